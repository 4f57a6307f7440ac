"""The walk of the fused GDN prefill in CuTe DSL (issue 27): host side, refusals, compile cache, launcher.

A drop-in for the Triton walk :func:`linattn.kernels.triton.chunk_fused.chunk_gdn_fused_kernel`:
the same inputs (``q, k, v, g`` and the Triton prep kernel's ``tmb, aqk [T, HV, 64]``,
``rk [T, HV]``, ``qs [T, HV, 2]``), the same outputs (``o [T, HV, V]``; the final state in place in
the pool row ``state_pool[state_indices[n]]`` or in the dense final state), the same maths (that
module's docstring; the kernel, :mod:`._fused_walk_kernel`, says how it maps onto the hardware).
Pool mode: a negative slot is padding (zero output rows, the pool neither read nor written);
``has_initial_state`` False a zero ``h0`` whose slot is not read. Dense and pool mode run the same
instructions.

Opt-in only: :func:`linattn.kernels.triton.prefill.launch_fused_stages` runs it in place of the
Triton walk where ``LINATTN_CUTEDSL_WALK`` is set and :func:`walk_refusal` is empty (else the
Triton walk runs, as without the switch). The planner never sets it. Two builds of the same walk
(:data:`MMA_VARIANTS`; the switch's value picks one):

- ``LINATTN_CUTEDSL_WALK=1``: warp-level ``mma.sync`` (:mod:`._fused_walk_kernel`; status below);
- ``LINATTN_CUTEDSL_WALK=wgmma``: warpgroup ``wgmma`` with the state as the register A operand
  and the B operands read from swizzled shared memory (:mod:`._fused_walk_wgmma_kernel`; issue 27).
  Status (2026-12-03): **sm_90a build 202 registers, no local memory, 138 KB of shared
  memory at BV = 128; on the H200 correct (tests/gpu/test_fused_walk_gpu.py, both builds: 22
  passed), its outputs and pool rows bitwise the mma.sync build's, and the walk 1.51x the Triton
  walk at 16 x 4,096 (16, 32) (0.854 against 1.293 ms), 1.18x at 8 x 1,024 (docs/performance.md,
  'The walk on warpgroup MMAs'). Still opt-in: the planner does not pick it yet.**

Scope of this step: GDN, bf16 ``q/k/v`` and prep buffers, ``K = V = 128``, chunk 64, fp32 or bf16
states, no state checkpoints; anything else is refused (:func:`walk_refusal`).

Status of the mma.sync build (2026-12-02): **compiles for sm_90a on the CPU (tests/cutedsl/test_fused_walk.py: 237
registers, no local memory, ~143 KB of shared memory at BV = 128); on the H200 (tree d2ca3fc)
correct (tests/gpu/test_fused_walk_gpu.py 10 passed) and 1.04x the Triton walk at 16 x 4,096
(16, 32), 0.99x at 8 x 1,024 (docs/performance.md, 'The walk in CuTe DSL'), so opt-in.** Tensor cores through warp-level ``mma.sync`` m16n8k16 (as
:mod:`._state_kernel`), not ``wgmma``: the state is the A operand from registers, each warp owning
16 value rows (8 warps at BV = 128, 4 at 64); the next chunk's tiles come by ``cp.async`` issued
by all threads, two stages (no producer warp, no TMA); each warp forms the chunk's gate factors
itself with shuffle scans (``WalkKey.warp_factors``; False: 64 threads, serial sums, one more CTA
barrier per chunk). Correctness against the Triton walk: tests/gpu/test_fused_walk_gpu.py; timing:
benchmarks/fused_walk.py; both through benchmarks/fused_walk_device.sh on the H200.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple, Optional

import torch

from linattn.kernels.triton.limits import G_MIN

from .chunk_state import _cutlass_types, _dt, compile_cached  # the state kernel's dtype names, CuTe types, cache

_LOCK = threading.Lock()
_CACHE: dict = {}
#: the environment switch that runs this walk in place of the Triton one (a key of :data:`MMA_VARIANTS`)
ENV_SWITCH = "LINATTN_CUTEDSL_WALK"
#: the switch's values -> the tensor-core instructions of the build (:attr:`WalkKey.mma`)
MMA_VARIANTS = {"1": "sync", "wgmma": "wgmma"}
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


def variant() -> str:
    """The build the environment asks for: ``"sync"`` (:data:`ENV_SWITCH` ``"1"``), ``"wgmma"``
    (``"wgmma"``), or ``""`` (unset or any other value: the Triton walk)."""
    return MMA_VARIANTS.get(os.environ.get(ENV_SWITCH, ""), "")


def enabled() -> bool:
    """Whether the environment asks for this walk (:data:`ENV_SWITCH` is a key of :data:`MMA_VARIANTS`)."""
    return variant() != ""


def walk_refusal(*, family: str, K: int, V: int, dtype: torch.dtype, buf_dtype: Optional[torch.dtype] = None,
                 g_dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None,
                 checkpoints: bool = False, chunk: int = WALK_CHUNK) -> str:
    """Why the CuTe DSL walk cannot run a call ('' where it can), from host-known facts only.

    Args:
        family: ``"gdn"`` (KDA is not written yet). K, V: head dims (128 only). dtype: ``q/k/v``'s
            (bf16 only). buf_dtype: the prep buffers' (``tmb``, ``aqk``; bf16 only; None: not checked).
        g_dtype: the log decays' (fp32 only, as docs/ops.md's ``gdn_prefill``; None: not checked).
        device: the call's device (None: not checked): CUDA of compute capability 9.x.
        checkpoints: state checkpoints asked for (not supported). chunk: the chunk size (64 only).
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
    if device is not None:
        if device.type != "cuda":
            return f"the CuTe DSL fused walk runs on CUDA GPUs; got device {device}"
        if torch.version.hip is not None:
            return "the CuTe DSL fused walk is NVIDIA's (sm_90a); this is a ROCm build"
        major = torch.cuda.get_device_capability(device)[0]
        if major != 9:
            return f"the CuTe DSL fused walk is built for sm_90a (H100 / H200); this GPU is sm_{major}x"
    from . import importable

    err = importable()
    if err is not None:
        return f"nvidia-cutlass-dsl does not import: {err}"
    return ""


