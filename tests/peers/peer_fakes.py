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
    """FLA's ``chunk_gated_delta_rule`` / ``chunk_kda`` (fla-core 0.6.0's parameter lists, so an
    argument handed over by position lands where it would in FLA): ``[B=1, T, ...]`` inputs,
    ``cu_seqlens`` int64, dense fp32 states ``[N, HV, K, V]`` (``state_v_first``: ``[N, HV, V, K]``)."""
    ref = gdn_prefill_ref if family == "gdn" else kda_prefill_ref

    def run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
            cu_seqlens, kwargs):
        log.append(dict(q=q, g=g, initial_state=None if initial_state is None else initial_state.clone(),
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        state_v_first=state_v_first, cu_seqlens=cu_seqlens, scale=scale, kwargs=kwargs))
        assert q.shape[0] == 1 and cu_seqlens is not None and cu_seqlens.dtype == torch.int64
        assert initial_state is None or initial_state.dtype == torch.float32, "FLA asserts an fp32 initial state"
        assert not kwargs, f"arguments FLA 0.6 does not take here: {sorted(kwargs)}"
        o, ht = ref(q[0], k[0], v[0], g[0], beta[0], cu_seqlens, initial_state=initial_state, scale=scale,
                    use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout="vk" if state_v_first else "kv")
        return o[None], (ht if output_final_state else None)

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                               state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                               cp_context=None, **kwargs):
        assert not (use_beta_sigmoid_in_kernel or allow_neg_eigval) and chunk_indices is None and cp_context is None
        return run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens, kwargs)

    def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                  return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                  cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
        assert not (use_gate_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval or return_intermediate_states)
        assert lower_bound is None and cp_context is None, "the gates are handed over in log space"
        return run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens, kwargs)

    return chunk_gated_delta_rule if family == "gdn" else chunk_kda


def fla_recurrent(family: str, log: Log):
    """FLA's ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda`` (fla-core 0.6.0's
    parameter lists: GDN's is ``(q, k, v, g, gk, gv, beta, ...)``, KDA's ``(q, k, v, g, beta, ...)``):
    ``[B, T, ...]`` with log-space ``g`` (GDN ``[B, T, HV]``, KDA ``[B, T, HV, K]``), post-sigmoid
    ``beta [B, T, HV]``, dense fp32 states ``[B, HV, ., .]``. GDN's per-key / per-value decays
    ``gk``, ``gv`` are never handed over (they would multiply the state as well). KDA's function,
    unwrapped, has no ``input_guard``: its kernel indexes every tensor from the base pointer, so a
    strided view is read as wrong numbers; the stand-in refuses one."""
    ref = gdn_decode_ref if family == "gdn" else kda_decode_ref

    def run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
            cu_seqlens, kwargs):
        log.append(dict(q=q, g=g, beta=beta, initial_state=initial_state.clone(), state_v_first=state_v_first,
                        scale=scale, cu_seqlens=cu_seqlens, kwargs=kwargs))
        assert cu_seqlens is None and not kwargs
        B, T, HV = v.shape[:3]
        gate_shape = (B, T, HV, q.shape[-1]) if family == "kda" else (B, T, HV)
        assert g is not None and g.shape == gate_shape, f"g {None if g is None else tuple(g.shape)}, FLA: {gate_shape}"
        assert beta is not None and beta.shape == (B, T, HV), "beta [B, T, HV] (FLA: None means all ones)"
        assert initial_state.dtype == torch.float32 and g.dtype == torch.float32 and bool((g <= 0).all())
        pool = initial_state.clone()
        o = ref(q, k, v, None, None, None, None, pool, torch.arange(B), scale=scale,
                use_qk_l2norm=use_qk_l2norm_in_kernel, state_layout="vk" if state_v_first else "kv", g=g, beta=beta)
        return o, (pool if output_final_state else None)

    def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                         output_final_state=False, use_qk_l2norm_in_kernel=False,
                                         use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                         state_v_first=False, cu_seqlens=None, **kwargs):
        assert gk is None and gv is None, "FLA 0.6 GDN: gk/gv are per-key/per-value decays; none is handed over"
        assert not (use_gate_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval) and A_log is None
        return run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens, kwargs)

    def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                            state_v_first=False, cu_seqlens=None, **kwargs):
        assert not (use_gate_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval)
        assert A_log is None and dt_bias is None and lower_bound is None, "the gates are handed over in log space"
        strided = [n for n, x in dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state).items()
                   if x is not None and not x.is_contiguous()]
        assert not strided, f"FLA's unwrapped fused_recurrent_kda reads these strided views wrong: {strided}"
        return run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
                   cu_seqlens, kwargs)

    return fused_recurrent_gated_delta_rule if family == "gdn" else fused_recurrent_kda


