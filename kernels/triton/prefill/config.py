"""The chunked prefill's pinned launch configuration (:func:`prefill_config`), per shape class.

A frozen :class:`PrefillConfig` of one part per stage (:class:`IntraConfig` with its
:class:`SolveConfig`, :class:`KdaSystemConfig`, :class:`StateConfig`, :class:`OutputConfig`) and
GDN's stage split (:class:`GdnStageSplit`); each part's launch is a :class:`.launch.LaunchOptions`.
Its field names are the names the planner (:mod:`.plan`) and the stage launchers use for the same
thing. :func:`override_config` replaces fields by their paths (a sweep's or a test's override);
:func:`config_on_target` and :func:`dot_precision` translate the dot precisions for the compile target.

Configurations are pinned per shape class (K, V, dtype): nothing is autotuned, so the kernel that
writes the pool runs exactly once per call (ops.md: the pool is advanced exactly once). Why each
pinned value won: docs/performance.md#prefill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import torch

from linattn.capabilities import DeviceCapabilities

from ..launch import LaunchOptions
from ..limits import _PIPELINED_SMEM, _PIPELINED_SMEM_OTHER

__all__ = ["LaunchOptions", "dot_precision", "SolveConfig", "IntraConfig", "KdaSystemConfig", "StateConfig",
           "OutputConfig", "GdnStageSplit", "PrefillConfig", "prefill_config", "override_config", "config_on_target"]


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
    """How GDN's stages split the work (:func:`.plan.stage_options` applies them together):
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


def config_on_target(cfg: PrefillConfig, caps: DeviceCapabilities, interpreted: bool = False) -> PrefillConfig:
    """``cfg`` with its solve's dot precisions translated for ``caps``'s target (:func:`dot_precision`):
    ``cfg`` itself on NVIDIA and in the interpreter."""
    s = cfg.intra.solve
    t = SolveConfig(s.neumann, dot_precision(s.diag_precision, caps, interpreted),
                    dot_precision(s.below_precision, caps, interpreted))
    return cfg if t == s else dataclasses.replace(cfg, intra=dataclasses.replace(cfg.intra, solve=t))
