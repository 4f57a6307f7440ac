"""GDN's bf16 chunked prefill: the three ways its stages split the work, each against the way it
replaced (``prefill_config(...).gdn``, a :class:`~linattn.kernels.triton.prefill.GdnStageSplit`).

- ``gates_kernel``: the state loop's gate factors ``rk exp(G_C - G)`` and ``exp(G_C)`` come from
  their own launch (``chunk_gdn_gates_kernel``) instead of a scan per chunk in the state loop.
- ``every_second_state``: the state stage stores the state entering every second chunk only; the
  grouped output kernel rebuilds the others' share from the chunk before.
- ``u_in_state``: stage 1 writes ``Tm diag(beta)`` and the state stage forms ``U`` itself.

Each test runs one call twice in pool mode (a padding sequence, an empty one, odd and even chunk
counts, foreign rows, two value blocks: V = 128), once with the option and once without, every
buffer the call allocates starting as NaN (an unwritten entry read would show), and checks: which
kernels launched with which constexprs, padding rows zero, rows no live sequence owns bitwise
unchanged, dense mode equal to pool mode bitwise, both runs against the float64 reference (bf16's
2e-2 / 1e-2), and the two within a bound (the interpreter computes in fp32: 1e-5; compiled, bf16
operands round differently: 1e-2).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled  # noqa: E402
from linattn.kernels.triton import chunk_intra, chunk_output, chunk_state  # noqa: E402

from prefill_cases import check_two_bf16_pool_runs, make_inputs, nan_run, random_states, rel, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LENS, SLOTS = [70, 0, 5, 130, 64], [3, 1, -1, 0, 5]  # chunk counts 2, 0, 1 (padding), 3, 1
P, H, HV, K, V = 7, 2, 4, 64, 128


def _launches(monkeypatch, pm) -> list:
    """Record (kernel name, grid, constexprs of interest) of every prefill launch."""
    seen = []
    keys = ("HOIST", "HSTEP", "UTM", "HALF", "TMOUT")
    for kernel in (chunk_intra.chunk_intra_kernel, chunk_state.chunk_gdn_gates_kernel, chunk_state.chunk_state_kernel,
                   chunk_output.chunk_output_grouped_kernel, chunk_output.chunk_output_kernel):
        def spy(*a, _run=kernel.run, _k=kernel, **kw):
            seen.append((_k.fn.__name__, tuple(kw["grid"]), {k: kw[k] for k in keys if k in kw}))
            return _run(*a, **kw)
        monkeypatch.setattr(kernel, "run", spy)
    return seen


#: (H, HV, dense) -> the "on" run of :func:`_two_runs` where it is the pinned configuration itself (no
#: ``fixed``, the option pinned on): the same call for every option, so it runs (and its dense-mode
#: comparison is asserted) once per module; clones are handed out (interpreter time).
_PINNED_RUN: dict[tuple, tuple] = {}


def _two_runs(monkeypatch, option: str, fixed: dict | None = None, H=H, HV=HV, pinned_on=True, dense=False):
    """The call with the pinned configuration (its GDN stage split updated with ``fixed``) with the
    split's field ``option`` on and off;
    returns the inputs, the pool before, the (output, pool) pairs and the launches of each run.
    With ``dense``, the first run is repeated in dense mode, which must give the same bits."""
    from linattn.kernels.triton import prefill as pm

    inp = make_inputs("gdn", LENS, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=91, device=DEV)
    idx = torch.tensor(SLOTS, dtype=torch.int32, device=DEV)
    before = random_states(P, HV, K, V, seed=92, device=DEV)
    pinned = pm.prefill_config
    if pinned_on:
        assert getattr(pinned("gdn", K, V, torch.bfloat16).gdn, option), f"{option} is not pinned on for bf16 GDN"
    seen = _launches(monkeypatch, pm)
    runs, launches = [], []
    shared = (H, HV, dense) if fixed is None and pinned_on else None
    for on in (True, False):
        if on and shared in _PINNED_RUN:
            o, pool, ran = _PINNED_RUN[shared]
            runs.append((o.clone(), pool.clone()))
            launches.append(list(ran))
            continue

        def config(*a, _on=on, **kw):
            cfg = pinned(*a, **kw)
            return replace(cfg, gdn=replace(cfg.gdn, **(fixed or {}), **{option: _on}))
        monkeypatch.setattr(pm.config, "prefill_config", config)
        pool = before.clone()
        o, _ = nan_run(monkeypatch, "gdn", inp, state_pool=pool, state_indices=idx)
        runs.append((o, pool))
        launches.append(list(seen))
        seen.clear()
        if on and dense:  # dense mode: the same instructions on the same data
            live = [i for i, s in enumerate(SLOTS) if s >= 0]
            sub = torch.tensor(live, device=DEV)
            h0 = torch.zeros(len(SLOTS), HV, V, K, device=DEV)
            h0[sub] = before[idx.long()[sub]]
            od, hd = nan_run(monkeypatch, "gdn", inp, initial_state=h0)
            seen.clear()
            pad = [i for i, s in enumerate(SLOTS) if s < 0]
            cu = inp["cu_seqlens"].tolist()
            keep = torch.ones(o.shape[0], dtype=torch.bool, device=DEV)
            for i in pad:
                keep[cu[i]:cu[i + 1]] = False
            assert torch.equal(o[keep], od[keep])
            assert torch.equal(pool[idx.long()[sub]], hd[sub])
        if on and shared is not None:
            _PINNED_RUN[shared] = (o.clone(), pool.clone(), list(launches[-1]))
    return inp, idx, before, runs, launches


def _check_pool_runs(inp, idx, before, runs, close: tuple) -> None:
    """prefill_cases.check_two_bf16_pool_runs, with the two runs' outputs and final states within
    ``close = (output, state)``."""
    (o1, p1), (o2, p2) = runs
    check_two_bf16_pool_runs("gdn", inp, idx, before, [o1, o2], [p1, p2], pool_close=close[1])
    assert rel(o1, o2) < close[0]


def _bound(state: float = 1e-5) -> tuple:
    """(output, state): the interpreter computes in fp32 (outputs are bf16: an element rounded the
    other way moves the norm by ~1e-5, so 1e-3 there); compiled, bf16 operands round differently."""
    return (1e-3, state) if interpreter_enabled() else (1e-2, 1e-2)


def test_gdn_gate_factors_from_their_own_launch_match_the_scan_in_the_state_loop(monkeypatch):
    # every chunk's state stored in both runs (the rebuild needs the gates kernel's factors)
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "gates_kernel", fixed={"every_second_state": False})
    nt_max = sum(LENS) // 64 + len(LENS)
    assert [(n, g) for n, g, _ in on if n == "chunk_gdn_gates_kernel"] == [("chunk_gdn_gates_kernel", (nt_max, 1))]
    assert [c["HOIST"] for n, _, c in on if n == "chunk_state_kernel"] == [True]
    assert not any(n == "chunk_gdn_gates_kernel" for n, _, _ in off)
    assert [c["HOIST"] for n, _, c in off if n == "chunk_state_kernel"] == [False]
    assert [c["HSTEP"] for n, _, c in on + off if n == "chunk_state_kernel"] == [1, 1]
    # the same maths with the suffix sum scanned in another kernel: fp32 rounding apart
    _check_pool_runs(inp, idx, before, runs, _bound(1e-6))


def test_gdn_output_rebuilds_every_second_chunk_state_and_reads_no_unwritten_one(monkeypatch):
    """Every buffer starts as NaN, so a state the state stage did not store, read by the output
    stage, would show in the output. (Without it, ``U`` stays in stage 1: ``stage_options``.)"""
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "every_second_state", dense=True)
    assert [c["HSTEP"] for n, _, c in on if n == "chunk_state_kernel"] == [2]
    assert [c["HALF"] for n, _, c in on if n == "chunk_output_grouped_kernel"] == [True]
    assert [c["HSTEP"] for n, _, c in off if n == "chunk_state_kernel"] == [1]
    assert [c["HALF"] for n, _, c in off if n == "chunk_output_grouped_kernel"] == [False]
    assert [c["UTM"] for n, _, c in on + off if n == "chunk_state_kernel"] == [True, False]
    _check_pool_runs(inp, idx, before, runs, _bound())


def test_gdn_state_stage_forms_u_from_stage_one_matrix(monkeypatch):
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "u_in_state", dense=True)
    assert [c["TMOUT"] for n, _, c in on if n == "chunk_intra_kernel"] == [True]
    assert [c["UTM"] for n, _, c in on if n == "chunk_state_kernel"] == [True]
    assert [c["TMOUT"] for n, _, c in off if n == "chunk_intra_kernel"] == [False]
    assert [c["UTM"] for n, _, c in off if n == "chunk_state_kernel"] == [False]
    _check_pool_runs(inp, idx, before, runs, _bound())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gdn_other_dtypes_keep_u_in_stage_one_and_every_chunk_state(dtype):
    """Only the measured bf16 path splits the stages this way (fp16 runs fp32 tiles, fp32 ieee
    dots: builds never measured with these options)."""
    from linattn.kernels.triton.prefill import GdnStageSplit, prefill_config

    off = GdnStageSplit(gates_kernel=False, every_second_state=False, u_in_state=False)
    assert prefill_config("gdn", 128, 128, dtype).gdn == off
    assert all(prefill_config("kda", 128, 128, dt).gdn == off for dt in (torch.bfloat16, dtype))


@pytest.mark.parametrize("H_,HV_", [(1, 1), (1, 4)], ids=["group1", "group4"])
def test_gdn_other_group_sizes_take_the_gate_launch_only(monkeypatch, H_, HV_):
    """At GVA group sizes other than 2 the output runs one program per value head, which cannot
    rebuild states, and U stays in stage 1 (the state kernel with U and every chunk's state
    measured slower): only the gate factors' launch applies."""
    from linattn.kernels.triton import prefill as pm

    cfg = pm.prefill_config("gdn", K, V, torch.bfloat16)
    opt = pm.stage_options("gdn", HV_ // H_, cfg)
    assert (opt.grouped_output, opt.gates_kernel, opt.every_second_state, opt.u_in_state) == (False, True, False, False)
    assert pm.stage_options("gdn", 2, cfg) == (True, True, True, True)
    assert pm.stage_options("gdn", 2, cfg, replaced_state=True) == (True, False, False, False)
    assert not any(pm.stage_options("kda", 2, pm.prefill_config("kda", K, V, torch.bfloat16))[1:])
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "gates_kernel", H=H_, HV=HV_)
    assert [(c["HOIST"], c["HSTEP"], c["UTM"]) for n, _, c in on if n == "chunk_state_kernel"] == [(True, 1, False)]
    assert [c["TMOUT"] for n, _, c in on if n == "chunk_intra_kernel"] == [False]
    assert any(n == "chunk_output_kernel" for n, _, _ in on)
    _check_pool_runs(inp, idx, before, runs, _bound(1e-6))


def test_chunk_tables_from_torch_ops_past_the_sequence_bound_give_the_same_bits(monkeypatch):
    """Past ``TABLES_TRITON_MAX_N`` sequences the tables come from torch ops: same call, same bits."""
    from linattn.kernels.triton import prefill as pm

    inp = make_inputs("gdn", LENS, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=93, device=DEV)
    idx = torch.tensor(SLOTS, dtype=torch.int32, device=DEV)
    before = random_states(P, HV, K, V, seed=94, device=DEV)
    outs = []
    for bound in (pm.TABLES_TRITON_MAX_N, 0):
        monkeypatch.setattr(pm.plan, "TABLES_TRITON_MAX_N", bound)
        pool = before.clone()
        o, _ = run("gdn", inp, state_pool=pool, state_indices=idx)
        outs.append((o, pool))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not torch.equal(outs[0][1], before)
