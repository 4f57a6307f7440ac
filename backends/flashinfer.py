"""``flashinfer``: FlashInfer's (flashinfer-python 0.7.4) GDN kernels as a peer backend.

Ops: ``gdn_prefill`` (``flashinfer.gdn_prefill.chunk_gated_delta_rule``: CuTe DSL kernels for SM90,
SM100/SM103 and SM120, compiled at their first call) and ``gdn_decode`` with ``T = 1``
(``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose``, its fp32-pool kernel). Both pinned
to FlashInfer's own kernels (``backend="flashinfer"``), so what runs is what was measured. Layout
as FlashInfer documents it: packed ``q, k [T, H, K]``, ``v [T, HV, V]``, gates ``[T, HV]``,
states ``[N, HV, V, K]`` (linattn's ``vk``), ``K = V = 128``.

The translation (the backend's, counted in its time):

- **gate**: FlashInfer's prefill takes the linear decay ``alpha = exp(g)`` and ``beta`` in fp32
  (its SM90 kernel raises on another dtype; linattn also accepts fp64 gates); ``g`` is clamped at
  :data:`LOG_ALPHA_MIN` first, so that ``alpha > 0`` (the kernel takes its log2; ``exp(-1000)``
  would be 0 and its log ``-inf``). A decay of ``exp(-80)`` wipes an fp32 state as surely as
  ``exp(-1000)``. Decode takes the raw ``a, b, A_log, dt_bias`` (``A_log`` and ``dt_bias``
  handed over in fp32) and gates inside with softplus(beta=1, threshold=20): other softplus
  parameters are refused by :meth:`FlashInferBackend.decode` (a ValueError before FlashInfer runs;
  the Problem does not carry them, so selection cannot reject them and fall back).
- **the pool, prefill**: FlashInfer reads and writes it by index. Without padding or
  ``has_initial_state`` it gets ``state_indices`` as they are; otherwise a read index and a write
  index (``output_state_indices``): ``-1`` reads the zero state (padding, fresh sequences) and
  ``-1`` skips the write (padding), so FlashInfer never reads or writes a padding row; padding
  sequences' outputs are zeroed. Which form applies is read from the indices on the host (one
  sync: prefill is eager). FlashInfer writes nothing for an empty sequence, so the slot of an
  empty fresh one gets its zeros from the backend. A pool whose rows are not dense ``[HV, V, K]``
  blocks is gathered into a dense fp32 copy and written back.
- **dense mode**: ``initial_state`` (made contiguous) and a final-state buffer that starts as a copy
  of it (zeros without one): FlashInfer writes no final state for an empty sequence, whose final
  state is its initial state.
- **the pool, decode**: FlashInfer's fp32 pool kernel skips a ``-1`` row entirely (zero output,
  nothing read or written); every negative slot is handed over as ``-1``.

Declared: bf16 and fp16 q/k/v; fp32 and bf16 pools for prefill, fp32 for decode (FlashInfer's bf16
decode kernel redirects padding to slot 0, an ordinary slot here: rejected); ``vk`` only; K = V =
128; GVA; ``has_initial_state`` for prefill only; NVIDIA arch sm_90, sm_100, sm_103 (CUDA >= 13)
and sm_120. Refused: decode with ``T > 1``, a ``[N, T]`` table beyond T = 1, intermediate states,
``num_accepted_tokens``, ``disable_state_update``, precomputed gates (reason ``feature``); prefill
during CUDA-graph capture (reason ``capture``). Decode runs in capture after one eager call of
its shape (FlashInfer compiles the kernel at the first call).
"""

from __future__ import annotations

from typing import ClassVar, Optional

import torch

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.calls import DecodeCall, PrefillCall
from linattn.dispatch.problem import Problem
from linattn.dispatch.verdict import Check, Reason

from .peer import PeerBackend, gather_states, import_library, scatter_states, zero_fresh_empty, zero_padded_tokens

