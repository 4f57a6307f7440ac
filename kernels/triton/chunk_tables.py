"""The chunked prefill's chunk index tables in one Triton launch (no host sync, no global atomics).

Sequence ``n`` of ``cu_seqlens`` holds ``ceil(len_n / 64)`` chunks of 64 tokens; chunks never cross
sequences. The tables say, for every chunk ``c`` up to the bound ``NT_max = T // 64 + N``, which
sequence owns it and at which token it starts (see :func:`chunk_tables_triton`).

Each program owns ``BC`` consecutive chunks ``c`` (from ``c_lo``) and scans the sequences in blocks
of ``BNO``: the chunk counts' block prefix sum (plus the carry of the blocks before) gives each
sequence's end ``e_n = chunk_off[n + 1]``. Since the ends never decrease,
``seq(c) = #{n : e_n <= c}`` (``searchsorted(chunk_off[1:], c, right=True)``) and
``chunk_off[seq(c)] = max{e_n : e_n <= c}`` (0 if none); zero-length sequences need no special
case (their end equals the next one's start). Chunks past the real count (``seq = N``) take their
start from sequence ``N - 1``, as the torch version's clamp does, so the maximum leaves out
``e_{N-1}``: it is ``chunk_off[min(seq, N - 1)]``.

Per block, the ends before ``c_lo`` add their count and their maximum to every chunk of the
program; the ends inside its chunks add, to the chunks from their own on, a histogram of
``e_n - c_lo`` (running sum: the count; running maximum of the chunks hit: the offset); the later
ends add nothing, and once a block starts after the program's last chunk the program stops.
Leading blocks whose sequences all end before ``c_lo`` by the bound
``chunk_off[n] <= (cu[n] - cu[0] + 63 n) // 64`` (read from ``cu_seqlens`` alone) are skipped
first: only their chunk count is summed, with no scan or synchronisation per step. Every program
writes ``chunk_off`` for the blocks it scans (identical values where two do): the program holding
a block's first chunk index scans that block. No global atomics (``tl.histogram`` counts with
shared-memory integer adds inside a program: exact and order-free), no host sync; every entry is
a pure function of ``cu_seqlens``, bitwise equal to
:func:`chunk_tables` (the torch version, below with this module's launchers).

Its cost against the torch version's, by batch shape: docs/performance.md#prefill-chunk-tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .launch import launch

if TYPE_CHECKING:
    from .prefill.plan import PrefillPlan

CHUNK = 64
_CHUNK: tl.constexpr = tl.constexpr(CHUNK)  # the kernel's copy (jit code reads constexpr globals only)
#: chunks per program, sequences per scanned block, block boundaries tested for the skip, sequences
#: per step of the skipped blocks' sum, warps
BC, BNO, NSKIP, BSUM, NUM_WARPS = 128, 1024, 256, 2048, 8


@triton.jit
def _imax(a, b):
    """Combine function of a running maximum (``tl.associative_scan``)."""
    return tl.maximum(a, b)


@triton.jit
def chunk_tables_kernel(cu_ptr, off_ptr, seq_ptr, start_ptr, N, N_LAST, NT_MAX,
                        BC: tl.constexpr, BNO: tl.constexpr, NSKIP: tl.constexpr, BSUM: tl.constexpr):
    """Program ``pid`` writes ``chunk_seq`` / ``chunk_start`` for chunks ``pid*BC .. pid*BC+BC-1``
    (those below ``NT_MAX``) and ``chunk_off`` for the sequence blocks it scans (every block is
    scanned by the program holding the block's first chunk index, or by the last program).

    ``cu_ptr``: ``[N+1]`` int32/int64 cu_seqlens; ``off_ptr``: ``[N+1]`` int64; ``seq_ptr``:
    ``[NT_MAX]`` int32; ``start_ptr``: ``[NT_MAX]`` int64; ``N_LAST = max(N - 1, 0)``. Chunk indices
    are int32 (the host checks ``NT_MAX + BC < 2**31``), token offsets int64. Chunk counts
    ``ceil(len / 64)`` are ``(len + 63) >> 6`` (an arithmetic shift: floor division, as torch's
    ``//``). ``NSKIP``: block boundaries tested for the skip; ``BSUM``: sequences per step of the
    skipped blocks' sum."""
    pid = tl.program_id(0)
    last_pid = tl.num_programs(0) - 1
    c_lo = pid * BC
    c_hi = c_lo + (BC - 1)
    j = tl.arange(0, BC)
    seq = tl.zeros([BC], dtype=tl.int32)  # #{n : e_n <= c}
    off = tl.zeros([BC], dtype=tl.int32)  # max{e_n : e_n <= c, n < N - 1} = chunk_off[min(seq, N - 1)]
    carry = c_lo * 0                      # chunks of the sequences before block n0 (chunk_off[n0])
    n0 = c_lo * 0
    if pid == 0:
        tl.store(off_ptr + tl.arange(0, 1), tl.zeros([1], dtype=tl.int64))
    if N > BNO:
        # skip the leading blocks whose sequences all end before chunk c_lo, found from cu_seqlens
        # alone: chunk_off[n] <= (cu[n] - cu[0] + 63 n) // 64, so that bound below c_lo suffices
        # (n <= N - 1 keeps the clamp of the chunks past the real count out of it)
        nbd = (1 + tl.arange(0, NSKIP)) * BNO
        okb = nbd <= N_LAST
        bound = (tl.load(cu_ptr + nbd, mask=okb, other=0).to(tl.int64) - tl.load(cu_ptr).to(tl.int64)
                 + (_CHUNK - 1) * nbd.to(tl.int64))
        n0 = tl.sum((okb & (bound < _CHUNK * c_lo.to(tl.int64))).to(tl.int32), 0) * BNO
        acc = tl.zeros([BSUM], dtype=tl.int32)
        for s0 in range(0, n0, BSUM):  # their chunk count: a plain sum (no scan, no sync per step)
            ns = s0 + tl.arange(0, BSUM)
            ms = ns < n0
            lo = tl.load(cu_ptr + ns, mask=ms, other=0).to(tl.int64)
            hi = tl.load(cu_ptr + ns + 1, mask=ms, other=0).to(tl.int64)
            acc += tl.where(ms, (hi - lo + (_CHUNK - 1)) >> 6, 0).to(tl.int32)
        carry = tl.sum(acc, 0)
        seq += n0
        off = tl.maximum(off, carry)
    # past a block that starts after chunk c_hi no sequence can end at or before a chunk of this
    # program: stop there (the last program scans on: it writes chunk_off for such blocks)
    while (n0 < N) & ((carry <= c_hi) | (pid == last_pid)):
        nb = n0 + tl.arange(0, BNO)
        mb = nb < N
        lo = tl.load(cu_ptr + nb, mask=mb, other=0).to(tl.int64)
        hi = tl.load(cu_ptr + nb + 1, mask=mb, other=0).to(tl.int64)
        nck = tl.where(mb, (hi - lo + (_CHUNK - 1)) >> 6, 0).to(tl.int32)
        end = carry + tl.cumsum(nck, 0)
        tl.store(off_ptr + nb + 1, end.to(tl.int64), mask=mb)
        # the ends never decrease: those before the program's first chunk count for all its chunks,
        # those inside its chunks (the histogram of end - c_lo) for the chunks from there on
        below = mb & (end < c_lo)
        seq += tl.sum(below.to(tl.int32), 0)
        off = tl.maximum(off, tl.max(tl.where(below & (nb < N_LAST), end, 0), 0))
        mid = mb & (end >= c_lo) & (end <= c_hi)
        bin = tl.where(mid, end - c_lo, 0)  # in range on every lane, masked or not
        seq += tl.cumsum(tl.histogram(bin, BC, mask=mid), 0)
        hit = tl.histogram(bin, BC, mask=mid & (nb < N_LAST)) > 0  # some n < N - 1 ends at chunk c
        off = tl.maximum(off, tl.associative_scan(tl.where(hit, c_lo + j, 0), 0, _imax))
        carry = tl.max(end, 0)  # the masked tail holds the last end
        n0 += BNO
    c = c_lo + j
    mc = c < NT_MAX
    first = tl.load(cu_ptr + tl.minimum(seq, N_LAST), mask=mc, other=0).to(tl.int64)
    tl.store(seq_ptr + c, seq, mask=mc)
    tl.store(start_ptr + c, first + _CHUNK * (c - off).to(tl.int64), mask=mc)


def chunk_tables_triton(cu_seqlens: torch.Tensor, T: int):
    """Chunk index tables of the chunked prefill, in one Triton launch with no host sync.

    Args:
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of the sequence lengths (zero lengths allowed
            anywhere), on the device the tables are wanted on (CPU under ``TRITON_INTERPRET=1``).
        T: total tokens (``cu_seqlens[-1]``, known from the shapes: no sync reads it).
    Returns:
        ``(chunk_off [N+1] int64, chunk_seq [NT_max] int32, chunk_start [NT_max] int64, NT_max)``:
        sequence ``n`` owns chunks ``chunk_off[n] .. chunk_off[n+1]-1``; chunk ``c`` starts at token
        ``chunk_start[c]`` of sequence ``chunk_seq[c]``; entries past the real count hold
        ``chunk_seq = N`` and ``chunk_start = cu_seqlens[N-1] + 64 * (c - chunk_off[N-1])`` (the
        kernels skip them). ``NT_max = T // 64 + N`` (a host int) bounds the count. Bitwise equal to
        :func:`chunk_tables` (the torch version), N = 0 included.
    Raises:
        ValueError: ``cu_seqlens`` is not a 1-D int32/int64 tensor with at least one entry; more than
            ``2**31 - 129`` chunks (``T >= 2**37`` tokens: chunk indices are int32 in the kernel).
    Source: ops.md "Chunked form" (chunks of 64 tokens that never cross a sequence); the kernel's
    method is in this module's docstring.
    Example:
        >>> off, seq, start, nt = chunk_tables_triton(torch.tensor([0, 1, 1, 130]), 130)
        >>> off.tolist(), seq.tolist(), start.tolist(), nt
        ([0, 1, 1, 4], [0, 2, 2, 2, 3], [0, 1, 65, 129, 193], 5)
    """
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be a 1-D int32/int64 tensor [N+1] with N >= 0; got shape "
                         f"{tuple(cu_seqlens.shape)}, dtype {cu_seqlens.dtype}")
    cu = cu_seqlens if cu_seqlens.is_contiguous() else cu_seqlens.contiguous()
    N = cu.numel() - 1
    nt_max = T // CHUNK + N
    if nt_max + BC >= 2**31:
        raise ValueError(f"T // 64 + N = {nt_max} chunks: the chunk tables count chunks in int32 "
                         f"(at most {2**31 - 1 - BC}); split the batch")
    dev = cu.device
    chunk_off = torch.empty(N + 1, dtype=torch.int64, device=dev)
    chunk_seq = torch.empty(nt_max, dtype=torch.int32, device=dev)
    chunk_start = torch.empty(nt_max, dtype=torch.int64, device=dev)
    grid = (max(1, triton.cdiv(nt_max, BC)),)  # program 0 writes chunk_off even when NT_max = 0
    launch(chunk_tables_kernel, grid, (cu, chunk_off, chunk_seq, chunk_start, N, max(N - 1, 0), nt_max),
           dict(BC=BC, BNO=BNO, NSKIP=NSKIP, BSUM=BSUM), num_warps=NUM_WARPS)
    return chunk_off, chunk_seq, chunk_start, nt_max


#: sequences and segments per step of :func:`segment_tables_kernel` (one program)
SEG_BN, SEG_BS = 256, 256


@triton.jit
def segment_tables_kernel(cu_ptr, off_ptr, slot_ptr, seg_cu_ptr, seg_off_ptr, seg_first_ptr, seg_slot_ptr,
                          N, T, L, NSEG, NITER, HAS_SLOT: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr):
    """The segment-parallel state pass's tables in one program (the pass runs only where the
    state grid is small, so ``N`` is small; any ``N`` is correct). Phase 1: ``seg_first [N+1]``
    int64, the prefix sums of ``ceil(nc_n / L)`` with ``nc_n = chunk_off[n+1] - chunk_off[n]``.
    Phase 2, per segment ``j < NSEG``: its sequence ``n = #{m : seg_first[m+1] <= j}`` by a binary
    search of ``NITER = ceil(log2(N + 1))`` steps (``N`` past the real count), ``i = j -
    seg_first[n]``; ``seg_cu[j] = cu[n] + 64 i L`` (``T`` past the real count; ``seg_cu[NSEG] =
    T``), ``seg_off[j] = chunk_off[n] + i L``, ``seg_slot[j] = state_indices[n]`` (-1 past the real
    count; ``HAS_SLOT``). Bitwise the tables of ``prefill.segment_tables_torch``."""
    tl.store(seg_first_ptr + tl.arange(0, 1), tl.zeros([1], dtype=tl.int64))
    carry = tl.zeros([1], dtype=tl.int64)
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)
        m = n < N
        nck = tl.load(off_ptr + n + 1, mask=m, other=0) - tl.load(off_ptr + n, mask=m, other=0)
        cnt = (nck + (L - 1)) // L
        incl = tl.cumsum(cnt, axis=0) + tl.sum(carry, axis=0)
        tl.store(seg_first_ptr + n + 1, incl, mask=m)
        carry += tl.sum(cnt, axis=0)
    tl.debug_barrier()  # phase 2 reads seg_first back
    n_last = tl.maximum(N - 1, 0)
    for j0 in range(0, NSEG, BS):
        j = (j0 + tl.arange(0, BS)).to(tl.int64)
        lo = tl.zeros([BS], dtype=tl.int64)
        hi = tl.zeros([BS], dtype=tl.int64) + N
        for _ in range(NITER):  # smallest n in [0, N] with seg_first[n + 1] > j (N: none)
            mid = (lo + hi) // 2
            ends = tl.load(seg_first_ptr + mid + 1, mask=mid < N, other=0)
            right = (mid < N) & (ends <= j)
            lo = tl.where(right & (lo < hi), mid + 1, lo)
            hi = tl.where(right | (lo >= hi), hi, mid)
        real = lo < N
        nc = tl.minimum(lo, n_last)
        i = j - tl.load(seg_first_ptr + nc)
        inside = j < NSEG
        start = tl.load(cu_ptr + nc).to(tl.int64) + i * (L * 64)
        tl.store(seg_cu_ptr + j, tl.where(real, start, T), mask=inside)
        tl.store(seg_off_ptr + j, tl.load(off_ptr + nc) + i * L, mask=inside)
        if HAS_SLOT:
            tl.store(seg_slot_ptr + j, tl.where(real, tl.load(slot_ptr + nc).to(tl.int64), -1), mask=inside)
    tl.store(seg_cu_ptr + NSEG + tl.arange(0, 1), tl.zeros([1], dtype=tl.int64) + T)


