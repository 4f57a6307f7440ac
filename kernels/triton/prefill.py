"""Chunked prefill for GDN and KDA in Triton, with the state pool read and written in place.

The host side reads as typed stages: a frozen :class:`PrefillConfig` (per shape class, from
:func:`prefill_config`), a :class:`PrefillPlan` built from host-known facts only
(:func:`plan_prefill`: shapes, dtypes, flags; never a tensor's values, no device sync) and one
launch function per stage, which :func:`run_prefill` calls in order:

0. :func:`launch_tables` (:mod:`.chunk_tables`): the chunk index tables (one launch; torch ops
   past :data:`TABLES_TRITON_MAX_N` sequences).
1. :func:`launch_intra` (:mod:`.chunk_intra`): per (chunk, value head), on a persistent grid:
   chunk-local cumulative gates, ``A`` (K K^T with decays), ``(I + A)^-1``, ``W`` and ``U`` (and,
   for KDA, the intra-chunk query-key matrix, the decayed queries and keys and the chunks' total
   decays, which stages 2 and 3 read). KDA builds its ``A`` and those operands in a launch before
   it (one program per (chunk, value head)); the persistent kernel then solves and forms ``W`` and
   ``U``. GDN's bf16 path writes ``Tm diag(beta)`` instead of ``U``
   (:attr:`GdnStageSplit.u_in_state`): stage 2 forms ``U``.
2. :func:`launch_gates` (GDN's bf16 path, :attr:`GdnStageSplit.gates_kernel`): the state loop's
   gate factors (:func:`.chunk_state.chunk_gdn_gates_kernel`).
3. :func:`launch_state` (:mod:`.chunk_state`): per (value block, sequence, value head), grid from
   the launch-grid planner: the sequential pass over the sequence's chunks; pool mode loads ``h0``
   from ``state_pool[state_indices[n]]`` and stores the final state to the same row inside the
   kernel. KDA's bf16 path at K <= 128 writes the output here (:attr:`StateConfig.writes_output`).
4. :func:`launch_output` (:mod:`.chunk_output`): per (chunk, value head, value block): the output
   rows (GDN's bf16 path at GROUP = 2: per (chunk, key head, value block), both value heads from
   one ``q k^T``; the state stage stores the state entering every second chunk only and this stage
   rebuilds the others' share from the chunk before: :attr:`GdnStageSplit.every_second_state`).

The chunk index table (sequence and first token of every chunk) is built on the device from
``cu_seqlens`` with no host sync: the intra and output stages cover the upper bound
``T // 64 + N`` chunks, and work past the real count is skipped at once. So a prefill call can be
captured in a CUDA graph (the validation layer's own checks aside).

Host cost. :func:`run_prefill` records the launches of a plan's second call of a tensor
signature (:class:`PrefillLaunch`: grids, scalar arguments, constexprs and launch options, derived
once by the stage functions themselves) and replays them on later calls of that signature: one
workspace allocation for every intermediate buffer and the chunk tables, no input copy where the
strides need none, and on CUDA each compiled kernel's launcher called directly
(:class:`.launch.LaunchSequence`). The dispatcher's prepared launch (:class:`PrefillReplay`) goes
further for an engine's stream of new lengths: one recorded plan per (T bucket, N) serves every T
of the bucket, bitwise as a plan for that T (issue 28).

Configurations are pinned per shape class (K, V, dtype): nothing is autotuned, so the kernel that
writes the pool runs exactly once per call (ops.md: the pool is advanced exactly once). Why each
pinned value won: docs/performance.md#prefill.

Precision: fp32 inputs use ``input_precision="ieee"`` dots everywhere (tf32 would miss ops.md's
1e-5 against float64); bf16 inputs run the dots that touch W, U, the states and the outputs on
bf16 operands with fp32 accumulation (state kept in fp32, stored per chunk in bf16 as the
reference implementations do; GDN's grouped path: every second chunk); fp16 inputs run those dots
in fp32 (tf32), since an fp16 copy of a state holding values past 65,504 would overflow (field
case F17). The triangular solve is fp32: ieee dots for fp32 inputs; for bf16/fp16, 3xTF32 dots for
the diagonal blocks (the Neumann product) and tf32 dots for the blocks below them. Under
``TRITON_INTERPRET=1`` every dot runs on fp32 operands (the interpreter's bf16 dot is wrong).

Unused kernel operands go in as None (each kernel's constexprs say which it reads), so a kernel
parameter always holds what its name says. One exception keeps a shipped build's code: where KDA's
state kernel writes the output, its unread ``rk``, ``has_init``, ``hbuf`` and ``vn`` are the real key
norms and zero-size tensors (:func:`launch_state`).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Literal, NamedTuple, Optional

import torch
import triton
import triton.language as tl

from linattn.capabilities import DeviceCapabilities, interpreter_enabled, probe
from linattn.kernels.grid import GridPlan, plan_grid

from .chunk_fused import (FusedConfig, chunk_gdn_fused_kernel, chunk_gdn_fused_prep_kernel, fused_config,
                          fused_refusal, launch_fused, launch_fused_prep)
from .chunk_fused_kda import chunk_kda_fused_kernel, chunk_kda_fused_prep_kernel
from .chunk_intra import KDA_FAST_SPAN, chunk_intra_kernel, chunk_kda_system_kernel
from .chunk_output import chunk_output_grouped_kernel, chunk_output_kernel
from .chunk_state import chunk_gdn_gates_kernel, chunk_segment_combine_kernel, chunk_state_kernel
from .chunk_tables import SEG_BN, SEG_BS, chunk_tables_triton, segment_tables_kernel
from .launch import LaunchSequence, NotReplayable, launch, recording
from .limits import _MIN_SMEM, _PIPELINED_SMEM, _PIPELINED_SMEM_OTHER, DTYPES, HEAD_DIMS, prefill_supported  # noqa: F401

CHUNK = 64
#: up to this many sequences the chunk tables come from one Triton launch
#: (:func:`.chunk_tables.chunk_tables_triton`), beyond it from :func:`chunk_tables` (torch ops;
#: docs/performance.md#prefill-chunk-tables)
TABLES_TRITON_MAX_N = 16384
#: the segment-parallel state pass (ops.md "Segment-parallel state pass"): segments hold at least
#: this many chunks, and the planner aims the rerun at this many programs per SM
#: (docs/performance.md#prefill-segments)
SEGMENT_MIN_CHUNKS = 64
SEGMENT_PROGRAMS_PER_SM = 2
#: the combine's value columns per program (a [K, K] fp32 tile in registers, K <= 128); its launch
#: (SEGMENT_COMBINE_LAUNCH) is below LaunchOptions
SEGMENT_COMBINE_BLOCK_V = 32
#: the largest key head dim of the segment-parallel pass (the combine's register tile)
SEGMENT_MAX_K = 128


# -- configuration -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchOptions:
    """Triton launch options of one kernel: warps, software-pipelining stages and an optional
    register cap per thread (None: the compiler's choice)."""

    num_warps: int
    num_stages: int
    maxnreg: Optional[int] = None

    def __post_init__(self):
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"num_warps must be a power of two up to 16 and num_stages >= 1; got {self}")


SEGMENT_COMBINE_LAUNCH = LaunchOptions(4, 2)  # why: docs/performance.md#prefill-segments

#: the dot precisions a configuration names (CUDA's ``input_precision`` values; :func:`dot_precision`
#: translates them for the compile target), and the AMD-only ones a translated configuration may hold
_PRECISIONS = ("ieee", "tf32", "tf32x3")
_TARGET_PRECISIONS = _PRECISIONS + ("bf16x3",)
#: AMD architectures with an XF32 (TF32) matrix instruction: Triton 3.6's HIP backend accepts
#: ``input_precision="tf32"`` on these only (``HIPOptions.allowed_dot_input_precisions``: ieee, bf16x3,
#: bf16x6 everywhere; tf32 on gfx942; tf32x3 nowhere)
_XF32_ARCHS = ("gfx942",)


def dot_precision(nominal: str, caps: DeviceCapabilities, interpreted: bool = False) -> str:
    """The ``input_precision`` a configuration's dot precision compiles as on ``caps``'s target.

    The kernels and configurations name CUDA's precisions; that is also the Triton interpreter's
    set, and on NVIDIA (and any non-AMD target) they are returned unchanged, so CUDA builds are
    exactly the ones measured. Triton's HIP backend rejects ``tf32x3`` on every AMD GPU and ``tf32``
    outside :data:`_XF32_ARCHS` (a compile error at the first call, not a fallback). There:

    - ``"tf32x3"`` (the solve's diagonal blocks, the segment combine) becomes ``"ieee"``: CDNA's fp32
      matrix instructions (``v_mfma_f32_32x32x2_f32``), exact fp32 products, at least 3xTF32's accuracy;
    - ``"tf32"`` stays ``"tf32"`` on gfx942 (XF32, TF32's 10-bit mantissa, as on CUDA) and becomes
      ``"bf16x3"`` elsewhere (gfx950 has no XF32: three bf16 products, about 16 mantissa bits, more
      accurate than tf32). On bf16 operands both compile to the plain bf16 instruction;
    - ``"ieee"`` stays ``"ieee"`` (the kernels read it as "fp32 inputs": never produced from another).

    Args:
        nominal: ``"ieee"``, ``"tf32"`` or ``"tf32x3"`` (a translated name passes unchanged).
        caps: the device the kernel compiles for (``vendor``, ``arch``).
        interpreted: the kernel runs in the Triton interpreter (CUDA's precision set; every dot fp32).
    Returns:
        The ``input_precision`` to compile with.
    Raises:
        ValueError: ``nominal`` is not a dot precision.
    Example:
        >>> from linattn.capabilities import profile
        >>> [dot_precision(p, profile("mi300x")) for p in ("ieee", "tf32", "tf32x3")]
        ['ieee', 'tf32', 'ieee']
    """
    if nominal not in _TARGET_PRECISIONS:
        raise ValueError(f"dot precision must be one of {_TARGET_PRECISIONS}; got {nominal!r}")
    if interpreted or caps.vendor != "amd" or nominal == "ieee":
        return nominal
    if nominal == "tf32x3":
        return "ieee"
    if nominal == "tf32":
        return "tf32" if caps.arch in _XF32_ARCHS else "bf16x3"
    return nominal


@dataclass(frozen=True)
class SolveConfig:
    """How stage 1 inverts ``I + A`` (:func:`.chunk_intra._solve`): the diagonal 16 x 16 blocks by
    the Neumann product (``neumann``; else forward substitution) on dots at ``diag_precision``,
    the blocks below them on dots at ``below_precision`` (``"ieee"``, ``"tf32"``, ``"tf32x3"``; on an
    AMD target after :func:`dot_precision`, also ``"bf16x3"``)."""

    neumann: bool
    diag_precision: str
    below_precision: str

    def __post_init__(self):
        if {self.diag_precision, self.below_precision} - set(_TARGET_PRECISIONS):
            raise ValueError(f"dot precisions must be among {_TARGET_PRECISIONS}; got {self}")


@dataclass(frozen=True)
class IntraConfig:
    """Stage 1 (:func:`.chunk_intra.chunk_intra_kernel`), a persistent grid of ``ctas_per_sm``
    programs per SM. ``tm_launch`` / ``tm_ctas_per_sm``: the same where it writes
    ``Tm diag(beta)`` instead of ``U`` (:attr:`GdnStageSplit.u_in_state`). ``block``: key and
    value columns per step."""

    launch: LaunchOptions
    ctas_per_sm: int
    tm_launch: LaunchOptions
    tm_ctas_per_sm: int
    block: int
    solve: SolveConfig


@dataclass(frozen=True)
class KdaSystemConfig:
    """KDA's stage 1a (:func:`.chunk_intra.chunk_kda_system_kernel`): channels per block, dots on
    bf16 operands (``bf16_operands``; else fp32) and the one-reference-row fast path where its
    bound holds (``fast_path``)."""

    launch: LaunchOptions
    block_k: int
    bf16_operands: bool
    fast_path: bool


@dataclass(frozen=True)
class StateConfig:
    """The state stage (:func:`.chunk_state.chunk_state_kernel`): value columns per program and its
    launch; ``writes_output`` (KDA): the state kernel also writes the output (``fused_launch``) and
    no output stage runs."""

    block_v: int
    launch: LaunchOptions
    writes_output: bool
    fused_launch: LaunchOptions


@dataclass(frozen=True)
class OutputConfig:
    """The output stage (:mod:`.chunk_output`): the per-value-head kernel's launch, value columns
    per program, the GVA group sizes at which one program per key head runs instead
    (``grouped_at``) and that kernel's launch."""

    launch: LaunchOptions
    block_v: int
    grouped_at: tuple[int, ...]
    grouped_launch: LaunchOptions


@dataclass(frozen=True)
class GdnStageSplit:
    """How GDN's stages split the work (:func:`stage_options` applies them together):
    ``gates_kernel``: the state loop's gate factors from :func:`.chunk_state.chunk_gdn_gates_kernel`;
    ``every_second_state``: with the grouped output, the state stage stores the state entering
    every second chunk only; ``u_in_state``: stage 1 writes ``Tm diag(beta)`` and the state stage
    forms ``U``."""

    gates_kernel: bool
    every_second_state: bool
    u_in_state: bool


