"""The CuTe DSL walk of the fused GDN prefill (kernels/cutedsl/fused_walk.py, ``LINATTN_CUTEDSL_WALK``)
against the Triton walk on the same prep outputs, on an SM90 GPU (H200).

Each test runs ``chunk_prefill(fused=True)`` twice on the same inputs, the switch at ``0`` (the Triton
walk ``chunk_gdn_fused_kernel``) and on (the CuTe DSL walk; the test asserts that it ran), so the
Triton prep kernel's ``tmb, aqk, rk, qs`` are the same. Every test but the last runs for both
builds of the walk (``walk``: the switch's value, ``"1"`` warp ``mma.sync``, ``"wgmma"`` warpgroup
MMAs); the last pins the two builds' results bitwise equal. Pinned: the float64 token-serial reference
within the fused tests' tolerance (tests/gpu/test_prefill_fused_gpu.py: no worse than 1.5x the
Triton walk's error plus 2e-3; bitwise equality with the Triton walk is not expected), pool mode in
both layouts and pool dtypes with rows not owned bitwise unchanged, padding rows zero and
``has_initial_state``, pool == dense bitwise, both value blocks (128: 8 warps, two warpgroups; 64: 4 warps, one).
The planner's default (the switch unset: the ``wgmma`` build) recorded and replayed (``PrefillLaunch``,
``PrefillReplay``'s T buckets) against the same call unrecorded: bitwise, with the Triton prep and with
the CuTe DSL prep (the default, ``LINATTN_CUTEDSL_PREP`` unset: a ``PrepStep`` before the ``WalkStep``).
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

_WHY = sm90_refusal(torch.device("cuda"), "the CuTe DSL fused walk")  # not SM90, or nvidia-cutlass-dsl does not import
if _WHY:
    pytest.skip(_WHY, allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

from linattn.capabilities import probe  # noqa: E402
from linattn.kernels.cutedsl import fused_prep as fp  # noqa: E402
from linattn.kernels.cutedsl import fused_walk as fw  # noqa: E402
from linattn.kernels.triton import launch as launch_mod  # noqa: E402
from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda"
LENS = [300, 0, 1, 64, 200]
WALKS = pytest.mark.parametrize("walk", sorted(fw.MMA_VARIANTS))  # "1" (mma.sync), "wgmma"


def _both(monkeypatch, inp, walk, bv=None, **kw):
    """``(triton, cutedsl)`` results of the fused prefill on the same inputs (states cloned per run)."""
    calls = []
    real = fw.cutedsl_fused_walk

    def counted(**a):
        calls.append(a.get("mma"))
        return real(**{**a, **({} if bv is None else {"bv": bv})})

    monkeypatch.setattr(fw, "cutedsl_fused_walk", counted)
    outs = []
    for on in (False, True):
        monkeypatch.setenv(fw.ENV_SWITCH, walk if on else "0")  # "0": the Triton walk (unset: the planner's, wgmma)
        k2 = {n: (x.clone() if n == "state_pool" else x) for n, x in kw.items()}
        o, ht = run("gdn", inp, fused=True, **k2)
        torch.cuda.synchronize()
        outs.append((o, ht, k2.get("state_pool")))
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    assert calls == [fw.MMA_VARIANTS[walk]], f"the CuTe DSL walk did not run as asked (refused?): {calls}"
    return outs


@WALKS
@pytest.mark.parametrize("bv", [128, 64])
def test_cutedsl_walk_matches_reference_and_triton_walk(monkeypatch, bv, walk):
    inp = make_inputs("gdn", LENS, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    h0 = random_states(len(LENS), 8, 128, 128, device=DEV) * 0.1
    o_r, ht_r = reference("gdn", inp, initial_state=h0)
    (o_t, ht_t, _), (o_c, ht_c, _) = _both(monkeypatch, inp, walk, bv=bv, initial_state=h0)
    assert torch.isfinite(o_c.float()).all() and torch.isfinite(ht_c).all()
    assert rel(o_c, o_r) <= 1.5 * rel(o_t, o_r) + 2e-3, (rel(o_c, o_r), rel(o_t, o_r))
    assert rel(ht_c, ht_r) <= 1.5 * rel(ht_t, ht_r) + 2e-3, (rel(ht_c, ht_r), rel(ht_t, ht_r))
    assert rel(o_c, o_t) < 2e-2 and rel(ht_c, ht_t) < 2e-2


@WALKS
def test_cutedsl_walk_without_initial_state(monkeypatch, walk):
    inp = make_inputs("gdn", [129, 64, 7], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=3)
    o_r, ht_r = reference("gdn", inp)
    (o_t, ht_t, _), (o_c, ht_c, _) = _both(monkeypatch, inp, walk)
    assert rel(o_c, o_r) <= 1.5 * rel(o_t, o_r) + 2e-3, (rel(o_c, o_r), rel(o_t, o_r))
    assert rel(ht_c, ht_r) <= 1.5 * rel(ht_t, ht_r) + 2e-3, (rel(ht_c, ht_r), rel(ht_t, ht_r))


@WALKS
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_cutedsl_walk_pool_rows_padding_and_dense_bitwise(monkeypatch, layout, pool_dtype, walk):
    lens = [300, 1, 64, 0, 200]
    inp = make_inputs("gdn", lens, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV)
    P = 9
    pool = (random_states(P, 8, 128, 128, layout=layout, device=DEV) * 0.1).to(pool_dtype)
    idx = torch.tensor([4, 7, -1, 0, 2], device=DEV, dtype=torch.int32)  # sequence 2 is padding
    flags = torch.tensor([True, False, True, True, True], device=DEV)  # sequence 1 starts from zero
    (o_t, _, work_t), (o, _, work) = _both(monkeypatch, inp, walk, state_pool=pool, state_indices=idx,
                                           state_layout=layout, has_initial_state=flags)
    own = torch.zeros(P, dtype=torch.bool, device=DEV)
    own[idx[idx >= 0].long()] = True
    assert torch.equal(work[~own], pool[~own])  # rows the call does not own: bitwise unchanged
    assert torch.all(o[301:365] == 0) and o[:301].abs().amax() > 0 and o[365:].abs().amax() > 0
    live = idx >= 0
    assert rel(o, o_t) < 2e-2
    assert rel(work[idx[live].long()].float(), work_t[idx[live].long()].float()) < 2e-2
    # the float64 reference on the same entering states (dense; the padding sequence's rows zero)
    h0 = pool[idx.clamp(min=0).long()].float()
    h0[1] = 0  # has_initial_state False
    o_r, _ = reference("gdn", inp, initial_state=h0, state_layout=layout)
    o_r[301:365] = 0
    assert rel(o, o_r) <= 1.5 * rel(o_t, o_r) + 2e-3, (rel(o, o_r), rel(o_t, o_r))
    # dense mode on the same entering states: the same instructions, bitwise
    (_, _, _), (o_d, ht_d, _) = _both(monkeypatch, inp, walk, initial_state=h0.to(pool_dtype),
                                         state_layout=layout)
    assert torch.equal(o[:301], o_d[:301]) and torch.equal(o[365:], o_d[365:])
    assert torch.equal(work[idx[live].long()], ht_d[live].to(pool_dtype))


@WALKS
def test_cutedsl_walk_at_a_throughput_shape_matches_triton_walk(monkeypatch, walk):
    """Qwen3-Next TP1 heads (16, 32), 2 x 4,096 tokens, fp32 "vk" pool."""
    N, L = 2, 4096
    inp = make_inputs("gdn", [L] * N, H=16, HV=32, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=5)
    pool = random_states(2 * N, 32, 128, 128, device=DEV) * 0.1
    idx = torch.tensor([3, 0], device=DEV, dtype=torch.int32)
    (o_t, _, work_t), (o_c, _, work_c) = _both(monkeypatch, inp, walk, state_pool=pool, state_indices=idx)
    assert rel(o_c, o_t) < 1e-2, rel(o_c, o_t)
    assert rel(work_c[idx.long()], work_t[idx.long()]) < 1e-2
    assert torch.equal(work_c[[1, 2]], pool[[1, 2]])


@WALKS
@pytest.mark.parametrize("which", ["q", "qk"])
def test_cutedsl_walk_with_huge_rows_equals_the_unscaled_problem(monkeypatch, which, walk):
    """F44: q (and k) rows of one sequence times 1e30 (finite bf16; l2norm makes it the same
    problem): the chunk's query scale ``c`` takes the state operand down by a power of two."""
    inp = make_inputs("gdn", [200, 70], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=7)
    big = dict(inp)
    for n in which:
        big[n] = inp[n].clone()
        big[n][:200] = big[n][:200] * 1e30
    h0 = random_states(2, 4, 128, 128, device=DEV) * 0.1
    (o_t, ht_t, _), (o_c, ht_c, _) = _both(monkeypatch, big, walk, initial_state=h0)
    (_, _, _), (o_u, ht_u, _) = _both(monkeypatch, inp, walk, initial_state=h0)
    assert torch.isfinite(o_c.float()).all() and torch.isfinite(ht_c).all()
    assert rel(o_c, o_u) < 2e-2 and rel(ht_c, ht_u) < 2e-2, (rel(o_c, o_u), rel(ht_c, ht_u))
    assert rel(o_c, o_t) < 2e-2 and rel(ht_c, ht_t) < 2e-2