#: the stand-ins' names, per FLA function (tests/peers compares their parameter lists with FLA's)
FLA_STAND_INS = {("gdn", "prefill"): fla_chunk, ("kda", "prefill"): fla_chunk,
                 ("gdn", "decode"): fla_recurrent, ("kda", "decode"): fla_recurrent}


def flashinfer_prefill(log: Log):
    """FlashInfer's ``chunk_gated_delta_rule`` (0.7.4 keywords): linear ``alpha`` gate, states
    ``[., HV, V, K]``; pool mode by ``state_indices`` (no ``-1`` without ``output_state_indices``),
    read ``-1`` = zero state, write ``-1`` = no write, a zero-length sequence writes nothing.

    Checkpoints as 0.7.4's non-CP kernels store them into pool rows (``checkpoint_state_indices``,
    ``flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py``'s ``checkpoint_entry``): the state
    after every ``checkpoint_every_n_tokens`` tokens of sequence ``n`` up to and including its length,
    the ``j``-th to row ``checkpoint_state_indices[checkpoint_cu_starts[n] + j]`` of
    ``state_checkpoints`` (``-1``: skipped), from the state the sequence read. The packed form
    (checkpoints without ``checkpoint_state_indices``) and ``prefix_lens`` are not modelled (raise).
    FlashInfer's preconditions that the translation relies on are asserted: slot arguments only with
    ``use_cp`` not True, dense checkpoint rows, entries read inside the index list."""

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                               state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
                               use_cp: Literal["auto"] | bool = "auto", state_indices=None, _cp_chunk_len=None,
                               backend="auto", max_seqlen=None, *, gate_domain="linear", use_gate_in_kernel=False,
                               A_log=None, dt_bias=None, beta_is_logit=False, cu_seqlens_cpu=None,
                               output_state_indices=None, checkpoint_state_indices=None, prefix_lens=None):
        log.append(dict(g=g, initial_state=initial_state, output_state=output_state, state_indices=state_indices,
                        output_state_indices=output_state_indices, use_cp=use_cp, backend=backend,
                        cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                        state_checkpoints=state_checkpoints, checkpoint_cu_starts=checkpoint_cu_starts,
                        checkpoint_every_n_tokens=checkpoint_every_n_tokens,
                        checkpoint_state_indices=checkpoint_state_indices))
        assert q.dtype in (torch.bfloat16, torch.float16) and q.is_contiguous() and cu_seqlens is not None
        assert g.dtype == torch.float32 and bool((g > 0).all()) and bool((g <= 1).all()), "alpha in (0, 1]"
        assert beta.dtype == torch.float32, "FlashInfer's SM90 kernel: beta must have dtype torch.float32"
        assert prefix_lens is None, "prefix_lens: not modelled"
        if state_indices is not None and output_state_indices is None:
            assert bool((state_indices >= 0).all()), "FlashInfer: unique, non-negative ids without output_state_indices"
        if output_state_indices is not None or checkpoint_state_indices is not None:
            assert use_cp is not True, "FlashInfer: use_cp=True rejects output_state_indices / checkpoint_state_indices"
        if output_state_indices is not None:
            assert state_indices is not None and output_state is not None and output_final_state
            assert output_state_indices.is_contiguous() and output_state_indices.shape == state_indices.shape
        log_g = torch.log(g)
        N = cu_seqlens.numel() - 1
        if state_indices is None:
            assert not checkpoint_every_n_tokens, "checkpoints in dense mode: not modelled"
            o, ht = gdn_prefill_ref(q, k, v, log_g, beta, cu_seqlens, initial_state=initial_state, scale=scale,
                                    use_qk_l2norm=use_qk_l2norm_in_kernel)
            for n in range(N):  # dense too: a zero-length sequence writes nothing (H200, 2026-12-02)
                if int(cu_seqlens[n + 1]) > int(cu_seqlens[n]):
                    output_state[n] = ht[n].to(output_state.dtype)
            return o, output_state
        read = state_indices
        write = output_state_indices if output_state_indices is not None else state_indices
        rows = initial_state.index_select(0, read.clamp_min(0).long()).float()
        h0 = torch.where((read >= 0).view(-1, 1, 1, 1), rows, rows.new_zeros(()))
        ckpts = _flashinfer_checkpoints(q, k, v, log_g, beta, cu_seqlens, h0, scale, use_qk_l2norm_in_kernel,
                                        state_checkpoints, checkpoint_cu_starts, checkpoint_every_n_tokens,
                                        checkpoint_state_indices)
        o, ht = gdn_prefill_ref(q, k, v, log_g, beta, cu_seqlens, initial_state=h0, scale=scale,
                                use_qk_l2norm=use_qk_l2norm_in_kernel)
        for row, state in ckpts:
            state_checkpoints[row] = state.to(state_checkpoints.dtype)
        for n in range(N):  # FlashInfer: "a zero-length sequence writes nothing"
            if int(write[n]) >= 0 and int(cu_seqlens[n + 1]) > int(cu_seqlens[n]):
                output_state[int(write[n])] = ht[n].to(output_state.dtype)
        return o, output_state

    return chunk_gated_delta_rule