@dataclass(frozen=True)
class PrefillConfig:
    """The pinned launch configuration of one shape class (:func:`prefill_config`). Override a
    field with :func:`dataclasses.replace` on the part, e.g.
    ``replace(cfg, state=replace(cfg.state, block_v=32))``."""

    intra: IntraConfig
    kda_system: KdaSystemConfig
    state: StateConfig
    output: OutputConfig
    gdn: GdnStageSplit


def prefill_config(family: str, K: int, V: int, dtype: torch.dtype,
                   smem_per_block: Optional[int] = None) -> PrefillConfig:
    """The pinned launch configuration of a shape class (no autotuning: the state kernel writes
    the pool, so it must run exactly once per call).

    Chosen from H200 sweeps (benchmarks/prefill.py ``--sweep``, ``--intra-sweep``) and sm_90 builds
    (registers, spills and shared memory per CTA: tests/prefill/test_prefill_compile.py,
    tests/contract/test_compile.py); what was measured against what: docs/performance.md#prefill.

    Args:
        family: ``"gdn"`` or ``"kda"``. K, V: head dims (:data:`HEAD_DIMS`).
        dtype: q/k/v dtype (:data:`DTYPES`).
        smem_per_block: the device's shared memory per block in bytes: the state kernel is
            software-pipelined (2 stages) where it holds it (None: assume it does), never at
            K = 256 (227 KiB would not hold it).
    Returns:
        A frozen :class:`PrefillConfig`.
    Example:
        >>> prefill_config("gdn", 128, 128, torch.bfloat16).state.block_v
        64
    """
    kda, bf16 = family == "kda", dtype == torch.bfloat16
    gdn_bf16 = not kda and bf16
    pipelined = K != 256 and (smem_per_block is None
                              or smem_per_block >= _PIPELINED_SMEM.get(dtype, _PIPELINED_SMEM_OTHER))
    fp32 = dtype == torch.float32
    return PrefillConfig(
        intra=IntraConfig(
            launch=LaunchOptions(4, 1, maxnreg=128), ctas_per_sm=8,  # #prefill-intra-grid
            tm_launch=LaunchOptions(4, 1, maxnreg=168), tm_ctas_per_sm=3,  # #prefill-intra-tm
            block=32,
            # fp32: forward substitution on ieee dots (ops.md's 1e-5); else #prefill-solve
            solve=SolveConfig(False, "ieee", "ieee") if fp32 else SolveConfig(True, "tf32x3", "tf32")),
        # fp32 operands (bf16 ones move W/U by 1e-3): #prefill-kda-system
        kda_system=KdaSystemConfig(LaunchOptions(4, 1), block_k=32, bf16_operands=False, fast_path=True),
        state=StateConfig(
            block_v=64 if bf16 else 32,  # fp32 operand tiles spill at 64: #prefill-state-block
            launch=LaunchOptions(8 if K == 256 else 4, 2 if pipelined else 1),
            # bf16 KDA at K <= 128 only (the measured, GPU-tested build): #prefill-kda-fused-output
            writes_output=kda and K <= 128 and bf16, fused_launch=LaunchOptions(4, 1)),
        output=OutputConfig(
            # GDN unpipelined at 8 warps: pipelined builds were not deterministic (#prefill-output-launch)
            launch=LaunchOptions(4, 2) if kda else LaunchOptions(8, 1),
            block_v=128 if V == 128 else 64,  # the whole value dim per program at 128: #prefill-output-block
            grouped_at=(2,) if gdn_bf16 else (),  # only GROUP = 2 measured: #prefill-grouped-output
            grouped_launch=LaunchOptions(4, 1)),
        # the measured bf16 path only; the three go together: #prefill-gdn-stage-split
        gdn=GdnStageSplit(gates_kernel=gdn_bf16, every_second_state=gdn_bf16, u_in_state=gdn_bf16),
    )


def override_config(cfg: PrefillConfig, over: Mapping[str, object]) -> PrefillConfig:
    """``cfg`` with the fields that ``over`` names by their dotted paths replaced, each level by
    :func:`dataclasses.replace` (a sweep's or a test's partial override; the shipped configuration is
    :func:`prefill_config`'s).

    A path names the configuration's own fields (``"state.block_v"``, ``"intra.solve"``,
    ``"gdn.u_in_state"``). A value is the field's new value, except that a mapping given for a part
    that is itself a dataclass replaces that part's fields by name (``{"intra.solve": {"neumann":
    False}}``, the form a JSON override takes) and a list given for a tuple field becomes a tuple.

    Raises:
        ValueError: a path names no field of the part it reaches.
        TypeError: a mapping names no field of the part it replaces.
    Example:
        >>> cfg = prefill_config("gdn", 128, 128, torch.bfloat16)
        >>> new = override_config(cfg, {"state.block_v": 32, "intra.solve": {"diag_precision": "tf32"}})
        >>> new.state.block_v, new.intra.solve
        (32, SolveConfig(neumann=True, diag_precision='tf32', below_precision='tf32'))
    """
    for path, value in over.items():
        cfg = _replace_at(cfg, path.split("."), value, path)
    return cfg


def _replace_at(part, names: list, value, path: str):
    """``part`` (a dataclass) with the field at ``names`` replaced by ``value`` (:func:`override_config`)."""
    name = names[0]
    if not dataclasses.is_dataclass(part) or name not in {f.name for f in dataclasses.fields(part)}:
        raise ValueError(f"{path!r}: {type(part).__name__} has no field {name!r}")
    now = getattr(part, name)
    if names[1:]:
        value = _replace_at(now, names[1:], value, path)
    elif isinstance(value, Mapping) and dataclasses.is_dataclass(now):
        value = dataclasses.replace(now, **value)
    elif isinstance(value, list) and isinstance(now, tuple):
        value = tuple(value)
    return dataclasses.replace(part, **{name: value})


def _smem_per_block(caps: DeviceCapabilities) -> Optional[int]:
    """The shared memory per block :func:`prefill_config` plans for (None on the CPU: assume it holds)."""
    return None if caps.device_type == "cpu" else caps.shared_memory_per_block


class StageOptions(NamedTuple):
    """How GDN's chunked prefill splits its stages for one call (:func:`stage_options`)."""

    #: stage 3 runs one program per key head (``chunk_output_grouped_kernel``)
    grouped_output: bool
    #: the state loop's gate factors come from ``chunk_gdn_gates_kernel``
    hoist: bool
    #: the state stage stores the state entering every second chunk only (grouped output: HALF)
    half_hbuf: bool
    #: stage 1 writes ``Tm diag(beta)``; the state stage forms ``U``
    state_u: bool


def stage_options(family: str, group: int, cfg: PrefillConfig, replaced_state: bool = False) -> StageOptions:
    """The stage split of a call at GVA group size ``group`` under ``cfg``.

    The options go together as measured (docs/performance.md#prefill-gdn-stage-split): every
    second chunk's state only with the grouped output (the kernel that rebuilds the others) and
    the gates kernel's factors; ``U`` in the state stage only with that. A replacement state kernel
    (``replaced_state``, e.g. cutedsl) takes none of them: it reads ``U`` and ``g`` and writes every
    chunk's state. KDA takes none (it has its own stage split)."""
    gdn = family == "gdn" and not replaced_state
    grouped = family == "gdn" and group in cfg.output.grouped_at
    hoist = gdn and cfg.gdn.gates_kernel
    half = hoist and grouped and cfg.gdn.every_second_state
    return StageOptions(grouped_output=grouped, hoist=hoist, half_hbuf=half, state_u=half and cfg.gdn.u_in_state)


# -- the plan ----------------------------------------------------------------------------------

class BufferSpec(NamedTuple):
    """One buffer a call allocates: its :class:`PrefillBuffers` field, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class PrefillGrids(NamedTuple):
    """The launch grids of one call (the stages that do not run hold None)."""

    kda_system: Optional[tuple[int, int]]
    intra: tuple[int]
    gates: Optional[tuple[int, int]]
    state: GridPlan
    output: Optional[tuple[int, int, int]]


@dataclass(frozen=True)
class PrefillPlan:
    """Everything a chunked-prefill call decides before it touches a tensor's values (:func:`plan_prefill`).

    A plan depends only on the call signature: ``family``, the shapes ``T, N, H, HV, K, V``, the
    q/k/v ``dtype``, the device, pool or dense mode, whether an initial state (dense; and its
    dtype) or ``has_initial_state`` flags (pool) come, ``state_layout``, ``use_qk_l2norm``, the
    grid ``layout``, the device capabilities and the replacement state kernel. So a caller may
    cache it per signature and :func:`run_prefill` it on new tensors.
    """

    family: str
    T: int
    N: int
    H: int
    HV: int
    K: int
    V: int
    dtype: torch.dtype
    device: torch.device
    pool_mode: bool
    #: dense mode: an initial state is given (else the sequences start from zero)
    has_h0: bool
    #: pool mode: ``has_initial_state`` flags are given
    has_init_flags: bool
    #: dense mode: the final state's dtype (the initial state's, fp32 without one); pool: None
    final_dtype: Optional[torch.dtype]
    state_layout: str
    use_qk_l2norm: bool
    #: no token or no sequence: nothing launches (:func:`run_prefill` handles the states)
    empty: bool
    #: the buffers the call allocates, by :class:`PrefillBuffers` field
    buffers: tuple[BufferSpec, ...]
    #: pool mode: state checkpoints are written (``checkpoint_indices`` given: docs/ops.md "State
    #: checkpoints"); the state stage runs one pass per sequence and the plan is not replayed
    checkpoints: bool = False
    config: Optional[PrefillConfig] = None
    stages: Optional[StageOptions] = None
    #: the state stage writes the output (:attr:`StateConfig.writes_output`); no output stage
    output_in_state: bool = False
    #: the dtype of the intermediate buffers and of the dots' operands (``buf_dtype`` as ``tl``)
    buf_dtype: torch.dtype = torch.float32
    DT: object = None
    #: dot precision of the stages (``"ieee"`` for fp32 inputs, else ``"tf32"`` as :func:`dot_precision`
    #: translates it for the target)
    PREC: str = "tf32"
    #: dot precision of the segment combine (``"ieee"`` for fp32 inputs, else ``"tf32x3"``, translated)
    COMBINE_PREC: str = "tf32x3"
    #: the bound on the chunk count, ``T // 64 + N``
    nt_max: int = 0
    #: the chunk tables come from :func:`.chunk_tables.chunk_tables_triton` (else torch ops)
    triton_tables: bool = True
    grids: Optional[PrefillGrids] = None
    intra_launch: Optional[LaunchOptions] = None
    #: an alternative stage-2 implementation (``chunk_prefill``'s ``state_kernel``)
    state_kernel: Optional[Callable] = None
    #: the segment-parallel state pass: chunks per segment (0: one pass per sequence, as before)
    segment_chunks: int = 0
    #: the bound on the segment count, ``NT_max // segment_chunks + N`` (0 when off)
    n_segments: int = 0
    #: why the planner chose ``segment_chunks`` (``explain`` shows it)
    segment_reason: str = ""
    segment_grids: Optional["SegmentGrids"] = None
    #: the fused prefill (:mod:`.chunk_fused`; KDA: :mod:`.chunk_fused_kda`) runs in place of the stages (None: the pipeline)
    fused: Optional[FusedConfig] = None
    #: why the planner chose the fused prefill or the pipeline (``explain`` shows it)
    fused_reason: str = ""
    #: the fused kernel's grid (``N x HV x V // block_v``) and its prep kernel's persistent programs
    fused_grid: Optional[GridPlan] = None
    #: the recorded launches of this plan's calls, per signature of their tensors (:func:`run_prefill`:
    #: a :class:`PrefillLaunch`, None where it cannot be replayed, or a mark of a first call); not part
    #: of the plan's value
    launches: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def kda(self) -> bool:
        return self.family == "kda"

    @property
    def replayable(self) -> bool:
        """Its stages make Triton launches only, so :class:`PrefillLaunch` can record and replay
        them: a non-empty call with the Triton chunk tables (up to :data:`TABLES_TRITON_MAX_N`
        sequences), one pass of the state stage and no replacement state kernel."""
        return (not self.empty and self.triton_tables and not self.segment_chunks and self.state_kernel is None
                and not self.checkpoints)

    @property
    def group(self) -> int:
        """GVA group size ``HV // H``."""
        return self.HV // self.H


