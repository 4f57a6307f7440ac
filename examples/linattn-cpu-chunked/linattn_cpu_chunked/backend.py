"""The ``cpu-chunked`` backend: chunked-form GDN and KDA prefill for CPUs.

A backend is a class: capabilities as data, predicates inherited from
:class:`linattn.backends.base.Backend` (each returns the verdict and its reason together), a
rank, and one method per op taking the validated keyword arguments of the op contract.
"""

from __future__ import annotations

from linattn.backends.base import Backend

from .chunked import CHUNK, chunked_prefill

LONG_SEQUENCE = {"gdn": 128, "kda": 256}
"""Average tokens per sequence from which the chunked form beats the token-serial reference on
CPUs (measured with ``benchmarks/cpu_chunked.py`` at 4 sequences, Qwen3-Next / Kimi-Linear
heads, 2 threads: GDN breaks even near 100 tokens, KDA near 200; at 2,048 tokens GDN runs about
2x and KDA 1.5x faster)."""


class CpuChunkedBackend(Backend):
    """Vectorised chunked-form prefill (``C = 64``) in PyTorch, for CPUs.

    Ranked 5 (ahead of ``torch-ref``'s 10 on CPUs) when a prefill averages at least
    :data:`LONG_SEQUENCE` tokens per sequence, else 50 (short sequences are mostly tail chunk, and
    the token-serial reference wins there). Computes in float32 (bf16 / fp16 inputs upcast once).
    """

    name = "cpu-chunked"
    summary = f"chunked-form (C={CHUNK}) GDN/KDA prefill, vectorised PyTorch for CPUs (example plugin)"
    ops = frozenset({"gdn_prefill", "kda_prefill"})
    vendors = frozenset({"cpu"})
    dtypes = frozenset({"float32", "bfloat16", "float16"})
    state_dtypes = frozenset({"float32", "bfloat16"})
    head_dims_k = None
    head_dims_v = None
    state_layouts = frozenset({"vk", "kv"})

    def rank(self, p, caps) -> int:
        return 5 if p.t / max(p.n, 1) >= LONG_SEQUENCE[p.family] else 50

    def gdn_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk"):
        return chunked_prefill(q, k, v, g, beta, cu_seqlens, state_pool=state_pool,
                               state_indices=state_indices, initial_state=initial_state, scale=scale,
                               use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)

    def kda_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk"):
        return chunked_prefill(q, k, v, g, beta, cu_seqlens, state_pool=state_pool,
                               state_indices=state_indices, initial_state=initial_state, scale=scale,
                               use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)
