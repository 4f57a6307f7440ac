"""F39: every op's fake implementation (what ``torch.compile`` traces with) against its real output.

The rule (docs/ops-decisions.md, "F39"): an op's fake gives exactly the real output's shape,
dtype, device and strides (outputs are new contiguous tensors), over the whole option grid
(``fake_grid.grid()``: every op of the op table; float32, float64, bfloat16; pool and dense modes,
with and without an initial state in each state dtype; decode T > 1 with tables, intermediate
states, accepted tokens, verify-only, ``has_initial_state``, precomputed gates; both layouts).
The output dtypes come from one place, ``dispatch/runtime/results.py`` (``gate_dtype``,
``final_state_dtype``), read by the fakes, by the real path (which casts a backend's gates and
final state to them) and by the plugin result contract. Compiled code then equals eager code:
float64 gating and float64 dense prefill without an initial state compile to float64.
"""

from __future__ import annotations

import os

import pytest
import torch

import linattn
from linattn.dispatch.runtime.results import RESULTS, Expect

from fake_grid import case_id, clamp_case, compare_fake, decode_case, gating_case, grid, prefill_case
from field_cases import backends_for

GRID = grid()


@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_fake_equals_real_output(case):
    op, args = case
    assert compare_fake(op, args) == []


def test_grid_covers_every_op_and_the_float64_cases_of_f39():
    ops = {op for op, _ in GRID}
    assert ops == set(linattn.dispatch.OPS)
    ids = [case_id(c) for c in GRID]
    assert any(i.startswith("gdn_gating,A_log=float64") for i in ids)
    assert any(i.startswith("gdn_prefill,q=float64") and "initial_state" not in i and "state_pool" not in i
               for i in ids)


def _few(op: str) -> list:
    if op.endswith("_gating"):
        return [gating_case(op, "float32"), gating_case(op, "float64", "float32")]
    if op.endswith("_decode"):
        return [decode_case(op, dt, variant=var) for dt in ("float32", "bfloat16") for var in ("plain", "verify")]
    if op.endswith("_prefill"):
        return [prefill_case(op, "float32", mode) for mode in ("pool", "dense", "dense_h0")]
    return [clamp_case("float32", 10.0), clamp_case("bfloat16")]


@pytest.mark.parametrize("op", linattn.dispatch.OPS)
def test_fake_equals_real_output_on_every_backend_that_runs_here(op):
    """The fake does not know the backend: every backend's output (forced) has the fake's metadata."""
    ran = 0
    for backend in backends_for(op):
        for case_op, args in _few(op):
            try:
                assert compare_fake(case_op, args, backend=backend) == [], backend
            except linattn.NoBackendError:
                continue  # the backend declines these small shapes; the grid covers the op
            ran += 1
    assert ran > 0


@pytest.mark.parametrize("case", [c for c in GRID if c[0].endswith(("_gating", "_prefill"))][::3],
                         ids=lambda c: case_id(c))
def test_fake_dtypes_are_the_plugin_result_contracts(case):
    """The contract a plugin's result is checked against (its first dtype) is the fake's dtype."""
    op, args = case
    from torch._subclasses.fake_tensor import FakeTensorMode

    full = {"state_pool": None, "initial_state": None, "state_layout": "vk", **args}
    expected = RESULTS[op](full)
    expected = (expected,) if isinstance(expected, Expect) else expected
    with torch.no_grad(), FakeTensorMode() as mode:
        out = getattr(linattn, op)(**{k: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                      for k, x in args.items()})
    out = out if isinstance(out, tuple) else (out,)
    for exp, item in zip(expected, out):
        assert item.dtype == exp.dtypes[0], (exp.name, item.dtype, exp.dtypes)


def test_a_backend_result_in_another_allowed_dtype_is_cast_to_the_declared_one(monkeypatch):
    """Triton's gates are fp32 when only b is fp64 (its problem dtype is a's): the op casts them to
    the declared float64, so eager, fake and compiled agree whichever backend runs."""
    from linattn.ops import _gates_as_declared

    g, beta = torch.zeros(3, 2), torch.zeros(2, 3).t()
    A_log = torch.zeros(2)
    g2, b2 = _gates_as_declared(g, beta, A_log, g, beta.double(), A_log)
    assert g2.dtype == b2.dtype == torch.float64 and b2.is_contiguous()
    g3, _ = _gates_as_declared(g, g, A_log, g, g, A_log)
    assert g3 is g  # no copy when the backend's result is already as declared


def _gating_fn(A_log, a, b, dt_bias):
    g, beta = linattn.gdn_gating(A_log, a, b, dt_bias)
    return (g * 2.0).exp(), beta.to(torch.float32), g


def _prefill_fn(q, v, g, beta, cu):
    o, final = linattn.gdn_prefill(q, q, v, g, beta, cu)
    return (final + 1.0).sum(-1), final.to(torch.float32), o


def _compiled_inputs():
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    gating = (r(2) * 0.5, r(5, 2), r(5, 2), r(2) * 0.5)
    prefill = (r(6, 1, 8), r(6, 2, 4), -torch.rand(6, 2, generator=gen, dtype=torch.float64),
               torch.rand(6, 2, generator=gen, dtype=torch.float64), torch.tensor([0, 2, 6]))
    return gating, prefill


def _compiled_equals_eager(backend: str) -> None:
    gating, prefill = _compiled_inputs()
    for fn, args in ((_gating_fn, gating), (_prefill_fn, prefill)):
        torch._dynamo.reset()
        with torch.no_grad():
            want = fn(*args)
            got = torch.compile(fn, backend=backend, fullgraph=True)(*args)
        for w, x in zip(want, got):
            assert x.dtype == w.dtype and x.shape == w.shape, (fn.__name__, x.dtype, w.dtype)
            torch.testing.assert_close(x, w, rtol=1e-12, atol=1e-12)


def test_compiled_equals_eager_float64_gating_and_dense_prefill():
    """aot_eager (fast): with the old fp32 fakes ``.to(float32)`` was dropped and the dtype wrong."""
    _compiled_equals_eager("aot_eager")


@pytest.mark.skipif(os.environ.get("LINATTN_TEST_INDUCTOR") != "1",
                    reason="inductor's C++ compile takes ~20 s on 2 cores: LINATTN_TEST_INDUCTOR=1 runs it")
def test_compiled_equals_eager_float64_under_inductor(monkeypatch):
    """With the old fakes inductor generated fp32 code after the op: off by up to 1e35."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "force_disable_caches", True)  # a cached graph hides a fake change
    _compiled_equals_eager("inductor")
