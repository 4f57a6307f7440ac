"""The fused prefill (GDN: kernels/triton/chunk_fused.py; KDA: chunk_fused_kda.py) under the Triton
interpreter, at tiny shapes (KDA's own cases: test_prefill_fused_kda.py).

Both families against the float64 token-serial reference (ops.md: 1e-5 for fp32 inputs) in pool mode with GVA,
varlen (an empty and a length-1 sequence, a tail chunk), padding rows and ``has_initial_state``,
with the pool rows the call does not own bitwise unchanged; both layouts, a bf16 pool, pool ==
dense bitwise; keys and queries past 2**32 (F44); GDN's queries near fp32's largest (F44); GDN's
planner choice and its reasons.
"""

from __future__ import annotations

import pytest
import torch

from linattn.capabilities import profile
from linattn.kernels.triton import prefill as pm

from prefill_cases import make_inputs, random_states, reference, rel, run

pytestmark = pytest.mark.interpreter


FAMILIES = pytest.mark.parametrize("family", ["gdn", "kda"])


@FAMILIES
def test_fused_pool_mode_matches_float64_reference_and_keeps_other_rows(family):
    inp = make_inputs(family, [70, 0, 1, 130], H=1, HV=2, K=64, V=64)
    pool = random_states(6, 2, 64, 64)
    idx = torch.tensor([4, 1, -1, 0], dtype=torch.int32)
    flags = torch.tensor([True, True, True, False])
    ref_pool = pool.clone()
    ref_pool[0] = 0  # has_initial_state False: the reference starts sequence 3 from zeros
    o_ref, _ = reference(family, inp, state_pool=ref_pool, state_indices=idx)
    work = pool.clone()
    o, _ = run(family, inp, state_pool=work, state_indices=idx, has_initial_state=flags, fused=True)
    assert rel(o, o_ref) < 1e-5
    assert rel(work[[4, 1, 0]], ref_pool[[4, 1, 0]]) < 1e-5
    assert torch.equal(work[[2, 3, 5]], pool[[2, 3, 5]])  # rows not owned: bitwise unchanged
    assert torch.all(o[70:71] == 0) and o[71:].abs().amax() > 0  # the padding sequence (token 70)


@FAMILIES
@pytest.mark.parametrize("layout,pool_dtype", [("kv", torch.bfloat16), ("vk", torch.float32)])
def test_fused_pool_equals_dense_bitwise(family, layout, pool_dtype):
    inp = make_inputs(family, [65, 3], H=1, HV=2, K=64, V=64, dtype=torch.bfloat16)
    inp["k"] = inp["k"] * 0.125  # no l2norm: keys of norm ~1 keep the delta rule contracting
    pool = random_states(3, 2, 64, 64, layout=layout).to(pool_dtype)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    work = pool.clone()
    o, _ = run(family, inp, state_pool=work, state_indices=idx, state_layout=layout, use_qk_l2norm=False,
               scale=0.1, fused=True)
    o_d, ht = run(family, inp, initial_state=pool[idx.long()].clone(), state_layout=layout, use_qk_l2norm=False,
                  scale=0.1, fused=True)
    assert torch.equal(o, o_d) and torch.equal(work[idx.long()], ht)
    assert torch.equal(work[1], pool[1])
    o_p, ht_p = run(family, inp, initial_state=pool[idx.long()].clone(), state_layout=layout, use_qk_l2norm=False,
                    scale=0.1, fused=False)
    assert rel(o, o_p) < 2e-2 and rel(ht.float(), ht_p.float()) < 1e-2


@FAMILIES
def test_fused_norms_do_not_overflow_past_2_32(family):
    """F44: l2norm makes the result independent of the keys' and queries' magnitude; rows near
    1e25 (squares past fp32's range) give the same output as the same rows at magnitude 1."""
    inp = make_inputs(family, [70], H=1, HV=2, K=64, V=64)
    big = dict(inp, q=inp["q"] * 1e25, k=inp["k"] * 1e25)
    o, ht = run(family, big, fused=True)
    o_ref, ht_ref = reference(family, inp)
    assert torch.isfinite(o).all() and rel(o, o_ref) < 1e-5 and rel(ht, ht_ref) < 1e-5