@pytest.mark.parametrize("bv", [128, 64])
def test_wgmma_walk_is_bitwise_the_mma_sync_walk(monkeypatch, bv):
    """The warpgroup build (at either value block) against the warp build at 128: the same bf16
    operands and fp32 products in the same order, so the same bits (measured on the H200,
    2026-12-03, up to 4 x 8,192 at (16, 64)); pool mode with padding and has_initial_state."""
    lens = [300, 1, 64, 0, 200]
    inp = make_inputs("gdn", lens, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=11)
    pool = random_states(7, 8, 128, 128, device=DEV) * 0.1
    idx = torch.tensor([4, 6, -1, 0, 2], device=DEV, dtype=torch.int32)
    flags = torch.tensor([True, False, True, True, True], device=DEV)
    real = fw.cutedsl_fused_walk
    outs = []
    for walk, block in (("1", 128), ("wgmma", bv)):
        calls = []
        monkeypatch.setattr(fw, "cutedsl_fused_walk", lambda **a: calls.append(a["mma"]) or real(**{**a, "bv": block}))
        monkeypatch.setenv(fw.ENV_SWITCH, walk)
        work = pool.clone()
        o, _ = run("gdn", inp, fused=True, state_pool=work, state_indices=idx, has_initial_state=flags)
        torch.cuda.synchronize()
        assert calls == [fw.MMA_VARIANTS[walk]]
        assert torch.equal(work[[1, 3, 5]], pool[[1, 3, 5]]), "pool rows the call does not own changed"
        outs.append((o, work))
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[1][0].abs().amax() > 0