# -- the host side: the torch tables and the launchers ------------------------------------

class ChunkTables(NamedTuple):
    """``chunk_off [N+1]`` int64, ``chunk_seq [NT_max]`` int32, ``chunk_start [NT_max]`` int64
    (:func:`chunk_tables`, :func:`launch_tables`)."""

    chunk_off: torch.Tensor
    chunk_seq: torch.Tensor
    chunk_start: torch.Tensor


def chunk_tables(cu_seqlens: torch.Tensor, T: int):
    """Chunk index tables, built on the device with no host sync (torch ops).

    Args:
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of the sequence lengths.
        T: total tokens (``cu_seqlens[-1]``, known from the shapes).
    Returns:
        ``(chunk_off [N+1] int64, chunk_seq [NT_max] int32, chunk_start [NT_max] int64, NT_max)``:
        sequence ``n`` owns chunks ``chunk_off[n] .. chunk_off[n+1]-1``; chunk ``c`` starts at token
        ``chunk_start[c]`` of sequence ``chunk_seq[c]``; entries past the real count hold
        ``chunk_seq = N`` (the kernels skip them). ``NT_max = T // 64 + N`` bounds the count.
    """
    cu = cu_seqlens.to(torch.int64)
    N = cu.numel() - 1
    nck = (cu[1:] - cu[:-1] + CHUNK - 1) // CHUNK
    chunk_off = torch.zeros(N + 1, dtype=torch.int64, device=cu.device)
    torch.cumsum(nck, 0, out=chunk_off[1:])
    nt_max = T // CHUNK + N
    c = torch.arange(nt_max, dtype=torch.int64, device=cu.device)
    seq = torch.searchsorted(chunk_off[1:], c, right=True)  # N for c >= real count
    seq_c = seq.clamp(max=max(N - 1, 0))
    start = cu[seq_c] + CHUNK * (c - chunk_off[seq_c])
    return chunk_off, seq.to(torch.int32), start, nt_max


