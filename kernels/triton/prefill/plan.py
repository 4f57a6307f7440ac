"""The chunked prefill's planner: :func:`plan_prefill` turns a call's host-known facts into a frozen
:class:`PrefillPlan`.

It reads shapes, dtypes, the device and which optional tensors are given, never a tensor's values
(no device sync): the pinned configuration (:func:`.config.prefill_config`, looked up through
:mod:`.config` at each plan, so an override of it there steers the planner; or ``config=``), the
stage split (:func:`stage_options`), the grids (the state stage's from
:func:`linattn.kernels.grid.plan_grid`), the buffers a call allocates (:class:`BufferSpec`), and two
decisions with their reasons (``explain`` shows them): the segment-parallel state pass
(:func:`plan_segments`) and the fused prefill in place of the stages (:func:`plan_fused`). The
types the stage launchers take (:class:`PrefillInputs`, :class:`PrefillBuffers`,
:class:`PrefillState`) are defined here too; :mod:`.run` runs a plan.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, NamedTuple, Optional

import torch
import triton
import triton.language as tl

from linattn.capabilities import DeviceCapabilities, interpreter_enabled, probe
from linattn.kernels.grid import GridPlan, plan_grid

from .. import limits
from ..chunk_fused import FusedConfig, fused_config, fused_prep_items, fused_refusal
from ..chunk_state import SEGMENT_COMBINE_BLOCK_V, gates_block
from ..chunk_tables import CHUNK
from ..launch import LaunchOptions
from . import config as _config
from .config import PrefillConfig, config_on_target, dot_precision

if TYPE_CHECKING:
    from linattn.kernels.cutedsl.fused_walk import WalkChoice

#: up to this many sequences the chunk tables come from one Triton launch
#: (:func:`.chunk_tables.chunk_tables_triton`), beyond it from :func:`.chunk_tables.chunk_tables` (torch ops;
#: docs/performance.md#prefill-chunk-tables)
TABLES_TRITON_MAX_N = 16384
#: the segment-parallel state pass (ops.md "Segment-parallel state pass"): segments hold at least
#: this many chunks, and the planner aims the rerun at this many programs per SM
#: (docs/performance.md#prefill-segments)
SEGMENT_MIN_CHUNKS = 64
SEGMENT_PROGRAMS_PER_SM = 2
#: the largest key head dim of the segment-parallel pass (the combine's register tile)
SEGMENT_MAX_K = 128


class StageOptions(NamedTuple):
    """How GDN's chunked prefill splits its stages for one call (:func:`stage_options`): the
    :class:`.config.GdnStageSplit` fields as they apply to the call, under the same names."""

    #: stage 3 runs one program per key head (``chunk_output_grouped_kernel``; the call's GVA group
    #: size is in :attr:`.config.OutputConfig.grouped_at`)
    grouped_output: bool
    #: the state loop's gate factors come from ``chunk_gdn_gates_kernel`` (constexpr ``HOIST``)
    gates_kernel: bool
    #: the state stage stores the state entering every second chunk only (``HSTEP = 2``; the grouped
    #: output's ``HALF``)
    every_second_state: bool
    #: stage 1 writes ``Tm diag(beta)`` (``TMOUT``); the state stage forms ``U`` (``UTM``)
    u_in_state: bool


def stage_options(family: str, group: int, cfg: PrefillConfig, replaced_state: bool = False) -> StageOptions:
    """The stage split of a call at GVA group size ``group`` under ``cfg``.

    The options go together as measured (docs/performance.md#prefill-gdn-stage-split): every
    second chunk's state only with the grouped output (the kernel that rebuilds the others) and
    the gates kernel's factors; ``U`` in the state stage only with that. A replacement state kernel
    (``replaced_state``, e.g. cutedsl) takes none of them: it reads ``U`` and ``g`` and writes every
    chunk's state. KDA takes none (it has its own stage split)."""
    gdn = family == "gdn" and not replaced_state
    grouped = family == "gdn" and group in cfg.output.grouped_at
    gates_kernel = gdn and cfg.gdn.gates_kernel
    every_second = gates_kernel and grouped and cfg.gdn.every_second_state
    return StageOptions(grouped_output=grouped, gates_kernel=gates_kernel, every_second_state=every_second,
                        u_in_state=every_second and cfg.gdn.u_in_state)


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
    #: the state stage writes the output (:attr:`.config.StateConfig.writes_output` where it applies: KDA,
    #: no replacement state kernel); no output stage (constexpr ``FUSE_O``)
    state_writes_output: bool = False
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
    #: the fused GDN prefill's walk: the Triton kernel or a CuTe DSL build, its value block and why
    #: (:func:`linattn.kernels.cutedsl.fused_walk.choose_walk`; None where the fused prefill does not run)
    fused_walk: Optional["WalkChoice"] = None
    #: the fused GDN prefill's prep: the CuTe DSL one (True; :func:`linattn.kernels.cutedsl.fused_prep.choose_prep`,
    #: the default where it can run; ``LINATTN_CUTEDSL_PREP=0`` keeps Triton's) or the Triton kernel
    fused_prep: bool = False
    #: the recorded launches of this plan's calls, per signature of their tensors (:func:`run_prefill`:
    #: a :class:`PrefillLaunch`, None where it cannot be replayed, or a mark of a first call); not part
    #: of the plan's value
    launches: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def kda(self) -> bool:
        return self.family == "kda"

    @property
    def replayable(self) -> bool:
        """Its stages make Triton launches and :class:`.launch.ReplayStep` launches (the CuTe DSL
        fused walk) only, so :class:`PrefillLaunch` can record and replay them: a non-empty call
        with the Triton chunk tables (up to :data:`TABLES_TRITON_MAX_N` sequences), one pass of the
        state stage and no replacement state kernel."""
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


class PrefillInputs(NamedTuple):
    """The inputs as the kernels read them (:func:`conform_inputs`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: torch.Tensor


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
        ValueError: as :func:`chunk_prefill` (checked here, before anything is allocated); a
            ``LINATTN_CUTEDSL_WALK`` value not allowed (``ConfigError``), for any call with tokens.
        linattn.kernels.grid.GridLimitError: the state kernel's grid does not fit the device.
    Example:
        >>> plan = plan_prefill("gdn", q=torch.zeros(100, 1, 64), v=torch.zeros(100, 2, 64),
        ...                     cu_seqlens=torch.tensor([0, 30, 100]))
        >>> plan.nt_max, plan.stages.grouped_output, [b.name for b in plan.buffers][:4]
        (3, False, ['o', 'final', 'w', 'u'])
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    why = limits.prefill_supported(family, K, V, q.dtype)
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
    cfg = config if config is not None else _config.prefill_config(family, K, V, q.dtype, _smem_per_block(caps))
    cfg = config_on_target(cfg, caps, interp)
    plan = _plan_stages(facts, cfg, caps, layout, buf_dtype, state_kernel, 0 if checkpoints else segment_chunks)
    if checkpoints:
        plan = dataclasses.replace(plan, segment_reason="state checkpoints: one pass per sequence (each checkpoint "
                                   "is the state of the sequence's own walk after a chunk)")
    return _with_fused(plan, caps, layout, fused, fused_cfg, segment_chunks)


def _smem_per_block(caps: DeviceCapabilities) -> Optional[int]:
    """The shared memory per block :func:`prefill_config` plans for (None on the CPU: assume it holds)."""
    return None if caps.device_type == "cpu" else caps.shared_memory_per_block


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
        ``(fused, reason)``; where not fused, the reason ends with :func:`walk_switch_note`'s (the planner's
        ``fused_reason`` and ``explain``'s prefill part both read it here).
    Raises:
        ValueError: forced on where the fused prefill cannot run (the reason says why); not fused and
            ``LINATTN_CUTEDSL_WALK`` a value not allowed (``ConfigError``).
    Example:
        >>> from linattn.capabilities import profile
        >>> plan_fused(family="gdn", N=16, HV=32, K=128, V=128, dtype=torch.bfloat16, caps=profile("sm90"),
        ...            cfg=fused_config(128, 128, torch.bfloat16))[0]
        True
    """
    on, why = _fused_choice(family, N, HV, K, V, dtype, caps, cfg, replaced_state, forced_segments, forced)
    return on, (why if on else why + walk_switch_note())


def _fused_choice(family: str, N: int, HV: int, K: int, V: int, dtype: torch.dtype, caps: DeviceCapabilities,
                  cfg: FusedConfig, replaced_state: bool, forced_segments: bool,
                  forced: Optional[bool]) -> tuple[bool, str]:
    """:func:`plan_fused`'s choice and reason, without the walk switch's note."""
    why = fused_refusal(family, K, V, dtype, replaced_state=replaced_state, forced_segments=forced_segments)
    if forced is not None:
        if forced and why:
            raise ValueError(f"fused=True: {why}; pass fused=None (the planner's choice) or False")
        return bool(forced), "forced " + ("on" if forced else "off")
    if why:
        return False, why
    if family == "kda" and not FUSED_KDA_DEFAULT:
        return False, ("the fused KDA prefill is not the default until it is measured faster than KDA's pipeline "
                       "on the H200 (prefill.plan.FUSED_KDA_DEFAULT; fused=True forces it)")
    if caps.device_type != "cuda" or caps.vendor != "nvidia" or dtype != torch.bfloat16:
        where = caps.device_type if caps.device_type != "cuda" else f"{caps.vendor} {caps.arch}"
        return False, (f"the fused prefill is chosen where it was measured faster: bf16 on CUDA (H200); here "
                       f"{str(dtype).removeprefix('torch.')} on {where} (fused=True forces it)")
    programs = N * HV * triton.cdiv(V, cfg.block_v)
    if programs < FUSED_MIN_PROGRAMS_PER_SM * caps.sm_count:
        return False, (f"the fused grid's {programs} programs (N x HV x V/{cfg.block_v}) would leave some of the "
                       f"{caps.sm_count} SMs idle for the whole sequence: the pipeline is kept (its segment-parallel "
                       "state pass runs only where the segment plan cuts segments)")
    return True, (f"fused: {programs} programs (N x HV x V/{cfg.block_v}) fill {caps.sm_count} SMs; the state stays "
                  "on chip (no per-chunk states, w, u or new values in memory)")


def plan_walk(family: str, K: int, V: int, dtype: torch.dtype, caps: DeviceCapabilities, N: int, HV: int,
              checkpoints: bool = False, buf_dtype: Optional[torch.dtype] = None, cute_prep: bool = True) -> "WalkChoice":
    """The walk of a fused prefill (:func:`linattn.kernels.cutedsl.fused_walk.choose_walk`, with the
    ``LINATTN_CUTEDSL_WALK`` switch read now): the ``wgmma`` CuTe DSL build for GDN on SM90 where CuTe
    DSL imports and the call is in its scope (``buf_dtype``: the prep buffers', bf16 only; fp32 in the
    interpreter), else the Triton walk; ``cute_prep``: whether the plan runs the CuTe DSL prep (the one-kernel
    prefill holds it). Raises ``ConfigError`` (a ValueError) for a switch value not allowed."""
    from linattn.kernels.cutedsl import fused_walk

    return fused_walk.choose_walk(family=family, K=K, V=V, dtype=dtype, caps=caps, N=N, HV=HV,
                                  checkpoints=checkpoints, buf_dtype=buf_dtype, switch=fused_walk.switch_value(),
                                  cute_prep=cute_prep)


def walk_switch_note() -> str:
    """For a call that runs the pipeline: a note where ``LINATTN_CUTEDSL_WALK`` is set (it picks among the fused
    prefill's builds, so it does nothing here; ``explain`` and the plan's reason say so), else ''. A value not allowed raises
    ``ConfigError`` here too (field fault F48's rule), not only where the fused prefill runs."""
    from linattn.dispatch.env import cutedsl_walk

    raw = os.environ.get("LINATTN_CUTEDSL_WALK", "").strip()
    if not cutedsl_walk(raw):
        return ""
    return (f"; LINATTN_CUTEDSL_WALK={raw} picks among the fused prefill's builds (its walk, or the one kernel): "
            "no effect on this call")


def _plan_prep(plan: PrefillPlan, caps: DeviceCapabilities, cfg: FusedConfig) -> bool:
    """Whether the fused prefill runs the CuTe DSL prep (:func:`linattn.kernels.cutedsl.fused_prep.choose_prep`,
    the ``LINATTN_CUTEDSL_PREP`` switch read now)."""
    from linattn.kernels.cutedsl import fused_prep

    return fused_prep.choose_prep(family=plan.family, K=plan.K, dtype=plan.dtype, caps=caps, buf_dtype=plan.buf_dtype,
                                  shared_keys=cfg.prep_shared_keys)[0]


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
    prep = _plan_prep(plan, caps, cfg)
    walk = plan_walk(plan.family, plan.K, plan.V, plan.dtype, caps, plan.N, HV, plan.checkpoints, plan.buf_dtype, prep)
    return dataclasses.replace(plan, fused=cfg, fused_reason=why, buffers=specs, segment_chunks=0, n_segments=0,
                               fused_walk=walk, fused_prep=prep,
                               segment_grids=None, segment_reason="the fused prefill runs (no state stage)",
                               fused_grid=plan_grid(plan.N, HV, plan.V // cfg.block_v, caps, layout),
                               grids=plan.grids._replace(intra=(progs,)))


def _plan_stages(facts: dict, cfg: PrefillConfig, caps: DeviceCapabilities, layout: str,
                 buf_dtype: torch.dtype, state_kernel: Optional[Callable],
                 segment_chunks: Optional[int] = None) -> PrefillPlan:
    """The stage split, grids and buffers of a non-empty call (:func:`plan_prefill`)."""
    kda, T, N, H, HV, V = facts["family"] == "kda", facts["T"], facts["N"], facts["H"], facts["HV"], facts["V"]
    opt = stage_options(facts["family"], HV // H, cfg, replaced_state=state_kernel is not None)
    writes_output = kda and state_kernel is None and cfg.state.writes_output
    nt_max = T // CHUNK + N
    items = nt_max * HV
    intra_launch, ctas = ((cfg.intra.tm_launch, cfg.intra.tm_ctas_per_sm) if opt.u_in_state
                          else (cfg.intra.launch, cfg.intra.ctas_per_sm))
    progs = max(1, min(items, caps.sm_count * ctas))
    obv = cfg.output.block_v
    grids = PrefillGrids(
        kda_system=(nt_max, HV) if kda else None, intra=(progs,),
        gates=(nt_max, triton.cdiv(HV, gates_block(HV))) if opt.gates_kernel else None,
        state=plan_grid(N, HV, V // cfg.state.block_v, caps, layout),
        output=None if writes_output else (nt_max, H if opt.grouped_output else HV, V // obv))
    bv = cfg.state.block_v
    L, why = plan_segments(N=N, HV=HV, K=facts["K"], V=V, nt_max=nt_max, block_v=bv, caps=caps, even=opt.every_second_state,
                           replaced_state=state_kernel is not None, forced=segment_chunks,
                           fp32=facts["dtype"] == torch.float32)
    nseg = nt_max // L + N if L else 0
    seg_grids = None if not L else SegmentGrids(
        summary=plan_grid(nseg, HV, (V + facts["K"]) // bv, caps, layout),
        combine=plan_grid(N, HV, V // SEGMENT_COMBINE_BLOCK_V, caps, layout),
        rerun=plan_grid(nseg, HV, V // bv, caps, layout))
    return PrefillPlan(
        **facts, empty=False, config=cfg, stages=opt, state_writes_output=writes_output, buf_dtype=buf_dtype,
        DT=tl.bfloat16 if buf_dtype == torch.bfloat16 else tl.float32,
        PREC=_stage_precision(facts["dtype"], "tf32", caps),
        COMBINE_PREC=_stage_precision(facts["dtype"], "tf32x3", caps), nt_max=nt_max,
        triton_tables=N <= TABLES_TRITON_MAX_N, grids=grids, intra_launch=intra_launch,
        state_kernel=state_kernel, segment_chunks=L, n_segments=nseg, segment_reason=why,
        segment_grids=seg_grids,
        buffers=(_output_specs(facts) + _buffer_specs(facts, opt, writes_output, nt_max, progs, buf_dtype)
                 + _segment_specs(facts, nseg)))


def _stage_precision(dtype: torch.dtype, nominal: str, caps: DeviceCapabilities) -> str:
    """A stage's dot precision: ``"ieee"`` for fp32 inputs (ops.md's 1e-5), else ``nominal`` as
    :func:`dot_precision` translates it for the target."""
    return "ieee" if dtype == torch.float32 else dot_precision(nominal, caps, interpreter_enabled())


def _output_specs(facts: dict) -> tuple[BufferSpec, ...]:
    """``o`` and, in dense mode, ``final`` (a new tensor in the initial state's dtype, as torch_ref)."""
    T, N, HV, K, V = (facts[n] for n in ("T", "N", "HV", "K", "V"))
    specs = (BufferSpec("o", (T, HV, V), facts["dtype"]),)
    if not facts["pool_mode"]:
        shape = (N, HV, V, K) if facts["state_layout"] == "vk" else (N, HV, K, V)
        specs += (BufferSpec("final", shape, facts["final_dtype"]),)
    return specs


def _buffer_specs(facts: dict, opt: StageOptions, state_writes_output: bool, nt_max: int, progs: int,
                  bdt: torch.dtype) -> tuple[BufferSpec, ...]:
    """The intermediate buffers of a non-empty call (:class:`PrefillBuffers` says what each holds)."""
    T, HV, K, V = (facts[n] for n in ("T", "HV", "K", "V"))
    f32 = torch.float32
    specs = [BufferSpec("w", (T, HV, K), bdt),
             BufferSpec("tm_beta", (T, HV, CHUNK), bdt) if opt.u_in_state else BufferSpec("u", (T, HV, V), bdt),
             BufferSpec("rk", (T, HV), f32)]
    if facts["family"] == "kda":
        specs += [BufferSpec("kda_a", (nt_max, HV, CHUNK, CHUNK), f32), BufferSpec("kda_aqk", (T, HV, CHUNK), bdt),
                  BufferSpec("kda_kd", (T, HV, K), bdt), BufferSpec("kda_qg", (T, HV, K), bdt),
                  BufferSpec("kda_gl", (nt_max, HV, K), f32)]
    if state_writes_output:  # zero-size: no corrected values or states go through memory (launch_state)
        specs += [BufferSpec("vn", (0,), bdt), BufferSpec("hbuf", (0,), bdt)]
    else:
        specs += [BufferSpec("vn", (T, HV, V), bdt), BufferSpec("hbuf", (nt_max, HV, K, V), bdt)]
    specs.append(BufferSpec("intra_scratch", (progs, 2, CHUNK, CHUNK), f32))
    if opt.gates_kernel:
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
