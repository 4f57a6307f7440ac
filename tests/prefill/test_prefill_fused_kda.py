"""The fused KDA prefill (kernels/triton/chunk_fused_kda.py) under the Triton interpreter, at tiny shapes:
what is KDA's own (the contract both fused prefills share, pool mode, padding, has_initial_state, rows not
owned, pool == dense, F44: test_prefill_fused.py). Decays past e^-60 over half a chunk (the level path of
the channel-block products) in some channels and not in others against the float64 reference (1e-5),
``late_keys`` bitwise, and the planner's choice (off until measured) and its reasons.
"""

from __future__ import annotations

import pytest
import torch

from linattn.capabilities import profile
from linattn.kernels.triton import prefill as pm

from prefill_cases import make_inputs, random_states, reference, rel, run

pytestmark = pytest.mark.interpreter


def test_fused_kda_late_keys_give_the_same_bits():
    """``late_keys`` (the decayed keys formed after the output, from reloaded tiles) changes what is
    live across the dots, not the arithmetic: outputs and final states bitwise equal."""
    import dataclasses

    inp = make_inputs("kda", [70], H=1, HV=1, K=64, V=64)
    h0 = random_states(1, 1, 64, 64)
    outs = []
    for late in (False, True):
        cfg = dataclasses.replace(pm.fused_config(64, 64, torch.float32, "kda"), late_keys=late)
        plan = pm.plan_prefill("kda", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"], initial_state=h0,
                               fused=True, fused_cfg=cfg)
        outs.append(pm.run_prefill(plan, **inp, scale=0.125, initial_state=h0.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][0].abs().amax() > 0


def test_fused_kda_strong_decays_take_the_exact_level_path():
    """Channels whose decay over half a chunk passes e^-60 (gates of -3 per token; the floor, -1000,
    on some rows) beside mild ones: the channel blocks with them take the level path (every exponent
    <= 0), the others the fast path, and the result stays within 1e-5 of float64 from a random
    initial state, as the pipeline's."""
    inp = make_inputs("kda", [100], H=1, HV=2, K=64, V=64)
    g = inp["g"].clone()
    g[:, 0, :32] = -3.0  # value head 0, first channel block: e^-96 over 32 rows
    g[::5, 1, 40:] = -2000.0  # value head 1, second block: floored at -1000 every fifth token
    inp["g"] = g
    h0 = random_states(1, 2, 64, 64)
    o_ref, ht_ref = reference("kda", inp, initial_state=h0.clone())
    o, ht = run("kda", inp, initial_state=h0.clone(), fused=True)
    assert torch.isfinite(o).all() and rel(o, o_ref) < 1e-5 and rel(ht, ht_ref) < 1e-5


def test_fused_kda_planner_reasons(monkeypatch):
    q, v = torch.zeros(100, 1, 64), torch.zeros(100, 2, 64)
    cu = torch.tensor([0, 30, 100])
    plan = pm.plan_prefill("kda", q=q, v=v, cu_seqlens=cu)
    assert plan.fused is None and "FUSED_KDA_DEFAULT" in plan.fused_reason
    forced = pm.plan_prefill("kda", q=q, v=v, cu_seqlens=cu, fused=True)
    assert forced.fused is not None and [b.shape for b in forced.buffers if b.name == "fused_qs"] == [(100, 2)]
    assert not {"w", "u", "kda_kd", "kda_qg", "hbuf", "vn"} & {b.name for b in forced.buffers}
    caps = profile("sm90")
    cfg = pm.fused_config(128, 128, torch.bfloat16)
    args = dict(family="kda", HV=32, K=128, V=128, dtype=torch.bfloat16, caps=caps, cfg=cfg)
    on, why = pm.plan_fused(N=16, **args)
    assert not on and "FUSED_KDA_DEFAULT" in why  # default off until measured on the H200
    monkeypatch.setattr(pm.plan, "FUSED_KDA_DEFAULT", True)  # then GDN's rule
    assert pm.plan_fused(N=16, **args)[0]
    on, why = pm.plan_fused(N=1, **dict(args, HV=2))
    assert not on and "idle" in why
    with pytest.raises(ValueError, match="K, V <= 128"):
        pm.plan_fused(N=16, **dict(args, K=256), forced=True)
