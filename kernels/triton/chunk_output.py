"""Chunked prefill, stage 3: the output of one (chunk, value head, value block), or of one (chunk,
key head, value block) for all the key head's value heads (:func:`chunk_output_grouped_kernel`).

Maths (ops.md, "Chunked form"; q l2-normalised and scaled, ``S0 = h[c]`` the state entering the
chunk, ``Vn`` the corrected values from the state stage)::

    O = (Q * exp(G)) S0 + lower_incl_diag( (q_r . k_s) exp(G_r - G_s) ) Vn
                             KDA: sum_d q_rd k_sd exp(G_rd - G_sd)   (from stage 1)

GDN: the query norm and the scale are row factors, applied once at the end; the key norms ``rk``
come from stage 1. KDA: stage 1 (``chunk_kda_system_kernel``) hands over ``Q * exp(G)`` (normalised and scaled,
as ``q`` with ``GROUP = 1``) and the matrix, so only the two dots remain; on its bf16 path at
K <= 128 the state kernel does those itself (``FUSE_O``) and this kernel does not run.
Grid ``(NT_max, HV, V // BV)``: chunks on axis x (up to 2**31-1 programs),
so no axis carries ``N * HV``. GDN's bf16 path at GVA group size 2 runs
:func:`chunk_output_grouped_kernel` instead: one program per key head writes its ``GROUP`` value
heads from one ``q k^T``.
"""

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ._gates import cumsum2
from ._l2norm import RNORM_LIMIT, SS_LIMIT, chunk_row_max, inv_pow2_scale, pow2_scale
from ._pid import chunk_span
from .decode import G_MIN  # the floor of g (-1000), as torch_ref and the decode kernel
from .launch import launch_with

if TYPE_CHECKING:
    from .chunk_tables import ChunkTables
    from .prefill.plan import PrefillBuffers, PrefillInputs, PrefillPlan, PrefillState


@triton.jit
def _scaled(x, s):
    """The rows of tile ``x`` times ``s`` (``[rows]`` fp32 powers of two, F44), in ``x``'s dtype (exact:
    a scaled row stays under ``2**32``)."""
    return (x.to(tl.float32) * s[:, None]).to(x.dtype)


@triton.jit
def _gdn_q_pass(q_ptr, k_ptr, hb, r, m, cv, sqt, skt, sq, sk, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, SCALED: tl.constexpr):
    """GDN's pass over one chunk's query and key rows: ``q h`` ``[64, BV]``, ``q k^T`` ``[64, 64]``
    and the query rows' sums of squares ``[64]`` (fp32). ``SCALED`` (F44, :mod:`._l2norm`): on the
    query rows times ``sq`` and the key rows times ``sk`` (``[64]`` powers of two), else on the raw
    rows (``sq``, ``sk`` unread)."""
    acc = tl.zeros([64, BV], dtype=tl.float32)
    A = tl.zeros([64, 64], dtype=tl.float32)
    ss = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        cols = ik * BK + tl.arange(0, BK)
        qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
        if SCALED:
            qt = qt.to(tl.float32) * sq[:, None]
        fq = qt.to(tl.float32)
        ss += tl.sum(fq * fq, axis=1)
        hk = tl.load(hb + (cols[:, None] * V + cv[None, :]))
        kt = tl.load(k_ptr + r[:, None] * skt + cols[None, :], mask=m[:, None], other=0.0)
        if SCALED:
            kt = kt.to(tl.float32) * sk[:, None]
        acc += tl.dot(qt.to(DT), hk.to(DT), input_precision=PREC)
        A += tl.dot(qt.to(DT), tl.trans(kt.to(DT)), input_precision=PREC)
    return acc, A, ss


