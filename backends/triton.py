"""The Triton backends' shared body: one class, two launch-grid layouts.

``triton-split`` (:mod:`linattn.backends.triton_split`) and ``triton-folded``
(:mod:`linattn.backends.triton_folded`) run the same kernels (``kernels/triton/``); they differ
only in the launch-grid layout the planner builds (``split``: sequence, head and value block on
separate axes, for CUDA; ``folded``: the legacy ``(NK, NV, N*HV)`` grid, for ROCm and XPU) and in
where they may run without being forced. The contract test proves both layouts give bitwise
equal results.

Triton is imported lazily (inside the op methods), so ``import linattn`` works without it; a
missing Triton is a ``toolchain`` rejection.

Running in the Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) is possible for tests:
both backends are then eligible only when forced (``needs_forcing``).
"""

from __future__ import annotations

import functools
from typing import ClassVar, Optional

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.lru import GRID_FITS_MAX, LRUCache
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.rules.value_rules import FUSABLE_DECODE, FUSABLE_PREFILL, PREFILL_RULE, ValueCheckHook
from linattn.dispatch.plugin.verdict import Check, Rank, Reason
from linattn.kernels.triton.limits import MAX_HEAD_DIM

from .base import Backend

#: Ops these backends implement (decode: ``kernels/triton/decode.py``; chunked prefill:
#: ``kernels/triton/prefill/``; SwiGLU clamp: ``kernels/triton/silu_clamp.py``).
TRITON_OPS = frozenset({"gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill", "silu_and_mul_clamp"})

_QKV_ROWS = {"q": "inner", "k": "inner", "v": "inner"}
#: The read-only arguments the Triton launchers pass with their strides (``Backend.input_strides``):
#: q/k/v rows, gate views (F11; decode's precomputed g / beta as its a / b), the decode slot table and a
#: dense prefill's initial state. ``has_initial_state`` is read as a contiguous array (copied). The small
#: per-head and per-sequence tensors (``A_log``, ``dt_bias``, ``cu_seqlens``, prefill's
#: ``state_indices``, ``num_accepted_tokens``, ``intermediate_state_indices``) are read as
#: contiguous, so the dispatcher copies views of them (field case F25).
TRITON_INPUT_STRIDES = {
    "gdn_decode": {**_QKV_ROWS, "a": "any", "b": "any", "g": "any", "beta": "any", "state_indices": "any"},
    "kda_decode": {**_QKV_ROWS, "a": "inner", "b": "any", "g": "inner", "beta": "any", "state_indices": "any"},
    "gdn_prefill": {**_QKV_ROWS, "g": "any", "beta": "any", "initial_state": "any"},
    "kda_prefill": {**_QKV_ROWS, "g": "inner", "beta": "any", "initial_state": "any"},
    "silu_and_mul_clamp": {"x": "inner"},
}


#: per (layout, op, N, HV, K, V, D, dtype, device capabilities): whether the grid fits (``size_class``)
_GRID_FITS = LRUCache(GRID_FITS_MAX)


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


class TritonValueChecks(ValueCheckHook):
    """The Triton backends' value-check hook (``Backend.value_check_hook``, held by the registry): a
    call's decode or prefill value rules as one kernel that computes every flag
    (``kernels/triton/value_checks.py``) and one sync, run by the dispatcher's call plans
    (``dispatch/rules/value_rules.py`` ``fused_value_check``) whichever backend the call chose."""

    @staticmethod
    def available() -> bool:
        """Where the direct Triton launch runs (``kernels/triton/launch.py`` ``fast_launch_status``:
        CUDA, a tested Triton, no interpreter)."""
        from linattn.kernels.triton.launch import fast_launch_status

        return fast_launch_status()[0]

    @staticmethod
    def plan(rules: frozenset, args: dict, dims: dict, like=None):
        """The kernel's planned check for ``rules`` (decode's or prefill's), or None; ``like``: the
        planned check of another length of the call's class (its launch is derived from)."""
        from linattn.kernels.triton import value_checks

        if args.get("output_state_indices") is not None:  # separate write slots: the kernel has no rule for them
            return None
        if args.get("checkpoint_indices") is not None:  # checkpoint slots: nor for them
            return None
        if PREFILL_RULE in rules and rules <= FUSABLE_PREFILL:
            return value_checks.plan_prefill_value_check(
                args, slots=dims.get("p"), tokens=dims["t"], shared_slots=dims["writes_pool"],
                like=like if isinstance(like, value_checks.PrefillValueCheck) else None)
        if rules <= FUSABLE_DECODE:
            return value_checks.plan_decode_value_check(
                args, slots=dims["p"], rows=dims.get("s"), tokens=dims["t"], shared_slots=dims["writes_pool"],
                like=like if isinstance(like, value_checks.DecodeValueCheck) else None)
        return None