@dataclass
class PrefillBuffers:
    """The tensors one call allocates (:func:`allocate_buffers`); a field the call does not use is
    None. Shapes: ``o [T, HV, V]`` (q's dtype); ``final`` (dense) ``[N, HV, V, K]`` (``"kv"``:
    ``[N, HV, K, V]``); ``w [T, HV, K]`` (KDA: first the operand ``beta kn exp(G)``); ``u
    [T, HV, V]``; ``tm_beta = Tm diag(beta) [T, HV, 64]`` (in place of ``u`` where the state stage
    forms ``U``); ``rk [T, HV]`` fp32, the inverse key norms; ``intra_scratch [P, 2, 64, 64]`` fp32;
    KDA: ``kda_a [NT, HV, 64, 64]`` fp32, ``kda_aqk [T, HV, 64]``, the decayed keys ``kda_kd`` and
    queries ``kda_qg [T, HV, K]``, the chunks' total log decays ``kda_gl [NT, HV, K]`` fp32 (what
    each holds: :func:`.chunk_intra.chunk_kda_system_kernel`); GDN's gates kernel: ``gdn_kf =
    rk exp(G_C - G) [T, HV]``, ``gdn_ec = exp(G_C) [NT, HV]`` fp32; ``vn [T, HV, V]`` the corrected
    values and ``hbuf [NT, HV, K, V]`` the states entering the chunks (zero-size where the state
    stage writes the output). Intermediate buffers are in ``plan.buf_dtype`` unless said otherwise."""

    o: torch.Tensor
    final: Optional[torch.Tensor] = None
    w: Optional[torch.Tensor] = None
    u: Optional[torch.Tensor] = None
    tm_beta: Optional[torch.Tensor] = None
    rk: Optional[torch.Tensor] = None
    intra_scratch: Optional[torch.Tensor] = None
    kda_a: Optional[torch.Tensor] = None
    kda_aqk: Optional[torch.Tensor] = None
    kda_kd: Optional[torch.Tensor] = None
    kda_qg: Optional[torch.Tensor] = None
    kda_gl: Optional[torch.Tensor] = None
    gdn_kf: Optional[torch.Tensor] = None
    gdn_ec: Optional[torch.Tensor] = None
    vn: Optional[torch.Tensor] = None
    hbuf: Optional[torch.Tensor] = None
    seg_summary: Optional[torch.Tensor] = None
    seg_init: Optional[torch.Tensor] = None
    fused_tmb: Optional[torch.Tensor] = None
    fused_aqk: Optional[torch.Tensor] = None
    fused_qs: Optional[torch.Tensor] = None


class SegmentGrids(NamedTuple):
    """The launch grids of the segment-parallel state pass: the summary pass (``NSEG x HV x
    (V + K) // block_v``), the combine (``N x HV x V // block_v``) and the rerun (``NSEG x HV x
    V // block_v``)."""

    summary: GridPlan
    combine: GridPlan
    rerun: GridPlan


class SegmentTables(NamedTuple):
    """The segments of one call (:func:`segment_tables`): ``seg_cu [NSEG+1]`` int64, the segments'
    token bounds as a prefix array (segments past the real count are empty, at ``T``);
    ``seg_chunk_off [NSEG]`` int64, each segment's first chunk; ``seg_first [N+1]`` int64, sequence
    ``n`` owns segments ``seg_first[n] .. seg_first[n+1] - 1``; ``seg_slot [NSEG]`` int64 (pool mode:
    the segment's state index, -1 past the real count; else None)."""

    seg_cu: torch.Tensor
    seg_chunk_off: torch.Tensor
    seg_first: torch.Tensor
    seg_slot: Optional[torch.Tensor]


class PrefillInputs(NamedTuple):
    """The inputs as the kernels read them (:func:`conform_inputs`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: torch.Tensor


class ChunkTables(NamedTuple):
    """``chunk_off [N+1]`` int64, ``chunk_seq [NT_max]`` int32, ``chunk_start [NT_max]`` int64
    (:func:`chunk_tables`)."""

    chunk_off: torch.Tensor
    chunk_seq: torch.Tensor
    chunk_start: torch.Tensor


class PrefillState(NamedTuple):
    """Where the state stage reads ``h0`` and writes the final state: the pool (both) in pool mode,
    else the initial state (None: zeros) and ``final``; ``state_indices`` and the
    ``has_initial_state`` bytes in pool mode only; pool mode with checkpoints: the slot table
    ``checkpoints [N, max_checkpoints]`` (contiguous) and ``checkpoint_every`` (tokens)."""

    h0: Optional[torch.Tensor]
    ht: torch.Tensor
    state_indices: Optional[torch.Tensor]
    has_initial_state: Optional[torch.Tensor]
    checkpoints: Optional[torch.Tensor] = None
    checkpoint_every: int = 0


def plan_prefill(family: Literal["gdn", "kda"], *, q: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                 state_pool: Optional[torch.Tensor] = None, state_indices: Optional[torch.Tensor] = None,
                 initial_state: Optional[torch.Tensor] = None, has_initial_state: Optional[torch.Tensor] = None,
                 use_qk_l2norm: bool = True, state_layout: str = "vk", layout: str = "split",
                 caps: Optional[DeviceCapabilities] = None, state_kernel: Optional[Callable] = None,
                 config: Optional[PrefillConfig] = None, segment_chunks: Optional[int] = None,
                 fused: Optional[bool] = None, fused_cfg: Optional[FusedConfig] = None,
                 checkpoint_indices: Optional[torch.Tensor] = None) -> PrefillPlan:
    """Plan a :func:`chunk_prefill` call from the shapes, dtypes and flags of its arguments.

    Reads only metadata (``shape``, ``dtype``, ``device``, ``numel``; whether optional tensors are
    given), never values: no device sync. Arguments as :func:`chunk_prefill`'s; ``config``
    overrides the pinned configuration (:func:`prefill_config`); ``segment_chunks`` the planner's
    choice of the segment-parallel state pass (:func:`plan_segments`; tests and sweeps); ``fused``
    the planner's choice of the fused prefill (:func:`plan_fused`: None the planner's, True
    forced (a ``ValueError`` where it cannot run), False off) and ``fused_cfg`` its configuration;
    ``checkpoint_indices`` (pool mode; only whether it is given is read): state checkpoints, which
    the state kernel (or the fused walk) stores when the chunk that ends at a multiple of
    ``checkpoint_every`` tokens is done (``HAS_CKPT``), no extra pass over the data: bitwise the state
    a prefill stopped there stores under the same plan choices (pipeline or fused); a checkpoint past
    the sequence's length or of a padding sequence writes nothing. The state stage then runs one pass
    per sequence (no segment-parallel pass) and the call is not replayed (:class:`PrefillLaunch`).
    Returns:
        A frozen :class:`PrefillPlan`.
    Raises:
        ValueError: as :func:`chunk_prefill` (checked here, before anything is allocated).
        linattn.kernels.grid.GridLimitError: the state kernel's grid does not fit the device.
    Example:
        >>> plan = plan_prefill("gdn", q=torch.zeros(100, 1, 64), v=torch.zeros(100, 2, 64),
        ...                     cu_seqlens=torch.tensor([0, 30, 100]))
        >>> plan.nt_max, plan.stages.grouped_output, [b.name for b in plan.buffers][:4]
        (3, False, ['o', 'final', 'w', 'u'])
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    why = prefill_supported(family, K, V, q.dtype)
    if why is not None:
        raise ValueError(f"Triton chunked prefill: {why}")
    pool_mode = state_pool is not None
    if pool_mode and state_indices is None:
        raise ValueError("pool mode (state_pool given) needs state_indices [N]: the slot of each "
                         "sequence, read as h0 and overwritten with the final state")
    N = cu_seqlens.numel() - 1
    checkpoints = checkpoint_indices is not None
    if checkpoints and not pool_mode:
        raise ValueError("checkpoint_indices: checkpoints are pool rows; pass state_pool and state_indices")
    if checkpoints and segment_chunks:
        raise ValueError("checkpoints are written by the state kernel in one pass per sequence: not with a forced "
                         "segment-parallel pass (segment_chunks)")
    final_dtype = None if pool_mode else (initial_state.dtype if initial_state is not None else torch.float32)
    facts = dict(family=family, T=T, N=N, H=H, HV=HV, K=K, V=V, dtype=q.dtype, device=q.device,
                 pool_mode=pool_mode, has_h0=initial_state is not None,
                 has_init_flags=has_initial_state is not None, final_dtype=final_dtype,
                 state_layout=state_layout, use_qk_l2norm=bool(use_qk_l2norm), checkpoints=checkpoints)
    if T == 0 or N == 0:
        return PrefillPlan(**facts, empty=True, buffers=_output_specs(facts))
    if has_initial_state is not None and not pool_mode:
        raise ValueError("has_initial_state is for pool mode; in dense mode pass initial_state")
    interp = interpreter_enabled()
    buf_dtype = torch.float32 if interp or q.dtype != torch.bfloat16 else torch.bfloat16
    if state_kernel is not None and buf_dtype != torch.bfloat16:
        raise ValueError("a replacement state_kernel runs on the bf16 path only (bf16 q/k/v, compiled)")
    caps = probe(q.device) if caps is None else caps
    cfg = config if config is not None else prefill_config(family, K, V, q.dtype, _smem_per_block(caps))
    cfg = config_on_target(cfg, caps, interp)
    plan = _plan_stages(facts, cfg, caps, layout, buf_dtype, state_kernel, 0 if checkpoints else segment_chunks)
    if checkpoints:
        plan = dataclasses.replace(plan, segment_reason="state checkpoints: one pass per sequence (each checkpoint "
                                   "is the state of the sequence's own walk after a chunk)")
    return _with_fused(plan, caps, layout, fused, fused_cfg, segment_chunks)


