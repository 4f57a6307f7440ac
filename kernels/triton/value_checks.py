"""The ops' value checks in one launch: one small Triton kernel per phase computes every flag.

``dispatch/rules/value_rules.py`` states the value rules (docs/ops.md). There each flag is a few torch
ops, a kernel launch apiece on a GPU. Here one kernel computes them all into ``int32`` bit sets
(bit ``i`` set: check ``i`` of the phase's check list failed), which the dispatcher reads in its
one sync; on a set bit it runs the torch rules, which raise the message of the first failing rule
(``dispatch/rules/value_rules.py`` :func:`fused_value_check`).

- **Decode** (:data:`CHECKS`, :func:`decode_value_flags_kernel`, one program): slots in range
  and, when the call writes the pool, no slot named by two sequences (``state_indices`` ``[N]`` or
  a per-token table ``[N, T]``, a row may repeat its own slot, negative entries are padding); the
  same for ``intermediate_state_indices`` against ``intermediate_states.shape[0]``;
  ``num_accepted_tokens`` in ``0..T``; finite shared gate parameters ``A_log`` and ``dt_bias``;
  precomputed ``g <= 0`` (not NaN). For the small index and parameter arrays of a decode call: at
  most :data:`MAX_PAIRWISE` entries in a table checked for shared slots, pair by pair, and at
  most :data:`MAX_ELEMENTS` elements in all; larger calls keep the torch rules.
- **Prefill** (:data:`PREFILL_CHECKS`, :func:`prefill_value_flags_kernel`, ``gdn_prefill`` and
  ``kda_prefill``): ``cu_seqlens [N + 1]`` starts at 0, never decreases and ends at ``T``;
  ``state_indices [N]`` (pool mode) below ``P`` (negative entries are padding) and no slot named
  by two sequences; ``g`` (``[T, HV]``, KDA ``[T, HV, K]``) ``<= 0`` and not NaN. Its operands
  grow with the prompt, so the work is spread over up to :data:`MAX_PROGRAMS` programs: program
  ``p`` of ``G`` reads blocks ``p, p + G, ...`` of each array (and rows of tiles ``p, p + G, ...``
  of the pairwise shared-slot check) and writes its own bits to ``flags[p]``; the host copies the
  ``G`` words in its one sync and ORs them. At most :data:`PREFILL_MAX_PAIRWISE` indices are
  checked pair by pair and at most :data:`MAX_STREAM` elements per array; larger calls keep the
  torch rules.

Each program writes its own word, so nothing has to be zeroed first and no atomics are needed.
"""

from __future__ import annotations

import functools
import operator
from typing import Optional

import torch
import triton
import triton.language as tl

from linattn.kernels.triton.launch import PreparedLaunch

#: The decode checks, in bit order.
CHECKS = ("state_indices range", "state_indices shared slot", "intermediate_state_indices range",
          "intermediate_state_indices shared row", "num_accepted_tokens range", "A_log finite",
          "dt_bias finite", "g <= 0")
#: The prefill checks, in bit order (the order of the torch rules, ``dispatch/rules/ops_table.py``).
PREFILL_CHECKS = ("cu_seqlens[0] == 0", "cu_seqlens non-decreasing", "cu_seqlens[-1] == T",
                  "state_indices range", "state_indices shared slot", "g <= 0")
#: Most entries of a decode index table checked pair by pair for shared slots (N * T): N^2 / 2 compares.
MAX_PAIRWISE = 1024
#: Most elements a decode check reads in all (the gate parameters and a precomputed g are streamed).
MAX_ELEMENTS = 1 << 16
#: Most prefill ``state_indices`` checked pair by pair for shared slots (N^2 / 2 compares, spread
#: over the programs by rows of tiles).
PREFILL_MAX_PAIRWISE = 4096
#: Most elements of one prefill array (``g``, ``cu_seqlens``, ``state_indices``): 32-bit offsets.
MAX_STREAM = (1 << 31) - (1 << 22)
#: Elements a prefill program streams at least, before another program is added.
STREAM_PER_PROGRAM = 1 << 15
#: Most programs of a prefill check (the host ORs one word per program).
MAX_PROGRAMS = 1024
BLOCK = 512
PREFILL_BLOCK = 1024
TILE = 32


