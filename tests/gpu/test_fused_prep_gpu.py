"""The CuTe DSL prep of the fused GDN prefill (kernels/cutedsl/fused_prep.py, the planner's default;
``LINATTN_CUTEDSL_PREP=0``: the Triton prep) against the Triton prep and the float64 reference, on an SM90 GPU (H200).

Pinned: the prep's buffers (``tmb``, ``aqk``, ``rk``, ``qs``) against the Triton prep's on the same
planned call (varlen with tail chunks, empty and one-token sequences, GVA groups of 1, 2 and 3
value heads, l2norm on and off, F44's huge rows), within bf16's rounding; the whole prefill with the
CuTe prep (Triton walk and wgmma walk) against the float64 token-serial reference within the fused
tests' tolerance (no worse than 1.5x the Triton prep's error plus 2e-3); pool mode with padding and
rows not owned bitwise unchanged, pool == dense bitwise; the worst-conditioned input no worse than
the Triton prep.
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

_WHY = sm90_refusal(torch.device("cuda"), "the CuTe DSL fused prep")  # not SM90, or nvidia-cutlass-dsl does not import
if _WHY:
    pytest.skip(_WHY, allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

from linattn.kernels.cutedsl import fused_prep as fp  # noqa: E402
from linattn.kernels.cutedsl import fused_walk as fw  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run, worst_conditioned  # noqa: E402

DEV = "cuda"
LENS = [300, 0, 1, 64, 200]


def _prep_buffers(monkeypatch, inp, on: bool, use_qk_l2norm=True):
    """The prep's ``(tmb, aqk, rk, qs)`` of one planned fused call and the mask of written rows."""
    from linattn.kernels.triton import prefill as pm

    monkeypatch.setenv(fp.ENV_SWITCH, "1" if on else "0")
    monkeypatch.setattr(fw, "run_for_plan", lambda *a: True)  # the prep alone
    monkeypatch.setenv(fw.ENV_SWITCH, "1")
    plan = pm.plan_prefill("gdn", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"],
                           use_qk_l2norm=use_qk_l2norm, fused=True)
    b = pm.allocate_buffers(plan)
    for x in (b.fused_tmb, b.fused_aqk, b.rk, b.fused_qs):
        x.fill_(float("nan"))
    x = pm.conform_inputs(plan, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["cu_seqlens"])
    st = pm.prefill_state(plan, b, None, None, None, None)
    pm.launch_fused_stages(plan, x, pm.launch_tables(plan, x.cu_seqlens), b, st, inp["q"].shape[-1] ** -0.5)
    torch.cuda.synchronize()
    return [t.clone() for t in (b.fused_tmb, b.fused_aqk, b.rk, b.fused_qs)]


def _compare_preps(monkeypatch, inp, use_qk_l2norm=True):
    called = []
    real = fp.cutedsl_fused_prep
    monkeypatch.setattr(fp, "cutedsl_fused_prep", lambda **a: (called.append(1), real(**a))[1])
    tri = _prep_buffers(monkeypatch, inp, False, use_qk_l2norm)
    cut = _prep_buffers(monkeypatch, inp, True, use_qk_l2norm)
    assert called == [1], "the CuTe DSL prep did not run as asked (refused?)"
    for name, t, c in zip(("tmb", "aqk", "rk", "qs"), tri, cut):
        assert torch.isfinite(c.float()).all(), f"{name}: a row was not written or is not finite"
        assert rel(c, t) < 1e-2, (name, rel(c, t))
        if name in ("tmb", "aqk"):  # bf16 of fp32 values that differ in summation order only
            assert (c.float() - t.float()).abs().max() <= 2e-2 * t.float().abs().max() + 1e-3, name
    return tri, cut


