"""KDA chunked prefill, fused: the state stays on chip for the whole sequence (issue 27, step 2).

KDA's counterpart of :mod:`.chunk_fused` (GDN): two launches (after the chunk tables) in place of
the pipeline's system, intra and state stages (:mod:`.prefill`), and nothing of size ``O(K V)`` or
``O(C K)`` per chunk goes through HBM (no per-chunk state, ``W``, ``U``, new values, decayed keys or
queries):

1. :func:`chunk_kda_fused_prep_kernel`, fully parallel over (chunk, value head) on a persistent
   grid with a per-program fp32 scratch (as :func:`.chunk_fused.chunk_gdn_fused_prep_kernel`):
   per chunk of ``C = 64`` rows, with ``G`` the chunk-local cumulative log decay per channel
   (gates floored at -1000), ``kn = k rk`` and ``qn = q rq scale`` (``rk``, ``rq`` the inverse
   l2 norms, 1 without l2norm)::

       A    = strictly_lower( beta_r sum_d kn_rd kn_sd exp(G_rd - G_sd) )
       Tb   = (I + A)^-1 diag(beta)                                    -> tmb [T, HV, 64]
       Aqk  = lower_incl( sum_d qn_rd kn_sd exp(G_rd - G_sd) )         -> aqk [T, HV, 64]
       rk, rq scale                                                    -> [T, HV], [T, HV] fp32

   ``A`` and ``Aqk`` come from the pipeline's own channel-block code
   (:func:`.chunk_intra.kda_block_products`, decided per channel block in the kernel as there): the
   fast path through row 31 where the block's decays stay within ``e^-60 .. e^60`` of that row,
   else the exact level path (a binary split of the 64 rows, every exponent taken <= 0), so
   strongly negative gates (a channel decaying by more than ``e^-60`` over half a chunk) are as
   exact here as in the pipeline. The solve is :func:`.chunk_intra._solve`.
2. :func:`chunk_kda_fused_kernel`, one program per (value block, sequence, value head) on the grid
   of :func:`linattn.kernels.grid.plan_grid`, walking the sequence's chunks in order with the state
   ``S [K, BV]`` fp32 in registers; per chunk it forms the decayed operands from the raw gates
   ``g [64, K]`` (``G`` the prefix sum, ``G_C - G`` the suffix sum after each row, exactly 0 at
   the last row; only exponentials of numbers <= 0)::

       Vn   = Tb (v - (kn exp(G)) S)             (= U - W S: no W and no U in memory)
       O    = (qn exp(G)) S + Aqk Vn
       S    = diag(exp(G_C)) S + (kn exp(G_C - G))^T Vn

   ``h0`` comes from the pool row ``state_pool[state_indices[n]]`` (or the dense initial state)
   inside the kernel and the final state goes back to the same row (:func:`.chunk_fused.walk_start`,
   :func:`.chunk_fused.walk_end`); a negative slot is padding (zero output rows, the pool neither
   read nor written), ``has_initial_state`` False a zero ``h0`` whose slot is not read. Dense and
   pool mode run the same instructions.

Precision as the pipeline (:mod:`.prefill` docstring): bf16 inputs run the state dots on bf16
operands with fp32 accumulation (the state rounded to bf16 as a dot operand, as the pipeline's
state kernel does), ``A``/``Aqk`` on fp32 operands (tf32, ``OP``), fp16 and fp32 inputs on fp32
operands (``DT`` fp32; ``PREC`` tf32 / ieee), and under ``TRITON_INTERPRET=1`` every dot on fp32
operands. fp32 inputs form the cumulative gates as two-float sums (:mod:`._gates`). Queries and keys
past ``2**32`` are normalised before any product (:func:`.chunk_intra._norms`), so no dot here can
overflow on them (F44).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gates import cum_gates
from ._pid import chunk_span, decode_pid
from .chunk_fused import chunk_tiles, store_tmb, walk_end, walk_start
from .chunk_state import store_checkpoint
from .chunk_intra import _ld, _norms, _solve, kda_block_products, kda_store_system
from .decode import G_MIN


@triton.jit
def _kda_prep_chunk(q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, sA, sT, i_c, i_hv,
                    sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, GROUP, HV, scale,
                    K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr,
                    OP: tl.constexpr, SPAN: tl.constexpr, NEUMANN: tl.constexpr, DPREC: tl.constexpr,
                    IPREC: tl.constexpr):
    """The prep work of chunk ``i_c`` and value head ``i_hv`` (:func:`chunk_kda_fused_prep_kernel`)."""
    n = tl.load(chunk_seq + i_c)
    if n < N:
        i_h = i_hv // GROUP
        t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
        k_ptr = k + t0 * skt + i_h * skh
        q_ptr = q + t0 * sqt + i_h * sqh
        g_ptr = g + t0 * sgt + i_hv * sgh
        row = t0 * HV + i_hv
        r = tl.arange(0, 64)
        m = r < L
        d = tl.arange(0, BK)
        lower = r[:, None] > r[None, :]
        rkv, rq = _norms(k_ptr, q_ptr, r, m, skt, sqt, K, BK, L2NORM)
        b = tl.load(beta + t0 * sbt + i_hv * sbh + r * sbt, mask=m, other=0.0).to(tl.float32)
        qsv = rq * scale
        A = tl.zeros([64, 64], dtype=tl.float32)
        dqk = tl.zeros([64], dtype=tl.float32)
        tl.debug_barrier()  # the CTA's previous item is done with the scratch
        for ik in range(K // BK):
            col0 = ik * BK
            gg = tl.maximum(_ld(g_ptr, r, m, sgt, col0, BK).to(tl.float32), G_MIN)
            kn = _ld(k_ptr, r, m, skt, col0, BK).to(tl.float32) * rkv[:, None]
            qn = _ld(q_ptr, r, m, sqt, col0, BK).to(tl.float32) * qsv[:, None]
            G, Gl = cum_gates(gg, PREC)
            dqk += tl.sum(qn * kn, axis=1)
            A = kda_block_products(A, kn, qn, G, Gl, tl.sum(gg, axis=0), sA, r, d, lower, BK, PREC, OP, SPAN)
        kda_store_system(A, dqk, b, sA, aqk, row, r, m, lower, HV)
        tl.debug_barrier()
        _solve(sA, sT, NEUMANN, DPREC, IPREC)
        tl.debug_barrier()
        store_tmb(sT, tmb, row * 64, b, r, m, HV)
        tl.store(rk + row + r * HV, rkv, mask=m)
        tl.store(qs + row + r * HV, qsv, mask=m)


@triton.jit
def chunk_kda_fused_prep_kernel(
    q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, scratch,
    sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, GROUP, HV, ITEMS, scale,
    K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr, OP: tl.constexpr,
    SPAN: tl.constexpr, NEUMANN: tl.constexpr, DPREC: tl.constexpr, IPREC: tl.constexpr,
):
    """The fused KDA prefill's state-independent part (module docstring, 1). Persistent grid
    ``(P,)``: program ``p`` takes items ``p, p + P, ...`` of the ``ITEMS = NT_max * HV`` (chunk,
    value head) items (value head fastest); chunks past the real count do nothing. ``q, k [T, H, K]``,
    ``g [T, HV, K]`` (raw log decays, last dim contiguous), ``beta [T, HV]`` (strides in elements).
    Writes ``tmb = Tm diag(beta)`` and ``aqk`` ``[T, HV, 64]`` (row ``t``: its chunk row, zeros above
    the diagonal), ``rk [T, HV]`` and ``qs = rq scale [T, HV]`` fp32. ``scratch [P, 2, 64, 64]``
    fp32: each program's ``A`` (first ``G`` on the level path) and ``Tm``; ``OP``, ``SPAN``: the
    channel-block dots' operand dtype and the fast path's span (``-inf``: off), as
    :func:`.chunk_intra.chunk_kda_system_kernel`; ``NEUMANN``, ``DPREC``, ``IPREC``: the solve's."""
    pid = tl.program_id(0)
    sA = scratch + pid.to(tl.int64) * (2 * 64 * 64)
    sT = sA + 64 * 64
    for item in range(pid, ITEMS, tl.num_programs(0)):
        _kda_prep_chunk(q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs, sA, sT,
                        item // HV, (item % HV).to(tl.int64), sqt, sqh, skt, skh, sgt, sgh, sbt, sbh,
                        N, GROUP, HV, scale, K, BK, L2NORM, PREC, OP, SPAN, NEUMANN, DPREC, IPREC)


