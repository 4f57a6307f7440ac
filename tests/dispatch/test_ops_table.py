"""The op table is the one source of op facts: validation, problems, policies, custom ops, results,
presets and the conformance suite read it, and no shipped module (linattn, dispatch, backends,
kernels, capabilities, examples) parses an op's name."""

import re
from pathlib import Path

import pytest
import torch

import linattn
from linattn.dispatch import OP_TABLE, OPS, Problem, find_op, op_spec, phase_of
from linattn.dispatch.runtime.policy import PHASES, Policy
from linattn.dispatch.runtime.results import RESULTS
from linattn.dispatch.rules.validate import read_arguments, validate, written_arguments
from linattn.presets import presets
from linattn.testing.cases import base_spec, generate_cases, problem_of

ROOT = Path(__file__).resolve().parents[2]


def test_every_op_has_one_row_with_consistent_facts():
    assert tuple(OP_TABLE) == OPS and len(OPS) == 7
    for op, spec in OP_TABLE.items():
        assert spec.name == op and spec.phase in PHASES
        assert find_op(spec.family, spec.phase) == op
        assert set(spec.required).isdisjoint(spec.defaults)
        assert set(spec.mutates) <= set(spec.arguments) and set(spec.only_when_given) <= set(spec.defaults)
        assert spec.writes_pool == ("state_pool" in spec.mutates)
        assert spec.default_preset in presets() and presets()[spec.default_preset].family == spec.family
    assert find_op("swiglu", "decode") is None


def test_unknown_op_is_refused_with_the_list_of_ops():
    with pytest.raises(ValueError, match="unknown op 'gdn_decoder'.*gdn_decode"):
        op_spec("gdn_decoder")
    with pytest.raises(ValueError, match="unknown op"):
        phase_of("attention")


def test_problem_family_and_phase_come_from_the_table():
    for op, spec in OP_TABLE.items():
        shape = dict(d=8) if spec.method == "clamp" else dict(h=1, hv=2, k=4, v=4)
        p = Problem(op=op, **shape)
        assert (p.family, p.phase, p.spec) == (spec.family, spec.phase, spec)
    assert Problem(op="silu_and_mul_clamp", d=4).family == "swiglu"  # not "silu", the first word of its name


def test_policy_phase_keys_follow_the_table():
    pol = Policy(force=(("gating", "a"), ("mlp", "b")))
    assert pol.forced_for("kda_gating") == "a" and pol.forced_for("silu_and_mul_clamp") == "b"
    assert pol.forced_for("kda_decode") is None


def test_validation_takes_arguments_defaults_and_written_buffers_from_the_table():
    x = torch.zeros(3, 8)
    kw, _ = validate("silu_and_mul_clamp", {"x": x})
    assert set(kw) == set(OP_TABLE["silu_and_mul_clamp"].arguments) and kw["limit"] is None
    with pytest.raises(TypeError) as e:
        validate("kda_gating", {"A_log": x, "a": x, "b": x, "dt_bias": x, "limit": 1.0})
    assert ", ".join(OP_TABLE["kda_gating"].arguments) in str(e.value)
    for op, spec in OP_TABLE.items():
        assert written_arguments(op) == spec.mutates
        assert read_arguments(op) == tuple(a for a in spec.arguments if a not in spec.mutates)


@pytest.mark.parametrize("op", OPS)
def test_custom_op_declares_exactly_the_tables_mutated_arguments(op):
    schema = getattr(torch.ops.linattn, op).default._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == OP_TABLE[op].mutates


def test_result_rules_and_presets_are_derived_from_the_table():
    assert set(RESULTS) == set(OPS)
    for p in presets().values():
        assert set(p.ops) == {op for op, s in OP_TABLE.items() if s.family == p.family}
    assert presets()["kimi-linear"].decode_op == "kda_decode"
    with pytest.raises(ValueError, match="no decode op"):
        presets()["deepseek-v4"].op_for("decode")


def test_conformance_cases_follow_the_table_lower_bound_only_where_the_op_takes_it():
    from linattn.backends.torch_ref import TorchRefBackend

    ids = [c.id for c in generate_cases(TorchRefBackend(), kinds=["accuracy"])]
    with_bound = {i.split("/")[0] for i in ids if "/lower-bound[" in i}
    assert with_bound == {op for op, s in OP_TABLE.items() if s.takes("lower_bound")} == {"kda_gating", "kda_decode"}
    for op in OPS:  # every op's base case is a valid problem of that op
        assert problem_of(op, base_spec(op, TorchRefBackend)).op == op


