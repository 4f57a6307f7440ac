"""Chunked prefill, stage 1: the intra-chunk system of one (chunk, value head).

For one chunk of ``C = 64`` rows (maths in ops.md, "Chunked form"; Yang et al., NeurIPS 2024, the
WY representation; Yang, Kautz, Hatamizadeh, ICLR 2025 for the gates; the Kimi Linear report for
per-channel gates), with ``G`` the chunk-local cumulative log decay and ``k`` l2-normalised::

    A  = strictly_lower( beta_r (k_r . k_s) exp(G_r - G_s) )     KDA: sum_d k_rd k_sd exp(G_rd - G_sd)
    Tm = (I + A)^-1
    W  = Tm diag(beta) (K * exp(G))          U = Tm diag(beta) V

``A`` goes to a per-program fp32 scratch. GDN: one 64 x 64 dot. KDA (:func:`_kda_system`): the
diagonal 16 x 16 blocks are summed exactly, column by column; each block below them is a dot with
the per-channel decay factored through the last row of its column block,
``exp(G_r - G_m) exp(G_m - G_s)``. Only exponentials of differences that are <= 0 are ever taken,
so strongly negative gates cannot overflow. ``Tm`` is solved block-wise from the scratch: the four
diagonal 16 x 16 blocks together by forward substitution, the others by
``Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj``; then ``W`` and ``U`` are single 64-row dots with the
whole ``Tm``. The scratch round trips re-block the matrix between those layouts; CTA barriers
(``tl.debug_barrier``) order them. The grid is persistent (about 8 programs per SM), so the
scratch of all programs stays in L2.

The kernel also writes ``rk`` (the inverse key norms, 1 without l2norm) and, for KDA, what the
later stages read instead of ``q``, ``k`` and ``g``: the intra-chunk query-key matrix
``Aqk[r, s] = sum_d qn_rd kn_sd exp(G_rd - G_sd)`` (s <= r, ``qn`` = normalised and scaled
queries, ``kn`` = normalised keys), the decayed keys ``kn exp(G_C - G)`` and queries
``qn exp(G)``, and the chunk's total log decay ``G_C`` per channel.
"""

import triton
import triton.language as tl

from .decode import G_MIN  # the floor of g (-1000), as torch_ref and the decode kernel

@triton.jit
def _ld(ptr, rows, msk, stride_t, col0, NC: tl.constexpr):
    """Rows ``rows`` x columns ``col0 .. col0+NC`` of a row-strided matrix whose chunk starts at
    ``ptr`` (64-bit scalar base; the in-chunk offsets are int32: the host keeps 64 * stride_t
    below 2**31)."""
    c = col0 + tl.arange(0, NC)
    return tl.load(ptr + rows[:, None] * stride_t + c[None, :], mask=msk[:, None], other=0.0)


@triton.jit
def _st(ptr, rows, msk, stride_t, col0, x, NC: tl.constexpr):
    c = col0 + tl.arange(0, NC)
    tl.store(ptr + rows[:, None] * stride_t + c[None, :], x.to(ptr.dtype.element_ty), mask=msk[:, None])


@triton.jit
def _mm(a, b, PREC: tl.constexpr, acc=None):
    return tl.dot(a, b, acc=acc, input_precision=PREC)


@triton.jit
def _blk_ld(ptr, bi: tl.constexpr, bj: tl.constexpr):
    """Block (bi, bj) (16 x 16) of a row-major 64 x 64 fp32 scratch matrix."""
    r = tl.arange(0, 16)
    return tl.load(ptr + (bi * 16 + r[:, None]) * 64 + (bj * 16 + r[None, :]))


@triton.jit
def _blk_st(ptr, bi: tl.constexpr, bj: tl.constexpr, x):
    r = tl.arange(0, 16)
    tl.store(ptr + (bi * 16 + r[:, None]) * 64 + (bj * 16 + r[None, :]), x)


