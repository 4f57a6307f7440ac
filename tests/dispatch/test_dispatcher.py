"""One Dispatcher owns the registry, the decision cache, the last decisions and the self-check log;
the public functions are thin wrappers over the process's one; dispatch modules import without a
cycle; a rejection lists every failing reason; rank tiers are named once."""

import ast
from pathlib import Path

import pytest
import torch

import linattn
from linattn.capabilities import PROFILES
from linattn.dispatch import (Dispatcher, NoBackendError, Problem, Rank, Reason, Rejected, dispatcher, explain,
                              get_registry, last_decision, reset_registry, select)
from linattn.dispatch.runtime import registry as registry_module
from linattn.dispatch.runtime import selection
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.runtime.registry import Registry
from linattn.dispatch.plugin.verdict import Decision

from dispatch_backends import FastCpuDecode  # noqa: E402

DISPATCH = Path(__file__).resolve().parents[2] / "dispatch"
SUBPACKAGES = ("rules", "plugin", "runtime")  # dispatch/'s subpackages; module names are unique across them
DECODE = Problem(op="gdn_decode", n=4, t=1, h=2, hv=4, k=16, v=16, dtype="float32")


class Fp32K16(FastCpuDecode):
    name = "fp32-k16"


def _sig(p: Problem) -> tuple:
    return tuple(p.model_dump().items())


# -- one object, thin wrappers ---------------------------------------------------------------------

def test_the_public_functions_are_the_process_dispatchers(fresh_registry):
    d = dispatcher()
    assert get_registry() is d.registry is fresh_registry
    assert registry_module.get_registry() is d.registry  # the old import path still answers
    impl, decision = select("gdn_decode", _sig(DECODE), torch.device("cpu"))
    assert last_decision() is decision is d.last_decision() and d.last_decision("gdn_decode") is decision
    assert [e.decision for e in d.cached_decisions()] == [decision]


def test_a_dispatcher_of_its_own_shares_nothing_with_the_process_one(fresh_registry):
    reg = Registry().load(entry_points=False)
    reg.add_plugin(BackendPlugin(Fp32K16), name="mine")
    mine = Dispatcher(reg)
    before = last_decision("gdn_decode")
    impl, d = mine.select("gdn_decode", _sig(DECODE), torch.device("cpu"))
    assert impl.name == "fp32-k16" and mine.last_decision("gdn_decode") is d
    assert last_decision("gdn_decode") is before  # the process dispatcher saw nothing
    assert "fp32-k16" not in get_registry().backends and not dispatcher().cached_decisions()
    assert explain(DECODE, "cpu").chosen == "torch-chunked" and mine.explain(DECODE, "cpu").chosen == "fp32-k16"


def test_clearing_and_resetting_forget_every_cached_decision(fresh_registry):
    d = dispatcher()
    select("gdn_decode", _sig(DECODE), torch.device("cpu"))
    assert len(d.cached_decisions()) == 1
    d.clear_cache()
    assert d.cached_decisions() == []
    select("gdn_decode", _sig(DECODE), torch.device("cpu"))
    new = Registry().load(entry_points=False)
    assert reset_registry(new) is new is d.registry and d.cached_decisions() == []


def test_a_registry_change_is_a_new_cache_key_not_a_stale_hit(fresh_registry):
    cpu = torch.device("cpu")
    assert select("gdn_decode", _sig(DECODE), cpu)[0].name == "torch-chunked"
    fresh_registry.add_plugin(BackendPlugin(Fp32K16), name="late")
    assert select("gdn_decode", _sig(DECODE), cpu)[0].name == "fp32-k16"
    assert {e.generation for e in dispatcher().cached_decisions()} == {fresh_registry.generation - 1,
                                                                       fresh_registry.generation}


def test_forgetting_a_broken_backend_is_a_registry_method(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(Fp32K16), name="p")
    fresh_registry.mark_broken("fp32-k16", RuntimeError("boom"))
    assert explain(DECODE, "cpu").verdict("fp32-k16").reason == Reason.BACKEND_ERROR
    gen = fresh_registry.generation
    assert fresh_registry.forget_broken("fp32-k16") and fresh_registry.generation == gen + 1
    assert not fresh_registry.forget_broken("fp32-k16")
    assert explain(DECODE, "cpu").chosen == "fp32-k16"


