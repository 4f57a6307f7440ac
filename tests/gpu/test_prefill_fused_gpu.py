"""The fused prefill (GDN: kernels/triton/chunk_fused.py; KDA: chunk_fused_kda.py) compiled on a CUDA GPU.

Pinned here, at Qwen3-Next head counts with tail chunks, an empty and a length-1 sequence: the
float64 token-serial reference within ops.md's tolerances (fp32 1e-5; bf16/fp16 no worse than the
pipeline's error plus a margin), pool mode in both layouts and both pool dtypes (rows not owned
bitwise unchanged, padding rows zero, ``has_initial_state``), pool == dense bitwise, and the
planner choosing GDN's at the throughput shapes of issue 27 (KDA's only once prefill.FUSED_KDA_DEFAULT is
set after its H200 measurement).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda"
LENS = [300, 0, 1, 64, 200]


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_matches_reference_and_pipeline(family, dtype):
    inp = make_inputs(family, LENS, H=4, HV=8, K=128, V=128, dtype=dtype, device=DEV)
    h0 = random_states(len(LENS), 8, 128, 128, device=DEV) * 0.1
    o_r, ht_r = reference(family, inp, initial_state=h0)
    o_f, ht_f = run(family, inp, initial_state=h0, fused=True)
    o_p, ht_p = run(family, inp, initial_state=h0, fused=False)
    if dtype == torch.float32:
        assert rel(o_f, o_r) < 1e-5 and rel(ht_f, ht_r) < 1e-5
    else:
        assert rel(o_f, o_r) <= 1.5 * rel(o_p, o_r) + 2e-3, (rel(o_f, o_r), rel(o_p, o_r))
        assert rel(ht_f, ht_r) <= 1.5 * rel(ht_p, ht_r) + 2e-3, (rel(ht_f, ht_r), rel(ht_p, ht_r))


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_fused_pool_rows_padding_and_dense_bitwise(family, layout, pool_dtype):
    lens = [300, 1, 64, 0, 200]
    inp = make_inputs(family, lens, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    P = 9
    pool = (random_states(P, 8, 128, 128, layout=layout, device=DEV) * 0.1).to(pool_dtype)
    idx = torch.tensor([4, 7, -1, 0, 2], device=DEV, dtype=torch.int32)  # sequence 2 is padding
    flags = torch.tensor([True, False, True, True, True], device=DEV)  # sequence 1 starts from zero
    work = pool.clone()
    o, _ = run(family, inp, state_pool=work, state_indices=idx, state_layout=layout, has_initial_state=flags,
               fused=True)
    own = torch.zeros(P, dtype=torch.bool, device=DEV)
    own[idx[idx >= 0].long()] = True
    assert torch.equal(work[~own], pool[~own])  # rows the call does not own: bitwise unchanged
    assert torch.all(o[301:365] == 0) and o[:301].abs().amax() > 0 and o[365:].abs().amax() > 0
    h0 = pool[idx.clamp(min=0).long()].float()
    h0[1] = 0  # has_initial_state False
    live = idx >= 0
    o_d, ht_d = run(family, inp, initial_state=h0.to(pool_dtype), state_layout=layout, fused=True)
    assert torch.equal(o[:301], o_d[:301]) and torch.equal(o[365:], o_d[365:])
    assert torch.equal(work[idx[live].long()], ht_d[live].to(pool_dtype))
    o_p, _ = run(family, inp, state_pool=pool.clone(), state_indices=idx, state_layout=layout,
                 has_initial_state=flags, fused=False)
    assert rel(o, o_p) < 2e-2


def test_planner_picks_fused_at_throughput_shapes():
    for N, L, H, HV in ((16, 4096, 16, 32), (8, 1024, 16, 32)):
        q = torch.empty(N * L, H, 128, dtype=torch.bfloat16, device=DEV)
        v = torch.empty(N * L, HV, 128, dtype=torch.bfloat16, device=DEV)
        cu = torch.arange(0, N * L + 1, L, device=DEV, dtype=torch.int32)
        plan = pm.plan_prefill("gdn", q=q, v=v, cu_seqlens=cu)
        assert plan.fused is not None, plan.fused_reason
        if _cutedsl_walk_refusal() == "":  # SM90 with CuTe DSL: the wgmma walk, BV 128 (the grid fills the SMs)
            assert plan.fused_walk[:2] == ("wgmma", 128), plan.fused_walk
        else:
            assert plan.fused_walk.walk == "triton", plan.fused_walk


def _cutedsl_walk_refusal() -> str:
    from linattn.kernels.cutedsl import fused_walk as fw

    return fw.walk_refusal(family="gdn", K=128, V=128, dtype=torch.bfloat16, device=torch.device(DEV))
