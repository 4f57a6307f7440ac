"""The power-of-two row scale of l2norm without overflow (F44; docs/ops.md, "l2norm without
overflow"; ``backends/torch_ref.l2norm_ref`` is the PyTorch form).

A fp32 row with ``max|x| = f 2**e >= 2**32`` (``f`` in ``[0.5, 1)``) is multiplied by
``s = 2**-(e - 32)`` before it is squared or dotted, and the eps by ``s**2``: the same value
exactly, as a power of two scales without rounding. Every other row has ``s = 1``, so the plain
formula runs bit for bit. ``s`` is read from the float's exponent bits.

The chunked prefill's stages keep their one pass over the rows for ordinary inputs: only a chunk
where some row's sum of squares reaches :data:`SS_LIMIT` (every row holding an element
``>= 2**32`` does, as ``x**2 >= 2**64``; an overflowed sum is inf) takes a second pass on the
scaled rows (``s`` from :func:`chunk_row_max`), whose other rows have ``s = 1`` and give the same bits.
"""

import triton
import triton.language as tl

#: A row sum of squares at least this (``2**64``) may come from an element ``>= 2**32``.
SS_LIMIT = tl.constexpr(2.0 ** 64)
#: A row inverse norm at most this (``2**-32``) may come from an element ``>= 2**32``.
RNORM_LIMIT = tl.constexpr(2.0 ** -32)


@triton.jit
def _shift(mx):
    """``max(e - 32, 0)`` for ``mx = f 2**e`` (fp32 >= 0, any shape; inf and nan give 97)."""
    return tl.maximum(((mx.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 158, 0)


@triton.jit
def pow2_scale(mx):
    """``s = 2**-(e - 32)`` for ``mx = max|x| = f 2**e >= 2**32``, else 1 (fp32, the shape of ``mx``)."""
    return ((127 - _shift(mx)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def inv_pow2_scale(mx):
    """``1 / pow2_scale(mx)``, exactly (from the exponent bits as well)."""
    return ((127 + _shift(mx)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def chunk_row_max(ptr, r, m, stride_t, K: tl.constexpr, BK: tl.constexpr):
    """``max|x|`` of the rows ``r`` (mask ``m``; ``[64]`` fp32, 0 where masked) of a row-strided
    ``[*, K]`` matrix whose chunk starts at ``ptr``, in ``K // BK`` column blocks."""
    mx = tl.zeros([64], dtype=tl.float32)
    for ik in range(K // BK):
        c = ik * BK + tl.arange(0, BK)
        x = tl.load(ptr + r[:, None] * stride_t + c[None, :], mask=m[:, None], other=0.0)
        mx = tl.maximum(mx, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    return mx
