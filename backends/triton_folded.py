"""``triton-folded``: the Triton kernels with the legacy folded launch grid (ROCm, XPU).

The grid is ``(NK, NV, N*HV)``: sequences and heads folded onto one axis, which HIP and Level
Zero allow up to 2**31-1 programs. On CUDA that axis stops at 65,535, so there the backend is
eligible only when forced (for the contract tests) and the planner rejects batches past the limit
with reason ``grid_limit``. In the Triton interpreter (CPU) it also runs only when forced.
See :mod:`linattn.backends.triton` for the shared body and :mod:`linattn.kernels.grid`.
"""

from __future__ import annotations

from .triton import TritonBackend


class TritonFoldedBackend(TritonBackend):
    """Triton GDN/KDA decode and SwiGLU clamp, folded grid (AMD, Intel; CUDA/CPU when forced)."""

    name = "triton-folded"
    api_version = "2"
    summary = "Triton kernels, legacy folded launch grid (NK, NV, N*HV); ROCm and XPU"
    layout = "folded"
    vendors = frozenset({"amd", "intel", "nvidia", "cpu"})
    native = frozenset({"amd", "intel"})