@triton.jit
def _outside(x, n, cols, s0, s1, lo, hi, pid, nprog, HAS_LO: tl.constexpr, BLOCK: tl.constexpr):
    """1 if an entry of the ``n``-entry table ``x`` (``cols`` per row, strides ``s0``, ``s1``) is
    above ``hi`` (or, with ``HAS_LO``, below ``lo``); else 0. Program ``pid`` of ``nprog`` reads
    blocks ``pid, pid + nprog, ...``."""
    bad = 0
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        e = start + tl.arange(0, BLOCK)
        m = e < n
        v = tl.load(x + (e // cols).to(tl.int64) * s0 + (e % cols).to(tl.int64) * s1, mask=m, other=0)
        out = v > hi
        if HAS_LO:
            out = out | (v < lo)
        bad = tl.maximum(bad, tl.max((out & m).to(tl.int32), axis=0))
    return bad


@triton.jit
def _shared_slot(x, n, cols, s0, s1, pid, nprog, TILE: tl.constexpr):
    """1 if two rows of the table ``x`` name the same non-negative slot (a row may repeat its own).
    Program ``pid`` of ``nprog`` compares the tiles ``pid, pid + nprog, ...`` with those after them."""
    bad = 0
    for i0 in range(pid * TILE, n, nprog * TILE):
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
def _flagged(x, n, pid, nprog, NONFINITE: tl.constexpr, BLOCK: tl.constexpr):
    """1 if an element of the contiguous ``x`` is NaN or infinite (``NONFINITE``) or is not ``<= 0``
    (NaN included); else 0. Program ``pid`` of ``nprog`` reads blocks ``pid, pid + nprog, ...``."""
    bad = 0
    for start in range(pid * BLOCK, n, nprog * BLOCK):
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
def _decreasing(x, n, s, pid, nprog, BLOCK: tl.constexpr):
    """1 if ``x[e + 1] < x[e]`` for an ``e`` in ``0 .. n - 2`` (``x`` has ``n`` entries, stride
    ``s``); else 0. Program ``pid`` of ``nprog`` reads blocks ``pid, pid + nprog, ...``."""
    bad = 0
    for start in range(pid * BLOCK, n - 1, nprog * BLOCK):
        e = start + tl.arange(0, BLOCK)
        m = e < n - 1
        here = tl.load(x + e.to(tl.int64) * s, mask=m, other=0)
        after = tl.load(x + (e + 1).to(tl.int64) * s, mask=m, other=0)
        bad = tl.maximum(bad, tl.max(((after < here) & m).to(tl.int32), axis=0))
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
        bits |= _outside(idx, n_idx, idx_cols, s_idx0, s_idx1, 0, n_slots - 1, 0, 1, False, BLOCK)
    if IDX_SHARED:
        bits |= _shared_slot(idx, n_idx, idx_cols, s_idx0, s_idx1, 0, 1, TILE) << 1
    if INTER:
        bits |= _outside(inter_idx, n_inter, 1, s_inter, 0, 0, n_rows - 1, 0, 1, False, BLOCK) << 2
        bits |= _shared_slot(inter_idx, n_inter, 1, s_inter, 0, 0, 1, TILE) << 3
    if ACCEPTED:
        bits |= _outside(accepted, n_acc, 1, s_acc, 0, 0, T, 0, 1, True, BLOCK) << 4
    if GATE_PARAMS:
        bits |= _flagged(a_log, n_a_log, 0, 1, True, BLOCK) << 5
        bits |= _flagged(dt_bias, n_dt_bias, 0, 1, True, BLOCK) << 6
    if G:
        bits |= _flagged(g, n_g, 0, 1, False, BLOCK) << 7
    tl.store(flags, bits)


@triton.jit
def prefill_value_flags_kernel(
    cu, idx, g, flags,
    n_cu, s_cu, cu_last, T,
    n_idx, s_idx, n_slots,
    n_g,
    IDX: tl.constexpr, IDX_SHARED: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
):
    """Program ``pid`` of the grid ``(G,)`` writes the :data:`PREFILL_CHECKS` bits of its share of
    ``cu_seqlens`` (``n_cu`` entries, stride ``s_cu``, the last at element offset ``cu_last``),
    ``state_indices`` (``n_idx``, stride ``s_idx``, against ``n_slots``) and the contiguous ``g``
    (``n_g`` elements) to ``flags[pid]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bits = _outside(cu, 1, 1, s_cu, 0, 0, 0, 0, 1, True, BLOCK)  # every program: two loads
    bits |= _decreasing(cu, n_cu, s_cu, pid, nprog, BLOCK) << 1
    bits |= _outside(cu + cu_last, 1, 1, s_cu, 0, T, T, 0, 1, True, BLOCK) << 2
    if IDX:
        bits |= _outside(idx, n_idx, 1, s_idx, 0, 0, n_slots - 1, pid, nprog, False, BLOCK) << 3
    if IDX_SHARED:
        bits |= _shared_slot(idx, n_idx, 1, s_idx, 0, pid, nprog, TILE) << 4
    if G:
        bits |= _flagged(g, n_g, pid, nprog, False, BLOCK) << 5
    tl.store(flags + pid, bits)


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

    def __init__(self, args: dict, *, slots: int, rows: Optional[int], tokens: int, shared_slots: bool,
                 like: Optional["DecodeValueCheck"] = None):
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
        if like is not None and like.launch.constexprs == constexprs:  # another length of its class
            self.launch = like.launch.with_scalars(scalars)
        else:
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
                            shared_slots: bool, like: Optional[DecodeValueCheck] = None) -> Optional[DecodeValueCheck]:
    """A :class:`DecodeValueCheck` for a decode call, or None where the torch rules stay: a float
    array that is not contiguous (the kernel streams them flat), a table checked pair by pair of
    more than :data:`MAX_PAIRWISE` entries, more than :data:`MAX_ELEMENTS` elements in all.
    ``like``: the check of another length of the call's class, whose launch it derives from
    (``PreparedLaunch.with_scalars``: its compiled kernel where the scalars' specialization is the same)."""
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
    return DecodeValueCheck(args, slots=slots, rows=rows, tokens=tokens, shared_slots=shared_slots, like=like)


class PrefillValueCheck:
    """The prefill value checks of one call key (:data:`PREFILL_CHECKS`), planned from its metadata;
    ``check(args)`` launches :func:`prefill_value_flags_kernel` on a later call's tensors and returns
    the failed-check bits (one device sync).

    Args:
        args: the call's arguments by name: ``cu_seqlens [N + 1]`` (int32/int64, any stride),
            ``state_indices [N]`` (int32/int64, any stride; None in dense mode), ``g [T, HV]`` (KDA
            ``[T, HV, K]``, fp32/fp64, contiguous); others are ignored.
        slots: ``state_pool.shape[0]`` (P; unused without ``state_indices``). tokens: T.
        shared_slots: also refuse a slot named by two sequences (the call writes the pool).
        programs: the grid size G (:func:`plan_prefill_value_check` derives it).
    Use :func:`plan_prefill_value_check`, which returns None where the kernel does not apply.

    Example:
        >>> import torch
        >>> args = dict(cu_seqlens=torch.tensor([0, 2, 2, 5]), state_indices=torch.tensor([0, -1, 3]),
        ...             g=-torch.rand(5, 2))
        >>> check = plan_prefill_value_check(args, slots=4, tokens=5, shared_slots=True)
        >>> check(args), check(dict(args, state_indices=torch.tensor([0, 3, 3])))  # doctest: +SKIP
        (0, 16)
    """

    def __init__(self, args: dict, *, slots: int, tokens: int, shared_slots: bool, programs: int,
                 like: Optional["PrefillValueCheck"] = None):
        cu, idx, g = args["cu_seqlens"], args.get("state_indices"), args.get("g")
        has_idx, has_g = _present(idx), _present(g)
        n_cu, s_cu = cu.numel(), cu.stride(0)
        scalars = (n_cu, s_cu, (n_cu - 1) * s_cu, tokens,
                   idx.numel() if has_idx else 0, idx.stride(0) if has_idx else 0, slots or 0,
                   g.numel() if has_g else 0)
        constexprs = dict(IDX=has_idx, IDX_SHARED=shared_slots and has_idx and idx.numel() > 1, G=has_g,
                          BLOCK=PREFILL_BLOCK, TILE=TILE)
        self.programs = programs
        if like is not None and like.launch.constexprs == constexprs:  # another length of its class
            self.launch = like.launch.with_scalars(scalars, (programs,))
        else:
            self.launch = PreparedLaunch(prefill_value_flags_kernel, (programs,), constexprs, scalars, num_warps=4)
        # the kernel's operands by argument name; one it does not read gets cu_seqlens (always a tensor)
        self._pick = operator.itemgetter("cu_seqlens", "state_indices" if has_idx else "cu_seqlens",
                                         "g" if has_g else "cu_seqlens")

    def __call__(self, args: dict) -> int:
        """Launch on ``args``' tensors; the failed-check bits (0: every check passed). One sync."""
        flags = args["cu_seqlens"].new_empty(self.programs, dtype=torch.int32)
        self.launch((*self._pick(args), flags))
        if self.programs == 1:
            return flags.item()
        words = flags.cpu()  # the one device->host sync: one word per program
        return functools.reduce(operator.or_, words.tolist()) if bool(words.any()) else 0


def _prefill_programs(n_cu: int, n_idx: int, n_g: int, pairwise: bool) -> int:
    """The grid size G: one program per :data:`STREAM_PER_PROGRAM` elements of the longest array
    and per row of tiles of a pairwise check, at most :data:`MAX_PROGRAMS`."""
    per = STREAM_PER_PROGRAM
    want = max(1, -(-max(n_cu, n_idx, n_g) // per), -(-n_idx // TILE) if pairwise else 1)
    return min(want, MAX_PROGRAMS)


def plan_prefill_value_check(args: dict, *, slots: Optional[int], tokens: int,
                             shared_slots: bool, like: Optional[PrefillValueCheck] = None) -> Optional[PrefillValueCheck]:
    """A :class:`PrefillValueCheck` for a ``gdn_prefill`` / ``kda_prefill`` call, planned from
    metadata only (no values read, no sync).

    Args:
        args: the call's arguments by name: ``cu_seqlens [N + 1]`` int32/int64, ``state_indices [N]``
            int32/int64 or None (dense mode), ``g [T, HV]`` (KDA ``[T, HV, K]``) fp32/fp64.
        slots: ``state_pool.shape[0]`` (P), or None in dense mode. tokens: T (``q.shape[0]``).
        shared_slots: also refuse a slot named by two sequences (the call writes the pool).
        like: the check of another length of the call's class, whose launch it derives from
            (``PreparedLaunch.with_scalars``: its compiled kernel where the scalars' specialization is the same).

    Returns:
        The check, or None where the torch rules stay: ``cu_seqlens`` or ``state_indices`` not
        1-D, a ``g`` that is not contiguous (the kernel streams it flat), more than
        :data:`PREFILL_MAX_PAIRWISE` indices checked pair by pair, an array of more than
        :data:`MAX_STREAM` elements. Raises nothing itself; the check's caller raises the torch
        rules' ``ValueError`` (``dispatch/rules/value_rules.py``).
    """
    cu, idx, g = args.get("cu_seqlens"), args.get("state_indices"), args.get("g")
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() == 0:
        return None
    if idx is not None and (not isinstance(idx, torch.Tensor) or idx.dim() != 1):
        return None
    if _present(g) and not g.is_contiguous():
        return None
    n_idx, n_g = (idx.numel() if _present(idx) else 0), (g.numel() if _present(g) else 0)
    pairwise = shared_slots and n_idx > 1
    if (pairwise and n_idx > PREFILL_MAX_PAIRWISE) or max(cu.numel(), n_idx, n_g) > MAX_STREAM:
        return None
    programs = _prefill_programs(cu.numel(), n_idx, n_g, pairwise)
    return PrefillValueCheck(args, slots=slots or 0, tokens=tokens, shared_slots=shared_slots, programs=programs,
                             like=like)