@triton.jit
def chunk_output_kernel(
    q, k, g, rk, aqk, hbuf, vn, o, cu_seqlens, chunk_seq, chunk_start, state_indices,
    sqt, sqh, skt, skh, sgt, sgh,
    N, GROUP, HV, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, POOL: tl.constexpr, DT: tl.constexpr,
    PREC: tl.constexpr,
):
    """Writes ``o [T, HV, V]`` rows of one chunk. Buffers as in the state stage. In pool mode a
    sequence with a negative slot is padding: its output rows are zeros. Operands a build does not
    read are None: ``aqk`` for GDN, ``rk`` for KDA, ``state_indices`` in dense mode."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    i_v = tl.program_id(2)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    i_h = i_hv // GROUP
    t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
    r = tl.arange(0, 64)  # in-chunk rows: int32 offsets from 64-bit scalar bases
    m = r < L
    cv = i_v * BV + tl.arange(0, BV)
    q_ptr = q + t0 * sqt + i_h * sqh
    k_ptr = k + t0 * skt + i_h * skh
    g_ptr = g + t0 * sgt + i_hv * sgh
    hb = hbuf + (i_c.to(tl.int64) * HV + i_hv) * (K * V)

    acc = tl.zeros([64, BV], dtype=tl.float32)
    incl = r[:, None] >= r[None, :]
    if KDA:  # q: stage 1's qg = qn exp(G) (normalised, scaled); aqk ready (scaled too)
        for ik in range(K // BK):
            cols = ik * BK + tl.arange(0, BK)
            qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
            hk = tl.load(hb + (cols[:, None] * V + cv[None, :]))
            acc += tl.dot(qt.to(DT), hk.to(DT), input_precision=PREC)
        A = tl.load(aqk + (t0 * HV + i_hv) * 64 + (r[:, None] * (HV * 64) + r[None, :]),
                    mask=m[:, None] & incl, other=0.0).to(tl.float32)
    else:
        one = tl.full([64], 1.0, tl.float32)
        acc, A, ss = _gdn_q_pass(q_ptr, k_ptr, hb, r, m, cv, sqt, skt, one, one, K, V, BK, BV, DT, PREC, False)
        rkv = tl.load(rk + t0 * HV + i_hv + r * HV, mask=m, other=0.0)
        sq = one
        if L2NORM:  # F44: rows of |q| or |k| >= 2**32 may be here: the pass again on scaled rows
            if (tl.max(ss, axis=0) >= SS_LIMIT) | (tl.min(tl.where(m, rkv, 1.0), axis=0) <= RNORM_LIMIT):
                sq = pow2_scale(chunk_row_max(q_ptr, r, m, sqt, K, BK))
                mk = chunk_row_max(k_ptr, r, m, skt, K, BK)
                acc, A, ss = _gdn_q_pass(q_ptr, k_ptr, hb, r, m, cv, sqt, skt, sq, pow2_scale(mk), K, V, BK, BV,
                                         DT, PREC, True)
                rkv = rkv * inv_pow2_scale(mk)
        gt = tl.maximum(tl.load(g_ptr + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN)
        if PREC == "ieee":  # fp32 inputs: two-float G, so that G_r - G_s keeps fp32 accuracy (_gates)
            G, Gl = cumsum2(gt, 0)
        else:
            G = tl.cumsum(gt, axis=0)
        acc = acc * tl.exp(G)[:, None]
        D = G[:, None] - G[None, :]
        if PREC == "ieee":
            D = D + (Gl[:, None] - Gl[None, :])
        A = A * tl.exp(tl.where(incl, D, float("-inf"))) * rkv[None, :]
    vo = (t0 * HV + i_hv) * V
    vt = tl.load(vn + vo + (r[:, None] * (HV * V) + cv[None, :]), mask=m[:, None], other=0.0)
    acc += tl.dot(A.to(DT), vt.to(DT), input_precision=PREC)
    if not KDA:  # GDN: the query norm and the scale (row factors); KDA has them in qg and aqk
        if L2NORM:
            acc = acc * (scale / tl.sqrt(ss + 1e-6 * sq * sq))[:, None]
        else:
            acc = acc * scale
    if POOL:
        acc = tl.where(tl.load(state_indices + n) >= 0, acc, 0.0)
    tl.store(o + vo + (r[:, None] * (HV * V) + cv[None, :]), acc.to(o.dtype.element_ty), mask=m[:, None])


@triton.jit
def chunk_output_grouped_kernel(
    q, k, g, rk, hbuf, vn, o, cu_seqlens, chunk_seq, chunk_start, state_indices, kf, ec,
    sqt, sqh, skt, skh, sgt, sgh,
    N, HV, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    L2NORM: tl.constexpr, POOL: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    HALF: tl.constexpr = False,
):
    """GDN: the output rows ``o [T, HV, V]`` of one (chunk, key head, value block) for the key
    head's ``GROUP`` value heads, grid ``(NT_max, HV // GROUP, V // BV)``: ``q k^T`` (and the query
    norms) formed once, then per value head ``q h`` and its decays, as :func:`chunk_output_kernel`
    does for one head (same maths, same order per head). bf16/fp16 only (the launcher: bf16 at
    GROUP = 2). The shared dot and key loads make it faster than one program per value head at
    GROUP = 2; at one head per program the single K loop of :func:`chunk_output_kernel` is faster
    than this form's two (docs/performance.md#prefill-grouped-output). The per-head decays are
    written out here rather than shared with :func:`chunk_output_kernel` through a helper: that
    changed both kernels' sm_90 code, and the builds shipped are the ones measured and GPU-tested
    (tools/sm90_digests.py holds them).

    ``HALF`` (the launcher: with the state stage's ``HSTEP = 2``): ``hbuf`` holds the state
    entering every second chunk of each sequence only; for the others (odd chunk ``c`` within its
    sequence) ``q h[c] = (q exp(G_C')) h[c-1] + (q k'^T diag(kf')) Vn'`` from chunk ``c - 1``
    (``'``; full, since only a sequence's last chunk is partial), with ``kf = rk exp(G_C - G)``
    ``[T, HV]`` and ``ec = exp(G_C)`` ``[NT_max, HV]`` fp32 from
    :func:`.chunk_state.chunk_gdn_gates_kernel`: the state stage's own update, applied to ``q``.
    All factors are exponentials of numbers <= 0. Otherwise ``kf`` and ``ec`` are None. In dense
    mode (not ``POOL``) ``state_indices`` is None."""
    tl.static_assert(PREC != "ieee", "fp32 inputs run chunk_output_kernel (its two-float gates)")
    i_c = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_v = tl.program_id(2)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
    r = tl.arange(0, 64)  # in-chunk rows: int32 offsets from 64-bit scalar bases
    m = r < L
    cv = i_v * BV + tl.arange(0, BV)
    q_ptr = q + t0 * sqt + i_h * sqh
    k_ptr = k + t0 * skt + i_h * skh
    incl = r[:, None] >= r[None, :]
    if POOL:
        keep = tl.load(state_indices + n) >= 0
    else:
        keep = True
    qk = tl.zeros([64, 64], dtype=tl.float32)
    ss = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        cols = ik * BK + tl.arange(0, BK)
        qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
        kt = tl.load(k_ptr + r[:, None] * skt + cols[None, :], mask=m[:, None], other=0.0)
        fq = qt.to(tl.float32)
        ss += tl.sum(fq * fq, axis=1)
        qk = tl.dot(qt.to(DT), tl.trans(kt.to(DT)), acc=qk, input_precision=PREC)
    one = tl.full([64], 1.0, tl.float32)
    sq = one
    isk = one
    big = False
    if L2NORM:  # F44: rows of |q| or |k| >= 2**32 may be here: q k^T again on scaled rows, and q scaled below
        rk0 = tl.load(rk + t0 * HV + i_h * GROUP + r * HV, mask=m, other=0.0)  # the group's heads share k
        big = (tl.max(ss, axis=0) >= SS_LIMIT) | (tl.min(tl.where(m, rk0, 1.0), axis=0) <= RNORM_LIMIT)
        if big:
            sq = pow2_scale(chunk_row_max(q_ptr, r, m, sqt, K, BK))
            mk = chunk_row_max(k_ptr, r, m, skt, K, BK)
            sk = pow2_scale(mk)
            isk = inv_pow2_scale(mk)
            qk = tl.zeros([64, 64], dtype=tl.float32)
            ss = tl.zeros([64], dtype=tl.float32)
            for ik in range(K // BK):
                cols = ik * BK + tl.arange(0, BK)
                qt = _scaled(tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0), sq)
                kt = _scaled(tl.load(k_ptr + r[:, None] * skt + cols[None, :], mask=m[:, None], other=0.0), sk)
                fq = qt.to(tl.float32)
                ss += tl.sum(fq * fq, axis=1)
                qk = tl.dot(qt.to(DT), tl.trans(kt.to(DT)), acc=qk, input_precision=PREC)
    hc = i_c.to(tl.int64)  # the chunk whose entering state hbuf holds for this one
    if HALF:  # hbuf holds the state entering every second chunk of each sequence (the 1st, 3rd,
        # ...): the others read the one before, h[c-1] (chunk c - 1 is full: not the last)
        odd = ((t0 - tl.load(cu_seqlens + n).to(tl.int64)) // 64) % 2 == 1
        if odd:
            hc = hc - 1
    if L2NORM:
        qs = scale / tl.sqrt(ss + 1e-6 * sq * sq)
    else:
        qs = tl.full([64], 1.0, tl.float32) * scale
    for j in tl.static_range(GROUP):
        i_hv = i_h * GROUP + j
        hb = hbuf + (hc * HV + i_hv) * (K * V)
        acc = tl.zeros([64, BV], dtype=tl.float32)
        if HALF:
            # h[c] = exp(G_C') h[c-1] + (k' diag(kf'))^T Vn'  (' = chunk c - 1; kf' = rk exp(G_C' - G'),
            # the state stage's row factor), so  q h[c] = (q exp(G_C')) h[c-1] + (q k'^T diag(kf')) Vn':
            # the second term first, with q k'^T per head (not held across the heads)
            sc = 1.0
            if odd:
                kfp = tl.load(kf + (t0 - 64) * HV + i_hv + r * HV)
                bigp = big
                skp = one
                if L2NORM:  # F44: chunk c - 1's keys, as this chunk's above
                    rkp = tl.load(rk + (t0 - 64) * HV + i_hv + r * HV)
                    bigp = big | (tl.min(rkp, axis=0) <= RNORM_LIMIT)
                    if bigp:
                        mkp = chunk_row_max(k_ptr - 64 * skt, r, r >= 0, skt, K, BK)
                        skp = pow2_scale(mkp)
                        kfp = kfp * inv_pow2_scale(mkp)
                qkp = tl.zeros([64, 64], dtype=tl.float32)
                for ik in range(K // BK):
                    cols = ik * BK + tl.arange(0, BK)
                    qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
                    kt = tl.load(k_ptr - 64 * skt + r[:, None] * skt + cols[None, :])
                    if bigp:
                        qt = _scaled(qt, sq)
                        kt = _scaled(kt, skp)
                    qkp = tl.dot(qt.to(DT), tl.trans(kt.to(DT)), acc=qkp, input_precision=PREC)
                vp = tl.load(vn + ((t0 - 64) * HV + i_hv) * V + (r[:, None] * (HV * V) + cv[None, :]))
                acc = tl.dot((qkp * kfp[None, :]).to(DT), vp.to(DT), input_precision=PREC)
                # int32 offset, as shipped: (c - 1) * HV + hv < NT_max * HV, far below 2**31 for any
                # o [T, HV, V] that fits in memory (the 64-bit form changed this build's sm_90 code)
                sc = tl.load(ec + (i_c - 1) * HV + i_hv)
            for ik in range(K // BK):
                cols = ik * BK + tl.arange(0, BK)
                qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
                if big:
                    qt = _scaled(qt, sq)
                hk = tl.load(hb + (cols[:, None] * V + cv[None, :]))
                acc = tl.dot((qt.to(tl.float32) * sc).to(DT), hk.to(DT), acc=acc, input_precision=PREC)
        else:
            for ik in range(K // BK):  # q again (from cache): not held across the heads
                cols = ik * BK + tl.arange(0, BK)
                qt = tl.load(q_ptr + r[:, None] * sqt + cols[None, :], mask=m[:, None], other=0.0)
                if big:
                    qt = _scaled(qt, sq)
                hk = tl.load(hb + (cols[:, None] * V + cv[None, :]))
                acc = tl.dot(qt.to(DT), hk.to(DT), acc=acc, input_precision=PREC)
        gt = tl.maximum(tl.load(g + t0 * sgt + i_hv * sgh + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN)
        G = tl.cumsum(gt, axis=0)
        rkv = tl.load(rk + t0 * HV + i_hv + r * HV, mask=m, other=0.0) * isk  # isk: 1 but where F44 scaled k
        D = G[:, None] - G[None, :]
        A = qk * tl.exp(tl.where(incl, D, float("-inf"))) * rkv[None, :]
        vo = (t0 * HV + i_hv) * V
        vt = tl.load(vn + vo + (r[:, None] * (HV * V) + cv[None, :]), mask=m[:, None], other=0.0)
        acc = tl.dot(A.to(DT), vt.to(DT), acc=acc * tl.exp(G)[:, None], input_precision=PREC)
        tl.store(o + vo + (r[:, None] * (HV * V) + cv[None, :]),
                 tl.where(keep, acc * qs[:, None], 0.0).to(o.dtype.element_ty), mask=m[:, None])


# -- the host side: the output stage's launch -------------------------------------------------

def launch_output(plan: "PrefillPlan", x: "PrefillInputs", t: "ChunkTables", b: "PrefillBuffers", st: "PrefillState",
                  scale: float) -> None:
    """Stage 3: the output rows, one program per (chunk, value head, value block)
    (:func:`.chunk_output.chunk_output_kernel`) or, at a grouped GVA size, per key head
    (:func:`.chunk_output.chunk_output_grouped_kernel`)."""
    opt, cfg = plan.stages, plan.config.output
    common = dict(K=plan.K, V=plan.V, BK=64, BV=cfg.block_v, L2NORM=plan.use_qk_l2norm, POOL=plan.pool_mode,
                  DT=plan.DT, PREC=plan.PREC)
    tail = (x.cu_seqlens, t.chunk_seq, t.chunk_start, st.state_indices)
    if opt.grouped_output:  # one program per key head: one q k^T
        half = opt.every_second_state  # the grouped kernel rebuilds every second chunk's state (HALF)
        launch_with(chunk_output_grouped_kernel, plan.grids.output,
                    (x.q, x.k, x.g, b.rk, b.hbuf, b.vn, b.o, *tail, b.gdn_kf if half else None,
                     b.gdn_ec if half else None, *x.q.stride()[:2], *x.k.stride()[:2], *x.g.stride()[:2],
                     plan.N, plan.HV, float(scale)),
                    dict(common, GROUP=plan.group, HALF=half), cfg.grouped_launch)
        return
    if plan.kda:  # stage 1's decayed queries and keys, per-chunk decays and Aqk (GROUP 1)
        q, k, g, rk, aqk, group = b.kda_qg, b.kda_kd, b.kda_gl, None, b.kda_aqk, 1
    else:
        q, k, g, rk, aqk, group = x.q, x.k, x.g, b.rk, None, plan.group
    launch_with(chunk_output_kernel, plan.grids.output,
                (q, k, g, rk, aqk, b.hbuf, b.vn, b.o, *tail, *q.stride()[:2], *k.stride()[:2], *g.stride()[:2],
                 plan.N, group, plan.HV, float(scale)),
                dict(common, KDA=plan.kda), cfg.launch)
