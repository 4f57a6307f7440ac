"""The one-kernel GDN prefill in CuTe DSL (issue 27): host side, compile cache, launcher.

:mod:`._fused_prefill_kernel` runs the prep (:mod:`.fused_prep`) and the ``wgmma`` walk
(:mod:`.fused_walk`) in one warp-specialized kernel per (sequence, value head): the state-independent
products (``K K^T``, ``Q K^T`` and their gate tiles on the walk warpgroups, the solve on the prep
warpgroup) go from one warpgroup to the other through shared memory, so nothing per chunk
(``Tm diag(beta)``, ``Aqk``, ``rk``, ``qs``) goes to HBM and q, k, v are read once. Its scope is the intersection of the
two kernels': GDN, bf16 q/k/v, fp32 ``g``, fp32 or bf16 ``beta``, ``K = V = 128``, chunk 64, no
state checkpoints, SM90.

Opt-in: ``LINATTN_CUTEDSL_WALK=fused`` makes the planner choose it (``PrefillPlan.fused_walk.walk ==
"fused"``, :func:`linattn.kernels.cutedsl.fused_walk.choose_walk`), and
:func:`linattn.kernels.triton.chunk_fused.launch_fused_stages` runs it in place of the prep and the
walk (:func:`run_for_plan`; where it refuses the call, the two kernels run). It is launched as a
:class:`FusedPrefillStep` (a replay step), so a recorded prefill replays it.

Correctness: tests/gpu/test_fused_prefill_gpu.py; speed and resources: docs/performance.md, 'The
one-kernel prefill'.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import torch

from linattn.kernels.triton.limits import G_MIN

from .chunk_state import _cutlass_types, _dt, compile_cached
from .fused_walk import (CuteStep, _aligned, _rows_aligned, _runtime, buffers_refusal, cached_step, state_args,
                         state_dtypes_refusal, walk_refusal)

_LOCK = threading.Lock()
_CACHE: dict = {}
#: registers a thread of the prep / walk warpgroups (``setmaxnreg``; :attr:`PrefillKey.regs`)
REGS = (112, 192)
#: k and q tiles by TMA (:attr:`PrefillKey.tma`); False: by the prep warpgroup's ``cp.async``, as v. Off: on the
#: H200 the TMA build was no faster (docs/performance.md, the one-kernel prefill's TMA loads)
TMA = False


class PrefillKey(NamedTuple):
    """Everything that changes the generated code of one one-kernel prefill."""

    pool: bool
    has_h0: bool
    state_dtype: str  # the written state's dtype (pool, or the dense final state)
    h0_dtype: str  # the read initial state's
    index_dtype: str  # state_indices' (cu_seqlens' in dense mode, unread)
    cu_dtype: str
    beta_dtype: str  # "float32" | "bfloat16"
    l2norm: bool
    arch: str
    has_init: bool = False
    regs: tuple = REGS
    tma: bool = False  # k and q tiles by TMA (else cp.async)


def fused_refusal(*, family: str, K: int, V: int, dtype: torch.dtype, g_dtype: Optional[torch.dtype] = None,
                  beta_dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None,
                  checkpoints: bool = False, caps=None) -> str:
    """Why the one-kernel prefill cannot run a call ('' where it can): the walk's refusals
    (:func:`linattn.kernels.cutedsl.fused_walk.walk_refusal`) and the prep's gate and beta dtypes."""
    why = walk_refusal(family=family, K=K, V=V, dtype=dtype, g_dtype=g_dtype, device=device,
                       checkpoints=checkpoints, caps=caps)
    if why:
        return why.replace("the CuTe DSL fused walk", "the CuTe DSL one-kernel prefill")
    if beta_dtype is not None and beta_dtype not in (torch.float32, torch.bfloat16):
        return f"the CuTe DSL one-kernel prefill reads fp32 or bf16 beta; got {str(beta_dtype).removeprefix('torch.')}"
    return ""


