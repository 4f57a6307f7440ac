"""Triton SwiGLU with an optional clamp: ``silu(min(gate, L)) * clamp(up, -L, L)``.

docs/ops.md, ``silu_and_mul_clamp``: ``x [M, 2D]`` is ``gate || up``; the output ``[M, D]`` has x's
dtype. ``limit=None`` runs the plain ``silu(gate) * up`` (the clamp code is compiled out, so the
result is bitwise the unclamped kernel's). The maths is done in fp32:
``silu(g) = g / (1 + exp(-g))``.

Work items are (column block, row): a 2-D grid planned by :func:`plan_grid` with one head, and
program ids decoded by the shared :func:`decode_pid` helper, so the split and folded layouts
agree bitwise. Any ``D >= 1`` (masked tail block), any ``M >= 0`` (``M = 0`` launches nothing).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from linattn.kernels.grid import plan_grid
from linattn.kernels.triton._pid import decode_pid


@triton.jit
def _silu_and_mul_clamp_kernel(
    x, out, limit, D, s_xm, s_om,
    BD: tl.constexpr, HAS_LIMIT: tl.constexpr,
    LAYOUT: tl.constexpr, AX_SEQ: tl.constexpr, AX_HEAD: tl.constexpr, AX_BLK: tl.constexpr,
):
    i_blk, i_m, _ = decode_pid(LAYOUT, AX_SEQ, AX_HEAD, AX_BLK, 1)
    cols = i_blk * BD + tl.arange(0, BD)
    mask = cols < D
    p_x = x + i_m * s_xm + cols
    gate = tl.load(p_x, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(p_x + D, mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.maximum(tl.minimum(up, limit), -limit)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out + i_m * s_om + cols, y.to(out.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=1024)
def silu_config(D: int) -> tuple[int, int]:
    """Column block and warps for width ``D``, pinned where measured
    (docs/performance.md#swiglu-clamp-tile-config)."""
    BD = min(1 << max(0, (max(D, 1) - 1).bit_length()), 2048)
    num_warps = 8 if BD >= 2048 else (4 if BD >= 512 else (2 if BD >= 128 else 1))
    return BD, num_warps


def silu_and_mul_clamp(x: torch.Tensor, limit: Optional[float], *, caps, layout: str,
                       block_d: Optional[int] = None, num_warps: Optional[int] = None) -> torch.Tensor:
    """SwiGLU with clamp on a 2-D grid (rows x column blocks).

    Args:
        x: ``[M, 2D]`` bf16/fp16/fp32 (last dim contiguous, else copied).
        limit: finite, > 0, or None (no clamp). Validated by the caller.
        caps: DeviceCapabilities (grid limits). layout: ``"split"`` or ``"folded"``.
        block_d, num_warps: override the tile config (tests, tuning).
    Returns:
        ``[M, D]`` in x's dtype.
    Raises:
        GridLimitError: the grid does not fit the device (before launch).
    """
    M, D2 = x.shape
    D = D2 // 2
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    BD, warps = silu_config(D)
    BD = block_d or BD
    warps = num_warps or warps
    plan = plan_grid(M, 1, -(-D // BD), caps, layout)
    if plan.empty:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    _silu_and_mul_clamp_kernel[plan.grid](
        x, out, float(limit) if limit is not None else 0.0, D, x.stride(0), out.stride(0),
        BD=BD, HAS_LIMIT=limit is not None, **plan.constexprs, num_warps=warps,
    )
    return out