#: natural-log decay clamp before ``alpha = exp(g)``: exp(-80) ~ 1.8e-35 is a normal fp32 number
LOG_ALPHA_MIN = -80.0
PREFILL_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_120")
DECODE_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_120")
#: archs whose FlashInfer GDN prefill needs CUDA 13
CUDA13_ARCHS = ("sm_100", "sm_103")


#: FlashInfer's module and function per phase
MODULES = {"prefill": ("flashinfer.gdn_prefill", "chunk_gated_delta_rule"),
           "decode": ("flashinfer.gdn_decode", "gated_delta_rule_decode_pretranspose")}


def flashinfer_function(phase: str):
    """FlashInfer's prefill (``chunk_gated_delta_rule``) or decode
    (``gated_delta_rule_decode_pretranspose``) function.

    Raises:
        ImportError: the module does not import.
    """
    mod_name, fn = MODULES[phase]
    mod, err = import_library(mod_name)
    if mod is None:
        raise ImportError(f"import {mod_name}: {err}")
    return getattr(mod, fn)


def dense_rows(pool: torch.Tensor) -> bool:
    """Whether each pool row is one dense ``[HV, V, K]`` block (the slot pitch is free)."""
    _, HV, V, K = pool.shape
    return pool.stride(3) == 1 and pool.stride(2) == K and pool.stride(1) == V * K


