"""Triton recurrent decode for GDN and KDA over a state pool: one kernel source for both.

Maths (docs/ops.md, "Gating" and "Recurrence"; Yang, Kautz, Hatamizadeh, "Gated Delta Networks",
ICLR 2025; the Kimi Linear report for KDA's per-channel gates), per token, per value head, with
the state held as a ``[BV, K]`` tile of ``S^T`` in fp32 registers:

    x    = a + dt_bias                                  (GDN: scalar; KDA: one per key channel)
    g    = -exp(A_log) * softplus(x)                    (or KDA bounded: lower_bound * sigmoid(exp(A_log) x))
    beta = sigmoid(b)                                   (g and beta in fp32)
    q, k = l2norm(q), l2norm(k);  q = q * scale
    S    = exp(g) * S;   u = beta * (v - S^T k);   S = S + k u^T;   o = S^T q

Work items are (value block, sequence, value head); program ids are decoded by the shared
:func:`decode_pid` helper for the ``split`` and ``folded`` layouts, so both layouts run the same
instructions on the same data and agree bitwise.

Pool rules (docs/ops.md): ``state_indices [N]`` or a per-token slot table ``[N, T]`` (int32/int64),
offsets in int64, a negative slot is padding (zero output, the pool neither read nor written),
layouts ``"vk"`` (``[P, HV, V, K]``) and ``"kv"`` (``[P, HV, K, V]``), pool dtype preserved,
slot pitch ``stride(0)``. ``has_initial_state [N]`` (``HAS_INITIAL_STATE``): False masks the
state load (a zero state, the slot never read) and stores as usual. ``output_state_indices [N]``
(``HAS_OUT_SLOTS``, with ``state_indices [N]``): the final state is stored through a second row
pointer, the load slot only read. Precomputed gates
(``GATES_PRECOMPUTED``): ``g`` and ``beta`` are read where ``a`` and ``b`` are, the gating is skipped
(``g`` is still floored at ``G_MIN``).
"""

from __future__ import annotations

import copy
import functools
import operator
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from linattn.kernels.grid import plan_grid
from linattn.kernels.triton._pid import decode_pid
from linattn.kernels.triton._l2norm import SS_LIMIT, pow2_scale
from linattn.kernels.triton import limits
from linattn.kernels.triton.launch import PreparedLaunch
from linattn.kernels.triton.limits import MAX_HEAD_DIM  # noqa: F401  (one copy, Triton-free)

#: Floor of the log decay g (limits.G_MIN, as the kernels see it): exp(G_MIN) is 0 in fp32.
G_MIN = tl.constexpr(limits.G_MIN)
#: log2(e), for :func:`_log2_decay`'s exp2 / log2 form of the decay
LOG2E = tl.constexpr(1.4426950408889634)
#: State tile budget in fp32 elements per program (BV * BK), keeps the tile in registers.
TILE_ELEMENTS = 4096


@triton.jit
def _log1p_exp_neg(y):
    """log(1 + exp(-y)) for y >= 0, accurate for large y (log1p written without libdevice)."""
    z = tl.exp(-y)
    w = 1.0 + z
    return tl.where(w == 1.0, z, tl.log(w) * (z / tl.where(w == 1.0, 1.0, w - 1.0)))


@triton.jit
def _softplus(x, beta, threshold):
    """softplus with PyTorch's beta/threshold convention; never overflows."""
    bx = beta * x
    sp = (tl.maximum(bx, 0.0) + _log1p_exp_neg(tl.abs(bx))) / beta
    return tl.where(bx > threshold, x, sp)


@triton.jit
def _log2_decay(x, decay_coef, softplus_beta, softplus_threshold):
    """``log2 exp(g)`` for ``g = -exp(A_log) softplus(x)`` (PyTorch's beta / threshold convention) as
    ``-(exp(A_log) / beta) log2(1 + 2^y)``, ``y = beta x log2 e`` (``y`` itself past the threshold), with
    ``decay_coef = exp(A_log) / beta`` and ``log2(1 + 2^y) = max(y, 0) + log2(1 + 2^-|y|)`` (no overflow
    for a ``beta x`` past 88 below a large threshold): two MUFU operations and no division on the chain
    from ``a`` to the decay (``DecodeConfig.decay_exp2``), against :func:`_softplus`'s log1p form and
    ``exp(g)``. The difference: where ``e^(beta x) < 2^-24``, ``1 + e^(beta x)`` rounds to 1 and the decay
    to exactly 1, where the log1p form gives ``1 - (exp(A_log) / beta) e^(beta x)`` (at most
    ``(exp(A_log) / beta) 2^-24`` apart). ``inf * 0`` reads as 0 (:func:`_decode_rows`'s rule for
    ``exp(A_log) softplus(x)``); a NaN ``x`` gives NaN, which the caller's floor turns into a decay of 0."""
    y = softplus_beta * x * LOG2E
    l2 = tl.where(softplus_beta * x > softplus_threshold, y, tl.maximum(y, 0.0) + tl.log2(1.0 + tl.exp2(-tl.abs(y))))
    return tl.where(l2 == 0.0, 0.0, tl.where(decay_coef == 0.0, 0.0, -decay_coef * l2))


