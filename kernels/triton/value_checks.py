"""The decode ops' value checks in one launch: one small Triton kernel computes every flag.

``dispatch/value_rules.py`` states the decode value rules (docs/ops.md): slots in range and, when
the call writes the pool, no slot named by two sequences (``state_indices`` ``[N]`` or a per-token
table ``[N, T]``, a row may repeat its own slot, negative entries are padding); the same for
``intermediate_state_indices`` against ``intermediate_states.shape[0]``; ``num_accepted_tokens``
in ``0..T``; finite shared gate parameters ``A_log`` and ``dt_bias``; precomputed ``g <= 0`` (not
NaN). There each flag is a few torch ops, a kernel launch apiece on a GPU. Here one program
computes them all into one ``int32`` (bit ``i`` set: check ``i`` of :data:`CHECKS` failed), which
the dispatcher reads in its one sync; on a set bit it runs the torch rules, which raise the
message of the first failing rule (``dispatch/value_rules.py`` :func:`fused_value_check`).

One program, so nothing has to be zeroed first and no atomics are needed: the checks are for
the small index and parameter arrays of a decode call (at most :data:`MAX_PAIRWISE` entries in a
table checked for shared slots, pair by pair; at most :data:`MAX_ELEMENTS` elements in all);
larger calls keep the torch rules.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import triton
import triton.language as tl

from linattn.kernels.triton.launch import PreparedLaunch

#: The checks, in bit order.
CHECKS = ("state_indices range", "state_indices shared slot", "intermediate_state_indices range",
          "intermediate_state_indices shared row", "num_accepted_tokens range", "A_log finite",
          "dt_bias finite", "g <= 0")
#: Most entries of an index table checked pair by pair for shared slots (N * T): N^2 / 2 compares.
MAX_PAIRWISE = 1024
#: Most elements read in all (the gate parameters and a precomputed g are streamed).
MAX_ELEMENTS = 1 << 16
BLOCK = 512
TILE = 32


@triton.jit
def _outside(x, n, cols, s0, s1, lo, hi, HAS_LO: tl.constexpr, BLOCK: tl.constexpr):
    """1 if an entry of the ``n``-entry table ``x`` (``cols`` per row, strides ``s0``, ``s1``) is
    above ``hi`` (or, with ``HAS_LO``, below ``lo``); else 0."""
    bad = 0
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        m = e < n
        v = tl.load(x + (e // cols).to(tl.int64) * s0 + (e % cols).to(tl.int64) * s1, mask=m, other=0)
        out = v > hi
        if HAS_LO:
            out = out | (v < lo)
        bad = tl.maximum(bad, tl.max((out & m).to(tl.int32), axis=0))
    return bad


@triton.jit
def _shared_slot(x, n, cols, s0, s1, TILE: tl.constexpr):
    """1 if two rows of the table ``x`` name the same non-negative slot (a row may repeat its own)."""
    bad = 0
    for i0 in range(0, n, TILE):
        ei = i0 + tl.arange(0, TILE)
        ri = ei // cols
        vi = tl.load(x + ri.to(tl.int64) * s0 + (ei % cols).to(tl.int64) * s1, mask=ei < n, other=-1)
        for j0 in range(i0, n, TILE):
            ej = j0 + tl.arange(0, TILE)
            rj = ej // cols
            vj = tl.load(x + rj.to(tl.int64) * s0 + (ej % cols).to(tl.int64) * s1, mask=ej < n, other=-1)
            hit = (vi[:, None] == vj[None, :]) & (ri[:, None] != rj[None, :]) & (vi[:, None] >= 0)
            bad = tl.maximum(bad, tl.max(tl.max(hit.to(tl.int32), axis=1), axis=0))
    return bad


@triton.jit
def _flagged(x, n, NONFINITE: tl.constexpr, BLOCK: tl.constexpr):
    """1 if an element of the contiguous ``x`` is NaN or infinite (``NONFINITE``) or is not ``<= 0``
    (NaN included); else 0."""
    bad = 0
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        m = e < n
        v = tl.load(x + e, mask=m, other=0)
        if NONFINITE:
            out = (v != v) | (tl.abs(v) == float("inf"))
        else:
            out = (v <= 0) == 0
        bad = tl.maximum(bad, tl.max((out & m).to(tl.int32), axis=0))
    return bad


@triton.jit
def decode_value_flags_kernel(
    idx, inter_idx, accepted, a_log, dt_bias, g, flags,
    n_idx, idx_cols, s_idx0, s_idx1, n_slots,
    n_inter, s_inter, n_rows,
    n_acc, s_acc, T,
    n_a_log, n_dt_bias, n_g,
    IDX: tl.constexpr, IDX_SHARED: tl.constexpr, INTER: tl.constexpr, ACCEPTED: tl.constexpr,
    GATE_PARAMS: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
):
    bits = 0
    if IDX:
        bits |= _outside(idx, n_idx, idx_cols, s_idx0, s_idx1, 0, n_slots - 1, False, BLOCK)
    if IDX_SHARED:
        bits |= _shared_slot(idx, n_idx, idx_cols, s_idx0, s_idx1, TILE) << 1
    if INTER:
        bits |= _outside(inter_idx, n_inter, 1, s_inter, 0, 0, n_rows - 1, False, BLOCK) << 2
        bits |= _shared_slot(inter_idx, n_inter, 1, s_inter, 0, TILE) << 3
    if ACCEPTED:
        bits |= _outside(accepted, n_acc, 1, s_acc, 0, 0, T, True, BLOCK) << 4
    if GATE_PARAMS:
        bits |= _flagged(a_log, n_a_log, True, BLOCK) << 5
        bits |= _flagged(dt_bias, n_dt_bias, True, BLOCK) << 6
    if G:
        bits |= _flagged(g, n_g, False, BLOCK) << 7
    tl.store(flags, bits)


def _present(x) -> bool:
    return isinstance(x, torch.Tensor) and x.numel() > 0


class DecodeValueCheck:
    """The decode value checks of one call key, planned from its metadata; ``check(args)`` launches
    the kernel on a later call's tensors and returns the failed-check bits (one device sync).

    Args:
        args: the call's arguments by name (``state_indices``, ``intermediate_state_indices``,
            ``num_accepted_tokens``, ``A_log``, ``dt_bias``, ``g``; others are ignored).
        slots: ``state_pool.shape[0]`` (P). rows: ``intermediate_states.shape[0]`` (S) or None.
        tokens: T. shared_slots: also refuse a slot named by two sequences (the call writes the pool).
    Use :func:`plan_decode_value_check`, which returns None where the kernel does not apply.
    """

    def __init__(self, args: dict, *, slots: int, rows: Optional[int], tokens: int, shared_slots: bool):
        idx, inter, acc = args["state_indices"], args.get("intermediate_state_indices"), args.get("num_accepted_tokens")
        a_log, dt_bias, g = args.get("A_log"), args.get("dt_bias"), args.get("g")
        has_inter, has_acc, has_gates, has_g = _present(inter), _present(acc), _present(a_log), _present(g)
        s_idx = idx.stride() if idx.dim() == 2 else (idx.stride(0), 0)
        scalars = (idx.numel(), idx.shape[1] if idx.dim() == 2 else 1, *s_idx, slots,
                   inter.numel() if has_inter else 0, inter.stride(0) if has_inter else 0, rows or 0,
                   acc.numel() if has_acc else 0, acc.stride(0) if has_acc else 0, tokens,
                   a_log.numel() if has_gates else 0, dt_bias.numel() if has_gates else 0, g.numel() if has_g else 0)
        constexprs = dict(IDX=_present(idx), IDX_SHARED=shared_slots and _present(idx) and idx.shape[0] > 1,
                          INTER=has_inter, ACCEPTED=has_acc, GATE_PARAMS=has_gates, G=has_g, BLOCK=BLOCK, TILE=TILE)
        self.launch = PreparedLaunch(decode_value_flags_kernel, (1,), constexprs, scalars, num_warps=4)
        # the kernel's operands by argument name; one it does not read gets state_indices (always a tensor)
        given = (True, has_inter, has_acc, has_gates, has_gates, has_g)
        names = ("state_indices", "intermediate_state_indices", "num_accepted_tokens", "A_log", "dt_bias", "g")
        self._pick = operator.itemgetter(*[n if on else "state_indices" for n, on in zip(names, given)])

    def __call__(self, args: dict) -> int:
        """Launch on ``args``' tensors; the failed-check bits (0: every check passed). One sync."""
        idx = args["state_indices"]
        flags = idx.new_empty(1, dtype=torch.int32)
        self.launch((*self._pick(args), flags))
        return flags.item()


def plan_decode_value_check(args: dict, *, slots: int, rows: Optional[int], tokens: int,
                            shared_slots: bool) -> Optional[DecodeValueCheck]:
    """A :class:`DecodeValueCheck` for a decode call, or None where the torch rules stay: a float
    array that is not contiguous (the kernel streams them flat), a table checked pair by pair of
    more than :data:`MAX_PAIRWISE` entries, more than :data:`MAX_ELEMENTS` elements in all."""
    idx = args["state_indices"]
    if not isinstance(idx, torch.Tensor) or idx.dim() > 2:
        return None
    floats = [args.get(n) for n in ("A_log", "dt_bias", "g")]
    if any(_present(x) and not x.is_contiguous() for x in floats):
        return None
    inter = args.get("intermediate_state_indices")
    if idx.numel() > MAX_PAIRWISE or (_present(inter) and (inter.dim() != 1 or inter.numel() > MAX_PAIRWISE)):
        return None
    acc = args.get("num_accepted_tokens")
    if _present(acc) and acc.dim() != 1:
        return None
    if sum(x.numel() for x in floats if _present(x)) > MAX_ELEMENTS:
        return None
    return DecodeValueCheck(args, slots=slots, rows=rows, tokens=tokens, shared_slots=shared_slots)
