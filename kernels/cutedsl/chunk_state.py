"""Host side of the CuTe DSL chunked-prefill state kernel: compile cache and launcher.

The kernel itself lives in :mod:`._state_kernel` (imported lazily: ``nvidia-cutlass-dsl`` is an
optional dependency, ``linattn[cutedsl]``). :func:`cutedsl_chunk_state` is a drop-in replacement
for the Triton state stage of :func:`linattn.kernels.triton.prefill.chunk_prefill`: same buffers in,
same buffers out (``hbuf``, ``vn`` and the final state, in place in the pool in pool mode).

Compiled kernels are cached per process by everything that changes the generated code
(:class:`KernelKey`): head dims, value block, GDN/KDA, pool/dense, initial state present, pool and
index dtypes, the target arch and whether a ``has_initial_state`` mask is read.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple, Optional

import torch

from linattn.kernels.triton.limits import G_MIN

from . import SUPPORTED_K, SUPPORTED_V

_LOCK = threading.Lock()
_CACHE: dict = {}


class KernelKey(NamedTuple):
    """Everything that changes the generated code of one state kernel."""

    K: int
    V: int
    BV: int
    kda: bool
    pool: bool
    has_h0: bool
    state_dtype: str  # dtype of the written state (pool, or the dense final state): "float32" | "bfloat16"
    h0_dtype: str  # dtype of the read initial state (the pool's in pool mode)
    index_dtype: str  # dtype of state_indices ("int32" | "int64"; "int64" in dense mode)
    cu_dtype: str  # dtype of cu_seqlens
    arch: str  # "sm_90a", "sm_100a", ...
    has_init: bool = False  # pool mode with has_initial_state [N] (uint8): 0 = zero h0, the slot not read
    ckpt_dtype: str = ""  # pool mode with state checkpoints: the slot table's dtype ("int32" | "int64"); "": none


def block_v(V: int, kda: bool = False) -> int:
    """Value columns per CTA (16 per warp): GDN 64 (4 warps); KDA 128 (8 warps: the per-channel key
    decays are computed once per head instead of once per value block). Chosen by measurement:
    docs/performance.md#cutedsl-block-v."""
    if kda and V % 128 == 0:
        return 128
    return 64 if V % 64 == 0 else 32


def _cutlass_types():
    import cutlass
    return {
        "float32": cutlass.Float32, "bfloat16": cutlass.BFloat16,
        "int32": cutlass.Int32, "int64": cutlass.Int64,
    }


def _dummy_args(key: KernelKey):
    """Arguments with the right types for compiling without a GPU (values are never read)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    T = _cutlass_types()

    def P(dt, align):
        return make_ptr(dt, 1 << 20, cute.AddressSpace.gmem, assumed_align=align)

    st, s0, cu, ix = T[key.state_dtype], T[key.h0_dtype], T[key.cu_dtype], T[key.index_dtype]
    return [
        P(cutlass.BFloat16, 16), P(cutlass.Float32, 16 if key.kda else 4), P(cutlass.BFloat16, 16),
        P(cutlass.BFloat16, 16), P(cutlass.Float32, 4), P(cu, cu.width // 8), P(cutlass.Int64, 8),
        P(ix, ix.width // 8), P(s0, s0.width // 8), P(st, st.width // 8), P(cutlass.BFloat16, 16),
        P(cutlass.BFloat16, 16), P(cutlass.Uint8, 1), P(T[key.ckpt_dtype or "int64"], 8 if key.ckpt_dtype != "int32" else 4),
        *[cutlass.Int64(8)] * 4, cutlass.Int64(1), cutlass.Int64(1), cutlass.Int32(1), cutlass.Int32(1),
        cutlass.Int64(1), cutlass.Int64(1), cutlass.Int32(1), cutlass.Int32(1),
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cuda.CUstream(0),
    ]


def compile_state_kernel(key: KernelKey, dump_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the state kernel for ``key``. Works without a GPU.

    Args:
        key: the configuration (:class:`KernelKey`); ``key.arch`` is the target (``sm_90a``, ``sm_100a``).
        dump_dir: if given, compile afresh (no cache) and keep the PTX and cubin there.
    Returns:
        the compiled CuTe DSL function (call it with pointers, strides and a CUDA stream); with
        ``dump_dir``, its ``artifacts.PTX`` / ``artifacts.CUBIN`` name the kept files.
    Raises:
        ImportError: nvidia-cutlass-dsl is not installed.
    Example:
        >>> fn = compile_state_kernel(KernelKey(128, 128, 64, False, True, True, "float32", "float32",
        ...                                     "int32", "int32", "sm_100a"))  # doctest: +SKIP
    """
    def kernel():
        from ._state_kernel import StateKernel

        return StateKernel(key.K, key.V, key.BV, key.kda, key.pool, key.has_h0, key.has_init, bool(key.ckpt_dtype))

    return compile_cached(_CACHE, _LOCK, key, kernel, lambda: _dummy_args(key), key.arch, dump_dir)