@pytest.mark.parametrize("H,HV", [(4, 8), (2, 2), (2, 6)])
@pytest.mark.parametrize("l2norm", [True, False])
def test_cutedsl_prep_buffers_match_triton_prep(monkeypatch, H, HV, l2norm):
    inp = make_inputs("gdn", LENS, H=H, HV=HV, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=11)
    if not l2norm:  # keys of norm ~1, as an l2-normalised model feeds them
        inp["k"] = (inp["k"].float() / inp["k"].float().norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    _compare_preps(monkeypatch, inp, l2norm)


def test_cutedsl_prep_with_huge_rows_matches_triton_prep(monkeypatch):
    """F44: a sequence's q and k rows times 1e30 (finite bf16): the power-of-two row scales."""
    inp = make_inputs("gdn", [200, 70], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=7)
    for n in "qk":
        x = inp[n].float()
        x[:200] *= 1e30
        inp[n] = x.to(torch.bfloat16)
    tri, cut = _compare_preps(monkeypatch, inp)
    assert (cut[3][:200, :, 1] < 1).all()  # sq: scaled rows


def _both(monkeypatch, inp, walk="", **kw):
    """``(triton prep, cutedsl prep)`` results of the fused prefill on the same inputs."""
    outs = []
    if walk:
        monkeypatch.setenv(fw.ENV_SWITCH, walk)
    for on in (False, True):
        monkeypatch.setenv(fp.ENV_SWITCH, "1" if on else "0")
        k2 = {n: (x.clone() if n == "state_pool" else x) for n, x in kw.items()}
        o, ht = run("gdn", inp, fused=True, **k2)
        torch.cuda.synchronize()
        outs.append((o, ht, k2.get("state_pool")))
    monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    return outs


@pytest.mark.parametrize("walk", ["0", "wgmma"])  # 0: the Triton walk (LINATTN_CUTEDSL_WALK; the planner would pick wgmma)
def test_prefill_with_cutedsl_prep_matches_reference(monkeypatch, walk):
    inp = make_inputs("gdn", LENS, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    h0 = random_states(len(LENS), 8, 128, 128, device=DEV) * 0.1
    o_r, ht_r = reference("gdn", inp, initial_state=h0)
    (o_t, ht_t, _), (o_c, ht_c, _) = _both(monkeypatch, inp, walk, initial_state=h0)
    assert torch.isfinite(o_c.float()).all() and torch.isfinite(ht_c).all()
    assert rel(o_c, o_r) <= 1.5 * rel(o_t, o_r) + 2e-3, (rel(o_c, o_r), rel(o_t, o_r))
    assert rel(ht_c, ht_r) <= 1.5 * rel(ht_t, ht_r) + 2e-3, (rel(ht_c, ht_r), rel(ht_t, ht_r))


def test_prefill_with_cutedsl_prep_pool_rows_padding_and_dense_bitwise(monkeypatch):
    lens = [300, 1, 64, 0, 200]
    inp = make_inputs("gdn", lens, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    P = 9
    pool = random_states(P, 8, 128, 128, device=DEV) * 0.1
    idx = torch.tensor([4, 7, -1, 0, 2], device=DEV, dtype=torch.int32)  # sequence 2 is padding
    (o_t, _, work_t), (o, _, work) = _both(monkeypatch, inp, "wgmma", state_pool=pool, state_indices=idx)
    own = torch.zeros(P, dtype=torch.bool, device=DEV)
    own[idx[idx >= 0].long()] = True
    assert torch.equal(work[~own], pool[~own])  # rows the call does not own: bitwise unchanged
    assert torch.all(o[301:365] == 0) and o[:301].abs().amax() > 0
    live = idx >= 0
    assert rel(o, o_t) < 2e-2 and rel(work[idx[live].long()], work_t[idx[live].long()]) < 2e-2
    h0 = pool[idx.clamp(min=0).long()]
    (_, _, _), (o_d, ht_d, _) = _both(monkeypatch, inp, "wgmma", initial_state=h0)
    assert torch.equal(o[:301], o_d[:301]) and torch.equal(o[365:], o_d[365:])
    assert torch.equal(work[idx[live].long()], ht_d[live])


def test_worst_conditioned_no_worse_than_triton_prep(monkeypatch):
    inp = worst_conditioned(make_inputs("gdn", [64, 130, 1000], H=16, HV=32, K=128, V=128,
                                        dtype=torch.bfloat16, seed=43, device=DEV))
    ro, rht = reference("gdn", inp)
    (o_t, ht_t, _), (o_c, ht_c, _) = _both(monkeypatch, inp)
    eo_t, es_t, eo_c, es_c = rel(o_t, ro), rel(ht_t, rht), rel(o_c, ro), rel(ht_c, rht)
    print(f"worst-conditioned: triton prep o {eo_t:.2e} state {es_t:.2e}; cutedsl prep o {eo_c:.2e} state {es_c:.2e}")
    assert torch.isfinite(o_c.float()).all()
    assert eo_c <= 1.05 * eo_t + 1e-4 and es_c <= 1.05 * es_t + 1e-4


def _prep_with_solve(monkeypatch, inp, solve):
    monkeypatch.setattr(fp, "SOLVE", solve)
    return _prep_buffers(monkeypatch, inp, True)


@pytest.mark.parametrize("H,HV", [(4, 8), (2, 6)])  # GVA groups of 2 and 3 (a pass with one value head)
@pytest.mark.parametrize("case", ["random", "worst", "beta2", "near_singular"])
def test_blockwise_solve_matches_the_column_substitution(monkeypatch, case, H, HV):
    """The blockwise solve (block doubling, products on bf16 hi/lo splits) against the whole-block fp32
    substitution on the same inputs: ``aqk``, ``rk``, ``qs`` bitwise (the same code), ``tmb`` within
    2.5e-4 of each row's largest entry on random inputs (hi-only products would be about 1e-3 off) and
    within a bf16 step on the ill-conditioned ones (one step of an entry in the largest's binade is up to
    2**-7 of it: the H200 measured 3.95e-3, one rounding flip, on ``near_singular``). ``worst``: every key equal, beta 1, no decay (Tm's
    entries 0 and +-1 from cancelling products); ``beta2``: the same at beta 2; ``near_singular``: the
    keys equal plus 5% noise, beta 1.99."""
    inp = make_inputs("gdn", [300, 1, 64, 130], H=H, HV=HV, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=5)
    if case != "random":
        inp = worst_conditioned(inp)
    if case == "beta2":
        inp["beta"] = inp["beta"] * 2
    if case == "near_singular":
        k = inp["k"].float()
        inp["k"] = (k + 0.05 * k.norm(dim=-1, keepdim=True) / 128 ** 0.5 * torch.randn_like(k)).to(torch.bfloat16)
        inp["beta"] = inp["beta"] * 1.99
    col = _prep_with_solve(monkeypatch, inp, "column")
    blk = _prep_with_solve(monkeypatch, inp, "blocks")
    for name, c, b in zip(("aqk", "rk", "qs"), col[1:], blk[1:]):
        assert torch.equal(c, b), name
    t_c, t_b = col[0].float(), blk[0].float()
    assert torch.isfinite(t_b).all()
    scale = t_c.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)  # per (row, value head)
    err = ((t_b - t_c).abs() / scale).max().item()
    print(f"{case}: tmb blocks vs column: {err:.2e} of each row's largest entry; largest {t_c.abs().max():.3g}")
    assert err <= (2.5e-4 if case == "random" else 2.0 ** -7), err
