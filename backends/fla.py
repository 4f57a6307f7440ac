"""``fla``: flash-linear-attention's (fla-core 0.6) Triton kernels as a peer backend.

Ops: ``gdn_prefill`` and ``kda_prefill`` (``chunk_gated_delta_rule``, ``chunk_kda``), ``gdn_decode``
and ``kda_decode`` (``fused_recurrent_gated_delta_rule``, ``fused_recurrent_kda``), in the layout FLA
documents: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (GVA when ``HV > H``), gates ``[B, T, HV]``
(KDA ``[B, T, HV, K]``) in log space, dense states ``[N, HV, K, V]`` (``state_v_first=True``:
``[N, HV, V, K]``), ``cu_seqlens`` int64 with ``B = 1``.

The translation (the backend's, counted in its time):

- **packed tensors**: ``[T, ...]`` becomes ``[1, T, ...]``; decode's ``[N, T, ...]`` is FLA's
  ``[B, T, ...]``; ``cu_seqlens`` is handed over as int64; gates in fp32 (linattn also accepts
  fp64 ``g``, ``beta``; FLA's kernels were measured and checked with fp32).
- **arguments by keyword**: FLA 0.6's GDN recurrent function takes ``(q, k, v, g, gk, gv, beta,
  ...)`` (``gk``, ``gv`` are per-key / per-value decays), its KDA one ``(q, k, v, g, beta, ...)``:
  everything after ``q, k, v`` is passed by name (:func:`launch`).
- **state layout**: ``vk`` is ``state_v_first=True``, ``kv`` is ``False``: no transpose.
- **the pool**: FLA has none, so the slots' rows are gathered into a dense fp32 state (zeros for
  padding and for sequences ``has_initial_state`` marks fresh: their slots are never handed to
  FLA), and the final states are written back to the non-negative slots, rounded to the pool's
  dtype (:mod:`linattn.backends.peer`). Padding rows' outputs are zeroed.
- **raw decode gates** (``a, b, A_log, dt_bias``) are turned into ``g, beta`` by torch-ref's
  gating (docs/ops.md, "Gating"; softplus parameters and ``lower_bound`` honoured).
- **speculative verify**: a ``[N, T]`` slot table, ``num_accepted_tokens`` or
  ``intermediate_states`` run FLA one token at a time, storing each token's state where the
  contract says; ``disable_state_update`` skips the pool writes.
- **FLA's own backend dispatch** (FlashQLA, FlashKDA, TileLang, Ascend) is bypassed: the public
  functions are unwrapped to FLA's Triton implementation (``inspect.unwrap`` of its dispatch
  decorator), so what runs is what was measured. KDA's inner kernels are dispatched inside FLA;
  where one of those would be redirected (a FLA backend is installed and enabled, and
  ``FLA_DISABLE_BACKEND_DISPATCH`` was not set before ``fla`` was imported) the KDA ops are
  rejected (reason ``toolchain``) instead of running something else. Unwrapping also removes
  FLA's ``input_guard`` from ``fused_recurrent_kda`` (contiguous inputs, the CUDA device set):
  decode does both itself, since its per-token calls hand over slices of ``[N, T, ...]``.

Declared: bf16 and fp16 q/k/v (not fp32: FLA carries the cumulative gate of its chunk kernels in
one fp32, which loses the mild decays after a gate at the floor, F28); fp32 and bf16 pools; ``vk``
and ``kv``; K, V in {64, 128}; GVA; ``has_initial_state``; precomputed gates; speculative verify
(``[N, T]`` tables, ``num_accepted_tokens``, intermediate states, ``disable_state_update``);
strided pools (the gather and scatter read them through their strides). Inputs are handed over
contiguous (``input_strides`` empty). Refused: autograd (inference only, as every backend here) and
prefill during CUDA-graph capture (FLA's chunk path reads ``cu_seqlens`` back to the host, and the
scatter's row mask syncs: reason ``capture``). Decode never syncs (its pool writes redirect padding
rows without a row mask, :func:`~linattn.backends.peer.write_rows`), so it runs in capture once an
eager call has self-checked its shape class.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import ClassVar, Optional

import torch

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.plugin.calls import DecodeCall, PrefillCall
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.verdict import Check, Reason

from .peer import (PeerBackend, gather_states, import_library, scatter_states, write_rows, zero_fresh_empty,
                   zero_padded_tokens)

#: FLA's public function per (family, phase), in the module that defines it
FUNCTIONS = {("gdn", "prefill"): ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
             ("kda", "prefill"): ("fla.ops.kda", "chunk_kda"),
             ("gdn", "decode"): ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
             ("kda", "decode"): ("fla.ops.kda", "fused_recurrent_kda")}
#: FLA operation registries whose redirections cannot be bypassed by unwrapping the public
#: function (they dispatch kernels inside it), per family
INNER_DISPATCH = {"gdn": (), "kda": ("kda",)}


def fla_function(family: str, phase: str):
    """FLA's own implementation of the op (its backend-dispatch wrappers unwrapped).

    Raises:
        ImportError: ``fla`` (or the op's module) does not import.
    """
    mod_name, fn_name = FUNCTIONS[(family, phase)]
    mod, err = import_library(mod_name)
    if mod is None:
        raise ImportError(f"import {mod_name}: {err}")
    return inspect.unwrap(getattr(mod, fn_name))


def inner_redirects(family: str) -> list[str]:
    """FLA backends that would replace kernels inside the ``family`` ops in this process
    (``operation -> backend type``); empty when FLA's dispatch is off or nothing is active."""
    backends, _ = import_library("fla.backends")
    if backends is None or getattr(backends, "_DISPATCH_DISABLED", False):
        return []
    out = []
    for operation in INNER_DISPATCH[family]:
        try:
            active = backends._load_operation_registry(operation).get_active()
        except Exception:  # noqa: BLE001 - a registry FLA cannot load redirects nothing
            continue
        if active is not None:
            out.append(f"{operation} -> {active.backend_type}")
    return out


class FLABackend(PeerBackend):
    """flash-linear-attention (fla-core 0.6) chunked prefill and fused recurrent decode, peer."""

    name: ClassVar[str] = "fla"
    summary: ClassVar[str] = "peer: flash-linear-attention's Triton kernels (pool gathered/scattered); GDN, KDA"
    library: ClassVar[str] = "fla"
    pip_name: ClassVar[str] = "fla-core"
    tested: ClassVar[str] = "fla-core 0.6.0"
    ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill", "kda_prefill", "gdn_decode", "kda_decode"})
    #: not float32: FLA's chunk kernels carry the cumulative gate in one fp32, which rounds away the
    #: mild decays after a gate at the floor (-1000, docs/ops.md F28); its fp32 decode is not declared
    #: either, so the conformance suite's base cases (its first declared dtype) test both phases
    dtypes: ClassVar[frozenset[str]] = frozenset({"bfloat16", "float16"})
    state_dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "bfloat16"})
    head_dims_k: ClassVar[frozenset[int]] = frozenset({64, 128})
    head_dims_v: ClassVar[frozenset[int]] = frozenset({64, 128})
    state_layouts: ClassVar[frozenset[str]] = frozenset({"vk", "kv"})
    requires: ClassVar[tuple[str, ...]] = ("triton",)
    strided_state_ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill", "kda_prefill", "gdn_decode",
                                                             "kda_decode"})
    features: ClassVar[frozenset[str]] = frozenset({"has_initial_state", "precomputed_gates"})

    def predicates(self):
        return super().predicates() + [self.supports_fla_path]

    def supports_toolchain(self, p: Problem, caps: DeviceCapabilities) -> Check:
        base = super().supports_toolchain(p, caps)
        if not base.ok:
            return base
        if getattr(caps.toolchain, "triton", None) is None:
            return Check.failed(Reason.TOOLCHAIN, "triton is not installed (FLA's kernels are Triton)",
                                "pip install 'linattn[triton]'")
        return Check.passed()

    def modules(self, p: Problem) -> tuple[str, ...]:
        key = (p.family, p.phase)
        return ("fla", FUNCTIONS[key][0]) if key in FUNCTIONS else ("fla",)

    def supports_fla_path(self, p: Problem, caps: DeviceCapabilities) -> Check:
        """The KDA ops only where FLA would run its own Triton kernels inside them (on a real device)."""
        if caps.profile is not None or caps.device_type != "cuda" or import_library("fla")[0] is None:
            return Check.passed()
        active = inner_redirects(p.family)
        if not active:
            return Check.passed()
        return Check.failed(Reason.TOOLCHAIN, f"FLA would redirect kernels inside {p.op} to another backend "
                            f"({', '.join(active)}): not what this backend declares or was measured as",
                            "set FLA_DISABLE_BACKEND_DISPATCH=1 before importing fla, or disable that FLA backend "
                            "(e.g. FLA_TILELANG=0)")

    def capture_refusal(self, p: Problem, caps: DeviceCapabilities) -> Optional[str]:
        """Prefill syncs (FLA's chunk path reads ``cu_seqlens`` back; the pool scatter builds a row
        mask); decode does not (gather, FLA's recurrent kernel, :func:`~linattn.backends.peer.write_rows`)."""
        if p.phase != "prefill":
            return None
        return (f"{self.name} prefill syncs with the host: FLA's chunk path reads cu_seqlens back "
                "(prepare_chunk_indices) and the pool scatter around FLA's pool-less kernel builds a row mask")

    def translation(self, p: Problem) -> str:
        fn = FUNCTIONS[(p.family, p.phase)][1] if p.phase in ("prefill", "decode") else "?"
        pool = ("pool rows gathered into a dense fp32 state and the final states scattered back"
                if p.mode == "pool" or p.phase == "decode" else "dense state handed over in fp32")
        return f"runs {fn} (FLA's dispatch bypassed), state_v_first={p.state_layout == 'vk'}, {pool}"

    # -- prefill -------------------------------------------------------------------------------------

    def prefill(self, call: PrefillCall):
        fn = fla_function(call.family, "prefill")
        T, HV, V = call.v.shape
        cu = call.cu_seqlens
        pool_mode = call.mode == "pool"
        if pool_mode:
            slots = call.state_indices
            read = slots >= 0
            if call.has_initial_state is not None:
                read = read & call.has_initial_state
            h0 = gather_states(call.state_pool, slots, read)
        else:
            h0 = call.initial_state.float() if call.initial_state is not None else None
        if T == 0:  # nothing to launch: the states stay as they were (fresh pool rows: zeros)
            o = call.v.new_zeros(0, HV, V)
            if pool_mode:
                zero_fresh_empty(call.state_pool, slots, call.has_initial_state, cu)
                return o, None
            return o, self._dense_final(call, h0)
        o, ht = fn(call.q[None], call.k[None], call.v[None], call.g.float()[None], call.beta.float()[None],
                   scale=call.scale, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=call.use_qk_l2norm,
                   state_v_first=call.state_layout == "vk", cu_seqlens=cu.long())
        o = o[0]
        if not pool_mode:
            return o, ht.to(call.initial_state.dtype if call.initial_state is not None else torch.float32)
        scatter_states(call.state_pool, slots, ht)
        zero_fresh_empty(call.state_pool, slots, call.has_initial_state, cu)
        return zero_padded_tokens(o, cu, slots < 0), None

    @staticmethod
    def _dense_final(call: PrefillCall, h0):
        if h0 is not None:  # a new tensor: a result never shares memory with an argument
            return h0.to(call.initial_state.dtype, copy=True)
        N, (HV, V), K = call.cu_seqlens.numel() - 1, call.v.shape[1:], call.q.shape[-1]
        shape = (N, HV, V, K) if call.state_layout == "vk" else (N, HV, K, V)
        return torch.zeros(shape, dtype=torch.float32, device=call.q.device)

    # -- decode --------------------------------------------------------------------------------------

    def decode(self, call: DecodeCall):
        N, T = call.q.shape[:2]
        HV, V = call.v.shape[2:]
        if N == 0 or T == 0:
            return call.v.new_zeros(N, T, HV, V)
        fn = fla_function(call.family, "decode")
        g, beta = decode_gates(call)
        load, pad, read = load_slots(call)
        h = gather_states(call.state_pool, load, read)
        table = call.state_indices.dim() == 2
        kw = dict(scale=call.scale, output_final_state=True, use_qk_l2norm_in_kernel=call.use_qk_l2norm,
                  state_v_first=call.state_layout == "vk")
        skip = torch.full_like(load, -1)
        unless_pad = lambda rows: torch.where(pad, skip, rows.to(skip.dtype))  # noqa: E731
        if not table and call.intermediate_states is None:  # one call for all T tokens
            o, h = launch(fn, call.q, call.k, call.v, g, beta, h, **kw)
        else:  # a state per token: one call per token
            outs = []
            for t in range(T):
                step = slice(t, t + 1)
                o_t, h = launch(fn, call.q[:, step], call.k[:, step], call.v[:, step], g[:, step], beta[:, step], h,
                                **kw)
                outs.append(o_t)
                if call.intermediate_states is not None:
                    write_rows(call.intermediate_states[:, t], unless_pad(call.intermediate_state_indices), h)
                if table and not call.disable_state_update:
                    write_rows(call.state_pool, unless_pad(call.state_indices[:, t]), h)
            o = torch.cat(outs, dim=1)
        if not table and not call.disable_state_update:
            write_rows(call.state_pool, unless_pad(load), h)
        return torch.where(pad.view(-1, 1, 1, 1), o.new_zeros(()), o)


