"""Chunked prefill, stage 1: the intra-chunk system of one (chunk, value head).

For one chunk of ``C = 64`` rows (maths in ops.md, "Chunked form"; Yang et al., NeurIPS 2024, the
WY representation; Yang, Kautz, Hatamizadeh, ICLR 2025 for the gates; the Kimi Linear report for
per-channel gates), with ``G`` the chunk-local cumulative log decay and ``k`` l2-normalised::

    A  = strictly_lower( beta_r (k_r . k_s) exp(G_r - G_s) )     KDA: sum_d k_rd k_sd exp(G_rd - G_sd)
    Tm = (I + A)^-1
    W  = Tm diag(beta) (K * exp(G))          U = Tm diag(beta) V

GDN's ``A`` is one 64 x 64 dot into a per-program fp32 scratch (:func:`_gdn_system`). KDA's comes
from its own launch, :func:`chunk_kda_system_kernel`, into ``abuf``, per channel block by one of
two exact factorizations of the per-channel decay: through row 31 for all pairs (two dots) where
the block's decays stay within ``e^-60 .. e^60`` of that row, else by a binary split of the 64
rows: each pair ``s < r`` belongs to one level, and each level is a masked 64 x 64 dot with the
decay factored through a row between the two, ``exp(G_r - G_m) exp(G_m - G_s)``
(:func:`_kda_level`), only exponentials of numbers <= 0, so strongly negative gates cannot
overflow. ``Tm`` is then solved block-wise (:func:`_solve`, in :func:`chunk_intra_kernel`): the four
diagonal 16 x 16 blocks together (bf16/fp16 inputs: the Neumann product
``(I - N)(I + N^2)(I + N^4)(I + N^8)``, six batched dots on 3xTF32; fp32 inputs: forward
substitution), the others by ``Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj`` in two steps; then ``W`` and ``U`` are single 64-row dots with the
whole ``Tm``. The scratch round trips re-block the matrix between those layouts; CTA barriers
(``tl.debug_barrier``) order them. The grid is persistent (about 8 programs per SM), so the
scratch of all programs stays in L2.

Stage 1 also writes ``rk`` (the inverse key norms, 1 without l2norm) and, for KDA
(:func:`chunk_kda_system_kernel`), what the later stages read instead of ``q``, ``k`` and ``g``: the intra-chunk query-key matrix
``Aqk[r, s] = sum_d qn_rd kn_sd exp(G_rd - G_sd)`` (s <= r, ``qn`` = normalised and scaled
queries, ``kn`` = normalised keys), the decayed keys ``kn exp(G_C - G)`` and queries
``qn exp(G)``, and the chunk's total log decay ``G_C`` per channel.
"""

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ._gates import cumsum2
from ._l2norm import SS_LIMIT, chunk_row_max, pow2_scale
from ._pid import chunk_span
from .decode import G_MIN  # the floor of g (-1000), as torch_ref and the decode kernel
from .launch import launch_with

