"""Stand-ins for the peer libraries' functions, on the CPU: their keyword names and conventions
(as the libraries document them), computed with linattn's reference, and a log of every call.

They let the CPU tests check a peer backend's translation end to end (what it hands the library,
what it does with what comes back) against ``torch-ref``, without the library's kernels. Each
stand-in also enforces the library's preconditions that the translation exists for (a negative
slot handed to a function that would read it, a gate in the wrong domain, a state of the wrong
dtype) by raising.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch

from linattn.backends.torch_ref import gdn_decode_ref, gdn_prefill_ref, kda_decode_ref, kda_prefill_ref


class Log(list):
    """The calls a stand-in received: one dict of its arguments per call."""


def fla_chunk(family: str, log: Log):
    """FLA's ``chunk_gated_delta_rule`` / ``chunk_kda``: ``[B=1, T, ...]`` inputs, ``cu_seqlens``
    int64, dense fp32 states ``[N, HV, K, V]`` (``state_v_first``: ``[N, HV, V, K]``)."""
    ref = gdn_prefill_ref if family == "gdn" else kda_prefill_ref

    def chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        log.append(dict(q=q, g=g, initial_state=None if initial_state is None else initial_state.clone(),
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        state_v_first=state_v_first, cu_seqlens=cu_seqlens, scale=scale, kwargs=kwargs))
        assert q.shape[0] == 1 and cu_seqlens is not None and cu_seqlens.dtype == torch.int64
        assert initial_state is None or initial_state.dtype == torch.float32, "FLA asserts an fp32 initial state"
        assert not kwargs, f"arguments FLA 0.6 does not take here: {sorted(kwargs)}"
        o, ht = ref(q[0], k[0], v[0], g[0], beta[0], cu_seqlens, initial_state=initial_state, scale=scale,
                    use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout="vk" if state_v_first else "kv")
        return o[None], (ht if output_final_state else None)

    return chunk


def fla_recurrent(family: str, log: Log):
    """FLA's ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda``: ``[B, T, ...]`` with
    log-space ``g``, post-sigmoid ``beta``, dense fp32 states ``[B, HV, ., .]``."""
    ref = gdn_decode_ref if family == "gdn" else kda_decode_ref

    def recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, state_v_first=False, cu_seqlens=None, **kwargs):
        log.append(dict(q=q, g=g, beta=beta, initial_state=initial_state.clone(), state_v_first=state_v_first,
                        scale=scale, cu_seqlens=cu_seqlens, kwargs=kwargs))
        assert cu_seqlens is None and not kwargs
        assert initial_state.dtype == torch.float32 and g.dtype == torch.float32 and bool((g <= 0).all())
        B = q.shape[0]
        pool = initial_state.clone()
        o = ref(q, k, v, None, None, None, None, pool, torch.arange(B), scale=scale,
                use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout="vk" if state_v_first else "kv", g=g, beta=beta)
        return o, (pool if output_final_state else None)

    return recurrent


def flashinfer_prefill(log: Log):
    """FlashInfer's ``chunk_gated_delta_rule`` (0.7.4 keywords): linear ``alpha`` gate, states
    ``[., HV, V, K]``; pool mode by ``state_indices`` (no ``-1`` without ``output_state_indices``),
    read ``-1`` = zero state, write ``-1`` = no write."""

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                               state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
                               use_cp: Literal["auto"] | bool = "auto", state_indices=None, _cp_chunk_len=None,
                               backend="auto", max_seqlen=None, *, gate_domain="linear", use_gate_in_kernel=False,
                               A_log=None, dt_bias=None, beta_is_logit=False, cu_seqlens_cpu=None,
                               output_state_indices=None, checkpoint_state_indices=None, prefix_lens=None):
        log.append(dict(g=g, initial_state=initial_state, output_state=output_state, state_indices=state_indices,
                        output_state_indices=output_state_indices, use_cp=use_cp, backend=backend,
                        cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale))
        assert q.dtype in (torch.bfloat16, torch.float16) and q.is_contiguous() and cu_seqlens is not None
        assert g.dtype == torch.float32 and bool((g > 0).all()) and bool((g <= 1).all()), "alpha in (0, 1]"
        if state_indices is not None and output_state_indices is None:
            assert bool((state_indices >= 0).all()), "FlashInfer: unique, non-negative ids without output_state_indices"
        if output_state_indices is not None:
            assert use_cp is not True, "FlashInfer: use_cp=True rejects output_state_indices"
        log_g = torch.log(g)
        N = cu_seqlens.numel() - 1
        if state_indices is None:
            o, ht = gdn_prefill_ref(q, k, v, log_g, beta, cu_seqlens, initial_state=initial_state, scale=scale,
                                    use_qk_l2norm=use_qk_l2norm_in_kernel)
            output_state.copy_(ht)
            return o, output_state
        read = state_indices
        write = output_state_indices if output_state_indices is not None else state_indices
        rows = initial_state.index_select(0, read.clamp_min(0).long()).float()
        h0 = torch.where((read >= 0).view(-1, 1, 1, 1), rows, rows.new_zeros(()))
        o, ht = gdn_prefill_ref(q, k, v, log_g, beta, cu_seqlens, initial_state=h0, scale=scale,
                                use_qk_l2norm=use_qk_l2norm_in_kernel)
        for n in range(N):  # FlashInfer: "a zero-length sequence writes nothing"
            if int(write[n]) >= 0 and int(cu_seqlens[n + 1]) > int(cu_seqlens[n]):
                output_state[int(write[n])] = ht[n].to(output_state.dtype)
        return o, output_state

    return chunk_gated_delta_rule


def flashinfer_decode(log: Log):
    """FlashInfer's ``gated_delta_rule_decode_pretranspose``, fp32 pool path: ``T = 1``, ``-1`` rows
    skipped (zero output, nothing read or written), raw gates with ``A_log`` fp32."""

    def gated_delta_rule_decode_pretranspose(q, k, v, state: Optional[torch.Tensor], A_log, a, dt_bias, b, scale=None,
                                             output=None, use_qk_l2norm=True, initial_state=None,
                                             initial_state_indices=None, output_state_indices=None,
                                             intermediate_states_buffer=None, disable_state_update=False,
                                             backend="auto"):
        log.append(dict(state=state, A_log=A_log, dt_bias=dt_bias, initial_state_indices=initial_state_indices,
                        backend=backend, scale=scale, use_qk_l2norm=use_qk_l2norm))
        assert q.shape[1] == 1 and initial_state.dtype == torch.float32 and A_log.dtype == torch.float32
        assert dt_bias.dtype in (torch.bfloat16, torch.float32)
        assert bool(((initial_state_indices >= 0) | (initial_state_indices == -1)).all()), "padding is -1"
        o = gdn_decode_ref(q, k, v, a, b, A_log, dt_bias, initial_state, initial_state_indices, scale=scale,
                           use_qk_l2norm=use_qk_l2norm)
        return o, initial_state

    return gated_delta_rule_decode_pretranspose


def default_scale(K: int) -> float:
    return 1.0 / math.sqrt(K)
