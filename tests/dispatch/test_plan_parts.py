"""The accepted verdict's ``plan``: the backend's plan note as named parts (``Backend.plan_parts``), so
``linattn explain --json`` gives the Triton prefill's choices (fused or pipeline, prep, walk, state stage)
as fields, and the message is those parts joined (``join_plan``)."""

import linattn
from linattn.dispatch.plugin.verdict import join_plan

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
    assert v.plan["prefill"].startswith("fused"), v.plan["prefill"]
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


def test_join_plan():
    assert join_plan({}) == ""
    assert join_plan({"prefill": "a", "state_stage": "b", "checkpoints": "c"}) == "prefill: a; state stage: b; checkpoints: c"
