"""GDN's bf16 chunked prefill: the three ways its stages split the work since session 7, each
against the way it replaced (pinned_config "gdn_hoist", "gdn_half_hbuf", "gdn_state_u").

- ``gdn_hoist``: the state loop's gate factors ``rk exp(G_C - G)`` and ``exp(G_C)`` come from
  their own launch (``chunk_gdn_gates_kernel``) instead of a scan per chunk in the state loop.
- ``gdn_half_hbuf``: the state stage stores the state entering every second chunk only; the grouped
  output kernel rebuilds the others' share from the chunk before.
- ``gdn_state_u``: stage 1 writes ``Tm diag(beta)`` and the state stage forms ``U`` itself.

Each test runs one call twice in pool mode (a padding sequence, an empty one, odd and even chunk
counts, foreign rows), once with the option and once without, and checks: which kernels launched
with which constexprs, padding rows zero, rows no live sequence owns bitwise unchanged, both runs
against the float64 reference (bf16's 2e-2 / 1e-2), and the two within a bound (the interpreter
computes in fp32: 1e-5; compiled, bf16 operands round differently: 1e-2).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled  # noqa: E402

from prefill_cases import make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LENS, SLOTS = [70, 0, 5, 200, 128], [3, 1, -1, 0, 5]  # chunk counts 2, 0, 1 (padding), 4, 2
P, H, HV, K, V = 7, 2, 4, 64, 64


def _launches(monkeypatch, pm) -> list:
    """Record (kernel name, grid, constexprs of interest) of every prefill launch."""
    seen = []
    keys = ("HOIST", "HSTEP", "UTM", "HALF", "TMOUT")
    for kernel in (pm.chunk_intra_kernel, pm.chunk_gdn_gates_kernel, pm.chunk_state_kernel,
                   pm.chunk_output_grouped_kernel, pm.chunk_output_kernel):
        def spy(*a, _run=kernel.run, _k=kernel, **kw):
            seen.append((_k.fn.__name__, tuple(kw["grid"]), {k: kw[k] for k in keys if k in kw}))
            return _run(*a, **kw)
        monkeypatch.setattr(kernel, "run", spy)
    return seen


def _two_runs(monkeypatch, option: str, nan_fill: bool = False):
    """The call with the pinned configuration and with ``option`` turned off; returns the
    inputs, the pool before, the (output, pool) pairs and the launches of each run."""
    from linattn.kernels.triton import prefill as pm

    inp = make_inputs("gdn", LENS, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=91, device=DEV)
    idx = torch.tensor(SLOTS, dtype=torch.int32, device=DEV)
    before = random_states(P, HV, K, V, seed=92, device=DEV)
    pinned = pm.pinned_config
    assert pinned("gdn", K, V, torch.bfloat16)[option], f"{option} is not pinned on for bf16 GDN"
    seen = _launches(monkeypatch, pm)
    runs, launches = [], []
    for on in (True, False):
        monkeypatch.setattr(pm, "pinned_config", lambda *a, _on=on, **kw: {**pinned(*a, **kw), option: _on})
        if nan_fill:  # every buffer the call allocates starts as NaN: an unwritten entry read shows
            empty = torch.empty

            def nan_empty(*a, **kw):
                x = empty(*a, **kw)
                return x.fill_(float("nan")) if x.is_floating_point() else x
            monkeypatch.setattr(torch, "empty", nan_empty)
        pool = before.clone()
        o, _ = run("gdn", inp, state_pool=pool, state_indices=idx)
        if nan_fill:
            monkeypatch.setattr(torch, "empty", empty)
        runs.append((o, pool))
        launches.append(list(seen))
        seen.clear()
    return inp, idx, before, runs, launches


def _check_pool_runs(inp, idx, before, runs, close: float) -> None:
    cu = inp["cu_seqlens"].tolist()
    lens = [b - a for a, b in zip(cu, cu[1:])]
    live = [s for s, n in zip(SLOTS, lens) if s >= 0 and n > 0]
    untouched = [p for p in range(P) if p not in live]
    rp = before.clone()
    ro, _ = reference("gdn", inp, state_pool=rp, state_indices=idx)
    for o, pool in runs:
        assert torch.isfinite(o).all()
        for i, s in enumerate(SLOTS):
            if s < 0:
                assert torch.equal(o[cu[i]:cu[i + 1]], torch.zeros_like(o[cu[i]:cu[i + 1]]))
        assert torch.equal(pool[untouched], before[untouched])
        assert rel(o, ro) < 2e-2 and rel(pool[live], rp[live]) < 1e-2
    (o1, p1), (o2, p2) = runs
    assert rel(o1, o2) < close and rel(p1[live], p2[live]) < close


def _bound() -> float:
    return 1e-5 if interpreter_enabled() else 1e-2


def test_gdn_gate_factors_from_their_own_launch_match_the_scan_in_the_state_loop(monkeypatch):
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "gdn_hoist")
    nt_max = sum(LENS) // 64 + len(LENS)
    assert [(n, g) for n, g, _ in on if n == "chunk_gdn_gates_kernel"] == [("chunk_gdn_gates_kernel", (nt_max, 1))]
    assert [c["HOIST"] for n, _, c in on if n == "chunk_state_kernel"] == [True]
    assert not any(n == "chunk_gdn_gates_kernel" for n, _, _ in off)
    assert [c["HOIST"] for n, _, c in off if n == "chunk_state_kernel"] == [False]
    _check_pool_runs(inp, idx, before, runs, _bound())


def test_gdn_output_rebuilds_every_second_chunk_state_and_reads_no_unwritten_one(monkeypatch):
    """Every buffer starts as NaN, so a state the state stage did not store, read by the output
    stage, would show in the output."""
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "gdn_half_hbuf", nan_fill=True)
    assert [c["HSTEP"] for n, _, c in on if n == "chunk_state_kernel"] == [2]
    assert [c["HALF"] for n, _, c in on if n == "chunk_output_grouped_kernel"] == [True]
    assert [c["HSTEP"] for n, _, c in off if n == "chunk_state_kernel"] == [1]
    assert [c["HALF"] for n, _, c in off if n == "chunk_output_grouped_kernel"] == [False]
    _check_pool_runs(inp, idx, before, runs, _bound())
    # the state stage is the same in both runs but for the stores it skips: the same final bits
    assert torch.equal(runs[0][1], runs[1][1])


def test_gdn_state_stage_forms_u_from_stage_one_matrix(monkeypatch):
    inp, idx, before, runs, (on, off) = _two_runs(monkeypatch, "gdn_state_u")
    assert [c["TMOUT"] for n, _, c in on if n == "chunk_intra_kernel"] == [True]
    assert [c["UTM"] for n, _, c in on if n == "chunk_state_kernel"] == [True]
    assert [c["TMOUT"] for n, _, c in off if n == "chunk_intra_kernel"] == [False]
    assert [c["UTM"] for n, _, c in off if n == "chunk_state_kernel"] == [False]
    _check_pool_runs(inp, idx, before, runs, _bound())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gdn_other_dtypes_keep_u_in_stage_one_and_every_chunk_state(dtype):
    """Only the measured bf16 path splits the stages this way (fp16 runs fp32 tiles, fp32 ieee
    dots: builds never measured with these options)."""
    from linattn.kernels.triton.prefill import pinned_config

    cfg = pinned_config("gdn", 128, 128, dtype)
    assert not cfg["gdn_hoist"] and not cfg["gdn_half_hbuf"] and not cfg["gdn_state_u"]
    assert not any(pinned_config("kda", 128, 128, dt)[o] for dt in (torch.bfloat16, dtype)
                   for o in ("gdn_hoist", "gdn_half_hbuf", "gdn_state_u"))
