"""The walk of the fused GDN prefill in CuTe DSL (issue 27): host side, refusals, compile cache, launcher.

A drop-in for the Triton walk :func:`linattn.kernels.triton.chunk_fused.chunk_gdn_fused_kernel`:
the same inputs (``q, k, v, g`` and the Triton prep kernel's ``tmb, aqk [T, HV, 64]``,
``rk [T, HV]``, ``qs [T, HV, 2]``), the same outputs (``o [T, HV, V]``; the final state in place in
the pool row ``state_pool[state_indices[n]]`` or in the dense final state), the same maths (that
module's docstring; the kernel, :mod:`._fused_walk_kernel`, says how it maps onto the hardware).
Pool mode: a negative slot is padding (zero output rows, the pool neither read nor written);
``has_initial_state`` False a zero ``h0`` whose slot is not read. Dense and pool mode run the same
instructions.

The planner's default for the fused GDN prefill on SM90 (issue 27): :func:`choose_walk` (through
``prefill.plan_walk``, stored as ``PrefillPlan.fused_walk`` and shown by ``linattn.explain``) picks the
``wgmma`` build where the call is in this walk's scope (:func:`walk_refusal` on the device's
capabilities: GDN, bf16, K = V = 128, chunk 64, no checkpoints, SM90, CuTe DSL importable), at the
value block :func:`walk_block_v` gives (BV 64 where the BV 128 grid leaves SMs idle), else the Triton
walk. :func:`linattn.kernels.triton.prefill.launch_fused_stages` runs it in place of the Triton walk
(:func:`run_for_plan`); it is launched as a :class:`WalkStep`, a
:class:`~linattn.kernels.triton.launch.ReplayStep`, so a recorded prefill (``PrefillLaunch``, the
dispatcher's host fast path) replays the Triton prep and this walk with no Python planning,
bitwise the unrecorded call's results (tests/gpu/test_fused_walk_gpu.py). :data:`ENV_SWITCH`
(``LINATTN_CUTEDSL_WALK``, read when a call is planned; the dispatcher keeps plans per call
signature, ``dispatcher().clear()`` forgets them) overrides: ``0`` / ``triton`` the Triton walk,
``1`` the ``mma.sync`` build, ``wgmma`` the ``wgmma`` build (each where it can run; else the
Triton walk, the reason says why); any other value is refused (``ConfigError``). Two builds of the
same walk (:data:`MMA_VARIANTS`):

- ``LINATTN_CUTEDSL_WALK=1`` (or ``sync``): warp-level ``mma.sync`` (:mod:`._fused_walk_kernel`; status below);
- ``wgmma`` (the default): warpgroup ``wgmma`` with the state as the register A operand
  and the B operands read from swizzled shared memory (:mod:`._fused_walk_wgmma_kernel`; issue 27);
  its outputs and pool rows are bitwise the mma.sync build's (speed: docs/performance.md, 'The walk on
  warpgroup MMAs').

Scope of this step: GDN, bf16 ``q/k/v`` and prep buffers, ``K = V = 128``, chunk 64, fp32 or bf16
states, no state checkpoints; anything else is refused (:func:`walk_refusal`).

The mma.sync build (opt-in: about the Triton walk's speed, docs/performance.md, 'The walk in CuTe DSL'):
tensor cores through warp-level ``mma.sync`` m16n8k16 (as
:mod:`._state_kernel`), not ``wgmma``: the state is the A operand from registers, each warp owning
16 value rows (8 warps at BV = 128, 4 at 64); the next chunk's tiles come by ``cp.async`` issued
by all threads, two stages (no producer warp, no TMA); each warp forms the chunk's gate factors
itself with shuffle scans (``WalkKey.warp_factors``; False: 64 threads, serial sums, one more CTA
barrier per chunk). Correctness against the Triton walk: tests/gpu/test_fused_walk_gpu.py; timing:
benchmarks/fused_walk.py; both through benchmarks/fused_walk_device.sh on the H200.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import sys
import threading
from typing import NamedTuple, Optional

import torch

from linattn.dispatch.env import CUTEDSL_WALK_VALUES
from linattn.dispatch.lru import LRUCache

from linattn.kernels.triton.limits import G_MIN

from .chunk_state import _cutlass_types, _dt, compile_cached  # the state kernel's dtype names, CuTe types, cache

_LOCK = threading.Lock()
_CACHE: dict = {}
#: the environment switch of the walk: unset the planner's choice (:func:`choose_walk`), else a key of
#: :data:`SWITCH_VALUES`; read when a call is planned (``plan_prefill``)
ENV_SWITCH = "LINATTN_CUTEDSL_WALK"
#: the switch's values -> the walk: ``"triton"`` (``chunk_gdn_fused_kernel``), ``"sync"`` / ``"wgmma"``
#: (this walk's builds, :attr:`WalkKey.mma`), ``"fused"`` (prep and walk in one kernel: :mod:`.fused_prefill`)
SWITCH_VALUES = CUTEDSL_WALK_VALUES  # (dispatch/env.py: one table, read by explain too)
#: the switch's values that ask for a CuTe DSL build -> its tensor-core instructions (:attr:`WalkKey.mma`)
MMA_VARIANTS = {"1": "sync", "sync": "sync", "wgmma": "wgmma"}
#: head dims, chunk and operand dtype of this step
WALK_K = WALK_V = 128
WALK_CHUNK = 64


class WalkKey(NamedTuple):
    """Everything that changes the generated code of one walk."""

    K: int
    V: int
    BV: int
    pool: bool
    has_h0: bool
    state_dtype: str  # the written state's dtype (pool, or the dense final state): "float32" | "bfloat16"
    h0_dtype: str  # the read initial state's (the pool's in pool mode)
    index_dtype: str  # state_indices' ("int32" | "int64"; cu_seqlens' in dense mode, unread)
    cu_dtype: str  # cu_seqlens'
    arch: str  # "sm_90a", ...
    has_init: bool = False  # pool mode with has_initial_state [N] (uint8)
    warp_factors: bool = True  # each warp forms the gate factors (shuffle scans); False: 64 threads, serial sums
    mma: str = "sync"  # the tensor-core instructions: "sync" (warp mma.sync) | "wgmma" (warpgroups; warp_factors only)


def switch_value(raw: Optional[str] = None) -> str:
    """The walk :data:`ENV_SWITCH` asks for: ``""`` (unset or empty: the planner's choice),
    ``"triton"``, ``"sync"``, ``"wgmma"`` or ``"fused"`` (``dispatch/env.py``'s ``cutedsl_walk``, which ``explain``
    reads first).

    Args:
        raw: the switch's text (default: read from the environment; blank is unset, as every
            ``LINATTN_*`` setting, ``dispatch/env.py``).
    Raises:
        linattn.dispatch.env.ConfigError: (a ``ValueError``) a value that is not a key of
            :data:`SWITCH_VALUES`, naming it and the allowed ones (field fault F48's rule).
    """
    from linattn.dispatch.env import cutedsl_walk

    return cutedsl_walk(raw)


def variant() -> str:
    """The CuTe DSL build the environment asks for: ``"sync"`` (:data:`ENV_SWITCH` ``"1"``),
    ``"wgmma"`` (``"wgmma"``), or ``""`` (unset, ``"0"``, ``"triton"``, or a value not allowed)."""
    return MMA_VARIANTS.get(os.environ.get(ENV_SWITCH, ""), "")


def enabled() -> bool:
    """Whether the environment asks for a CuTe DSL build (:func:`variant`); unset, the planner may still
    choose one (:func:`choose_walk`)."""
    return variant() != ""


def walk_refusal(*, family: str, K: int, V: int, dtype: torch.dtype, buf_dtype: Optional[torch.dtype] = None,
                 g_dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None,
                 checkpoints: bool = False, chunk: int = WALK_CHUNK, caps=None) -> str:
    """Why the CuTe DSL walk cannot run a call ('' where it can), from host-known facts only.

    Args:
        family: ``"gdn"`` (KDA is not written yet). K, V: head dims (128 only). dtype: ``q/k/v``'s
            (bf16 only). buf_dtype: the prep buffers' (``tmb``, ``aqk``; bf16 only; None: not checked).
        g_dtype: the log decays' (fp32 only, as docs/ops.md's ``gdn_prefill``; None: not checked).
        device: the call's device (None: not checked): CUDA of compute capability 9.x.
        checkpoints: state checkpoints asked for (not supported). chunk: the chunk size (64 only).
        caps: the device as :class:`linattn.capabilities.DeviceCapabilities` (None: not checked), for
            the planner, which has no device to ask: NVIDIA CUDA of compute capability 9.x with
            nvidia-cutlass-dsl in its toolchain.
    Example:
        >>> walk_refusal(family="kda", K=128, V=128, dtype=torch.bfloat16)
        "the CuTe DSL fused walk is GDN's; got family 'kda'"
    """
    if family != "gdn":
        return f"the CuTe DSL fused walk is GDN's; got family {family!r}"
    if (K, V) != (WALK_K, WALK_V):
        return f"the CuTe DSL fused walk is built for K = V = {WALK_K}; got K = {K}, V = {V}"
    if dtype != torch.bfloat16:
        return f"the CuTe DSL fused walk takes bf16 q/k/v; got {str(dtype).removeprefix('torch.')}"
    if buf_dtype is not None and buf_dtype != torch.bfloat16:
        return f"the CuTe DSL fused walk takes bf16 prep buffers; got {str(buf_dtype).removeprefix('torch.')}"
    if g_dtype is not None and g_dtype != torch.float32:
        return f"the CuTe DSL fused walk reads fp32 gates g; got {str(g_dtype).removeprefix('torch.')}"
    if chunk != WALK_CHUNK:
        return f"the CuTe DSL fused walk walks chunks of {WALK_CHUNK} rows; got {chunk}"
    if checkpoints:
        return "the CuTe DSL fused walk does not store state checkpoints (the Triton walk does)"
    from . import sm90_refusal

    return sm90_refusal(device, "the CuTe DSL fused walk", caps)


def block_v(V: int) -> int:
    """Value columns per CTA of the ``mma.sync`` build (16 per warp): the whole value dim, as the
    Triton walk's bf16 config (``BV = 128``, 8 warps; BV 64 is slower: docs/performance.md, 'The walk in
    CuTe DSL')."""
    return V


