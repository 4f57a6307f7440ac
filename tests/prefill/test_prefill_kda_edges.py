"""KDA chunked prefill at its edges, on the CPU through the Triton interpreter.

Stage 1 of KDA (:func:`linattn.kernels.triton.chunk_intra.chunk_kda_system_kernel`) builds ``A`` and
``Aqk`` per 32-channel block either through one reference row (the fast path, where the block's
decays stay within e^-60..e^60 of row 31) or by a six-level binary split of the 64 chunk rows
(level ``p`` pairs rows whose highest differing bit is ``p``, with the decay factored through the
group's middle row), so its failure modes sit at the path boundary, at the power-of-two positions
inside a chunk, at tail chunks, at per-channel gates of very different size and at the head
mapping. On the bf16 path the state kernel also writes the output. These tests pin:

- stage 1's matrices and operands entry by entry against float64 (every level, tail rows zero);
- sequence lengths on both sides of every power of two up to 129, zero-length sequences among
  them, each sequence checked on its own (a short one would vanish in a batch-wide norm);
- pool mode (padding, owned and foreign rows) against dense mode, bitwise;
- per-channel gates at and below the floor next to gates of zero, no l2norm with small
  unnormalised q/k and a custom scale, GVA with several key heads, bf16 inputs, strided views.

Tolerances (ops.md): fp32 inputs 1e-5 on outputs and states against the float64 token-serial
reference; bf16 inputs 2e-2 on outputs, 1e-2 on states.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from prefill_cases import check_two_bf16_pool_runs, make_inputs, random_states, reference, rel, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _per_sequence(o, ro, ht, rht, lens, cu, tol):
    """Every non-empty sequence's output rows and every final state within ``tol`` on their own."""
    for n, L in enumerate(lens):
        a, b = int(cu[n]), int(cu[n + 1])
        if L:
            assert rel(o[a:b], ro[a:b]) < tol, (n, L, rel(o[a:b], ro[a:b]))
        if ht is not None:
            assert rel(ht[n], rht[n]) < tol, (n, L, rel(ht[n], rht[n]))


# -- stage 1 on its own, entry by entry ---------------------------------------------------------