def block_v(V: int) -> int:
    """Value columns per CTA (16 per warp): the whole value dim, as the Triton walk's bf16 config
    (``BV = 128``, 8 warps). Not yet measured for this kernel."""
    return V


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


def cutedsl_fused_walk(*, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, tmb: torch.Tensor,
                       aqk: torch.Tensor, rk: torch.Tensor, qs: torch.Tensor, o: torch.Tensor,
                       cu_seqlens: torch.Tensor, state_indices: Optional[torch.Tensor],
                       has_initial_state: Optional[torch.Tensor], h0: Optional[torch.Tensor], ht: torch.Tensor,
                       s0: tuple, st: tuple, bv: Optional[int] = None, arch: Optional[str] = None,
                       mma: Optional[str] = None) -> None:
    """The fused GDN prefill's walk on an SM90 GPU, in CuTe DSL (module docstring); the arguments of
    :func:`linattn.kernels.triton.chunk_fused.launch_fused` for ``chunk_gdn_fused_kernel``.

    Args:
        q, k: ``[T, H, K]`` bf16; v: ``[T, HV, V]`` bf16 (last dims contiguous; rows whose strides
            are not multiples of 8 elements are copied first). g: ``[T, HV]`` fp32 raw log decays
            (floored at ``G_MIN`` in the kernel).
        tmb, aqk: ``[T, HV, 64]`` bf16, contiguous (the prep kernel's); rk: ``[T, HV]`` fp32;
            qs: ``[T, HV, 2]`` fp32 (contiguous).
        o: ``[T, HV, V]`` bf16, contiguous: written (rows of padding sequences zero).
        cu_seqlens: ``[N+1]`` int32/int64.
        state_indices: pool mode ``[N]`` int32/int64 slots (negative: padding), else None.
        has_initial_state: pool mode ``[N]`` bool/uint8 or None.
        h0: pool mode: the pool (the same tensor as ``ht``); dense: the initial state or None.
        ht: pool mode: the pool (written in place, owned rows only); dense: the final state.
        s0, st: ``(slot, head, k, v)`` element strides of ``h0`` and ``ht`` (zeros for a missing h0).
        bv: value columns per CTA (64 or 128; default :func:`block_v`). arch: the target (default:
            the device's). mma: ``"sync"`` or ``"wgmma"`` (:attr:`WalkKey.mma`; default: the
            switch's :func:`variant`, else ``"sync"``).
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
    mma = mma or variant() or "sync"
    if mma not in MMA_VARIANTS.values():
        raise ValueError(f"cutedsl fused walk: mma {mma!r}; supported: {sorted(MMA_VARIANTS.values())}")
    if max(abs(s0[2]) * K, abs(s0[3]) * V, abs(st[2]) * K, abs(st[3]) * V) >= 2**31:
        raise ValueError("cutedsl fused walk: state strides inside one head exceed 32 bits")
    if N == 0:
        return
    q, k, v = (x if _rows_aligned(x) else x.contiguous() for x in (q, k, v))
    if max(q.stride(0), k.stride(0), v.stride(0)) >= 2**31:
        raise ValueError("cutedsl fused walk: a token stride of q, k or v exceeds 32 bits")
    if has_initial_state is not None:
        has_initial_state = has_initial_state.contiguous().view(torch.uint8)
    if arch is None:
        from . import device_arch
        arch = device_arch(q.device)
    key = WalkKey(K, V, bv, pool, h0 is not None, _dt(ht.dtype), _dt(h0.dtype if h0 is not None else ht.dtype),
                  _dt(state_indices.dtype) if pool else _dt(cu_seqlens.dtype), _dt(cu_seqlens.dtype), arch,
                  has_initial_state is not None, mma=mma)
    sidx = state_indices if pool else cu_seqlens
    mask = has_initial_state if has_initial_state is not None else sidx
    _launch(compile_walk(key), key, (q, k, v, g, tmb, aqk, rk, qs, o, cu_seqlens, sidx, mask,
                                     h0 if h0 is not None else ht, ht), s0, st, N, HV, H)


def _check(*, q, k, v, g, tmb, aqk, rk, qs, o, ht, h0, HV: int, H: int, V: int) -> None:
    """Shapes, dtypes and layouts of the walk's buffers (ValueError naming the first that is wrong)."""
    T = q.shape[0]
    want = {"k": (k, q.shape, torch.bfloat16), "v": (v, (T, HV, V), torch.bfloat16),
            "g": (g, (T, HV), torch.float32), "tmb": (tmb, (T, HV, WALK_CHUNK), torch.bfloat16),
            "aqk": (aqk, (T, HV, WALK_CHUNK), torch.bfloat16), "rk": (rk, (T, HV), torch.float32),
            "qs": (qs, (T, HV, 2), torch.float32), "o": (o, (T, HV, V), torch.bfloat16)}
    for name, (x, shape, dt) in want.items():
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"cutedsl fused walk: {name} has shape {tuple(x.shape)}; expected {tuple(shape)}")
        if x.dtype != dt:
            raise ValueError(f"cutedsl fused walk: {name} must be {dt}, got {x.dtype}")
    if HV % H:
        raise ValueError(f"cutedsl fused walk: HV = {HV} is not a multiple of H = {H} (GVA)")
    for name in ("tmb", "aqk", "rk", "qs", "o"):
        if not want[name][0].is_contiguous():
            raise ValueError(f"cutedsl fused walk: {name} must be contiguous")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"cutedsl fused walk: {name}'s last dim must be contiguous")
    for name, x in (("state", ht), ("initial state", h0 if h0 is not None else ht)):
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"cutedsl fused walk: {name} dtype {x.dtype}; supported: float32, bfloat16")
    devs = {x.device for x in (q, k, v, g, tmb, aqk, rk, qs, o, ht)}
    if len(devs) != 1:
        raise ValueError(f"cutedsl fused walk: tensors on several devices {sorted(map(str, devs))}")