@triton.jit
def _l2norm_scaled(x):
    """``x / sqrt(sum(x^2) + 1e-6)`` of one fp32 row without overflow (F44; ``l2norm_ref`` in
    backends/torch_ref.py): a row with ``max|x| = f 2**e >= 2**32`` (``f`` in ``[0.5, 1)``) is scaled
    by ``s = 2**-(e - 32)``, read from the float's exponent bits, and the eps by ``s**2`` (the same
    value); every other row has ``s = 1``, the plain formula."""
    s = pow2_scale(tl.max(tl.abs(x)))  # the chunked prefill's stages share it (._l2norm)
    y = x * s
    return y / tl.sqrt(tl.sum(y * y) + 1e-6 * s * s)


@triton.jit
def _l2norm(x, ONE_PASS: tl.constexpr = False):
    """:func:`_l2norm_scaled`; with ``ONE_PASS`` (``DecodeConfig.l2norm_one_pass``) the sum of squares
    first, and the row's max only where that sum reaches ``SS_LIMIT`` (every row holding an element
    ``>= 2**32`` does; an inf or nan sum does too), as the chunked prefill's stages do: one cross-lane
    reduction instead of two for an ordinary row, and the same bits (such a row has ``s = 1``)."""
    if ONE_PASS:
        ss = tl.sum(x * x)
        if ss < SS_LIMIT:
            y = x / tl.sqrt(ss + 1e-6)
        else:
            y = _l2norm_scaled(x)
    else:
        y = _l2norm_scaled(x)
    return y


