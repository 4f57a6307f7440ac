"""The op table is the one source of op facts: validation, problems, policies, custom ops, results,
presets and the conformance suite read it, and no shipped module of the dispatch layer parses an
op's name."""

import re
from pathlib import Path

import pytest
import torch

import linattn
from linattn.dispatch import OP_TABLE, OPS, Problem, find_op, op_spec, phase_of
from linattn.dispatch.policy import PHASES, Policy
from linattn.dispatch.results import RESULTS
from linattn.dispatch.validate import read_arguments, validate, written_arguments
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


# Op-name parsing: ``op.split("_")``, ``op.startswith("gdn")``, ``op.endswith("_decode")``, ``op ==
# "silu_and_mul_clamp"`` and the like. The modules below read the op table instead.
PARSING = re.compile(r"""(\bop\w*|\.op)\.(split|rsplit|partition)\(\s*['"]_['"]|"""
                     r"""(\bop\w*|\.op)\.(startswith|endswith)\(|"""
                     r"""(\bop\w*|\.op)\s*(==|!=)\s*['"]silu_and_mul_clamp['"]|"""
                     r"""\.op\s+(not\s+)?in\s+\(\s*['"]silu""")
TABLE_READERS = ("dispatch", "backends", "capabilities", "linattn/ops.py", "linattn/presets.py",
                 "linattn/testing/cases.py", "linattn/testing/execute.py", "linattn/testing/runner.py",
                 "examples/linattn-cpu-chunked/linattn_cpu_chunked/backend.py")


def _sources():
    for entry in TABLE_READERS:
        path = ROOT / entry
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path])


def test_the_parsing_pattern_catches_what_it_is_for():
    for line in ('op.split("_")[0]', "case.op.startswith('kda')", 'if p.op == "silu_and_mul_clamp":',
                 'op.endswith(("_decode", "_prefill"))', 'p.op in ("silu_and_mul_clamp",)'):
        assert PARSING.search(line), line
    assert not PARSING.search('spec = OP_TABLE[p.op]') and not PARSING.search('name.startswith("plugin:")')


def test_no_op_name_parsing_in_the_modules_that_read_the_table():
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _sources()
            for n, line in enumerate(path.read_text().splitlines(), 1) if PARSING.search(line)]
    assert not hits, "\n".join(hits)


def test_public_ops_name_their_table_rows():
    for op in OPS:
        assert callable(getattr(linattn, op)) and hasattr(torch.ops.linattn, op)