def compile_cached(cache: dict, lock, key, kernel, args, arch: str, dump_dir: Optional[str]):
    """``cute.compile(kernel(), *args(), options="--gpu-arch ARCH")`` once per ``key`` in ``cache``
    (under ``lock``); with ``dump_dir``, compiled afresh (not cached) keeping its PTX and cubin there.
    Shared by the CuTe DSL state kernel and the fused walk (:mod:`.fused_walk`)."""
    if dump_dir is None:
        with lock:
            fn = cache.get(key)
            if fn is not None:
                return fn
    import cutlass.cute as cute

    opts = f"--gpu-arch {arch}"
    if dump_dir is not None:
        os.makedirs(dump_dir, exist_ok=True)
        return cute.compile(kernel(), *args(), options=f"{opts} --keep-ptx --keep-cubin --dump-dir {dump_dir}")
    fn = cute.compile(kernel(), *args(), options=opts)
    with lock:
        cache.setdefault(key, fn)
        return cache[key]


def cache_info() -> list[KernelKey]:
    """Keys of the kernels compiled so far in this process."""
    with _LOCK:
        return list(_CACHE)


def _dt(x: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64"}[x]


def _aligned(x: torch.Tensor, elems: int, strides: tuple[int, ...]) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % elems == 0 for s in strides)


def _state_strides(x: torch.Tensor, state_layout: str) -> tuple[int, int, int, int]:
    """(slot, head, v, k) element strides of a state tensor in layout ``vk`` or ``kv``."""
    if state_layout == "vk":
        return x.stride(0), x.stride(1), x.stride(2), x.stride(3)
    return x.stride(0), x.stride(1), x.stride(3), x.stride(2)