def _ptr_types(key: PrefillKey) -> tuple:
    """(CuTe type, assumed byte alignment) of the 11 pointer arguments, in the kernel's order:
    ``q, k, v, g, beta, o, cu_seqlens, state_indices, has_initial_state, h0, ht``."""
    import cutlass

    T = _cutlass_types()
    bf, f32 = cutlass.BFloat16, cutlass.Float32
    beta, cu, idx = T[key.beta_dtype], T[key.cu_dtype], T[key.index_dtype]
    s0, st = T[key.h0_dtype], T[key.state_dtype]
    return ((bf, 16), (bf, 16), (bf, 16), (f32, 4), (beta, beta.width // 8), (bf, 16), (cu, cu.width // 8),
            (idx, idx.width // 8), (cutlass.Uint8, 1), (s0, s0.width // 8), (st, st.width // 8))


def _dummy_args(key: PrefillKey):
    """Arguments with the right types for compiling without a GPU (values are never read)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    I64, I32 = cutlass.Int64, cutlass.Int32
    return [*(make_ptr(dt, 1 << 20, cute.AddressSpace.gmem, assumed_align=al) for dt, al in _ptr_types(key)),
            *[I64(8)] * 10, I64(64), I64(1), I64(1), I32(1), I32(1), I64(1), I64(1), I32(1), I32(1),
            I32(1), I32(1), I32(1), cutlass.Float32(1.0), cuda.CUstream(0)]


def compile_fused_prefill(key: PrefillKey, dump_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the one-kernel prefill for ``key``; works without a GPU.

    Args:
        key: the configuration (:class:`PrefillKey`); ``key.arch`` the target (``sm_90a``).
        dump_dir: compile afresh (no cache) and keep the PTX and cubin there.
    Raises:
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    def kernel():
        from ._fused_prefill_kernel import FusedPrefillKernel

        return FusedPrefillKernel(128, 128, key.pool, key.has_h0, key.has_init, G_MIN, key.l2norm,
                                  key.beta_dtype == "bfloat16", tuple(key.regs), key.tma)

    return compile_cached(_CACHE, _LOCK, key, kernel, lambda: _dummy_args(key), key.arch, dump_dir)


class FusedPrefillStep(CuteStep):
    """One compiled one-kernel prefill with the arguments its call signature fixes (state strides,
    ``N``, ``HV``, the GVA group, the scale): a :class:`~linattn.kernels.triton.launch.ReplayStep`.

    ``args``: ``(q, k, v, g, beta, o, cu_seqlens, state_indices, has_initial_state, h0, ht)`` (dense
    mode: ``cu_seqlens`` for the indices and the mask, ``ht`` for a missing ``h0``; none of them read).
    ``q, k, v, g, beta`` are tensors (their token and head strides are read per call; q, k or v rows
    not 16-byte aligned are copied first); the others tensors or addresses. The last stride-like argument is
    the token count ``T`` (the TMA build's descriptors; at least 1, a descriptor takes no empty dim).
    """

    __slots__ = ()

    def __init__(self, fn, key: PrefillKey, device: torch.device, s0: tuple, st: tuple, N: int, HV: int, H: int,
                 scale: float):
        import cutlass

        _, _, _, I64, I32 = _runtime()
        tail = ((I64, s0[0]), (I64, s0[1]), (I32, s0[3]), (I32, s0[2]), (I64, st[0]), (I64, st[1]), (I32, st[3]),
                (I32, st[2]), (I32, N), (I32, HV), (I32, HV // H), (cutlass.Float32, float(scale)))
        super().__init__(fn, key, device, _ptr_types(key), tail)

    def __call__(self, args: tuple) -> None:
        q, k, v, g, beta = _aligned(args[0]), _aligned(args[1]), _aligned(args[2]), args[3], args[4]
        addrs = tuple(a if a.__class__ is int else a.data_ptr() for a in (q, k, v, g, beta) + tuple(args[5:]))
        self.launch(addrs, (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *g.stride()[:2], *beta.stride()[:2],
                            max(q.shape[0], 1)))


def tensor_refusal(*, q, k, v, g, beta, o, cu_seqlens, state_indices, has_initial_state, h0, ht, s0: tuple,
                   st: tuple) -> str:
    """Why the one-kernel prefill cannot run these tensors ('' where it can): :func:`fused_refusal` on
    their dtypes, then shapes, dtypes, layouts and devices (the first that is wrong, named). Nothing is
    compiled or launched; :func:`run_for_plan` falls back to the two kernels where this is not empty. Values
    (index ranges and repeats, ``cu_seqlens`` increasing to T) are the public ops' checks, not read here (that
    would synchronise with the GPU)."""
    name = "cutedsl one-kernel prefill"
    for n, x in (("q", q), ("v", v)):
        if x.dim() != 3:
            return f"{name}: {n} must be [T, heads, head dim]; got shape {tuple(x.shape)}"
    T_, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    why = fused_refusal(family="gdn", K=K, V=V, dtype=q.dtype, g_dtype=g.dtype, beta_dtype=beta.dtype)
    if why:
        return why
    want = {"k": (k, q.shape, torch.bfloat16), "v": (v, (T_, HV, V), torch.bfloat16),
            "g": (g, (T_, HV), torch.float32), "beta": (beta, (T_, HV), beta.dtype),
            "o": (o, (T_, HV, V), torch.bfloat16)}
    why = buffers_refusal(name, T_, want, exact=("k", "v", "g", "beta"))
    if why:
        return why
    if not o.is_contiguous():
        return f"{name}: o must be contiguous"
    if HV % H:
        return f"{name}: HV = {HV} is not a multiple of H = {H} (GVA)"
    pool = state_indices is not None
    if pool and (h0 is None or h0.data_ptr() != ht.data_ptr()):
        return f"{name}: pool mode needs h0 and ht to be the same pool"
    if has_initial_state is not None and not pool:
        return f"{name}: has_initial_state is for pool mode"
    if has_initial_state is not None and has_initial_state.dtype not in (torch.bool, torch.uint8):
        return f"{name}: has_initial_state must be bool or uint8, got {has_initial_state.dtype}"
    why = state_dtypes_refusal(name, ht, h0)
    if why:
        return why
    for n, x in (("cu_seqlens", cu_seqlens), ("state_indices", state_indices)):
        if x is not None and x.dtype not in (torch.int32, torch.int64):
            return f"{name}: {n} must be int32 or int64, got {x.dtype}"
    why = _state_shapes(cu_seqlens, state_indices, has_initial_state, h0, ht, HV, K, V)
    if why:
        return f"{name}: {why}"
    if max(abs(s0[2]) * K, abs(s0[3]) * V, abs(st[2]) * K, abs(st[3]) * V) >= 2**31:
        return f"{name}: state strides inside one head exceed 32 bits"
    if max(x.stride(0) if _rows_aligned(x) else x[0].numel() for x in (q, k, v)) * 64 >= 2**31:
        return f"{name}: a chunk of q, k or v spans more than 2**31 elements"
    devs = {x.device for x in (q, k, v, g, beta, o, cu_seqlens, state_indices, has_initial_state, h0, ht)
            if x is not None and x.device.type != "meta"}
    if len(devs) > 1:
        return f"{name}: tensors on several devices {sorted(map(str, devs))}"
    if devs and next(iter(devs)).type != "cuda":
        return f"{name}: runs on CUDA tensors; got {next(iter(devs))}"
    return ""


def _state_shapes(cu_seqlens, state_indices, has_initial_state, h0, ht, HV: int, K: int, V: int) -> str:
    """Why the state tensors' shapes do not fit the call ('' where they do): ``cu_seqlens [N+1]``, pool mode
    ``state_indices [N]``, ``has_initial_state [N]`` and a ``[P, HV, V, K]`` or ``[P, HV, K, V]`` pool;
    dense mode ``ht`` (and ``h0``) ``[>= N, HV, ., .]``."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        return f"cu_seqlens must be [N + 1]; got shape {tuple(cu_seqlens.shape)}"
    N = cu_seqlens.numel() - 1
    for n, x in (("state_indices", state_indices), ("has_initial_state", has_initial_state)):
        if x is not None and (x.dim() != 1 or x.numel() != N):
            return f"{n} must be [N] = [{N}]; got shape {tuple(x.shape)}"
    for n, x in (("ht", ht), ("h0", h0)):
        if x is None:
            continue
        if x.dim() != 4 or x.shape[1] != HV or sorted(x.shape[2:]) != sorted((K, V)):
            return f"{n} must be [rows, HV, V, K] or [rows, HV, K, V] = [.., {HV}, {V}, {K}]; got {tuple(x.shape)}"
        if state_indices is None and x.shape[0] < N:
            return f"{n} has {x.shape[0]} rows for N = {N} sequences"
    return ""


def cutedsl_fused_prefill(*, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          o: torch.Tensor, cu_seqlens: torch.Tensor, state_indices: Optional[torch.Tensor],
                          has_initial_state: Optional[torch.Tensor], h0: Optional[torch.Tensor], ht: torch.Tensor,
                          s0: tuple, st: tuple, scale: float, use_qk_l2norm: bool, arch: Optional[str] = None,
                          regs: Optional[tuple] = None) -> None:
    """The whole GDN prefill (prep and walk) in one kernel on an SM90 GPU (module docstring).

    Args:
        q, k: ``[T, H, K]`` bf16; v: ``[T, HV, V]`` bf16 (last dims contiguous; rows whose base or
            strides are not multiples of 8 elements are copied first). g: ``[T, HV]`` fp32 raw log
            decays (floored at ``G_MIN``); beta: ``[T, HV]`` fp32 or bf16.
        o: ``[T', HV, V]`` bf16, contiguous, ``T' >= T``: written (rows of padding sequences zero).
        cu_seqlens: ``[N+1]`` int32/int64. state_indices: pool mode ``[N]`` int32/int64 (negative:
            padding), else None. has_initial_state: pool mode ``[N]`` bool/uint8 or None.
        h0: pool mode: the pool (the same tensor as ``ht``); dense: the initial state or None.
        ht: pool mode: the pool (written in place, owned rows only); dense: the final state.
        s0, st: ``(slot, head, k, v)`` element strides of ``h0`` and ``ht`` (zeros for a missing h0).
        scale: the query scale. use_qk_l2norm: the q/k l2 norms in the kernel.
        arch: the target (default: the device's). regs: :attr:`PrefillKey.regs` (default :data:`REGS`). The
            k / q loads are :data:`TMA`'s (``cp.async`` unless it is set).
    Raises:
        ValueError: anything :func:`tensor_refusal` refuses (a buffer of the wrong shape, dtype, layout
            or device), or ``regs`` not a register split (:func:`regs_refusal`); nothing has launched then.
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    regs = REGS if regs is None else (tuple(regs) if isinstance(regs, (tuple, list)) else regs)
    why = tensor_refusal(q=q, k=k, v=v, g=g, beta=beta, o=o, cu_seqlens=cu_seqlens, state_indices=state_indices,
                         has_initial_state=has_initial_state, h0=h0, ht=ht, s0=s0, st=st) or regs_refusal(regs)
    if why:
        raise ValueError(why)
    H, HV = q.shape[1], v.shape[1]
    N = cu_seqlens.numel() - 1
    if N == 0:
        return
    if arch is None:
        from . import device_arch
        arch = device_arch(q.device)
    fields, states = state_args(cu_seqlens, state_indices, has_initial_state, h0, ht)
    key = PrefillKey(**fields, beta_dtype=_dt(beta.dtype), l2norm=bool(use_qk_l2norm), arch=arch, regs=regs,
                     tma=TMA)
    from linattn.kernels.triton.launch import launch_step

    launch_step(cached_step(FusedPrefillStep, compile_fused_prefill, key, q.device, s0, st, N, HV, H, scale),
                (q, k, v, g, beta, o) + states)


def regs_refusal(regs: tuple) -> str:
    """Why ``regs`` is not a register split of the one kernel ('' where it is): ``(prep, walk)`` registers a
    thread, ints, multiples of 8 (``setmaxnreg``), at least 24, with ``prep + 2 walk <= 504`` (384 threads share
    64,512 registers)."""
    ok = isinstance(regs, (tuple, list)) and len(regs) == 2 and all(type(r) is int for r in regs)
    if not ok or any(r % 8 or r < 24 for r in regs) or regs[0] + 2 * regs[1] > 504:
        return (f"cutedsl one-kernel prefill: regs {regs!r}: (prep, walk) ints, multiples of 8, at least 24 each, "
                "with prep + 2 walk <= 504")
    return ""


def run_for_plan(plan, x, b, st, scale: float) -> bool:
    """Run the one-kernel prefill for a planned fused GDN call whose walk choice is ``"fused"``, in
    place of the prep and the walk (:func:`linattn.kernels.triton.chunk_fused.launch_fused_stages`).

    Returns:
        True where it ran (or was recorded); False where :func:`fused_refusal` refuses the call's device or
        :func:`cutedsl_fused_prefill` its tensors (:func:`tensor_refusal`, a ValueError raised before anything
        is compiled or launched): the caller runs the prep and the walk. (A plan whose prep is the Triton
        one never asks for this kernel: ``fused_walk.choose_walk``'s ``cute_prep``.)
    """
    from linattn.kernels.triton.chunk_state import state_strides

    if fused_refusal(family=plan.family, K=plan.K, V=plan.V, dtype=plan.dtype, device=x.q.device,
                     checkpoints=getattr(st, "checkpoints", None) is not None):
        return False
    s0 = state_strides(st.h0 if st.h0 is not None else st.ht, plan.state_layout)
    try:  # the wrapper checks the tensors once (tensor_refusal) and raises before any work where it refuses
        cutedsl_fused_prefill(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, o=b.o, cu_seqlens=x.cu_seqlens,
                              state_indices=st.state_indices,
                              has_initial_state=st.has_initial_state if plan.has_init_flags else None, h0=st.h0,
                              ht=st.ht, s0=s0 if st.h0 is not None else (0, 0, 0, 0),
                              st=state_strides(st.ht, plan.state_layout), scale=scale,
                              use_qk_l2norm=plan.use_qk_l2norm)
    except ValueError:
        return False
    return True