# Op-name parsing: ``op.split("_")``, ``op.startswith("gdn")``, ``op.endswith("_decode")``, ``op[:3]``,
# ``"prefill" in op``, ``op in ("gdn_decode", ...)``, ``op == "silu_and_mul_clamp"`` and the like. The
# shipped tree reads the op table instead (``op_spec(op).family``, ``.phase``, ``.method``).
_SUBJECT = r"""(?:\bop\w*|\.op|\[['"]op['"]\])"""
PARSING = re.compile(rf"""{_SUBJECT}\.(split|rsplit|partition|rpartition)\(\s*['"]_['"]|"""
                     rf"""{_SUBJECT}\.(startswith|endswith|removeprefix|removesuffix)\(|"""
                     rf"""{_SUBJECT}\s*(==|!=)\s*['"]silu_and_mul_clamp['"]|"""
                     r"""(?:\bop(?:_?name)?|\.op|\[['"]op['"]\])\[\s*-?\d*\s*:|"""
                     rf"""['"]_?(gdn|kda|swiglu|silu|decode|prefill|gating|clamp)_?['"]\s+(not\s+)?in\s+{_SUBJECT}|"""
                     r"""(?<!for\s)(?:\bop|\.op|\[['"]op['"]\])\s+(not\s+)?in\s+[(\[{]\s*['"](gdn|kda|silu)""")
# Op names built from a family (``f"{family}_{phase}"``, ``f"{p.family}_gating"``) where
# ``find_op(family, phase)`` gives them; only the table's own rows make them.
BUILDING = re.compile(r"""\{[^{}]*\b(family|fam|gate)\b[^{}]*\}_(\{|gating\b|decode\b|prefill\b)""")
NAMES_ARE_MADE_IN = "dispatch/rules/ops_table.py"
#: The shipped tree: the package (``pyproject.toml``'s package-dir) and the examples.
SHIPPED = ("linattn", "apps", "dispatch", "backends", "kernels", "capabilities", "examples")


def _sources():
    for entry in SHIPPED:
        yield from sorted((ROOT / entry).rglob("*.py"))


def _parsing_sites(path: Path, text: str) -> list[str]:
    building = path.relative_to(ROOT).as_posix() != NAMES_ARE_MADE_IN
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if PARSING.search(line) or (building and BUILDING.search(line))]


def test_the_parsing_pattern_catches_what_it_is_for():
    for line in ('op.split("_")[0]', "case.op.startswith('kda')", 'if p.op == "silu_and_mul_clamp":',
                 'op.endswith(("_decode", "_prefill"))', 'p.op in ("silu_and_mul_clamp",)', 'gate=op[:3]',
                 'doc["op"].endswith("_prefill")', "if 'prefill' in op:", 'if op in ("gdn_decode", "kda_decode"):',
                 'op_name[4:]', 'return "mlp" if x else op.split("_")[-1]'):
        assert PARSING.search(line), line
    for line in ('f"{family}_prefill"', 'name = f"{p.family}_gating"', 'getattr(linattn, f"{family}_{phase}")',
                 'return f"{row[\'family\']}_{phase}"'):
        assert BUILDING.search(line), line
    for line in ('spec = OP_TABLE[p.op]', 'name.startswith("plugin:")', 'for op in ("gdn_prefill", "kda_prefill")',
                 'options[:3]', 'ops[:3]', 'find_op(family, "prefill")', 'getattr(ref, f"{op}_ref")'):
        assert not PARSING.search(line) and not BUILDING.search(line), line


def test_no_op_name_parsing_in_the_shipped_tree():
    assert {p.relative_to(ROOT).parts[0] for p in _sources()} == set(SHIPPED)
    hits = [hit for path in _sources() for hit in _parsing_sites(path, path.read_text())]
    assert not hits, "\n".join(hits)


def test_public_ops_name_their_table_rows():
    for op in OPS:
        assert callable(getattr(linattn, op)) and hasattr(torch.ops.linattn, op)
