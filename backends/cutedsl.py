"""``cutedsl``: chunked prefill (GDN, KDA) whose state kernel is written in CuTe DSL.

The state stage (the sequential pass over chunks, the one that reads and writes the state pool)
is :mod:`linattn.kernels.cutedsl` (warp-level ``mma.sync``, ``ldmatrix`` and ``cp.async``: the
same instructions on SM90 and SM100); the intra-chunk and output stages are the Triton prefill's.
Pool mode reads ``h0`` from ``state_pool[state_indices[n]]`` and writes the final state to the same
row inside the kernel; a negative index reads and writes nothing (zero output for that sequence).

Eligibility: an NVIDIA GPU of arch sm_90, sm_100 or sm_103 (other GPUs, AMD included: reason
``arch``); nvidia-cutlass-dsl >= 4.8 (and new enough for the arch: a rejection names both) and
Triton installed; bf16 q/k/v; fp32 or bf16 state; K, V in {64, 128};
state layouts ``vk`` and ``kv``. Rank: first for prefill on SM100/SM103 (the design card); on SM90
only for the shape classes in :data:`SM90_FASTER` (where H200 measurements put it ahead of
``triton-split``: at present none; that table says why), otherwise behind it.

Verification: the kernels ran (and match the float64 reference) on SM90 only; on SM100 / SM103
they are compile-checked. ``verified_archs = {sm_90}``, so there every op and shape class
self-checks against torch-ref on its first eager call before any user data, ``explain`` marks the
verdict ``verified=False`` until then, and CUDA-graph capture does not choose it before that
(``dispatch/runtime/self_check.py``).

``nvidia-cutlass-dsl`` is imported only when a kernel is compiled, so this module imports
without it (reason ``toolchain`` then).
"""

from __future__ import annotations

from typing import ClassVar

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.verdict import Check, Rank, Reason
from linattn.kernels.cutedsl import (MIN_DSL_FOR_ARCH, MIN_DSL_VERSION, SUPPORTED_ARCHS, SUPPORTED_K,
                                     SUPPORTED_V, importable, parse_version)

from .base import Backend
from .triton import TRITON_INPUT_STRIDES

RANK_FIRST = Rank.PREFERRED  # 5: ahead of triton-split (Rank.NATIVE, 20) and torch-ref (1000)
RANK_BEHIND = Rank.BEHIND_NATIVE  # 60: behind triton-split, ahead of the reference

#: Shape classes (see :func:`shape_class`) where cutedsl measured faster than triton-split on the
#: H200 (SM90), per family: none. The cutedsl prefill runs the Triton intra and output stages with
#: its own state stage, so the state stages decide (docs/performance.md#cutedsl-rank-on-sm90).
SM90_FASTER: dict[str, frozenset[str]] = {"gdn": frozenset(), "kda": frozenset()}


def shape_class(p: Problem) -> str:
    """``long`` (>= 2,048 tokens per sequence on average), ``medium`` (>= 512) or ``short``."""
    avg = p.t / max(p.n, 1)
    return "long" if avg >= 2048 else "medium" if avg >= 512 else "short"


def _ver(t: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in t)


