"""Chunk-local cumulative log decays as two-float sums, for the fp32 (``ieee``) prefill path.

A plain fp32 prefix sum ``G_r = g_1 + ... + g_r`` rounds every partial sum at the magnitude it has
reached: after a floor gate (-1000) early in a chunk, fp32's spacing there is 6e-5, and the later
differences ``G_r - G_s`` of mild gates (-0.02 per token) carry that rounding, one-signed, as a
relative error of up to ~1e-4 in ``exp(G_r - G_s)``: outputs 3e-4 off the float64 reference, 30x
docs/ops.md's 1e-5 for fp32 inputs.

:func:`cumsum2` splits each gate into a coarse part on the grid of ``2**-7`` and the remainder
(``|rem| <= 2**-8``, exact in fp32). The coarse parts of a chunk sum exactly in any order: the
gates are floored at -1000 and a chunk has 64 rows, so every partial sum is a multiple of
``2**-7`` below ``64 * 1000 * 2**7 < 2**24`` in units of the grid. The remainders sum to at most
0.25 in magnitude, where fp32's spacing is 3e-8. ``G + Gl`` then carries the cumulative gate to
about fp32 precision squared, and ``(G_r - G_s) + (Gl_r - Gl_s)`` is accurate to the rounding of
the difference itself. Two plain prefix sums: any scan order (the GPU's tree, the interpreter's
sequential one) gives the same coarse sums.

The bf16/fp16 paths keep the plain sum (those errors sit far below their 2e-2 / 1e-2).
"""

import triton
import triton.language as tl


@triton.jit
def cumsum2(x, axis: tl.constexpr):
    """Inclusive prefix sum along ``axis`` (at most 64 long) of fp32 gates ``x`` in
    ``[-1000, 0]`` as ``(G, Gl)``: ``G`` the sum rounded to fp32, ``Gl`` the part of the exact sum
    that ``G`` misses (``|Gl|`` about fp32's spacing at ``G``)."""
    coarse = tl.floor(x * 128.0 + 0.5) * (1.0 / 128.0)
    hi = tl.cumsum(coarse, axis=axis)  # exact (module docstring)
    lo = tl.cumsum(x - coarse, axis=axis)
    G = hi + lo
    return G, (hi - G) + lo


@triton.jit
def cum_gates(gg, PREC: tl.constexpr):
    """The chunk-local cumulative log decays of the gates ``gg`` (rows along axis 0): with
    ``PREC == "ieee"`` (fp32 inputs) the two-float sum ``(G, Gl)`` of :func:`cumsum2`, so that
    differences keep fp32 accuracy; else the plain prefix sum as ``G`` and ``Gl = G`` (not used)."""
    if PREC == "ieee":
        G, Gl = cumsum2(gg, 0)
    else:
        G = tl.cumsum(gg, axis=0)
        Gl = G
    return G, Gl
