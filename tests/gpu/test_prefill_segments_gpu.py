"""The segment-parallel state pass compiled on a CUDA GPU at real shapes (ops.md "Segment-parallel
state pass"): pool mode == dense mode bitwise on the segmented path, the segmented path against
the one-pass path and the float64 token-serial reference, untouched pool rows bitwise unchanged,
padding and ``has_initial_state``, and the planner's choice at the long-prompt shapes."""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

from linattn.kernels.triton.prefill import plan_prefill  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda"
BF = torch.bfloat16
TP8 = dict(H=2, HV=8, K=128, V=128)


def _others(P, idx):
    keep = set(int(i) for i in idx.tolist() if i >= 0)
    return torch.tensor([i for i in range(P) if i not in keep], device=DEV)


@pytest.mark.parametrize("pool_dtype", [torch.float32, BF], ids=["fp32pool", "bf16pool"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_segmented_pool_equals_dense_bitwise_and_leaves_other_rows(family, pool_dtype):
    lens = [5000, 0, 1, 3000, 64]
    inp = make_inputs(family, lens, dtype=BF, seed=11, device=DEV, **TP8)
    P = 9
    idx = torch.tensor([4, 0, 7, -1, 2], dtype=torch.int32, device=DEV)
    pool = random_states(P, 8, 128, 128, dtype=pool_dtype, seed=12, device=DEV)
    before = pool.clone()
    o_pool, _ = run(family, inp, state_pool=pool, state_indices=idx, segment_chunks=16)
    live = idx >= 0
    h0 = before[idx.clamp(min=0).long()].clone()
    o_dense, ht = run(family, inp, initial_state=h0, segment_chunks=16)
    torch.cuda.synchronize()
    rows = torch.cumsum(torch.tensor([0] + lens), 0)
    pad = slice(int(rows[3]), int(rows[4]))
    assert torch.equal(o_pool[: pad.start], o_dense[: pad.start]) and torch.equal(o_pool[pad.stop:], o_dense[pad.stop:])
    assert torch.equal(o_pool[pad], torch.zeros_like(o_pool[pad]))  # padding: zero rows
    assert torch.equal(pool[idx[live].long()], ht[live])
    assert torch.equal(pool[_others(P, idx)], before[_others(P, idx)])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_segmented_path_close_to_one_pass_and_reference(family):
    lens = [2000, 300, 0, 1]
    inp = make_inputs(family, lens, dtype=BF, seed=13, device=DEV, gate=-0.002, **TP8)
    h0 = random_states(4, 8, 128, 128, seed=14, device=DEV)
    o1, f1 = run(family, inp, initial_state=h0, segment_chunks=0)
    for L in (2, 6, 16):
        oL, fL = run(family, inp, initial_state=h0, segment_chunks=L)
        assert rel(oL, o1) < 2e-2 and rel(fL, f1) < 1e-2, (L, rel(oL, o1), rel(fL, f1))
    o_ref, f_ref = reference(family, inp, initial_state=h0)
    oL, fL = run(family, inp, initial_state=h0, segment_chunks=4)
    assert rel(oL, o_ref) < 2e-2 and rel(fL, f_ref) < 1e-2


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_segmented_has_initial_state_false_on_nan_slots_equals_zeroed_slots(family):
    lens = [3000, 2000]
    inp = make_inputs(family, lens, dtype=BF, seed=15, device=DEV, **TP8)
    idx = torch.tensor([1, 3], dtype=torch.int32, device=DEV)
    flags = torch.tensor([False, True], device=DEV)
    nan_pool = random_states(5, 8, 128, 128, seed=16, device=DEV)
    nan_pool[1] = float("nan")
    zero_pool = nan_pool.clone()
    zero_pool[1] = 0
    o_nan, _ = run(family, inp, state_pool=nan_pool, state_indices=idx, has_initial_state=flags, segment_chunks=8)
    o_zero, _ = run(family, inp, state_pool=zero_pool, state_indices=idx, segment_chunks=8)
    torch.cuda.synchronize()
    assert torch.equal(o_nan, o_zero)
    assert torch.equal(nan_pool, zero_pool)


@pytest.mark.parametrize("H,HV,T,expect", [(2, 8, 65536, True), (16, 32, 65536, None), (16, 32, 4096 * 16, None)])
def test_planner_segments_long_prompts_on_few_heads_only(H, HV, T, expect):
    q = torch.empty(T, H, 128, dtype=BF, device=DEV)
    v = torch.empty(T, HV, 128, dtype=BF, device=DEV)
    one = plan_prefill("gdn", q=q, v=v, cu_seqlens=torch.tensor([0, T], device=DEV))
    many = plan_prefill("gdn", q=q, v=v, cu_seqlens=torch.arange(0, T + 1, 4096, device=DEV))
    assert many.segment_chunks == 0, many.segment_reason  # the throughput shapes keep one pass
    if expect:
        assert one.segment_chunks > 0, one.segment_reason