def _module_imports(path: Path) -> set[str]:
    """The dispatch modules ``path`` imports at module level (``from .x import``, ``from . import x``,
    and across the subpackages ``from ..rules.x import``, ``from ..rules import x``, ``from ..env import``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            last = (node.module or "").rpartition(".")[2]
            out |= {a.name for a in node.names} if last in ("", *SUBPACKAGES) else {last}
    return out


def test_dispatch_modules_import_each_other_without_a_cycle():
    graph = {p.stem: _module_imports(p) & {q.stem for q in DISPATCH.rglob("*.py")} for p in DISPATCH.rglob("*.py")
             if p.stem != "__init__"}
    assert "selection" not in graph["registry"] and "registry" in graph["selection"]
    done, stack = set(), []

    def visit(mod):
        assert mod not in stack, f"import cycle: {' -> '.join(stack + [mod])}"
        if mod in done:
            return
        stack.append(mod)
        for dep in graph.get(mod, ()):
            visit(dep)
        stack.pop()
        done.add(mod)

    for mod in graph:
        visit(mod)


def test_no_selection_state_lives_in_the_registry_or_self_check_modules():
    for mod in (registry_module, linattn.dispatch.runtime.self_check):
        assert not [n for n in vars(mod) if n in ("_registry", "_loading", "_results", "_running", "_cache")]
    assert not [n for n in vars(selection) if n in ("_cache", "_last_by_op", "_logged", "_local")]


# -- every failing reason ---------------------------------------------------------------------------

BAD = DECODE.model_copy(update={"dtype": "bfloat16", "k": 32})


def test_a_rejection_lists_every_failing_predicate_the_first_as_reason(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(Fp32K16), name="p")
    v = explain(BAD, "cpu").verdict("fp32-k16")
    assert not v.ok and [r.reason for r in v.reasons] == [Reason.DTYPE, Reason.SHAPE]
    assert (v.reason, v.message, v.hint) == (v.reasons[0].reason, v.reasons[0].message, v.reasons[0].hint)
    assert "bfloat16" in v.reasons[0].message and "K=32" in v.reasons[1].message
    on_gpu = explain(BAD, "sm90").verdict("fp32-k16")  # wrong vendor too: three reasons
    assert [r.reason for r in on_gpu.reasons] == [Reason.DEVICE, Reason.DTYPE, Reason.SHAPE]


def test_an_op_the_backend_does_not_implement_is_its_only_reason(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(Fp32K16), name="p")
    v = explain(BAD.model_copy(update={"op": "kda_decode"}), "sm90").verdict("fp32-k16")
    assert [r.reason for r in v.reasons] == [Reason.OP]


def test_the_error_text_and_the_summary_list_every_reason(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(Fp32K16), name="p")
    with pytest.raises(NoBackendError) as e:
        select("gdn_decode", _sig(BAD), torch.device("cpu"), backend="fp32-k16")
    text = str(e.value)
    assert "fp32-k16: [dtype]" in text and "also [shape] unsupported head_dim K=32" in text
    assert "fp32-k16=dtype+shape" in explain(BAD, "cpu").summary()


def test_reasons_survive_json_and_a_single_reason_fills_the_list():
    r = Rejected(backend="x", reason=Reason.ARCH, message="arch='sm_75'", hint="use sm_90")
    assert [(f.reason, f.message, f.hint) for f in r.reasons] == [(Reason.ARCH, "arch='sm_75'", "use sm_90")]
    d = explain(DECODE.model_copy(update={"dtype": "float64", "k": 512}), "sm90")  # triton: dtype and shape
    again = Decision.model_validate_json(d.model_dump_json())
    assert again == d and any(len(v.reasons) > 1 for v in again.verdicts if not v.ok)


# -- rank tiers and declared protocols ---------------------------------------------------------------

def test_every_builtin_rank_is_a_named_tier(fresh_registry):
    tiers = {int(t) for t in Rank}
    for prof in PROFILES:
        for op in ("gdn_decode", "kda_prefill", "silu_and_mul_clamp"):
            shape = dict(d=64) if op == "silu_and_mul_clamp" else dict(h=16, hv=32, k=128, v=128)
            p = Problem(op=op, n=16, t=4096 if op == "kda_prefill" else 1, **shape)
            for v in explain(p, prof, backend=None).verdicts:
                assert not v.ok or v.rank in tiers, (prof, op, v)
    assert Rank.CPU_DEFAULT < Rank.NATIVE < Rank.GPU_REFERENCE < Rank.FORCED_ONLY


def test_forcing_and_kernel_lists_are_declared_on_the_base_class():
    b = Fp32K16()
    assert b.needs_forcing(DECODE, PROFILES["cpu"]) is None and b.triton_kernels == ()
    assert b.prepare("gdn_decode", {}) is None
    from linattn.backends.triton_split import TritonSplitBackend

    assert TritonSplitBackend().needs_forcing(DECODE, PROFILES["sm90"]) is None
    assert "only when forced" in TritonSplitBackend().needs_forcing(DECODE, PROFILES["cpu"])