class TritonBackend(Backend):
    """Base of the Triton backends; subclasses set ``name``, ``layout``, ``vendors``, ``native``.

    Class fields (besides :class:`Backend`'s):
        layout: the launch-grid layout (``"split"`` or ``"folded"``).
        native: vendors where the backend runs without being forced.
    """

    layout: ClassVar[str] = "split"
    native: ClassVar[frozenset[str]] = frozenset()
    api_version = "2"  # dispatched through the phase methods, whose defaults run the op methods below
    ops = TRITON_OPS
    dtypes = frozenset({"float32", "bfloat16", "float16"})
    state_dtypes = frozenset({"float32", "bfloat16"})
    state_layouts = frozenset({"vk", "kv"})
    requires = ("triton",)
    #: Run and checked against the float64 reference on an H200 (sm_90) only; Triton generates code
    #: per arch, so on any other GPU (sm_100, sm_120, gfx942, pvc, ...) the first eager call of each
    #: op and shape class self-checks against torch-ref first (dispatch/runtime/self_check.py). The CPU
    #: interpreter is covered by the test suite and never self-checks (Backend.needs_self_check).
    verified_archs = frozenset({"sm_90"})
    input_strides = TRITON_INPUT_STRIDES
    #: the decode and prefill value rules as one kernel, for every call on CUDA (the registry holds it)
    value_check_hook = TritonValueChecks()
    #: the chunked prefill's state kernel takes every pool stride; decode reads dense state tiles
    strided_state_ops = frozenset({"gdn_prefill", "kda_prefill"})
    #: decode from precomputed gates (``GATES_PRECOMPUTED``), has_initial_state in decode and in
    #: the prefill's state kernel (a masked h0 load, ``HAS_INITIAL_STATE`` / ``HAS_INIT``), and
    #: output_state_indices (decode: a second row pointer, ``HAS_OUT_SLOTS``; prefill: the read rows
    #: copied into the write rows first, ``kernels/triton/fork_slots.py``, then in place there) and
    #: prefill's state checkpoints (stored in the state kernel's chunk loop or the fused walk,
    #: ``HAS_CKPT``: docs/ops.md "State checkpoints")
    features = frozenset({"precomputed_gates", "has_initial_state", "output_state_indices", "checkpoints"})

    # -- predicates -------------------------------------------------------------------------------

    def predicates(self):
        return super().predicates() + [self.supports_mode, self.supports_grid]

    def supports_device(self, p: Problem, caps: DeviceCapabilities) -> Check:
        base = super().supports_device(p, caps)
        if not base.ok:
            return base
        if caps.vendor == "cpu" and not caps.toolchain.triton_interpreter:
            return Check.failed(Reason.DEVICE, "vendor='cpu' without the Triton interpreter: Triton kernels "
                                "need a GPU, or TRITON_INTERPRET=1 (tests only)",
                                "run on a GPU, or set TRITON_INTERPRET=1 before importing triton and force "
                                f"the backend (backend='{self.name}'; on a CPU the dispatcher only picks "
                                "Triton when forced)")
        return Check.passed()

    def supports_shape(self, p: Problem, caps: DeviceCapabilities) -> Check:
        base = super().supports_shape(p, caps)
        if not base.ok or not p.spec.has_state:
            return base
        if p.phase == "prefill":
            import torch

            from linattn.kernels.triton.limits import prefill_supported

            why = prefill_supported(p.family, p.k, p.v, getattr(torch, p.dtype), caps)
            if why is not None:
                return Check.failed(Reason.SHAPE, f"{self.name} chunked prefill: {why}",
                                    "use torch-ref (or another backend) for this shape")
            return Check.passed()
        for dim, val in (("K", p.k), ("V", p.v)):
            if not 1 <= val <= MAX_HEAD_DIM:
                return Check.failed(Reason.SHAPE, f"unsupported head_dim {dim}={val}: {self.name} keeps "
                                    f"the whole key dim of the state tile in registers, 1 <= K, V <= {MAX_HEAD_DIM}",
                                    "use torch-ref (or another backend) for larger heads")
        tile_bytes = 4 * _pow2(p.k) * min(_pow2(p.v), max(1, 4096 // _pow2(p.k)))
        if caps.vendor != "cpu" and tile_bytes > caps.shared_memory_per_block:
            return Check.failed(Reason.SHAPE, f"unsupported head_dim K={p.k}: the fp32 state tile "
                                f"({tile_bytes} bytes) exceeds {caps.shared_memory_per_block} bytes of "
                                f"shared memory per block on {caps.name}")
        return Check.passed()

    def supports_mode(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if p.phase == "decode" and p.mode != "pool":
            return Check.failed(Reason.FEATURE, f"mode={p.mode!r}: {self.name} decodes over a state pool "
                                "only (mode='pool')", "pass state_pool and state_indices")
        return Check.passed()

    def supports_grid(self, p: Problem, caps: DeviceCapabilities) -> Check:
        from linattn.kernels.grid import GridLimitError, plan_grid

        try:
            plan_grid(*self._work(p), caps, self.layout)
        except GridLimitError as e:
            return Check.failed(Reason.GRID_LIMIT, str(e),
                                "use triton-split on CUDA" if self.layout == "folded" else "split the batch")
        return Check.passed()

    def _grid_fits(self, p: Problem, caps: DeviceCapabilities) -> bool:
        """:meth:`supports_grid`'s outcome (``ok``) by arithmetic (``kernels.grid.grid_fits``): no
        grid plan or message built; a subclass that redefines :meth:`supports_grid` is asked it."""
        if type(self).supports_grid is not TritonBackend.supports_grid:
            return self.supports_grid(p, caps).ok
        from linattn.kernels.grid import grid_fits

        return grid_fits(*self._work(p), caps, self.layout)

    def size_class(self, p: Problem, caps: DeviceCapabilities) -> tuple:
        """Only :meth:`supports_grid` reads the sizes (N, through the grid and decode's block
        width): its outcome. :meth:`plan_parts` reads T and N for its message only. Kept per what
        the grid reads (``_work``: op, N, heads, head dims, dtype, state pool dtype (decode's config);
        the layout and the device), so a new prefill length T of a known N asks no grid planner (issue 28)."""
        key = (self.layout, p.op, p.n, p.hv, p.k, p.v, p.d, p.dtype, p.state_dtype, id(caps))
        hit = _GRID_FITS.get(key)
        if hit is None or hit[0] is not caps:  # the id of a freed capabilities object may be reused
            hit = (caps, self._grid_fits(p, caps))
            _GRID_FITS.put(key, hit)
        return (hit[1],)

    def needs_forcing(self, p: Problem, caps: DeviceCapabilities) -> Optional[str]:
        """A message when this backend may run only when forced (None: it may be chosen)."""
        if caps.vendor in self.native:
            return None
        if caps.vendor == "cpu":
            return (f"{self.name} on the CPU runs in the Triton interpreter (slow; for tests): "
                    "eligible only when forced")
        return f"{self.name} ({self.layout} grid) on {caps.vendor} is for the contract tests: eligible only when forced"

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        return Rank.NATIVE if caps.vendor in self.native else Rank.FORCED_ONLY

    def plan_parts(self, p: Problem, caps: DeviceCapabilities) -> dict[str, str]:
        """Prefill: the fused GDN prefill where ``kernels.triton.prefill.plan_fused`` chooses it
        (``prefill``: its reason; ``prep``: ``fused_prep.choose_prep``'s, the CuTe DSL prep on SM90 or
        the Triton one; ``walk``: ``plan_walk``'s, the CuTe DSL walk on SM90 or the Triton one), else
        the pipeline (``prefill``: why) and its state stage's plan (``state_stage``: one pass per
        sequence, or the segment-parallel pass with its segment length, from
        ``kernels.triton.prefill.plan_segments`` on the problem's shapes); with ``output_state_indices``
        the row copy before it, with checkpoints where they are stored. {} for the other ops or
        without Triton. :meth:`plan_note` joins them (``"prefill: ...; prep: ...; walk: ..."``)."""
        if p.phase != "prefill" or not p.k or not p.v:
            return {}
        parts = self._prefill_parts(p, caps)
        if parts and p.output_state_indices:
            parts["output_state_indices"] = "each read row copied into its write row first (fork_slots, one launch)"
        if parts and p.checkpoints and p.mode == "pool":
            parts["checkpoints"] = ("stored in the state loop after each chunk that ends at a multiple of "
                                    "checkpoint_every (HAS_CKPT builds), not replayed")
        return parts

    @staticmethod
    def _prefill_parts(p: Problem, caps: DeviceCapabilities) -> dict[str, str]:
        try:
            import torch

            from linattn.kernels.triton.prefill import (CHUNK, fused_config, plan_fused, plan_segments, plan_walk,
                                                        prefill_config, stage_options)
        except ImportError:
            return {}
        family = OP_TABLE[p.op].family
        dtype = getattr(torch, p.dtype)
        ckpt = p.checkpoints and p.mode == "pool"  # the state stage in one pass per sequence
        fcfg = fused_config(p.k, p.v, dtype, family)  # the planner's (prefill.plan._with_fused)
        try:  # where not fused, its reason carries the walk switch's note (no effect on the pipeline)
            fused, fwhy = plan_fused(family=family, N=p.n, HV=p.hv, K=p.k, V=p.v, dtype=dtype, caps=caps, cfg=fcfg)
        except ValueError as e:  # a malformed LINATTN_CUTEDSL_WALK (ConfigError): planning the call raises it
            return {"prefill": f"the pipeline (planning raises {type(e).__name__}: {e})"}
        if fused:
            from linattn.kernels.cutedsl.fused_prep import choose_prep

            cute_prep, prep = choose_prep(family=family, K=p.k, dtype=dtype, caps=caps, shared_keys=fcfg.prep_shared_keys)
            try:  # the walk as the planner picks it, knowing the prep (the one kernel holds the CuTe DSL prep)
                walk = plan_walk(family, p.k, p.v, dtype, caps, p.n, p.hv, ckpt, cute_prep=cute_prep).reason
            except ValueError as e:  # a malformed LINATTN_CUTEDSL_WALK (ConfigError): planning the call raises it
                walk = f"planning raises {type(e).__name__}: {e}"
            return {"prefill": fwhy, "prep": prep, "walk": walk}
        cfg = prefill_config(family, p.k, p.v, dtype)
        even = stage_options(family, p.hv // max(p.h, 1), cfg).every_second_state
        L, why = plan_segments(N=p.n, HV=p.hv, K=p.k, V=p.v, nt_max=p.t // CHUNK + p.n,
                               block_v=cfg.state.block_v, caps=caps, even=even, fp32=p.dtype == "float32",
                               forced=0 if ckpt else None)
        if ckpt:
            why = "state checkpoints: no segment-parallel pass"
        return {"prefill": f"the pipeline ({fwhy})", "state_stage": why if L else f"one pass per sequence ({why})"}

    # -- work items (shared by the grid predicate and the launchers' plans) ----------------------

    @staticmethod
    def _work(p: Problem) -> tuple[int, int, int]:
        """(n_seq, n_heads, n_blocks) of the launch the kernels would make for ``p``.

        The block count comes from the kernels' pinned configurations, which need Triton. When a
        profile is asked about on a machine without Triton, one block per (sequence, head) is
        assumed: the axes that carry N and HV, the ones that can exceed a limit, are the same.
        """
        try:
            return TritonBackend._planned_work(p)
        except ImportError:
            return p.n, max(p.hv, 1) if p.spec.method != "clamp" else 1, 1

    @staticmethod
    def _planned_work(p: Problem) -> tuple[int, int, int]:
        if p.spec.method == "clamp":
            from linattn.kernels.triton.silu_clamp import silu_config

            bd, _ = silu_config(p.d)
            return p.n, 1, -(-p.d // bd)
        if p.phase == "decode" and 1 <= p.k <= MAX_HEAD_DIM and 1 <= p.v <= MAX_HEAD_DIM:
            import torch

            from linattn.kernels.triton.decode import decode_launch_config

            # the pool dtype's config (decode.PINNED): a program covers BV value rows times its blocks
            _, cfg = decode_launch_config(p.k, p.v, p.n, gate=p.family,
                                          state_dtype=getattr(torch, p.state_dtype, torch.float32))
            return p.n, p.hv, -(-p.v // (cfg.block_v * cfg.blocks))
        if p.phase == "prefill" and p.k in (64, 128, 256) and p.v in (64, 128, 256):
            return p.n, p.hv, p.v // _prefill_state_bv(p.family, p.k, p.v, p.dtype)
        return p.n, p.hv, 1

    # -- ops --------------------------------------------------------------------------------------

    @staticmethod
    def _caps(t):
        from linattn.capabilities import probe

        return probe(t.device)

    def _decode(self, gate, **kw):
        from linattn.kernels.triton.decode import recurrent_decode

        return recurrent_decode(gate=gate, **kw, caps=self._caps(kw["q"]), layout=self.layout)

    def gdn_decode(self, **kw):
        """GDN decode over a state pool (docs/ops.md; keywords: backends/base.py); ``kernels/triton/decode.py``."""
        return self._decode("gdn", **kw)

    def kda_decode(self, **kw):
        """KDA decode over a state pool (docs/ops.md; keywords: backends/base.py); ``kernels/triton/decode.py``."""
        return self._decode("kda", **kw)

    def silu_and_mul_clamp(self, *, x, limit=None):
        """SwiGLU with clamp (docs/ops.md); see ``kernels/triton/silu_clamp.py``."""
        from linattn.kernels.triton.silu_clamp import silu_and_mul_clamp

        return silu_and_mul_clamp(x, limit, caps=self._caps(x), layout=self.layout)

    def _prefill(self, family, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                 initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", has_initial_state=None,
                 output_state_indices=None, checkpoint_every=None, checkpoint_indices=None):
        from linattn.kernels.triton.prefill import chunk_prefill

        return chunk_prefill(family, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                             state_pool=state_pool, state_indices=state_indices, initial_state=initial_state,
                             scale=scale, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                             layout=self.layout, caps=self._caps(q), has_initial_state=has_initial_state,
                             output_state_indices=output_state_indices, checkpoint_every=checkpoint_every,
                             checkpoint_indices=checkpoint_indices)

    def gdn_prefill(self, **kw):
        """GDN chunked prefill, pool or dense mode (docs/ops.md); see ``kernels/triton/prefill/``."""
        return self._prefill("gdn", **kw)

    def kda_prefill(self, **kw):
        """KDA chunked prefill, pool or dense mode (docs/ops.md); see ``kernels/triton/prefill/``."""
        return self._prefill("kda", **kw)

    # -- prepared launches (the dispatcher's per-call fast path, dispatch/runtime/fast_path.py) ------------

    def prepare(self, op: str, args: dict):
        """A launch planned from the call's metadata, to call with later calls' tensors of the same
        class: the same dtypes, strides, head dims and scalars, any T and N (``dispatch/runtime/fast_path.py``
        shares it between the class's call plans: its ``serves_class``). Decode:
        :class:`~linattn.kernels.triton.decode.DecodeReplay`; prefill:
        :class:`~linattn.kernels.triton.prefill.PrefillReplay`; None for an op without a plan (its
        op method runs)."""
        spec = OP_TABLE.get(op)
        if spec is None:
            return None
        if spec.method == "decode":
            from linattn.kernels.triton.decode import DecodeReplay

            return DecodeReplay(gate=spec.family, caps=self._caps(args["q"]), layout=self.layout, **args)
        if spec.method == "prefill":
            from linattn.kernels.triton.prefill import PrefillReplay

            return PrefillReplay(spec.family, args, self._caps(args["q"]), self.layout)
        return None


@functools.lru_cache(maxsize=64)
def _prefill_state_bv(family: str, k: int, v: int, dtype: str) -> int:
    """The prefill state stage's value columns per program (its pinned configuration; building
    one costs about 0.1 ms, and the grid predicate asks on every decision)."""
    import torch

    from linattn.kernels.triton.prefill import prefill_config

    return prefill_config(family, k, v, getattr(torch, dtype)).state.block_v