def launch(fn, q, k, v, g, beta, initial_state, **kw):
    """One call of FLA's fused recurrent ``fn`` (GDN or KDA), as FLA 0.6 takes it.

    Every tensor after ``q, k, v`` is passed by keyword: FLA 0.6's
    ``fused_recurrent_gated_delta_rule`` is ``(q, k, v, g, gk, gv, beta, ...)`` (``gk``, ``gv``:
    per-key / per-value decays), so a positional ``beta`` would land in ``gk`` and be read as a
    ``[B, T, HV, K]`` decay, while ``fused_recurrent_kda`` is ``(q, k, v, g, beta, ...)``. Every
    tensor is handed over contiguous: FLA's kernels index ``[B, T, H, K]`` from the base pointer,
    and the unwrapped KDA function no longer has FLA's ``input_guard`` (which made them contiguous
    and set the CUDA device; the device is set here too).

    Args:
        fn: :func:`fla_function` of ``(family, "decode")``.
        q, k: ``[B, T, H, K]`` bf16/fp16; v: ``[B, T, HV, V]``.
        g: fp32 log-space decay, ``[B, T, HV]`` (GDN) or ``[B, T, HV, K]`` (KDA); beta: ``[B, T, HV]`` fp32.
        initial_state: ``[B, HV, V, K]`` (``state_v_first``) or ``[B, HV, K, V]`` fp32.
        kw: ``scale``, ``output_final_state``, ``use_qk_l2norm_in_kernel``, ``state_v_first``.
    Returns:
        ``(o [B, T, HV, V] in v's dtype, final state fp32 in initial_state's layout)``.
    """
    q, k, v, g, beta, initial_state = (x.contiguous() for x in (q, k, v, g, beta, initial_state))
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        return fn(q, k, v, g=g, beta=beta, initial_state=initial_state, **kw)