def launch_tables(plan: PrefillPlan, cu_seqlens: torch.Tensor) -> ChunkTables:
    """Stage 0: the chunk index tables (:func:`.chunk_tables.chunk_tables_triton`, or torch ops past
    :data:`.prefill.plan.TABLES_TRITON_MAX_N` sequences)."""
    tables = chunk_tables_triton if plan.triton_tables else chunk_tables
    chunk_off, chunk_seq, chunk_start, _ = tables(cu_seqlens, plan.T)
    return ChunkTables(chunk_off, chunk_seq, chunk_start)


class SegmentTables(NamedTuple):
    """The segments of one call (:func:`segment_tables`): ``seg_cu [NSEG+1]`` int64, the segments'
    token bounds as a prefix array (segments past the real count are empty, at ``T``);
    ``seg_chunk_off [NSEG]`` int64, each segment's first chunk; ``seg_first [N+1]`` int64, sequence
    ``n`` owns segments ``seg_first[n] .. seg_first[n+1] - 1``; ``seg_slot [NSEG]`` int64 (pool mode:
    the segment's state index, -1 past the real count; else None)."""

    seg_cu: torch.Tensor
    seg_chunk_off: torch.Tensor
    seg_first: torch.Tensor
    seg_slot: Optional[torch.Tensor]


