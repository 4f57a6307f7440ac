"""The prep of the fused GDN prefill in CuTe DSL (issue 27): host side, refusals, compile cache, launcher.

A drop-in for the Triton prep :func:`linattn.kernels.triton.chunk_fused.chunk_gdn_fused_prep_kernel`:
the same inputs (``q, k [T, H, K]``, ``g, beta [T, HV]``, ``cu_seqlens [N+1]``, the chunk tables
``chunk_seq [NT_max]`` int32 and ``chunk_start [NT_max]`` int64, ``scale``, ``use_qk_l2norm``), the
same outputs in the same layouts (``tmb = Tm diag(beta)`` and ``aqk [T, HV, 64]`` bf16, ``rk [T, HV]``
and ``qs [T, HV, 2]`` fp32; rows of a chunk past its sequence not written), so either walk (Triton's
or :mod:`.fused_walk`) consumes them unchanged. The maths is that module's docstring (1); the kernel,
:mod:`._fused_prep_kernel`, says how it maps onto the hardware: one CTA per (chunk, key head), the
norms and ``K K^T``, ``Q K^T`` (warp ``mma.sync``) once for the key head's value heads (GVA), then
per value head the gates, ``Aqk``, ``A`` and the solve ``(I + A)^-1`` (the diagonal 16 x 16 blocks by
forward substitution in fp32 registers, the blocks below them by block doubling on ``mma.sync``: :data:`SOLVE`;
no Neumann product, no scratch in HBM).

The planner's default on SM90: it chooses it (``PrefillPlan.fused_prep``, :func:`choose_prep`) where
:func:`prep_refusal` is empty and ``LINATTN_CUTEDSL_PREP`` is not ``0`` (the switch: ``0`` keeps the
Triton prep, ``1`` asks for this one, as unset does), and
:func:`linattn.kernels.triton.chunk_fused.launch_fused_stages` runs it in place of the Triton prep
(else the Triton prep runs). Scope of this step: GDN, bf16 ``q/k`` and
prep buffers, fp32 ``g``, fp32 or bf16 ``beta``, ``K = 128``, chunk 64; anything else is refused. It is
launched as a :class:`PrepStep` (a replay step, as the walk's), so a recorded prefill replays it; its
prep buffers may hold more token rows than q (a prefill bucket's workspace). The switch is read when a
call is planned, as the walk's (``linattn.dispatcher().clear()`` drops the plans).

Correctness: tests/gpu/test_fused_prep_gpu.py; speed and build resources: docs/performance.md, 'The
prep in CuTe DSL'.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import torch

from linattn.kernels.triton.limits import G_MIN

from .chunk_state import _cutlass_types, _dt, compile_cached
from .fused_walk import CuteStep, _aligned, _rows_aligned, _runtime, cached_step

_LOCK = threading.Lock()
_CACHE: dict = {}
#: the environment switch that runs this prep in place of the Triton one (value "1")
ENV_SWITCH = "LINATTN_CUTEDSL_PREP"
PREP_K = 128
PREP_CHUNK = 64
#: CTAs per SM the build's registers allow (:attr:`PrepKey.min_ctas`; 0: the compiler's choice, slower:
#: docs/performance.md, 'The prep in CuTe DSL')
MIN_CTAS = 3
#: how the prep inverts ``I + A`` (:attr:`PrepKey.solve`): ``"blocks"``, block doubling with the products on
#: mma.sync (the 16 x 16 diagonal blocks by fp32 substitution), or ``"column"``, the whole 64 x 64 block by fp32
#: substitution, a column per thread (docs/performance.md, 'The prep's blockwise solve')
SOLVE = "blocks"
SOLVES = ("blocks", "column")


class PrepKey(NamedTuple):
    """Everything that changes the generated code of one prep."""

    K: int
    l2norm: bool
    beta_dtype: str  # "float32" | "bfloat16"
    cu_dtype: str  # cu_seqlens': "int32" | "int64"
    arch: str  # "sm_90a", ...
    min_ctas: int = 0  # CTAs per SM the registers must allow (FusedPrepKernel.min_ctas; 0: the compiler's)
    solve: str = "blocks"  # the (I + A)^-1 solve: "blocks" (block doubling on mma.sync) | "column" (substitution)


def enabled() -> bool:
    """Whether the environment allows this prep (:data:`ENV_SWITCH`, a switch: ``1`` / ``0``, ``true`` /
    ``false``, ``yes`` / ``no``, ``on`` / ``off``; unset: on, the planner's default).

    Raises:
        linattn.dispatch.env.ConfigError: any other value (``dispatch/env.py``'s rule).
    """
    from linattn.dispatch.env import env_switch

    return env_switch(ENV_SWITCH, default=True)


def prep_refusal(*, family: str, K: int, dtype: torch.dtype, buf_dtype: Optional[torch.dtype] = None,
                 g_dtype: Optional[torch.dtype] = None, beta_dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None, chunk: int = PREP_CHUNK, shared_keys: bool = True,
                 caps=None) -> str:
    """Why the CuTe DSL prep cannot run a call ('' where it can), from host-known facts only.

    Args:
        family: ``"gdn"`` (KDA's prep is not written). K: key head dim (128 only). dtype: ``q/k``'s
            (bf16 only). buf_dtype: the prep buffers' (``tmb``, ``aqk``; bf16 only; None: not checked).
        g_dtype: the log decays' (fp32 only; None: not checked). beta_dtype: fp32 or bf16 (None: not
            checked). device: the call's device (None: not checked): CUDA of compute capability 9.x.
        chunk: the chunk size (64 only). shared_keys: the plan's ``prep_shared_keys`` (this prep's
            items are (chunk, key head) pairs: it writes the same outputs either way, so only a
            plan that asks for the unshared Triton prep by configuration is refused).
        caps: the device as :class:`linattn.capabilities.DeviceCapabilities` (None: not checked), for
            ``linattn.explain`` on a profile.
    """
    name = lambda dt: str(dt).removeprefix("torch.")  # noqa: E731
    if family != "gdn":
        return f"the CuTe DSL fused prep is GDN's; got family {family!r}"
    if K != PREP_K:
        return f"the CuTe DSL fused prep is built for K = {PREP_K}; got K = {K}"
    if dtype != torch.bfloat16:
        return f"the CuTe DSL fused prep takes bf16 q/k; got {name(dtype)}"
    if buf_dtype is not None and buf_dtype != torch.bfloat16:
        return f"the CuTe DSL fused prep writes bf16 prep buffers; got {name(buf_dtype)}"
    if g_dtype is not None and g_dtype != torch.float32:
        return f"the CuTe DSL fused prep reads fp32 gates g; got {name(g_dtype)}"
    if beta_dtype is not None and beta_dtype not in (torch.float32, torch.bfloat16):
        return f"the CuTe DSL fused prep reads fp32 or bf16 beta; got {name(beta_dtype)}"
    if chunk != PREP_CHUNK:
        return f"the CuTe DSL fused prep forms chunks of {PREP_CHUNK} rows; got {chunk}"
    if not shared_keys:
        return "the plan asks for the unshared Triton prep (prep_shared_keys False)"
    from . import sm90_refusal

    return sm90_refusal(device, "the CuTe DSL fused prep", caps)


def choose_prep(*, family: str, K: int, dtype: torch.dtype, caps, buf_dtype: Optional[torch.dtype] = None,
                shared_keys: bool = True) -> tuple[bool, str]:
    """Whether a fused prefill of these facts runs the CuTe DSL prep, and why, as the planner decides it
    (``PrefillPlan.fused_prep``) and ``linattn.explain`` says it: where :func:`prep_refusal` accepts the
    call on ``caps`` and :data:`ENV_SWITCH` is not ``0``; else the Triton prep (KDA's prep is
    Triton's). A launch still checks the call's device and its g / beta dtypes (:func:`run_for_plan`).

    Raises:
        linattn.dispatch.env.ConfigError: a malformed :data:`ENV_SWITCH` (:func:`enabled`).
    """
    if family != "gdn":
        return False, "Triton (KDA's prep is Triton's)"
    if not enabled():
        return False, f"Triton ({ENV_SWITCH}=0 keeps it)"
    why = prep_refusal(family=family, K=K, dtype=dtype, buf_dtype=buf_dtype, shared_keys=shared_keys, caps=caps)
    if why:
        return False, f"Triton (the CuTe DSL prep cannot run it: {why})"
    return True, (f"CuTe DSL (where the call's g is fp32 and beta fp32 or bf16; faster than Triton's on the H200; "
                  f"{ENV_SWITCH}=0 keeps the Triton prep)")


def _ptr_types(key: PrepKey) -> tuple:
    """(CuTe type, assumed byte alignment) of the compiled prep's 11 pointer arguments, in its order
    (``q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs``): the compile's stand-ins
    (:func:`_dummy_args`) and :class:`PrepStep`'s launches take them from here."""
    import cutlass

    T = _cutlass_types()
    bf, f32, I32, I64 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32, cutlass.Int64
    beta, cu = T[key.beta_dtype], T[key.cu_dtype]
    return ((bf, 16), (bf, 16), (f32, 4), (beta, beta.width // 8), (cu, cu.width // 8), (I32, 4), (I64, 8),
            (bf, 16), (bf, 16), (f32, 4), (f32, 4))


def _dummy_args(key: PrepKey):
    """Arguments with the right types for compiling without a GPU (values are never read)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    I64, I32 = cutlass.Int64, cutlass.Int32
    return [*(make_ptr(dt, 1 << 20, cute.AddressSpace.gmem, assumed_align=al) for dt, al in _ptr_types(key)),
            *[I64(8)] * 8, I32(1), I32(1), I32(1), I32(1), cutlass.Float32(1.0), cuda.CUstream(0)]


def compile_prep(key: PrepKey, dump_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the prep for ``key``; works without a GPU.

    Args:
        key: the configuration (:class:`PrepKey`); ``key.arch`` the target (``sm_90a``).
        dump_dir: compile afresh (no cache) and keep the PTX and cubin there.
    Returns:
        the compiled CuTe DSL function (pointers, strides, sizes, scale and a CUDA stream).
    Raises:
        ValueError: ``key.solve`` is not ``"blocks"`` or ``"column"``.
        ImportError: nvidia-cutlass-dsl is not installed.
    """
    if key.solve not in SOLVES:
        raise ValueError(f"PrepKey.solve must be one of {SOLVES}, got {key.solve!r}")

    def kernel():
        from ._fused_prep_kernel import FusedPrepKernel

        return FusedPrepKernel(key.K, key.l2norm, key.beta_dtype == "bfloat16", G_MIN, key.min_ctas, key.solve)

    return compile_cached(_CACHE, _LOCK, key, kernel, lambda: _dummy_args(key), key.arch, dump_dir)


def cutedsl_fused_prep(*, q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       cu_seqlens: torch.Tensor, chunk_seq: torch.Tensor, chunk_start: torch.Tensor,
                       tmb: torch.Tensor, aqk: torch.Tensor, rk: torch.Tensor, qs: torch.Tensor, scale: float,
                       use_qk_l2norm: bool, arch: Optional[str] = None) -> None:
    """The fused GDN prefill's prep on an SM90 GPU, in CuTe DSL (module docstring).

    Args:
        q, k: ``[T, H, K]`` bf16 (last dim contiguous; rows whose strides are not multiples of 8
            elements are copied first). g: ``[T, HV]`` fp32 raw log decays (floored at ``G_MIN`` in
            the kernel). beta: ``[T, HV]`` fp32 or bf16.
        cu_seqlens: ``[N+1]`` int32/int64. chunk_seq: ``[NT_max]`` int32, chunk_start: ``[NT_max]``
            int64 (:func:`linattn.kernels.triton.chunk_tables.chunk_tables_triton`).
        tmb, aqk: ``[T', HV, 64]`` bf16, contiguous: written (rows of each chunk inside its sequence).
        rk: ``[T', HV]`` fp32; qs: ``[T', HV, 2]`` fp32 (contiguous): written. ``T' >= T`` (a prefill
            bucket's workspace; rows past ``T`` are not written).
        scale: the query scale. use_qk_l2norm: the q/k l2 norms in the kernel.
        arch: the target (default: the device's).
    Raises:
        ValueError: anything :func:`prep_refusal` refuses, or a buffer of the wrong shape, dtype or
            layout; nothing has launched then.
        ImportError: nvidia-cutlass-dsl is not installed.

    Example (on an H200)::

        >>> cutedsl_fused_prep(q=q, k=k, g=g, beta=beta, cu_seqlens=cu, chunk_seq=cs, chunk_start=c0,
        ...                    tmb=tmb, aqk=aqk, rk=rk, qs=qs, scale=128 ** -0.5, use_qk_l2norm=True)
    """
    T_, H, K = q.shape
    HV = g.shape[1]
    N = cu_seqlens.numel() - 1
    why = prep_refusal(family="gdn", K=K, dtype=q.dtype, buf_dtype=tmb.dtype, g_dtype=g.dtype,
                       beta_dtype=beta.dtype)
    if why:
        raise ValueError(why)
    want = {"k": (k, q.shape, (torch.bfloat16,)), "g": (g, (T_, HV), (torch.float32,)),
            "beta": (beta, (T_, HV), (torch.float32, torch.bfloat16)),
            "tmb": (tmb, (T_, HV, PREP_CHUNK), (torch.bfloat16,)), "aqk": (aqk, (T_, HV, PREP_CHUNK), (torch.bfloat16,)),
            "rk": (rk, (T_, HV), (torch.float32,)), "qs": (qs, (T_, HV, 2), (torch.float32,))}
    for name, (x, shape, dts) in want.items():
        rows_ok = x.dim() == len(shape) and (x.shape[0] == T_ if name in ("k", "g", "beta") else x.shape[0] >= T_)
        if not rows_ok or tuple(x.shape[1:]) != tuple(shape[1:]):
            more = "" if name in ("k", "g", "beta") else " (or more rows)"
            raise ValueError(f"cutedsl fused prep: {name} has shape {tuple(x.shape)}; expected {tuple(shape)}{more}")
        if x.dtype not in dts:
            raise ValueError(f"cutedsl fused prep: {name} must be {' or '.join(map(str, dts))}, got {x.dtype}")
    for name in ("tmb", "aqk", "rk", "qs"):
        if not want[name][0].is_contiguous():
            raise ValueError(f"cutedsl fused prep: {name} must be contiguous")
    if HV % H:
        raise ValueError(f"cutedsl fused prep: HV = {HV} is not a multiple of H = {H} (GVA)")
    if chunk_seq.dtype != torch.int32 or chunk_start.dtype != torch.int64:
        raise ValueError("cutedsl fused prep: chunk_seq must be int32 and chunk_start int64 (the chunk tables)")
    nt_max = chunk_seq.numel()
    if N == 0 or nt_max == 0 or T_ == 0:
        return
    if max(_aligned_stride(q), _aligned_stride(k)) * PREP_CHUNK >= 2**31:
        raise ValueError("cutedsl fused prep: a chunk of q or k spans more than 2**31 elements")
    if arch is None:
        from . import device_arch
        arch = device_arch(q.device)
    key = PrepKey(K, bool(use_qk_l2norm), _dt(beta.dtype), _dt(cu_seqlens.dtype), arch, MIN_CTAS, SOLVE)
    from linattn.kernels.triton.launch import launch_step

    launch_step(cached_step(PrepStep, compile_prep, key, q.device, N, HV, H, nt_max * H, scale),
                (q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs))


def _aligned_stride(x: torch.Tensor) -> int:
    """The token stride the prep reads ``x`` (q or k) with: its own, or its contiguous copy's where its
    rows are not 16-byte aligned (:class:`PrepStep` copies it then)."""
    return x.stride(0) if _rows_aligned(x) else x[0].numel()


class PrepStep(CuteStep):
    """One compiled prep with the arguments its call signature fixes (``N``, ``HV``, the GVA group,
    the work items, the scale), launched on a call's tensors: a
    :class:`~linattn.kernels.triton.launch.ReplayStep`, so a recorded prefill replays it with the
    walk (:class:`~linattn.kernels.cutedsl.fused_walk.WalkStep`).

    ``args``: ``(q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, tmb, aqk, rk, qs)``. ``q, k, g,
    beta`` are tensors (their token and head strides are read per call; a q or k whose rows are not
    16-byte aligned is copied first); the others tensors or addresses (a replay's workspace).
    Launches on the current stream of the device it was made for.
    """

    __slots__ = ()

    def __init__(self, fn, key: PrepKey, device: torch.device, N: int, HV: int, H: int, items: int, scale: float):
        import cutlass

        I32 = _runtime()[4]
        super().__init__(fn, key, device, _ptr_types(key),
                         ((I32, N), (I32, HV), (I32, HV // H), (I32, items), (cutlass.Float32, float(scale))))

    def __call__(self, args: tuple) -> None:
        q, k, g, beta = _aligned(args[0]), _aligned(args[1]), args[2], args[3]
        addrs = tuple(a if a.__class__ is int else a.data_ptr() for a in (q, k, g, beta) + tuple(args[4:]))
        self.launch(addrs, (*q.stride()[:2], *k.stride()[:2], *g.stride()[:2], *beta.stride()[:2]))


def run_for_plan(plan, x, t, b, scale: float) -> bool:
    """Run this prep for a planned fused GDN call in place of the Triton prep
    (:func:`linattn.kernels.triton.chunk_fused.launch_fused_stages` calls it where the plan chose it:
    ``plan.fused_prep``, :func:`choose_prep`).

    Args:
        plan: the call's ``PrefillPlan`` (fused GDN); x, t, b: its ``PrefillInputs``, ``ChunkTables``
            and ``PrefillBuffers``; scale: the query scale.
    Returns:
        True where it ran (or was recorded, as a :class:`PrepStep`); False where :func:`prep_refusal`
        refuses the call (the caller runs the Triton prep: the switch asks, it does not force).
    """
    why = prep_refusal(family=plan.family, K=plan.K, dtype=plan.dtype, buf_dtype=b.fused_tmb.dtype,
                       g_dtype=x.g.dtype, beta_dtype=x.beta.dtype, device=x.q.device,
                       shared_keys=plan.fused.prep_shared_keys)
    if why:
        return False
    cutedsl_fused_prep(q=x.q, k=x.k, g=x.g, beta=x.beta, cu_seqlens=x.cu_seqlens, chunk_seq=t.chunk_seq,
                       chunk_start=t.chunk_start, tmb=b.fused_tmb, aqk=b.fused_aqk, rk=b.rk, qs=b.fused_qs,
                       scale=scale, use_qk_l2norm=plan.use_qk_l2norm)
    return True
