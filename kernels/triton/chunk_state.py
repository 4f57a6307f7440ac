"""Chunked prefill, stage 2: the sequential state kernel, reading and writing the pool in place.

One program per (value block, sequence, value head), its grid planned by
:func:`linattn.kernels.grid.plan_grid` and its program ids decoded by
:func:`linattn.kernels.triton._pid.decode_pid` (layouts ``split`` and ``folded``). The program walks
its sequence's chunks in order (maths in ops.md, "Chunked form"; maths layout ``S [K, V]``)::

    h[c]  = S                                   (state entering chunk c, for the output stage)
    Vn    = U - W S
    O     = qg h[c] + Aqk Vn                    (KDA with FUSE_O: the output here, h[c] and Vn
                                                 never stored)
    S     = exp(G_C) S + (K * exp(G_C - G))^T Vn      KDA: diag(exp(G_C)) S + ...

(KDA's decayed keys ``K * exp(G_C - G)`` and ``G_C`` come ready from stage 1,
:func:`.chunk_intra.chunk_kda_system_kernel`.) GDN's bf16 path (the launcher's pinned options):
``rk exp(G_C - G)`` and ``exp(G_C)`` come from :func:`chunk_gdn_gates_kernel` (``HOIST``), ``U`` is
formed here as ``(Tm diag(beta)) V`` from stage 1's matrix (``UTM``), and ``h[c]`` is stored for
every second chunk only (``HSTEP = 2``: the output stage rebuilds the others' share).

Initial state: **pool mode** loads ``state_pool[state_indices[n]]`` and stores the final state to
the same row, in place, inside this kernel (no gather, no scatter, no ``[N, HV, V, K]``
temporary); a negative index means a zero initial state and no store; ``has_initial_state[n]``
False (``HAS_INIT``) a zero initial state read from nowhere (the load is masked) and the usual store. **Dense mode** loads
``initial_state[n]`` (or zeros) and writes ``final_state[n]``. Both modes run the same
instructions on the same data, so they agree bitwise. Element offsets are 64-bit throughout.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from linattn.kernels.triton._pid import chunk_span, decode_pid

from .chunk_tables import CHUNK, segment_tables
from .decode import G_MIN  # the floor of g (-1000), as torch_ref and the decode kernel
from .launch import LaunchOptions, launch, launch_with

if TYPE_CHECKING:
    from linattn.kernels.grid import GridPlan

    from .chunk_tables import ChunkTables
    from .prefill.plan import PrefillBuffers, PrefillInputs, PrefillPlan, PrefillState


@triton.jit
def pool_slot(state_indices, has_init, i_n, HAS_INIT: tl.constexpr):
    """Sequence ``i_n``'s pool slot (int64), whether it is live (a negative slot is padding) and
    whether its state is carried in (live, and with ``HAS_INIT`` its ``has_init`` byte set: else a
    zero h0 whose slot is not read, the final state still stored)."""
    slot = tl.load(state_indices + i_n).to(tl.int64)
    live = slot >= 0
    if HAS_INIT:
        carry = live & (tl.load(has_init + i_n) != 0)
    else:
        carry = live
    return slot, live, carry


@triton.jit
def store_checkpoint(ckpt, ck_n, ck_every, t, i_n, length, live, ht, S, i_hv, v0, st_p, st_h, st_k, st_v,
                     K: tl.constexpr, BV: tl.constexpr, TRANS: tl.constexpr = False):
    """State checkpoints (docs/ops.md "State checkpoints"): after chunk ``t`` (0-based) of sequence
    ``i_n`` (``length`` tokens; ``live``: its slot is not padding), where ``t + 1`` is a multiple of
    ``ck_every`` (``checkpoint_every`` in chunks of 64) and the chunk is full, checkpoint
    ``j = (t + 1) / ck_every - 1`` of the table ``ckpt [N, ck_n]`` (int32/int64; ``j < ck_n``) names
    the pool row that gets ``S`` (``[K, BV]`` fp32, ``[BV, K]`` with ``TRANS``; value columns ``v0 ..``),
    in the pool's dtype and strides ``(slot, head, k, v)``, as the final store; a negative entry
    stores nothing. So a checkpoint is the state a prefill stopped after those tokens stores."""
    done = t + 1
    j = done // ck_every - 1
    if (done % ck_every == 0) & (done * 64 <= length) & (j < ck_n) & live:
        cs = tl.load(ckpt + i_n * ck_n + j).to(tl.int64)
        kk = tl.arange(0, K)
        cv = tl.arange(0, BV)
        if TRANS:  # (the loop-variant strides below spill more in the transposed GDN walk: 136 B against 16)
            off = cv[:, None] * st_v + kk[None, :] * st_k
            all_k = kk[None, :] >= 0
        else:
            # strides times a value of this checkpoint's (1 where it is stored), so that the offset tile is
            # not hoisted out of the chunk loop and held across it beside the state (sm_90, GDN's bf16 state
            # kernel: 72 B of stack against 176)
            one = (cs >= 0).to(tl.int32)
            off = kk[:, None] * (st_k * one) + cv[None, :] * (st_v * one)
            all_k = kk[:, None] >= 0
        tl.store(ht + cs * st_p + i_hv * st_h + v0 * st_v + off, S.to(ht.dtype.element_ty),
                 mask=(all_k & (cs >= 0)) != 0)


@triton.jit
def _gate_factors(g):
    """The log decays of GDN's state update for one chunk, from its raw gates ``g`` (rows along
    axis 0; rows past the sequence loaded as 0), floored at -1000: ``G_C - G_r`` per row and
    ``G_C`` (the callers take the exponentials). ``G_C - G_r`` is the suffix sum of the gates
    after row ``r``: exactly 0 at the last row, and no cancellation against a large early decay
    (``G_C - G_r`` rounded at ``G``'s magnitude)."""
    gt = tl.maximum(g.to(tl.float32), G_MIN)
    return tl.cumsum(gt, axis=0, reverse=True) - gt, tl.sum(gt, axis=0)


@triton.jit
def chunk_state_kernel(
    k, g, w, u, rk, cu_seqlens, chunk_off, state_indices, has_init,
    h0, ht, hbuf, vn, q, aqk, o, v, tm_beta,
    skt, skh, sgt, sgh, sxt, sxh,
    s0_p, s0_h, s0_k, s0_v,
    st_p, st_h, st_k, st_v,
    GROUP, HV, ckpt, ck_n, ck_every,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
    KDA: tl.constexpr, POOL: tl.constexpr, HAS_H0: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, FUSE_O: tl.constexpr, HOIST: tl.constexpr = False,
    HSTEP: tl.constexpr = 1, UTM: tl.constexpr = False, HAS_INIT: tl.constexpr = False,
    SEGMENT: tl.constexpr = 0, HAS_CKPT: tl.constexpr = False,
):
    """See the module docstring. GDN: ``k [T, H, K]`` the keys (normalised here by ``rk``) and
    ``g [T, HV]`` the raw log decays. KDA: stage 1's (``chunk_kda_system_kernel``) decayed keys
    ``kd = k rk exp(G_C - G)`` as ``k`` (``[T, HV, K]``, dtype DT, launched with ``GROUP = 1``) and
    its per-chunk total log decays ``G_C`` as ``g`` (``[NT, HV, K]`` fp32, chunk stride ``sgt``).
    Buffers: ``w [T, HV, K]``, ``u, vn [T, HV, V]`` (dtype DT), ``rk [T, HV]`` fp32 (GDN),
    ``hbuf [NT, HV, K, V]`` (dtype DT).
    ``h0``/``ht``: the pool (both) in pool mode, else the initial and final state; strides
    ``(slot, head, k, v)`` in elements. ``HAS_INIT`` (pool mode): ``has_init [N]`` (bytes; 0 = the
    sequence starts from a zero state, its slot not read but written as usual).

    ``FUSE_O`` (KDA only; the launcher sets it on the bf16 path at K <= 128): the program also writes its chunks' output rows ``o [T, HV, V]``,
    ``o = qg h + Aqk Vn`` (the output stage's maths, :func:`.chunk_output.chunk_output_kernel`, on
    the state and ``Vn`` it holds, in the same dtypes), from stage 1's ``qg [T, HV, K]`` (as
    ``q``, strides ``sxt``, ``sxh``) and ``aqk [T, HV, 64]``; ``hbuf`` and ``vn`` are then not written.
    Otherwise ``q``, ``aqk`` and ``o`` are None (the output kernel reads ``hbuf``, ``vn``).
    GDN keeps the output kernel: fused, its serial loop measured slower than the two stages apart
    (docs/performance.md#prefill-kda-fused-output).

    GDN only: ``HOIST``: ``rk`` holds ``kf = rk exp(G_C - G)`` ``[T, HV]`` and ``g`` holds
    ``exp(G_C)`` ``[NT, HV]`` (chunk stride ``sgt``), from :func:`chunk_gdn_gates_kernel`.
    ``HSTEP = 2``: ``hbuf`` gets the state entering chunks 0, 2, 4, ... of each sequence only.
    ``UTM``: ``U = tm_beta v`` with stage 1's ``tm_beta = Tm diag(beta)`` ``[T, HV, 64]`` (dtype DT) and
    ``v [T, HV, V]`` (strides ``sxt``, ``sxh``); ``u`` is None. Otherwise ``v`` and ``tm_beta`` are None.
    ``sxt, sxh``: the token and head strides of the one of ``q`` (``FUSE_O``, KDA) and ``v``
    (``UTM``, GDN) a build reads (0 when neither: one pair, so the parameters keep the layout of
    the shipped builds). An operand a build does not read comes as None (KDA: ``rk``; dense mode:
    ``state_indices``, and ``h0`` without ``HAS_H0``; ``has_init`` without ``HAS_INIT``), except with
    ``FUSE_O``, where ``rk`` is the key norms and ``has_init``, ``hbuf``, ``vn`` may be zero-size (the
    launcher keeps that build's code).

    ``SEGMENT`` (the segment-parallel state pass, ops.md "Segment-parallel state pass"; 0: off):
    the programs' "sequences" are the segments of the segment tables (``cu_seqlens`` and
    ``chunk_off`` are the segments' bounds and first chunks). ``1``, the summary pass: the value
    blocks cover ``V + K`` columns; the first ``V`` start from zero, the last ``K`` from the
    identity and read no ``U``, so the final store (dense, ``ht [NSEG, HV, K, V + K]`` fp32) is the
    segment's ``[B | M]``; nothing else is written. ``2``, the rerun: ``h0 [NSEG, HV, K, V]`` holds
    each segment's entering state (from :func:`chunk_segment_combine_kernel`), the final store is
    dense (``ht``, scratch) and with ``POOL`` ``state_indices`` holds each segment's slot (negative:
    padding, zero output rows where ``FUSE_O``).

    ``HAS_CKPT`` (pool mode, one pass per sequence: ``SEGMENT = 0``): state checkpoints, written in the
    chunk loop by :func:`store_checkpoint` from ``ckpt [N, ck_n]`` (the slot table) every ``ck_every``
    chunks; without it ``ckpt``, ``ck_n``, ``ck_every`` are None and the build is the one before."""
    tl.static_assert(not HAS_CKPT or (POOL and SEGMENT == 0), "checkpoints: pool mode, one pass per sequence")
    tl.static_assert(HSTEP == 1 or HSTEP == 2, "HSTEP: every chunk's state (1) or every second one (2)")
    tl.static_assert(not KDA or not (HOIST or UTM or HSTEP != 1), "HOIST, UTM and HSTEP = 2 are GDN's")
    tl.static_assert(SEGMENT != 1 or not (FUSE_O or POOL or HAS_H0), "the summary pass starts from [I | 0], dense")
    i_v, i_n, i_hv = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
    i_h = i_hv // GROUP
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    c0 = tl.load(chunk_off + i_n).to(tl.int64)
    nc = (eos - bos + 63) // 64
    kk = tl.arange(0, K)
    cv = tl.arange(0, BV)  # value columns of this block, relative to v0 (int32 tile offsets)
    v0 = i_v * BV
    r = tl.arange(0, 64)
    all_k = kk[:, None] >= 0  # `(all_k & scalar) != 0` below: bool masks for Triton 3.9's interpreter, where a
    # scalar compare ANDed into a tile is int data ('mask has unsupported dtype'); the same sm_90 code

    if SEGMENT == 1:  # columns [0, V): B from a zero state; [V, V + K): the transition, from I
        S = (kk[:, None] == (v0 - V + cv)[None, :]).to(tl.float32)
    elif SEGMENT == 2:  # the segment's entering state from the combine (dense, by segment)
        S = tl.load(h0 + i_n * s0_p + i_hv * s0_h + v0 * s0_v + (kk[:, None] * s0_k + cv[None, :] * s0_v))
    elif POOL:
        # inline, not pool_slot(): the helper moves the sm120 fp32 KDA build's sm_90 code (same maths)
        slot = tl.load(state_indices + i_n).to(tl.int64)
        live = slot >= 0
        if HAS_INIT:  # has_initial_state False: a zero h0, the slot never read (the final state is stored)
            carry = live & (tl.load(has_init + i_n) != 0)
        else:
            carry = live
        row0 = slot * s0_p + i_hv * s0_h + v0 * s0_v
        S = tl.load(h0 + row0 + (kk[:, None] * s0_k + cv[None, :] * s0_v), mask=(all_k & carry) != 0,
                    other=0.0).to(tl.float32)
    elif HAS_H0:
        S = tl.load(h0 + i_n * s0_p + i_hv * s0_h + v0 * s0_v + (kk[:, None] * s0_k + cv[None, :] * s0_v)).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)

    if FUSE_O and POOL:
        keep_o = tl.load(state_indices + i_n) >= 0  # padding: zero output rows
    else:
        keep_o = True
    incl = r[:, None] >= r[None, :]
    for t in range(nc):
        c = c0 + t
        t0 = bos + t * 64  # int64 scalar bases; in-chunk offsets are int32
        m = r < eos - t0
        Sd = S.to(DT)  # the state entering chunk c, as the output stage reads it
        if not FUSE_O and SEGMENT != 1:
            if t % HSTEP == 0:  # HSTEP = 2: the output stage rebuilds the others' share from the chunk before
                tl.store(hbuf + (c * HV + i_hv) * (K * V) + v0 + (kk[:, None] * V + cv[None, :]), Sd)
        wt = tl.load(w + (t0 * HV + i_hv) * K + (r[:, None] * (HV * K) + kk[None, :]), mask=m[:, None], other=0.0)
        vo = (t0 * HV + i_hv) * V + v0
        if UTM:  # GDN: U = (Tm diag(beta)) V here, from stage 1's matrix and v
            tmt = tl.load(tm_beta + (t0 * HV + i_hv) * 64 + (r[:, None] * (HV * 64) + r[None, :]), mask=m[:, None],
                          other=0.0)
            if SEGMENT == 1:  # the transition's columns read no values
                vt = tl.load(v + t0 * sxt + i_hv * sxh + v0 + (r[:, None] * sxt + cv[None, :]),
                             mask=m[:, None] & (v0 + cv < V)[None, :], other=0.0)
            else:
                vt = tl.load(v + t0 * sxt + i_hv * sxh + v0 + (r[:, None] * sxt + cv[None, :]), mask=m[:, None],
                             other=0.0)
            vnew = tl.dot(tmt.to(DT), vt.to(DT), input_precision=PREC) - tl.dot(wt.to(DT), Sd, input_precision=PREC)
        else:
            if SEGMENT == 1:
                ut = tl.load(u + vo + (r[:, None] * (HV * V) + cv[None, :]), mask=m[:, None] & (v0 + cv < V)[None, :],
                             other=0.0)
            else:
                ut = tl.load(u + vo + (r[:, None] * (HV * V) + cv[None, :]), mask=m[:, None], other=0.0)
            vnew = ut.to(tl.float32) - tl.dot(wt.to(DT), Sd, input_precision=PREC)
        vd = vnew.to(DT)
        if not FUSE_O and SEGMENT != 1:
            tl.store(vn + vo + (r[:, None] * (HV * V) + cv[None, :]), vd, mask=m[:, None])
        kt = tl.load(k + t0 * skt + i_h * skh + (r[:, None] * skt + kk[None, :]), mask=m[:, None], other=0.0)
        if KDA:
            if FUSE_O:  # o = qg h + Aqk Vn
                qt = tl.load(q + t0 * sxt + i_hv * sxh + (r[:, None] * sxt + kk[None, :]), mask=m[:, None], other=0.0)
                A = tl.load(aqk + (t0 * HV + i_hv) * 64 + (r[:, None] * (HV * 64) + r[None, :]),
                            mask=m[:, None] & incl, other=0.0)
                acc = tl.dot(qt.to(DT), Sd, input_precision=PREC)
                acc = tl.dot(A.to(DT), vd, acc=acc, input_precision=PREC)
                tl.store(o + vo + (r[:, None] * (HV * V) + cv[None, :]), tl.where(keep_o, acc, 0.0).to(o.dtype.element_ty),
                         mask=m[:, None])
            # S = diag(exp(G_C)) S + kd^T Vn
            gl = tl.load(g + c * sgt + i_hv * sgh + kk)
            S = tl.dot(tl.trans(kt.to(DT)), vd, acc=S * tl.exp(gl)[:, None], input_precision=PREC)
        else:
            rkv = tl.load(rk + t0 * HV + i_hv + r * HV, mask=m, other=0.0)
            if HOIST:  # rk: kf = rk exp(G_C - G) per row; g: exp(G_C) per chunk (chunk stride sgt)
                vs = vnew * rkv[:, None]
                egl = tl.load(g + c * sgt + i_hv * sgh)
            else:
                suf, gl = _gate_factors(tl.load(g + t0 * sgt + i_hv * sgh + r * sgt, mask=m, other=0.0))
                egl = tl.exp(gl)
                vs = vnew * (tl.exp(suf) * rkv)[:, None]
            S = tl.dot(tl.trans(kt.to(DT)), vs.to(DT), acc=S * egl, input_precision=PREC)
        if HAS_CKPT:  # the state after t + 1 chunks, where a checkpoint falls there
            store_checkpoint(ckpt, ck_n, ck_every, t, i_n, eos - bos, live, ht, S, i_hv, v0, st_p, st_h, st_k, st_v,
                             K, BV)

    if POOL and SEGMENT == 0:  # same row as the load; the store strides come in separately so that the compiler
        # does not keep the load's address tensor alive across the loop
        tl.store(ht + slot * st_p + i_hv * st_h + v0 * st_v + (kk[:, None] * st_k + cv[None, :] * st_v),
                 S.to(ht.dtype.element_ty), mask=(all_k & live) != 0)
    else:
        tl.store(ht + i_n * st_p + i_hv * st_h + v0 * st_v + (kk[:, None] * st_k + cv[None, :] * st_v),
                 S.to(ht.dtype.element_ty))