@triton.jit
def _tile(i_blk, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, STATE_LAYOUT: tl.constexpr,
          STATE_VEC: tl.constexpr):
    """Value block ``i_blk`` of a ``[V, K]`` state slot: its rows, the key columns, their masks, the
    tile mask and the tile's element offsets in the slot (layout ``"vk"`` or ``"kv"``).

    ``STATE_VEC > 0``: the key columns written ``(c // STATE_VEC) * STATE_VEC + c % STATE_VEC`` (the
    same values), which Triton's contiguity analysis sees as runs of ``STATE_VEC``: its loads and
    stores of the tile then move ``STATE_VEC`` elements per thread (not 16 bytes' worth)."""
    offs_v = i_blk * BV + tl.arange(0, BV)
    if STATE_VEC > 0:
        c = tl.arange(0, BK)
        offs_k = (c // STATE_VEC) * STATE_VEC + c % STATE_VEC
    else:
        offs_k = tl.arange(0, BK)
    mask_v = offs_v < V
    mask_k = offs_k < K
    mask_s = mask_v[:, None] & mask_k[None, :]  # `(mask_s & scalar) != 0` below: bool masks for Triton 3.9's
    # interpreter, where a scalar compare ANDed into a tile is int data; the same sm_90 code
    if STATE_LAYOUT == "vk":
        offs_s = offs_v[:, None] * K + offs_k[None, :]
    else:
        offs_s = offs_k[None, :] * V + offs_v[:, None]
    return offs_v, offs_k, mask_v, mask_k, mask_s, offs_s


@triton.jit
def _decode_rows(
    h, offs_v, mask_v, mask_s, offs_s, offs_k, mask_k, p_state, load_slot, valid, idx_row, i_n, i_h, i_hv,
    q, k, v, a, b, A_log, dt_bias, o, pool, inter, inter_indices, out_indices,
    scale, softplus_beta, softplus_threshold, lower_bound, T,
    s_qn, s_qt, s_qh, s_kn, s_kt, s_kh, s_vn, s_vt, s_vh, s_an, s_at, s_ah, s_bn, s_bt, s_bh,
    s_pool_slot, s_idx_t, s_inter_slot, s_inter_t, s_inter_h,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    GATE: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    PER_TOKEN_SLOTS: tl.constexpr, HAS_INTER: tl.constexpr, HAS_INTER_IDX: tl.constexpr, UPDATE_STATE: tl.constexpr,
    GATES_PRECOMPUTED: tl.constexpr, HAS_OUT_SLOTS: tl.constexpr, STATE_EVICTION: tl.constexpr,
    L2NORM_ONE_PASS: tl.constexpr, DECAY_EXP2: tl.constexpr,
):
    """The tokens of one sequence on one state tile ``h`` (fp32 ``[BV, BK]``, loaded by the caller
    from ``p_state + load_slot * s_pool_slot``): gating, the delta rule, the output rows and the
    state stores (the kernel's docstring and the module's)."""
    if not GATES_PRECOMPUTED:
        exp_a = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
        if DECAY_EXP2:
            decay_coef = exp_a / softplus_beta
        if GATE == "gdn":
            dt = tl.load(dt_bias + i_hv).to(tl.float32)
        else:
            dt = tl.load(dt_bias + i_hv * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if HAS_INTER:
        if HAS_INTER_IDX:
            i_slot = tl.load(inter_indices + i_n).to(tl.int64)
        else:
            i_slot = i_n
        p_inter = inter + i_slot * s_inter_slot + i_hv * s_inter_h + offs_s
        inter_mask = (mask_s & valid & (i_slot >= 0)) != 0

    p_q = q + i_n * s_qn + i_h * s_qh + offs_k
    p_k = k + i_n * s_kn + i_h * s_kh + offs_k
    p_v = v + i_n * s_vn + i_hv * s_vh + offs_v
    p_a = a + i_n * s_an + i_hv * s_ah
    p_b = b + i_n * s_bn + i_hv * s_bh
    p_o = o + (i_n * T * HV + i_hv) * V + offs_v
    for t in range(T):
        t64 = tl.cast(t, tl.int64)
        b_q = tl.load(p_q + t64 * s_qt, mask=mask_k, other=0.0).to(tl.float32)
        b_k = tl.load(p_k + t64 * s_kt, mask=mask_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v + t64 * s_vt, mask=mask_v, other=0.0).to(tl.float32)
        b_b = tl.load(p_b + t64 * s_bt).to(tl.float32)
        if GATES_PRECOMPUTED:  # a holds g (log decay), b holds beta (already sigmoided)
            if GATE == "gdn":
                g = tl.load(p_a + t64 * s_at).to(tl.float32)
            else:
                g = tl.load(p_a + t64 * s_at + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            beta = b_b
        else:
            if GATE == "gdn":
                x = tl.load(p_a + t64 * s_at).to(tl.float32) + dt
            else:
                x = tl.load(p_a + t64 * s_at + offs_k, mask=mask_k, other=0.0).to(tl.float32) + dt
            if HAS_LOWER_BOUND:
                z = tl.where(x == 0.0, 0.0, tl.where(exp_a == 0.0, 0.0, exp_a * x))  # inf * 0 reads as 0
                g = lower_bound / (1.0 + tl.exp(-z))
            elif DECAY_EXP2:  # log2 of the decay: -(exp(A_log) / beta) log2(1 + e^(beta x)) (:func:`_log2_decay`)
                g2 = _log2_decay(x, decay_coef, softplus_beta, softplus_threshold)
            else:
                sp = _softplus(x, softplus_beta, softplus_threshold)
                g = tl.where(sp == 0.0, 0.0, tl.where(exp_a == 0.0, 0.0, -exp_a * sp))  # inf * 0 reads as 0
            beta = 1.0 / (1.0 + tl.exp(-b_b))
        if DECAY_EXP2 and not GATES_PRECOMPUTED and not HAS_LOWER_BOUND:
            decay = tl.exp2(tl.where(g2 >= G_MIN * LOG2E, g2, G_MIN * LOG2E))  # exp(max(g, G_MIN)); NaN: the floor
        else:
            g = tl.maximum(g, G_MIN)  # finite; exp(G_MIN) is 0 (torch_ref.G_MIN)
        if USE_QK_L2NORM:
            b_q = _l2norm(b_q, L2NORM_ONE_PASS)
            b_k = _l2norm(b_k, L2NORM_ONE_PASS)
        b_q = b_q * scale
        if DECAY_EXP2 and not GATES_PRECOMPUTED and not HAS_LOWER_BOUND:
            if GATE == "gdn":
                h = h * decay
            else:
                h = h * decay[None, :]
        elif GATE == "gdn":
            h = h * tl.exp(g)
        else:
            h = h * tl.exp(g)[None, :]
        u = beta * (b_v - tl.sum(h * b_k[None, :], axis=1))
        h = h + u[:, None] * b_k[None, :]
        b_o = tl.sum(h * b_q[None, :], axis=1)
        b_o = tl.where(valid, b_o, 0.0)
        tl.store(p_o + t64 * (HV * V), b_o.to(o.dtype.element_ty), mask=mask_v)
        if HAS_INTER:
            tl.store(p_inter + t64 * s_inter_t, h.to(inter.dtype.element_ty), mask=inter_mask)
        if PER_TOKEN_SLOTS and UPDATE_STATE:
            st = tl.load(idx_row + t64 * s_idx_t).to(tl.int64)
            tl.store(p_state + st * s_pool_slot, h.to(pool.dtype.element_ty), mask=(mask_s & valid & (st >= 0)) != 0)
    if UPDATE_STATE and not PER_TOKEN_SLOTS:
        if HAS_OUT_SLOTS:  # separate write slots: the load slot is only read
            out_slot = tl.load(out_indices + i_n).to(tl.int64)
            tl.store(p_state + out_slot * s_pool_slot, h.to(pool.dtype.element_ty),
                     mask=(mask_s & valid & (out_slot >= 0)) != 0, eviction_policy=STATE_EVICTION)
        else:
            tl.store(p_state + load_slot * s_pool_slot, h.to(pool.dtype.element_ty), mask=(mask_s & valid) != 0,
                     eviction_policy=STATE_EVICTION)


@triton.jit
def _recurrent_decode_kernel(
    q, k, v, a, b, A_log, dt_bias, o, pool, state_indices, num_accepted, inter, inter_indices, has_init,
    out_indices, scale, softplus_beta, softplus_threshold, lower_bound,
    T,
    s_qn, s_qt, s_qh, s_kn, s_kt, s_kh, s_vn, s_vt, s_vh,
    s_an, s_at, s_ah, s_bn, s_bt, s_bh,
    s_pool_slot, s_pool_h, s_idx_n, s_idx_t,
    s_inter_slot, s_inter_t, s_inter_h,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    STATE_LAYOUT: tl.constexpr, PER_TOKEN_SLOTS: tl.constexpr, HAS_NUM_ACCEPTED: tl.constexpr,
    HAS_INTER: tl.constexpr, HAS_INTER_IDX: tl.constexpr, UPDATE_STATE: tl.constexpr,
    GATES_PRECOMPUTED: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr, HAS_OUT_SLOTS: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
    STATE_EVICTION: tl.constexpr = "", BLOCKS: tl.constexpr = 1, STATE_VEC: tl.constexpr = 0,
    L2NORM_ONE_PASS: tl.constexpr = False, DECAY_EXP2: tl.constexpr = False,
):
    """One program: ``BLOCKS`` consecutive value blocks of ``BV`` rows of one (sequence, value head).
    ``BLOCKS = 1`` (every shipped build but those :data:`PINNED` says otherwise): one tile, loaded
    then updated. ``BLOCKS > 1``: the tiles one after another, each next tile's state load issued
    before the current tile's update (in its pool dtype; converted to fp32 when its turn comes), so
    that a program keeps a load in flight while it computes; the same instructions per tile, so
    the results equal ``BLOCKS = 1``'s bitwise. ``STATE_VEC``: :func:`_tile` (0: every shipped build)."""
    i_v, i_n, i_hv = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, HV)
    i_h = i_hv // (HV // H)

    if BLOCKS == 1:
        i_first = i_v
    else:
        i_first = i_v * BLOCKS
    offs_v, offs_k, mask_v, mask_k, mask_s, offs_s = _tile(i_first, K, V, BK, BV, STATE_LAYOUT, STATE_VEC)

    # The load slot, and padding: a row whose load slot is negative is padding (zero output,
    # nothing read or written). With num_accepted_tokens, the load slot is the table entry of
    # token num_accepted - 1; 0 accepted starts from a zero state, and then the row's first
    # entry decides padding (as backends/torch_ref.py).
    idx_row = state_indices + i_n * s_idx_n
    load_slot = tl.load(idx_row).to(tl.int64)
    do_load = load_slot >= 0
    if PER_TOKEN_SLOTS:
        if HAS_NUM_ACCEPTED:
            na = tl.load(num_accepted + i_n).to(tl.int64)
            na = tl.minimum(tl.maximum(na, 0), T)  # never reads outside the row
            acc_slot = tl.load(idx_row + tl.maximum(na - 1, 0) * s_idx_t).to(tl.int64)
            load_slot = tl.where(na > 0, acc_slot, load_slot)
            do_load = (load_slot >= 0) & (na > 0)
    if HAS_INITIAL_STATE:  # False: a zero state, the slot is never read (a masked load)
        do_load = do_load & (tl.load(has_init + i_n) != 0)
    valid = load_slot >= 0
    p_head = pool + i_hv * s_pool_h
    raw = tl.load(p_head + offs_s + load_slot * s_pool_slot, mask=(mask_s & do_load) != 0, other=0.0,
                  eviction_policy=STATE_EVICTION)
    for j in tl.static_range(BLOCKS):
        h = raw.to(tl.float32)
        if j + 1 < BLOCKS:  # the next tile's load, ahead of this tile's update
            offs_v1, _, mask_v1, _, mask_s1, offs_s1 = _tile(i_first + j + 1, K, V, BK, BV, STATE_LAYOUT, STATE_VEC)
            raw = tl.load(p_head + offs_s1 + load_slot * s_pool_slot, mask=(mask_s1 & do_load) != 0, other=0.0,
                          eviction_policy=STATE_EVICTION)
        _decode_rows(h, offs_v, mask_v, mask_s, offs_s, offs_k, mask_k, p_head + offs_s, load_slot, valid, idx_row,
                     i_n, i_h, i_hv, q, k, v, a, b, A_log, dt_bias, o, pool, inter, inter_indices, out_indices,
                     scale, softplus_beta, softplus_threshold, lower_bound, T,
                     s_qn, s_qt, s_qh, s_kn, s_kt, s_kh, s_vn, s_vt, s_vh, s_an, s_at, s_ah, s_bn, s_bt, s_bh,
                     s_pool_slot, s_idx_t, s_inter_slot, s_inter_t, s_inter_h,
                     HV, K, V, GATE, HAS_LOWER_BOUND, USE_QK_L2NORM, PER_TOKEN_SLOTS, HAS_INTER, HAS_INTER_IDX,
                     UPDATE_STATE, GATES_PRECOMPUTED, HAS_OUT_SLOTS, STATE_EVICTION, L2NORM_ONE_PASS, DECAY_EXP2)
        if j + 1 < BLOCKS:
            offs_v, mask_v, mask_s, offs_s = offs_v1, mask_v1, mask_s1, offs_s1  # the tile loaded ahead


# --- host side -------------------------------------------------------------------------------

class DecodeConfig(NamedTuple):
    """One launch configuration of the decode kernel (docs/performance.md#decode-tile-configs, and
    #decode-on-bf16-pools for the fields a bf16 pool may need).

    Fields:
        block_v: ``BV``, value rows of the ``[BV, BK]`` state tile (fp32 in registers).
        num_warps: warps per program.
        num_stages: Triton's pipelining stages (None: Triton's default, as every build shipped so far;
            the kernel has no loop over tiles for the pipeliner, so it is a sweep's knob, not a promise).
        maxnreg: a register cap per thread (None: the compiler's choice): more programs per SM
            (sm_90: 65,536 registers, at most 32 programs) at the risk of spills.
        blocks: value blocks per program (the kernel's ``BLOCKS``): each next tile's load issued
            before the current tile's update; 1 (every shipped build): one tile per program.
        l2norm_one_pass: the kernel's ``L2NORM_ONE_PASS`` (:func:`_l2norm`): q's and k's norms in one
            reduction for ordinary rows, the same bits (True in the bf16 pools' ``large`` pin; False: two).
        state_vec: key elements per thread in the state tile's loads and stores (the kernel's
            ``STATE_VEC``; 0, every shipped build: the compiler's choice, 16-byte runs: 4 fp32 or 8
            bf16). 4 on a bf16 pool gives the tile the layout of the key vectors (4 per thread over
            32 lanes: q, k, KDA's gate), so they reach it without shuffles, in 8-byte loads.
        decay_exp2: the kernel's ``DECAY_EXP2`` (:func:`_log2_decay`): the softplus gates' decay
            ``exp(g)`` as ``exp2`` of a ``log2``, a shorter chain from ``a`` to the state update (not bitwise
            the log1p form: a decay within ``2^-24 exp(A_log) / beta`` of 1 reads as 1); the bounded (KDA
            ``lower_bound``) and precomputed gates keep their code.
    """

    block_v: int
    num_warps: int
    num_stages: Optional[int] = None
    maxnreg: Optional[int] = None
    blocks: int = 1
    state_vec: int = 0
    l2norm_one_pass: bool = False
    decay_exp2: bool = False


#: Pinned launch configs per ``(gate, K, V, batch class, state pool dtype)``
#: (docs/performance.md#decode-tile-configs; the pool dtype's name: ``fp32``, ``bf16``, ``fp16``). No
#: autotuning: the kernel writes the pool in place, so it must run exactly once per call. bf16 pools,
#: batch class ``large``: BV 16, 1 warp, q's and k's norms in one pass (``l2norm_one_pass``), the best
#: config of ``benchmarks/decode_sweep.py`` on the H200 that gives the same bits as BV 8
#: (docs/performance.md#decode-on-bf16-pools); ``small`` and fp32 pools are unmeasured with the one-pass
#: norm and keep BV 8, 1 warp. GDN on bf16 pools also takes ``decay_exp2``, in both batch classes so that
#: a request's bits do not depend on its batch's size (docs/performance.md#decode-on-bf16-pools).
PINNED: dict[tuple[str, int, int, str, str], DecodeConfig] = {
    **{(gate, 128, 128, cls, dt): DecodeConfig(8, 1) for gate in ("gdn", "kda") for cls in ("small", "large")
       for dt in ("fp32", "bf16")},
    **{(gate, 128, 128, "large", "bf16"): DecodeConfig(16, 1, l2norm_one_pass=True) for gate in ("gdn", "kda")},
    ("gdn", 128, 128, "small", "bf16"): DecodeConfig(8, 1, decay_exp2=True),
    ("gdn", 128, 128, "large", "bf16"): DecodeConfig(16, 1, l2norm_one_pass=True, decay_exp2=True),
}
#: the pool dtype's name in :data:`PINNED` keys
STATE_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def _batch_class(n_seq: int) -> str:
    return "small" if n_seq < 16 else "large"


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.lru_cache(maxsize=1024)
def _config(K: int, V: int, cls: str, gate: str, state_dtype: str) -> tuple[int, DecodeConfig]:
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"unsupported head_dim K={K}, V={V}: the Triton decode kernels take "
                         f"1 <= K, V <= {MAX_HEAD_DIM}")
    BK = _pow2(K)
    pinned = PINNED.get((gate, K, V, cls, state_dtype))
    if pinned is not None:
        return BK, pinned
    BV = min(_pow2(V), max(1, TILE_ELEMENTS // BK), 32)
    num_warps = 4 if BV * BK >= 2048 else (2 if BV * BK >= 512 else 1)
    return BK, DecodeConfig(BV, num_warps)


def decode_launch_config(K: int, V: int, n_seq: int, gate: str = "gdn",
                         state_dtype: torch.dtype = torch.float32) -> tuple[int, DecodeConfig]:
    """``(BK, config)`` for head dims ``K x V``, ``n_seq`` sequences and a pool of ``state_dtype``.

    The whole key dim is one block (``BK = next_pow2(K)``); unpinned shapes get a ``BV`` that keeps
    the fp32 state tile ``BV x BK`` within :data:`TILE_ELEMENTS` so it stays in registers. Pinned
    configs (:data:`PINNED`, by the pool dtype's name) win where measured.

    Raises:
        ValueError: K or V above :data:`MAX_HEAD_DIM` or below 1 ("unsupported head_dim").
    """
    name = STATE_DTYPE_NAMES.get(state_dtype, str(state_dtype))
    return _config(int(K), int(V), _batch_class(n_seq), gate, name)


def decode_config(K: int, V: int, n_seq: int, caps=None, gate: str = "gdn",
                  state_dtype: torch.dtype = torch.float32) -> tuple[int, int, int]:
    """Tile config ``(BK, BV, num_warps)`` of :func:`decode_launch_config` (a program covers
    ``BV`` value rows times its config's ``blocks``).

    Raises:
        ValueError: K or V above :data:`MAX_HEAD_DIM` or below 1 ("unsupported head_dim").
    """
    BK, cfg = decode_launch_config(K, V, n_seq, gate, state_dtype)
    return BK, cfg.block_v, cfg.num_warps


def _inner_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def recurrent_decode(*, gate: str, caps, layout: str, block_v: Optional[int] = None,
                     num_warps: Optional[int] = None, config: Optional[DecodeConfig] = None,
                     **tensors_and_options) -> torch.Tensor:
    """Launch the GDN/KDA recurrent decode kernel on a state pool (in place).

    Args:
        gate: ``"gdn"`` (scalar gate per head) or ``"kda"`` (one gate per key channel).
        caps: DeviceCapabilities of the tensors' device (grid limits). layout: ``split``/``folded``.
        block_v, num_warps: override the pinned tile config (tests, tuning).
        config: a whole :class:`DecodeConfig` instead of the pinned one (sweeps; ``block_v`` and
            ``num_warps`` still override its fields).
        tensors_and_options: the op's arguments, as :class:`DecodeLaunch` takes them.
    Returns:
        o: ``[N, T, HV, V]`` in q's dtype.
    Raises:
        GridLimitError, ValueError: as :class:`DecodeLaunch`.
    """
    plan = DecodeLaunch(gate=gate, caps=caps, layout=layout, block_v=block_v, num_warps=num_warps,
                        config=config, **tensors_and_options)
    return plan(tensors_and_options)


class DecodeLaunch:
    """One decode launch planned from a call's metadata; calling it launches on the call's tensors.

    Everything but the data pointers is derived here, once: the tile config, the grid, the
    constexprs, which inputs need a copy of their rows and the integer arguments (strides, ``T``).
    A later call whose tensors have the same shapes, strides and dtypes and whose scalars are
    equal (the dispatcher's call key, ``dispatch/runtime/fast_path.py``) launches with ``plan(tensors)``.

    Args (keyword; shapes as the public ``gdn_decode`` / ``kda_decode``):
        gate: ``"gdn"`` or ``"kda"``.
        q, k: ``[N, T, H, K]`` bf16/fp16/fp32 (last dim contiguous, else copied).
        v: ``[N, T, HV, V]``. a: GDN ``[N, T, HV]``, KDA ``[N, T, HV, K]``. b: ``[N, T, HV]``.
        A_log: ``[HV]``, dt_bias: GDN ``[HV]``, KDA ``[HV, K]``, has_initial_state, num_accepted_tokens
            and intermediate_state_indices: contiguous, as the public ops hand them over
            (``dispatch/rules/layouts.py`` copies views the backend does not declare in
            ``TritonBackend.input_strides``).
        state_pool: ``[P, HV, V, K]`` (``"vk"``) or ``[P, HV, K, V]`` (``"kv"``), fp32 or bf16,
            each slot contiguous; slot pitch ``stride(0)``. Updated in place.
        state_indices: ``[N]`` or ``[N, T]`` (per-token slot table), int32/int64. A row whose
            load slot is negative is padding (backends/torch_ref.py states the rule).
        scale: > 0 (None = ``K ** -0.5``). use_qk_l2norm: normalise q and k in the kernel.
        state_layout: ``"vk"`` or ``"kv"``.
        intermediate_states: ``[S, steps >= T, HV, <slot layout>]`` or None; receives the state
            after every token at row ``intermediate_state_indices[n]`` (``[N]``, negative = skip;
            None = row ``n``), row pitch ``stride(0)``.
        disable_state_update: leave the pool untouched.
        num_accepted_tokens: ``[N]`` (with a ``[N, T]`` table): load from the slot of token
            ``num_accepted - 1``; 0 = start from a zero state.
        softplus_beta, softplus_threshold, lower_bound: gate parameters (docs/ops.md).
        g, beta: the precomputed-gate form instead of ``a, b, A_log, dt_bias`` (None then): ``g``
            fp32 log decay shaped as ``a`` (floored at ``G_MIN`` in the kernel), ``beta`` shaped as
            ``b`` (already sigmoided); read through their strides as ``a`` and ``b`` are.
        has_initial_state: ``[N]`` bool or None: False starts the row from a zero state; the
            kernel's state load is masked (the slot is never read), stores are as usual.
        output_state_indices: ``[N]`` int32/int64 or None (with ``state_indices [N]``): the final
            state is stored to this slot (``HAS_OUT_SLOTS``: a second row pointer, the load slot
            only read); negative: no store. Contiguous.
        caps: DeviceCapabilities of the tensors' device. layout: ``split`` / ``folded``.
        block_v, num_warps: override the pinned tile config. config: a :class:`DecodeConfig` in place
            of the pinned one (:func:`decode_launch_config`, by the pool's dtype).
        state_eviction_policy: Triton's cache hint on the state tile's load and store (``""``: none,
            as shipped; ``"evict_first"`` / ``"evict_last"``: benchmarks' experiments).
    Raises:
        GridLimitError: the grid does not fit the device (before launch).
        ValueError: a head dim above 256, or state tiles that are not dense (the dispatcher's
            ``layout`` predicate rejects those first, so through the public ops this never fires).
    """

    def __init__(self, *, gate: str, caps, layout: str, block_v: Optional[int] = None,
                 num_warps: Optional[int] = None, config: Optional[DecodeConfig] = None, q, k, v, state_pool, state_indices, scale: Optional[float] = None,
                 use_qk_l2norm: bool = True, state_layout: str = "vk", intermediate_states=None,
                 disable_state_update: bool = False, num_accepted_tokens=None, softplus_beta: float = 1.0,
                 softplus_threshold: float = 20.0, lower_bound: Optional[float] = None, g=None,
                 has_initial_state=None, output_state_indices=None, state_eviction_policy: str = "",
                 **other_tensors):
        N, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        self.out_shape, self.out_dtype = (N, T, HV, V), q.dtype
        BK, pinned = decode_launch_config(K, V, N, gate, state_pool.dtype)
        #: what :meth:`with_rows` must find again for another N (None: the tile config was overridden)
        self.rows_class = None if block_v is not None or num_warps is not None or config is not None else (
            (K, V, gate, caps, layout, state_pool.dtype), (BK, pinned))
        cfg = (config or pinned)._replace(**{n: x for n, x in (("block_v", block_v), ("num_warps", num_warps))
                                             if x is not None})
        if cfg.blocks < 1 or cfg.block_v < 1 or cfg.state_vec < 0:
            raise ValueError(f"decode config {cfg}: block_v and blocks must be >= 1, state_vec >= 0")
        self.num_warps, BV = cfg.num_warps, cfg.block_v
        self.blocks = -(-V // (BV * cfg.blocks))  # programs per (sequence, value head)
        plan = plan_grid(N, HV, self.blocks, caps, layout)
        self.grid, self.skip = plan.grid, plan.empty or T == 0
        self.grid_constexprs = plan.constexprs
        self._check_state_tiles(state_pool, intermediate_states, state_layout, V, K)
        self.copy_qkv = q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1
        self.precomputed = g is not None
        self.copy_a = gate == "kda" and (g if self.precomputed else other_tensors["a"]).stride(-1) != 1
        self.per_token = state_indices.dim() == 2
        self.has_na = num_accepted_tokens is not None and self.per_token
        self.has_inter, self.has_init = intermediate_states is not None, has_initial_state is not None
        self.has_inter_idx = self.has_inter and other_tensors.get("intermediate_state_indices") is not None
        self.has_out = output_state_indices is not None and not self.per_token
        self.update_state = not disable_state_update
        self.scalars = (float(K ** -0.5 if scale is None else scale), float(softplus_beta),
                        float(softplus_threshold), float(lower_bound) if lower_bound is not None else 0.0, T)
        self.constexprs = dict(
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, GATE=gate, HAS_LOWER_BOUND=lower_bound is not None,
            USE_QK_L2NORM=bool(use_qk_l2norm), STATE_LAYOUT=state_layout, PER_TOKEN_SLOTS=self.per_token,
            HAS_NUM_ACCEPTED=self.has_na, HAS_INTER=self.has_inter, HAS_INTER_IDX=self.has_inter_idx,
            UPDATE_STATE=self.update_state, GATES_PRECOMPUTED=self.precomputed,
            HAS_INITIAL_STATE=self.has_init, HAS_OUT_SLOTS=self.has_out, **plan.constexprs)
        if state_eviction_policy:  # an experiment's cache hint on the state tile; shipped builds pass none
            self.constexprs["STATE_EVICTION"] = state_eviction_policy
        if cfg.blocks != 1:  # only where the config asks: the one-tile builds keep their constexprs
            self.constexprs["BLOCKS"] = cfg.blocks
        if cfg.state_vec:
            self.constexprs["STATE_VEC"] = cfg.state_vec
        if cfg.l2norm_one_pass:
            self.constexprs["L2NORM_ONE_PASS"] = True
        if cfg.decay_exp2:
            self.constexprs["DECAY_EXP2"] = True
        if cfg.maxnreg is not None:  # a compile option Triton takes among the keywords (as launch.launch_with)
            self.constexprs["maxnreg"] = cfg.maxnreg
        self.launch: Optional[PreparedLaunch] = None
        self._pick = self._operand_picker()
        if not self.skip:  # the strides of the tensors as the kernel gets them (after the row copies)
            strides = self._strides(self._operands(dict(other_tensors, q=q, k=k, v=v, g=g,
                                                        state_pool=state_pool, state_indices=state_indices,
                                                        intermediate_states=intermediate_states,
                                                        num_accepted_tokens=num_accepted_tokens,
                                                        has_initial_state=has_initial_state,
                                                        output_state_indices=output_state_indices), o=None))
            self.launch = PreparedLaunch(_recurrent_decode_kernel, self.grid, self.constexprs,
                                         (*self.scalars, *strides), num_warps=self.num_warps,
                                         num_stages=cfg.num_stages)

    @staticmethod
    def _check_state_tiles(state_pool, intermediate_states, state_layout: str, V: int, K: int) -> None:
        ps = state_pool.stride()
        inner = (V, K) if state_layout == "vk" else (K, V)
        if ps[3] != 1 or ps[2] != inner[1]:
            raise ValueError(f"state_pool slots must be contiguous in layout {state_layout!r} "
                             f"(shape {tuple(state_pool.shape)}, strides {tuple(ps)}); "
                             "pass a pool whose last two dims are contiguous (slot and head pitch may be any)")
        if intermediate_states is not None and intermediate_states.stride()[3:] != (inner[1], 1):
            raise ValueError("intermediate_states must be contiguous in its last two dims "
                             f"(strides {tuple(intermediate_states.stride())})")

    def _operand_picker(self) -> Optional[tuple]:
        """``(before o, after o)`` item getters of the kernel's tensor operands by argument name, for a
        call that needs no row copy and no byte view (the common case); None otherwise."""
        if self.copy_qkv or self.copy_a or self.has_init:
            return None
        a, b = ("g", "beta") if self.precomputed else ("a", "b")
        gates = (a, a) if self.precomputed else ("A_log", "dt_bias")
        idx = "state_indices"
        tail = ("state_pool", idx, "num_accepted_tokens" if self.has_na else idx,
                "intermediate_states" if self.has_inter else "state_pool",
                "intermediate_state_indices" if self.has_inter_idx else idx, idx,
                "output_state_indices" if self.has_out else idx)
        return operator.itemgetter("q", "k", "v", a, b, *gates), operator.itemgetter(*tail)

    def _operands(self, t: dict, o) -> tuple:
        """The kernel's 15 tensor operands, in its parameter order (operands a flag turns off get
        ``state_indices`` as an unread placeholder pointer)."""
        if self._pick is not None:
            head, tail = self._pick
            return (*head(t), o, *tail(t))
        q, k, v = t["q"], t["k"], t["v"]
        if self.copy_qkv:
            q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
        a, b = (t["g"], t["beta"]) if self.precomputed else (t["a"], t["b"])
        if self.copy_a:
            a = a.contiguous()  # [N, T, HV, K]: key channels contiguous (GDN a is strided freely)
        A_log, dt_bias = (a, a) if self.precomputed else (t["A_log"], t["dt_bias"])  # contiguous (class docstring)
        idx = t["state_indices"]
        init = t["has_initial_state"].view(torch.uint8) if self.has_init else idx  # [N] bytes, contiguous
        pool = t["state_pool"]
        inter = t["intermediate_states"] if self.has_inter else pool
        inter_idx = t["intermediate_state_indices"] if self.has_inter_idx else idx
        accepted = t["num_accepted_tokens"] if self.has_na else idx
        out_idx = t["output_state_indices"] if self.has_out else idx  # [N], contiguous (input_strides)
        return (q, k, v, a, b, A_log, dt_bias, o, pool, idx, accepted, inter, inter_idx, init, out_idx)

    def _strides(self, ops: tuple) -> tuple:
        q, k, v, a, b, _, _, _, pool, idx, _, inter, _, _, _ = ops
        qs, ks, vs, as_, bs, ss, ps = q.stride(), k.stride(), v.stride(), a.stride(), b.stride(), idx.stride(), pool.stride()
        s_inter = inter.stride()[:3] if self.has_inter else (0, 0, 0)
        return (qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], as_[0], as_[1], as_[2],
                bs[0], bs[1], bs[2], ps[0], ps[1], ss[0], ss[1] if self.per_token else 0, *s_inter)

    def with_rows(self, n: int) -> Optional["DecodeLaunch"]:
        """This launch for a batch of ``n`` rows of the same class (issue 28: a decode batch that
        changes from call to call), or None where ``n`` needs a plan of its own: another tile
        configuration (:func:`decode_launch_config`'s batch class and pool dtype), another grid layout, no launch.

        The kernel takes no argument that depends on N (the rows come from the grid; strides, ``T``
        and the scalars are the class's), so the copy differs in its grid and output shape only and
        shares the compiled kernels of this launch (:meth:`.launch.PreparedLaunch.with_grid`)."""
        if self.rows_class is None or self.launch is None or n < 1:
            return None
        (K, V, gate, caps, layout, state_dtype), config = self.rows_class
        if decode_launch_config(K, V, n, gate, state_dtype) != config:
            return None
        plan = plan_grid(n, self.constexprs["HV"], self.blocks, caps, layout)
        if plan.empty or plan.constexprs != self.grid_constexprs:
            return None
        new = copy.copy(self)
        new.grid, new.out_shape = plan.grid, (n, *self.out_shape[1:])
        new.launch = self.launch.with_grid(plan.grid)
        return new

    def __call__(self, tensors: dict) -> torch.Tensor:
        """Launch on ``tensors`` (the op's tensor arguments by name; more keys are ignored)."""
        o = tensors["q"].new_empty(self.out_shape)  # q's dtype and device
        if self.launch is not None:
            self.launch(self._operands(tensors, o))
        return o


class DecodeReplay:
    """The decode launches of one class of calls whose batch N changes from call to call (issue 28).

    Made from the class's first call (a :class:`DecodeLaunch`); a call with another N gets that
    launch's copy for its N (:meth:`DecodeLaunch.with_rows`: a new grid and output shape, the same
    compiled kernel), or a :class:`DecodeLaunch` of its own where its tile configuration differs
    (planned from its tensors and the first call's scalars). Calls must be of one class (the
    dispatcher's class key, ``dispatch/runtime/fast_path.py``: the same dtypes, strides, head dims, flags
    and scalars).

    Args: ``gate``, ``caps``, ``layout`` and the call's arguments, as :class:`DecodeLaunch`.
    """

    __slots__ = ("first", "n", "launches", "options", "tensors")
    #: serves every T and N of its call class (the dispatcher's class plans share it)
    serves_class = True

    def __init__(self, *, gate: str, caps, layout: str, **args):
        from linattn.dispatch.lru import DECODE_ROWS_MAX, LRUCache

        self.first = DecodeLaunch(gate=gate, caps=caps, layout=layout, **args)
        self.n = args["q"].shape[0]
        self.launches = LRUCache(DECODE_ROWS_MAX)
        self.tensors = tuple(n for n, x in args.items() if isinstance(x, torch.Tensor))
        self.options = dict({n: x for n, x in args.items() if not isinstance(x, torch.Tensor)},
                            gate=gate, caps=caps, layout=layout)

    def bind(self, tensors: dict) -> DecodeLaunch:
        """The launch for calls with the batch size of ``tensors`` (the op's tensor arguments by name)."""
        n = tensors["q"].shape[0]
        if n == self.n:
            return self.first
        run = self.launches.get(n)
        if run is None:
            run = self.first.with_rows(n)
            if run is None:
                run = DecodeLaunch(**self.options, **{k: tensors[k] for k in self.tensors})
            self.launches.put(n, run)
        return run

    def __call__(self, tensors: dict) -> torch.Tensor:
        """Launch on ``tensors`` (the op's tensor arguments by name; more keys are ignored)."""
        return self.bind(tensors)(tensors)
