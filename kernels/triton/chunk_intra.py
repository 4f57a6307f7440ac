"""Chunked prefill, stage 1: the intra-chunk system of one (chunk, value head).

For one chunk of ``C = 64`` rows (maths in ops.md, "Chunked form"; Yang et al., NeurIPS 2024, the
WY representation; Yang, Kautz, Hatamizadeh, ICLR 2025 for the gates; the Kimi Linear report for
per-channel gates), with ``G`` the chunk-local cumulative log decay and ``k`` l2-normalised::

    A  = strictly_lower( beta_r (k_r . k_s) exp(G_r - G_s) )     KDA: sum_d k_rd k_sd exp(G_rd - G_sd)
    Tm = (I + A)^-1
    W  = Tm diag(beta) (K * exp(G))          U = Tm diag(beta) V

``A`` goes to a per-program fp32 scratch (GDN: one 64 x 64 dot; KDA: one ``[16, 64]`` dot per
row block, the per-channel decay factored through the row just above the block,
``exp(G_r - G_m) exp(G_m - G_s)``, both exponents <= 0, and the diagonal 16 x 16 blocks summed
channel by channel: only exponentials of differences that are <= 0 are ever taken, so strongly
negative gates cannot overflow). ``Tm`` is solved block-wise from the scratch: the four diagonal
16 x 16 blocks together by forward substitution, the others by
``Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj``; then ``W`` and ``U`` are single 64-row dots with the
whole ``Tm``. The scratch round trips re-block the matrix between those layouts; CTA barriers
(``tl.debug_barrier``) order them. The grid is persistent (about 8 programs per SM), so the
scratch of all programs stays in L2.

The kernel also writes ``rk`` (the inverse key norms, 1 without l2norm) and, for KDA, the
intra-chunk query-key matrix ``Aqk[r, s] = sum_d q_rd k_sd exp(G_rd - G_sd) rk_s`` (s <= r,
query norm and scale applied later) and the cumulative gates ``G``, which the later stages read.
"""

import triton
import triton.language as tl

from .decode import G_MIN  # the floor of g (-1000), as torch_ref and the decode kernel

