"""Copy each sequence's read slot into its write slot, so that a prefill can run in place on the
write slots (docs/ops.md "Separate read and write slots").

A pool-mode prefill with ``output_state_indices`` reads sequence ``n``'s initial state from
``state_pool[state_indices[n]]`` and writes its final state to ``state_pool[output_state_indices[n]]``.
The chunked prefills (the Triton pipeline, its segment-parallel pass, the fused GDN and KDA
kernels, the CuTe DSL state kernel) all read ``h0`` from and write the final state to one row per
sequence. Rather than give each of those five state kernels a second row pointer, the launcher first
runs :func:`fork_slots`: one program per (sequence, value head) copies the read row's bits into the
write row, where the sequence reads a state (not padding, not fresh under ``has_initial_state``) and
the two slots differ. The prefill then runs in place on ``output_state_indices``, and gives the bits
of an in-place call on a pool holding that copy. The cost is one read and one write of a state
row per forked sequence (``HV * K * V`` elements; 2 MiB at HV = 32, K = V = 128, fp32: about 1 us of
H200 bandwidth), small beside a prefill's work. Decode takes the second row pointer in its kernel
instead (``kernels/triton/decode.py``, ``HAS_OUT_SLOTS``): there the state row is the traffic.

Safety of the copy before the state kernels: the validation layer refuses a slot written by two
sequences and a slot read by one sequence and written by another, so no copy overwrites a row
another sequence still reads, and no two copies meet.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .launch import launch

#: element size -> the integer dtype the rows are copied as (bits, whatever the float)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _fork_slots_kernel(pool, src_idx, dst_idx, has_init, s_p, s_h, s_a, s_b, A, B,
                       BA: tl.constexpr, BB: tl.constexpr, HAS_INIT: tl.constexpr):
    i_n = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    src = tl.load(src_idx + i_n).to(tl.int64)
    dst = tl.load(dst_idx + i_n).to(tl.int64)
    go = (src >= 0) & (dst >= 0) & (src != dst)
    if HAS_INIT:  # a fresh sequence reads no state: nothing to carry
        go = go & (tl.load(has_init + i_n) != 0)
    if go:
        offs_b = tl.arange(0, BB)
        for a0 in range(0, A, BA):
            offs_a = a0 + tl.arange(0, BA)
            mask = (offs_a[:, None] < A) & (offs_b[None, :] < B)
            off = offs_a[:, None].to(tl.int64) * s_a + offs_b[None, :].to(tl.int64) * s_b + i_h * s_h
            x = tl.load(pool + src * s_p + off, mask=mask)
            tl.store(pool + dst * s_p + off, x, mask=mask)


def fork_slots(state_pool: torch.Tensor, state_indices: torch.Tensor, output_state_indices: torch.Tensor,
               has_initial_state: Optional[torch.Tensor] = None) -> None:
    """Copy ``state_pool[state_indices[n]]`` into ``state_pool[output_state_indices[n]]`` bitwise, for
    each sequence that reads a state and writes another slot. No sync; capturable.

    Args:
        state_pool: ``[P, HV, A, B]`` (either state layout), any strides, fp32 / bf16 / fp64; written in
            place at the write slots only.
        state_indices, output_state_indices: ``[N]`` int32/int64, contiguous; negative = padding (on
            the same rows of both: validated by the caller).
        has_initial_state: optional ``[N]`` bool, contiguous: False rows are not copied (their slot
            is not read).

    Example (a CUDA pool, or a CPU one under ``TRITON_INTERPRET=1``):
        >>> pool = torch.arange(8.0).reshape(4, 1, 1, 2)
        >>> fork_slots(pool, torch.tensor([0, 2]), torch.tensor([1, 2]))
        >>> pool[:, 0, 0].tolist()  # slot 0 copied into slot 1; slot 2 is read and written in place
        [[0.0, 1.0], [0.0, 1.0], [4.0, 5.0], [6.0, 7.0]]
    """
    N = state_indices.shape[0]
    P, HV, A, B = state_pool.shape
    if N == 0 or HV == 0 or A == 0 or B == 0:
        return
    bits = state_pool.view(_BITS[state_pool.element_size()])
    init = state_indices if has_initial_state is None else has_initial_state.view(torch.uint8)
    BB = triton.next_power_of_2(B)
    BA = max(1, min(triton.next_power_of_2(A), 4096 // BB))
    s = bits.stride()
    launch(_fork_slots_kernel, (N, HV), (bits, state_indices, output_state_indices, init, s[0], s[1], s[2], s[3],
                                         A, B), dict(BA=BA, BB=BB, HAS_INIT=has_initial_state is not None),
           num_warps=4)