# -- the planner's default, recorded and replayed -----------------------------------------------------

NAMES = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")


def _pool_call(lens, seed, P=9, HV=8, H=4):
    kw = make_inputs("gdn", lens, H=H, HV=HV, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=seed)
    idx = torch.tensor([4, 7, -1, 0, 2, 5, 1][:len(lens)], device=DEV, dtype=torch.int32)
    kw.update(state_pool=random_states(P, HV, 128, 128, device=DEV, seed=seed) * 0.1, state_indices=idx,
              has_initial_state=torch.tensor([True, False, True, True, True, True, False][:len(lens)], device=DEV))
    return kw


def _plan_of(kw, **over):
    keys = ("q", "v", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")
    return pm.plan_prefill("gdn", **{n: kw[n] for n in keys if kw.get(n) is not None}, **over)


def _unrecorded(monkeypatch, plan, kw):
    """``run_prefill`` with the stages run one by one (nothing recorded), on a copy of the pool."""
    kw = dict(kw, state_pool=kw["state_pool"].clone()) if kw.get("state_pool") is not None else dict(kw)
    with monkeypatch.context() as m:
        m.setattr(pm.PrefillPlan, "replayable", property(lambda self: False))
        o, final = pm.run_prefill(plan, **kw, scale=0.125)
    torch.cuda.synchronize()
    return o, final, kw.get("state_pool")


def _same(got, want, before):
    (o, final, pool), (o_r, final_r, pool_r) = got, want
    assert torch.equal(o, o_r) and o.abs().amax() > 0
    assert (final is None) == (final_r is None) and (final is None or torch.equal(final, final_r))
    if pool is not None:
        assert torch.equal(pool, pool_r)
        idx = before["state_indices"]
        own = torch.zeros(pool.shape[0], dtype=torch.bool, device=DEV)
        own[idx[idx >= 0].long()] = True
        assert torch.equal(pool[~own], before["state_pool"][~own])  # rows not owned: bitwise as given


def _steps_run(monkeypatch) -> list:
    """The CuTe DSL steps launched from now on: ``"prep"`` per PrepStep, ``(mma, value block)`` per WalkStep."""
    ran, walk, prep = [], fw.WalkStep.__call__, fp.PrepStep.__call__
    monkeypatch.setattr(fw.WalkStep, "__call__", lambda self, args: ran.append((self.key.mma, self.key.BV))
                        or walk(self, args))
    monkeypatch.setattr(fp.PrepStep, "__call__", lambda self, args: ran.append("prep") or prep(self, args))
    return ran


PREPS = pytest.mark.parametrize("prep", ["triton", "cutedsl"])  # LINATTN_CUTEDSL_PREP 0 / unset (the default)


def _set_prep(monkeypatch, prep: str) -> list:
    """The prep switch for ``prep``; the steps a call then runs before its walk."""
    if prep == "cutedsl":
        monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
        return ["prep"]
    monkeypatch.setenv(fp.ENV_SWITCH, "0")
    return []


def test_the_planner_picks_the_wgmma_walk_and_the_switch_overrides_it(monkeypatch):
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    kw = _pool_call([300, 1, 64, 0, 200], seed=21)
    plan = _plan_of(kw, fused=True)
    assert plan.fused_walk.walk == "wgmma" and plan.fused_walk.block_v == 64, plan.fused_walk  # 5 x 8 CTAs < SMs
    for value, walk in (("0", "triton"), ("triton", "triton"), ("1", "sync"), ("wgmma", "wgmma")):
        monkeypatch.setenv(fw.ENV_SWITCH, value)
        assert _plan_of(kw, fused=True).fused_walk.walk == walk


@PREPS
@pytest.mark.parametrize("dense", [False, True])
def test_a_recorded_then_replayed_wgmma_walk_is_bitwise_the_unrecorded_call(monkeypatch, dense, prep):
    """The planner's walk (switch unset: wgmma) under run_prefill's recording: call 1 stage by stage,
    call 2 recorded (prep + WalkStep) and replayed, calls 3 and 4 replayed on new tensors of the
    same signature (direct launches); each bitwise the same call run unrecorded. With the CuTe DSL
    prep, its PrepStep is recorded and replayed before the walk's."""
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    before = _set_prep(monkeypatch, prep)
    lens = [300, 1, 64, 0, 200]
    calls = []
    for seed in (22, 22, 23, 24):
        kw = _pool_call(lens, seed)
        if dense:
            kw.update(initial_state=kw.pop("state_pool")[:len(lens)].contiguous(), state_indices=None,
                      has_initial_state=None)
            kw["state_pool"] = None
        calls.append(kw)
    plan = _plan_of(calls[0], fused=True)
    assert plan.fused_walk.walk == "wgmma" and plan.replayable
    ran = _steps_run(monkeypatch)
    for i, kw in enumerate(calls):
        want = _unrecorded(monkeypatch, plan, kw)
        del ran[:]
        work = dict(kw, state_pool=kw["state_pool"].clone()) if not dense else dict(kw)
        o, final = pm.run_prefill(plan, **work, scale=0.125)
        torch.cuda.synchronize()
        assert ran == before + [("wgmma", plan.fused_walk.block_v)], (i, ran)  # the walk ran once, as a step
        _same((o, final, work.get("state_pool")), want, kw)
    (launch,) = plan.launches.values()
    assert isinstance(launch, pm.PrefillLaunch), launch
    assert isinstance(launch.sequence, launch_mod.SteppedSequence)
    assert [type(s) for s in launch.sequence.steps] == [fp.PrepStep] * len(before) + [fw.WalkStep]
    # the steps launched through their argument cells (the compiled executors' layout held), not the
    # executor's own per-call conversion
    assert all(s._cells is not None for s in launch.sequence.steps)


@PREPS
def test_a_prefill_bucket_replays_the_wgmma_walk_with_the_bits_of_its_own_plan(monkeypatch, prep):
    """PrefillReplay (issue 28): calls of new T in one bucket replay prep + wgmma walk, bitwise the
    call planned for its own T and run unrecorded (the CuTe DSL prep then writes into the bucket's
    buffers, which hold more rows than the call)."""
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    before = _set_prep(monkeypatch, prep)
    heads = dict(H=16, HV=32)  # 5 x 32 programs fill the SMs: the planner's fused prefill, BV 128
    first = _pool_call([300, 1, 64, 0, 200], seed=25, **heads)  # T = 565: bucket 640
    replay = pm.PrefillReplay("gdn", dict(first, scale=0.125, use_qk_l2norm=True, state_layout="vk"),
                              probe(first["q"].device), "split")
    ran = _steps_run(monkeypatch)
    for lens, seed in (([300, 1, 64, 0, 200], 25), ([290, 5, 60, 3, 199], 26), ([280, 9, 64, 1, 200], 27)):
        kw = _pool_call(lens, seed, **heads)
        want = _unrecorded(monkeypatch, _plan_of(kw), kw)
        del ran[:]
        work = dict(kw, state_pool=kw["state_pool"].clone())
        o, final = replay(work)
        torch.cuda.synchronize()
        assert ran == before + [("wgmma", 128)], ran
        _same((o, final, work["state_pool"]), want, kw)
    (plan, launch, _), = replay.entries.values()
    assert plan.fused is not None and isinstance(launch, pm.PrefillLaunch)


def test_the_argument_cells_launch_bitwise_as_the_executors_own_call(monkeypatch):
    """The CuTe DSL prep and walk launched through their argument cells (``CuteStep``'s fast path) give
    the bits of the same call launched through CuTe DSL's executor (CuTe objects, its own argument
    conversion), on the same inputs, outputs and pool rows; the fast path did run."""
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
    kw = _pool_call([300, 1, 64, 0, 200], seed=31)
    plan = _plan_of(kw, fused=True)
    assert plan.fused_walk.walk == "wgmma"

    def run():
        fw._STEPS.clear()
        got = _unrecorded(monkeypatch, plan, kw)
        return got, list(fw._STEPS.values())

    fast, steps = run()
    assert len(steps) == 2 and all(s._cells is not None for s in steps)  # prep and walk through their cells
    with monkeypatch.context() as m:
        m.setattr(fw, "_executor_layout", lambda step, n_ptrs, n_strides: False)
        m.setattr(fw, "_LAYOUTS", {})
        slow, steps = run()
    assert len(steps) == 2 and all(s._cells is None for s in steps)  # the executor's own call
    _same(fast, slow, kw)
