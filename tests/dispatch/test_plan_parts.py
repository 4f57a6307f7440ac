"""The accepted verdict's ``plan``: the backend's plan note as named parts (``Backend.plan_parts``), so
``linattn explain --json`` gives the Triton prefill's choices (fused or pipeline, prep, walk, state stage)
as fields, and the message is those parts joined (``join_plan``)."""

import pytest
import torch

import linattn
from linattn.backends.base import Backend
from linattn.backends.triton_split import TritonSplitBackend
from linattn.capabilities import profile
from linattn.dispatch.env import ConfigError
from linattn.dispatch.plugin.verdict import join_plan
from linattn.dispatch.runtime.selection import _plan
from linattn.presets import make_problem

pytest.importorskip("triton")  # the triton-split backend's plan

SHAPE = dict(n=16, t=65536, h=16, hv=32, k=128, v=128)


def _triton(op="gdn_prefill", dtype="bfloat16", **kw):
    d = linattn.explain(op, device="sm90", dtype=dtype, **{**SHAPE, **kw})
    (v,) = [v for v in d.verdicts if v.backend == "triton-split"]
    return d, v


def test_the_fused_prefill_names_its_prep_and_walk(monkeypatch):
    monkeypatch.setenv("LINATTN_CUTEDSL_PREP", "0")
    monkeypatch.setenv("LINATTN_CUTEDSL_WALK", "0")
    d, v = _triton()
    assert list(v.plan) == ["prefill", "prep", "walk"], v.plan
    assert v.plan["prep"] == "Triton (LINATTN_CUTEDSL_PREP=0 keeps it)"
    assert v.plan["walk"].startswith("the Triton walk"), v.plan["walk"]
    assert v.message.startswith("prefill: fused: "), v.message
    assert v.message.endswith(join_plan(v.plan)) and "; prep: Triton (" in v.message
    (doc,) = [x for x in d.model_dump(mode="json")["verdicts"] if x["backend"] == "triton-split"]
    assert doc["plan"] == v.plan  # what explain --json prints


def test_the_pipeline_names_its_state_stage_and_other_ops_name_nothing():
    _, v = _triton(dtype="float32")  # fp32: the pipeline
    assert list(v.plan) == ["prefill", "state_stage"], v.plan
    assert v.plan["prefill"].startswith("the pipeline (")
    assert f"state stage: {v.plan['state_stage']}" in v.message
    _, dec = _triton(op="gdn_decode", t=16)
    assert dec.plan == {}


def _pipeline_plan():
    """A GDN prefill planned for the CPU profile on meta tensors (fp32: the pipeline)."""
    from linattn.kernels.triton.prefill import plan_prefill  # (Triton: the module's importorskip)

    q = torch.empty(2 * 64, 1, 64, device="meta", dtype=torch.float32)
    v = torch.empty(2 * 64, 2, 64, device="meta", dtype=torch.float32)
    return plan_prefill("gdn", q=q, v=v, cu_seqlens=torch.tensor([0, 64, 128], dtype=torch.int32), caps=profile("cpu"))


@pytest.mark.parametrize("switch", ["fused", "wgmma", "0"])
def test_the_pipeline_says_a_walk_switch_has_no_effect(monkeypatch, switch):
    """LINATTN_CUTEDSL_WALK picks the fused prefill's walk: on a call that runs the pipeline, explain's prefill part
    and the planner's own reason say it has no effect there."""
    monkeypatch.delenv("LINATTN_CUTEDSL_WALK", raising=False)
    _, v = _triton(dtype="float32")
    assert "LINATTN_CUTEDSL_WALK" not in v.plan["prefill"]
    monkeypatch.setenv("LINATTN_CUTEDSL_WALK", switch)
    _, v = _triton(dtype="float32")
    note = (f"LINATTN_CUTEDSL_WALK={switch} picks among the fused prefill's builds (its walk, or the one kernel): "
            "no effect on this call")
    assert v.plan["prefill"].startswith("the pipeline (") and note in v.plan["prefill"], v.plan
    plan = _pipeline_plan()
    assert plan.fused is None and plan.fused_reason.endswith(note), plan.fused_reason
    _, fused = _triton()  # bf16: the fused prefill, whose walk the switch picks: no note
    assert "no effect" not in fused.message, fused.message


def test_a_malformed_walk_switch_is_refused_on_the_pipeline_too(monkeypatch):
    """Field fault F48's rule: a LINATTN_CUTEDSL_WALK value not allowed is an error where the call runs the pipeline
    too: the planner raises, and the Triton backend's plan parts say that planning raises."""
    monkeypatch.setenv("LINATTN_CUTEDSL_WALK", "fast")
    with pytest.raises(ConfigError, match="LINATTN_CUTEDSL_WALK='fast'"):
        _pipeline_plan()
    problem = make_problem("gdn_prefill", dtype="float32", **SHAPE)
    parts = TritonSplitBackend().plan_parts(problem, profile("sm90"))
    assert "planning raises ConfigError: LINATTN_CUTEDSL_WALK='fast'" in parts["prefill"], parts


def test_a_pool_call_names_its_row_copy_and_checkpoints():
    _, v = _triton(dtype="float32", mode="pool", output_state_indices=True, checkpoints=True)
    assert list(v.plan) == ["prefill", "state_stage", "output_state_indices", "checkpoints"], v.plan
    assert v.plan["state_stage"].startswith("one pass per sequence (state checkpoints")
    assert v.message.endswith("; output_state_indices: " + v.plan["output_state_indices"]
                              + "; checkpoints: " + v.plan["checkpoints"])


def test_a_backends_own_note_is_kept_and_its_parts_are_strings():
    """A backend without parts: no message, no plan; one that writes its own note (torch-chunked) keeps
    it beside its parts; parts given as other types are shown as strings, None as none."""
    from linattn.dispatch.plugin.problem import Problem

    class Plain(Backend):
        name = "plain-test"

    class Own(Backend):
        name = "own-test"

        def plan_note(self, p, caps):
            return "my own words"

        def plan_parts(self, p, caps):
            return {"tiles": 4}

    class Nothing(Backend):
        name = "none-test"

        def plan_parts(self, p, caps):
            return None

    p = Problem(op="gdn_prefill", n=1, t=64, h=1, hv=1, k=64, v=64)
    assert _plan(Plain(), p, None) == ("", {})
    assert _plan(Own(), p, None) == ("my own words", {"tiles": "4"})
    assert _plan(Nothing(), p, None) == ("", {})


def test_join_plan():
    assert join_plan({}) == ""
    assert join_plan({"prefill": "a", "state_stage": "b", "checkpoints": "c"}) == "prefill: a; state stage: b; checkpoints: c"