@triton.jit
def _combine_rows(h0_row, kh, cv, s0_k, s0_v, mask, LOADS: tl.constexpr, KH: tl.constexpr, BV: tl.constexpr):
    """Rows ``kh`` of an entering state, ``[KH, BV]`` fp32 (zeros where nothing is loaded)."""
    if LOADS:
        x = tl.load(h0_row + (kh[:, None] * s0_k + cv[None, :] * s0_v), mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([KH, BV], dtype=tl.float32)
    return x


@triton.jit
def chunk_segment_combine_kernel(
    summary, seg_first, seg_init, h0, ht, state_indices, has_init,
    sm_s, sm_h, s0_p, s0_h, s0_k, s0_v, st_p, st_h, st_k, st_v, HV,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
    POOL: tl.constexpr, HAS_H0: tl.constexpr, HAS_INIT: tl.constexpr, PREC: tl.constexpr,
):
    """The segment-parallel state pass's sequential combine (ops.md "Segment-parallel state
    pass"), one program per (value block, sequence, value head): ``S = h0``; for the sequence's
    segments ``j = seg_first[n] .. seg_first[n+1] - 1`` in order: ``seg_init[j] = S``,
    ``S = M_j S + B_j``; then the final ``S`` goes to the pool row (``POOL``; not for a negative
    slot) or to ``ht[n]`` (dense). ``h0``: as the state kernel's (pool, dense initial state, or
    zeros; ``has_init`` bytes with ``HAS_INIT``). ``summary [NSEG, HV, K, V + K]`` fp32 (strides
    ``sm_s, sm_h``; row pitch ``V + K``): ``[B_j | M_j]`` from the summary pass; ``seg_init
    [NSEG, HV, K, V]`` fp32, contiguous. ``S [K, BV]`` is held in registers as two row halves and
    ``M_j`` read as four ``[K/2, K/2]`` tiles (K <= 128: the planner's bound); the loads of ``M_j``,
    ``B_j`` do not depend on ``S``, so the software pipeline fetches them ahead."""
    i_v, i_n, i_hv = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
    v0 = i_v * BV
    KH: tl.constexpr = K // 2
    ka = tl.arange(0, KH)
    kb = KH + ka
    cv = tl.arange(0, BV)
    all_k = ka[:, None] >= 0
    j0 = tl.load(seg_first + i_n).to(tl.int64)
    j1 = tl.load(seg_first + i_n + 1).to(tl.int64)
    if POOL:
        slot, live, carry = pool_slot(state_indices, has_init, i_n, HAS_INIT)
        row0 = h0 + slot * s0_p + i_hv * s0_h + v0 * s0_v
        dst = ht + slot * st_p + i_hv * st_h + v0 * st_v
    else:
        live = i_n >= 0
        carry = live
        row0 = h0
        if HAS_H0:
            row0 = h0 + i_n * s0_p + i_hv * s0_h + v0 * s0_v
        dst = ht + i_n * st_p + i_hv * st_h + v0 * st_v
    Sa = _combine_rows(row0, ka, cv, s0_k, s0_v, (all_k & carry) != 0, POOL or HAS_H0, KH, BV)
    Sb = _combine_rows(row0, kb, cv, s0_k, s0_v, (all_k & carry) != 0, POOL or HAS_H0, KH, BV)
    for j in range(j0, j1):
        cur = seg_init + (j * HV + i_hv) * (K * V) + v0 + cv[None, :]
        tl.store(cur + ka[:, None] * V, Sa)
        tl.store(cur + kb[:, None] * V, Sb)
        base = summary + j * sm_s + i_hv * sm_h
        ra = base + ka[:, None] * (V + K)
        rb = base + kb[:, None] * (V + K)
        na = tl.dot(tl.load(ra + V + ka[None, :]), Sa, acc=tl.load(ra + v0 + cv[None, :]), input_precision=PREC)
        na = tl.dot(tl.load(ra + V + kb[None, :]), Sb, acc=na, input_precision=PREC)
        nb = tl.dot(tl.load(rb + V + ka[None, :]), Sa, acc=tl.load(rb + v0 + cv[None, :]), input_precision=PREC)
        nb = tl.dot(tl.load(rb + V + kb[None, :]), Sb, acc=nb, input_precision=PREC)
        Sa = na
        Sb = nb
    out = (all_k & live) != 0
    tl.store(dst + (ka[:, None] * st_k + cv[None, :] * st_v), Sa.to(ht.dtype.element_ty), mask=out)
    tl.store(dst + (kb[:, None] * st_k + cv[None, :] * st_v), Sb.to(ht.dtype.element_ty), mask=out)


@triton.jit
def chunk_gdn_gates_kernel(g, rk, kf, ec, cu_seqlens, chunk_seq, chunk_start, sgt, sgh, N, HV,
                           BH: tl.constexpr):
    """GDN: the state stage's per-chunk gate factors, grid ``(NT_max, cdiv(HV, BH))``: for chunk
    ``c`` and value heads ``hv``, ``kf[t, hv] = rk[t, hv] exp(G_C - G_t)`` (``G_C - G_t`` as the
    suffix sum of the gates after row ``t``) ``[T, HV]`` fp32 and ``ec[c, hv] = exp(G_C)``
    ``[NT_max, HV]`` fp32, from ``g [T, HV]`` and stage 1's ``rk [T, HV]`` (:func:`_gate_factors`,
    as the state loop forms them without ``HOIST``)."""
    i_c = tl.program_id(0)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    t0, L = chunk_span(chunk_start, cu_seqlens, i_c, n)
    r = tl.arange(0, 64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    msk = (r < L)[:, None] & (h < HV)[None, :]
    suf, gl = _gate_factors(tl.load(g + t0 * sgt + r[:, None] * sgt + h[None, :] * sgh, mask=msk, other=0.0))
    ro = (t0 + r[:, None]) * HV + h[None, :]
    tl.store(kf + ro, tl.load(rk + ro, mask=msk, other=0.0) * tl.exp(suf), mask=msk)
    tl.store(ec + i_c.to(tl.int64) * HV + h, tl.exp(gl), mask=h < HV)


# -- the host side: the gates and state stages' launches ------------------------------------

#: the combine's value columns per program (a [K, K] fp32 tile in registers, K <= 128) and its launch
SEGMENT_COMBINE_BLOCK_V = 32
SEGMENT_COMBINE_LAUNCH = LaunchOptions(4, 2)  # why: docs/performance.md#prefill-segments


def state_strides(x: torch.Tensor, state_layout: str) -> tuple[int, int, int, int]:
    """(slot, head, k, v) element strides of a state tensor in layout ``vk`` or ``kv``."""
    if state_layout == "vk":
        return x.stride(0), x.stride(1), x.stride(3), x.stride(2)
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)


def gates_block(HV: int) -> int:
    """Value heads per program of the gates kernel."""
    return min(32, triton.next_power_of_2(HV))


def launch_gates(plan: "PrefillPlan", x: "PrefillInputs", t: "ChunkTables", b: "PrefillBuffers") -> None:
    """GDN, between stages 1 and 2: ``gdn_kf`` and ``gdn_ec``, the state loop's gate factors
    (:func:`.chunk_state.chunk_gdn_gates_kernel`)."""
    launch(chunk_gdn_gates_kernel, plan.grids.gates,
           (x.g, b.rk, b.gdn_kf, b.gdn_ec, x.cu_seqlens, t.chunk_seq, t.chunk_start, *x.g.stride()[:2],
            plan.N, plan.HV), dict(BH=gates_block(plan.HV)), num_warps=4)


def launch_state(plan: "PrefillPlan", x: "PrefillInputs", t: "ChunkTables", b: "PrefillBuffers", st: "PrefillState") -> None:
    """Stage 2: the sequential state kernel (:func:`.chunk_state.chunk_state_kernel`), on the grid
    planned for ``N x HV x V // block_v``; reads ``h0`` and writes the final state in place (pool)
    or to ``final`` (dense); writes ``hbuf`` and ``vn``, or the output (``plan.state_writes_output``)."""
    if plan.grids.state.empty:
        return
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    _launch_state_kernel(plan, x, b, grid=plan.grids.state, cu=x.cu_seqlens, chunk_off=t.chunk_off,
                         state_indices=st.state_indices, flags=st.has_initial_state, h0=st.h0, ht=st.ht,
                         s0=s0, st=state_strides(st.ht, plan.state_layout), pool=plan.pool_mode,
                         has_h0=plan.has_h0, has_init=plan.has_init_flags, writes_output=plan.state_writes_output,
                         checkpoints=st.checkpoints, checkpoint_every=st.checkpoint_every)


def _launch_state_kernel(plan: "PrefillPlan", x: "PrefillInputs", b: "PrefillBuffers", *, grid: "GridPlan", cu, chunk_off,
                         state_indices, flags, h0, ht, s0: tuple, st: tuple, pool: bool, has_h0: bool,
                         has_init: bool, writes_output: bool, segment: int = 0, checkpoints=None,
                         checkpoint_every: int = 0) -> None:
    """One launch of the state kernel on ``grid`` with the given tables and state operands
    (``s0``, ``st``: the ``(slot, head, k, v)`` element strides of ``h0`` and ``ht``); ``checkpoints``
    (pool mode, one pass): the slot table, with ``checkpoint_every`` in tokens (``HAS_CKPT``)."""
    opt, kda = plan.stages, plan.kda
    if kda:  # stage 1's decayed keys and per-chunk total log decays, per value head (GROUP 1)
        keys, gate, row, group = b.kda_kd, b.kda_gl, None, 1
    else:  # the gates kernel's factors, or the raw gates and the key norms
        keys, group = x.k, plan.group
        gate, row = (b.gdn_ec, b.gdn_kf) if opt.gates_kernel else (x.g, b.rk)
    q, aqk, o = (b.kda_qg, b.kda_aqk, b.o) if writes_output else (None, None, None)
    v, tm = (x.v, b.tm_beta) if opt.u_in_state else (None, None)
    if writes_output:  # unread, yet not None: None here moves a shipped build's sm_90 code (#prefill-none-operands)
        row = b.rk
        flags = flags if flags is not None else torch.empty(0, dtype=torch.uint8, device=plan.device)
    constexprs = dict(K=plan.K, V=plan.V, BV=plan.config.state.block_v, **grid.constexprs, KDA=kda, POOL=pool,
                      HAS_H0=has_h0, DT=plan.DT, PREC=plan.PREC, FUSE_O=writes_output, HOIST=opt.gates_kernel,
                      HSTEP=2 if opt.every_second_state else 1, UTM=opt.u_in_state, HAS_INIT=has_init)
    if segment:
        constexprs["SEGMENT"] = segment
    ck = (None, None, None)
    if checkpoints is not None:  # the build without HAS_CKPT takes the three as None (constexpr-folded)
        constexprs["HAS_CKPT"] = True
        ck = (checkpoints, checkpoints.shape[1], checkpoint_every // CHUNK)
    launch_with(chunk_state_kernel, grid.grid,
                (keys, gate, b.w, b.u, row, cu, chunk_off, state_indices, flags,
                 h0, ht, b.hbuf, b.vn, q, aqk, o, v, tm, *keys.stride()[:2], *gate.stride()[:2],
                 *(q.stride()[:2] if writes_output else v.stride()[:2] if opt.u_in_state else (0, 0)),  # q's or v's: one pair
                 *s0, *st, group, plan.HV, *ck),
                constexprs, plan.config.state.fused_launch if writes_output else plan.config.state.launch)


def launch_segmented_state(plan: "PrefillPlan", x: "PrefillInputs", t: "ChunkTables", b: "PrefillBuffers",
                           st: "PrefillState") -> None:
    """Stage 2 as the segment-parallel state pass (ops.md "Segment-parallel state pass"): the
    segment tables, the summary pass (each segment's ``[B | M]`` from ``[0 | I]``), the combine
    (every segment's entering state; the final state to the pool row or ``final``) and the rerun
    from the entering states (``hbuf`` and ``vn``, or the output)."""
    seg = segment_tables(plan, x.cu_seqlens, t.chunk_off, st.state_indices if plan.pool_mode else None)
    g, K, V, HV = plan.segment_grids, plan.K, plan.V, plan.HV
    summary, init = b.seg_summary, b.seg_init
    sm = (HV * K * (V + K), K * (V + K), V + K, 1)  # (segment, head, k, v) strides of [B | M]
    si = (HV * K * V, K * V, V, 1)
    common = dict(cu=seg.seg_cu, chunk_off=seg.seg_chunk_off)
    _launch_state_kernel(plan, x, b, grid=g.summary, **common, state_indices=None, flags=None, h0=None,
                         ht=summary, s0=sm, st=sm, pool=False, has_h0=False, has_init=False, writes_output=False,
                         segment=1)
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    launch_with(chunk_segment_combine_kernel, g.combine.grid,
                (summary, seg.seg_first, init, st.h0, st.ht, st.state_indices, st.has_initial_state,
                 sm[0], sm[1], *s0, *state_strides(st.ht, plan.state_layout), HV),
                dict(K=K, V=V, BV=SEGMENT_COMBINE_BLOCK_V, **g.combine.constexprs, POOL=plan.pool_mode,
                     HAS_H0=plan.has_h0, HAS_INIT=plan.has_init_flags,
                     PREC=plan.COMBINE_PREC), SEGMENT_COMBINE_LAUNCH)
    _launch_state_kernel(plan, x, b, grid=g.rerun, **common, state_indices=seg.seg_slot, flags=None, h0=init,
                         ht=summary, s0=si, st=sm, pool=plan.pool_mode, has_h0=True, has_init=False,
                         writes_output=plan.state_writes_output, segment=2)
