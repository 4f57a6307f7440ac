"""The ``cpu-chunked`` backend: chunked-form GDN and KDA prefill for CPUs (plugin API 2).

A backend is a class: capabilities as data, predicates inherited from
:class:`linattn.backends.base.Backend` (each returns the verdict and its reason together), a
rank, and one method per phase taking a typed call object (``linattn.dispatch.plugin.calls``) whose
fields are the validated arguments of the op contract. This one implements ``prefill`` only.
"""

from __future__ import annotations

from linattn.backends.base import Backend, PrefillCall, Rank

from .chunked import CHUNK, chunked_prefill

LONG_SEQUENCE = {"gdn": 128, "kda": 256}
"""Average tokens per sequence from which the chunked form beats the token-serial reference on
CPUs (``benchmarks/cpu_chunked.py``; the measurements: docs/performance.md#cpu-chunked-crossover)."""


class CpuChunkedBackend(Backend):
    """Vectorised chunked-form prefill (``C = 64``) in PyTorch, for CPUs.

    Ranked ``Rank.PREFERRED`` (5, ahead of ``torch-ref``'s ``Rank.CPU_DEFAULT``, 10, on CPUs) when a
    prefill averages at least :data:`LONG_SEQUENCE` tokens per sequence, else ``Rank.BEHIND_NATIVE``
    (60: short sequences are mostly tail chunk, and the token-serial reference wins there).
    Computes in float32 (bf16 / fp16 inputs upcast once).
    """

    name = "cpu-chunked"
    summary = f"chunked-form (C={CHUNK}) GDN/KDA prefill, vectorised PyTorch for CPUs (example plugin)"
    api_version = "2"
    ops = frozenset({"gdn_prefill", "kda_prefill"})
    vendors = frozenset({"cpu"})
    dtypes = frozenset({"float32", "bfloat16", "float16"})
    state_dtypes = frozenset({"float32", "bfloat16"})
    head_dims_k = None
    head_dims_v = None
    state_layouts = frozenset({"vk", "kv"})

    def rank(self, p, caps) -> int:
        return Rank.PREFERRED if self.size_class(p, caps) else Rank.BEHIND_NATIVE

    def size_class(self, p, caps) -> bool:
        """What :meth:`rank` reads of the sizes (the dispatcher caches one decision per value):
        whether the prefill averages at least :data:`LONG_SEQUENCE` tokens per sequence."""
        return p.t / max(p.n, 1) >= LONG_SEQUENCE[p.family]

    def prefill(self, call: PrefillCall):
        """GDN and KDA alike: one chunked form, g's shape (``[T, HV]`` or ``[T, HV, K]``) tells them
        apart. Returns ``(o, None)`` in pool mode, ``(o, final_state)`` in dense mode."""
        return chunked_prefill(call.q, call.k, call.v, call.g, call.beta, call.cu_seqlens,
                               state_pool=call.state_pool, state_indices=call.state_indices,
                               initial_state=call.initial_state, scale=call.scale,
                               use_qk_l2norm=call.use_qk_l2norm, state_layout=call.state_layout)