class CuteDSLBackend(Backend):
    """Chunked prefill with the CuTe DSL state kernel (SM90 / SM100 / SM103; bf16)."""

    name: ClassVar[str] = "cutedsl"
    api_version: ClassVar[str] = "2"  # dispatched through the phase methods; their defaults run the op methods
    summary: ClassVar[str] = "CuTe DSL state kernel (mma.sync, pool read/written in place) + Triton stages; prefill"
    ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill", "kda_prefill"})
    vendors: ClassVar[frozenset[str]] = frozenset({"nvidia"})
    dtypes: ClassVar[frozenset[str]] = frozenset({"bfloat16"})
    state_dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "bfloat16"})
    head_dims_k: ClassVar[frozenset[int]] = frozenset(SUPPORTED_K)
    head_dims_v: ClassVar[frozenset[int]] = frozenset(SUPPORTED_V)
    state_layouts: ClassVar[frozenset[str]] = frozenset({"vk", "kv"})
    requires: ClassVar[tuple[str, ...]] = ("cutlass_dsl", "triton")
    archs: ClassVar[tuple[str, ...]] = SUPPORTED_ARCHS
    #: Run and checked against the float64 reference on an H200 only (sm_90; tests/gpu,
    #: benchmarks/results). sm_100 / sm_103 are compile-checked, never run: there the first eager
    #: call of each op and shape class self-checks against torch-ref (dispatch/runtime/self_check.py), and
    #: a failure routes prefill to the next backend. Its rank there stays first (the design).
    verified_archs: ClassVar[frozenset[str]] = frozenset({"sm_90"})
    #: the Triton stages read these views as the Triton backends do; the CuTe DSL state kernel
    #: copies a misaligned k or g itself and takes every state stride
    input_strides: ClassVar = {op: TRITON_INPUT_STRIDES[op] for op in ("gdn_prefill", "kda_prefill")}
    strided_state_ops: ClassVar[frozenset[str]] = frozenset({"gdn_prefill", "kda_prefill"})
    #: pool-mode has_initial_state: the state kernel skips the h0 load of a fresh sequence (HAS_INIT);
    #: output_state_indices: the read rows are copied into the write rows first (Triton's fork_slots),
    #: then the state kernel runs in place there; checkpoints: the state kernel stores them in its chunk
    #: loop (StateKernel.store_checkpoint; docs/ops.md "State checkpoints")
    features: ClassVar[frozenset[str]] = frozenset({"has_initial_state", "output_state_indices", "checkpoints"})

    def predicates(self):
        ps = super().predicates()
        i = ps.index(self.supports_device) + 1
        return ps[:i] + [self.supports_arch] + ps[i:]

    def supports_device(self, p: Problem, caps: DeviceCapabilities) -> Check:
        # GPUs of any vendor reach the arch predicate (an AMD part is rejected there, by arch)
        if caps.device_type == "cuda":
            return Check.passed()
        return Check.failed(Reason.DEVICE, f"device_type={caps.device_type!r} ({caps.name}); supported: "
                            f"CUDA GPUs of arch {{{', '.join(self.archs)}}}", "run on an SM90, SM100 or SM103 GPU")

    def supports_arch(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if caps.vendor == "nvidia" and caps.arch in self.archs:
            return Check.passed()
        return Check.failed(Reason.ARCH, f"arch={caps.arch!r} ({caps.vendor}, {caps.name}); supported: "
                            f"NVIDIA {{{', '.join(self.archs)}}}", "on other GPUs the dispatcher picks among the eligible backends: see `linattn explain`")

    def supports_toolchain(self, p: Problem, caps: DeviceCapabilities) -> Check:
        base = super().supports_toolchain(p, caps)
        if not base.ok:
            return base
        ver = caps.toolchain.cutlass_dsl
        need = max(MIN_DSL_VERSION, MIN_DSL_FOR_ARCH.get(caps.arch, MIN_DSL_VERSION))
        if parse_version(ver) < need:
            return Check.failed(Reason.TOOLCHAIN, f"nvidia-cutlass-dsl {ver} is too old for {caps.arch}: the cutedsl "
                                f"kernels need >= {_ver(need)} there", "pip install -U 'linattn[cutedsl]'")
        if caps.profile is None and caps.device_type == "cuda":  # a real device: the DSL must import
            err = importable()
            if err is not None:
                return Check.failed(Reason.TOOLCHAIN, f"nvidia-cutlass-dsl {ver} is installed but does not import: "
                                    f"{err}", "reinstall it: pip install -U 'linattn[cutedsl]'")
        return Check.passed()

    def size_class(self, p: Problem, caps: DeviceCapabilities) -> str:
        """:meth:`rank` reads the sizes through :func:`shape_class`, on SM90 only (no predicate does)."""
        return shape_class(p) if caps.arch == "sm_90" else ""

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        if caps.arch in ("sm_100", "sm_103"):
            return RANK_FIRST
        if caps.arch == "sm_90" and shape_class(p) in SM90_FASTER.get(p.family, frozenset()):
            return RANK_FIRST
        return RANK_BEHIND

    # -- ops --------------------------------------------------------------------------------------

    def gdn_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", has_initial_state=None,
                    output_state_indices=None, checkpoint_every=None, checkpoint_indices=None):
        """GDN chunked prefill (docs/ops.md ``gdn_prefill``); see :mod:`linattn.kernels.cutedsl.prefill`."""
        return self._prefill("gdn", q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                             state_indices=state_indices, initial_state=initial_state, scale=scale,
                             use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                             has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                             checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices)

    def kda_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", has_initial_state=None,
                    output_state_indices=None, checkpoint_every=None, checkpoint_indices=None):
        """KDA chunked prefill (docs/ops.md ``kda_prefill``); see :mod:`linattn.kernels.cutedsl.prefill`."""
        return self._prefill("kda", q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                             state_indices=state_indices, initial_state=initial_state, scale=scale,
                             use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                             has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                             checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices)

    @staticmethod
    def _prefill(family, *, scale, **kw):
        from linattn.kernels.cutedsl.prefill import cutedsl_prefill

        K = kw["q"].shape[-1]
        return cutedsl_prefill(family, scale=K ** -0.5 if scale is None else float(scale), **kw)