def _flashinfer_checkpoints(q, k, v, log_g, beta, cu_seqlens, h0, scale, l2norm, pool, starts, every, rows):
    """``[(row, state)]``: the checkpoints FlashInfer's non-CP kernel stores (see flashinfer_prefill),
    each the reference over the sequence's first ``(j + 1) * every`` tokens from its initial state."""
    if not every:
        assert pool is None and starts is None and rows is None, "checkpoint arguments without checkpoint_every"
        return []
    assert every % 64 == 0 and pool is not None and starts is not None
    assert rows is not None, "the packed checkpoint buffer (no checkpoint_state_indices): not modelled"
    assert rows.dim() == 1 and rows.is_contiguous() and not rows.dtype.is_floating_point
    assert starts.dim() == 1 and starts.is_contiguous() and starts.numel() in (h0.shape[0], h0.shape[0] + 1)
    assert pool.stride()[1:] == (pool.shape[2] * pool.shape[3], pool.shape[3], 1), "dense [H, V, K] rows"
    assert pool.stride(0) >= pool.shape[1] * pool.shape[2] * pool.shape[3]
    out = []
    for n in range(h0.shape[0]):
        s, e = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        for j in range((e - s) // every):
            entry = int(starts[n]) + j
            assert entry < rows.numel(), f"sequence {n}'s checkpoint {j} reads entry {entry} of {rows.numel()}"
            row = int(rows[entry])
            if row < 0:
                continue
            assert row < pool.shape[0]
            t = (j + 1) * every
            cut = torch.tensor([0, t], dtype=cu_seqlens.dtype)
            _, ht = gdn_prefill_ref(q[s:s + t], k[s:s + t], v[s:s + t], log_g[s:s + t], beta[s:s + t], cut,
                                    initial_state=h0[n:n + 1], scale=scale, use_qk_l2norm=l2norm)
            out.append((row, ht[0]))
    return out


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