class FlashInferBackend(PeerBackend):
    """FlashInfer GDN prefill (pool by index) and T = 1 decode (fp32 pool), peer."""

    name: ClassVar[str] = "flashinfer"
    summary: ClassVar[str] = "peer: FlashInfer's CuTe DSL GDN prefill (SM90/SM100/SM120) and fp32-pool decode"
    library: ClassVar[str] = "flashinfer"
    pip_name: ClassVar[str] = "flashinfer-python"
    tested: ClassVar[str] = "flashinfer-python 0.7.4"
    ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill", "gdn_decode"})
    dtypes: ClassVar[frozenset[str]] = frozenset({"bfloat16", "float16"})
    state_dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "bfloat16"})
    head_dims_k: ClassVar[frozenset[int]] = frozenset({128})
    head_dims_v: ClassVar[frozenset[int]] = frozenset({128})
    state_layouts: ClassVar[frozenset[str]] = frozenset({"vk"})
    #: prefill gathers a pool without dense rows; decode hands FlashInfer the pool (dense tiles
    #: with any slot and head pitch are not promised by its decode kernel): see supports_decode
    strided_state_ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill"})
    features: ClassVar[frozenset[str]] = frozenset({"has_initial_state"})

    def predicates(self):
        ps = super().predicates()
        i = ps.index(self.supports_device) + 1
        return ps[:i] + [self.supports_arch] + ps[i:] + [self.supports_decode]

    def supports_arch(self, p: Problem, caps: DeviceCapabilities) -> Check:
        archs = PREFILL_ARCHS if p.phase == "prefill" else DECODE_ARCHS
        if caps.vendor != "nvidia" or caps.arch not in archs:
            return Check.failed(Reason.ARCH, f"arch={caps.arch!r} ({caps.vendor}, {caps.name}); FlashInfer's GDN "
                                f"{p.phase} kernels: NVIDIA {{{', '.join(archs)}}}",
                                "on other GPUs the dispatcher picks among the eligible backends")
        cuda = caps.toolchain.cuda
        if p.phase == "prefill" and caps.arch in CUDA13_ARCHS and (cuda is None or int(cuda.split(".")[0]) < 13):
            return Check.failed(Reason.TOOLCHAIN, f"CUDA {cuda} on {caps.arch}: FlashInfer's Blackwell GDN prefill "
                                "needs CUDA >= 13", "use a CUDA 13 build of torch")
        return Check.passed()

    def modules(self, p: Problem) -> tuple[str, ...]:
        return ("flashinfer", MODULES[p.phase][0]) if p.phase in MODULES else ("flashinfer",)

    def supports_toolchain(self, p: Problem, caps: DeviceCapabilities) -> Check:
        """The library imports (:class:`PeerBackend`) and, on a real SM90 device, its CuTe DSL prefill
        kernel is there (FlashInfer imports without CuTe DSL and then has none)."""
        base = super().supports_toolchain(p, caps)
        if not base.ok or p.phase != "prefill" or caps.profile is not None or caps.arch != "sm_90":
            return base
        kernels, err = import_library("flashinfer.gdn_kernels")
        if kernels is None or getattr(kernels, "chunk_gated_delta_rule_sm90", None) is None:
            return Check.failed(Reason.TOOLCHAIN, "FlashInfer imports but its SM90 GDN prefill kernel is missing "
                                f"(flashinfer.gdn_kernels.chunk_gated_delta_rule_sm90 is None{': ' + err if err else ''})",
                                "install CuTe DSL: pip install 'nvidia-cutlass-dsl>=4.4'")
        return base

    def supports_decode(self, p: Problem, caps: DeviceCapabilities) -> Check:
        """Decode: one token, raw gates at the default softplus, an fp32 pool, no verify features."""
        if p.phase != "decode":
            return Check.passed()
        refused = [what for flag, what in (
            (p.t != 1, f"T={p.t} (speculative verify: FlashInfer's verify kernel is not wired here)"),
            (p.intermediate_states, "intermediate_states"), (p.num_accepted_tokens, "num_accepted_tokens"),
            (p.disable_state_update, "disable_state_update=True"),
            (p.precomputed_gates, "precomputed gates (g=, beta=): FlashInfer's decode gates inside"),
            (p.has_initial_state, "has_initial_state= (FlashInfer's decode skips a -1 row instead of starting "
                                  "it from zero)")) if flag]
        if refused:
            return Check.failed(Reason.FEATURE, f"gdn_decode with {'; '.join(refused)}: not supported by {self.name}",
                                "another backend runs it")
        if p.state_dtype != "float32":
            return Check.failed(Reason.DTYPE, f"decode state dtype={p.state_dtype}: FlashInfer's bf16-state decode "
                                "redirects padding rows to slot 0, which is an ordinary slot in linattn's contract; "
                                "supported for decode: {float32}", "another backend runs bf16 pools")
        if not p.state_tiles_contiguous:
            return Check.failed(Reason.LAYOUT, "decode with a pool whose state tiles are not dense blocks",
                                "pass a pool whose last two dims are contiguous")
        return Check.passed()

    def capture_refusal(self, p: Problem, caps: DeviceCapabilities) -> Optional[str]:
        if p.phase == "prefill":
            return ("flashinfer prefill reads state_indices back to the host (one sync, to pick FlashInfer's pool "
                    "form) and compiles its CuTe DSL kernels at the first call")
        return None

    def translation(self, p: Problem) -> str:
        if p.phase == "prefill":
            return ("chunk_gated_delta_rule(backend='flashinfer') with alpha = exp(max(g, -80)), the pool read and "
                    "written by index (-1 rows neither read nor written)")
        return "gated_delta_rule_decode_pretranspose(backend='flashinfer'), fp32 pool by index, negative slots as -1"

    # -- prefill -------------------------------------------------------------------------------------

    def prefill(self, call: PrefillCall):
        fn = flashinfer_function("prefill")
        T, HV, V = call.v.shape
        K = call.q.shape[-1]
        N = call.cu_seqlens.numel() - 1
        kw = dict(scale=call.scale, output_final_state=True, cu_seqlens=call.cu_seqlens,
                  use_qk_l2norm_in_kernel=call.use_qk_l2norm, backend="flashinfer")
        if call.mode == "dense":
            h0 = call.initial_state
            if T == 0:
                return call.v.new_zeros(0, HV, V), (h0.clone() if h0 is not None else
                                                    torch.zeros(N, HV, V, K, device=call.q.device))
            # FlashInfer reads and writes dense [N, HV, V, K] blocks and writes nothing for a zero-length
            # sequence (the H200 self-check's final state failed, relative error 1.07, with an empty
            # output buffer): the buffer starts as the initial state (zeros without one), which is an
            # empty sequence's final state.
            h0 = h0.contiguous() if h0 is not None else None
            out_state = h0.clone() if h0 is not None else torch.zeros(N, HV, V, K, device=call.q.device)
            o, ht = fn(call.q, call.k, call.v, self.alpha(call.g), call.beta.float(), initial_state=h0,
                       output_state=out_state, **kw)
            return o, ht
        if T == 0:
            zero_fresh_empty(call.state_pool, call.state_indices, call.has_initial_state, call.cu_seqlens)
            return call.v.new_zeros(0, HV, V), None
        o = self._prefill_pool(fn, call, kw)
        # FlashInfer writes nothing for an empty sequence; a fresh one's slot must read zeros afterwards
        zero_fresh_empty(call.state_pool, call.state_indices, call.has_initial_state, call.cu_seqlens)
        return o, None

    @staticmethod
    def alpha(g: torch.Tensor) -> torch.Tensor:
        """FlashInfer's linear decay from linattn's log decay: ``exp(max(g, LOG_ALPHA_MIN))``, fp32."""
        return torch.exp(g.float().clamp_min(LOG_ALPHA_MIN))

    def _prefill_pool(self, fn, call: PrefillCall, kw: dict) -> torch.Tensor:
        slots, pool = call.state_indices, call.state_pool
        scratch = not dense_rows(pool)
        if scratch:  # a dense fp32 copy of the named rows, indexed 0..N-1, written back below
            read_all = slots >= 0
            work = gather_states(pool, slots, read_all)
            ids = torch.arange(slots.numel(), device=slots.device, dtype=slots.dtype)
            idx = torch.where(read_all, ids, torch.full_like(ids, -1))
        else:
            work, idx = pool, slots
        padded = bool((slots < 0).any())  # the one host read: prefill is eager (capture_refusal)
        if padded or call.has_initial_state is not None:
            read = idx >= 0
            if call.has_initial_state is not None:
                read = read & call.has_initial_state
            minus = torch.full_like(idx, -1)
            o = fn(call.q, call.k, call.v, self.alpha(call.g), call.beta.float(), initial_state=work,
                   output_state=work, state_indices=torch.where(read, idx, minus).contiguous(),
                   output_state_indices=torch.where(idx >= 0, idx, minus).contiguous(), use_cp=False, **kw)
        else:
            o = fn(call.q, call.k, call.v, self.alpha(call.g), call.beta.float(), initial_state=work,
                   output_state=work, state_indices=idx.contiguous(), **kw)
        o = o[0] if isinstance(o, tuple) else o
        if scratch:
            scatter_states(pool, slots, work)
        return zero_padded_tokens(o, call.cu_seqlens, slots < 0) if padded else o

    # -- decode --------------------------------------------------------------------------------------

    def decode(self, call: DecodeCall):
        if (call.softplus_beta, call.softplus_threshold) != (1.0, 20.0):  # not in the Problem: no predicate sees it
            raise ValueError(f"{self.name} decode gates inside FlashInfer's kernel with softplus(beta=1, threshold=20), "
                             f"which its API does not let a caller change; got softplus_beta={call.softplus_beta}, "
                             f"softplus_threshold={call.softplus_threshold}. Run this call on another backend "
                             "(e.g. backend='triton-split'), or pass precomputed g, beta (flashinfer then declines it)")
        N, T = call.q.shape[:2]
        HV, V = call.v.shape[2:]
        if N == 0 or T == 0:
            return call.v.new_zeros(N, T, HV, V)
        fn = flashinfer_function("decode")
        slots = call.state_indices if call.state_indices.dim() == 1 else call.state_indices[:, 0]
        slots = torch.where(slots < 0, torch.full_like(slots, -1), slots).contiguous()
        o, _ = fn(call.q, call.k, call.v, None, call.A_log.float(), call.a, call.dt_bias.float(), call.b,
                  scale=call.scale, use_qk_l2norm=call.use_qk_l2norm, initial_state=call.state_pool,
                  initial_state_indices=slots, backend="flashinfer")
        return o
