"""Probe kernel: records which work item each program of a plan visits.

Built on the same :func:`decode_pid` helper as the real kernels, it adds 1 to
``counts[i_n, i_h, i_blk]`` for the work item each program decodes (and, when asked, writes
the coordinates it decoded per program). After a launch over a plan, every entry of ``counts``
equal to 1 proves the plan and the helper visit every work item exactly once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from linattn.kernels.grid import GridPlan
from linattn.kernels.triton._pid import decode_pid


@triton.jit
def _probe_kernel(counts, n_seq, n_heads, n_blocks,
                  LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr):
    i_blk, i_n, i_h = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, n_heads)
    in_range = (i_blk >= 0) & (i_blk < n_blocks) & (i_h >= 0) & (i_h < n_heads) & (i_n >= 0) & (i_n < n_seq)
    # Cell 0 counts out-of-range coordinates, so they are seen, not lost.
    cell = tl.where(in_range, (i_n * n_heads + i_h) * n_blocks + i_blk + 1, 0)
    tl.atomic_add(counts + cell, 1)


def probe_visits(plan: GridPlan, device="cpu") -> tuple[torch.Tensor, int]:
    """Launch the probe over ``plan`` on ``device``.

    Returns:
        (counts, overflow): visits per work item as int32 ``[n_seq, n_heads, n_blocks]``, and the
        number of programs that decoded a coordinate outside the work (must be 0).
    """
    n = plan.n_seq * plan.n_heads * plan.n_blocks
    buf = torch.zeros(n + 1, dtype=torch.int32, device=device)  # buf[0] = overflow, then cells
    if not plan.empty:
        _probe_kernel[plan.grid](buf, plan.n_seq, plan.n_heads, plan.n_blocks, **plan.constexprs)
    return buf[1:].view(plan.n_seq, plan.n_heads, plan.n_blocks), int(buf[0].item())
