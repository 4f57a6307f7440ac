"""The one comparison harness (issue 30 section 3): ``linattn.testing.compare``'s relative error,
tolerance table and checker, used by the self-check, the conformance suite, the CuTe DSL sign-off
checks and the demo; ``linattn.testing.inputs`` loads with it as ``import linattn`` runs, the suite
does not."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from linattn.testing import compare
from linattn.testing.compare import Comparison, rel_error, rel_error_exact_zero, tolerances


def _off_by(ref: torch.Tensor, rel: float) -> torch.Tensor:
    return ref * (1.0 + rel)


def test_rel_error_is_the_relative_frobenius_norm_with_its_edge_cases():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert rel_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5.0)
    assert rel_error(torch.tensor([0.5, 0.0]), torch.zeros(2)) == 0.5  # zero reference: the absolute norm
    assert rel_error(torch.empty(0), torch.empty(0)) == 0.0
    assert rel_error(ref.to(torch.bfloat16), ref) == 0.0  # exactly representable: no error
    # the tests' form: a zero reference demands exact zeros (the private helpers it replaced had a
    # 1e-30 / 1e-300 floor or divided by zero there); elsewhere it is rel_error
    assert rel_error_exact_zero(torch.tensor([1e-12, 0.0]), torch.zeros(2)) == float("inf")
    assert rel_error_exact_zero(torch.tensor([0.0, -0.0]), torch.zeros(2)) == 0.0
    assert rel_error_exact_zero(torch.tensor([float("nan")]), torch.zeros(1)) == float("inf")
    assert rel_error_exact_zero(torch.tensor([3.0, 4.5]), ref) == rel_error(torch.tensor([3.0, 4.5]), ref)
    assert rel_error_exact_zero(torch.empty(0), torch.empty(0)) == 0.0


def test_the_checker_passes_at_the_bound_and_fails_just_past_it():
    ref = torch.linspace(-1, 1, 17, dtype=torch.float64)
    x = _off_by(ref, 3e-3).to(torch.float32)
    err = rel_error(x, ref)
    at = Comparison()
    assert at.close("o", x, ref, err) == err and at.ok and at.message() == ""
    past = Comparison()
    past.close("o", x, ref, math.nextafter(err, 0.0))
    assert not past.ok and past.failures == [f"o: relative error {err:.2e} > tolerance {math.nextafter(err, 0.0):.0e}"]


def test_the_checker_fails_on_what_a_miscompiled_kernel_gives():
    ref = torch.ones(4, 3, dtype=torch.float64)
    c = Comparison()
    c.close("o", torch.ones(4, 2), ref, 1e-2)
    nan = torch.ones(4, 3)
    nan[1, 1] = float("nan")
    c.close("state", nan, ref, 1e-2)
    c.zero("o", torch.tensor([[0.0], [0.25]]), "padding rows (slot -1)")  # the self-check's form: rows pre-selected
    c.zero("o", torch.tensor([[0.0], [0.25], [0.0]]), "padding rows (slot -1)", rows=[0, 1])  # the suite's: named
    c.zero("o", torch.ones(2), "padding rows (slot -1)", rows=[])  # no padding: nothing to check
    before = torch.zeros(4, 2)
    after = before.clone()
    after[3] = 1.0
    c.untouched("state_pool", after, before, {0, 1}, "pool rows")
    c.untouched("state_pool", after, before, {3}, "pool rows")  # row 3 owned: fine
    assert c.failures == [
        "o: shape (4, 2), reference (4, 3)",
        "state: not finite (NaN or inf)",
        "o: padding rows (slot -1) must be exactly zero (max |x| = 0.25)",
        "o: padding rows (slot -1) [0, 1] must be exactly zero (max |x| = 0.25)",
        "state_pool: pool rows [3] changed but are not owned by the call (rows owned: [0, 1]); they must stay "
        "bitwise unchanged",
    ]
    assert c.errors == {} and c.worst is None and c.summary() == "passed"


def test_the_checker_names_the_worst_tensor_relative_to_its_bound():
    ref = torch.linspace(1, 2, 8, dtype=torch.float64)
    c = Comparison()
    c.close("o", _off_by(ref, 1e-2), ref, 2e-2)  # the largest error, half its bound
    c.close("state", _off_by(ref, 8e-3), ref, 1e-2)  # smaller, but 0.8 of its bound: the worst
    c.close("g", _off_by(ref, 1e-7), ref, 1e-5)
    name, err, bound = c.worst
    assert (name, bound) == ("state", 1e-2) and err == pytest.approx(8e-3)
    assert c.ok and c.summary() == "o 1.0e-02, state 8.0e-03, g 1.0e-07"
    c.close("beta", _off_by(ref, 3e-5), ref, 1e-5)  # past its bound: now the worst, and a failure
    assert c.worst[0] == "beta" and not c.ok and c.message().startswith("beta: relative error 3.00e-05")


def test_one_tolerance_table_holds_every_callers_bounds():
    assert tolerances("float32") == tolerances("float64", "float64", "prefill") == (1e-5, 1e-5)
    for dt, sdt in (("bfloat16", "float32"), ("float16", "float32"), ("float32", "bfloat16")):
        assert tolerances(dt, sdt, "decode") == tolerances(dt, sdt, "prefill") == (2e-2, 1e-2)
    assert tolerances("bfloat16", phase="gating") == tolerances("float32", phase="gating") == (1e-5, None)
    assert tolerances("float32", "bfloat16", "mlp") == (1e-5, None)  # the clamp has no state
    assert tolerances("bfloat16", phase="mlp") == (1e-2, None)
    assert tolerances("bfloat16", phase="prefill_state_stage") == (2e-2, 2e-2)
    with pytest.raises(KeyError):
        tolerances("float32", phase="prefill_state_stage")  # no fp32 state stage: no bound invented


def test_the_callers_use_the_one_harness():
    from linattn.apps import demo
    from linattn.dispatch.plugin import self_check_case  # the self-check's default case (dispatch/runtime/self_check.py runs it)
    from linattn.kernels.cutedsl import selfcheck
    from linattn.testing import execute as _  # noqa: F401 - loads the submodule

    ex = sys.modules["linattn.testing.execute"]
    assert ex.rel_error is selfcheck.rel_error is demo.rel_error is rel_error  # one name everywhere
    assert not hasattr(selfcheck, "rel")  # no alias
    assert ex.tolerances is tolerances and issubclass(ex.Checker, Comparison)
    assert self_check_case.Comparison is Comparison and self_check_case.tolerance_for is compare.tolerance_for
    assert (demo.TOL_OUTPUT_BF16, demo.TOL_STATE_BF16, demo.TOL_FP32) == (2e-2, 1e-2, 1e-5)
    assert (selfcheck.TOL_O, selfcheck.TOL_S, selfcheck.TOL_STAGE) == (2e-2, 1e-2, 2e-2)


def test_import_linattn_loads_the_harness_but_not_the_suite_or_pytest():
    code = ("import sys, linattn; mods = set(sys.modules); "
            "print(sorted(m for m in mods if m.startswith('linattn.testing')), 'pytest' in mods)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['linattn.testing', 'linattn.testing.compare', 'linattn.testing.inputs'] False"


#: Functions that compute a relative error themselves, and why (everything else imports
#: ``rel_error``): path relative to the repository -> function name -> why.
OWN_RELATIVE_ERRORS = {
    "linattn/testing/compare.py": {"rel_error": "the one definition",
                                   "rel_error_exact_zero": "the tests' form of it: exact zeros where the reference is zero"},
    "benchmarks/decode.py": {"_rel": "sums the squares a chunk of rows at a time: the states it compares can be "
                                     "17 GB, twice that in float64"},
    "tests/compat/test_fla_compat.py": {"rel": "another measure: max |a - b| / max |b|"},
}
ROOT = compare.__file__.rsplit("/linattn/", 1)[0]


def _relative_error_helpers() -> list[tuple[str, str, int]]:
    """(path, function, line) of every function outside ``test_*`` that is named like a relative error
    (``rel``, ``_rel``, ``rel_err``, ``rel_error``, ...) or divides one ``.norm()`` by another."""
    import ast
    import re
    from pathlib import Path

    def norm_in(node) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == "norm" for n in ast.walk(node))

    out = []
    for folder in ("tests", "benchmarks", "linattn", "dispatch", "backends", "kernels", "apps", "tools", "examples"):
        for path in sorted(Path(ROOT, folder).rglob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text())):
                if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("test_"):
                    continue
                named = re.fullmatch(r"_?rel(_?err(or)?)?", fn.name) is not None
                ratio = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and norm_in(n.left)
                            and norm_in(n.right) for n in ast.walk(fn))
                if named or ratio:
                    out.append((str(path.relative_to(ROOT)), fn.name, fn.lineno))
    return out


def test_the_relative_error_is_defined_once_and_imported_everywhere_else():
    found = _relative_error_helpers()
    own = [f"{p}:{line} {name}" for p, name, line in found if name not in OWN_RELATIVE_ERRORS.get(p, {})]
    assert not own, ("private copies of the relative error: import it instead, `from linattn.testing.compare import "
                     "rel_error` (``||x - ref|| / ||ref||`` in float64), or name the function in OWN_RELATIVE_ERRORS "
                     "with why: " + ", ".join(own))
    assert ("linattn/testing/compare.py", "rel_error") in {(p, n) for p, n, _ in found}  # the scan sees a definition


def test_the_helpers_that_moved_to_the_harness_are_its_strict_rel_error():
    sys.path[:0] = [f"{ROOT}/tests/fuzz", f"{ROOT}/tests/prefill"]
    try:
        import fuzz_support
        import prefill_cases
    finally:
        del sys.path[:2]
    assert fuzz_support.rel is prefill_cases.rel is rel_error_exact_zero