@triton.jit
def chunk_kda_fused_kernel(
    q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_init, h0, ht,
    sqt, sqh, skt, skh, svt, svh, sgt, sgh,
    s0_p, s0_h, s0_k, s0_v, st_p, st_h, st_k, st_v, GROUP, HV, ckpt, ck_n, ck_every,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
    POOL: tl.constexpr, HAS_H0: tl.constexpr, HAS_INIT: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
    LATE_KD: tl.constexpr, HAS_CKPT: tl.constexpr = False,
):
    """The fused KDA prefill's sequential part (module docstring, 2): one program per (value block,
    sequence, value head). Reads ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g [T, HV, K]`` (raw log
    decays, last dim contiguous) and the prep kernel's ``tmb, aqk [T, HV, 64]``, ``rk, qs [T, HV]``;
    writes ``o [T, HV, V]``. ``LATE_KD``: the decayed keys of the state update are formed after the
    output, from the chunk's key and gate tiles loaded again (fewer registers live across the dots; the
    same bits), else with the other operands (:class:`.chunk_fused.FusedConfig`'s ``late_keys``).
    ``h0``/``ht``: the pool (both) in pool mode (``state_indices [N]``; a
    negative slot is padding; ``has_init [N]`` bytes with ``HAS_INIT``), else the dense initial
    state (``HAS_H0``; else None) and final state; strides ``(slot, head, k, v)`` in elements.
    ``HAS_CKPT`` (pool mode): state checkpoints as :func:`.chunk_fused.chunk_gdn_fused_kernel`'s."""
    tl.static_assert(not HAS_CKPT or POOL, "checkpoints are pool rows")
    i_h, i_hv, v0, bos, eos, nc, S, slot, live = walk_start(cu_seqlens, state_indices, has_init, h0, s0_p, s0_h,
                                                            s0_k, s0_v, GROUP, HV, K, BV, LAYOUT, AX_SEQ, AX_HEAD,
                                                            AX_BLK, POOL, HAS_H0, HAS_INIT)
    kk = tl.arange(0, K)
    cv = tl.arange(0, BV)
    r = tl.arange(0, 64)
    for t in range(nc):
        t0 = bos + t * 64  # int64 scalar bases; in-chunk offsets are int32
        m = r < eos - t0
        # rows past the sequence load g = 0: G there is G_C, the suffix sums 0 (their k rows are zeros)
        gt = tl.maximum(tl.load(g + t0 * sgt + i_hv * sgh + (r[:, None] * sgt + kk[None, :]), mask=m[:, None],
                                other=0.0).to(tl.float32), G_MIN)
        egl = tl.exp(tl.sum(gt, axis=0))  # exp(G_C) per channel
        rkv = tl.load(rk + t0 * HV + i_hv + r * HV, mask=m, other=0.0)
        qsv = tl.load(qs + t0 * HV + i_hv + r * HV, mask=m, other=0.0)
        kt, qt, vt, tm, A = chunk_tiles(q, k, v, tmb, aqk, t0, i_h, i_hv, v0, m, sqt, sqh, skt, skh, svt, svh, HV,
                                        K, BV)
        # the three decayed operands first, in DT, so that no [64, K] fp32 tile outlives them
        kn = kt.to(tl.float32) * rkv[:, None]
        G, _ = cum_gates(gt, PREC)
        eg = tl.exp(G)
        kw = (kn * eg).to(DT)
        qg = (qt.to(tl.float32) * qsv[:, None] * eg).to(DT)
        if not LATE_KD:
            kd = (kn * tl.exp(tl.cumsum(gt, axis=0, reverse=True) - gt)).to(DT)  # exp(G_C - G), 1 at the last row
        Sd = S.to(DT)
        x = vt.to(tl.float32) - tl.dot(kw, Sd, input_precision=PREC)
        vd = tl.dot(tm.to(DT), x.to(DT), input_precision=PREC).to(DT)
        acc = tl.dot(qg, Sd, input_precision=PREC)
        acc = tl.dot(A.to(DT), vd, acc=acc, input_precision=PREC)
        tl.store(o + (t0 * HV + i_hv) * V + v0 + (r[:, None] * (HV * V) + cv[None, :]),
                 tl.where(live, acc, 0.0).to(o.dtype.element_ty), mask=m[:, None])
        if LATE_KD:  # the decayed keys last, from their tiles loaded again, so that no operand lives across the dots
            gt = tl.maximum(tl.load(g + t0 * sgt + i_hv * sgh + (r[:, None] * sgt + kk[None, :]), mask=m[:, None],
                                    other=0.0).to(tl.float32), G_MIN)
            kt = tl.load(k + t0 * skt + i_h * skh + (r[:, None] * skt + kk[None, :]), mask=m[:, None], other=0.0)
            kd = (kt.to(tl.float32) * rkv[:, None] * tl.exp(tl.cumsum(gt, axis=0, reverse=True) - gt)).to(DT)
        S = tl.dot(tl.trans(kd), vd, acc=S * egl[:, None], input_precision=PREC)
        if HAS_CKPT:
            _, i_n, _ = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
            store_checkpoint(ckpt, ck_n, ck_every, t, i_n, eos - bos, live, ht, S, i_hv, v0, st_p, st_h, st_k, st_v,
                             K, BV)
    walk_end(ht, S, slot, live, i_hv, v0, st_p, st_h, st_k, st_v, K, BV, POOL)