def _stage1(inp, scale, l2norm, fast):
    """Stage 1 of KDA (fp32, ieee dots) on ``inp``; ``fast``: the system kernel's fast path allowed
    (the pinned configuration) or turned off. Returns the buffers on the CPU and the chunk tables."""
    import triton.language as tl

    from linattn.capabilities import probe
    from linattn.kernels.triton import prefill as pm

    q, k, v, g, beta, cu = (inp[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens"))
    cfg = pm.prefill_config("kda", q.shape[2], v.shape[2], torch.float32)
    assert cfg.kda_system.fast_path  # the shipped configuration takes the fast path where it may
    cfg = replace(cfg, kda_system=replace(cfg.kda_system, fast_path=fast))
    plan = pm.plan_prefill("kda", q=q, v=v, cu_seqlens=cu, use_qk_l2norm=l2norm, caps=probe(DEV), config=cfg)
    assert (plan.DT, plan.PREC) == (tl.float32, "ieee")
    bufs = pm.allocate_buffers(plan)
    stage1 = dict(abuf=bufs.kda_a, aqk=bufs.kda_aqk, kd=bufs.kda_kd, qg=bufs.kda_qg, gl=bufs.kda_gl, w=bufs.w,
                  u=bufs.u, rk=bufs.rk)
    for b in stage1.values():
        b.fill_(float("nan"))  # anything the kernels should write and do not shows up
    tables = pm.launch_tables(plan, cu)
    pm.launch_intra(plan, pm.conform_inputs(plan, q, k, v, g, beta, cu), tables, bufs, scale)
    return {name: b.cpu() for name, b in stage1.items()}, tables


#: Gates of stage 1's entrywise test, by the system kernel's path they take per channel block
#: (fast: ``|G_r - G_31| <= 60`` in the whole block):
#: ``levels`` - decays per channel from ~1 down to 0, some 20x stronger, some below the floor, in
#: every channel block: the level path everywhere;
#: ``fast`` - the inputs' own gates (about -0.3 per token): the fast path everywhere;
#: ``mixed`` - channel block 0 (channels 0..31) at -3 per token (``G_31`` = -96): the level path
#: there, the fast path in the other three; and channel 40 at -1.85 per token (``G_31 = -59.2``,
#: ``G_C - G_31`` of the full chunk -59.2): the fast path at its bound.
GATES = ("levels", "fast", "mixed")


@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
def test_stage1_A_Aqk_and_operands_match_float64_entrywise_on_every_split_level(l2norm, gates):
    """``abuf``, ``aqk``, ``kd``, ``qg``, ``gl``, ``W``, ``U`` of a full chunk, a tail chunk of 37
    rows and a chunk of 1 row, GVA (H = 1, HV = 2), K = 128, for each path of the system kernel
    (:data:`GATES`). Each entry of ``A`` / ``Aqk`` is held to its own scale (the sum of the
    absolute terms), so one wrong level (even level 0, 32 entries) fails; on and above the
    diagonal and past the tail, ``A`` is exactly 0 and ``Aqk`` above the diagonal too. With the
    fast path turned off the buffers are the same bits where no block takes it (``levels``) and
    differ where one does (the fast path ran)."""
    lens, H, HV, K, V = [64, 0, 37, 1], 1, 2, 128, 64
    scale = 0.37
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=41, device=DEV)
    if gates == "levels":
        inp["g"][:, :, ::3] *= 20
        inp["g"][:, :, 1::7] = -1e4
    elif gates == "mixed":
        inp["g"][:, :, :32] = -3.0
        inp["g"][:, :, 40] = -1.85
    if not l2norm:
        inp["q"], inp["k"] = inp["q"] * 0.2, inp["k"] * 0.15
    bufs, (off, seq, start) = _stage1(inp, scale, l2norm, fast=True)
    levels_only, _ = _stage1(inp, scale, l2norm, fast=False)
    same_bits = all(bool(((bufs[n] == levels_only[n]) | (bufs[n].isnan() & levels_only[n].isnan())).all())
                    for n in ("abuf", "aqk", "w"))  # NaN: rows neither run writes
    assert same_bits == (gates == "levels"), gates

    q, k, v, g, beta, cu = (inp[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens"))
    q, k, v, g, beta, cu = (x.cpu() for x in (q, k, v, g, beta, cu))
    d = torch.float64

    def prep(x):
        x = x.to(d)
        if l2norm:
            x = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
        return x.repeat_interleave(HV // H, 1)

    qn, kn, gg = prep(q) * scale, prep(k), g.to(d).clamp_min(-1000.0)
    seen = 0
    for c in range(int(off[-1])):
        t0, n = int(start[c]), int(seq[c])
        L = min(64, int(cu[n + 1]) - t0)
        for h in range(HV):
            sl = slice(t0, t0 + L)
            G = gg[sl, h].cumsum(0)  # [L, K]
            kk, qq, b = kn[sl, h], qn[sl, h], beta[sl, h].to(d)
            E = torch.exp((G[:, None, :] - G[None, :, :]).clamp_max(0.0))  # [r, s, K]; used for s <= r
            strict = torch.ones(L, L, dtype=torch.bool).tril(-1)
            incl = torch.ones(L, L, dtype=torch.bool).tril()
            terms = kk[:, None] * kk[None] * E
            A = torch.zeros(64, 64, dtype=d)
            A_abs = torch.zeros(64, 64, dtype=d)
            A[:L, :L] = torch.where(strict, b[:, None] * terms.sum(-1), 0.0)
            A_abs[:L, :L] = torch.where(strict, b[:, None] * terms.abs().sum(-1), 0.0)
            qterms = qq[:, None] * kk[None] * E
            Aq = torch.where(incl, qterms.sum(-1), 0.0)
            Aq_abs = torch.where(incl, qterms.abs().sum(-1), 0.0)

            gA = bufs["abuf"][c, h].to(d)
            assert torch.isfinite(gA).all()
            assert torch.equal(gA[A_abs == 0], torch.zeros_like(gA[A_abs == 0])), (c, h)  # upper, diag, tail
            assert ((gA - A).abs() <= 2e-5 * A_abs + 1e-30).all(), (c, h, float(((gA - A).abs() / (A_abs + 1e-30)).max()))
            gq = bufs["aqk"][sl, h].to(d)  # [L, 64]
            assert torch.isfinite(gq).all()
            assert torch.equal(gq[:, L:], torch.zeros(L, 64 - L, dtype=d))
            assert torch.equal(gq[:, :L][~incl], torch.zeros(int((~incl).sum()), dtype=d))
            assert ((gq[:, :L] - Aq).abs() <= 2e-5 * Aq_abs + 1e-30).all(), (c, h)

            Gc = G[-1]
            kd, qg = kk * torch.exp(Gc - G), qq * torch.exp(G)
            assert (bufs["kd"][sl, h].to(d) - kd).abs().max() <= 1e-5 * kd.abs().max()
            assert (bufs["qg"][sl, h].to(d) - qg).abs().max() <= 1e-5 * qg.abs().max()
            assert ((bufs["gl"][c, h].to(d) - Gc).abs() <= 1e-6 * Gc.abs().clamp_min(1.0)).all()
            Tm = torch.linalg.inv(torch.eye(L, dtype=d) + A[:L, :L])
            W = Tm @ (b[:, None] * kk * torch.exp(G))
            U = Tm @ (b[:, None] * v[sl, h].to(d))
            assert rel(bufs["w"][sl, h], W) < 1e-5 and rel(bufs["u"][sl, h], U) < 1e-5
            rk_ref = 1 / torch.sqrt((k[sl, h // (HV // H)].to(d) ** 2).sum(-1) + 1e-6) if l2norm else torch.ones(L, dtype=d)
            assert rel(bufs["rk"][sl, h], rk_ref) < 1e-6
            seen += 1
    assert seen == 3 * HV


# -- whole prefill against the token-serial reference -------------------------------------------

def test_lengths_around_every_power_of_two_with_empty_sequences_match_reference_per_sequence():
    """1 .. 65 on both sides of every split level (and 64, a full chunk; 65, a one-row tail
    chunk), empty sequences first, inside and last; GVA (H = 1, HV = 2), K = 128 != V = 64, dense
    mode with a random initial state. Empty sequences keep their initial state bitwise."""
    lens = [0, 1, 2, 3, 7, 8, 9, 0, 15, 16, 17, 31, 32, 33, 63, 64, 65, 0]  # T = 366
    H, HV, K, V = 1, 2, 128, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=51, device=DEV)
    h0 = random_states(len(lens), HV, K, V, seed=52, device=DEV)
    o, ht = run("kda", inp, initial_state=h0)
    ro, rht = reference("kda", inp, initial_state=h0)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    _per_sequence(o, ro, ht, rht, lens, inp["cu_seqlens"].tolist(), 1e-5)
    for n, L in enumerate(lens):
        if L == 0:
            assert torch.equal(ht[n], h0[n])


def test_multi_chunk_lengths_127_128_129_pool_mode_equals_dense_bitwise_with_padding_and_foreign_rows():
    """Lengths 127 / 128 / 129 (second and third chunks with 63, 64 and 1 rows), H = HV = 2,
    K = V = 128, a padding sequence (negative index), empty sequences owning a slot, and slots
    no sequence names. Padding: zero output rows and no pool row touched; every row not written
    by a live sequence is bitwise unchanged; live rows and outputs equal dense mode bitwise and
    the reference to 1e-5."""
    lens = [0, 127, 9, 128, 129, 0]  # T = 393
    slots = [5, 2, -1, 0, 4, 3]
    P, H, HV, K, V = 7, 2, 2, 128, 128
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=61, device=DEV)
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    pool = random_states(P, HV, K, V, seed=62, device=DEV)
    before = pool.clone()

    o, none = run("kda", inp, state_pool=pool, state_indices=idx)
    assert none is None
    cu = inp["cu_seqlens"].tolist()
    pad = slice(cu[2], cu[3])
    assert torch.equal(o[pad], torch.zeros_like(o[pad]))
    live = [s for s, L in zip(slots, lens) if s >= 0 and L > 0]  # 2, 0, 4
    untouched = [p for p in range(P) if p not in live]  # 1, 3, 5, 6: foreign or empty-owned
    assert torch.equal(pool[untouched], before[untouched])
    assert not torch.equal(pool[live], before[live])

    rp = before.clone()
    ro, _ = reference("kda", inp, state_pool=rp, state_indices=idx)
    assert rel(o, ro) < 1e-5
    assert rel(pool[live], rp[live]) < 1e-5
    for n, L in enumerate(lens):
        if L and slots[n] >= 0:
            assert rel(o[cu[n]:cu[n + 1]], ro[cu[n]:cu[n + 1]]) < 1e-5, n

    # dense mode on the same rows (the padding sequence gets some state; its rows are not compared)
    h0 = before[[max(s, 0) for s in slots]].clone()
    o_d, ht_d = run("kda", inp, initial_state=h0)
    keep = torch.ones(o.shape[0], dtype=torch.bool, device=DEV)
    keep[pad] = False
    assert torch.equal(o[keep], o_d[keep])
    for n, s in enumerate(slots):
        if s >= 0:
            assert torch.equal(pool[s], ht_d[n]), n


def test_per_channel_gates_at_and_below_the_floor_next_to_zero_gates_match_reference():
    """Per key channel: g = -1000 (the floor), -1e4 and -inf (floored to -1000), exactly 0 (no
    decay) and ordinary gates, in one chunk; tail chunks, an empty sequence, dense mode without
    an initial state. Nothing overflows and the result is the reference's to 1e-5 (the floored
    channels' cumulative gates are exact multiples of 1000)."""
    lens = [17, 0, 64, 33]
    H, HV, K, V = 1, 2, 128, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=71, device=DEV)
    g = inp["g"]
    g[:, :, 0::4] = -1000.0
    g[:, :, 1::8] = -1e4
    g[:, :, 5::8] = float("-inf")
    g[:, :, 2::4] = 0.0
    o, ht = run("kda", inp)
    ro, rht = reference("kda", inp)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    _per_sequence(o, ro, ht, rht, lens, inp["cu_seqlens"].tolist(), 1e-5)
    assert torch.equal(ht[1], torch.zeros_like(ht[1]))
    # a channel at the floor forgets everything but the chunk's last key; one at 0 keeps all
    assert ht[:, :, :, 0::4].abs().sum() > 0


def test_without_l2norm_small_unnormalised_qk_custom_scale_and_two_key_heads_match_reference():
    """use_qk_l2norm=False with q, k of norm ~0.4 (so a forgotten or doubled norm or scale shows),
    scale 0.7, H = 2 key heads read by HV = 4 value heads (head hv reads hv // 2: a mix-up with
    hv % H fails), with an initial state."""
    lens = [5, 0, 64, 40]
    H, HV, K, V = 2, 4, 64, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=81, device=DEV)
    inp["q"] = inp["q"] * 0.05
    inp["k"] = inp["k"] * 0.05
    h0 = random_states(len(lens), HV, K, V, seed=82, device=DEV)
    o, ht = run("kda", inp, initial_state=h0, use_qk_l2norm=False, scale=0.7)
    ro, rht = reference("kda", inp, initial_state=h0, use_qk_l2norm=False, scale=0.7)
    _per_sequence(o, ro, ht, rht, lens, inp["cu_seqlens"].tolist(), 1e-5)
    # the l2norm path must give something else here (so the flag is honoured at all)
    ro2, _ = reference("kda", inp, initial_state=h0, use_qk_l2norm=True, scale=0.7)
    assert rel(o, ro2) > 1e-2


def test_bf16_inputs_with_K_ne_V_and_fp32_pool_match_reference():
    lens = [3, 0, 70, 31]
    H, HV, K, V = 1, 2, 128, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=91, device=DEV)
    pool = random_states(5, HV, K, V, seed=92, device=DEV)
    before = pool.clone()
    slots = [4, 1, 0, 2]
    idx = torch.tensor(slots, dtype=torch.int64, device=DEV)
    o, _ = run("kda", inp, state_pool=pool, state_indices=idx)
    ro, rht = reference("kda", inp, initial_state=before[idx])
    assert o.dtype == torch.bfloat16 and pool.dtype == torch.float32
    assert rel(o, ro) < 2e-2
    live = [4, 0, 2]
    assert rel(pool[live], rht[[0, 2, 3]]) < 1e-2
    assert torch.equal(pool[[1, 3]], before[[1, 3]])  # slot 1: empty sequence; slot 3: nobody's


def test_strided_views_of_q_k_g_and_beta_give_the_same_bits_as_contiguous():
    """q and k with different token strides (q out of a fused projection, k padded), g a slice of
    a wider last dim, beta every other column: the system kernel's strides are not mixed up."""
    lens, H, HV, K, V = [40, 30], 1, 2, 64, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, seed=101, device=DEV)
    T = inp["q"].shape[0]
    fused = torch.cat([inp["q"].reshape(T, -1), inp["v"].reshape(T, -1)], 1)
    kpad = torch.cat([inp["k"], torch.full_like(inp["k"], float("nan"))], 2)  # [T, H, 2K]
    gwide = torch.cat([inp["g"], torch.full_like(inp["g"], float("nan"))], 2)  # [T, HV, 2K]
    bwide = torch.stack([inp["beta"], torch.full_like(inp["beta"], float("nan"))], 2).reshape(T, 2 * HV)
    views = dict(inp, q=fused[:, :H * K].view(T, H, K), k=kpad[:, :, :K], g=gwide[:, :, :K],
                 beta=bwide[:, ::2])
    assert views["q"].stride(0) != views["k"].stride(0) and views["beta"].stride(1) == 2
    o1, h1 = run("kda", inp)
    o2, h2 = run("kda", views)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


def test_state_kernel_writing_the_output_matches_the_output_kernel_and_leaves_the_state_bits_alone(monkeypatch):
    """KDA's bf16 path writes the output from the state kernel (pinned ``StateConfig.writes_output``; the
    per-chunk states and Vn never go through memory). Against the same prefill with the output
    kernel (``state_fuse_o`` off), pool mode with a padding sequence, an empty one and foreign
    rows: the final pool rows are the same bits (the state update is the same instructions), the
    outputs agree to 1e-5 (dot order), padding rows are zeros in both, rows no live sequence owns
    are bitwise unchanged, and both match the float64 reference within bf16's 2e-2 / 1e-2."""
    from linattn.kernels.triton import chunk_output, prefill as pm

    lens, slots = [70, 0, 5, 130], [3, 1, -1, 0]
    P, H, HV, K, V = 5, 1, 2, 128, 64
    inp = make_inputs("kda", lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=71, device=DEV)
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    before = random_states(P, HV, K, V, seed=72, device=DEV)
    assert pm.prefill_config("kda", K, V, torch.bfloat16).state.writes_output
    assert not pm.prefill_config("gdn", K, V, torch.bfloat16).state.writes_output
    pinned, run_output = pm.prefill_config, chunk_output.chunk_output_kernel.run
    calls = []
    monkeypatch.setattr(chunk_output.chunk_output_kernel, "run", lambda *a, **kw: calls.append(1) or run_output(*a, **kw))
    outs, pools, output_launches = [], [], []
    for fuse in (True, False):
        pool = before.clone()
        monkeypatch.setattr(pm.config, "prefill_config", lambda *a, _fuse=fuse, **kw: replace(
            pinned(*a, **kw), state=replace(pinned(*a, **kw).state, writes_output=_fuse)))
        calls.clear()
        o, _ = run("kda", inp, state_pool=pool, state_indices=idx)
        outs.append(o)
        pools.append(pool)
        output_launches.append(len(calls))
    assert output_launches == [0, 1]  # fused: no output kernel; apart: one launch
    check_two_bf16_pool_runs("kda", inp, idx, before, outs, pools)
    assert rel(outs[0], outs[1]) < 1e-5
