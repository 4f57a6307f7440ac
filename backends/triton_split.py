"""``triton-split``: the Triton kernels with the split launch grid (CUDA).

Sequence, head and value block sit on separate grid axes (value blocks on x and sequences on z
while they fit, for locality; sequences on x, which takes 2**31-1 programs on CUDA, beyond), so
decode batches are not capped at 65,535 / HV sequences. Chosen on NVIDIA
GPUs ahead of the reference; on the CPU it runs in the Triton interpreter only when forced.
See :mod:`linattn.backends.triton` for the shared body and :mod:`linattn.kernels.grid`.
"""

from __future__ import annotations

from .triton import TritonBackend


class TritonSplitBackend(TritonBackend):
    """Triton GDN/KDA decode and SwiGLU clamp, split grid (NVIDIA; CPU interpreter when forced)."""

    name = "triton-split"
    api_version = "2"
    summary = "Triton kernels, split launch grid (seq/head/value-block on separate axes); CUDA"
    layout = "split"
    vendors = frozenset({"nvidia", "cpu"})
    native = frozenset({"nvidia"})
