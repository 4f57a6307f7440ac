"""The program-id contract shared by every Triton kernel of linattn.

The ``@triton.jit`` helper :func:`decode_pid` turns the program's coordinates on the launch grid
into a work item ``(i_blk, i_n, i_h)`` (value or column block, sequence or row, head) for every
layout that :func:`linattn.kernels.grid.plan_grid` produces. A kernel passes the plan's
``constexprs`` straight through (``LAYOUT``, ``AX_SEQ``, ``AX_HEAD``, ``AX_BLK``), so the launch
grid and the decoding can never drift apart; the contract test checks, with a probe kernel built
on this helper, that every work item is visited exactly once.

The ids come back as int64: callers multiply them by strides, and products such as
``slot * HV * V * K`` pass 2**31 for real pools (4,200 slots x 32 heads x 128 x 128 elements).

The chunked prefill's chunk-grid kernels (outside the planner: one program per chunk on axis x)
read their chunk from the device-side chunk table with :func:`chunk_span`.
"""

import triton
import triton.language as tl


@triton.jit
def decode_pid(LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr,
               AX_BLK: tl.constexpr, n_heads):
    """Program ids -> ``(i_blk, i_n, i_h)`` as int64.

    Args:
        LAYOUT: ``"split"`` (each dimension on the axis the plan names) or ``"folded"``
            (block on axis y, ``n * n_heads + h`` on axis z: the legacy ``(NK, NV, N*HV)`` grid).
        AX_SEQ, AX_HEAD, AX_BLK: axis of each dimension (split layout; ignored when folded).
        n_heads: heads per sequence (a constexpr or a runtime int; used by ``folded`` only).
    Returns:
        (i_blk, i_n, i_h), int64 scalars.
    """
    if LAYOUT == "split":
        i_blk = tl.program_id(AX_BLK).to(tl.int64)
        i_n = tl.program_id(AX_SEQ).to(tl.int64)
        i_h = tl.program_id(AX_HEAD).to(tl.int64)
    else:
        i_blk = tl.program_id(1).to(tl.int64)
        pid = tl.program_id(2).to(tl.int64)
        i_n = pid // n_heads
        i_h = pid % n_heads
    return i_blk, i_n, i_h


@triton.jit
def chunk_span(chunk_start, cu_seqlens, i_c, n):
    """Chunk ``i_c`` of sequence ``n`` (a real chunk: ``n < N``, checked by the caller) ->
    ``(t0, L)``, int64: its first token, and the rows left in the sequence from there (the chunk
    holds ``min(L, 64)`` of them). Tables from :func:`linattn.kernels.triton.chunk_tables.chunk_tables_triton`
    (or :func:`linattn.kernels.triton.prefill.chunk_tables`: the same bits)."""
    t0 = tl.load(chunk_start + i_c).to(tl.int64)
    return t0, tl.load(cu_seqlens + n + 1).to(tl.int64) - t0
