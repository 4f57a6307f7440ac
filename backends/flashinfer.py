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
- **the pool, prefill**: FlashInfer reads and writes it by index. A call without padding, fresh
  sequences, separate slots or checkpoints gets ``state_indices`` as they are (FlashInfer's plain
  form; ``use_cp="auto"`` from :data:`CP_MIN_TOKENS` tokens on, else its non-CP kernel). Every other
  call gets FlashInfer's read / write index pair, which only its non-CP kernel takes: read
  ``state_indices`` with ``-1`` where nothing is read (padding, ``has_initial_state`` False: the zero
  state), write ``output_state_indices`` (else ``state_indices``) with ``-1`` on padding (no write),
  so FlashInfer never reads or writes a padding row; padding sequences' outputs are zeroed. Which
  form applies is read from the indices on the host (one sync: prefill is eager). FlashInfer writes
  nothing for a zero-length sequence ("its write row keeps its contents"), whose final state is its
  initial state here: the backend copies its read row (zeros when fresh) to its write slot where
  they differ. A pool whose rows are not dense ``[HV, V, K]`` blocks is gathered into a dense fp32
  copy (the rows read, zeros where nothing is read), run there, and the copy's rows written to the
  write slots.
- **checkpoints** (``checkpoint_every`` = FlashInfer's ``checkpoint_every_n_tokens``, tokens, a
  multiple of 64 in both): FlashInfer's non-CP kernel stores the state after every
  ``checkpoint_every`` tokens of a sequence, up to and including its length (``len //
  checkpoint_every`` of them; none past it, none for an empty sequence), starting from the state it
  read (zeros for a ``-1`` read), into pool rows: the ``j``-th of sequence ``n`` to
  ``checkpoint_state_indices[checkpoint_cu_starts[n] + j]`` (``-1``: skipped), ``state_checkpoints``
  being the pool itself (rows must be dense blocks, as for the state). linattn's ``[N, M]`` table
  becomes that flat list (:class:`CheckpointRows`): ``checkpoint_cu_starts`` the cumulative
  counts, ``-1`` for checkpoints past ``M`` and for padding sequences. So checkpoints are written
  inside FlashInfer's state loop, no extra pass. With a pool whose rows are not dense, into a
  dense fp32 buffer, then to their slots. FlashInfer's ``prefix_lens`` (absolute positions) is not
  used: linattn counts from the call's first token.
- **dense mode**: ``initial_state`` (made contiguous) and a final-state buffer that starts as a copy
  of it (zeros without one): FlashInfer writes no final state for an empty sequence, whose final
  state is its initial state.
- **the pool, decode**: FlashInfer's fp32 pool kernel skips a ``-1`` row entirely (zero output,
  nothing read or written); every negative slot is handed over as ``-1``.

Declared: bf16 and fp16 q/k/v; fp32 and bf16 pools for prefill, fp32 for decode (FlashInfer's bf16
decode kernel redirects padding to slot 0, an ordinary slot here: rejected); ``vk`` only; K = V =
128; GVA; ``has_initial_state``, ``output_state_indices`` and ``checkpoints`` for prefill only;
NVIDIA arch sm_90, sm_100, sm_103 (CUDA >= 13) and sm_120. Refused: decode with ``T > 1``, a
``[N, T]`` table beyond T = 1, intermediate states, ``num_accepted_tokens``,
``disable_state_update``, precomputed gates, ``has_initial_state``, ``output_state_indices``
(reason ``feature``); prefill during CUDA-graph capture (reason ``capture``). Decode runs in capture
after one eager call of its shape (FlashInfer compiles the kernel at the first call).