def segment_tables(plan: PrefillPlan, cu_seqlens: torch.Tensor, chunk_off: torch.Tensor,
                   state_indices: Optional[torch.Tensor]) -> SegmentTables:
    """The segments of a call, on the device with no host sync, in one launch
    (:func:`.chunk_tables.segment_tables_kernel`): sequence ``n`` of ``nc_n`` chunks is cut into
    ``ceil(nc_n / L)`` segments of ``L = plan.segment_chunks`` chunks, on its own chunk grid (the
    last one may be shorter, its last chunk short); a zero-length sequence has none. Returns
    :class:`SegmentTables` over the bound ``plan.n_segments``, bitwise those of
    :func:`segment_tables_torch`."""
    N, nseg, dev = plan.N, plan.n_segments, cu_seqlens.device
    seg_cu = torch.empty(nseg + 1, dtype=torch.int64, device=dev)
    seg_off = torch.empty(nseg, dtype=torch.int64, device=dev)
    seg_first = torch.empty(N + 1, dtype=torch.int64, device=dev)
    seg_slot = None if state_indices is None else torch.empty(nseg, dtype=torch.int64, device=dev)
    launch(segment_tables_kernel, (1,),
           (cu_seqlens, chunk_off, state_indices, seg_cu, seg_off, seg_first, seg_slot, N, plan.T,
            plan.segment_chunks, nseg, max(1, N.bit_length())),
           dict(HAS_SLOT=state_indices is not None, BN=SEG_BN, BS=SEG_BS), num_warps=4)
    return SegmentTables(seg_cu, seg_off, seg_first, seg_slot)