@triton.jit
def _gdn_system(k_ptr, g_ptr, b_ptr, L, skt, sgt, sbt, sA,
                K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """GDN: ``A = strictly_lower(beta_r rk_r rk_s (k_r . k_s) exp(G_r - G_s))`` as one 64 x 64 dot,
    stored to the scratch ``sA``. Returns the chunk-local cumulative gate ``G [64]``, the inverse
    key norms ``rk [64]`` and ``beta [64]`` (rows past ``L`` hold zeros)."""
    r = tl.arange(0, 64)
    m = r < L
    kk = tl.zeros([64, 64], dtype=tl.float32)
    ss = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        kt = _ld(k_ptr, r, m, skt, ik * BK, BK)
        f = kt.to(tl.float32)
        ss += tl.sum(f * f, axis=1)
        d = kt.to(DT)
        kk = tl.dot(d, tl.trans(d), acc=kk, input_precision=PREC)
    if L2NORM:
        rk = tl.where(m, 1.0 / tl.sqrt(ss + 1e-6), 0.0)
    else:
        rk = tl.where(m, 1.0, 0.0)
    G = tl.cumsum(tl.maximum(tl.load(g_ptr + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN), axis=0)
    b = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
    strict = r[:, None] > r[None, :]
    a = kk * tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf")))
    a = a * (b * rk)[:, None] * rk[None, :]
    tl.store(sA + r[:, None] * 64 + r[None, :], a)
    return G, rk, b


@triton.jit
def _norms(k_ptr, q_ptr, r, m, skt, sqt, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """Inverse l2 norms of the chunk's key and query rows (``[64]`` fp32; keys 0 past ``L``; both 1
    without l2norm)."""
    if L2NORM:
        ks = tl.zeros([64], dtype=tl.float32)
        qs = tl.zeros([64], dtype=tl.float32)
        for ik in range(K // BK):
            kt = _ld(k_ptr, r, m, skt, ik * BK, BK).to(tl.float32)
            qt = _ld(q_ptr, r, m, sqt, ik * BK, BK).to(tl.float32)
            ks += tl.sum(kt * kt, axis=1)
            qs += tl.sum(qt * qt, axis=1)
        return tl.where(m, 1.0 / tl.sqrt(ks + 1e-6), 0.0), 1.0 / tl.sqrt(qs + 1e-6)
    else:
        return tl.where(m, 1.0, 0.0), tl.full([64], 1.0, tl.float32)


@triton.jit
def _kda_offdiag(k_ptr, sG, kn, qn, G, r, L, skt, col0, j: tl.constexpr, BK: tl.constexpr,
                 DT: tl.constexpr, PREC: tl.constexpr):
    """Column block ``j`` (0..2) of ``A`` and ``Aqk`` below the diagonal, for channels
    ``col0 .. col0+BK``: the decay is factored through the block's last row ``ref = 16 j + 15``,
    ``exp(G_r - G_s) = exp(G_r - G_ref) exp(G_ref - G_s)`` (rows ``r > ref``, columns ``s <= ref``:
    both exponents <= 0). Returns two ``[64, 16]`` fp32 dots (rows ``<= ref`` are zero; key norms
    of the columns not applied)."""
    c = tl.arange(0, 16)
    d = tl.arange(0, BK)
    ref = 16 * j + 15
    g_ref = tl.load(sG + ref * 64 + d)
    er = tl.exp(tl.where((r > ref)[:, None], G - g_ref[None, :], float("-inf")))
    s = 16 * j + c
    kc = _ld(k_ptr, s, s < L, skt, col0, BK).to(tl.float32)
    kc = (kc * tl.exp(g_ref[None, :] - tl.load(sG + s[:, None] * 64 + d[None, :]))).to(DT)
    a = _mm((kn * er).to(DT), tl.trans(kc), PREC)
    aq = _mm((qn * er).to(DT), tl.trans(kc), PREC)
    return a, aq


@triton.jit
def _kda_system(k_ptr, q_ptr, g_ptr, b_ptr, L, skt, sqt, sgt, sbt, sA, sG, rk_ptr, da_ptr, a_ptr, x_ptr,
                kd_ptr, qg_ptr, gl_ptr, HV, scale,
                K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """KDA's intra-chunk system for one (chunk, value head), channel block by channel block.

    Writes ``A`` (strictly lower, beta and key norms applied) to the scratch ``sA``; to the stage
    buffers (rows of pitch ``HV * K``, or ``HV * 64`` for ``Aqk``; rows past ``L`` untouched):

    - ``rk`` (inverse key norms) and the blocks of ``Aqk[r, s] = sum_d qn_rd kn_sd exp(G_rd - G_sd)``
      below the diagonal blocks (``qn = q rq scale``, ``kn = k rk``),
    - ``x = beta kn exp(G)`` (the operand of ``W = Tm x``; the caller overwrites it with ``W``),
    - ``kd = kn exp(G_C - G)`` and ``qg = qn exp(G)`` (the state and output stages' operands) and
    - ``gl = G_C`` (the chunk's total log decay per channel, ``[K]``).

    The blocks below the diagonal blocks are dots with the decay factored through a reference row
    (:func:`_kda_offdiag`); every exponent taken is <= 0. The diagonal 16 x 16 blocks come from
    :func:`chunk_kda_diag_kernel`: ``da_ptr`` (``[64, 16]`` rows of pitch ``HV * 16``) for ``A``;
    it wrote those of ``Aqk`` itself. ``sG`` (64 x 64 fp32 scratch, free until the solve) holds each
    channel block's ``G`` for the row gathers.
    """
    r = tl.arange(0, 64)
    m = r < L
    rb = r - r % 16  # first row of each row's 16-row block
    c16 = tl.arange(0, 16)
    d = tl.arange(0, BK)
    rk, rq = _norms(k_ptr, q_ptr, r, m, skt, sqt, K, BK, L2NORM)
    tl.store(rk_ptr + r * HV, rk, mask=m)
    b = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
    qs = rq * scale
    A0 = tl.zeros([64, 16], dtype=tl.float32)  # column blocks 0..2 below the diagonal
    A1 = tl.zeros([64, 16], dtype=tl.float32)
    A2 = tl.zeros([64, 16], dtype=tl.float32)
    Q0 = tl.zeros([64, 16], dtype=tl.float32)
    Q1 = tl.zeros([64, 16], dtype=tl.float32)
    Q2 = tl.zeros([64, 16], dtype=tl.float32)
    for ik in range(K // BK):
        col0 = ik * BK
        # rows past L load g = 0, so G there equals G at row L - 1 and G[63] is the chunk's total
        gg = tl.maximum(_ld(g_ptr, r, m, sgt, col0, BK).to(tl.float32), G_MIN)
        G = tl.cumsum(gg, axis=0)
        gl = tl.sum(gg, axis=0)
        kn = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32) * rk[:, None]
        qn = _ld(q_ptr, r, m, sqt, col0, BK).to(tl.float32) * qs[:, None]
        eg = tl.exp(G)
        _st(x_ptr, r, m, HV * K, col0, kn * (b[:, None] * eg), BK)
        _st(kd_ptr, r, m, HV * K, col0, kn * tl.exp(gl[None, :] - G), BK)
        _st(qg_ptr, r, m, HV * K, col0, qn * eg, BK)
        tl.store(gl_ptr + col0 + d, gl)
        tl.debug_barrier()  # the previous channel block's readers of sG are done
        tl.store(sG + r[:, None] * 64 + d[None, :], G)
        tl.debug_barrier()
        a, aq = _kda_offdiag(k_ptr, sG, kn, qn, G, r, L, skt, col0, 0, BK, DT, PREC)
        A0 += a
        Q0 += aq
        a, aq = _kda_offdiag(k_ptr, sG, kn, qn, G, r, L, skt, col0, 1, BK, DT, PREC)
        A1 += a
        Q1 += aq
        a, aq = _kda_offdiag(k_ptr, sG, kn, qn, G, r, L, skt, col0, 2, BK, DT, PREC)
        A2 += a
        Q2 += aq
    # column key norms (rk was stored by this CTA before the barriers above), row beta; the
    # blocks go to the scratch (A) and to aqk now, so that the diagonal pass starts with them dead
    rk0 = tl.load(rk_ptr + c16 * HV, mask=c16 < L, other=0.0)[None, :]
    rk1 = tl.load(rk_ptr + (16 + c16) * HV, mask=16 + c16 < L, other=0.0)[None, :]
    rk2 = tl.load(rk_ptr + (32 + c16) * HV, mask=32 + c16 < L, other=0.0)[None, :]
    bb = b[:, None]
    tl.store(sA + r[:, None] * 64 + c16[None, :], A0 * rk0 * bb, mask=(r >= 16)[:, None])
    tl.store(sA + r[:, None] * 64 + 16 + c16[None, :], A1 * rk1 * bb, mask=(r >= 32)[:, None])
    tl.store(sA + r[:, None] * 64 + 32 + c16[None, :], A2 * rk2 * bb, mask=(r >= 48)[:, None])
    ap = a_ptr + r[:, None] * (HV * 64)
    ety = a_ptr.dtype.element_ty
    tl.store(ap + c16[None, :], (Q0 * rk0).to(ety), mask=(m & (r >= 16))[:, None])
    tl.store(ap + 16 + c16[None, :], (Q1 * rk1).to(ety), mask=(m & (r >= 32))[:, None])
    tl.store(ap + 32 + c16[None, :], (Q2 * rk2).to(ety), mask=(m & (r >= 48))[:, None])
    # the diagonal blocks, from chunk_kda_diag_kernel (strict, key norms applied): beta of the rows
    DA = tl.load(da_ptr + r[:, None] * (HV * 16) + c16[None, :], mask=m[:, None], other=0.0)
    tl.store(sA + r[:, None] * 64 + rb[:, None] + c16[None, :], DA * bb)


@triton.jit
def chunk_kda_diag_kernel(
    q, k, g, cu_seqlens, chunk_seq, chunk_start, da, aqk,
    sqt, sqh, skt, skh, sgt, sgh, N, GROUP, HV, scale,
    K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr,
):
    """KDA, stage 1a: the diagonal 16 x 16 blocks of ``A`` and ``Aqk``, summed exactly.

    Grid ``(4 * NT_max, HV)``: program ``(4 c + b, hv)`` takes rows ``16 b .. 16 b + 15`` of chunk
    ``c`` (blocks past the sequence's end and chunks past the real count do nothing). Inside one
    block, with ``G`` the block-local cumulative log decay (a difference of two rows of one block
    does not depend on where the cumulative sum starts)::

        A[r, s]   = rk_r rk_s sum_d k_rd k_sd exp(G_rd - G_sd)         s < r
        Aqk[r, s] = rq_r scale rk_s sum_d q_rd k_sd exp(G_rd - G_sd)    s <= r

    channel by channel on ``[16, 16, BK]`` tiles, exponents masked to ``s <= r`` (so <= 0): no
    factoring of the decay, so nothing can overflow. Writes ``da [T, HV, 16]`` fp32 (column ``s``
    of row ``r`` holds ``A[r, 16 b + s]``; beta is applied by :func:`_kda_system`) and columns
    ``16 b .. 16 b + 15`` of ``aqk [T, HV, 64]``.
    """
    i_c = tl.program_id(0) // 4
    blk = tl.program_id(0) % 4
    i_hv = tl.program_id(1).to(tl.int64)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    t0 = tl.load(chunk_start + i_c).to(tl.int64) + 16 * blk
    L = tl.load(cu_seqlens + n + 1).to(tl.int64) - t0
    if L <= 0:
        return
    i_h = i_hv // GROUP
    i = tl.arange(0, 16)
    m = i < L
    d = tl.arange(0, BK)
    incl = (i[:, None] >= i[None, :])[:, :, None]
    a = tl.zeros([16, 16], dtype=tl.float32)
    aq = tl.zeros([16, 16], dtype=tl.float32)
    ks = tl.zeros([16], dtype=tl.float32)
    qs = tl.zeros([16], dtype=tl.float32)
    for ik in range(K // BK):
        cols = ik * BK + d
        gb = tl.load(g + t0 * sgt + i_hv * sgh + (i[:, None] * sgt + cols[None, :]), mask=m[:, None], other=0.0)
        G = tl.cumsum(tl.maximum(gb.to(tl.float32), G_MIN), axis=0)
        kb = tl.load(k + t0 * skt + i_h * skh + (i[:, None] * skt + cols[None, :]), mask=m[:, None],
                     other=0.0).to(tl.float32)
        qb = tl.load(q + t0 * sqt + i_h * sqh + (i[:, None] * sqt + cols[None, :]), mask=m[:, None],
                     other=0.0).to(tl.float32)
        ks += tl.sum(kb * kb, axis=1)
        qs += tl.sum(qb * qb, axis=1)
        kc = kb[None, :, :] * tl.exp(tl.where(incl, G[:, None, :] - G[None, :, :], float("-inf")))
        a += tl.sum(kb[:, None, :] * kc, axis=2)
        aq += tl.sum(qb[:, None, :] * kc, axis=2)
    if L2NORM:
        rk = 1.0 / tl.sqrt(ks + 1e-6)
        rq = scale / tl.sqrt(qs + 1e-6)
    else:
        rk = tl.full([16], 1.0, tl.float32)
        rq = tl.full([16], scale, tl.float32)
    a = tl.where(i[:, None] > i[None, :], a, 0.0) * rk[:, None] * rk[None, :]
    aq = aq * rq[:, None] * rk[None, :]
    row = (t0 + i) * HV + i_hv
    tl.store(da + row[:, None] * 16 + i[None, :], a, mask=m[:, None])
    tl.store(aqk + row[:, None] * 64 + 16 * blk + i[None, :], aq.to(aqk.dtype.element_ty), mask=m[:, None])


@triton.jit
def _solve(sA, sT, IPREC: tl.constexpr):
    """``Tm = (I + A)^-1`` for the strictly lower 64 x 64 ``A`` in scratch ``sA``, written to the
    scratch ``sT`` (lower block triangle only; blocks above the diagonal are left unwritten).

    The four diagonal 16 x 16 blocks are inverted together by forward substitution (15 steps on a
    ``[4, 16, 16]`` stack, row ``i`` of each block read straight from the scratch); the blocks
    below the diagonal follow from ``Tm_ij = -Tm_ii sum_{j <= m < i} A_im Tm_mj`` (fp32 dots).
    The scratch round trips re-block the matrix between the two layouts; the caller's CTA
    barriers (``tl.debug_barrier``) order them.
    """
    b = tl.arange(0, 4)
    i16 = tl.arange(0, 16)
    b3 = b[:, None, None]
    rows3 = i16[None, :, None]
    cols3 = i16[None, None, :]
    X = tl.where(rows3 == cols3, 1.0, 0.0) + tl.zeros([4, 16, 16], dtype=tl.float32)
    for i in range(1, 16):
        a = tl.load(sA + (b[:, None] * 16 + i) * 64 + (b[:, None] * 16 + i16[None, :]))  # [4, 16]
        xi = tl.sum(a[:, :, None] * X, axis=1)  # [4, 16]: sum_j A[i, j] X[j, :], per block
        X = tl.where(rows3 == i, X - xi[:, None, :], X)
    tl.store(sT + (b3 * 16 + rows3) * 64 + (b3 * 16 + cols3), X)
    tl.debug_barrier()
    # Row block by row block; every operand is re-read from the scratch where it is used (other
    # threads wrote it: barrier first), so that few 16 x 16 operands are live at once.
    _blk_st(sT, 1, 0, -_mm(_blk_ld(sT, 1, 1), _mm(_blk_ld(sA, 1, 0), _blk_ld(sT, 0, 0), IPREC), IPREC))
    tl.debug_barrier()
    y = _mm(_blk_ld(sA, 2, 1), _blk_ld(sT, 1, 1), IPREC)
    _blk_st(sT, 2, 1, -_mm(_blk_ld(sT, 2, 2), y, IPREC))
    y = _mm(_blk_ld(sA, 2, 0), _blk_ld(sT, 0, 0), IPREC)
    y = _mm(_blk_ld(sA, 2, 1), _blk_ld(sT, 1, 0), IPREC, y)
    _blk_st(sT, 2, 0, -_mm(_blk_ld(sT, 2, 2), y, IPREC))
    tl.debug_barrier()
    y = _mm(_blk_ld(sA, 3, 2), _blk_ld(sT, 2, 2), IPREC)
    _blk_st(sT, 3, 2, -_mm(_blk_ld(sT, 3, 3), y, IPREC))
    y = _mm(_blk_ld(sA, 3, 1), _blk_ld(sT, 1, 1), IPREC)
    y = _mm(_blk_ld(sA, 3, 2), _blk_ld(sT, 2, 1), IPREC, y)
    _blk_st(sT, 3, 1, -_mm(_blk_ld(sT, 3, 3), y, IPREC))
    y = _mm(_blk_ld(sA, 3, 0), _blk_ld(sT, 0, 0), IPREC)
    y = _mm(_blk_ld(sA, 3, 1), _blk_ld(sT, 1, 0), IPREC, y)
    y = _mm(_blk_ld(sA, 3, 2), _blk_ld(sT, 2, 0), IPREC, y)
    _blk_st(sT, 3, 0, -_mm(_blk_ld(sT, 3, 3), y, IPREC))


@triton.jit
def _intra_chunk(
    q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, rk, da, aqk, kd, qg, gl, sA, sT, i_c, i_hv,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    IPREC: tl.constexpr,
):
    """Stage 1 for chunk ``i_c`` and value head ``i_hv`` (see :func:`chunk_intra_kernel`)."""
    n = tl.load(chunk_seq + i_c)
    if n < N:
        i_h = i_hv // GROUP
        t0 = tl.load(chunk_start + i_c).to(tl.int64)
        L = tl.load(cu_seqlens + n + 1).to(tl.int64) - t0
        k_ptr = k + t0 * skt + i_h * skh
        v_ptr = v + t0 * svt + i_hv * svh
        g_ptr = g + t0 * sgt + i_hv * sgh
        b_ptr = beta + t0 * sbt + i_hv * sbh
        rk_ptr = rk + t0 * HV + i_hv
        w_ptr = w + (t0 * HV + i_hv) * K
        r = tl.arange(0, 64)
        m = r < L
        # ---- A into the scratch (the CTA's previous item is done with it: barrier first) ------
        tl.debug_barrier()
        if KDA:
            _kda_system(k_ptr, q + t0 * sqt + i_h * sqh, g_ptr, b_ptr, L, skt, sqt, sgt, sbt, sA, sT, rk_ptr,
                        da + (t0 * HV + i_hv) * 16, aqk + (t0 * HV + i_hv) * 64, w_ptr, kd + (t0 * HV + i_hv) * K,
                        qg + (t0 * HV + i_hv) * K, gl + (i_c.to(tl.int64) * HV + i_hv) * K, HV, scale,
                        K, BK, L2NORM, DT, PREC)
        else:
            G, rkv, bv = _gdn_system(k_ptr, g_ptr, b_ptr, L, skt, sgt, sbt, sA, K, BK, L2NORM, DT, PREC)
            tl.store(rk_ptr + r * HV, rkv, mask=m)
        tl.debug_barrier()
        # ---- Tm = (I + A)^-1 ---------------------------------------------------------------------
        _solve(sA, sT, IPREC)
        tl.debug_barrier()
        blk = (r[:, None] // 16) >= (r[None, :] // 16)
        tm = tl.load(sT + r[:, None] * 64 + r[None, :], mask=blk, other=0.0).to(DT)
        if KDA:  # beta has not been loaded here yet
            bv = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
        # ---- W = Tm diag(beta rk) (K * exp(G)),  U = Tm diag(beta) V ----------------------------
        for ik in range(K // BK):
            col0 = ik * BK
            if KDA:  # the operand x = beta kn exp(G) that _kda_system left in w (this CTA's rows)
                e = _ld(w_ptr, r, m, HV * K, col0, BK)
            else:
                kt = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32)
                e = kt * (bv * rkv * tl.exp(G))[:, None]
            _st(w_ptr, r, m, HV * K, col0, tl.dot(tm, e.to(DT), input_precision=PREC), BK)
        u_ptr = u + (t0 * HV + i_hv) * V
        for iv in range(V // BV):
            col0 = iv * BV
            e = _ld(v_ptr, r, m, svt, col0, BV).to(tl.float32) * bv[:, None]
            _st(u_ptr, r, m, HV * V, col0, tl.dot(tm, e.to(DT), input_precision=PREC), BV)


@triton.jit
def chunk_intra_kernel(
    q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start,
    w, u, rk, da, aqk, kd, qg, gl, scratch,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh,
    N, GROUP, HV, ITEMS, scale,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    IPREC: tl.constexpr,
):
    """Persistent grid ``(P,)``: program ``p`` takes the work items ``p, p + P, ...`` of the
    ``ITEMS = NT_max * HV`` items (chunk-major, value head fastest, so the value heads sharing a key
    head run side by side); items of chunks past the real count do nothing.

    Writes ``w [T, HV, K]`` and ``u [T, HV, V]`` (dtype DT) and ``rk [T, HV]`` fp32. KDA reads the
    diagonal blocks ``da [T, HV, 16]`` of :func:`chunk_kda_diag_kernel` (launched first) and
    writes (see :func:`_kda_system`) the rest of ``aqk [T, HV, 64]`` (lower triangle incl. the
    diagonal; the rest is never read), the decayed keys ``kd`` and queries ``qg [T, HV, K]`` (dtype DT) and the
    chunks' total log decays ``gl [NT_max, HV, K]`` fp32; for GDN those four are unused. ``scale``
    is the query scale (KDA folds it into ``qg`` and ``aqk``). ``scratch`` is fp32
    ``[P, 2, 64, 64]``: program ``p``'s own ``A`` and ``Tm`` (``P`` is about the number of resident
    CTAs, so the scratch stays in L2).
    """
    pid = tl.program_id(0)
    sA = scratch + pid.to(tl.int64) * (2 * 64 * 64)
    sT = sA + 64 * 64
    for item in range(pid, ITEMS, tl.num_programs(0)):
        _intra_chunk(q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, rk, da, aqk, kd, qg, gl, sA, sT,
                     item // HV, (item % HV).to(tl.int64),
                     sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV, scale,
                     K, V, BK, BV, KDA, L2NORM, DT, PREC, IPREC)