Separate slots and checkpoints: written for FlashInfer 0.7.4's API as its source documents and
implements it (``flashinfer/gdn_prefill.py``, its SM90 kernel's ``checkpoint_entry``); checked on
the CPU against a stand-in (tests/peers); on the H200 at 67c126e ``linattn check --backend flashinfer --op
gdn_prefill`` passed 28 cases, separate slots and checkpoints included (benchmarks/results/check_h200.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.plugin.calls import DecodeCall, PrefillCall
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.verdict import Check, Reason

from .peer import PeerBackend, gather_states, import_library, scatter_states, zero_padded_tokens

#: natural-log decay clamp before ``alpha = exp(g)``: exp(-80) ~ 1.8e-35 is a normal fp32 number
LOG_ALPHA_MIN = -80.0
PREFILL_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_120")
DECODE_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_120")
#: archs whose FlashInfer GDN prefill needs CUDA 13
CUDA13_ARCHS = ("sm_100", "sm_103")
#: tokens per call from which a call in FlashInfer's plain form is handed ``use_cp="auto"`` (below it:
#: its non-CP kernel, as every call with padding, fresh rows, separate slots or checkpoints): 8,192 is
#: the smallest call its context-parallel kernels were measured on (1 x 8,192 and 8 x 1,024 at
#: Qwen3.5 TP8 heads, docs/performance.md "Prefill against FlashInfer"); shorter calls were not measured
#: either way
CP_MIN_TOKENS = 8192


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


def cp_choice(call: PrefillCall):
    """FlashInfer's ``use_cp`` for a call in its plain form (no padding, fresh rows, separate slots or
    checkpoints): ``"auto"`` from :data:`CP_MIN_TOKENS` tokens on (its own rule then picks the
    context-parallel kernels for few (sequence, head) pairs), else ``False`` (the non-CP kernel every
    other form runs), so that a short call and the same tokens inside a checkpointed call run the
    same kernel: a checkpoint is then bitwise a prefill stopped there."""
    return "auto" if call.q.shape[0] >= CP_MIN_TOKENS else False


@dataclass(frozen=True)
class PoolSlots:
    """A pool-mode call's slots in FlashInfer's terms: ``read [N]`` (``state_indices``; negative =
    padding), ``write [N]`` (``output_state_indices``, else ``read``; -1 on padding rows) and
    ``fresh [N]`` (``~has_initial_state``, or None)."""

    read: torch.Tensor
    write: torch.Tensor
    fresh: Optional[torch.Tensor]
    separate: bool

    @classmethod
    def of(cls, call: PrefillCall) -> "PoolSlots":
        read = call.state_indices
        out = call.output_state_indices
        write = out.to(read.dtype) if out is not None else read
        write = torch.where(write < 0, torch.full_like(write, -1), write)  # padding on the same rows (validated)
        fresh = ~call.has_initial_state if call.has_initial_state is not None else None
        return cls(read=read, write=write, fresh=fresh, separate=out is not None)

    @property
    def n(self) -> int:
        return self.read.numel()

    def loads(self) -> torch.Tensor:
        """``[N]`` bool: whether row n's read slot is read (not padding, not fresh)."""
        ok = self.read >= 0
        return ok & ~self.fresh if self.fresh is not None else ok

    def loads_as_minus_one(self) -> torch.Tensor:
        """The read slots with ``-1`` where nothing is read (FlashInfer: start from the zero state)."""
        return torch.where(self.loads(), self.read, torch.full_like(self.read, -1))

    def renumbered(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Read and write indices into a dense copy whose row n is sequence n's (``ids = 0..N-1``)."""
        minus = torch.full_like(ids, -1)
        return torch.where(self.loads(), ids, minus), torch.where(self.write >= 0, ids, minus)


def carry_empty(pool: torch.Tensor, slots: PoolSlots, cu_seqlens: torch.Tensor) -> None:
    """An empty sequence's final state is its initial state (docs/ops.md): FlashInfer writes nothing for
    it, so its write slot gets its read slot's row (zeros when fresh) here, where the two differ or it
    is fresh; padding rows are written nowhere. Nothing (no sync) for a call in place without
    ``has_initial_state``; otherwise one sync, and only the empty sequences' rows are copied."""
    if not slots.separate and slots.fresh is None:
        return
    moved = slots.write != slots.read
    if slots.fresh is not None:
        moved = moved | slots.fresh
    due = (cu_seqlens[1:] == cu_seqlens[:-1]) & moved & (slots.write >= 0)
    rows = due.nonzero().squeeze(1)
    if rows.numel():  # a read slot is written by no other sequence (validated): reading it after the call is safe
        states = gather_states(pool, slots.read.index_select(0, rows), slots.loads().index_select(0, rows))
        pool.index_copy_(0, slots.write.index_select(0, rows).long(), states.to(pool.dtype))


@dataclass(frozen=True)
class CheckpointRows:
    """linattn's checkpoints ``[N, M]`` slot table as FlashInfer's ``checkpoint_state_indices``: a flat
    list of rows, sequence n's j-th checkpoint at entry ``starts[n] + j``, ``starts`` the exclusive
    cumulative sum of ``len_n // checkpoint_every`` (FlashInfer's count: the state after every
    ``checkpoint_every`` tokens up to and including the sequence's length). Entries with ``j >= M``,
    of padding sequences or named ``-1`` are ``-1`` (skipped). The list has ``T // checkpoint_every``
    entries (at least the total count) plus one that collects the entries nobody reads; built on
    the device, no sync.

    ``target`` is the pool row an entry writes (``slot``), or, with a scratch copy (a pool whose rows
    are not dense blocks), the row ``n * M + j`` of a dense fp32 buffer, written back to the slots
    afterwards."""

    every: int
    starts: torch.Tensor
    rows: torch.Tensor
    written: torch.Tensor
    buffer: Optional[torch.Tensor]

    @classmethod
    def of(cls, call: PrefillCall, slots: PoolSlots, scratch: bool) -> "CheckpointRows":
        table, every, cu = call.checkpoint_indices, int(call.checkpoint_every), call.cu_seqlens.long()
        N, M = table.shape
        counts = (cu[1:] - cu[:-1]) // every
        starts = torch.cumsum(counts, 0) - counts
        j = torch.arange(M, device=table.device)
        due = (j.view(1, M) < counts.view(N, 1)) & (slots.read >= 0).view(N, 1) & (table >= 0)
        size = call.q.shape[0] // every  # >= sum(counts): the entries FlashInfer reads
        pos = torch.where(due, starts.view(N, 1) + j.view(1, M), size)
        buffer = None
        target = table
        if scratch:
            pool = call.state_pool
            buffer = torch.zeros(N * M, *pool.shape[1:], device=pool.device)
            target = torch.arange(N * M, device=table.device, dtype=table.dtype).view(N, M)
        rows = torch.full((size + 1,), -1, device=table.device, dtype=table.dtype)
        rows.scatter_(0, pos.flatten(), torch.where(due, target, -1).flatten())
        written = torch.where(due, table, torch.full_like(table, -1)).flatten()
        return cls(every=every, starts=starts.to(torch.int32), rows=rows, written=written, buffer=buffer)

    def arguments(self, pool: Optional[torch.Tensor]) -> dict:
        """FlashInfer's checkpoint keywords; ``pool`` is where they go (None: the scratch buffer)."""
        return dict(checkpoint_every_n_tokens=self.every, checkpoint_cu_starts=self.starts,
                    checkpoint_state_indices=self.rows,
                    state_checkpoints=pool if pool is not None else self.buffer)

    def write_back(self, pool: torch.Tensor) -> None:
        """Scratch only: the buffer's written rows to their slots (rounded to the pool's dtype)."""
        scatter_states(pool, self.written, self.buffer)


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
    #: prefill only (decode refuses all three: supports_decode): has_initial_state and
    #: output_state_indices as FlashInfer's read / write index pair; checkpoints through its
    #: checkpoint_state_indices (see the module docstring)
    features: ClassVar[frozenset[str]] = frozenset({"has_initial_state", "output_state_indices", "checkpoints"})

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
            (p.output_state_indices, "output_state_indices (separate write slots are wired for FlashInfer's prefill "
                                     "only)"),
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
            note = ("chunk_gated_delta_rule(backend='flashinfer') with alpha = exp(max(g, -80)), the pool read and "
                    "written by index (-1 rows neither read nor written)")
            if p.mode == "pool" and p.output_state_indices:
                note += "; output_state_indices as FlashInfer's own (its non-CP kernel)"
            if p.mode == "pool" and p.checkpoints:
                note += ("; checkpoints stored by FlashInfer's non-CP kernel into the named slots "
                         "(checkpoint_state_indices, one entry per checkpoint due)")
            return note
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
        slots = PoolSlots.of(call)
        if T == 0:  # no launch; empty sequences still hand their initial state to their write slots
            carry_empty(call.state_pool, slots, call.cu_seqlens)
            return call.v.new_zeros(0, HV, V), None
        return self._prefill_pool(fn, call, slots, kw), None

    @staticmethod
    def alpha(g: torch.Tensor) -> torch.Tensor:
        """FlashInfer's linear decay from linattn's log decay: ``exp(max(g, LOG_ALPHA_MIN))``, fp32."""
        return torch.exp(g.float().clamp_min(LOG_ALPHA_MIN))

    def _prefill_pool(self, fn, call: PrefillCall, slots: "PoolSlots", kw: dict) -> torch.Tensor:
        """Pool mode: FlashInfer reads and writes the pool (or a dense fp32 copy of the named rows when the
        pool's rows are not dense blocks) by index; checkpoints go to their slots (or through the copy)."""
        pool = call.state_pool
        padded = bool((slots.read < 0).any())  # the one host read: prefill is eager (capture_refusal)
        due = call.checkpoint_every and call.q.shape[0] >= call.checkpoint_every  # else no sequence has one
        # FlashInfer's checkpoint pool also needs a slot pitch of at least one row (any pool of P >= 2
        # linattn accepts has one: rows may not overlap)
        scratch = not dense_rows(pool) or bool(due and pool.stride(0) < pool[0].numel())
        if scratch:  # a dense fp32 copy of the rows read, indexed 0..N-1, written back below
            work = gather_states(pool, slots.read, slots.loads())
            ids = torch.arange(slots.n, device=pool.device, dtype=slots.read.dtype)
            read_idx, write_idx = slots.renumbered(ids)
        else:
            work, read_idx, write_idx = pool, slots.loads_as_minus_one(), slots.write
        ckpt = CheckpointRows.of(call, slots, scratch) if due else None
        if padded or slots.fresh is not None or slots.separate or ckpt is not None:  # the index pair: non-CP only
            extra = dict(state_indices=read_idx.contiguous(), output_state_indices=write_idx.contiguous(),
                         use_cp=False)
            if ckpt is not None:
                extra.update(ckpt.arguments(work if not scratch else None))
        else:
            extra = dict(state_indices=read_idx.contiguous(), use_cp=cp_choice(call))
        o = fn(call.q, call.k, call.v, self.alpha(call.g), call.beta.float(), initial_state=work,
               output_state=work, **extra, **kw)
        o = o[0] if isinstance(o, tuple) else o
        if scratch:
            scatter_states(pool, slots.write, work)
            if ckpt is not None:
                ckpt.write_back(pool)
        else:  # FlashInfer writes nothing for an empty sequence: its initial state goes to its write slot here
            carry_empty(pool, slots, call.cu_seqlens)
        return zero_padded_tokens(o, call.cu_seqlens, slots.read < 0) if padded else o

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