#: the ``wgmma`` build takes BV 64 where its grid at BV 128 (``N x HV x V / 128`` CTAs, one per SM at
#: 141 KB of shared memory) holds fewer CTAs than the GPU has SMs. Measured on the H200 (docs/performance.md,
#: 'The walk on warpgroup MMAs'): 8 CTAs (1 x 65,536 (2, 8)) BV 64 2.142 against 3.271 ms; 256 CTAs
#: (8 x 1,024 (16, 32)) BV 128 0.150 against 0.157 ms, and BV 128 ahead at every larger grid measured
WGMMA_BV64_BELOW_SMS = 1.0


def walk_block_v(mma: str, N: int, HV: int, V: int, sm_count: int) -> int:
    """The value block the planner gives a build: ``mma.sync`` :func:`block_v`; ``wgmma`` 64 where
    ``N * HV * V / 128 < WGMMA_BV64_BELOW_SMS * sm_count`` (the BV 128 grid leaves SMs idle), else 128.

    Example:
        >>> walk_block_v("wgmma", 1, 8, 128, 132), walk_block_v("wgmma", 8, 32, 128, 132)
        (64, 128)
    """
    if mma != "wgmma" or V % 128:
        return block_v(V)
    return 64 if N * HV * (V // 128) < WGMMA_BV64_BELOW_SMS * sm_count else 128


class WalkChoice(NamedTuple):
    """The planner's walk for a fused GDN call (``PrefillPlan.fused_walk``): ``walk`` ``"triton"``
    (``chunk_gdn_fused_kernel``), ``"sync"`` or ``"wgmma"`` (this walk's builds); ``block_v`` the
    CuTe DSL build's value columns per CTA (0 for the Triton walk: its ``FusedConfig``'s); ``reason``
    why (``linattn.explain`` shows it)."""

    walk: str
    block_v: int
    reason: str


def choose_walk(*, family: str, K: int, V: int, dtype: torch.dtype, caps, N: int, HV: int,
                checkpoints: bool = False, buf_dtype: Optional[torch.dtype] = None, switch: str = "",
                cute_prep: bool = True) -> WalkChoice:
    """The walk of a fused prefill call, from host-known facts: the ``wgmma`` build where the call is
    in its scope (:func:`walk_refusal` on ``caps``: GDN, bf16, K = V = 128, chunk 64, no
    checkpoints, SM90 with CuTe DSL importable), else the Triton walk; ``switch``
    (:func:`switch_value`) overrides: ``"triton"`` the Triton walk, ``"sync"`` / ``"wgmma"`` that
    build where it can run (else the Triton walk, the reason says why).

    Why the ``wgmma`` build by default: on the H200 it is 1.44-1.54x the Triton walk where the grid
    fills the SMs (16 x 4,096, 4 x 8,192, 64 x 1,024 at (16, 32) / (16, 64)), 1.18x at 8 x 1,024,
    2.1x at BV 64 at 1 x 65,536 (2, 8); its results 3e-5 from the Triton walk's (docs/performance.md,
    'The walk on warpgroup MMAs'). Its value block: :func:`walk_block_v`.

    Args:
        family, K, V, dtype: the call's. caps: the device (:class:`linattn.capabilities.DeviceCapabilities`).
        N, HV: sequences and value heads (the grid). checkpoints: state checkpoints asked for.
        buf_dtype: the prep buffers' dtype (None: not checked; the interpreter's are fp32).
        switch: :func:`switch_value` (``""``: the planner's choice).
        cute_prep: the plan runs the CuTe DSL prep (``fused_prep.choose_prep``); ``"fused"`` (the one kernel,
            which holds that prep) becomes the ``wgmma`` walk where it does not (``LINATTN_CUTEDSL_PREP=0``).
    Example:
        >>> from linattn.capabilities import profile
        >>> choose_walk(family="gdn", K=128, V=128, dtype=torch.float32, caps=profile("sm90"), N=16, HV=32).walk
        'triton'
    """
    if switch == "triton":
        return WalkChoice("triton", 0, f"the Triton walk ({ENV_SWITCH} forces it)")
    why = walk_refusal(family=family, K=K, V=V, dtype=dtype, buf_dtype=buf_dtype, checkpoints=checkpoints, caps=caps)
    if why:
        asked = f"{ENV_SWITCH} asks for the CuTe DSL walk, but " if switch else ""
        return WalkChoice("triton", 0, f"the Triton walk ({asked}{why})")
    if switch == "fused":  # block_v: the wgmma walk's, where the call's tensors send it to the two kernels
        bv = walk_block_v("wgmma", N, HV, V, caps.sm_count)
        if not cute_prep:
            return WalkChoice("wgmma", bv, f"the CuTe DSL walk on warpgroup MMAs (wgmma), BV {bv}: {ENV_SWITCH}=fused "
                              "asks for the one-kernel prefill, which holds the CuTe DSL prep, but LINATTN_CUTEDSL_PREP "
                              "keeps the Triton prep, so the two kernels run")
        return WalkChoice("fused", bv, f"the CuTe DSL one-kernel prefill: prep and wgmma walk in one kernel, no per-chunk "
                          f"buffers in HBM ({ENV_SWITCH} forces it; kernels/cutedsl/fused_prefill.py)")
    mma = switch or "wgmma"
    bv = walk_block_v(mma, N, HV, V, caps.sm_count)
    if switch:
        build = ("on warpgroup MMAs (wgmma), the planner's build" if mma == "wgmma" else
                 "on warp mma.sync (sync), a build the planner never picks")
        return WalkChoice(mma, bv, f"the CuTe DSL walk {build}, BV {bv} ({ENV_SWITCH} forces it)")
    ctas = N * HV * (V // 128)
    if bv == 64:
        why = (f"{ctas} CTAs at BV 128 < {caps.sm_count} SMs: BV 64 doubles them (2.1x the Triton walk at 8 CTAs, "
               "1 x 65,536 (2, 8), H200)")
    else:
        why = f"{ctas} CTAs at BV 128 >= {caps.sm_count} SMs: 1.2-1.5x the Triton walk on the H200"
    return WalkChoice(mma, bv, f"the CuTe DSL walk on warpgroup MMAs (wgmma), BV {bv} ({why}; {ENV_SWITCH}=0 keeps "
                      "the Triton walk)")


def _dummy_args(key: WalkKey):
    """Arguments with the right types for compiling without a GPU (values are never read)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    T = _cutlass_types()

    def P(dt, align):
        return make_ptr(dt, 1 << 20, cute.AddressSpace.gmem, assumed_align=align)

    st, s0, cu, ix = T[key.state_dtype], T[key.h0_dtype], T[key.cu_dtype], T[key.index_dtype]
    bf, f32 = cutlass.BFloat16, cutlass.Float32
    I64, I32 = cutlass.Int64, cutlass.Int32
    return [
        P(bf, 16), P(bf, 16), P(bf, 16), P(f32, 4), P(bf, 16), P(bf, 16), P(f32, 4), P(f32, 4), P(bf, 16),
        P(cu, cu.width // 8), P(ix, ix.width // 8), P(cutlass.Uint8, 1), P(s0, s0.width // 8), P(st, st.width // 8),
        *[I64(8)] * 8, I64(1), I64(1), I32(1), I32(1), I64(1), I64(1), I32(1), I32(1),
        I32(1), I32(1), I32(1), cuda.CUstream(0),
    ]


def compile_walk(key: WalkKey, dump_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the walk for ``key``; works without a GPU.

    Args:
        key: the configuration (:class:`WalkKey`); ``key.arch`` the target (``sm_90a``).
        dump_dir: compile afresh (no cache) and keep the PTX and cubin there.
    Returns:
        the compiled CuTe DSL function (pointers, strides, sizes and a CUDA stream).
    Raises:
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    def kernel():
        if key.mma == "wgmma":
            from ._fused_walk_wgmma_kernel import FusedWalkWgmmaKernel

            return FusedWalkWgmmaKernel(key.K, key.V, key.BV, key.pool, key.has_h0, key.has_init, G_MIN)
        from ._fused_walk_kernel import FusedWalkKernel

        return FusedWalkKernel(key.K, key.V, key.BV, key.pool, key.has_h0, key.has_init, G_MIN, key.warp_factors)

    return compile_cached(_CACHE, _LOCK, key, kernel, lambda: _dummy_args(key), key.arch, dump_dir)


def _rows_aligned(x: torch.Tensor) -> bool:
    """16-byte ``cp.async`` rows: the last dim contiguous, the base and the other strides in 8 elements."""
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a fresh contiguous copy where its rows are not 16-byte aligned (:func:`_rows_aligned`)."""
    return x if _rows_aligned(x) else torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def cutedsl_fused_walk(*, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, tmb: torch.Tensor,
                       aqk: torch.Tensor, rk: torch.Tensor, qs: torch.Tensor, o: torch.Tensor,
                       cu_seqlens: torch.Tensor, state_indices: Optional[torch.Tensor],
                       has_initial_state: Optional[torch.Tensor], h0: Optional[torch.Tensor], ht: torch.Tensor,
                       s0: tuple, st: tuple, bv: Optional[int] = None, arch: Optional[str] = None,
                       mma: Optional[str] = None) -> None:
    """The fused GDN prefill's walk on an SM90 GPU, in CuTe DSL (module docstring); the arguments of
    :func:`linattn.kernels.triton.chunk_fused.launch_fused` for ``chunk_gdn_fused_kernel``. Checks
    the buffers, compiles (or finds) the build and launches it as a :class:`WalkStep` through
    :func:`linattn.kernels.triton.launch.launch_step`, so that a recorded prefill replays it.

    Args:
        q, k: ``[T, H, K]`` bf16; v: ``[T, HV, V]`` bf16 (last dims contiguous; rows whose base or
            strides are not multiples of 8 elements are copied first, on every call). g: ``[T, HV]``
            fp32 raw log decays (floored at ``G_MIN`` in the kernel).
        tmb, aqk: ``[T', HV, 64]`` bf16, contiguous (the prep kernel's; ``T' >= T`` rows, as a
            prefill bucket's workspace holds); rk: ``[T', HV]`` fp32; qs: ``[T', HV, 2]`` fp32 (contiguous).
        o: ``[T', HV, V]`` bf16, contiguous: written (rows of padding sequences zero).
        cu_seqlens: ``[N+1]`` int32/int64.
        state_indices: pool mode ``[N]`` int32/int64 slots (negative: padding), else None.
        has_initial_state: pool mode ``[N]`` bool/uint8 or None (read as bytes; copied if not contiguous).
        h0: pool mode: the pool (the same tensor as ``ht``); dense: the initial state or None.
        ht: pool mode: the pool (written in place, owned rows only); dense: the final state.
        s0, st: ``(slot, head, k, v)`` element strides of ``h0`` and ``ht`` (zeros for a missing h0).
        bv: value columns per CTA (64 or 128; default :func:`block_v`). arch: the target (default:
            the device's). mma: ``"sync"`` or ``"wgmma"`` (:attr:`WalkKey.mma`; default: the
            switch's :func:`variant`, else ``"wgmma"``).
    Raises:
        ValueError: anything :func:`walk_refusal` refuses, or a buffer of the wrong shape, dtype
            or layout; nothing has launched then.
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    T_, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    why = walk_refusal(family="gdn", K=K, V=V, dtype=q.dtype, buf_dtype=tmb.dtype)
    if why:
        raise ValueError(why)
    _check(q=q, k=k, v=v, g=g, tmb=tmb, aqk=aqk, rk=rk, qs=qs, o=o, ht=ht, h0=h0, HV=HV, H=H, V=V)
    pool = state_indices is not None
    if pool and (h0 is None or h0.data_ptr() != ht.data_ptr()):
        raise ValueError("cutedsl fused walk: pool mode needs h0 and ht to be the same pool")
    if has_initial_state is not None and not pool:
        raise ValueError("cutedsl fused walk: has_initial_state is for pool mode")
    bv = block_v(V) if bv is None else bv
    if bv not in (64, 128) or V % bv:
        raise ValueError(f"cutedsl fused walk: bv {bv}; supported: 64, 128 dividing V = {V}")
    mma = mma or variant() or "wgmma"
    if mma not in MMA_VARIANTS.values():
        raise ValueError(f"cutedsl fused walk: mma {mma!r}; supported: {sorted(MMA_VARIANTS.values())}")
    if max(abs(s0[2]) * K, abs(s0[3]) * V, abs(st[2]) * K, abs(st[3]) * V) >= 2**31:
        raise ValueError("cutedsl fused walk: state strides inside one head exceed 32 bits")
    if max((x.stride(0) for x in (q, k, v) if all(s % 8 == 0 for s in x.stride()[:-1])), default=0) >= 2**31:
        raise ValueError("cutedsl fused walk: a token stride of q, k or v exceeds 32 bits")
    if N == 0:
        return
    if arch is None:
        from . import device_arch
        arch = device_arch(q.device)
    fields, states = state_args(cu_seqlens, state_indices, has_initial_state, h0, ht)
    key = WalkKey(K, V, bv, **fields, arch=arch, mma=mma)
    from linattn.kernels.triton.launch import launch_step

    launch_step(cached_step(WalkStep, compile_walk, key, q.device, s0, st, N, HV, H),
                (q, k, v, g, tmb, aqk, rk, qs, o) + states)


def state_args(cu_seqlens: torch.Tensor, state_indices: Optional[torch.Tensor],
               has_initial_state: Optional[torch.Tensor], h0: Optional[torch.Tensor], ht: torch.Tensor) -> tuple:
    """What a CuTe DSL launch that reads and writes states takes from them (the walk's, and the one-kernel
    prefill's :mod:`.fused_prefill`): ``(fields, tensors)``, the key fields (``pool, has_h0, state_dtype,
    h0_dtype, index_dtype, cu_dtype, has_init``, as :class:`WalkKey` names them) and the pointer arguments
    ``(cu_seqlens, state_indices, has_initial_state, h0, ht)``. Dense mode passes ``cu_seqlens`` for the
    indices and the mask and ``ht`` for a missing ``h0`` (none of them read); a non-contiguous
    ``has_initial_state`` is copied (it is read as bytes)."""
    pool = state_indices is not None
    if has_initial_state is not None and not has_initial_state.is_contiguous():
        has_initial_state = has_initial_state.contiguous()
    sidx = state_indices if pool else cu_seqlens
    fields = dict(pool=pool, has_h0=h0 is not None, state_dtype=_dt(ht.dtype),
                  h0_dtype=_dt((h0 if h0 is not None else ht).dtype), index_dtype=_dt(sidx.dtype),
                  cu_dtype=_dt(cu_seqlens.dtype), has_init=has_initial_state is not None)
    return fields, (cu_seqlens, sidx, has_initial_state if has_initial_state is not None else sidx,
                    h0 if h0 is not None else ht, ht)


def buffers_refusal(kernel: str, T: int, want: dict, exact: tuple) -> str:
    """Why a table of buffers does not fit a call of ``T`` tokens ('' where it does; the first wrong one
    named, ``kernel`` the message's prefix): ``want`` maps a name to ``(tensor, expected shape, dtype)``;
    the buffers named in ``exact`` have exactly ``T`` rows, the others at least ``T`` (a prefill bucket's
    workspace may hold more). Shared by the walk's :func:`_check` and the one-kernel prefill's
    ``fused_prefill.tensor_refusal``."""
    for name, (x, shape, dt) in want.items():
        rows_ok = x.dim() == len(shape) and (x.shape[0] == T if name in exact else x.shape[0] >= T)
        if not rows_ok or tuple(x.shape[1:]) != tuple(shape[1:]):
            more = "" if name in exact else " (or more rows)"
            return f"{kernel}: {name} has shape {tuple(x.shape)}; expected {tuple(shape)}{more}"
        if x.dtype != dt:
            return f"{kernel}: {name} must be {dt}, got {x.dtype}"
    return ""


def state_dtypes_refusal(kernel: str, ht: torch.Tensor, h0: Optional[torch.Tensor]) -> str:
    """Why the written state ``ht`` or the read one ``h0`` has a dtype the CuTe DSL kernels do not take ('' where
    both are fp32 or bf16)."""
    for name, x in (("state", ht), ("initial state", h0 if h0 is not None else ht)):
        if x.dtype not in (torch.float32, torch.bfloat16):
            return f"{kernel}: {name} dtype {x.dtype}; supported: float32, bfloat16"
    return ""


def _check(*, q, k, v, g, tmb, aqk, rk, qs, o, ht, h0, HV: int, H: int, V: int) -> None:
    """Shapes, dtypes and layouts of the walk's buffers (ValueError naming the first that is wrong).
    The prep buffers and ``o`` may hold more token rows than q (a prefill bucket's workspace: the
    walk reads the rows ``cu_seqlens`` names); ``meta`` stand-ins (a recording) are not placed."""
    T = q.shape[0]
    want = {"k": (k, q.shape, torch.bfloat16), "v": (v, (T, HV, V), torch.bfloat16),
            "g": (g, (T, HV), torch.float32), "tmb": (tmb, (T, HV, WALK_CHUNK), torch.bfloat16),
            "aqk": (aqk, (T, HV, WALK_CHUNK), torch.bfloat16), "rk": (rk, (T, HV), torch.float32),
            "qs": (qs, (T, HV, 2), torch.float32), "o": (o, (T, HV, V), torch.bfloat16)}
    why = buffers_refusal("cutedsl fused walk", T, want, exact=("k", "v", "g"))
    if why:
        raise ValueError(why)
    if HV % H:
        raise ValueError(f"cutedsl fused walk: HV = {HV} is not a multiple of H = {H} (GVA)")
    for name in ("tmb", "aqk", "rk", "qs", "o"):
        if not want[name][0].is_contiguous():
            raise ValueError(f"cutedsl fused walk: {name} must be contiguous")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"cutedsl fused walk: {name}'s last dim must be contiguous")
    why = state_dtypes_refusal("cutedsl fused walk", ht, h0)
    if why:
        raise ValueError(why)
    devs = {x.device for x in (q, k, v, g, tmb, aqk, rk, qs, o, ht) if x.device.type != "meta"}
    if len(devs) != 1:
        raise ValueError(f"cutedsl fused walk: tensors on several devices {sorted(map(str, devs))}")


@functools.lru_cache(maxsize=None)
def _runtime():
    """``(make_ptr, gmem, CUstream, Int64, Int32)``, imported once."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr, cute.AddressSpace.gmem, cuda.CUstream, cutlass.Int64, cutlass.Int32


class CuteStep:
    """The host side the CuTe DSL launch steps share (:class:`WalkStep`, and the prep's
    :class:`~linattn.kernels.cutedsl.fused_prep.PrepStep`): a compiled function called with its pointer
    arguments, its Int64 stride arguments, the scalars its call signature fixed (``tail``: per scalar
    its CuTe type, ``Int64`` / ``Int32`` / ``Float32``, and value) and the current stream of the device
    the step was made for.

    ``ptr_types``: per pointer argument its (CuTe type, assumed byte alignment). Where the function is
    CuTe DSL's executor (``generate_execution_args`` and ``run_compiled_program``), each argument is
    one 8-byte cell of a ctypes array whose cell addresses are the C arguments the program reads
    (the layout the executor's own conversion gives these types, checked once per compiled function
    against its conversion of a first call's arguments: :func:`_executor_layout`): a call writes its
    addresses, strides and stream into the cells and runs the program, a few microseconds of host
    time where the executor's own call (CuTe pointers, ``Int64`` objects, its argument conversion)
    takes about 45. A lock holds the cells for one call at a time. A function without those methods
    (a test's stub, another executor), or one whose conversion is not that layout, is called with
    CuTe objects every time.

    Raises:
        ValueError: an address not aligned to its type's assumed alignment (checked on every call,
            as ``make_ptr`` does).
    """

    __slots__ = ("fn", "key", "device", "ptr_types", "tail", "_cells", "_exe_args", "_lock", "_aligns")

    def __init__(self, fn, key, device: torch.device, ptr_types: tuple, tail: tuple):
        self.fn, self.key, self.ptr_types, self.tail = fn, key, ptr_types, tail
        self.device = device.index  # None: the current device when launched
        self._cells = self._exe_args = None  # made at the first call where the executor's layout holds
        self._lock = threading.Lock()
        self._aligns = tuple(al for _, al in ptr_types)

    def launch(self, addrs: tuple, strides: tuple) -> None:
        """Call the compiled function on these addresses (one per :attr:`ptr_types`) and strides."""
        for a, al in zip(addrs, self._aligns):
            if a % al:
                raise ValueError(f"a CuTe DSL pointer argument at {a:#x} is not {al}-byte aligned")
        raw = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice() if self.device is None else self.device)
        cells = self._cells
        if cells is None:
            cells = self._first_call(addrs, strides, raw)
            if cells is None:
                return
        with self._lock:
            cells[:len(addrs) + len(strides)], cells[-1] = (*addrs, *strides), raw
            self.fn.run_compiled_program(self._exe_args)

    def _first_call(self, addrs: tuple, strides: tuple, raw: int):
        """This step's argument cells where :func:`_executor_layout` holds for its compiled function;
        else None, having called the function with CuTe objects."""
        hit = _LAYOUTS.get(id(self.fn))  # the entry holds fn, so its id is not another function's
        ok = hit[1] if hit is not None else _executor_layout(self, len(addrs), len(strides))
        if not ok:
            self.fn(*_cute_args(self.ptr_types, self.tail, addrs, strides, raw))
            return None
        # a 4-byte value in its cell's low bytes (little-endian hosts): an int32 as the int64 of its value,
        # a float32 as the integer of its bits
        tail = tuple(_float_bits(v) if _ctype(t) is ctypes.c_float else v for t, v in self.tail)
        cells = (ctypes.c_int64 * (len(addrs) + len(strides) + len(tail) + 1))(*addrs, *strides, *tail, raw)
        with self._lock:
            if self._cells is None:
                base = ctypes.addressof(cells)
                self._exe_args = [base + 8 * i for i in range(len(cells))]
                self._cells = cells
            return self._cells



#: (step class, key, device, signature) -> step, the 256 used last (the signature holds N and the chunk
#: count, so a serving stream makes new ones often: a miss costs one step, ~10 us, the layout is not rechecked)
_STEPS = LRUCache(256)


def cached_step(cls, compile_fn, key, device: torch.device, *signature):
    """The :class:`CuteStep` ``cls(compile_fn(key), key, device, *signature)``, made once per (class,
    key, device, signature) and kept among the 256 used last: a call on a signature seen before
    reuses its step and the step's argument cells."""
    k = (cls, key, device, signature)
    step = _STEPS.get(k)
    if step is None:
        step = cls(compile_fn(key), key, device, *signature)
        _STEPS.put(k, step)
    return step


def _cute_args(ptr_types: tuple, tail: tuple, addrs: tuple, strides: tuple, raw: int) -> tuple:
    """A step's arguments as CuTe objects (what its executor's own call takes): ``ptr_types`` and ``tail``
    as :class:`CuteStep` holds them, the call's addresses, strides and raw stream handle."""
    make_ptr, gmem, stream, I64, _ = _runtime()
    return (*(make_ptr(dt, a, gmem, assumed_align=al) for a, (dt, al) in zip(addrs, ptr_types)),
            *(I64(x) for x in strides), *(t(v) for t, v in tail), stream(raw))


def _ctype(t):
    """The C type of a CuTe ``Int64`` / ``Int32`` / ``Float32`` argument type."""
    import cutlass

    got = {cutlass.Float32: ctypes.c_float, cutlass.Int64: ctypes.c_int64, cutlass.Int32: ctypes.c_int32}.get(t)
    if got is None:
        raise TypeError(f"a CuTe DSL step's scalar must be Int64, Int32 or Float32, got {t}")
    return got


_LAYOUTS: dict = {}  # id(fn) -> (fn, whether the executor passes one C pointer per argument to its value)


def _float_bits(v: float) -> int:
    """The int32 of a float32's bits (``v`` rounded to float32 as ctypes does: out of range is inf)."""
    return struct.unpack("<i", bytes(ctypes.c_float(v)))[0]


def _executor_layout(step: "CuteStep", n_ptrs: int, n_strides: int) -> bool:
    """Whether ``step.fn`` is CuTe DSL's executor and passes each argument as one C pointer to that
    argument's value, in order, with nothing added: its own conversion (``generate_execution_args``,
    which launches nothing) of made-up arguments, every one a distinct value (aligned fake addresses,
    strides, the tail's types, a stream handle), read back and compared; recorded in ``_LAYOUTS``
    per compiled function. An executor refused is warned about once: the step then takes the
    executor's own call (about 45 us of host a launch)."""
    fn = step.fn
    ok = (sys.byteorder == "little" and callable(getattr(fn, "generate_execution_args", None))
          and callable(getattr(fn, "run_compiled_program", None))
          and not getattr(fn, "total_added_arguments", 0) and getattr(fn, "_pyir_spec", None) is None)
    if ok:
        addrs = tuple(2**20 * (i + 1) for i in range(n_ptrs))  # 1 MiB apart: every alignment holds
        strides = tuple(1000 + i for i in range(n_strides))
        tail = tuple((t, 0.5 + i if _ctype(t) is ctypes.c_float else 100 + i) for i, (t, _) in enumerate(step.tail))
        raw = 0x7E57
        i64 = ctypes.c_int64
        values = (*((i64, a) for a in addrs), *((i64, x) for x in strides), *((_ctype(t), v) for t, v in tail),
                  (i64, raw))
        try:
            args = _cute_args(step.ptr_types, tail, addrs, strides, raw)
            exe_args = fn.generate_execution_args(*args)[0]
            ok = len(exe_args) == len(args) == len(values) and all(isinstance(e, (ctypes.c_void_p, int)) for e in exe_args)
            addr = [int(e.value if isinstance(e, ctypes.c_void_p) else e) for e in exe_args] if ok else []
            ok = ok and all(addr) and all(ct.from_address(a).value == ct(v).value for a, (ct, v) in zip(addr, values))
        except Exception:  # noqa: BLE001 - any failure keeps the executor's own call
            ok = False
    _LAYOUTS[id(fn)] = (fn, ok)
    if not ok and callable(getattr(fn, "generate_execution_args", None)):  # an executor (not a plain callable)
        import warnings

        warnings.warn(f"linattn: CuTe DSL launches of {step.key!r} take the executor's own call (its C argument "
                      "layout is not the one linattn's argument cells write): correct, about 45 us of host a launch "
                      "more", RuntimeWarning, stacklevel=4)
    return ok


class WalkStep(CuteStep):
    """One compiled walk with the arguments its call signature fixes (state strides, ``N``, ``HV``,
    the GVA group), launched on a call's buffers: a
    :class:`~linattn.kernels.triton.launch.ReplayStep`, so a recorded prefill replays it.

    ``args``: ``(q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_initial_state, h0,
    ht)`` (dense mode: ``cu_seqlens`` for the indices and the mask, ``ht`` for a missing ``h0``; none
    of them read). ``q, k, v, g`` are tensors (their token and head strides are read per call, and a
    q, k or v whose rows are not 16-byte aligned is copied first, as :func:`cutedsl_fused_walk` says);
    the others tensors or addresses. Launches on the current stream of the device it was made for.
    """

    __slots__ = ()

    def __init__(self, fn, key: WalkKey, device: torch.device, s0: tuple, st: tuple, N: int, HV: int, H: int):
        import cutlass

        _, _, _, I64, I32 = _runtime()
        T = _cutlass_types()
        F32, BF16 = cutlass.Float32, cutlass.BFloat16
        idx, cu, s0t, stt = T[key.index_dtype], T[key.cu_dtype], T[key.h0_dtype], T[key.state_dtype]
        ptr_types = ((BF16, 16),) * 3 + ((F32, 4), (BF16, 16), (BF16, 16), (F32, 4), (F32, 4), (BF16, 16),
                                         (cu, cu.width // 8), (idx, idx.width // 8), (cutlass.Uint8, 1),
                                         (s0t, s0t.width // 8), (stt, stt.width // 8))
        tail = ((I64, s0[0]), (I64, s0[1]), (I32, s0[3]), (I32, s0[2]), (I64, st[0]), (I64, st[1]), (I32, st[3]),
                (I32, st[2]), (I32, N), (I32, HV), (I32, HV // H))
        super().__init__(fn, key, device, ptr_types, tail)

    def __call__(self, args: tuple) -> None:
        q, k, v, g = _aligned(args[0]), _aligned(args[1]), _aligned(args[2]), args[3]
        addrs = tuple(a if a.__class__ is int else a.data_ptr() for a in (q, k, v, g) + tuple(args[4:]))
        self.launch(addrs, (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *g.stride()[:2]))


def run_for_plan(plan, x, b, st) -> bool:
    """Run the plan's CuTe DSL walk (``plan.fused_walk``, :func:`choose_walk`) for a fused GDN call in
    place of the Triton walk, after the prep kernel (:func:`linattn.kernels.triton.prefill.launch_fused_stages`
    calls it where the plan chose a CuTe DSL build). Under launch recording the walk is recorded as
    a :class:`WalkStep` and replayed with the Triton prep.

    Args:
        plan: the call's ``PrefillPlan`` (fused GDN); x, b, st: its ``PrefillInputs``,
            ``PrefillBuffers`` and ``PrefillState``.
    Returns:
        True where it ran (or was recorded); False where the plan chose the Triton walk, or where
        :func:`walk_refusal` refuses the call's device (a plan made for another device's
        capabilities, e.g. the sm90 profile on the CPU): the caller runs the Triton walk.
    """
    from linattn.kernels.triton.chunk_state import state_strides

    choice = plan.fused_walk
    if choice is None or choice.walk == "triton":
        return False
    why = walk_refusal(family=plan.family, K=plan.K, V=plan.V, dtype=plan.dtype, buf_dtype=b.fused_tmb.dtype,
                       g_dtype=x.g.dtype, device=x.q.device, checkpoints=getattr(st, "checkpoints", None) is not None)
    if why:
        return False
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    mma = "wgmma" if choice.walk == "fused" else choice.walk  # the one-kernel prefill refused the call's tensors
    cutedsl_fused_walk(q=x.q, k=x.k, v=x.v, g=x.g, tmb=b.fused_tmb, aqk=b.fused_aqk, rk=b.rk, qs=b.fused_qs,
                       o=b.o, cu_seqlens=x.cu_seqlens, state_indices=st.state_indices,
                       has_initial_state=st.has_initial_state if plan.has_init_flags else None, h0=st.h0,
                       ht=st.ht, s0=s0 if st.h0 is not None else (0, 0, 0, 0),
                       st=state_strides(st.ht, plan.state_layout), bv=choice.block_v, mma=mma)
    return True
