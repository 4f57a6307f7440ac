"""The PyTorch reference backend, ``torch-ref``: every op on any device, by the reference maths.

The maths (docs/ops.md written as token-serial PyTorch, its numerics, and the decisions where
docs/ops.md is silent) is :mod:`linattn.reference`, a module below every layer so that the
self-checks and the seeded input builders use it too; its functions are re-exported here
(``linattn.backends.torch_ref.gdn_decode_ref`` and the others, ``G_MIN``), as before.
"""

from __future__ import annotations

import torch

from linattn.dispatch.plugin.problem import OPS
from linattn.reference import (G_MIN, L2NORM_EPS, gdn_decode_ref, gdn_gating_ref,  # noqa: F401
                               gdn_prefill_ref, kda_decode_ref, kda_gating_ref, kda_prefill_ref, l2norm_ref,
                               seq_lengths, silu_and_mul_clamp_ref, store_empty_sequences)

from .base import ALL_VENDORS, FLOAT_DTYPES, Backend, Rank

__all__ = [
    "G_MIN", "TorchRefBackend", "gdn_gating_ref", "kda_gating_ref", "gdn_decode_ref",
    "kda_decode_ref", "gdn_prefill_ref", "kda_prefill_ref", "silu_and_mul_clamp_ref",
]


# -- the backend --------------------------------------------------------------------------------

def _cd(*tensors) -> torch.dtype:
    """float64 when any given tensor is float64 (the oracle), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


class TorchRefBackend(Backend):
    """The reference: every op, any device, token-serial PyTorch (:mod:`linattn.reference`).

    Ranked last on GPUs (``Rank.GPU_REFERENCE``, 1000) and first on the CPU (``Rank.CPU_DEFAULT``,
    10), where it is the embedded default. Plugin API 2: dispatched through the phase methods,
    whose defaults run the per-op methods below (a subclass may override either).
    Computes in float32, or in float64 when an input or the state is float64.
    """

    name = "torch-ref"
    api_version = "2"
    summary = "PyTorch token-serial reference (fp32 accumulation, fp64 for fp64 inputs); any device"
    ops = frozenset(OPS)
    vendors = ALL_VENDORS
    dtypes = FLOAT_DTYPES
    state_dtypes = frozenset({"float32", "bfloat16", "float64"})
    state_layouts = frozenset({"vk", "kv"})
    input_strides = "any"  # PyTorch ops read every view through its strides
    strided_state_ops = frozenset(OPS)
    features = frozenset({"precomputed_gates", "has_initial_state", "output_state_indices", "checkpoints"})

    def rank(self, p, caps) -> int:
        return Rank.CPU_DEFAULT if caps.vendor == "cpu" else Rank.GPU_REFERENCE

    def size_class(self, p, caps) -> tuple:
        """Nothing here reads the sizes: every N and T is one class."""
        return ()

    def gdn_gating(self, *, A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):
        return gdn_gating_ref(A_log, a, b, dt_bias, softplus_beta, softplus_threshold,
                              compute_dtype=_cd(A_log, a, b, dt_bias))

    def kda_gating(self, *, A_log, a, b, dt_bias, lower_bound=None, softplus_beta=1.0,
                   softplus_threshold=20.0):
        return kda_gating_ref(A_log, a, b, dt_bias, lower_bound, softplus_beta, softplus_threshold,
                              compute_dtype=_cd(A_log, a, b, dt_bias))

    def gdn_decode(self, *, q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale=None,
                   use_qk_l2norm=True, state_layout="vk", intermediate_states=None,
                   intermediate_state_indices=None, disable_state_update=False,
                   num_accepted_tokens=None, softplus_beta=1.0, softplus_threshold=20.0,
                   g=None, beta=None, has_initial_state=None, output_state_indices=None):
        return gdn_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale,
                              use_qk_l2norm, state_layout, intermediate_states,
                              intermediate_state_indices, disable_state_update, num_accepted_tokens,
                              softplus_beta, softplus_threshold, g=g, beta=beta,
                              has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                              compute_dtype=_cd(q, state_pool))

    def kda_decode(self, *, q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale=None,
                   use_qk_l2norm=True, state_layout="vk", intermediate_states=None,
                   intermediate_state_indices=None, disable_state_update=False,
                   num_accepted_tokens=None, softplus_beta=1.0, softplus_threshold=20.0,
                   lower_bound=None, g=None, beta=None, has_initial_state=None, output_state_indices=None):
        return kda_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale,
                              use_qk_l2norm, state_layout, intermediate_states,
                              intermediate_state_indices, disable_state_update, num_accepted_tokens,
                              softplus_beta, softplus_threshold, lower_bound, g=g, beta=beta,
                              has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                              compute_dtype=_cd(q, state_pool))

    def gdn_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk",
                    has_initial_state=None, output_state_indices=None, checkpoint_every=None,
                    checkpoint_indices=None):
        return gdn_prefill_ref(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                               initial_state, scale, use_qk_l2norm, state_layout,
                               has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                               checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
                               compute_dtype=_cd(q, state_pool, initial_state))

    def kda_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk",
                    has_initial_state=None, output_state_indices=None, checkpoint_every=None,
                    checkpoint_indices=None):
        return kda_prefill_ref(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                               initial_state, scale, use_qk_l2norm, state_layout,
                               has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                               checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
                               compute_dtype=_cd(q, state_pool, initial_state))

    def silu_and_mul_clamp(self, *, x, limit=None):
        return silu_and_mul_clamp_ref(x, limit, compute_dtype=_cd(x))