def plan_segments(*, N: int, HV: int, K: int, V: int, nt_max: int, block_v: int, caps: DeviceCapabilities,
                  even: bool, replaced_state: bool = False, forced: Optional[int] = None,
                  fp32: bool = False) -> tuple[int, str]:
    """Chunks per segment of the segment-parallel state pass, from host-known facts only (no sync).

    The state stage runs ``N x HV x V // block_v`` programs, each walking its sequence's chunks in
    order; when they leave most SMs idle and the sequences are long, cutting them into segments of
    ``L`` chunks runs the walk on ``NSEG x HV x ...`` programs (at the price of the summary pass,
    ``V + K`` columns, the rerun and the combine: ops.md "Segment-parallel state pass"). ``L``
    aims the rerun at :data:`SEGMENT_PROGRAMS_PER_SM` programs per SM (rounded down, so that no
    partial extra wave runs), with at least :data:`SEGMENT_MIN_CHUNKS` chunks; the sequences' mean
    chunk count ``nt_max / N`` must reach ``4 L`` (the lengths themselves are on the device). The
    constants and the measurements behind them: docs/performance.md#prefill-segments.

    Args:
        N, HV, K, V: sequences, value heads, head dims (segments need ``K <=``
            :data:`SEGMENT_MAX_K`). nt_max: the chunk bound ``T // 64 + N``.
        block_v: the state kernel's value columns per program. caps: the device (its SM count).
        even: ``L`` must be even (GDN's every-second-chunk state store counts chunks from the
            segment's start). replaced_state: a replacement state kernel runs (no segments).
            fp32: fp32 inputs (ieee dots; the planner keeps one pass).
        forced: a test's or sweep's choice (0: off; ``L >= 1``: segments of ``L`` chunks, rounded
            up to even where ``even``).
    Returns:
        ``(L, reason)``, ``L = 0`` for one pass per sequence.
    Raises:
        ValueError: ``forced`` negative, or positive at ``K >`` :data:`SEGMENT_MAX_K`, with a
            replacement state kernel or where ``block_v`` does not divide ``K`` and ``V``.
    Example:
        >>> from linattn.capabilities import profile
        >>> plan_segments(N=1, HV=8, K=128, V=128, nt_max=1025, block_v=64, caps=profile("sm90"), even=True)[0]
        64
    """
    if forced is not None:
        if not isinstance(forced, int) or isinstance(forced, bool):
            raise TypeError(f"segment_chunks must be an int (None: the planner's choice); got {forced!r}")
        if forced < 0 or (forced and (K > SEGMENT_MAX_K or replaced_state or V % block_v or K % block_v)):
            raise ValueError(f"segment_chunks must be >= 0 (0: off), and 0 at K > {SEGMENT_MAX_K}, with a "
                             f"replacement state kernel or where block_v = {block_v} does not divide K and V; "
                             f"got {forced} at K = {K}, V = {V}")
        if not forced:
            return 0, "forced off"
        L = forced + (forced % 2 if even else 0)
        return L, f"forced: segments of {L} chunks" + (f" (segment_chunks={forced} rounded up to even)" if L != forced else "")
    if replaced_state:  # its own single pass (run_prefill calls it, not the segmented stage)
        return 0, "a replacement state kernel runs the state stage"
    if V % block_v or K % block_v:  # the summary's column blocks must tile V and then K
        return 0, f"block_v = {block_v} does not divide K = {K} and V = {V}"
    if K > SEGMENT_MAX_K:
        return 0, f"segments need K <= {SEGMENT_MAX_K} (the combine's register tile); K = {K}"
    if fp32:
        return 0, ("fp32 inputs run ieee dots (no tensor cores): the segmented pass's triple state work "
                   "would not pay (force segment_chunks to run it)")
    per_seg = HV * (V // block_v)
    programs = N * per_seg
    if programs >= caps.sm_count:
        return 0, f"the state stage's {programs} programs (N x HV x V/{block_v}) fill {caps.sm_count} SMs"
    want = max(1, SEGMENT_PROGRAMS_PER_SM * caps.sm_count // per_seg)  # segments in all (no extra wave)
    L = max(SEGMENT_MIN_CHUNKS, triton.cdiv(nt_max - N, want))
    L += L % 2 if even else 0
    if nt_max < 4 * L * N:
        return 0, (f"{programs} state programs on {caps.sm_count} SMs leave room for {want} segments in all: "
                   f"sequences of at most {nt_max // N} chunks on average would get fewer than 4 segments of "
                   f"{L} chunks")
    return L, (f"{programs} state programs on {caps.sm_count} SMs: segments of {L} chunks "
               f"(at most {nt_max // L + N}), aiming at {SEGMENT_PROGRAMS_PER_SM} rerun programs per SM")


#: the fused prefill (GDN; KDA with FUSED_KDA_DEFAULT) runs where its grid (``N x HV x V // block_v`` programs, one per sequence,
#: value head and value block) holds at least this many programs per SM; below it the pipeline is
#: kept (its segment-parallel state pass, where planned, fills the device better; docs/performance.md#prefill-fused)
FUSED_MIN_PROGRAMS_PER_SM = 1.0
#: the fused KDA prefill (:mod:`.chunk_fused_kda`) is the planner's choice under GDN's rule (bf16 on NVIDIA
#: CUDA, the grid filling the SMs: :func:`plan_fused`) only while this is True; off until it is measured
#: against KDA's pipeline on the H200 (``benchmarks/prefill_fused.py``, docs/performance.md#prefill-fused).
#: Off, it runs only where forced (``fused=True``)
FUSED_KDA_DEFAULT = False
#: the fused kernel runs software-pipelined (2 stages) where a block has this much shared memory (LDS): its
#: fp32-operand builds take 72.25 KiB pipelined on gfx942 / gfx950 (tests/contract/test_compile_amd.py),
#: so on MI300X (64 KiB) it runs unpipelined; NVIDIA's profiles all hold it
FUSED_PIPELINED_SMEM = 74 * 1024


def plan_fused(*, family: str, N: int, HV: int, K: int, V: int, dtype: torch.dtype, caps: DeviceCapabilities,
               cfg: FusedConfig, replaced_state: bool = False, forced_segments: bool = False,
               forced: Optional[bool] = None) -> tuple[bool, str]:
    """Whether the fused prefill (:mod:`.chunk_fused`, KDA's :mod:`.chunk_fused_kda`) runs a call, from
    host-known facts only: where it can run (:func:`.chunk_fused.fused_refusal`), bf16 on NVIDIA CUDA
    with the grid filling the SMs; KDA only while :data:`FUSED_KDA_DEFAULT` is set.

    Args:
        family, N, HV, K, V, dtype: the call's. caps: the device (its SM count). cfg: the fused
            configuration (its ``block_v``). replaced_state: a replacement state kernel is given.
            forced_segments: the caller forced the segment-parallel pass on.
        forced: None the planner's choice, True forced on, False off.
    Returns:
        ``(fused, reason)``.
    Raises:
        ValueError: forced on where the fused prefill cannot run (the reason says why).
    Example:
        >>> from linattn.capabilities import profile
        >>> plan_fused(family="gdn", N=16, HV=32, K=128, V=128, dtype=torch.bfloat16, caps=profile("sm90"),
        ...            cfg=fused_config(128, 128, torch.bfloat16))[0]
        True
    """
    why = fused_refusal(family, K, V, dtype, replaced_state=replaced_state, forced_segments=forced_segments)
    if forced is not None:
        if forced and why:
            raise ValueError(f"fused=True: {why}; pass fused=None (the planner's choice) or False")
        return bool(forced), "forced " + ("on" if forced else "off")
    if why:
        return False, why
    if family == "kda" and not FUSED_KDA_DEFAULT:
        return False, ("the fused KDA prefill is not the default until it is measured faster than KDA's pipeline "
                       "on the H200 (prefill.FUSED_KDA_DEFAULT; fused=True forces it)")
    if caps.device_type != "cuda" or caps.vendor != "nvidia" or dtype != torch.bfloat16:
        where = caps.device_type if caps.device_type != "cuda" else f"{caps.vendor} {caps.arch}"
        return False, (f"the fused prefill is chosen where it was measured faster: bf16 on CUDA (H200); here "
                       f"{str(dtype).removeprefix('torch.')} on {where} (fused=True forces it)")
    programs = N * HV * triton.cdiv(V, cfg.block_v)
    if programs < FUSED_MIN_PROGRAMS_PER_SM * caps.sm_count:
        return False, (f"the fused grid's {programs} programs (N x HV x V/{cfg.block_v}) would leave SMs of "
                       f"{caps.sm_count} idle for the whole sequence: the pipeline is kept (its segment-parallel "
                       "state pass runs only where the segment plan cuts segments)")
    return True, (f"fused: {programs} programs (N x HV x V/{cfg.block_v}) fill {caps.sm_count} SMs; the state stays "
                  "on chip (no per-chunk states, w, u or new values in memory)")


def _with_fused(plan: PrefillPlan, caps: DeviceCapabilities, layout: str, forced: Optional[bool],
                cfg: Optional[FusedConfig], segment_chunks: Optional[int]) -> PrefillPlan:
    """``plan`` (the pipeline's) turned into the fused prefill's where :func:`plan_fused` says so:
    its grids, buffers and reason; the pipeline's stages, segments and buffers dropped."""
    if plan.empty:
        return plan
    if cfg is None:
        cfg = fused_config(plan.K, plan.V, plan.dtype, plan.family)
        if caps.device_type != "cpu" and caps.shared_memory_per_block < FUSED_PIPELINED_SMEM:
            cfg = dataclasses.replace(cfg, num_stages=1)  # MI300X's 64 KiB (issue 31)
        if caps.device_type != "cpu" and caps.warp_size > 32 and cfg.num_warps > 4:
            # 8 wavefronts of 64 (the NVIDIA pin's 8 warps): gfx942's build of the GDN walk spills
            # (56 B of scratch at K = 64); 4 fit without (tests/contract/test_compile_amd.py)
            cfg = dataclasses.replace(cfg, num_warps=4)
    on, why = plan_fused(family=plan.family, N=plan.N, HV=plan.HV, K=plan.K, V=plan.V, dtype=plan.dtype, caps=caps,
                         cfg=cfg, replaced_state=plan.state_kernel is not None,
                         forced_segments=bool(segment_chunks), forced=forced)
    if not on:
        return dataclasses.replace(plan, fused_reason=why)
    T, HV, f32 = plan.T, plan.HV, torch.float32
    progs = max(1, min(fused_prep_items(dataclasses.replace(plan, fused=cfg)), caps.sm_count * cfg.prep_ctas_per_sm))
    facts = {f: getattr(plan, f) for f in ("T", "N", "HV", "K", "V", "dtype", "pool_mode", "state_layout",
                                            "final_dtype")}
    specs = _output_specs(facts) + (
        BufferSpec("rk", (T, HV), f32), BufferSpec("fused_qs", (T, HV) if plan.kda else (T, HV, 2), f32),
        BufferSpec("fused_tmb", (T, HV, CHUNK), plan.buf_dtype), BufferSpec("fused_aqk", (T, HV, CHUNK), plan.buf_dtype),
        BufferSpec("intra_scratch", (progs, 2, CHUNK, CHUNK), f32))
    return dataclasses.replace(plan, fused=cfg, fused_reason=why, buffers=specs, segment_chunks=0, n_segments=0,
                               segment_grids=None, segment_reason="the fused prefill runs (no state stage)",
                               fused_grid=plan_grid(plan.N, HV, plan.V // cfg.block_v, caps, layout),
                               grids=plan.grids._replace(intra=(progs,)))


def _plan_stages(facts: dict, cfg: PrefillConfig, caps: DeviceCapabilities, layout: str,
                 buf_dtype: torch.dtype, state_kernel: Optional[Callable],
                 segment_chunks: Optional[int] = None) -> PrefillPlan:
    """The stage split, grids and buffers of a non-empty call (:func:`plan_prefill`)."""
    kda, T, N, H, HV, V = facts["family"] == "kda", facts["T"], facts["N"], facts["H"], facts["HV"], facts["V"]
    opt = stage_options(facts["family"], HV // H, cfg, replaced_state=state_kernel is not None)
    in_state = kda and state_kernel is None and cfg.state.writes_output
    nt_max = T // CHUNK + N
    items = nt_max * HV
    intra_launch, ctas = ((cfg.intra.tm_launch, cfg.intra.tm_ctas_per_sm) if opt.state_u
                          else (cfg.intra.launch, cfg.intra.ctas_per_sm))
    progs = max(1, min(items, caps.sm_count * ctas))
    obv = cfg.output.block_v
    grids = PrefillGrids(
        kda_system=(nt_max, HV) if kda else None, intra=(progs,),
        gates=(nt_max, triton.cdiv(HV, _gates_block(HV))) if opt.hoist else None,
        state=plan_grid(N, HV, V // cfg.state.block_v, caps, layout),
        output=None if in_state else (nt_max, H if opt.grouped_output else HV, V // obv))
    bv = cfg.state.block_v
    L, why = plan_segments(N=N, HV=HV, K=facts["K"], V=V, nt_max=nt_max, block_v=bv, caps=caps, even=opt.half_hbuf,
                           replaced_state=state_kernel is not None, forced=segment_chunks,
                           fp32=facts["dtype"] == torch.float32)
    nseg = nt_max // L + N if L else 0
    seg_grids = None if not L else SegmentGrids(
        summary=plan_grid(nseg, HV, (V + facts["K"]) // bv, caps, layout),
        combine=plan_grid(N, HV, V // SEGMENT_COMBINE_BLOCK_V, caps, layout),
        rerun=plan_grid(nseg, HV, V // bv, caps, layout))
    return PrefillPlan(
        **facts, empty=False, config=cfg, stages=opt, output_in_state=in_state, buf_dtype=buf_dtype,
        DT=tl.bfloat16 if buf_dtype == torch.bfloat16 else tl.float32,
        PREC=_stage_precision(facts["dtype"], "tf32", caps),
        COMBINE_PREC=_stage_precision(facts["dtype"], "tf32x3", caps), nt_max=nt_max,
        triton_tables=N <= TABLES_TRITON_MAX_N, grids=grids, intra_launch=intra_launch,
        state_kernel=state_kernel, segment_chunks=L, n_segments=nseg, segment_reason=why,
        segment_grids=seg_grids,
        buffers=(_output_specs(facts) + _buffer_specs(facts, opt, in_state, nt_max, progs, buf_dtype)
                 + _segment_specs(facts, nseg)))


def _stage_precision(dtype: torch.dtype, nominal: str, caps: DeviceCapabilities) -> str:
    """A stage's dot precision: ``"ieee"`` for fp32 inputs (ops.md's 1e-5), else ``nominal`` as
    :func:`dot_precision` translates it for the target."""
    return "ieee" if dtype == torch.float32 else dot_precision(nominal, caps, interpreter_enabled())


def config_on_target(cfg: PrefillConfig, caps: DeviceCapabilities, interpreted: bool = False) -> PrefillConfig:
    """``cfg`` with its solve's dot precisions translated for ``caps``'s target (:func:`dot_precision`):
    ``cfg`` itself on NVIDIA and in the interpreter."""
    s = cfg.intra.solve
    t = SolveConfig(s.neumann, dot_precision(s.diag_precision, caps, interpreted),
                    dot_precision(s.below_precision, caps, interpreted))
    return cfg if t == s else dataclasses.replace(cfg, intra=dataclasses.replace(cfg.intra, solve=t))


def _output_specs(facts: dict) -> tuple[BufferSpec, ...]:
    """``o`` and, in dense mode, ``final`` (a new tensor in the initial state's dtype, as torch_ref)."""
    T, N, HV, K, V = (facts[n] for n in ("T", "N", "HV", "K", "V"))
    specs = (BufferSpec("o", (T, HV, V), facts["dtype"]),)
    if not facts["pool_mode"]:
        shape = (N, HV, V, K) if facts["state_layout"] == "vk" else (N, HV, K, V)
        specs += (BufferSpec("final", shape, facts["final_dtype"]),)
    return specs


def _buffer_specs(facts: dict, opt: StageOptions, in_state: bool, nt_max: int, progs: int,
                  bdt: torch.dtype) -> tuple[BufferSpec, ...]:
    """The intermediate buffers of a non-empty call (:class:`PrefillBuffers` says what each holds)."""
    T, HV, K, V = (facts[n] for n in ("T", "HV", "K", "V"))
    f32 = torch.float32
    specs = [BufferSpec("w", (T, HV, K), bdt),
             BufferSpec("tm_beta", (T, HV, CHUNK), bdt) if opt.state_u else BufferSpec("u", (T, HV, V), bdt),
             BufferSpec("rk", (T, HV), f32)]
    if facts["family"] == "kda":
        specs += [BufferSpec("kda_a", (nt_max, HV, CHUNK, CHUNK), f32), BufferSpec("kda_aqk", (T, HV, CHUNK), bdt),
                  BufferSpec("kda_kd", (T, HV, K), bdt), BufferSpec("kda_qg", (T, HV, K), bdt),
                  BufferSpec("kda_gl", (nt_max, HV, K), f32)]
    if in_state:  # zero-size: no corrected values or states go through memory (launch_state)
        specs += [BufferSpec("vn", (0,), bdt), BufferSpec("hbuf", (0,), bdt)]
    else:
        specs += [BufferSpec("vn", (T, HV, V), bdt), BufferSpec("hbuf", (nt_max, HV, K, V), bdt)]
    specs.append(BufferSpec("intra_scratch", (progs, 2, CHUNK, CHUNK), f32))
    if opt.hoist:
        specs += [BufferSpec("gdn_kf", (T, HV), f32), BufferSpec("gdn_ec", (nt_max, HV), f32)]
    return tuple(specs)


def _segment_specs(facts: dict, nseg: int) -> tuple[BufferSpec, ...]:
    """The segment-parallel pass's buffers (none when off): ``seg_summary [NSEG, HV, K, V + K]``
    (each segment's ``[B | M]``; the rerun's scratch final states after the combine has read it) and
    ``seg_init [NSEG, HV, K, V]`` (the segments' entering states), fp32, maths layout."""
    if not nseg:
        return ()
    HV, K, V = facts["HV"], facts["K"], facts["V"]
    return (BufferSpec("seg_summary", (nseg, HV, K, V + K), torch.float32),
            BufferSpec("seg_init", (nseg, HV, K, V), torch.float32))


def _gates_block(HV: int) -> int:
    """Value heads per program of the gates kernel."""
    return min(32, triton.next_power_of_2(HV))


# -- running a plan ----------------------------------------------------------------------------

def allocate_buffers(plan: PrefillPlan) -> PrefillBuffers:
    """Fresh (uninitialised) tensors for every buffer of ``plan``."""
    return PrefillBuffers(**{b.name: torch.empty(b.shape, dtype=b.dtype, device=plan.device) for b in plan.buffers})


def conform_inputs(plan: PrefillPlan, q, k, v, g, beta, cu_seqlens) -> PrefillInputs:
    """The inputs with their last dim contiguous (and KDA's ``g``'s), copied where a token stride
    times 64 would overflow the kernels' int32 in-chunk offsets (field case F10)."""
    q, k, v = _row_major(q), _row_major(k), _row_major(v)
    g = _row_major(g) if plan.kda else g
    q, k, v, g, beta = (x if x.stride(0) * CHUNK < 2**31 else x.contiguous() for x in (q, k, v, g, beta))
    return PrefillInputs(q, k, v, g, beta, cu_seqlens)


def prefill_state(plan: PrefillPlan, bufs: PrefillBuffers, state_pool, state_indices, initial_state,
                  has_initial_state, checkpoint_indices=None, checkpoint_every: int = 0) -> PrefillState:
    """Where the state stage reads and writes (:class:`PrefillState`)."""
    if plan.pool_mode:
        flags = None if has_initial_state is None else has_initial_state.contiguous().view(torch.uint8)
        table = None if checkpoint_indices is None else checkpoint_indices.contiguous()
        # flags read as [N] bytes
        return PrefillState(state_pool, state_pool, state_indices, flags, table, int(checkpoint_every or 0))
    return PrefillState(initial_state, bufs.final, None, None)


def run_prefill(plan: PrefillPlan, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                state_pool: Optional[torch.Tensor] = None, state_indices: Optional[torch.Tensor] = None,
                initial_state: Optional[torch.Tensor] = None,
                has_initial_state: Optional[torch.Tensor] = None, checkpoint_every: Optional[int] = None,
                checkpoint_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Run a planned call on tensors of the plan's signature: the stages in order.

    A :attr:`~PrefillPlan.replayable` plan notes, per signature of the tensors (which are given,
    their dtypes and strides, q's, v's and ``cu_seqlens``' shapes) and ``scale``, its first call
    (run stage by stage), records the launches of its second (:class:`PrefillLaunch`, in
    ``plan.launches``) and replays them from then on: the same kernels with the same arguments on
    each call's own tensors, so bitwise the same results, without redoing the host work (buffers,
    grids, argument lists). Other plans, and signatures that cannot be replayed, run the stages one
    by one.

    Args: the tensors of :func:`chunk_prefill` (with the shapes, dtypes and optional ones the plan
    was made for) and ``scale``. Returns and Raises: as :func:`chunk_prefill`.
    Example:
        >>> inp = dict(q=torch.randn(100, 1, 64), k=torch.randn(100, 1, 64), v=torch.randn(100, 2, 64),
        ...            g=-torch.rand(100, 2), beta=torch.rand(100, 2), cu_seqlens=torch.tensor([0, 30, 100]))
        >>> plan = plan_prefill("gdn", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"])
        >>> o, ht = run_prefill(plan, **inp, scale=0.125)
    """
    tensors = (q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, has_initial_state)
    first = None  # the signature of a replayable plan's first call of it
    if plan.replayable:
        key = _call_signature(tensors, scale)
        run = plan.launches.get(key, _UNKNOWN)
        if run is _SEEN_ONCE:
            run = _prepare_launch(plan, key, tensors, scale)
        if run.__class__ is PrefillLaunch:
            return run(*tensors)
        first = key if run is _UNKNOWN else None
    _check_signature(plan, q, v, cu_seqlens, state_pool, initial_state, has_initial_state)
    if (checkpoint_indices is not None) != plan.checkpoints:
        raise ValueError("run_prefill: checkpoint_indices given to a plan made without them, or the reverse; plan "
                         "the call again (plan_prefill(checkpoint_indices=...))")
    _check_checkpoint_every(checkpoint_indices, checkpoint_every)
    bufs = allocate_buffers(plan)
    if plan.empty:  # no chunk runs, so no checkpoint falls inside a sequence (each is past its length)
        _run_empty(plan, bufs, state_pool, state_indices, initial_state, has_initial_state)
        return bufs.o, bufs.final
    x = conform_inputs(plan, q, k, v, g, beta, cu_seqlens)
    st = prefill_state(plan, bufs, state_pool, state_indices, initial_state, has_initial_state, checkpoint_indices,
                       checkpoint_every)
    launch_stages(plan, x, bufs, st, scale)
    if first is not None:
        _keep_launch(plan, first, _SEEN_ONCE)
    return bufs.o, bufs.final


def launch_stages(plan: PrefillPlan, x: PrefillInputs, bufs: PrefillBuffers, st: PrefillState,
                  scale: float) -> ChunkTables:
    """The stages of a non-empty call in order, on conformed inputs (:func:`conform_inputs`), its
    buffers (:func:`allocate_buffers`) and states (:func:`prefill_state`); returns the chunk tables."""
    tables = launch_tables(plan, x.cu_seqlens)
    if plan.fused is not None:
        launch_fused_stages(plan, x, tables, bufs, st, scale)
        return tables
    launch_intra(plan, x, tables, bufs, scale)
    if plan.stages.hoist:
        launch_gates(plan, x, tables, bufs)
    if plan.state_kernel is not None:
        _run_state_kernel(plan, x, tables, bufs, st)
    elif plan.segment_chunks:
        launch_segmented_state(plan, x, tables, bufs, st)
    else:
        launch_state(plan, x, tables, bufs, st)
    if not plan.output_in_state:
        launch_output(plan, x, tables, bufs, st, scale)
    return tables


_UNKNOWN = object()
#: ``plan.launches`` entry of a signature run once (one by one): its next call records the launches,
#: so that a plan run once (:func:`chunk_prefill`) pays for no recording
_SEEN_ONCE = object()
#: signatures kept per plan; past this many they are all forgotten (each is recorded again)
_LAUNCHES_PER_PLAN = 64


def _call_signature(tensors: tuple, scale) -> tuple:
    """What a recorded call's launches depend on besides the plan: ``scale``, each tensor's dtype
    and strides (None for one not given), and the shapes :func:`_check_signature` and the stages
    read (q, v, ``cu_seqlens`` and ``has_initial_state``'s; the others' are the plan's, and their
    strides are what the kernels take). Addresses are not in it: the replay keys its compiled
    kernels on their alignment (:class:`.launch.LaunchSequence`)."""
    flags = tensors[9]
    key = [scale, tensors[0].shape, tensors[2].shape, tensors[5].shape, None if flags is None else flags.shape]
    for x in tensors:
        if x is None:
            key.append(None)
        else:
            key += (x.dtype, x.stride())
    return tuple(key)


def _prepare_launch(plan: PrefillPlan, key: tuple, tensors: tuple, scale) -> Optional["PrefillLaunch"]:
    """Record the launches of a call of a signature run once (None where it cannot be replayed: one
    tensor passed as two arguments, or a launcher copying an input, e.g. a strided ``cu_seqlens``)
    and keep them in ``plan.launches``. Raises as :func:`_check_signature`, keeping nothing."""
    q, v, cu, pool, h0, flags = tensors[0], tensors[2], tensors[5], tensors[6], tensors[8], tensors[9]
    _check_signature(plan, q, v, cu, pool, h0, flags)
    try:
        run = PrefillLaunch(plan, tensors, scale)
    except NotReplayable:
        run = None
    _keep_launch(plan, key, run)
    return run


def _keep_launch(plan: PrefillPlan, key: tuple, entry) -> None:
    if len(plan.launches) >= _LAUNCHES_PER_PLAN:
        plan.launches.clear()
    plan.launches[key] = entry


#: byte alignment of each buffer in a :class:`PrefillLaunch` workspace (that of a fresh CUDA allocation)
WORKSPACE_ALIGN = 512


class PrefillLaunch:
    """The launches of a planned call, recorded once per signature of its tensors and replayed on
    later calls of that signature (:func:`run_prefill` keeps one per signature in ``plan.launches``).

    Recording runs :func:`launch_stages` with the launches recorded, not made
    (:func:`.launch.recording`), on the call's conformed inputs and on stand-in buffers without
    storage (``meta`` tensors of the plan's buffer specs). A replay
    (:class:`.launch.LaunchSequence`) makes the same launches, with the same kernels, scalar
    arguments, constexprs and launch options, on a later call's tensors. Per call it copies only the
    inputs whose strides need it (:func:`conform_inputs`, :func:`prefill_state`), allocates the
    output ``o``, in dense mode the final state, and one workspace holding every non-empty
    intermediate buffer (:class:`PrefillBuffers`) and the chunk tables, each at a
    :data:`WORKSPACE_ALIGN`-byte offset; the direct launch passes the workspace's buffers as
    addresses. So a replay computes bitwise what :func:`launch_stages` computes on the same tensors.

    Args:
        plan: a :attr:`~PrefillPlan.replayable` plan.
        tensors: ``(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state,
            has_initial_state)`` of one call, as :func:`run_prefill` takes them (None where not given).
        scale: the query scale (> 0).
    Raises:
        linattn.kernels.triton.launch.NotReplayable: one tensor passed as two arguments, or a
            launch on a tensor the stages made themselves (a copy of ``cu_seqlens``).
    """

    __slots__ = ("sequence", "copies", "copy_flags", "device", "o_spec", "final_spec", "workspace", "offsets",
                 "ws_bytes", "_present")

    def __init__(self, plan: PrefillPlan, tensors: tuple, scale: float):
        q, k, v, g, beta, cu, pool, idx, h0, flags = tensors
        x = conform_inputs(plan, q, k, v, g, beta, cu)
        self.copies = tuple(a is not b for a, b in zip(tensors[:5], x[:5]))
        self.copy_flags = flags is not None and not flags.is_contiguous()
        # no storage; an empty buffer (KDA's unread vn, hbuf) is a real one, kept as a constant of the replay
        stand_in = PrefillBuffers(**{b.name: torch.empty(b.shape, dtype=b.dtype, device=plan.device if 0 in b.shape
                                                         else "meta") for b in plan.buffers})
        st = prefill_state(plan, stand_in, pool, idx, h0, flags)
        with recording() as records:
            tables = launch_stages(plan, x, stand_in, st, scale)
        carved = [t for t in (getattr(stand_in, b.name) for b in plan.buffers if b.name not in ("o", "final"))
                  if t.numel()] + list(tables)
        self.workspace, self.offsets, self.ws_bytes = _workspace_layout(carved)
        sources = (*x, pool, idx, h0, st.has_initial_state, stand_in.o, stand_in.final, *carved)
        self.sequence = LaunchSequence(records, sources)
        self.device = plan.device
        specs = {b.name: b for b in plan.buffers}
        self.o_spec, self.final_spec = specs["o"], specs.get("final")
        present = [i for i, t in enumerate(tensors[:10] + (stand_in.o, stand_in.final)) if t is not None]
        self._present = operator.itemgetter(*present)

    def __call__(self, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state,
                 has_initial_state) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Launch on a call's tensors (:func:`run_prefill`'s, of the recorded signature); returns
        ``(o, final_state)`` as :func:`chunk_prefill`."""
        if True in self.copies:
            q, k, v, g, beta = (a.contiguous() if c else a for a, c in zip((q, k, v, g, beta), self.copies))
        if self.copy_flags:
            has_initial_state = has_initial_state.contiguous()
        o_shape = self.o_spec.shape
        if q.shape[0] != o_shape[0]:  # a call of a T bucket's replay (:class:`PrefillReplay`): o has its own T rows
            o_shape = (q.shape[0], *o_shape[1:])
        o = torch.empty(o_shape, dtype=self.o_spec.dtype, device=self.device)
        f = self.final_spec
        final = None if f is None else torch.empty(f.shape, dtype=f.dtype, device=self.device)
        ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=self.device)
        base = ws.data_ptr()
        tensors = (q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, has_initial_state, o, final)
        key = (base & 15 == 0, *[t.data_ptr() & 15 == 0 for t in self._present(tensors)])
        self.sequence(key, tensors + tuple(map(base.__add__, self.offsets)), lambda: self._views(tensors, ws), ws)
        return o, final

    def _views(self, tensors: tuple, ws: torch.Tensor) -> tuple:
        """The sources with the workspace's buffers as tensors, and the ``has_initial_state`` bytes
        as :func:`prefill_state` views them (Triton's ordinary launch types pointers by dtype)."""
        flags = tensors[9]
        head = tensors[:9] + (None if flags is None else flags.view(torch.uint8),) + tensors[10:]
        return head + tuple(ws[o:o + n].view(dt).view(shape) for o, n, dt, shape in self.workspace)


def _workspace_layout(buffers: list) -> tuple[tuple, tuple, int]:
    """``(layout, offsets, total bytes)`` of a workspace holding tensors shaped as ``buffers``:
    per buffer ``(byte offset, bytes, dtype, shape)``, each offset a multiple of :data:`WORKSPACE_ALIGN`."""
    layout, at = [], 0
    for b in buffers:
        n = b.numel() * b.element_size()
        layout.append((at, n, b.dtype, tuple(b.shape)))
        at += -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return tuple(layout), tuple(o for o, *_ in layout), at


#: T buckets a :class:`PrefillReplay` splits each power of two into (the workspace's overhead is at
#: most a quarter of T, and at least one chunk)
REPLAY_BUCKETS_PER_OCTAVE = 4


def replay_tokens(T: int) -> int:
    """The token count a replay of a ``T``-token call is planned for (:class:`PrefillReplay`): ``T``
    rounded up to a multiple of ``max(64, 2**(bit_length(T) - 3))`` (4 buckets per power of two:
    ``T <= result < 1.25 T + 64``)."""
    step = max(CHUNK, 1 << max(0, T.bit_length() - REPLAY_BUCKETS_PER_OCTAVE.bit_length()))
    return -(-T // step) * step


class PrefillReplay:
    """The chunked prefill of every call of one class whose token count ``T`` and sequence count
    ``N`` change from call to call (issue 28: an engine's packed prefill), at the host cost of a
    recorded replay.

    The stages read ``T`` only through the chunk bound ``T // 64 + N`` (grids of the chunk-parallel
    stages, the chunk tables' size, the intermediate buffers' rows); which chunks are real and where
    they start comes from ``cu_seqlens`` on the device (the chunk tables: entries past the real count
    hold ``chunk_seq = N`` and every stage skips them). So a plan made for ``T_b =``
    :func:`replay_tokens` ``(T) >= T`` tokens and the call's ``N`` runs a ``T``-token call: its
    grids cover more chunk slots, the extra ones exit at once, each real chunk is computed by the
    same instructions on the same operands (bitwise the result of a plan for ``T``,
    ``tests/prefill/test_prefill_replay.py``), and its workspace is sized by the bucket, so calls of
    one bucket ask the allocator for one size (on CUDA the caching allocator hands back the block the
    last call freed, on the call's stream). The output ``o`` is ``[T, HV, V]``, allocated per call.

    Per ``(T_b, N)`` the plan is made once and its launches recorded (:class:`PrefillLaunch`); a
    later call with a new ``T`` of a known bucket is a replay: the output and workspace allocations
    and the recorded launches on the call's tensors, the table pointers carved from the new
    workspace. Where a bucket's plan cannot be replayed (not :attr:`~PrefillPlan.replayable`: the
    torch chunk tables past :data:`TABLES_TRITON_MAX_N` sequences, a segment-parallel state pass)
    or where the planner would cut ``T`` itself into segments, the call is planned for its own
    ``T`` (:func:`plan_prefill`, :func:`run_prefill`).

    Args:
        family: ``"gdn"`` or ``"kda"``. layout, caps: as :func:`plan_prefill`.
        args: the first call's arguments (the class's metadata: dtypes, strides, which optional
            tensors are given, ``scale``, ``use_qk_l2norm``, ``state_layout``); later calls must be of
            the same class (the dispatcher's class key, ``dispatch/fast_path.py``: same dtypes,
            strides, head dims, flags and scalars; other ``T`` and ``N``).
    """

    __slots__ = ("family", "caps", "layout", "scale", "flags", "entries", "exact")
    #: serves every T and N of its call class (the dispatcher's class plans share it)
    serves_class = True

    def __init__(self, family: str, args: dict, caps: DeviceCapabilities, layout: str):
        from linattn.dispatch.lru import PREFILL_REPLAYS_MAX, LRUCache

        self.family, self.caps, self.layout = family, caps, layout
        self.scale = args["scale"]
        self.flags = (args.get("state_pool") is not None, args["use_qk_l2norm"], args["state_layout"])
        #: per (T bucket, N): ``(plan, launch)``, ``launch`` None where the bucket's plan is not replayable
        self.entries = LRUCache(PREFILL_REPLAYS_MAX)
        #: per exact (T, N): the call's own plan, where the bucket cannot serve it
        self.exact = LRUCache(PREFILL_REPLAYS_MAX)

    def _plan(self, a: dict, q: torch.Tensor) -> PrefillPlan:
        return plan_prefill(self.family, q=q, v=a["v"], cu_seqlens=a["cu_seqlens"], state_pool=a.get("state_pool"),
                            state_indices=a.get("state_indices"), initial_state=a.get("initial_state"),
                            has_initial_state=a.get("has_initial_state"), use_qk_l2norm=self.flags[1],
                            state_layout=self.flags[2], layout=self.layout, caps=self.caps,
                            checkpoint_indices=a.get("checkpoint_indices"))

    def _bucket(self, a: dict, key: tuple) -> list:
        """Plan the bucket ``key = (T_b, N)`` from the call ``a``'s metadata (the bucket's q shape
        stands in for q's); its launches are recorded on the bucket's second call (:meth:`__call__`)."""
        q = a["q"]
        stand_in = q.new_empty(()).expand(key[0], *q.shape[1:])  # the bucket's shape; no storage
        plan = self._plan(a, stand_in)
        #: the plan, its recorded launches (None: not yet, or _NOT_REPLAYED), whether the planner's
        #: segment choice may differ at another T of the bucket
        entry = [plan, None if plan.replayable else _NOT_REPLAYED, _segments_vary(plan, self.caps)]
        self.entries.put(key, entry)
        return entry

    def bind(self, a: dict) -> "PrefillReplay":
        """What runs calls with the lengths of ``a``: this replay (it finds the bucket per call)."""
        return self

    def __call__(self, a: dict) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Run the call ``a`` (the op's tensor arguments by name); returns ``(o, final_state)``.

        A bucket's first call runs the stages of the bucket's plan one by one (their launches through
        :func:`.launch.launch`, direct where the kernels were compiled for another call of the same
        int classes), so a bucket used once pays no recording; its second call records the launches
        (:class:`PrefillLaunch`), and every call after replays them. With ``output_state_indices`` the
        read slots are first copied into the write slots (:func:`forked`) and the call runs in place there."""
        a = forked(a)
        q = a["q"]
        T, N = q.shape[0], a["cu_seqlens"].shape[0] - 1
        if T and N and a.get("checkpoint_indices") is None:  # a call with checkpoints: its own plan, not replayed
            key = (replay_tokens(T), N)
            entry = self.entries.get(key)
            first = entry is None
            if first:
                entry = self._bucket(a, key)
            plan, launch, vary = entry
            if launch is not _NOT_REPLAYED and not (vary and _segmented(plan, T, self.caps)):
                if launch is not None:
                    return launch(*_tensors(a))
                if not first:
                    try:
                        launch = entry[1] = PrefillLaunch(plan, _tensors(a), self.scale)
                    except NotReplayable:
                        entry[1] = _NOT_REPLAYED
                    else:
                        return launch(*_tensors(a))
                else:
                    return _run_bucket(plan, a, T, self.scale)
        plan = self.exact.get((T, N))
        if plan is None:
            plan = self._plan(a, q)
            self.exact.put((T, N), plan)
        return run_prefill(plan, **_prefill_kwargs(a), scale=self.scale)


def forked(a: dict) -> dict:
    """The call ``a`` (the op's arguments by name) to run in place: unchanged without
    ``output_state_indices``; else each read slot copied into its write slot (``fork_slots``: only
    where they differ and the sequence reads a state) and ``state_indices`` replaced by the write
    slots (docs/ops.md "Separate read and write slots")."""
    out = a.get("output_state_indices")
    if out is None:
        return a
    from .fork_slots import fork_slots

    fork_slots(a["state_pool"], a["state_indices"], out, a.get("has_initial_state"))
    return dict(a, state_indices=out, output_state_indices=None)


#: a :class:`PrefillReplay` bucket whose launches cannot be replayed (its calls are planned for their own T)
_NOT_REPLAYED = object()


def _run_bucket(plan: PrefillPlan, a: dict, T: int, scale: float) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The stages of a bucket's plan run one by one on a ``T``-token call (``o`` of its own ``T`` rows;
    the other buffers the bucket's)."""
    bufs = PrefillBuffers(**{b.name: torch.empty((T, *b.shape[1:]) if b.name == "o" else b.shape, dtype=b.dtype,
                                                 device=plan.device) for b in plan.buffers})
    x = conform_inputs(plan, a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"])
    st = prefill_state(plan, bufs, a.get("state_pool"), a.get("state_indices"), a.get("initial_state"),
                       a.get("has_initial_state"))
    launch_stages(plan, x, bufs, st, scale)
    return bufs.o, bufs.final


def _tensors(a: dict) -> tuple:
    """The tensors of a call as :class:`PrefillLaunch` takes them."""
    get = a.get
    return (a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"], get("state_pool"), get("state_indices"),
            get("initial_state"), get("has_initial_state"))


def _prefill_kwargs(a: dict) -> dict:
    names = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state",
             "has_initial_state", "checkpoint_every", "checkpoint_indices")
    return {n: a.get(n) for n in names}


def _segments_vary(plan: PrefillPlan, caps: DeviceCapabilities) -> bool:
    """Whether :func:`plan_segments` may cut a call of ``plan``'s ``N`` into segments at another
    ``T`` (False where it answers 0 before reading the chunk bound: fp32, a large ``K``, a state
    grid that fills the SMs, the fused prefill ...)."""
    if plan.empty or plan.fused is not None or plan.state_kernel is not None or plan.segment_chunks:
        return plan.segment_chunks != 0
    bv = plan.config.state.block_v
    return not (plan.dtype == torch.float32 or plan.K > SEGMENT_MAX_K or plan.V % bv or plan.K % bv
                or plan.N * plan.HV * (plan.V // bv) >= caps.sm_count)


def _segmented(plan: PrefillPlan, T: int, caps: DeviceCapabilities) -> bool:
    """Whether the planner cuts a ``T``-token call of ``plan``'s class into segments."""
    bv = plan.config.state.block_v
    L, _ = plan_segments(N=plan.N, HV=plan.HV, K=plan.K, V=plan.V, nt_max=T // CHUNK + plan.N, block_v=bv,
                         caps=caps, even=plan.stages.half_hbuf, fp32=plan.dtype == torch.float32)
    return L != 0


def _check_signature(plan: PrefillPlan, q, v, cu_seqlens, state_pool, initial_state, has_initial_state) -> None:
    got = (tuple(q.shape), tuple(v.shape[1:]), q.dtype, cu_seqlens.numel() - 1, state_pool is not None,
           initial_state is not None, has_initial_state is not None)
    want = ((plan.T, plan.H, plan.K), (plan.HV, plan.V), plan.dtype, plan.N, plan.pool_mode, plan.has_h0,
            plan.has_init_flags)
    if got != want:
        raise ValueError(f"run_prefill: the tensors do not match the plan: got (q shape, v shape[1:], dtype, N, "
                         f"pool, initial_state, has_initial_state) = {got}, the plan was made for {want}; "
                         "plan the call again (plan_prefill)")


def _run_empty(plan: PrefillPlan, bufs: PrefillBuffers, state_pool, state_indices, initial_state,
               has_initial_state) -> None:
    """No token or no sequence: the final state is the initial state (a fresh pool slot: zeros)."""
    if plan.pool_mode and has_initial_state is not None and plan.N > 0:
        idx = state_indices.to(torch.long)
        fresh = (idx >= 0) & ~has_initial_state.to(device=plan.device, dtype=torch.bool)
        state_pool[idx[fresh]] = 0  # no kernel runs at T = 0
    if bufs.final is not None:
        if initial_state is not None:
            bufs.final.copy_(initial_state)
        else:
            bufs.final.zero_()


def _run_state_kernel(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers,
                      st: PrefillState) -> None:
    """Stage 2 by the replacement state kernel, on the same buffers (the raw k and g)."""
    extra = {} if st.has_initial_state is None else {"has_initial_state": st.has_initial_state}
    if st.checkpoints is not None:  # state checkpoints: the replacement kernel stores them (CuTe DSL's does)
        extra.update(checkpoint_indices=st.checkpoints, checkpoint_every=st.checkpoint_every)
    plan.state_kernel(kda=plan.kda, k=x.k, g=x.g, w=b.w, u=b.u, rk=b.rk, cu_seqlens=x.cu_seqlens,
                      chunk_off=t.chunk_off, state_indices=st.state_indices, h0=st.h0, ht=st.ht, hbuf=b.hbuf,
                      vn=b.vn, state_layout=plan.state_layout, **extra)


# -- the stages --------------------------------------------------------------------------------

def _launch(kernel, grid: tuple, args: tuple, constexprs: dict, opts: LaunchOptions) -> None:
    """:func:`.launch.launch` with ``opts``. A register cap goes among the keywords, which Triton
    takes as a compile option (:func:`.launch.launch` has no ``maxnreg`` option of its own)."""
    if opts.maxnreg is not None:
        constexprs = {**constexprs, "maxnreg": opts.maxnreg}
    launch(kernel, grid, args, constexprs, num_warps=opts.num_warps, num_stages=opts.num_stages)


def launch_tables(plan: PrefillPlan, cu_seqlens: torch.Tensor) -> ChunkTables:
    """Stage 0: the chunk index tables (:func:`.chunk_tables.chunk_tables_triton`, or torch ops past
    :data:`TABLES_TRITON_MAX_N` sequences)."""
    tables = chunk_tables_triton if plan.triton_tables else chunk_tables
    chunk_off, chunk_seq, chunk_start, _ = tables(cu_seqlens, plan.T)
    return ChunkTables(chunk_off, chunk_seq, chunk_start)


def launch_intra(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, scale: float) -> None:
    """Stage 1: KDA's system kernel (grid ``(NT_max, HV)``), then the persistent intra kernel
    (``min(NT_max * HV, sm_count * ctas_per_sm)`` programs, each with its own 32 KiB fp32 scratch).
    Writes ``w``, ``u`` (or ``tm_beta``), ``rk`` and KDA's operands; touches no state."""
    cfg, kda, HV = plan.config, plan.kda, plan.HV
    common = dict(K=plan.K, L2NORM=plan.use_qk_l2norm, DT=plan.DT, PREC=plan.PREC)
    if kda:  # stage 1a: A, Aqk and the later stages' operands
        s = cfg.kda_system
        _launch(chunk_kda_system_kernel, plan.grids.kda_system,
                (x.q, x.k, x.g, x.beta, x.cu_seqlens, t.chunk_seq, t.chunk_start, b.kda_a, b.rk, b.kda_aqk, b.w,
                 b.kda_kd, b.kda_qg, b.kda_gl, *x.q.stride()[:2], *x.k.stride()[:2], *x.g.stride()[:2],
                 *x.beta.stride()[:2], plan.N, plan.group, HV, float(scale)),
                dict(common, **kda_system_constexprs(plan)), s.launch)
    solve = cfg.intra.solve
    _launch(chunk_intra_kernel, plan.grids.intra,
            (x.k, x.v, None if kda else x.g, x.beta, x.cu_seqlens, t.chunk_seq, t.chunk_start, b.w, b.u,
             b.tm_beta, b.rk, b.kda_a, b.intra_scratch, *x.k.stride()[:2], *x.v.stride()[:2],
             *((0, 0) if kda else x.g.stride()[:2]), *x.beta.stride()[:2],
             plan.N, plan.group, HV, plan.nt_max * HV),
            dict(common, V=plan.V, BK=cfg.intra.block, BV=cfg.intra.block, KDA=kda, NEUMANN=solve.neumann,
                 DPREC=solve.diag_precision, IPREC=solve.below_precision, TMOUT=plan.stages.state_u),
            plan.intra_launch)


def kda_system_constexprs(plan: PrefillPlan) -> dict:
    """KDA's channel-block constexprs (:class:`KdaSystemConfig`: ``BK``, the operand dtype ``OP``, the
    fast path's ``SPAN``, ``-inf`` when off) for :func:`.chunk_intra.chunk_kda_system_kernel` and the
    fused prep (:func:`.chunk_fused_kda.chunk_kda_fused_prep_kernel`)."""
    s = plan.config.kda_system
    return dict(BK=s.block_k, OP=plan.DT if s.bf16_operands else tl.float32,
                SPAN=KDA_FAST_SPAN if s.fast_path else float("-inf"))


def launch_gates(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers) -> None:
    """GDN, between stages 1 and 2: ``gdn_kf`` and ``gdn_ec``, the state loop's gate factors
    (:func:`.chunk_state.chunk_gdn_gates_kernel`)."""
    launch(chunk_gdn_gates_kernel, plan.grids.gates,
           (x.g, b.rk, b.gdn_kf, b.gdn_ec, x.cu_seqlens, t.chunk_seq, t.chunk_start, *x.g.stride()[:2],
            plan.N, plan.HV), dict(BH=_gates_block(plan.HV)), num_warps=4)


def launch_state(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, st: PrefillState) -> None:
    """Stage 2: the sequential state kernel (:func:`.chunk_state.chunk_state_kernel`), on the grid
    planned for ``N x HV x V // block_v``; reads ``h0`` and writes the final state in place (pool)
    or to ``final`` (dense); writes ``hbuf`` and ``vn``, or the output (``plan.output_in_state``)."""
    if plan.grids.state.empty:
        return
    s0 = _state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    _launch_state_kernel(plan, x, b, grid=plan.grids.state, cu=x.cu_seqlens, chunk_off=t.chunk_off,
                         state_indices=st.state_indices, flags=st.has_initial_state, h0=st.h0, ht=st.ht,
                         s0=s0, st=_state_strides(st.ht, plan.state_layout), pool=plan.pool_mode,
                         has_h0=plan.has_h0, has_init=plan.has_init_flags, fused=plan.output_in_state,
                         checkpoints=st.checkpoints, checkpoint_every=st.checkpoint_every)


def _launch_state_kernel(plan: PrefillPlan, x: PrefillInputs, b: PrefillBuffers, *, grid: GridPlan, cu, chunk_off,
                         state_indices, flags, h0, ht, s0: tuple, st: tuple, pool: bool, has_h0: bool,
                         has_init: bool, fused: bool, segment: int = 0, checkpoints=None,
                         checkpoint_every: int = 0) -> None:
    """One launch of the state kernel on ``grid`` with the given tables and state operands
    (``s0``, ``st``: the ``(slot, head, k, v)`` element strides of ``h0`` and ``ht``); ``checkpoints``
    (pool mode, one pass): the slot table, with ``checkpoint_every`` in tokens (``HAS_CKPT``)."""
    opt, kda = plan.stages, plan.kda
    if kda:  # stage 1's decayed keys and per-chunk total log decays, per value head (GROUP 1)
        keys, gate, row, group = b.kda_kd, b.kda_gl, None, 1
    else:  # the gates kernel's factors, or the raw gates and the key norms
        keys, group = x.k, plan.group
        gate, row = (b.gdn_ec, b.gdn_kf) if opt.hoist else (x.g, b.rk)
    q, aqk, o = (b.kda_qg, b.kda_aqk, b.o) if fused else (None, None, None)
    v, tm = (x.v, b.tm_beta) if opt.state_u else (None, None)
    if fused:  # unread, yet not None: None here moves a shipped build's sm_90 code (#prefill-none-operands)
        row = b.rk
        flags = flags if flags is not None else torch.empty(0, dtype=torch.uint8, device=plan.device)
    constexprs = dict(K=plan.K, V=plan.V, BV=plan.config.state.block_v, **grid.constexprs, KDA=kda, POOL=pool,
                      HAS_H0=has_h0, DT=plan.DT, PREC=plan.PREC, FUSE_O=fused, HOIST=opt.hoist,
                      HSTEP=2 if opt.half_hbuf else 1, UTM=opt.state_u, HAS_INIT=has_init)
    if segment:
        constexprs["SEGMENT"] = segment
    ck = (None, None, None)
    if checkpoints is not None:  # the build without HAS_CKPT takes the three as None (constexpr-folded)
        constexprs["HAS_CKPT"] = True
        ck = (checkpoints, checkpoints.shape[1], checkpoint_every // CHUNK)
    _launch(chunk_state_kernel, grid.grid,
            (keys, gate, b.w, b.u, row, cu, chunk_off, state_indices, flags,
             h0, ht, b.hbuf, b.vn, q, aqk, o, v, tm, *keys.stride()[:2], *gate.stride()[:2],
             *(q.stride()[:2] if fused else v.stride()[:2] if opt.state_u else (0, 0)),  # q's or v's: one pair
             *s0, *st, group, plan.HV, *ck),
            constexprs, plan.config.state.fused_launch if fused else plan.config.state.launch)


def segment_tables(plan: PrefillPlan, cu_seqlens: torch.Tensor, chunk_off: torch.Tensor,
                   state_indices: Optional[torch.Tensor]) -> SegmentTables:
    """The segments of a call, on the device with no host sync, in one launch
    (:func:`.chunk_tables.segment_tables_kernel`): sequence ``n`` of ``nc_n`` chunks is cut into
    ``ceil(nc_n / L)`` segments of ``L = plan.segment_chunks`` chunks, on its own chunk grid (the
    last one may be shorter, its last chunk short); a zero-length sequence has none. Returns
    :class:`SegmentTables` over the bound ``plan.n_segments``, bitwise those of
    :func:`segment_tables_torch`."""
    N, nseg, dev = plan.N, plan.n_segments, cu_seqlens.device
    seg_cu = torch.empty(nseg + 1, dtype=torch.int64, device=dev)
    seg_off = torch.empty(nseg, dtype=torch.int64, device=dev)
    seg_first = torch.empty(N + 1, dtype=torch.int64, device=dev)
    seg_slot = None if state_indices is None else torch.empty(nseg, dtype=torch.int64, device=dev)
    launch(segment_tables_kernel, (1,),
           (cu_seqlens, chunk_off, state_indices, seg_cu, seg_off, seg_first, seg_slot, N, plan.T,
            plan.segment_chunks, nseg, max(1, N.bit_length())),
           dict(HAS_SLOT=state_indices is not None, BN=SEG_BN, BS=SEG_BS), num_warps=4)
    return SegmentTables(seg_cu, seg_off, seg_first, seg_slot)


def segment_tables_torch(plan: PrefillPlan, cu_seqlens: torch.Tensor, chunk_off: torch.Tensor,
                         state_indices: Optional[torch.Tensor]) -> SegmentTables:
    """:func:`segment_tables` in torch ops (the tests' reference for the kernel)."""
    L, T, N, nseg = plan.segment_chunks, plan.T, plan.N, plan.n_segments
    dev = cu_seqlens.device
    cu = cu_seqlens.to(torch.int64)
    per_seq = (chunk_off[1:] - chunk_off[:-1] + (L - 1)) // L
    seg_first = torch.zeros(N + 1, dtype=torch.int64, device=dev)
    torch.cumsum(per_seq, 0, out=seg_first[1:])
    j = torch.arange(nseg, dtype=torch.int64, device=dev)
    n = torch.searchsorted(seg_first[1:], j, right=True)  # N past the real count
    real = n < N
    nc = n.clamp(max=N - 1)
    i = j - seg_first[nc]
    seg_cu = torch.full((nseg + 1,), T, dtype=torch.int64, device=dev)
    seg_cu[:-1] = torch.where(real, cu[nc] + i * (L * CHUNK), T)
    seg_chunk_off = chunk_off[nc] + i * L
    slot = None
    if state_indices is not None:
        slot = torch.where(real, state_indices.to(torch.int64)[nc], -1)
    return SegmentTables(seg_cu, seg_chunk_off, seg_first, slot)


def launch_segmented_state(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers,
                           st: PrefillState) -> None:
    """Stage 2 as the segment-parallel state pass (ops.md "Segment-parallel state pass"): the
    segment tables, the summary pass (each segment's ``[B | M]`` from ``[0 | I]``), the combine
    (every segment's entering state; the final state to the pool row or ``final``) and the rerun
    from the entering states (``hbuf`` and ``vn``, or the output)."""
    seg = segment_tables(plan, x.cu_seqlens, t.chunk_off, st.state_indices if plan.pool_mode else None)
    g, K, V, HV = plan.segment_grids, plan.K, plan.V, plan.HV
    summary, init = b.seg_summary, b.seg_init
    sm = (HV * K * (V + K), K * (V + K), V + K, 1)  # (segment, head, k, v) strides of [B | M]
    si = (HV * K * V, K * V, V, 1)
    common = dict(cu=seg.seg_cu, chunk_off=seg.seg_chunk_off)
    _launch_state_kernel(plan, x, b, grid=g.summary, **common, state_indices=None, flags=None, h0=None,
                         ht=summary, s0=sm, st=sm, pool=False, has_h0=False, has_init=False, fused=False,
                         segment=1)
    s0 = _state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    _launch(chunk_segment_combine_kernel, g.combine.grid,
            (summary, seg.seg_first, init, st.h0, st.ht, st.state_indices, st.has_initial_state,
             sm[0], sm[1], *s0, *_state_strides(st.ht, plan.state_layout), HV),
            dict(K=K, V=V, BV=SEGMENT_COMBINE_BLOCK_V, **g.combine.constexprs, POOL=plan.pool_mode,
                 HAS_H0=plan.has_h0, HAS_INIT=plan.has_init_flags,
                 PREC=plan.COMBINE_PREC), SEGMENT_COMBINE_LAUNCH)
    _launch_state_kernel(plan, x, b, grid=g.rerun, **common, state_indices=seg.seg_slot, flags=None, h0=init,
                         ht=summary, s0=si, st=sm, pool=plan.pool_mode, has_h0=True, has_init=False,
                         fused=plan.output_in_state, segment=2)


def fused_prep_items(plan: PrefillPlan) -> int:
    """The fused prep kernel's items: ``(chunk, key head)`` pairs where GDN's prep shares the keys of a
    GVA group (``FusedConfig.prep_shared_keys``), else ``(chunk, value head)`` pairs (KDA: per value
    head gates of every channel, nothing to share)."""
    shared = not plan.kda and plan.fused.prep_shared_keys
    return plan.nt_max * (plan.H if shared else plan.HV)


def launch_fused_stages(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, st: PrefillState,
                        scale: float) -> None:
    """The fused prefill (:mod:`.chunk_fused`; KDA: :mod:`.chunk_fused_kda`) in place of the pipeline's
    stages: the prep kernel (``Tm diag(beta)``, ``Aqk``, the norms; persistent grid) and the fused
    kernel (state on chip; ``h0`` and the final state in place, as the state stage)."""
    cfg = plan.fused
    if plan.kda:  # the pipeline's channel blocks, operands and fast path (chunk_kda_system_kernel's)
        prep, fused = chunk_kda_fused_prep_kernel, chunk_kda_fused_kernel
        family, walk = kda_system_constexprs(plan), dict(LATE_KD=cfg.late_keys)
    else:
        prep, fused = chunk_gdn_fused_prep_kernel, chunk_gdn_fused_kernel
        family = dict(BK=min(plan.K, cfg.prep_block_k), DT=plan.DT, SHARED_KEYS=cfg.prep_shared_keys)
        walk = {}
    launch_fused_prep(_launch_plain, prep, q=x.q, k=x.k, g=x.g, beta=x.beta, cu_seqlens=x.cu_seqlens,
                      chunk_seq=t.chunk_seq, chunk_start=t.chunk_start, tmb=b.fused_tmb, aqk=b.fused_aqk,
                      rk=b.rk, qs=b.fused_qs, scratch=b.intra_scratch, N=plan.N, group=plan.group, HV=plan.HV,
                      items=fused_prep_items(plan), scale=scale, K=plan.K, l2norm=plan.use_qk_l2norm,
                      PREC=plan.PREC, solve=plan.config.intra.solve, cfg=cfg, **family)
    if not plan.kda:  # opt-in: the CuTe DSL walk where LINATTN_CUTEDSL_WALK=1 (kernels/cutedsl/fused_walk.py)
        from linattn.kernels.cutedsl import fused_walk
        if fused_walk.enabled() and fused_walk.run_for_plan(plan, x, b, st):
            return
    s0 = _state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    launch_fused(_launch_plain, fused, plan.fused_grid, q=x.q, k=x.k, v=x.v, g=x.g, tmb=b.fused_tmb,
                 aqk=b.fused_aqk, rk=b.rk, qs=b.fused_qs, o=b.o, cu_seqlens=x.cu_seqlens,
                 state_indices=st.state_indices, has_init=st.has_initial_state, h0=st.h0, ht=st.ht, s0=s0,
                 st=_state_strides(st.ht, plan.state_layout), group=plan.group, HV=plan.HV, K=plan.K, V=plan.V,
                 pool=plan.pool_mode, has_h0=plan.has_h0, has_init_flags=plan.has_init_flags, DT=plan.DT,
                 PREC=plan.PREC, cfg=cfg, checkpoints=st.checkpoints, checkpoint_every=st.checkpoint_every, **walk)


def _launch_plain(kernel, grid, args, constexprs, *, num_warps, num_stages):
    """:func:`.launch.launch` looked up at call time (tests may wrap it)."""
    launch(kernel, grid, args, constexprs, num_warps=num_warps, num_stages=num_stages)


def launch_output(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers, st: PrefillState,
                  scale: float) -> None:
    """Stage 3: the output rows, one program per (chunk, value head, value block)
    (:func:`.chunk_output.chunk_output_kernel`) or, at a grouped GVA size, per key head
    (:func:`.chunk_output.chunk_output_grouped_kernel`)."""
    opt, cfg = plan.stages, plan.config.output
    common = dict(K=plan.K, V=plan.V, BK=64, BV=cfg.block_v, L2NORM=plan.use_qk_l2norm, POOL=plan.pool_mode,
                  DT=plan.DT, PREC=plan.PREC)
    tail = (x.cu_seqlens, t.chunk_seq, t.chunk_start, st.state_indices)
    if opt.grouped_output:  # one program per key head: one q k^T
        half = opt.half_hbuf
        _launch(chunk_output_grouped_kernel, plan.grids.output,
                (x.q, x.k, x.g, b.rk, b.hbuf, b.vn, b.o, *tail, b.gdn_kf if half else None,
                 b.gdn_ec if half else None, *x.q.stride()[:2], *x.k.stride()[:2], *x.g.stride()[:2],
                 plan.N, plan.HV, float(scale)),
                dict(common, GROUP=plan.group, HALF=half), cfg.grouped_launch)
        return
    if plan.kda:  # stage 1's decayed queries and keys, per-chunk decays and Aqk (GROUP 1)
        q, k, g, rk, aqk, group = b.kda_qg, b.kda_kd, b.kda_gl, None, b.kda_aqk, 1
    else:
        q, k, g, rk, aqk, group = x.q, x.k, x.g, b.rk, None, plan.group
    _launch(chunk_output_kernel, plan.grids.output,
            (q, k, g, rk, aqk, b.hbuf, b.vn, b.o, *tail, *q.stride()[:2], *k.stride()[:2], *g.stride()[:2],
             plan.N, group, plan.HV, float(scale)),
            dict(common, KDA=plan.kda), cfg.launch)


# -- the public entry --------------------------------------------------------------------------

def chunk_prefill(family: Literal["gdn", "kda"], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
                  state_pool: Optional[torch.Tensor], state_indices: Optional[torch.Tensor],
                  initial_state: Optional[torch.Tensor], scale: float, use_qk_l2norm: bool,
                  state_layout: str, layout: str = "split",
                  caps: Optional[DeviceCapabilities] = None,
                  state_kernel=None,
                  has_initial_state: Optional[torch.Tensor] = None,
                  segment_chunks: Optional[int] = None,
                  fused: Optional[bool] = None,
                  output_state_indices: Optional[torch.Tensor] = None,
                  checkpoint_every: Optional[int] = None,
                  checkpoint_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GDN / KDA chunked prefill (ops.md ``gdn_prefill`` / ``kda_prefill``), pool or dense mode:
    :func:`plan_prefill` then :func:`run_prefill`.

    Args:
        family: ``"gdn"`` (scalar gate per value head) or ``"kda"`` (one gate per key channel).
        q, k: ``[T, H, K]`` fp32/bf16/fp16 (last dim contiguous; token and head strides honoured).
        v: ``[T, HV, V]``, same dtype; value head ``hv`` reads q/k head ``hv // (HV // H)``.
        g: log-space decay, fp32, ``[T, HV]`` (GDN) or ``[T, HV, K]`` (KDA), from the gating op.
        beta: ``[T, HV]`` fp32.
        cu_seqlens: ``[N+1]`` int32/int64, contiguous (the public ops hand it over so, as
            ``state_indices``); zero-length sequences allowed anywhere.
        state_pool: pool mode: ``[P, HV, V, K]`` (``"vk"``) or ``[P, HV, K, V]`` (``"kv"``), fp32 or
            bf16, any slot pitch; row ``state_indices[n]`` is read as h0 and overwritten in place
            with the final state. A negative index is padding: zero output rows, the pool is
            neither read nor written for that sequence (ops.md; torch_ref agrees).
        state_indices: ``[N]`` int32/int64 (pool mode), valid and distinct (checked upstream).
        initial_state: dense mode: ``[N, HV, V, K]`` (or ``[N, HV, K, V]`` for ``"kv"``) or None.
        scale: query scale (> 0). use_qk_l2norm: l2-normalise q and k in the kernels.
        state_layout: ``"vk"`` or ``"kv"``; layout: the state kernel's grid (``"split"`` or ``"folded"``).
        caps: device capabilities (default: probed from q's device).
        state_kernel: an alternative implementation of stage 2 (the sequential state kernel), e.g.
            :func:`linattn.kernels.cutedsl.chunk_state.cutedsl_chunk_state`; called with the
            keywords ``kda, k, g, w, u, rk, cu_seqlens, chunk_off, state_indices, h0, ht, hbuf, vn,
            state_layout`` on the same buffers (bf16 path only), plus ``has_initial_state`` and
            ``checkpoint_indices``, ``checkpoint_every`` when given. None: the Triton state kernel.
        has_initial_state: pool mode only: ``[N]`` bool or None. False starts that sequence from a
            zero state: the state kernel's h0 load is masked (the slot is never read, NaN there is
            harmless) and the final state is stored as usual. No extra launch.
        segment_chunks: the segment-parallel state pass (:func:`plan_segments`): None the
            planner's choice, 0 off, ``L >= 1`` segments of ``L`` chunks (tests, sweeps).
        fused: the fused prefill (GDN, KDA) (:func:`plan_fused`): None the planner's choice, True forced
            on, False off (tests, sweeps).
        output_state_indices: pool mode only, ``[N]`` write slots or None: the read rows are first
            copied into the write rows (:func:`forked`) and the prefill runs in place on the write
            slots (docs/ops.md "Separate read and write slots").
        checkpoint_every, checkpoint_indices: pool mode, both or neither (docs/ops.md "State
            checkpoints"; validated upstream): tokens (a multiple of 64) and ``[N, max_checkpoints]``
            int32/int64 slots (-1: none); the state after ``(j + 1) * checkpoint_every`` tokens of
            sequence ``n`` goes to slot ``[n, j]`` from the state loop (:func:`plan_prefill`).
    Returns:
        ``(o, final_state)``: ``o [T, HV, V]`` in q's dtype; ``final_state`` is a new tensor
        ``[N, HV, V, K]`` (layout as ``state_layout``) in ``initial_state``'s dtype (fp32 without
        an initial state) in dense mode, None in pool mode. Dense and pool mode run the same
        instructions, so a dense final state equals the pool row of the same dtype bitwise.
    Raises:
        ValueError: an unsupported head dim or dtype (:func:`prefill_supported`); a pool without
            ``state_indices`` (field case F23).
        linattn.kernels.grid.GridLimitError: the state kernel's grid does not fit the device.
    Source: ops.md "Chunked form" (Yang et al. 2024, WY representation; Yang, Kautz, Hatamizadeh
    2025; Kimi Linear 2025).
    Example:
        >>> T, H, HV, K, V = 100, 1, 2, 64, 64
        >>> q, k = torch.randn(T, H, K), torch.randn(T, H, K); v = torch.randn(T, HV, V)
        >>> g, beta = -torch.rand(T, HV), torch.rand(T, HV)
        >>> o, ht = chunk_prefill("gdn", q=q, k=k, v=v, g=g, beta=beta,
        ...     cu_seqlens=torch.tensor([0, 30, 100]), state_pool=None, state_indices=None,
        ...     initial_state=None, scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk")
    """
    _check_checkpoint_every(checkpoint_indices, checkpoint_every)  # before forked() writes any pool row
    states = forked(dict(state_pool=state_pool, state_indices=state_indices, initial_state=initial_state,
                         has_initial_state=has_initial_state, output_state_indices=output_state_indices))
    del states["output_state_indices"]  # None now: the call runs in place on the write slots
    plan = plan_prefill(family, q=q, v=v, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                        state_layout=state_layout, layout=layout, caps=caps, state_kernel=state_kernel,
                        segment_chunks=segment_chunks, fused=fused, checkpoint_indices=checkpoint_indices, **states)
    return run_prefill(plan, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, scale=scale,
                       checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices, **states)


# -- helpers -----------------------------------------------------------------------------------

def _check_checkpoint_every(checkpoint_indices: Optional[torch.Tensor], checkpoint_every) -> None:
    """With ``checkpoint_indices``, ``checkpoint_every`` must be a positive multiple of :data:`CHUNK`
    (the kernels divide by it in chunks; the op layer's host rules check it too, this guards direct
    callers). Raises ValueError before any launch or pool write."""
    if checkpoint_indices is None:
        return
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, numbers.Integral) \
            or checkpoint_every <= 0 or checkpoint_every % CHUNK:
        raise ValueError(f"checkpoint_every must be a positive multiple of {CHUNK} tokens with checkpoint_indices, "
                         f"got {checkpoint_every!r}")


def chunk_tables(cu_seqlens: torch.Tensor, T: int):
    """Chunk index tables, built on the device with no host sync (torch ops).

    Args:
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of the sequence lengths.
        T: total tokens (``cu_seqlens[-1]``, known from the shapes).
    Returns:
        ``(chunk_off [N+1] int64, chunk_seq [NT_max] int32, chunk_start [NT_max] int64, NT_max)``:
        sequence ``n`` owns chunks ``chunk_off[n] .. chunk_off[n+1]-1``; chunk ``c`` starts at token
        ``chunk_start[c]`` of sequence ``chunk_seq[c]``; entries past the real count hold
        ``chunk_seq = N`` (the kernels skip them). ``NT_max = T // 64 + N`` bounds the count.
    """
    cu = cu_seqlens.to(torch.int64)
    N = cu.numel() - 1
    nck = (cu[1:] - cu[:-1] + CHUNK - 1) // CHUNK
    chunk_off = torch.zeros(N + 1, dtype=torch.int64, device=cu.device)
    torch.cumsum(nck, 0, out=chunk_off[1:])
    nt_max = T // CHUNK + N
    c = torch.arange(nt_max, dtype=torch.int64, device=cu.device)
    seq = torch.searchsorted(chunk_off[1:], c, right=True)  # N for c >= real count
    seq_c = seq.clamp(max=max(N - 1, 0))
    start = cu[seq_c] + CHUNK * (c - chunk_off[seq_c])
    return chunk_off, seq.to(torch.int32), start, nt_max


def _row_major(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _state_strides(x: torch.Tensor, state_layout: str) -> tuple[int, int, int, int]:
    """(slot, head, k, v) element strides of a state tensor in layout ``vk`` or ``kv``."""
    if state_layout == "vk":
        return x.stride(0), x.stride(1), x.stride(3), x.stride(2)
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)