def decode_gates(call: DecodeCall) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` in fp32 for a decode call: the given ones (gate form) or torch-ref's gating of
    ``a, b, A_log, dt_bias`` (docs/ops.md, "Gating"), floored at -1000."""
    from .torch_ref import G_MIN, gdn_gating_ref, kda_gating_ref

    if call.g is not None:
        return call.g.float().clamp_min(G_MIN), call.beta.float()
    sp = dict(softplus_beta=call.softplus_beta, softplus_threshold=call.softplus_threshold)
    if call.family == "kda":
        return kda_gating_ref(call.A_log, call.a, call.b, call.dt_bias, lower_bound=call.lower_bound, **sp)
    return gdn_gating_ref(call.A_log, call.a, call.b, call.dt_bias, **sp)


def load_slots(call: DecodeCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(load [N], padding [N], read [N])`` of a decode call (docs/ops.md, "Speculative verify"):
    the slot each row's state is read from, whether the row is padding, and whether its slot is
    read (False: padding, ``num_accepted_tokens = 0``, or ``has_initial_state`` False). No sync."""
    idx = call.state_indices
    if idx.dim() == 1:
        load, fresh = idx, torch.zeros_like(idx, dtype=torch.bool)
        pad = load < 0
    elif call.num_accepted_tokens is None:
        load, fresh = idx[:, 0], torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        pad = load < 0
    else:
        nat = call.num_accepted_tokens.long()
        load = idx.gather(1, (nat - 1).clamp_min(0)[:, None]).squeeze(1)
        fresh = nat == 0
        pad = torch.where(fresh, idx[:, 0] < 0, load < 0)
    read = ~pad & ~fresh
    if call.has_initial_state is not None:
        read = read & call.has_initial_state
    return load, pad, read