def cutedsl_chunk_state(*, kda: bool, k: torch.Tensor, g: torch.Tensor, w: torch.Tensor, u: torch.Tensor,
                        rk: torch.Tensor, cu_seqlens: torch.Tensor, chunk_off: torch.Tensor,
                        state_indices: Optional[torch.Tensor], h0: Optional[torch.Tensor], ht: torch.Tensor,
                        hbuf: torch.Tensor, vn: torch.Tensor, state_layout: str, bv: Optional[int] = None,
                        has_initial_state: Optional[torch.Tensor] = None,
                        checkpoint_indices: Optional[torch.Tensor] = None, checkpoint_every: int = 0) -> None:
    """The chunked-prefill state stage on a CUDA GPU (SM90 / SM100), in CuTe DSL.

    Maths: docs/ops.md "Chunked form" (Yang et al., NeurIPS 2024; Yang, Kautz, Hatamizadeh, ICLR 2025;
    Kimi Linear 2025): per sequence, per chunk ``c``: ``hbuf[c] = S``, ``Vn = U - W S``,
    ``S = exp(G_C) S + (K * exp(G_C - G))^T Vn`` (KDA: per key channel).

    Args:
        kda: KDA (per-channel gates) instead of GDN.
        k: ``[T, H, K]`` bf16, raw keys (last dim contiguous); ``rk [T, HV]`` fp32 inverse key norms.
        g: fp32 log decays, ``[T, HV]`` (GDN) or ``[T, HV, K]`` (KDA, last dim contiguous); values
            below ``G_MIN`` (-1000) are floored (on a copy), as every backend floors them.
        w: ``[T, HV, K]`` bf16, contiguous; ``u``: ``[T, HV, V]`` bf16, contiguous.
        cu_seqlens: ``[N+1]`` int32/int64; ``chunk_off``: ``[N+1]`` int64 (first chunk of each sequence).
        state_indices: pool mode: ``[N]`` int32/int64 slots (negative = padding: zero h0, no store);
            None in dense mode.
        h0: pool mode: the pool ``[P, HV, V, K]`` ("vk") or ``[P, HV, K, V]`` ("kv"), fp32 or bf16;
            dense mode: the initial state ``[N, HV, ., .]`` or None (zeros).
        ht: pool mode: the same pool (written in place, valid rows only); dense: final state, fp32.
        hbuf: ``[NT, HV, K, V]`` bf16, written (state entering each chunk).
        vn: ``[T, HV, V]`` bf16, written (corrected values).
        state_layout: ``"vk"`` or ``"kv"``.
        bv: value columns per CTA (32, 64 or 128; default :func:`block_v`), for benchmarks.
        has_initial_state: pool mode only: ``[N]`` bool (or its uint8 view) or None; 0 / False
            starts that sequence from a zero state without reading its slot (the final state is
            stored as usual).
        checkpoint_indices, checkpoint_every: pool mode only, state checkpoints (docs/ops.md "State
            checkpoints"; validated upstream): ``[N, max_checkpoints]`` int32/int64 slots (-1: none) and
            the tokens between them (a multiple of 64); the state after each such chunk is stored in the
            chunk loop (:meth:`._state_kernel.StateKernel.store_checkpoint`).
    Raises:
        ValueError: a dtype, head dim or buffer layout the kernel does not take.
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    T_, H, K = k.shape
    HV, V = u.shape[1], u.shape[2]
    N = cu_seqlens.numel() - 1
    _check_buffers(k, w, u, hbuf, vn, K, V)
    if N == 0:
        return
    pool = state_indices is not None
    has_initial_state, checkpoint_indices = _mode_args(pool, h0, ht, has_initial_state, checkpoint_indices,
                                                       checkpoint_every)
    if not _aligned(k, 8, (k.stride(0), k.stride(1))) or k.stride(2) != 1:
        k = k.contiguous()
    g = g.clamp_min(G_MIN)  # the kernel reads g raw: floored here as the Triton stages floor it on load
    if kda and (not _aligned(g, 4, (g.stride(0), g.stride(1))) or g.stride(2) != 1):
        g = g.contiguous()
    for name, x in (("w", w), ("u", u), ("vn", vn), ("hbuf", hbuf), ("rk", rk)):
        if not x.is_contiguous():
            raise ValueError(f"cutedsl state kernel: {name} must be contiguous")
    s0 = _state_strides(h0, state_layout) if h0 is not None else (0, 0, 0, 0)
    st = _state_strides(ht, state_layout)
    if max(abs(s0[2]) * V, abs(s0[3]) * K, abs(st[2]) * V, abs(st[3]) * K) >= 2**31:
        raise ValueError("cutedsl state kernel: state strides inside one head exceed 32 bits")

    from . import device_arch

    h0_dt = h0.dtype if h0 is not None else ht.dtype
    key = KernelKey(K, V, block_v(V, kda) if bv is None else bv, bool(kda), pool, h0 is not None, _dt(ht.dtype),
                    _dt(h0_dt), _dt(state_indices.dtype) if pool else "int64", _dt(cu_seqlens.dtype),
                    device_arch(k.device), has_initial_state is not None,
                    "" if checkpoint_indices is None else _dt(checkpoint_indices.dtype))
    sidx = state_indices if pool else chunk_off
    ck = (chunk_off, 0, 1) if checkpoint_indices is None else (checkpoint_indices, checkpoint_indices.shape[1],
                                                                checkpoint_every // 64)
    _launch(compile_state_kernel(key), key, (k, g, w, u, rk, cu_seqlens, chunk_off, sidx,
                                             h0 if h0 is not None else ht, ht, hbuf, vn,
                                             has_initial_state if has_initial_state is not None else sidx),
            s0, st, N, HV, H, ck)


def _mode_args(pool: bool, h0, ht, has_initial_state, checkpoint_indices, checkpoint_every: int):
    """Checks the mode-dependent arguments of :func:`cutedsl_chunk_state` (raising its ``ValueError``)
    and returns ``has_initial_state`` as a uint8 view and ``checkpoint_indices`` contiguous (or None)."""
    if has_initial_state is not None and not pool:
        raise ValueError("cutedsl state kernel: has_initial_state is for pool mode")
    if has_initial_state is not None:
        has_initial_state = has_initial_state.contiguous().view(torch.uint8)
    if checkpoint_indices is not None:
        if not pool or checkpoint_every <= 0 or checkpoint_every % 64:
            raise ValueError("cutedsl state kernel: checkpoints need pool mode and checkpoint_every a multiple of 64")
        checkpoint_indices = checkpoint_indices.contiguous()
    if pool and (h0 is None or h0.data_ptr() != ht.data_ptr()):
        raise ValueError("cutedsl state kernel: pool mode needs h0 and ht to be the same pool")
    for name, x in (("state", ht), ("initial state", h0 if h0 is not None else ht)):
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"cutedsl state kernel: {name} dtype {x.dtype}; supported: float32, bfloat16")
    return has_initial_state, checkpoint_indices


def _check_buffers(k, w, u, hbuf, vn, K: int, V: int) -> None:
    """Head dims the kernel is built for, and bf16 key / W / U / hbuf / vn buffers."""
    if K not in SUPPORTED_K or V not in SUPPORTED_V:
        raise ValueError(f"cutedsl state kernel: unsupported head dims K={K}, V={V}; "
                         f"supported: K in {SUPPORTED_K}, V in {SUPPORTED_V}")
    for name, x in (("k", k), ("w", w), ("u", u), ("hbuf", hbuf), ("vn", vn)):
        if x.dtype != torch.bfloat16:
            raise ValueError(f"cutedsl state kernel: {name} must be bfloat16, got {x.dtype}")


def _launch(fn, key: KernelKey, tensors: tuple, s0: tuple, st: tuple, N: int, HV: int, H: int, ck: tuple) -> None:
    """Call the compiled kernel on the current stream of ``k``'s device: pointers, strides, sizes.

    ``tensors`` are ``(k, g, w, u, rk, cu_seqlens, chunk_off, state_indices, h0, ht, hbuf, vn,
    has_initial_state)`` (dense mode: ``chunk_off`` for the indices, ``ht`` for a missing ``h0``,
    and the indices for a missing mask; the kernel reads neither then); ``ck``: the checkpoint table,
    its width and checkpoint_every in chunks (``chunk_off``, 0, 1 without checkpoints: not read).
    """
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    k, g, w, u, rk, cu_seqlens, chunk_off, sidx, h0t, ht, hbuf, vn, mask = tensors
    T = _cutlass_types()

    def P(x, dt, align):
        return make_ptr(dt, x.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)

    F32, BF16, I64, I32 = cutlass.Float32, cutlass.BFloat16, cutlass.Int64, cutlass.Int32
    stream = cuda.CUstream(torch.cuda.current_stream(k.device).cuda_stream)
    fn(P(k, BF16, 16), P(g, F32, 16 if key.kda else 4), P(w, BF16, 16), P(u, BF16, 16), P(rk, F32, 4),
       P(cu_seqlens, T[key.cu_dtype], cu_seqlens.element_size()), P(chunk_off, cutlass.Int64, 8),
       P(sidx, T[key.index_dtype], sidx.element_size()),
       P(h0t, T[key.h0_dtype], h0t.element_size()), P(ht, T[key.state_dtype], ht.element_size()),
       P(hbuf, BF16, 16), P(vn, BF16, 16), P(mask, cutlass.Uint8, 1),
       P(ck[0], T[key.ckpt_dtype or "int64"], ck[0].element_size()),
       I64(k.stride(0)), I64(k.stride(1)), I64(g.stride(0)), I64(g.stride(1)),
       I64(s0[0]), I64(s0[1]), I32(s0[2]), I32(s0[3]), I64(st[0]), I64(st[1]), I32(st[2]), I32(st[3]),
       I32(N), I32(HV), I32(HV // H), I32(ck[1]), I32(ck[2]), stream)