@triton.jit
def _rows(L, b: tl.constexpr):
    """Chunk-local rows of row block ``b`` (int32) and their mask (rows < L)."""
    r = b * 16 + tl.arange(0, 16)
    return r, r < L


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
def _kda_diag(k_ptr, q_ptr, g_ptr, tok, msk, skt, sqt, sgt, K: tl.constexpr):
    """Diagonal 16 x 16 block of A (strict, no beta/norms) and Aqk (incl. diagonal), channel by channel."""
    r = tl.arange(0, 16)
    incl = (r[:, None] >= r[None, :])[:, :, None]
    strict = (r[:, None] > r[None, :])[:, :, None]
    akk = tl.zeros([16, 16], dtype=tl.float32)
    aqk = tl.zeros([16, 16], dtype=tl.float32)
    for p in range(K // 16):
        kk = _ld(k_ptr, tok, msk, skt, p * 16, 16).to(tl.float32)
        gg = tl.maximum(_ld(g_ptr, tok, msk, sgt, p * 16, 16).to(tl.float32), G_MIN)
        gl = tl.cumsum(gg, axis=0)
        e = tl.exp(tl.where(incl, gl[:, None, :] - gl[None, :, :], float("-inf")))  # [r, s, d]
        akk += tl.sum(tl.where(strict, kk[:, None, :] * kk[None, :, :] * e, 0.0), axis=2)
        qq = _ld(q_ptr, tok, msk, sqt, p * 16, 16).to(tl.float32)
        aqk += tl.sum(qq[:, None, :] * kk[None, :, :] * e, axis=2)
    return akk, aqk


@triton.jit
def _kda_gates(g_ptr, L, sgt, col0, BK: tl.constexpr):
    """Cumulative log decays of the 4 row blocks for channels col0..col0+BK, and the carries
    (G at the last row above each block; carry 0 is 0)."""
    tok0, m0 = _rows(L, 0)
    tok1, m1 = _rows(L, 1)
    tok2, m2 = _rows(L, 2)
    tok3, m3 = _rows(L, 3)
    g0 = tl.maximum(_ld(g_ptr, tok0, m0, sgt, col0, BK).to(tl.float32), G_MIN)
    G0 = tl.cumsum(g0, axis=0)
    c1 = tl.sum(g0, axis=0)
    g1 = tl.maximum(_ld(g_ptr, tok1, m1, sgt, col0, BK).to(tl.float32), G_MIN)
    G1 = tl.cumsum(g1, axis=0) + c1[None, :]
    c2 = c1 + tl.sum(g1, axis=0)
    g2 = tl.maximum(_ld(g_ptr, tok2, m2, sgt, col0, BK).to(tl.float32), G_MIN)
    G2 = tl.cumsum(g2, axis=0) + c2[None, :]
    c3 = c2 + tl.sum(g2, axis=0)
    g3 = tl.maximum(_ld(g_ptr, tok3, m3, sgt, col0, BK).to(tl.float32), G_MIN)
    G3 = tl.cumsum(g3, axis=0) + c3[None, :]
    return G0, G1, G2, G3, c1, c2, c3



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
def _kda_system(k_ptr, q_ptr, g_ptr, b_ptr, L, skt, sqt, sgt, sbt, sA, rk_ptr, a_ptr, gc_ptr, HV,
                K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """KDA: the 16 x 16 blocks of ``A`` (per-channel decays, beta and key norms applied) to the
    scratch ``sA`` (blocks above the diagonal are never read), ``rk`` and the intra-chunk
    query-key matrix ``Aqk`` (columns scaled by ``rk``) to their buffers, and the chunk-local
    cumulative gates ``G`` to ``gc_ptr`` (rows of pitch ``HV * K``; the state and output stages
    read them instead of summing ``g`` again). The off-diagonal blocks factor the decay through the
    row above the block (see the module docstring)."""
    tok0, m0 = _rows(L, 0)
    tok1, m1 = _rows(L, 1)
    tok2, m2 = _rows(L, 2)
    tok3, m3 = _rows(L, 3)
    s0 = tl.zeros([16], dtype=tl.float32)
    s1 = tl.zeros([16], dtype=tl.float32)
    s2 = tl.zeros([16], dtype=tl.float32)
    s3 = tl.zeros([16], dtype=tl.float32)
    A10 = tl.zeros([16, 16], dtype=tl.float32)
    A20 = tl.zeros([16, 16], dtype=tl.float32)
    A21 = tl.zeros([16, 16], dtype=tl.float32)
    A30 = tl.zeros([16, 16], dtype=tl.float32)
    A31 = tl.zeros([16, 16], dtype=tl.float32)
    A32 = tl.zeros([16, 16], dtype=tl.float32)
    Q10 = tl.zeros([16, 16], dtype=tl.float32)
    Q20 = tl.zeros([16, 16], dtype=tl.float32)
    Q21 = tl.zeros([16, 16], dtype=tl.float32)
    Q30 = tl.zeros([16, 16], dtype=tl.float32)
    Q31 = tl.zeros([16, 16], dtype=tl.float32)
    Q32 = tl.zeros([16, 16], dtype=tl.float32)
    for ik in range(K // BK):
        col0 = ik * BK
        f0 = _ld(k_ptr, tok0, m0, skt, col0, BK).to(tl.float32)
        f1 = _ld(k_ptr, tok1, m1, skt, col0, BK).to(tl.float32)
        f2 = _ld(k_ptr, tok2, m2, skt, col0, BK).to(tl.float32)
        f3 = _ld(k_ptr, tok3, m3, skt, col0, BK).to(tl.float32)
        s0 += tl.sum(f0 * f0, axis=1)
        s1 += tl.sum(f1 * f1, axis=1)
        s2 += tl.sum(f2 * f2, axis=1)
        s3 += tl.sum(f3 * f3, axis=1)
        G0, G1, G2, G3, c1, c2, c3 = _kda_gates(g_ptr, L, sgt, col0, BK)
        _st(gc_ptr, tok0, m0, HV * K, col0, G0, BK)
        _st(gc_ptr, tok1, m1, HV * K, col0, G1, BK)
        _st(gc_ptr, tok2, m2, HV * K, col0, G2, BK)
        _st(gc_ptr, tok3, m3, HV * K, col0, G3, BK)
        fq1 = _ld(q_ptr, tok1, m1, sqt, col0, BK).to(tl.float32)
        fq2 = _ld(q_ptr, tok2, m2, sqt, col0, BK).to(tl.float32)
        fq3 = _ld(q_ptr, tok3, m3, sqt, col0, BK).to(tl.float32)
        # row block 1, reference row 15 (carry c1): exp(G1 - c1) <= 1, exp(c1 - G0) <= 1
        e = tl.exp(G1 - c1[None, :])
        kc = (f0 * tl.exp(c1[None, :] - G0)).to(DT)
        A10 += _mm((f1 * e).to(DT), tl.trans(kc), PREC)
        Q10 += _mm((fq1 * e).to(DT), tl.trans(kc), PREC)
        # row block 2, reference row 31
        e = tl.exp(G2 - c2[None, :])
        kr = (f2 * e).to(DT)
        qr = (fq2 * e).to(DT)
        kc = (f0 * tl.exp(c2[None, :] - G0)).to(DT)
        A20 += _mm(kr, tl.trans(kc), PREC)
        Q20 += _mm(qr, tl.trans(kc), PREC)
        kc = (f1 * tl.exp(c2[None, :] - G1)).to(DT)
        A21 += _mm(kr, tl.trans(kc), PREC)
        Q21 += _mm(qr, tl.trans(kc), PREC)
        # row block 3, reference row 47
        e = tl.exp(G3 - c3[None, :])
        kr = (f3 * e).to(DT)
        qr = (fq3 * e).to(DT)
        kc = (f0 * tl.exp(c3[None, :] - G0)).to(DT)
        A30 += _mm(kr, tl.trans(kc), PREC)
        Q30 += _mm(qr, tl.trans(kc), PREC)
        kc = (f1 * tl.exp(c3[None, :] - G1)).to(DT)
        A31 += _mm(kr, tl.trans(kc), PREC)
        Q31 += _mm(qr, tl.trans(kc), PREC)
        kc = (f2 * tl.exp(c3[None, :] - G2)).to(DT)
        A32 += _mm(kr, tl.trans(kc), PREC)
        Q32 += _mm(qr, tl.trans(kc), PREC)
    if L2NORM:
        r0 = 1.0 / tl.sqrt(s0 + 1e-6)
        r1 = 1.0 / tl.sqrt(s1 + 1e-6)
        r2 = 1.0 / tl.sqrt(s2 + 1e-6)
        r3 = 1.0 / tl.sqrt(s3 + 1e-6)
    else:
        r0 = tl.full([16], 1.0, tl.float32)
        r1 = tl.full([16], 1.0, tl.float32)
        r2 = tl.full([16], 1.0, tl.float32)
        r3 = tl.full([16], 1.0, tl.float32)
    tl.store(rk_ptr + tok0 * HV, r0, mask=m0)
    tl.store(rk_ptr + tok1 * HV, r1, mask=m1)
    tl.store(rk_ptr + tok2 * HV, r2, mask=m2)
    tl.store(rk_ptr + tok3 * HV, r3, mask=m3)
    A00, D00 = _kda_diag(k_ptr, q_ptr, g_ptr, tok0, m0, skt, sqt, sgt, K)
    A11, D11 = _kda_diag(k_ptr, q_ptr, g_ptr, tok1, m1, skt, sqt, sgt, K)
    A22, D22 = _kda_diag(k_ptr, q_ptr, g_ptr, tok2, m2, skt, sqt, sgt, K)
    A33, D33 = _kda_diag(k_ptr, q_ptr, g_ptr, tok3, m3, skt, sqt, sgt, K)
    # Aqk = q k^T with decays, columns scaled by rk (query norm and scale: output stage)
    _st(a_ptr, tok0, m0, HV * 64, 0, D00 * r0[None, :], 16)
    _st(a_ptr, tok1, m1, HV * 64, 0, Q10 * r0[None, :], 16)
    _st(a_ptr, tok1, m1, HV * 64, 16, D11 * r1[None, :], 16)
    _st(a_ptr, tok2, m2, HV * 64, 0, Q20 * r0[None, :], 16)
    _st(a_ptr, tok2, m2, HV * 64, 16, Q21 * r1[None, :], 16)
    _st(a_ptr, tok2, m2, HV * 64, 32, D22 * r2[None, :], 16)
    _st(a_ptr, tok3, m3, HV * 64, 0, Q30 * r0[None, :], 16)
    _st(a_ptr, tok3, m3, HV * 64, 16, Q31 * r1[None, :], 16)
    _st(a_ptr, tok3, m3, HV * 64, 32, Q32 * r2[None, :], 16)
    _st(a_ptr, tok3, m3, HV * 64, 48, D33 * r3[None, :], 16)
    # beta and key norms: A_rs *= beta_r rk_r rk_s
    x0 = tl.load(b_ptr + tok0 * sbt, mask=m0, other=0.0).to(tl.float32) * r0
    x1 = tl.load(b_ptr + tok1 * sbt, mask=m1, other=0.0).to(tl.float32) * r1
    x2 = tl.load(b_ptr + tok2 * sbt, mask=m2, other=0.0).to(tl.float32) * r2
    x3 = tl.load(b_ptr + tok3 * sbt, mask=m3, other=0.0).to(tl.float32) * r3
    _blk_st(sA, 0, 0, A00 * x0[:, None] * r0[None, :])
    _blk_st(sA, 1, 1, A11 * x1[:, None] * r1[None, :])
    _blk_st(sA, 2, 2, A22 * x2[:, None] * r2[None, :])
    _blk_st(sA, 3, 3, A33 * x3[:, None] * r3[None, :])
    _blk_st(sA, 1, 0, A10 * x1[:, None] * r0[None, :])
    _blk_st(sA, 2, 0, A20 * x2[:, None] * r0[None, :])
    _blk_st(sA, 2, 1, A21 * x2[:, None] * r1[None, :])
    _blk_st(sA, 3, 0, A30 * x3[:, None] * r0[None, :])
    _blk_st(sA, 3, 1, A31 * x3[:, None] * r1[None, :])
    _blk_st(sA, 3, 2, A32 * x3[:, None] * r2[None, :])


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
    q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, rk, aqk, gc, sA, sT, i_c, i_hv,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV,
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
        r = tl.arange(0, 64)
        m = r < L
        # ---- A into the scratch (the CTA's previous item is done with it: barrier first) ------
        tl.debug_barrier()
        if KDA:
            _kda_system(k_ptr, q + t0 * sqt + i_h * sqh, g_ptr, b_ptr, L, skt, sqt, sgt, sbt, sA, rk_ptr,
                        aqk + (t0 * HV + i_hv) * 64, gc + (t0 * HV + i_hv) * K, HV, K, BK, L2NORM, DT, PREC)
        else:
            G, rkv, bv = _gdn_system(k_ptr, g_ptr, b_ptr, L, skt, sgt, sbt, sA, K, BK, L2NORM, DT, PREC)
            tl.store(rk_ptr + r * HV, rkv, mask=m)
        tl.debug_barrier()
        # ---- Tm = (I + A)^-1 ---------------------------------------------------------------------
        _solve(sA, sT, IPREC)
        tl.debug_barrier()
        blk = (r[:, None] // 16) >= (r[None, :] // 16)
        tm = tl.load(sT + r[:, None] * 64 + r[None, :], mask=blk, other=0.0).to(DT)
        if KDA:  # rk was written by this CTA before the barriers; beta has not been loaded yet
            rkv = tl.load(rk_ptr + r * HV, mask=m, other=0.0)
            bv = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
        # ---- W = Tm diag(beta rk) (K * exp(G)),  U = Tm diag(beta) V ----------------------------
        w_ptr = w + (t0 * HV + i_hv) * K
        for ik in range(K // BK):
            col0 = ik * BK
            kt = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32)
            if KDA:
                Gk = _ld(gc + (t0 * HV + i_hv) * K, r, m, HV * K, col0, BK)
                e = kt * tl.exp(Gk) * (bv * rkv)[:, None]
            else:
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
    w, u, rk, aqk, gc, scratch,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh,
    N, GROUP, HV, ITEMS,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    IPREC: tl.constexpr,
):
    """Persistent grid ``(P,)``: program ``p`` takes the work items ``p, p + P, ...`` of the
    ``ITEMS = NT_max * HV`` items (chunk-major, value head fastest, so the value heads sharing a key
    head run side by side); items of chunks past the real count do nothing.

    Writes ``w [T, HV, K]`` and ``u [T, HV, V]`` (dtype DT), ``rk [T, HV]`` fp32 and, for KDA,
    ``aqk [T, HV, 64]`` fp32 (lower triangle incl. diagonal; the rest is never read) and the
    chunk-local cumulative gates ``gc [T, HV, K]`` fp32 (``gc`` is unused for GDN). ``scratch`` is
    fp32 ``[P, 2, 64, 64]``: program ``p``'s own ``A`` and ``Tm`` (``P`` is about the number of
    resident CTAs, so the scratch stays in L2).
    """
    pid = tl.program_id(0)
    sA = scratch + pid.to(tl.int64) * (2 * 64 * 64)
    sT = sA + 64 * 64
    for item in range(pid, ITEMS, tl.num_programs(0)):
        _intra_chunk(q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, rk, aqk, gc, sA, sT,
                     item // HV, (item % HV).to(tl.int64),
                     sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV,
                     K, V, BK, BV, KDA, L2NORM, DT, PREC, IPREC)