def _launch(fn, key: WalkKey, tensors: tuple, s0: tuple, st: tuple, N: int, HV: int, H: int) -> None:
    """Call the compiled walk on the current stream of ``q``'s device. ``tensors``: ``(q, k, v, g,
    tmb, aqk, rk, qs, o, cu_seqlens, state_indices, has_initial_state, h0, ht)`` (dense mode:
    ``cu_seqlens`` for the indices and the mask, ``ht`` for a missing ``h0``; none of them read)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    q, k, v, g, tmb, aqk, rk, qs, o, cu, sidx, mask, h0t, ht = tensors
    T = _cutlass_types()

    def P(x, dt, align):
        return make_ptr(dt, x.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)

    F32, BF16, I64, I32 = cutlass.Float32, cutlass.BFloat16, cutlass.Int64, cutlass.Int32
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    fn(P(q, BF16, 16), P(k, BF16, 16), P(v, BF16, 16), P(g, F32, 4), P(tmb, BF16, 16), P(aqk, BF16, 16),
       P(rk, F32, 4), P(qs, F32, 4), P(o, BF16, 16), P(cu, T[key.cu_dtype], cu.element_size()),
       P(sidx, T[key.index_dtype], sidx.element_size()), P(mask, cutlass.Uint8, 1),
       P(h0t, T[key.h0_dtype], h0t.element_size()), P(ht, T[key.state_dtype], ht.element_size()),
       I64(q.stride(0)), I64(q.stride(1)), I64(k.stride(0)), I64(k.stride(1)), I64(v.stride(0)), I64(v.stride(1)),
       I64(g.stride(0)), I64(g.stride(1)),
       I64(s0[0]), I64(s0[1]), I32(s0[3]), I32(s0[2]), I64(st[0]), I64(st[1]), I32(st[3]), I32(st[2]),
       I32(N), I32(HV), I32(HV // H), stream)


def run_for_plan(plan, x, b, st) -> bool:
    """Run this walk for a planned fused GDN call in place of the Triton walk, after the prep kernel
    (:func:`linattn.kernels.triton.prefill.launch_fused_stages` calls it where :func:`enabled`).

    Args:
        plan: the call's ``PrefillPlan`` (fused GDN); x, b, st: its ``PrefillInputs``,
            ``PrefillBuffers`` and ``PrefillState``.
    Returns:
        True where it ran; False where :func:`walk_refusal` refuses the call (the caller runs the
        Triton walk: the switch asks, it does not force).
    Raises:
        linattn.kernels.triton.launch.NotReplayable: while launches are being recorded for replay
            (:class:`~linattn.kernels.triton.prefill.PrefillLaunch` records Triton launches only):
            the call is then not replayed, and runs its stages directly each time.
    """
    from linattn.kernels.triton import launch as tl_launch
    from linattn.kernels.triton.chunk_state import state_strides

    why = walk_refusal(family=plan.family, K=plan.K, V=plan.V, dtype=plan.dtype, buf_dtype=b.fused_tmb.dtype,
                       g_dtype=x.g.dtype, device=x.q.device, checkpoints=getattr(st, "checkpoints", None) is not None)
    if why:
        return False
    if getattr(tl_launch._recording, "records", None) is not None:
        raise tl_launch.NotReplayable(f"the CuTe DSL fused walk ({ENV_SWITCH}) is not a Triton launch")
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    cutedsl_fused_walk(q=x.q, k=x.k, v=x.v, g=x.g, tmb=b.fused_tmb, aqk=b.fused_aqk, rk=b.rk, qs=b.fused_qs,
                       o=b.o, cu_seqlens=x.cu_seqlens, state_indices=st.state_indices,
                       has_initial_state=st.has_initial_state if plan.has_init_flags else None, h0=st.h0,
                       ht=st.ht, s0=s0 if st.h0 is not None else (0, 0, 0, 0),
                       st=state_strides(st.ht, plan.state_layout), mma=variant() or "sync")
    return True
