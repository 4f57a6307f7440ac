"""The one-kernel GDN prefill (kernels/cutedsl/fused_prefill.py, ``LINATTN_CUTEDSL_WALK=fused``) against
the two kernels it fuses (the CuTe DSL prep and the ``wgmma`` walk), on an SM90 GPU (H200).

Each test runs ``chunk_prefill(fused=True)`` with the switch at ``wgmma`` (the prep kernel, then the walk)
and at ``fused`` (the test asserts the one kernel ran). Both compute the same products in the same order,
so on inputs whose rows need no F44 scale the outputs and pool rows are pinned bitwise equal; where a
row does (huge q / k rows) the one kernel folds the scale into the rewritten rows, and the result is
pinned against the same problem unscaled. Pool mode in both layouts and pool dtypes, padding rows zero,
``has_initial_state``, rows not owned bitwise unchanged, GVA groups 1, 2 and 3, l2norm off, fp32 and
bf16 beta, the float64 reference within the fused tests' tolerance; a sequence's rows never reach another's
(NaN rows after a partial chunk); the TMA build of the k / q loads (``fused_prefill.TMA``) beside the shipped one
in pool mode and there.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)
from linattn.kernels.cutedsl import sm90_refusal  # noqa: E402

_WHY = sm90_refusal(torch.device("cuda"), "the CuTe DSL one-kernel prefill")
if _WHY:
    pytest.skip(_WHY, allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

from linattn.kernels.cutedsl import fused_prefill as fpk  # noqa: E402
from linattn.kernels.cutedsl import fused_walk as fw  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda"


def _both(monkeypatch, inp, **kw):
    """``(two kernels, one kernel)`` results of the fused prefill on the same inputs (pools cloned)."""
    calls = []
    real = fpk.cutedsl_fused_prefill
    # counted once it returned: a refusal (ValueError, then the two kernels' fallback) is not counted
    monkeypatch.setattr(fpk, "cutedsl_fused_prefill", lambda **a: real(**a) or calls.append(1))
    outs = []
    for walk in ("wgmma", "fused"):
        monkeypatch.setenv(fw.ENV_SWITCH, walk)
        k2 = {n: (x.clone() if n == "state_pool" else x) for n, x in kw.items()}
        o, ht = run("gdn", inp, fused=True, **k2)
        torch.cuda.synchronize()
        outs.append((o, ht, k2.get("state_pool")))
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    assert calls == [1], f"the one-kernel prefill did not run once (refused?): {calls}"
    return outs


@pytest.mark.parametrize("heads", [(4, 8), (2, 6), (4, 4)])
def test_one_kernel_is_bitwise_the_two_kernels_dense(monkeypatch, heads):
    H, HV = heads
    lens = [300, 0, 1, 64, 200, 129]
    inp = make_inputs("gdn", lens, H=H, HV=HV, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=HV)
    h0 = random_states(len(lens), HV, 128, 128, device=DEV) * 0.1
    (o_2, ht_2, _), (o_1, ht_1, _) = _both(monkeypatch, inp, initial_state=h0)
    assert o_1.abs().amax() > 0 and torch.isfinite(ht_1).all()
    assert torch.equal(o_1, o_2) and torch.equal(ht_1, ht_2)
    o_r, ht_r = reference("gdn", inp, initial_state=h0)
    assert rel(o_1, o_r) < 2e-2 and rel(ht_1, ht_r) < 2e-2, (rel(o_1, o_r), rel(ht_1, ht_r))


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_one_kernel_pool_rows_padding_bitwise(monkeypatch, layout, pool_dtype, tma):
    monkeypatch.setattr(fpk, "TMA", tma)
    lens = [300, 1, 64, 0, 200]
    inp = make_inputs("gdn", lens, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    P = 9
    pool = (random_states(P, 8, 128, 128, layout=layout, device=DEV) * 0.1).to(pool_dtype)
    idx = torch.tensor([4, 7, -1, 0, 2], device=DEV, dtype=torch.int32)  # sequence 2 is padding
    flags = torch.tensor([True, False, True, True, True], device=DEV)  # sequence 1 starts from zero
    (o_2, _, work_2), (o_1, _, work_1) = _both(monkeypatch, inp, state_pool=pool, state_indices=idx,
                                               state_layout=layout, has_initial_state=flags)
    own = torch.zeros(P, dtype=torch.bool, device=DEV)
    own[idx[idx >= 0].long()] = True
    assert torch.equal(work_1[~own], pool[~own])  # rows the call does not own: bitwise unchanged
    assert torch.all(o_1[301:365] == 0) and o_1[:301].abs().amax() > 0
    assert torch.equal(o_1, o_2) and torch.equal(work_1, work_2)


@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("beta_dtype", [torch.float32, torch.bfloat16])
def test_one_kernel_l2norm_and_beta_dtypes_bitwise(monkeypatch, l2norm, beta_dtype):
    inp = make_inputs("gdn", [200, 70, 5], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=5)
    inp["beta"] = inp["beta"].to(beta_dtype)
    if not l2norm:  # the caller's rows already unit length
        inp["q"] = torch.nn.functional.normalize(inp["q"].float(), dim=-1).to(torch.bfloat16)
        inp["k"] = torch.nn.functional.normalize(inp["k"].float(), dim=-1).to(torch.bfloat16)
    h0 = random_states(3, 4, 128, 128, device=DEV) * 0.1
    (o_2, ht_2, _), (o_1, ht_1, _) = _both(monkeypatch, inp, initial_state=h0, use_qk_l2norm=l2norm)
    assert o_1.abs().amax() > 0
    assert torch.equal(o_1, o_2) and torch.equal(ht_1, ht_2)


@pytest.mark.parametrize("which", ["q", "qk"])
def test_one_kernel_with_huge_rows_equals_the_unscaled_problem(monkeypatch, which):
    """F44: q (and k) rows times 1e30 (l2norm makes it the same problem): the one kernel folds the
    rows' power-of-two scale into the rewritten tiles (``rk = uk``, ``sq = 1``)."""
    inp = make_inputs("gdn", [200, 70], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=7)
    big = dict(inp)
    for n in which:
        big[n] = inp[n].clone()
        big[n][:200] = big[n][:200] * 1e30
    h0 = random_states(2, 4, 128, 128, device=DEV) * 0.1
    (o_2, ht_2, _), (o_1, ht_1, _) = _both(monkeypatch, big, initial_state=h0)
    (_, _, _), (o_u, ht_u, _) = _both(monkeypatch, inp, initial_state=h0)
    assert torch.isfinite(o_1.float()).all() and torch.isfinite(ht_1).all()
    assert rel(o_1, o_u) < 2e-2 and rel(ht_1, ht_u) < 2e-2, (rel(o_1, o_u), rel(ht_1, ht_u))
    assert rel(o_1, o_2) < 2e-2 and rel(ht_1, ht_2) < 2e-2