if TYPE_CHECKING:
    from .chunk_tables import ChunkTables
    from .prefill.plan import PrefillBuffers, PrefillInputs, PrefillPlan

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
    key norms ``rk [64]`` and ``beta [64]`` (rows past ``L`` hold zeros).

    With ``L2NORM``, a chunk where a row's sum of squares reaches ``2**64`` forms ``ss`` and the
    dot again on the rows times their power-of-two scale ``sk`` (F44, :mod:`._l2norm`): then
    ``rk = sk / sqrt(ss + 1e-6 sk**2)`` and the dot's entries take ``rk / sk`` (``u``) per row."""
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
        sk = tl.full([64], 1.0, tl.float32)
        if tl.max(ss, axis=0) >= SS_LIMIT:  # F44: rows of |k| >= 2**32 may be here; the others keep sk = 1
            sk = pow2_scale(chunk_row_max(k_ptr, r, m, skt, K, BK))
            kk = tl.zeros([64, 64], dtype=tl.float32)
            ss = tl.zeros([64], dtype=tl.float32)
            for ik in range(K // BK):
                f = _ld(k_ptr, r, m, skt, ik * BK, BK).to(tl.float32) * sk[:, None]
                ss += tl.sum(f * f, axis=1)
                d = f.to(DT)
                kk = tl.dot(d, tl.trans(d), acc=kk, input_precision=PREC)
        u = tl.where(m, 1.0 / tl.sqrt(ss + 1e-6 * sk * sk), 0.0)  # ordinary rows: rk itself
        rk = u * sk
    else:
        rk = tl.where(m, 1.0, 0.0)
        u = rk
    if PREC == "ieee":  # fp32 inputs: two-float G, so that G_r - G_s keeps fp32 accuracy (_gates)
        G, Gl = cumsum2(tl.maximum(tl.load(g_ptr + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN), 0)
    else:
        G = tl.cumsum(tl.maximum(tl.load(g_ptr + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN), axis=0)
    b = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
    strict = r[:, None] > r[None, :]
    D = G[:, None] - G[None, :]
    if PREC == "ieee":
        D = D + (Gl[:, None] - Gl[None, :])
    a = kk * tl.exp(tl.where(strict, D, float("-inf")))
    a = a * (b * u)[:, None] * u[None, :]
    tl.store(sA + r[:, None] * 64 + r[None, :], a)
    return G, rk, b


@triton.jit
def _norms(k_ptr, q_ptr, r, m, skt, sqt, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """Inverse l2 norms of the chunk's key and query rows (``[64]`` fp32; keys 0 past ``L``; both 1
    without l2norm). A chunk where a row's sum of squares reaches ``2**64`` sums the squares again
    on the rows times their power-of-two scales ``s`` (F44, :mod:`._l2norm`), the norm being
    ``s / sqrt(ss + 1e-6 s**2)``; rows with ``s = 1`` give the same bits."""
    if L2NORM:
        ks = tl.zeros([64], dtype=tl.float32)
        qs = tl.zeros([64], dtype=tl.float32)
        for ik in range(K // BK):
            kt = _ld(k_ptr, r, m, skt, ik * BK, BK).to(tl.float32)
            qt = _ld(q_ptr, r, m, sqt, ik * BK, BK).to(tl.float32)
            ks += tl.sum(kt * kt, axis=1)
            qs += tl.sum(qt * qt, axis=1)
        sk = tl.full([64], 1.0, tl.float32)
        sq = tl.full([64], 1.0, tl.float32)
        if tl.max(tl.maximum(ks, qs), axis=0) >= SS_LIMIT:  # F44: rows of |x| >= 2**32 may be here
            sk = pow2_scale(chunk_row_max(k_ptr, r, m, skt, K, BK))
            sq = pow2_scale(chunk_row_max(q_ptr, r, m, sqt, K, BK))
            ks = tl.zeros([64], dtype=tl.float32)
            qs = tl.zeros([64], dtype=tl.float32)
            for ik in range(K // BK):
                kt = _ld(k_ptr, r, m, skt, ik * BK, BK).to(tl.float32) * sk[:, None]
                qt = _ld(q_ptr, r, m, sqt, ik * BK, BK).to(tl.float32) * sq[:, None]
                ks += tl.sum(kt * kt, axis=1)
                qs += tl.sum(qt * qt, axis=1)
        return (tl.where(m, 1.0 / tl.sqrt(ks + 1e-6 * sk * sk), 0.0) * sk,
                (1.0 / tl.sqrt(qs + 1e-6 * sq * sq)) * sq)
    else:
        return tl.where(m, 1.0, 0.0), tl.full([64], 1.0, tl.float32)


#: The fast path of :func:`chunk_kda_system_kernel` factors every decay through the channel block's
#: row 31, which needs ``|G_r - G_31| <= KDA_FAST_SPAN`` for every row and channel: then each
#: factor lies in ``[e^-60, e^60]``, finite and normal in fp32 and tf32 with a margin of ``e^28``
#: for the key and query magnitudes (the entries kept are the exact products, <= |k_r| |k_s|).
KDA_FAST_SPAN = 60.0


@triton.jit
def _kda_level(kn, qn, G, Gl, gscr, r, p, BK: tl.constexpr, PREC: tl.constexpr, OP: tl.constexpr):
    """Level ``p`` (0..5) of one channel block's share of ``A`` and ``Aqk``: the pairs ``s < r``
    of one group of ``2**(p+1)`` rows whose highest differing bit is ``p`` (``r`` has it set, ``s``
    not). The decay factors through the group's middle row ``ref = first + 2**p - 1``, which lies
    between them: ``exp(G_r - G_s) = exp(G_r - G_ref) exp(G_ref - G_s)``, both exponents <= 0.
    ``G_ref`` comes from ``G`` stored to the scratch ``gscr`` (``[64, BK]`` fp32, row-major): a
    load at the reference rows, where ``tl.gather`` would force a column layout on the operands.
    With ``PREC == "ieee"`` (fp32 inputs) ``G`` is a two-float sum ``G + Gl`` (:mod:`._gates`),
    both parts in the scratch (``Gl`` after ``G``), and the differences use both.

    Returns one ``[64, 64]`` matrix: ``A / beta`` for the level's pairs below the diagonal
    (``kn_r . kn_s`` decayed) and ``Aqk`` transposed above it (``(C Rq^T)[s, r] = qn_r . kn_s``
    decayed), zeros elsewhere: two dots into one accumulator, masked once (rows and columns of
    other groups meet only in entries masked out; their factors are <= 1 too, so those are finite).
    """
    ref = (r >> (p + 1) << (p + 1)) + (1 << p) - 1
    g_ref = tl.load(gscr + ref[:, None] * BK + tl.arange(0, BK)[None, :])
    hi = (((r >> p) & 1) == 1)[:, None]  # rows after ref (the others: columns up to ref)
    if PREC == "ieee":
        gl_ref = tl.load(gscr + 64 * BK + ref[:, None] * BK + tl.arange(0, BK)[None, :])
        e = tl.exp(tl.where(hi, (G - g_ref) + (Gl - gl_ref), (g_ref - G) + (gl_ref - Gl)))
    else:
        e = tl.exp(tl.where(hi, G - g_ref, g_ref - G))  # <= 1 either way
    fr = tl.where(hi, e, 0.0)
    c = (kn * tl.where(hi, 0.0, e)).to(OP)
    t = tl.dot((kn * fr).to(OP), tl.trans(c), input_precision=PREC)
    t = tl.dot(c, tl.trans((qn * fr).to(OP)), acc=t, input_precision=PREC)
    same = (r[:, None] >> (p + 1)) == (r[None, :] >> (p + 1))
    return tl.where(same, t, 0.0)


@triton.jit
def kda_block_products(A, kn, qn, G, Gl, g_tot, gscr, r, d, lower, BK: tl.constexpr, PREC: tl.constexpr,
                       OP: tl.constexpr, SPAN: tl.constexpr):
    """``A`` plus one channel block's share of ``A / beta`` (below the diagonal) and ``Aqk``
    transposed (above it), from the block's normalised keys ``kn`` and scaled queries ``qn``
    (``[64, BK]`` fp32) and cumulative gates ``G`` (``Gl``: the two-float low part with
    ``PREC == "ieee"``) whose column sums are ``g_tot``: the fast path through row 31 where
    ``|G_r - G_31| <= SPAN`` holds for the block, else the six levels (:func:`_kda_level`), with ``G``
    through the scratch ``gscr`` (``[64, 64]`` fp32) between CTA barriers
    (:func:`chunk_kda_system_kernel` says why both are exact)."""
    g_mid = tl.sum(tl.where((r == 31)[:, None], G, 0.0), axis=0)  # G at row 31, exactly
    if tl.min(tl.minimum(g_mid, g_tot - g_mid), axis=0) >= -SPAN:
        if PREC == "ieee":
            gl_mid = tl.sum(tl.where((r == 31)[:, None], Gl, 0.0), axis=0)
            dm = (G - g_mid[None, :]) + (Gl - gl_mid[None, :])
            c = (kn * tl.exp(-dm)).to(OP)
            ef = tl.exp(dm)
        else:
            c = (kn * tl.exp(g_mid[None, :] - G)).to(OP)
            ef = tl.exp(G - g_mid[None, :])
        t1 = tl.dot((kn * ef).to(OP), tl.trans(c), input_precision=PREC)
        t2 = tl.dot(c, tl.trans((qn * ef).to(OP)), input_precision=PREC)
        A += tl.where(lower, t1, t2)
    else:
        tl.store(gscr + r[:, None] * BK + d[None, :], G)
        if PREC == "ieee":
            tl.static_assert(2 * BK <= 64, "the scratch (64 x 64 fp32) holds G and Gl for BK <= 32")
            tl.store(gscr + 64 * BK + r[:, None] * BK + d[None, :], Gl)
        tl.debug_barrier()
        for p in range(6):
            A += _kda_level(kn, qn, G, Gl, gscr, r, p, BK, PREC, OP)
        tl.debug_barrier()  # every read of this block's G is done before the next one lands
    return A


@triton.jit
def kda_store_system(A, dqk, b, sA, aqk, row, r, m, lower, HV):
    """Store the accumulated ``A / beta`` times ``beta`` (strictly lower, zeros elsewhere) to the
    ``[64, 64]`` fp32 ``sA`` and ``Aqk`` (transposed above the diagonal of ``A``, ``dqk`` on it)
    to ``aqk``'s rows ``row + r * HV`` (``[T, HV, 64]``; rows past the chunk not written)."""
    tl.store(sA + r[:, None] * 64 + r[None, :], tl.where(lower, A * b[:, None], 0.0))
    # Aqk[j, i] = A[i, j] above the diagonal: element (i, j) goes to aqk's row j, column i
    Qt = tl.where(r[:, None] < r[None, :], A, tl.where(r[:, None] == r[None, :], dqk[:, None], 0.0))
    tl.store(aqk + row * 64 + r[None, :] * (HV * 64) + r[:, None], Qt.to(aqk.dtype.element_ty), mask=m[None, :])


@triton.jit
def chunk_kda_system_kernel(
    q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, abuf, rk, aqk, x, kd, qg, gl,
    sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, GROUP, HV, scale,
    K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    OP: tl.constexpr, SPAN: tl.constexpr,
):
    """KDA, stage 1a: the intra-chunk system of one (chunk, value head), grid ``(NT_max, HV)``.

    With ``G`` the chunk-local cumulative log decay per channel, ``kn = k rk`` and
    ``qn = q rq scale`` (rk, rq: inverse l2 norms, 1 without l2norm)::

        A[r, s]   = beta_r sum_d kn_rd kn_sd exp(G_rd - G_sd)     s < r      -> abuf
        Aqk[r, s] =        sum_d qn_rd kn_sd exp(G_rd - G_sd)     s <= r     -> aqk

    Both build up, channel block by channel block, in one ``[64, 64]`` fp32 accumulator: ``A / beta``
    below the diagonal, ``Aqk`` transposed above it. Per channel block, two ways to factor the
    decay ``exp(G_r - G_s)`` into a row and a column operand:

    - **fast** (``|G_r - G_31| <= SPAN`` for all rows and channels of the block, i.e.
      ``G_31 >= -SPAN`` and ``G_C - G_31 >= -SPAN``): one reference row for all pairs,
      ``exp(G_r - G_31) exp(G_31 - G_s)``, each factor in ``[e^-SPAN, e^SPAN]``: two 64 x 64 dots
      (``SPAN = -inf`` turns this path off).
      Entries above (resp. below) the diagonal of each dot may be large or infinite; they are
      never selected.
    - **level** (otherwise, e.g. strongly negative gates): each pair ``s < r`` belongs to one level
      of a binary split of the 64 rows (:func:`_kda_level`): six levels of two masked dots, with
      the decay factored through a row between the two, so every exponent taken is <= 0.
      ``G`` goes through this program's ``abuf`` rows as a scratch (read back at the reference
      rows), ordered by CTA barriers.

    The dots run on ``OP`` operands (the launcher's choice: fp32, i.e. tf32 on the bf16 path and
    ieee for fp32 inputs; docs/performance.md#kda-system-kernel).

    Writes: ``abuf [NT_max, HV, 64, 64]`` fp32 (the whole matrix, zeros on and above the
    diagonal: the intra kernel solves it in place of its scratch), ``rk [T, HV]`` fp32,
    ``aqk [T, HV, 64]`` (row ``r``: ``Aqk[r, :]``, zeros above the diagonal), ``x = beta kn exp(G)``
    (the operand of ``W = Tm x``, in the ``w`` buffer, overwritten by the intra kernel), the
    decayed keys ``kd = kn exp(G_C - G)`` and queries ``qg = qn exp(G)`` (``[T, HV, K]``, dtype
    DT) and the chunk's total log decays ``gl [NT_max, HV, K]`` fp32. Rows past the sequence's
    end are not written (``abuf``: zero rows).
    """
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    i_h = i_hv // GROUP
    t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
    k_ptr = k + t0 * skt + i_h * skh
    q_ptr = q + t0 * sqt + i_h * sqh
    g_ptr = g + t0 * sgt + i_hv * sgh
    gscr = abuf + (i_c.to(tl.int64) * HV + i_hv) * 4096  # this program's A rows (G's scratch first)
    row = t0 * HV + i_hv  # element offsets of the row-major [T, HV, *] buffers: row * width
    r = tl.arange(0, 64)
    m = r < L
    d = tl.arange(0, BK)
    lower = r[:, None] > r[None, :]
    rkv, rq = _norms(k_ptr, q_ptr, r, m, skt, sqt, K, BK, L2NORM)
    tl.store(rk + row + r * HV, rkv, mask=m)
    b = tl.load(beta + t0 * sbt + i_hv * sbh + r * sbt, mask=m, other=0.0).to(tl.float32)
    qs = rq * scale
    A = tl.zeros([64, 64], dtype=tl.float32)
    dqk = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        col0 = ik * BK
        # rows past L load g = 0, so G there equals G at row L - 1 and the column sum is G_C
        gg = tl.maximum(_ld(g_ptr, r, m, sgt, col0, BK).to(tl.float32), G_MIN)
        kn = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32) * rkv[:, None]
        # kd first: G_C - G as the suffix sum of the gates after each row (no cancellation against
        # a large early decay; exactly 0 at the last row)
        _st(kd + row * K, r, m, HV * K, col0, kn * tl.exp(tl.cumsum(gg, axis=0, reverse=True) - gg), BK)
        if PREC == "ieee":  # fp32 inputs: two-float G, so that differences keep fp32 accuracy
            G, Gl = cumsum2(gg, 0)
        else:
            G = tl.cumsum(gg, axis=0)
            Gl = G  # not used
        g_tot = tl.sum(gg, axis=0)
        qn = _ld(q_ptr, r, m, sqt, col0, BK).to(tl.float32) * qs[:, None]
        eg = tl.exp(G)
        _st(x + row * K, r, m, HV * K, col0, kn * (b[:, None] * eg), BK)
        _st(qg + row * K, r, m, HV * K, col0, qn * eg, BK)
        tl.store(gl + (i_c.to(tl.int64) * HV + i_hv) * K + col0 + d, g_tot)
        dqk += tl.sum(qn * kn, axis=1)
        # this block and the stores after the loop are kda_block_products and kda_store_system (the fused
        # prep's), written out here: calling them (or cum_gates above) moves this kernel's fp16 and fp32
        # sm_90 builds (13 of the KDA builds digested; bf16's keep theirs), not measurable this session
        g_mid = tl.sum(tl.where((r == 31)[:, None], G, 0.0), axis=0)  # G at row 31, exactly
        if tl.min(tl.minimum(g_mid, g_tot - g_mid), axis=0) >= -SPAN:
            if PREC == "ieee":
                gl_mid = tl.sum(tl.where((r == 31)[:, None], Gl, 0.0), axis=0)
                dm = (G - g_mid[None, :]) + (Gl - gl_mid[None, :])
                c = (kn * tl.exp(-dm)).to(OP)
                ef = tl.exp(dm)
            else:
                c = (kn * tl.exp(g_mid[None, :] - G)).to(OP)
                ef = tl.exp(G - g_mid[None, :])
            t1 = tl.dot((kn * ef).to(OP), tl.trans(c), input_precision=PREC)
            t2 = tl.dot(c, tl.trans((qn * ef).to(OP)), input_precision=PREC)
            A += tl.where(lower, t1, t2)
        else:
            tl.store(gscr + r[:, None] * BK + d[None, :], G)
            if PREC == "ieee":
                tl.static_assert(2 * BK <= 64, "the scratch (64 x 64 fp32) holds G and Gl for BK <= 32")
                tl.store(gscr + 64 * BK + r[:, None] * BK + d[None, :], Gl)
            tl.debug_barrier()
            for p in range(6):
                A += _kda_level(kn, qn, G, Gl, gscr, r, p, BK, PREC, OP)
            tl.debug_barrier()  # every read of this block's G is done before the next one lands
    tl.store(gscr + r[:, None] * 64 + r[None, :], tl.where(lower, A * b[:, None], 0.0))
    # Aqk[j, i] = A[i, j] above the diagonal: element (i, j) goes to aqk's row j, column i
    Qt = tl.where(r[:, None] < r[None, :], A, tl.where(r[:, None] == r[None, :], dqk[:, None], 0.0))
    tl.store(aqk + row * 64 + r[None, :] * (HV * 64) + r[:, None], Qt.to(aqk.dtype.element_ty), mask=m[None, :])


@triton.jit
def _diag_inv(sA, sT, NEUMANN: tl.constexpr, DPREC: tl.constexpr):
    """The four diagonal 16 x 16 blocks of ``Tm``, together on a ``[4, 16, 16]`` stack, stored to
    ``sT``. ``NEUMANN``: ``(I + N)^-1 = (I - N)(I + N^2)(I + N^4)(I + N^8)`` (exact, as ``N^16 = 0``
    for a strictly lower 16 x 16 ``N``): six batched dots at ``DPREC`` and no sequential chain.
    Else forward substitution, 15 steps, with the blocks held transposed in registers."""
    b = tl.arange(0, 4)
    i16 = tl.arange(0, 16)
    b3 = b[:, None, None]
    rows3 = i16[None, :, None]
    cols3 = i16[None, None, :]
    X = tl.where(rows3 == cols3, 1.0, 0.0) + tl.zeros([4, 16, 16], dtype=tl.float32)
    if NEUMANN:
        N = tl.load(sA + (b3 * 16 + rows3) * 64 + (b3 * 16 + cols3))
        X = X - N
        N = tl.dot(N, N, input_precision=DPREC)
        X = tl.dot(X, N, acc=X, input_precision=DPREC)
        N = tl.dot(N, N, input_precision=DPREC)
        X = tl.dot(X, N, acc=X, input_precision=DPREC)
        N = tl.dot(N, N, input_precision=DPREC)
        X = tl.dot(X, N, acc=X, input_precision=DPREC)
    else:
        # At[b, j, i] = A[16 b + i, 16 b + j]: row i of a block is a masked sum over the last axis,
        # independent of X (no load in the chain)
        At = tl.load(sA + (b3 * 16 + cols3) * 64 + (b3 * 16 + rows3))
        for i in range(1, 16):
            a = tl.sum(tl.where(cols3 == i, At, 0.0), axis=2)  # [4, 16] over j: A[i, j]
            xi = tl.sum(a[:, :, None] * X, axis=1)  # [4, 16]: sum_j A[i, j] X[j, :], per block
            X = tl.where(rows3 == i, X - xi[:, None, :], X)
    tl.store(sT + (b3 * 16 + rows3) * 64 + (b3 * 16 + cols3), X)


@triton.jit
def _half_ld(ptr, hi: tl.constexpr):
    """The lower block triangle of the 32 x 32 diagonal half ``hi`` (0, 1) of a 64 x 64 scratch
    matrix (the block above its diagonal is unwritten: zeros)."""
    r = tl.arange(0, 32)
    keep = (r[:, None] // 16) >= (r[None, :] // 16)
    return tl.load(ptr + (hi * 32 + r[:, None]) * 64 + (hi * 32 + r[None, :]), mask=keep, other=0.0)


@triton.jit
def _solve(sA, sT, NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr):
    """``Tm = (I + A)^-1`` for the strictly lower 64 x 64 ``A`` at ``sA`` (row-major fp32), written
    to the scratch ``sT`` (lower block triangle only; blocks above the diagonal are left unwritten).

    The four diagonal 16 x 16 blocks first (:func:`_diag_inv`); then, from
    ``Tm_ij = -Tm_ii sum_{j <= m < i} A_im Tm_mj``, the two 16 x 16 blocks next to the diagonal,
    (1, 0) and (3, 2), and last the lower-left 32 x 32 half ``-Tm_hi A_hl Tm_lo`` at once (fp32
    dots at ``IPREC``). The scratch round trips re-block the matrix between those layouts; CTA
    barriers (``tl.debug_barrier``; the caller's before and after) order them.
    """
    _diag_inv(sA, sT, NEUMANN, DPREC)
    tl.debug_barrier()
    _blk_st(sT, 1, 0, -_mm(_blk_ld(sT, 1, 1), _mm(_blk_ld(sA, 1, 0), _blk_ld(sT, 0, 0), IPREC), IPREC))
    _blk_st(sT, 3, 2, -_mm(_blk_ld(sT, 3, 3), _mm(_blk_ld(sA, 3, 2), _blk_ld(sT, 2, 2), IPREC), IPREC))
    tl.debug_barrier()
    r = tl.arange(0, 32)
    y = _mm(tl.load(sA + (32 + r[:, None]) * 64 + r[None, :]), _half_ld(sT, 0), IPREC)
    tl.store(sT + (32 + r[:, None]) * 64 + r[None, :], -_mm(_half_ld(sT, 1), y, IPREC))


@triton.jit
def _intra_chunk(
    k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, tm_beta, rk, abuf, sA, sT, i_c, i_hv,
    skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr, TMOUT: tl.constexpr,
):
    """Stage 1 for chunk ``i_c`` and value head ``i_hv`` (see :func:`chunk_intra_kernel`)."""
    n = tl.load(chunk_seq + i_c)
    if n < N:
        i_h = i_hv // GROUP
        t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
        k_ptr = k + t0 * skt + i_h * skh
        v_ptr = v + t0 * svt + i_hv * svh
        b_ptr = beta + t0 * sbt + i_hv * sbh
        rk_ptr = rk + t0 * HV + i_hv
        w_ptr = w + (t0 * HV + i_hv) * K
        r = tl.arange(0, 64)
        m = r < L
        # ---- A: KDA's from chunk_kda_system_kernel, in place; GDN's into the scratch ------------
        tl.debug_barrier()  # the CTA's previous item is done with the scratch
        if KDA:
            sA = abuf + (i_c.to(tl.int64) * HV + i_hv) * 4096
        else:
            G, rkv, bv = _gdn_system(k_ptr, g + t0 * sgt + i_hv * sgh, b_ptr, L, skt, sgt, sbt, sA, K, BK,
                                     L2NORM, DT, PREC)
            tl.store(rk_ptr + r * HV, rkv, mask=m)
            wsc = bv * rkv * tl.exp(G)  # W's row scale: one vector live across the solve
            tl.debug_barrier()
        if KDA:
            bv = tl.load(b_ptr + r * sbt, mask=m, other=0.0).to(tl.float32)
        # ---- Tm = (I + A)^-1 ---------------------------------------------------------------------
        _solve(sA, sT, NEUMANN, DPREC, IPREC)
        tl.debug_barrier()
        blk = (r[:, None] // 16) >= (r[None, :] // 16)
        tmf = tl.load(sT + r[:, None] * 64 + r[None, :], mask=blk, other=0.0)
        if TMOUT:  # Tm diag(beta) [T, HV, 64]: the state stage forms U itself
            _st(tm_beta + (t0 * HV + i_hv) * 64, r, m, HV * 64, 0, tmf * bv[None, :], 64)
        tm = tmf.to(DT)
        # ---- W = Tm diag(beta rk) (K * exp(G)),  U = Tm diag(beta) V ----------------------------
        for ik in range(K // BK):
            col0 = ik * BK
            if KDA:  # the operand x = beta kn exp(G) that chunk_kda_system_kernel left in w
                e = _ld(w_ptr, r, m, HV * K, col0, BK)
            else:
                kt = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32)
                e = kt * wsc[:, None]
            _st(w_ptr, r, m, HV * K, col0, tl.dot(tm, e.to(DT), input_precision=PREC), BK)
        if not TMOUT:
            u_ptr = u + (t0 * HV + i_hv) * V
            for iv in range(V // BV):
                col0 = iv * BV
                e = _ld(v_ptr, r, m, svt, col0, BV).to(tl.float32) * bv[:, None]
                _st(u_ptr, r, m, HV * V, col0, tl.dot(tm, e.to(DT), input_precision=PREC), BV)


@triton.jit
def chunk_intra_kernel(
    k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, tm_beta, rk, abuf, scratch,
    skt, skh, svt, svh, sgt, sgh, sbt, sbh,
    N, GROUP, HV, ITEMS,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr, TMOUT: tl.constexpr = False,
):
    """Persistent grid ``(P,)``: program ``p`` takes the work items ``p, p + P, ...`` of the
    ``ITEMS = NT_max * HV`` items (chunk-major, value head fastest, so the value heads sharing a key
    head run side by side); items of chunks past the real count do nothing.

    Writes ``w [T, HV, K]`` and ``u [T, HV, V]`` (dtype DT; with ``TMOUT``, GDN only,
    ``tm_beta`` gets ``Tm diag(beta)`` ``[T, HV, 64]`` instead, ``u`` is None and the state stage
    forms ``U``; otherwise ``tm_beta`` is None); GDN also
    ``rk [T, HV]`` fp32. KDA solves the matrices ``abuf [NT_max, HV, 64, 64]`` of :func:`chunk_kda_system_kernel` (launched
    first; it also left the operand of ``W`` in ``w`` and wrote ``rk``); GDN builds ``A`` itself
    (:func:`_gdn_system`; KDA passes ``g`` as None, GDN ``abuf``). ``scratch`` is fp32 ``[P, 2, 64, 64]``: program ``p``'s own ``A`` (GDN)
    and ``Tm`` (``P`` is about the number of resident CTAs, so the scratch stays in L2).
    """
    tl.static_assert(not (KDA and TMOUT), "TMOUT is GDN's")
    pid = tl.program_id(0)
    sA = scratch + pid.to(tl.int64) * (2 * 64 * 64)
    sT = sA + 64 * 64
    for item in range(pid, ITEMS, tl.num_programs(0)):
        _intra_chunk(k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, w, u, tm_beta, rk, abuf, sA, sT,
                     item // HV, (item % HV).to(tl.int64),
                     skt, skh, svt, svh, sgt, sgh, sbt, sbh, N, GROUP, HV,
                     K, V, BK, BV, KDA, L2NORM, DT, PREC, NEUMANN, DPREC, IPREC, TMOUT)


# -- the host side: stage 1's launches --------------------------------------------------------

def launch_intra(plan: "PrefillPlan", x: "PrefillInputs", t: "ChunkTables", b: "PrefillBuffers", scale: float) -> None:
    """Stage 1: KDA's system kernel (grid ``(NT_max, HV)``), then the persistent intra kernel
    (``min(NT_max * HV, sm_count * ctas_per_sm)`` programs, each with its own 32 KiB fp32 scratch).
    Writes ``w``, ``u`` (or ``tm_beta``), ``rk`` and KDA's operands; touches no state."""
    cfg, kda, HV = plan.config, plan.kda, plan.HV
    common = dict(K=plan.K, L2NORM=plan.use_qk_l2norm, DT=plan.DT, PREC=plan.PREC)
    if kda:  # stage 1a: A, Aqk and the later stages' operands
        s = cfg.kda_system
        launch_with(chunk_kda_system_kernel, plan.grids.kda_system,
                    (x.q, x.k, x.g, x.beta, x.cu_seqlens, t.chunk_seq, t.chunk_start, b.kda_a, b.rk, b.kda_aqk, b.w,
                     b.kda_kd, b.kda_qg, b.kda_gl, *x.q.stride()[:2], *x.k.stride()[:2], *x.g.stride()[:2],
                     *x.beta.stride()[:2], plan.N, plan.group, HV, float(scale)),
                    dict(common, **kda_system_constexprs(plan)), s.launch)
    solve = cfg.intra.solve
    launch_with(chunk_intra_kernel, plan.grids.intra,
                (x.k, x.v, None if kda else x.g, x.beta, x.cu_seqlens, t.chunk_seq, t.chunk_start, b.w, b.u,
                 b.tm_beta, b.rk, b.kda_a, b.intra_scratch, *x.k.stride()[:2], *x.v.stride()[:2],
                 *((0, 0) if kda else x.g.stride()[:2]), *x.beta.stride()[:2],
                 plan.N, plan.group, HV, plan.nt_max * HV),
                dict(common, V=plan.V, BK=cfg.intra.block, BV=cfg.intra.block, KDA=kda, NEUMANN=solve.neumann,
                     DPREC=solve.diag_precision, IPREC=solve.below_precision, TMOUT=plan.stages.u_in_state),
                plan.intra_launch)


def kda_system_constexprs(plan: "PrefillPlan") -> dict:
    """KDA's channel-block constexprs (:class:`KdaSystemConfig`: ``BK``, the operand dtype ``OP``, the
    fast path's ``SPAN``, ``-inf`` when off) for :func:`.chunk_intra.chunk_kda_system_kernel` and the
    fused prep (:func:`.chunk_fused_kda.chunk_kda_fused_prep_kernel`)."""
    s = plan.config.kda_system
    return dict(BK=s.block_k, OP=plan.DT if s.bf16_operands else tl.float32,
                SPAN=KDA_FAST_SPAN if s.fast_path else float("-inf"))