def segment_tables_torch(plan: PrefillPlan, cu_seqlens: torch.Tensor, chunk_off: torch.Tensor,
                         state_indices: Optional[torch.Tensor]) -> SegmentTables:
    """:func:`segment_tables` in torch ops (the tests' reference for the kernel)."""
    L, T, N, nseg = plan.segment_chunks, plan.T, plan.N, plan.n_segments
    dev = cu_seqlens.device
    cu = cu_seqlens.to(torch.int64)
    per_seq = (chunk_off[1:] - chunk_off[:-1] + (L - 1)) // L
    seg_first = torch.zeros(N + 1, dtype=torch.int64, device=dev)
    torch.cumsum(per_seq, 0, out=seg_first[1:])
    j = torch.arange(nseg, dtype=torch.int64, device=dev)
    n = torch.searchsorted(seg_first[1:], j, right=True)  # N past the real count
    real = n < N
    nc = n.clamp(max=N - 1)
    i = j - seg_first[nc]
    seg_cu = torch.full((nseg + 1,), T, dtype=torch.int64, device=dev)
    seg_cu[:-1] = torch.where(real, cu[nc] + i * (L * CHUNK), T)
    seg_chunk_off = chunk_off[nc] + i * L
    slot = None
    if state_indices is not None:
        slot = torch.where(real, state_indices.to(torch.int64)[nc], -1)
    return SegmentTables(seg_cu, seg_chunk_off, seg_first, slot)