def test_one_kernel_at_a_throughput_shape_is_bitwise_the_two_kernels(monkeypatch):
    """Qwen3-Next TP1 heads (16, 32), 2 x 4,096 tokens, fp32 "vk" pool."""
    N, L = 2, 4096
    inp = make_inputs("gdn", [L] * N, H=16, HV=32, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=5)
    pool = random_states(2 * N, 32, 128, 128, device=DEV) * 0.1
    idx = torch.tensor([3, 0], device=DEV, dtype=torch.int32)
    (o_2, _, work_2), (o_1, _, work_1) = _both(monkeypatch, inp, state_pool=pool, state_indices=idx)
    assert torch.equal(o_1, o_2) and torch.equal(work_1, work_2)
    assert torch.equal(work_1[[1, 2]], pool[[1, 2]])


@pytest.mark.parametrize("tma", [True, False])
def test_one_kernel_sequences_do_not_read_each_others_rows(monkeypatch, tma):
    """A sequence whose last chunk is partial (70 = 64 + 6 rows) followed by one whose q, k, v rows are NaN:
    the first sequence's output and final state are bitwise those of the same call with finite rows there
    (TMA loads the next sequence's rows into the partial chunk's tail, which the prep zeroes; ``cp.async``
    never loads them), and bitwise the two kernels'. Both builds of the k / q loads (``fused_prefill.TMA``)."""
    monkeypatch.setattr(fpk, "TMA", tma)
    inp = make_inputs("gdn", [70, 90], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=11)
    bad = dict(inp)
    for n in ("q", "k", "v"):
        bad[n] = inp[n].clone()
        bad[n][70:] = float("nan")
    h0 = random_states(2, 4, 128, 128, device=DEV) * 0.1
    (o_2, ht_2, _), (o_1, ht_1, _) = _both(monkeypatch, inp, initial_state=h0)
    assert torch.equal(o_1, o_2) and torch.equal(ht_1, ht_2)
    (_, _, _), (o_b, ht_b, _) = _both(monkeypatch, bad, initial_state=h0)
    assert torch.isfinite(o_b[:70].float()).all() and o_b[:70].abs().amax() > 0
    assert torch.equal(o_b[:70], o_1[:70]) and torch.equal(ht_b[0], ht_1[0])