def test_gdn_prep_shares_keys_across_a_gva_group_bitwise():
    """GDN's prep forms the norms, ``K K^T`` and ``Q K^T`` once per (chunk, key head) for its GVA group
    (``FusedConfig.prep_shared_keys``); each value head then runs the same instructions as a prep item
    of its own: the results equal the unshared prep's bitwise, with two key heads of four value heads
    each (the items' head offsets) and the float64 reference."""
    import dataclasses

    from linattn.kernels.triton.chunk_fused import fused_config

    inp = make_inputs("gdn", [70, 3], H=2, HV=8, K=64, V=64)
    pool = random_states(4, 8, 64, 64)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    cfg = fused_config(64, 64, torch.float32)
    assert cfg.prep_shared_keys
    outs = []
    for shared in (True, False):
        work = pool.clone()
        plan = pm.plan_prefill("gdn", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"], state_pool=work,
                               state_indices=idx, fused=True,
                               fused_cfg=dataclasses.replace(cfg, prep_shared_keys=shared))
        assert pm.fused_prep_items(plan) == plan.nt_max * (2 if shared else 8)
        o, _ = pm.run_prefill(plan, **inp, scale=64 ** -0.5, state_pool=work, state_indices=idx)
        outs.append((o, work))
        assert torch.equal(work[[0, 2]], pool[[0, 2]])  # rows not owned: bitwise unchanged
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    ref_pool = pool.clone()
    o_ref, _ = reference("gdn", inp, state_pool=ref_pool, state_indices=idx)
    assert rel(outs[0][0], o_ref) < 1e-5 and rel(outs[0][1][[3, 1]], ref_pool[[3, 1]]) < 1e-5


@pytest.mark.parametrize("mag", [1e37, 3e37])
def test_fused_query_state_product_does_not_overflow(mag):
    """F44: queries near fp32's largest run ``q . S`` on the rows times their power of two ``sq``
    (the raw product overflowed to inf: nan outputs); the output equals the float64 reference of
    the same problem at magnitude 1, from a random initial state."""
    inp = make_inputs("gdn", [70], H=1, HV=2, K=64, V=64)
    h0 = random_states(1, 2, 64, 64)
    o, ht = run("gdn", dict(inp, q=inp["q"] * mag), initial_state=h0.clone(), fused=True)
    o_ref, ht_ref = reference("gdn", inp, initial_state=h0.clone())
    assert torch.isfinite(o).all() and rel(o, o_ref) < 1e-5 and rel(ht, ht_ref) < 1e-5


def test_planner_reasons():
    q, v = torch.zeros(100, 1, 64), torch.zeros(100, 2, 64)
    cu = torch.tensor([0, 30, 100])
    plan = pm.plan_prefill("gdn", q=q, v=v, cu_seqlens=cu)
    assert plan.fused is None and "bf16 on CUDA" in plan.fused_reason  # not measured here: the pipeline
    assert pm.plan_prefill("gdn", q=q, v=v, cu_seqlens=cu, fused=True).fused is not None
    caps = profile("sm90")
    cfg = pm.fused_config(128, 128, torch.bfloat16)
    on, why = pm.plan_fused(family="gdn", N=1, HV=8, K=128, V=128, dtype=torch.bfloat16, caps=caps, cfg=cfg)
    assert not on and "idle" in why  # 16 programs on 132 SMs: the pipeline's segment pass
    on, why = pm.plan_fused(family="gdn", N=1, HV=8, K=256, V=128, dtype=torch.bfloat16, caps=caps, cfg=cfg)
    assert not on and "K, V <= 128" in why
