"""Chunk-local cumulative log decays as two-float sums, for the fp32 (``ieee``) prefill path.

A plain fp32 prefix sum ``G_r = g_1 + ... + g_r`` rounds every partial sum at the magnitude it has
reached: after a floor gate (-1000) early in a chunk, fp32's spacing there is 6e-5, and the later
differences ``G_r - G_s`` of mild gates (-0.02 per token) carry that rounding, one-signed, as a
relative error of up to ~1e-4 in ``exp(G_r - G_s)``: outputs 3e-4 off the float64 reference, 30x
ops.md's 1e-5 for fp32 inputs. Carrying each partial sum as ``hi + lo`` (Knuth's TwoSum, exact in
round-to-nearest fp32; no multiplications, so FMA contraction cannot alter it) makes the
difference ``(hi_r - hi_s) + (lo_r - lo_s)`` accurate to the rounding of the difference itself.

The bf16/fp16 paths keep the plain sum (those errors sit far below their 2e-2 / 1e-2).
"""

import triton
import triton.language as tl


@triton.jit
def _two_sum(a_hi, a_lo, b_hi, b_lo):
    """``(a_hi + a_lo) + (b_hi + b_lo)`` as a normalised pair (TwoSum of the high parts, the low
    parts and the rounding error added, then renormalised)."""
    s = a_hi + b_hi
    bb = s - a_hi
    err = (a_hi - (s - bb)) + (b_hi - bb)
    lo = (a_lo + b_lo) + err
    hi = s + lo
    return hi, lo - (hi - s)


@triton.jit
def cumsum2(x, axis: tl.constexpr):
    """Inclusive prefix sum of fp32 ``x`` along ``axis`` as ``(hi, lo)``, ``hi + lo`` the sum to
    about fp32 precision squared."""
    return tl.associative_scan((x, tl.zeros_like(x)), axis, _two_sum)
