"""GDN chunked prefill, fused: the state stays on chip for the whole sequence (issue 27, step 1).

Two launches (after the chunk tables) in place of the pipeline's intra, gates, state and output
stages (:mod:`.prefill`), and nothing of size ``O(K V)`` or ``O(C K)`` per chunk goes through HBM:

1. :func:`chunk_gdn_fused_prep_kernel`, fully parallel over (chunk, key head) on a persistent
   grid (as :func:`.chunk_intra.chunk_intra_kernel`, whose block solve :func:`.chunk_intra._solve`
   it reuses, with a per-program fp32 scratch): per chunk of ``C = 64`` rows, with ``G`` the
   chunk-local cumulative log decay (gates floored at -1000), ``rk``/``rq`` the inverse key/query
   l2 norms (1 without l2norm), for each value head of the key head (GVA: the norms, ``K K^T`` and
   ``Q K^T`` formed once per key head)::

       A    = strictly_lower( beta_r rk_r rk_s (k_r . k_s) exp(G_r - G_s) )
       Tb   = (I + A)^-1 diag(beta)                                         -> tmb [T, HV, 64]
       Aqk  = lower_incl( scale rq_r rk_s (q_r . k_s) exp(G_r - G_s) )      -> aqk [T, HV, 64]
       rk, qs = (scale uq, sq)                                              -> [T, HV], [T, HV, 2] fp32

   (``O(C^2)`` per chunk and value head; the norms scale rows past ``2**32`` by a power of two
   ``sk``, ``sq`` (1 for every other row) before squaring, so no square overflows, and ``rq = uq sq``:
   F44.)
2. :func:`chunk_gdn_fused_kernel`, one program per (value block, sequence, value head) on the grid
   of :func:`linattn.kernels.grid.plan_grid` (ids by :func:`._pid.decode_pid`), walking the
   sequence's chunks in order with the transposed state ``S^T [BV, K]`` fp32 in registers, the
   left operand of every product that reads it (so that the compiler can feed it to the MMA from
   registers, and the chunk's tiles are the right operands, loaded transposed)::

       Vn^T = ((v^T - ((c S^T) k^T) diag(rk exp(G)) / c) Tb^T       (= U - W S: no W, no U in memory)
       O^T  = ((c S^T) q^T) diag(scale uq sq exp(G) / c) + Vn^T Aqk^T
       S^T  = exp(G_C) S^T + (Vn^T diag(rk exp(G_C - G))) k

   (the key rows' scales applied to the products, never to the bf16 keys: ``k`` is a dot operand
   as loaded, which left the kernel 1.31 ms at 16 x 4,096 (16, 32) on the H200 against 1.72 for
   the ``S [K, BV]`` walk that scaled the keys before each product: docs/performance.md#prefill-fused)

   with ``c`` the chunk's smallest query scale ``sq`` (F44): 1, and the formulas the plain ones bit
   for bit, unless a query row of the chunk reaches ``2**32``; then ``q . S`` of a row near fp32's
   largest would overflow, while ``q (c S)`` cannot (a power of two scales without rounding, so
   the chunk's results change only where a product of ``c S`` falls below fp32's normal range).
   ``h0`` comes from the pool row ``state_pool[state_indices[n]]`` (or the dense initial state)
   inside the kernel, and the final state goes back to the same row; a negative slot is padding
   (zero output rows, the pool neither read nor written), ``has_initial_state`` False a zero
   ``h0`` whose slot is not read. Dense and pool mode run the same instructions.

Precision as the pipeline (:mod:`.prefill` docstring): bf16 inputs run the dots on bf16
operands with fp32 accumulation (the state rounded to bf16 as a dot operand, as the pipeline's
stored per-chunk states), fp16 and fp32 inputs on fp32 operands (``DT`` fp32; ``PREC`` tf32 /
ieee), and under ``TRITON_INTERPRET=1`` every dot on fp32 operands. fp32 inputs form the
pairwise decays from two-float cumulative gates (:mod:`._gates`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import triton
import triton.language as tl

from ._gates import cumsum2
from ._l2norm import chunk_row_max, pow2_scale
from ._pid import chunk_span, decode_pid
from .chunk_intra import _ld, _solve, kda_system_constexprs
from .chunk_state import pool_slot, state_strides, store_checkpoint
from .decode import G_MIN
from .launch import launch

if TYPE_CHECKING:
    from .chunk_tables import ChunkTables
    from .prefill.plan import PrefillBuffers, PrefillInputs, PrefillPlan, PrefillState

#: the largest key and value head dims of the fused kernel (the state tile ``[K, BV]`` fp32 lives in
#: registers; K = 256 would spill it)
FUSED_MAX_DIM = 128


@dataclass(frozen=True)
class FusedConfig:
    """The fused prefill's launch configuration (:func:`fused_config`): the fused kernel's value
    columns per program ``block_v``, warps and pipelining stages; the prep kernel's warps,
    persistent programs per SM, key columns per step ``prep_block_k`` (GDN's) and register cap per
    thread ``prep_maxnreg`` (None: the compiler's choice); KDA's ``late_keys``
    (:func:`.chunk_fused_kda.chunk_kda_fused_kernel`'s ``LATE_KD``); GDN's ``prep_shared_keys``
    (:func:`chunk_gdn_fused_prep_kernel`'s ``SHARED_KEYS``: one prep item per key head under GVA)."""

    block_v: int
    num_warps: int
    num_stages: int
    prep_warps: int
    prep_ctas_per_sm: int
    prep_block_k: int = 64
    prep_maxnreg: Optional[int] = None
    late_keys: bool = False
    prep_shared_keys: bool = True


@triton.jit
def _rnorm(ptr, r, m, stride_t, K: tl.constexpr, BK: tl.constexpr):
    """Inverse l2 norms ``1 / sqrt(sum x^2 + 1e-6)`` of the chunk's rows (``[64]`` fp32) without
    overflow, as the decode kernel's ``_l2norm`` (F44): a row whose largest magnitude is
    ``f 2**e >= 2**32`` is scaled by ``s = 2**-(e - 32)`` (from the float's exponent bits,
    :mod:`._l2norm`'s helpers) before squaring, and the eps by ``s**2``; every other row has ``s = 1``, the plain formula. Returns
    ``(u, s)``, the inverse norm being ``u s``: the dots run on the rows times ``s`` (exact, a power
    of two), so that ``k_r . k_s`` cannot overflow either, and ``u`` scales their results."""
    sc = pow2_scale(chunk_row_max(ptr, r, m, stride_t, K, BK))
    ss = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        y = _ld(ptr, r, m, stride_t, ik * BK, BK).to(tl.float32) * sc[:, None]
        ss += tl.sum(y * y, axis=1)
    return 1.0 / tl.sqrt(ss + 1e-6 * sc * sc), sc


@triton.jit
def _chunk_scale(sq):
    """``(c, 1 / c)`` for ``c = min(sq)``, the smallest of a chunk's query scales ``sq [64]`` (powers
    of two in ``[2**-96, 1]``; masked rows 1): ``(1, 1)`` for every chunk without a query row past
    ``2**32``, so that ``S * c``, ``d * (1 / c)`` are exact multiplications by 1 there. ``1 / c`` from
    the exponent bits (exact)."""
    c = tl.min(sq, axis=0)
    return c, ((254 - ((c.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def store_tmb(sT, tmb, row, b, r, m, HV):
    """Store ``Tm diag(beta)`` of one chunk from the solve's scratch ``sT`` (lower block triangle;
    :func:`.chunk_intra._solve`) to ``tmb``'s rows ``row + r * HV * 64`` (``[T, HV, 64]``; rows past
    the chunk, ``m`` False, not written)."""
    tmf = tl.load(sT + r[:, None] * 64 + r[None, :], mask=(r[:, None] // 16) >= (r[None, :] // 16), other=0.0)
    tl.store(tmb + row + r[:, None] * (HV * 64) + r[None, :], (tmf * b[None, :]).to(tmb.dtype.element_ty),
             mask=m[:, None])


@triton.jit
def walk_start(cu_seqlens, state_indices, has_init, h0, s0_p, s0_h, s0_k, s0_v, GROUP, HV, K: tl.constexpr,
               BV: tl.constexpr, LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr,
               AX_BLK: tl.constexpr, POOL: tl.constexpr, HAS_H0: tl.constexpr, HAS_INIT: tl.constexpr,
               TRANS: tl.constexpr = False):
    """A fused kernel's work item and entering state: ``(i_h, i_hv, v0, bos, eos, nc, S, slot, live)``
    (key head, value head, first value column, the sequence's token bounds and chunk count) with
    ``S [K, BV]`` fp32 (``[BV, K]``, the transpose, with ``TRANS``) the state entering sequence
    ``i_n`` (value columns ``v0 .. v0 + BV``):
    in pool mode from row ``slot = state_indices[i_n]`` (zeros, the row not read, where the slot is
    padding or ``has_init`` says so: :func:`.chunk_state.pool_slot`), else ``h0[i_n]`` (``HAS_H0``)
    or zeros, ``slot = i_n`` and ``live`` True. Strides ``(slot, head, k, v)`` in elements."""
    i_v, i_n, i_hv = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
    i_h = i_hv // GROUP
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    nc = (eos - bos + 63) // 64
    v0 = i_v * BV
    off, all_k = _state_offsets(s0_k, s0_v, K, BV, TRANS)
    if POOL:
        slot, live, carry = pool_slot(state_indices, has_init, i_n, HAS_INIT)
        S = tl.load(h0 + slot * s0_p + i_hv * s0_h + v0 * s0_v + off, mask=(all_k & carry) != 0,
                    other=0.0).to(tl.float32)
    else:
        slot = i_n
        live = True
        if HAS_H0:
            S = tl.load(h0 + i_n * s0_p + i_hv * s0_h + v0 * s0_v + off).to(tl.float32)
        elif TRANS:
            S = tl.zeros([BV, K], dtype=tl.float32)
        else:
            S = tl.zeros([K, BV], dtype=tl.float32)
    return i_h, i_hv, v0, bos, eos, nc, S, slot, live


@triton.jit
def walk_end(ht, S, slot, live, i_hv, v0, st_p, st_h, st_k, st_v, K: tl.constexpr, BV: tl.constexpr,
             POOL: tl.constexpr, TRANS: tl.constexpr = False):
    """Store a fused kernel's final state ``S [K, BV]`` (``[BV, K]`` with ``TRANS``) to the row
    :func:`walk_start` read (pool mode: not for a padding slot) or to ``ht[slot]`` (dense)."""
    off, all_k = _state_offsets(st_k, st_v, K, BV, TRANS)
    if POOL:  # same row as the load
        tl.store(ht + slot * st_p + i_hv * st_h + v0 * st_v + off, S.to(ht.dtype.element_ty),
                 mask=(all_k & live) != 0)
    else:
        tl.store(ht + slot * st_p + i_hv * st_h + v0 * st_v + off, S.to(ht.dtype.element_ty))


@triton.jit
def _state_offsets(s_k, s_v, K: tl.constexpr, BV: tl.constexpr, TRANS: tl.constexpr):
    """Element offsets of a state tile within its head, ``[K, BV]`` (``k, v``) or ``[BV, K]`` with
    ``TRANS`` (strides ``s_k``, ``s_v`` in elements), and an all-true mask along ``k`` that broadcasts
    against it: ``(all & scalar) != 0`` gives the interpreter bool masks (:mod:`.chunk_state`)."""
    kk = tl.arange(0, K)
    cv = tl.arange(0, BV)
    if TRANS:
        return cv[:, None] * s_v + kk[None, :] * s_k, kk[None, :] >= 0
    else:
        return kk[:, None] * s_k + cv[None, :] * s_v, kk[:, None] >= 0


@triton.jit
def chunk_tiles(q, k, v, tmb, aqk, t0, i_h, i_hv, v0, m, sqt, sqh, skt, skh, svt, svh, HV, K: tl.constexpr,
                BV: tl.constexpr):
    """One chunk's tiles for a fused kernel (rows past the sequence, ``m`` False, zeros): keys and
    queries ``[64, K]`` of key head ``i_h``, values ``[64, BV]`` (columns ``v0 ..``) of value head
    ``i_hv``, and the prep kernel's ``Tm diag(beta)`` and ``Aqk`` ``[64, 64]``, as stored."""
    r = tl.arange(0, 64)
    kk = tl.arange(0, K)
    cv = tl.arange(0, BV)
    row = (t0 * HV + i_hv) * 64
    kt = tl.load(k + t0 * skt + i_h * skh + (r[:, None] * skt + kk[None, :]), mask=m[:, None], other=0.0)
    qt = tl.load(q + t0 * sqt + i_h * sqh + (r[:, None] * sqt + kk[None, :]), mask=m[:, None], other=0.0)
    vt = tl.load(v + t0 * svt + i_hv * svh + v0 + (r[:, None] * svt + cv[None, :]), mask=m[:, None], other=0.0)
    tm = tl.load(tmb + row + (r[:, None] * (HV * 64) + r[None, :]), mask=m[:, None], other=0.0)
    A = tl.load(aqk + row + (r[:, None] * (HV * 64) + r[None, :]), mask=m[:, None], other=0.0)
    return kt, qt, vt, tm, A



@triton.jit
def chunk_tiles_t(q, k, v, tmb, aqk, t0, i_h, i_hv, v0, m, sqt, sqh, skt, skh, svt, svh, HV, K: tl.constexpr,
                  BV: tl.constexpr):
    """:func:`chunk_tiles` for the transposed walk (:func:`chunk_gdn_fused_kernel`): keys ``[64, K]``
    and their transpose ``[K, 64]`` (two loads of the same rows: both feed a dot as its right operand),
    and the transposes of the queries ``[K, 64]``, values ``[BV, 64]``, ``Tm diag(beta)`` and ``Aqk``
    ``[64, 64]``; columns past the sequence (``m`` False) zeros."""
    r = tl.arange(0, 64)
    kk = tl.arange(0, K)
    cv = tl.arange(0, BV)
    row = (t0 * HV + i_hv) * 64
    k_ptr = k + t0 * skt + i_h * skh
    kt = tl.load(k_ptr + (r[:, None] * skt + kk[None, :]), mask=m[:, None], other=0.0)
    kT = tl.load(k_ptr + (r[None, :] * skt + kk[:, None]), mask=m[None, :], other=0.0)
    qT = tl.load(q + t0 * sqt + i_h * sqh + (r[None, :] * sqt + kk[:, None]), mask=m[None, :], other=0.0)
    vT = tl.load(v + t0 * svt + i_hv * svh + v0 + (r[None, :] * svt + cv[:, None]), mask=m[None, :], other=0.0)
    tmT = tl.load(tmb + row + (r[None, :] * (HV * 64) + r[:, None]), mask=m[None, :], other=0.0)
    AT = tl.load(aqk + row + (r[None, :] * (HV * 64) + r[:, None]), mask=m[None, :], other=0.0)
    return kt, kT, qT, vT, tmT, AT

@triton.jit
def _prep_chunk(q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, sA, sT, i_c, i_hv0, HEADS,
                sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, GROUP, HV, scale,
                K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
                NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr):
    """The prep work of chunk ``i_c`` and the ``HEADS`` value heads ``i_hv0, i_hv0 + 1, ...`` (of one
    key head; :func:`chunk_gdn_fused_prep_kernel`): the norms, ``K K^T`` and ``Q K^T`` once, then each
    value head's gates, beta, solve and stores."""
    n = tl.load(chunk_seq + i_c)
    if n < N:
        i_h = i_hv0 // GROUP
        t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
        k_ptr = k + t0 * skt + i_h * skh
        q_ptr = q + t0 * sqt + i_h * sqh
        r = tl.arange(0, 64)
        m = r < L
        if L2NORM:  # the dots below run on k sk and q sq (powers of two, 1 but past 2**32): F44
            uk, sk = _rnorm(k_ptr, r, m, skt, K, BK)
            uq, sq = _rnorm(q_ptr, r, m, sqt, K, BK)
            rkv = tl.where(m, uk * sk, 0.0)
            uk = tl.where(m, uk, 0.0)
        else:
            rkv = tl.where(m, 1.0, 0.0)
            sk = tl.full([64], 1.0, tl.float32)
            sq = sk
            uk = rkv
            uq = sk
        kk = tl.zeros([64, 64], dtype=tl.float32)
        qk = tl.zeros([64, 64], dtype=tl.float32)
        for ik in range(K // BK):
            kt = (_ld(k_ptr, r, m, skt, ik * BK, BK).to(tl.float32) * sk[:, None]).to(DT)
            qt = (_ld(q_ptr, r, m, sqt, ik * BK, BK).to(tl.float32) * sq[:, None]).to(DT)
            kk = tl.dot(kt, tl.trans(kt), acc=kk, input_precision=PREC)
            qk = tl.dot(qt, tl.trans(kt), acc=qk, input_precision=PREC)
        qsv = uq * scale  # = rq scale where sq = 1 (every row below 2**32): the same bits
        for j in range(HEADS):  # Aqk and the norms first: Q K^T is dead before the solves
            i_hv = i_hv0 + j
            D = _decay_diffs(g, t0, i_hv, r, m, sgt, sgh, PREC)
            row = (t0 * HV + i_hv) * 64
            aq = qk * tl.exp(tl.where(r[:, None] >= r[None, :], D, float("-inf"))) * uk[None, :] * qsv[:, None]
            tl.store(aqk + row + r[:, None] * (HV * 64) + r[None, :], aq.to(aqk.dtype.element_ty), mask=m[:, None])
            tl.store(rk + t0 * HV + i_hv + r * HV, rkv, mask=m)
            tl.store(qs + (t0 * HV + i_hv + r * HV) * 2, qsv, mask=m)
            tl.store(qs + (t0 * HV + i_hv + r * HV) * 2 + 1, sq, mask=m)
        for j in range(HEADS):
            i_hv = i_hv0 + j
            D = _decay_diffs(g, t0, i_hv, r, m, sgt, sgh, PREC)
            b = tl.load(beta + t0 * sbt + i_hv * sbh + r * sbt, mask=m, other=0.0).to(tl.float32)
            tl.debug_barrier()  # the CTA's previous item (or head) is done with the scratch
            a = kk * tl.exp(tl.where(r[:, None] > r[None, :], D, float("-inf")))
            tl.store(sA + r[:, None] * 64 + r[None, :], a * (b * uk)[:, None] * uk[None, :])
            tl.debug_barrier()
            _solve(sA, sT, NEUMANN, DPREC, IPREC)
            tl.debug_barrier()
            store_tmb(sT, tmb, (t0 * HV + i_hv) * 64, b, r, m, HV)


@triton.jit
def _decay_diffs(g, t0, i_hv, r, m, sgt, sgh, PREC: tl.constexpr):
    """``D [64, 64] = G_r - G_s`` of a chunk's rows for value head ``i_hv``, ``G`` the chunk-local
    cumulative log decay of the gates floored at ``G_MIN`` (masked rows 0); fp32 inputs (``PREC``
    ieee) from two-float ``G`` (:mod:`._gates`), so that the difference keeps fp32 accuracy."""
    gt = tl.maximum(tl.load(g + t0 * sgt + i_hv * sgh + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN)
    if PREC == "ieee":
        G, Gl = cumsum2(gt, 0)
        return (G[:, None] - G[None, :]) + (Gl[:, None] - Gl[None, :])
    G = tl.cumsum(gt, axis=0)
    return G[:, None] - G[None, :]


@triton.jit
def chunk_gdn_fused_prep_kernel(
    q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, scratch,
    sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, GROUP, HV, ITEMS, scale,
    K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr, SHARED_KEYS: tl.constexpr,
):
    """The fused prefill's state-independent part (module docstring, 1). Persistent grid ``(P,)``:
    program ``p`` takes items ``p, p + P, ...`` of the ``ITEMS`` items, chunks past the real count
    doing nothing. ``SHARED_KEYS``: an item is a (chunk, key head), ``ITEMS = NT_max * HV / GROUP``
    (key head fastest), whose norms, ``K K^T`` and ``Q K^T`` serve its ``GROUP`` value heads (GVA);
    else a (chunk, value head), ``ITEMS = NT_max * HV``, each recomputing them. ``q, k [T, H, K]``,
    ``g, beta [T, HV]`` (strides in elements). Writes ``tmb = Tm diag(beta)`` and ``aqk``
    ``[T, HV, 64]`` (dtype DT; row ``t``: its chunk row, zeros above the diagonal), ``rk [T, HV]``
    and ``qs [T, HV, 2]`` fp32: ``scale uq`` and the power of two ``sq`` (``rq = uq sq``; both 1 and
    ``scale`` without l2norm). ``scratch [P, 2, 64, 64]`` fp32: each program's ``A`` and
    ``Tm`` (:func:`.chunk_intra._solve`, with its precisions ``NEUMANN``, ``DPREC``, ``IPREC``)."""
    pid = tl.program_id(0)
    sA = scratch + pid.to(tl.int64) * (2 * 64 * 64)
    sT = sA + 64 * 64
    heads = GROUP if SHARED_KEYS else 1  # value heads per item
    per_chunk = HV // heads
    for item in range(pid, ITEMS, tl.num_programs(0)):
        _prep_chunk(q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, sA, sT,
                    item // per_chunk, ((item % per_chunk) * heads).to(tl.int64), heads,
                    sqt, sqh, skt, skh, sgt, sgh, sbt, sbh,
                    N, GROUP, HV, scale, K, BK, L2NORM, DT, PREC, NEUMANN, DPREC, IPREC)


@triton.jit
def chunk_gdn_fused_kernel(
    q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_init, h0, ht,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh,
    s0_p, s0_h, s0_k, s0_v, st_p, st_h, st_k, st_v, GROUP, HV, ckpt, ck_n, ck_every,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
    POOL: tl.constexpr, HAS_H0: tl.constexpr, HAS_INIT: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    HAS_CKPT: tl.constexpr = False,
):
    """The fused prefill's sequential part (module docstring, 2): one program per (value block,
    sequence, value head), the state transposed (``S^T [BV, K]``). Reads ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g [T, HV]`` (raw log
    decays) and the prep kernel's ``tmb, aqk [T, HV, 64]``, ``rk [T, HV]``, ``qs [T, HV, 2]``; writes
    ``o [T, HV, V]``. ``h0``/``ht``: the pool (both) in pool mode (``state_indices [N]``; a
    negative slot is padding; ``has_init [N]`` bytes with ``HAS_INIT``), else the dense initial
    state (``HAS_H0``; else None) and final state; strides ``(slot, head, k, v)`` in elements.
    ``HAS_CKPT`` (pool mode): state checkpoints from the slot table ``ckpt [N, ck_n]`` every ``ck_every``
    chunks, stored in the walk (:func:`.chunk_state.store_checkpoint`); else those three are None."""
    tl.static_assert(not HAS_CKPT or POOL, "checkpoints are pool rows")
    i_h, i_hv, v0, bos, eos, nc, S, slot, live = walk_start(cu_seqlens, state_indices, has_init, h0, s0_p, s0_h,
                                                            s0_k, s0_v, GROUP, HV, K, BV, LAYOUT, AX_SEQ, AX_HEAD,
                                                            AX_BLK, POOL, HAS_H0, HAS_INIT, True)
    cv = tl.arange(0, BV)
    r = tl.arange(0, 64)
    for t in range(nc):
        t0 = bos + t * 64  # int64 scalar bases; in-chunk offsets are int32
        m = r < eos - t0
        gt = tl.maximum(tl.load(g + t0 * sgt + i_hv * sgh + r * sgt, mask=m, other=0.0).to(tl.float32), G_MIN)
        eg = tl.exp(tl.cumsum(gt, axis=0))
        esuf = tl.exp(tl.cumsum(gt, axis=0, reverse=True) - gt)  # exp(G_C - G_r): the suffix sum, 1 at the last row
        egl = tl.exp(tl.sum(gt, axis=0))
        rkv = tl.load(rk + t0 * HV + i_hv + r * HV, mask=m, other=0.0)
        qsv = tl.load(qs + (t0 * HV + i_hv + r * HV) * 2, mask=m, other=0.0)
        sqv = tl.load(qs + (t0 * HV + i_hv + r * HV) * 2 + 1, mask=m, other=1.0)
        kt, kT, qT, vT, tmT, AT = chunk_tiles_t(q, k, v, tmb, aqk, t0, i_h, i_hv, v0, m, sqt, sqh, skt, skh, svt,
                                                svh, HV, K, BV)
        # F44: the state operand times c = the chunk's smallest query scale sq (1 unless a query row
        # of the chunk reaches 2**32), so that q . (c S) cannot overflow; ic = 1 / c exactly
        c, ic = _chunk_scale(sqv)
        Sd = (S * c).to(DT)  # S^T [BV, K]: the left operand of every product with the state
        x = vT.to(tl.float32) - tl.dot(Sd, kT.to(DT), input_precision=PREC) * ((rkv * eg) * ic)[None, :]
        vf = tl.dot(x.to(DT), tmT.to(DT), input_precision=PREC)  # Vn^T [BV, 64]
        acc = tl.dot(Sd, qT.to(DT), input_precision=PREC) * ((qsv * eg) * (sqv * ic))[None, :]  # rq = uq sq
        acc = tl.dot(vf.to(DT), AT.to(DT), acc=acc, input_precision=PREC)
        tl.store(o + (t0 * HV + i_hv) * V + v0 + (r[None, :] * (HV * V) + cv[:, None]),
                 tl.where(live, acc, 0.0).to(o.dtype.element_ty), mask=m[None, :])
        S = tl.dot((vf * (rkv * esuf)[None, :]).to(DT), kt.to(DT), acc=S * egl, input_precision=PREC)
        if HAS_CKPT:
            _, i_n, _ = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
            store_checkpoint(ckpt, ck_n, ck_every, t, i_n, eos - bos, live, ht, S, i_hv, v0, st_p, st_h, st_k, st_v,
                             K, BV, True)
    walk_end(ht, S, slot, live, i_hv, v0, st_p, st_h, st_k, st_v, K, BV, POOL, True)


def fused_config(K: int, V: int, dtype, family: str = "gdn") -> FusedConfig:
    """The fused prefill's pinned configuration for head dims ``K, V``, the q/k/v ``dtype`` and the
    ``family`` (H200 sweeps: docs/performance.md#prefill-fused). GDN bf16: the whole value dim
    ``BV = 128`` at 8 warps, 2 stages (the transposed walk: 1.31 ms against 1.59-2.32 at BV 64 / 32,
    4 or 8 warps, 1-3 stages, at 16 x 4,096 (16, 32)); the prep kernel at 32 key columns per step
    (3-5% faster than 64; a register cap of 128 or 168, or 8 warps, slower); fp32 operand tiles
    (fp16/fp32 inputs, not measured) at ``BV = 32``, 4 warps, unpipelined (gfx950's build of the
    transposed walk spills at 2 stages). The planner takes 4 warps where a warp is 64 wide
    (:func:`.prefill.plan._with_fused`). KDA (not yet measured on the H200): 8 warps, unpipelined,
    the decayed keys formed late (``late_keys``), the sm_90 build that spills least at K = 128 (24 B
    of stack; 256 without ``late_keys``, 1,416 at GDN's 4 warps and 2 stages: its loop holds the
    ``[64, K]`` gates and their decayed operands besides the state); fp32
    operand tiles (fp16/fp32 inputs) at ``BV = 32``, 4 warps, unpipelined (no spill on gfx942 / gfx950,
    where 8 warps or 2 stages spill); its prep's channel blocks are the pipeline's (``prep_block_k``
    unused)."""
    import torch

    bf16 = dtype == torch.bfloat16
    if family == "kda":
        return FusedConfig(block_v=min(V, 64 if bf16 else 32), num_warps=8 if bf16 else 4, num_stages=1,
                           prep_warps=4, prep_ctas_per_sm=4, prep_block_k=32, late_keys=True)
    return FusedConfig(block_v=min(V, 128 if bf16 else 32), num_warps=8 if bf16 else 4, num_stages=2 if bf16 else 1,
                       prep_warps=4, prep_ctas_per_sm=4, prep_block_k=32)


def fused_refusal(family: str, K: int, V: int, dtype, *, replaced_state: bool, forced_segments: bool) -> str:
    """Why the fused prefill cannot run a call ('' where it can): GDN or KDA
    (:mod:`.chunk_fused_kda`), ``K, V <=`` :data:`FUSED_MAX_DIM`, no replacement state kernel, no
    forced segment-parallel pass."""
    if family not in ("gdn", "kda"):
        return f"the fused prefill is GDN's and KDA's; got family {family!r}"
    if K > FUSED_MAX_DIM or V > FUSED_MAX_DIM:
        return (f"the fused prefill holds the [K, block_v] fp32 state in registers: K, V <= {FUSED_MAX_DIM}; "
                f"got K = {K}, V = {V}")
    if replaced_state:
        return "a replacement state kernel runs the pipeline's state stage"
    if forced_segments:
        return "a forced segment-parallel state pass runs the pipeline"
    return ""


def launch_fused_prep(launch, kernel, *, q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs,
                      scratch, N: int, group: int, HV: int, items: int, scale: float, K: int, l2norm: bool,
                      PREC: str, solve, cfg: FusedConfig, **family) -> None:
    """Launch a fused prep kernel (:func:`chunk_gdn_fused_prep_kernel`, or
    :func:`.chunk_fused_kda.chunk_kda_fused_prep_kernel` with KDA's channel-block options) on
    ``scratch.shape[0]`` persistent programs (``launch``: :func:`.launch.launch`; ``solve``: the
    pipeline's :class:`.prefill.config.SolveConfig`; ``family``: the kernel's own constexprs, ``BK`` among
    them)."""
    launch(kernel, (scratch.shape[0],),
           (q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, scratch,
            *q.stride()[:2], *k.stride()[:2], *g.stride()[:2], *beta.stride()[:2], N, group, HV, items,
            float(scale)),
           dict(K=K, L2NORM=l2norm, PREC=PREC, NEUMANN=solve.neumann, DPREC=solve.diag_precision,
                IPREC=solve.below_precision, **family,
                **({} if cfg.prep_maxnreg is None else {"maxnreg": cfg.prep_maxnreg})),
           num_warps=cfg.prep_warps, num_stages=1)


def launch_fused(launch, kernel, grid, *, q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_init, h0,
                 ht, s0: tuple, st: tuple, group: int, HV: int, K: int, V: int, pool: bool, has_h0: bool,
                 has_init_flags: bool, DT, PREC: str, cfg: FusedConfig, checkpoints=None, checkpoint_every: int = 0,
                 **family) -> None:
    """Launch a fused kernel (:func:`chunk_gdn_fused_kernel` or
    :func:`.chunk_fused_kda.chunk_kda_fused_kernel`: the same parameters) on ``grid`` (a
    :class:`linattn.kernels.grid.GridPlan` of ``N x HV x V // cfg.block_v``); ``s0``, ``st``: the
    ``(slot, head, k, v)`` strides of ``h0`` and ``ht``; ``checkpoints``: the checkpoint slot table
    ``[N, max_checkpoints]`` (contiguous; pool mode) with ``checkpoint_every`` in tokens, or None (the
    build without ``HAS_CKPT``); ``family``: the kernel's own constexprs."""
    if grid.empty:
        return
    ck = (None, None, None) if checkpoints is None else (checkpoints, checkpoints.shape[1], checkpoint_every // 64)
    launch(kernel, grid.grid,
           (q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_init, h0, ht,
            *q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *g.stride()[:2], *s0, *st, group, HV, *ck),
           dict(K=K, V=V, BV=cfg.block_v, **grid.constexprs, POOL=pool, HAS_H0=has_h0, HAS_INIT=has_init_flags,
                DT=DT, PREC=PREC, **family, **({} if checkpoints is None else {"HAS_CKPT": True})),
           num_warps=cfg.num_warps, num_stages=cfg.num_stages)


# -- the host side: the fused prefill's launches ----------------------------------------------

def fused_prep_items(plan: PrefillPlan) -> int:
    """The fused prep kernel's items: ``(chunk, key head)`` pairs where GDN's prep shares the keys of a
    GVA group (``FusedConfig.prep_shared_keys``), else ``(chunk, value head)`` pairs (KDA: per value
    head gates of every channel, nothing to share)."""
    shared = not plan.kda and plan.fused.prep_shared_keys
    return plan.nt_max * (plan.H if shared else plan.HV)


def launch_fused_stages(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, st: PrefillState,
                        scale: float) -> None:
    """The fused prefill (:mod:`.chunk_fused`; KDA: :mod:`.chunk_fused_kda`) in place of the pipeline's
    stages: the prep kernel (``Tm diag(beta)``, ``Aqk``, the norms; persistent grid) and the fused
    kernel (state on chip; ``h0`` and the final state in place, as the state stage), or in its place
    the CuTe DSL walk where the plan chose it (``plan.fused_walk``: GDN on SM90)."""
    from .chunk_fused_kda import chunk_kda_fused_kernel, chunk_kda_fused_prep_kernel

    if plan.fused_walk is not None and plan.fused_walk.walk == "fused":  # prep and walk in one CuTe DSL kernel
        from linattn.kernels.cutedsl import fused_prefill
        if fused_prefill.run_for_plan(plan, x, b, st, scale):  # (kernels/cutedsl/fused_prefill.py)
            return
    cfg = plan.fused
    if plan.kda:  # the pipeline's channel blocks, operands and fast path (chunk_kda_system_kernel's)
        prep, fused = chunk_kda_fused_prep_kernel, chunk_kda_fused_kernel
        family, walk = kda_system_constexprs(plan), dict(LATE_KD=cfg.late_keys)
    else:
        prep, fused = chunk_gdn_fused_prep_kernel, chunk_gdn_fused_kernel
        family = dict(BK=min(plan.K, cfg.prep_block_k), DT=plan.DT, SHARED_KEYS=cfg.prep_shared_keys)
        walk = {}
    if not (plan.fused_prep and _cutedsl_prep(plan, x, t, b, scale)):
        launch_fused_prep(_launch_plain, prep, q=x.q, k=x.k, g=x.g, beta=x.beta, cu_seqlens=x.cu_seqlens,
                          chunk_seq=t.chunk_seq, chunk_start=t.chunk_start, tmb=b.fused_tmb, aqk=b.fused_aqk,
                          rk=b.rk, qs=b.fused_qs, scratch=b.intra_scratch, N=plan.N, group=plan.group, HV=plan.HV,
                          items=fused_prep_items(plan), scale=scale, K=plan.K, l2norm=plan.use_qk_l2norm,
                          PREC=plan.PREC, solve=plan.config.intra.solve, cfg=cfg, **family)
    if plan.fused_walk is not None and plan.fused_walk.walk != "triton":  # the CuTe DSL walk the plan chose
        from linattn.kernels.cutedsl import fused_walk
        if fused_walk.run_for_plan(plan, x, b, st):  # (kernels/cutedsl/fused_walk.py, choose_walk)
            return
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    launch_fused(_launch_plain, fused, plan.fused_grid, q=x.q, k=x.k, v=x.v, g=x.g, tmb=b.fused_tmb,
                 aqk=b.fused_aqk, rk=b.rk, qs=b.fused_qs, o=b.o, cu_seqlens=x.cu_seqlens,
                 state_indices=st.state_indices, has_init=st.has_initial_state, h0=st.h0, ht=st.ht, s0=s0,
                 st=state_strides(st.ht, plan.state_layout), group=plan.group, HV=plan.HV, K=plan.K, V=plan.V,
                 pool=plan.pool_mode, has_h0=plan.has_h0, has_init_flags=plan.has_init_flags, DT=plan.DT,
                 PREC=plan.PREC, cfg=cfg, checkpoints=st.checkpoints, checkpoint_every=st.checkpoint_every, **walk)


def _cutedsl_prep(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, scale: float) -> bool:
    """The CuTe DSL prep the plan chose (kernels/cutedsl/fused_prep.py; ``LINATTN_CUTEDSL_PREP=0`` keeps Triton's)
    where the call's device and tensors allow it; False: the Triton prep runs."""
    from linattn.kernels.cutedsl import fused_prep

    return fused_prep.run_for_plan(plan, x, t, b, scale)


def _launch_plain(kernel, grid, args, constexprs, *, num_warps, num_stages):
    """:func:`.launch.launch` looked up at call time (tests may wrap it)."""
    launch(kernel, grid, args, constexprs, num_warps=num_warps, num_stages=num_stages)
