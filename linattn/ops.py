"""Public ops: validate, choose a backend (explainably), run it.

Each op is also a ``torch.library`` custom op (namespace ``linattn``) with the state pool declared
as mutated and a fake implementation for shapes, so functions calling these ops compile with
``torch.compile(fullgraph=True)``. In eager mode the public functions call the implementation
directly (no extra dispatcher hop); under ``torch.compile`` they go through the custom op.

Maths and shapes: ``ops.md`` (symbols N, T, H, HV, K, V, P as in flash-linear-attention). Sources:
Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (ICLR 2025); the Kimi Linear report (2025).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from linattn.dispatch.selection import select as _select_backend
from linattn.dispatch.validate import validate as _validate


class BackendRunError(RuntimeError):
    """A plugin backend raised while running; it is reported as ``backend_error`` from now on."""


def _device_of(args: dict) -> torch.device:
    for v in args.values():
        if isinstance(v, Tensor):
            return v.device
    return torch.device("cpu")


def _call(op: str, args: dict, backend: Optional[str], validate: bool):
    nargs, signature = _validate(op, args, check_values=validate)
    impl, _decision = _select_backend(op, signature, _device_of(nargs), backend or None)
    if impl.plugin == "linattn-builtin":
        return impl.run(op, **nargs)
    try:
        return impl.run(op, **nargs)
    except Exception as e:  # a plugin's failure is named and remembered, never retried silently
        from linattn.dispatch.registry import get_registry

        get_registry().mark_broken(impl.name, e)
        raise BackendRunError(f"backend {impl.name!r} (plugin {impl.plugin!r}) raised in {op}: "
                              f"{type(e).__name__}: {e}") from e


_compiling = torch.compiler.is_compiling

# -- gating ------------------------------------------------------------------------------------------


def _gdn_gating_impl(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, softplus_beta: float,
                     softplus_threshold: float, backend: str, validate: bool) -> tuple[Tensor, Tensor]:
    return _call("gdn_gating", dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, softplus_beta=softplus_beta,
                                    softplus_threshold=softplus_threshold), backend, validate)


_gdn_gating_op = torch.library.custom_op("linattn::gdn_gating", mutates_args=())(_gdn_gating_impl)


@_gdn_gating_op.register_fake
def _(A_log, a, b, dt_bias, softplus_beta, softplus_threshold, backend, validate):
    return torch.empty_like(a, dtype=torch.float32), torch.empty_like(b, dtype=torch.float32)


def gdn_gating(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, *, softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0, backend: Optional[str] = None, validate: bool = True):
    """GDN gates: ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (ops.md "Gating").

    Args:
        A_log: ``[HV]`` fp32. a, b: ``[..., HV]`` (any float dtype). dt_bias: ``[HV]``.
        softplus_beta, softplus_threshold: softplus parameters (1.0, 20.0).
        backend: force a backend by name. validate: run the value checks.
    Returns:
        ``(g, beta)``: fp32, shapes of ``a`` and ``b``; ``g <= 0`` is a log-space decay.
    Raises:
        ValueError / TypeError: bad shapes, dtypes or devices (before anything runs).
    Example:
        >>> import torch, linattn
        >>> g, beta = linattn.gdn_gating(torch.zeros(4), torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(4))
        >>> round(float(beta[0, 0]), 2)
        0.5
    """
    fn = _gdn_gating_op if _compiling() else _gdn_gating_impl
    return fn(A_log, a, b, dt_bias, softplus_beta, softplus_threshold, backend or "", validate)


def _kda_gating_impl(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, lower_bound: Optional[float],
                     softplus_beta: float, softplus_threshold: float, backend: str,
                     validate: bool) -> tuple[Tensor, Tensor]:
    return _call("kda_gating", dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, lower_bound=lower_bound,
                                    softplus_beta=softplus_beta, softplus_threshold=softplus_threshold),
                 backend, validate)


_kda_gating_op = torch.library.custom_op("linattn::kda_gating", mutates_args=())(_kda_gating_impl)


@_kda_gating_op.register_fake
def _(A_log, a, b, dt_bias, lower_bound, softplus_beta, softplus_threshold, backend, validate):
    return torch.empty_like(a, dtype=torch.float32), torch.empty_like(b, dtype=torch.float32)


def kda_gating(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, *, lower_bound: Optional[float] = None,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0, backend: Optional[str] = None,
               validate: bool = True):
    """KDA gates, one per key channel (ops.md "Gating"; Kimi Linear report).

    Args:
        A_log: ``[HV]`` fp32. a: ``[..., HV, K]``. b: ``[..., HV]``. dt_bias: ``[HV, K]``.
        lower_bound: None for ``g = -exp(A_log) * softplus(a + dt_bias)``; a negative float (e.g.
            -5.0) for the bounded gate ``g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``.
    Returns:
        ``(g [..., HV, K], beta [..., HV])``, fp32.
    Raises:
        ValueError / TypeError: bad inputs.
    Example:
        >>> import torch, linattn
        >>> g, beta = linattn.kda_gating(torch.zeros(2), torch.zeros(3, 2, 8), torch.zeros(3, 2), torch.zeros(2, 8))
        >>> tuple(g.shape)
        (3, 2, 8)
    """
    fn = _kda_gating_op if _compiling() else _kda_gating_impl
    return fn(A_log, a, b, dt_bias, lower_bound, softplus_beta, softplus_threshold, backend or "", validate)


# -- decode ------------------------------------------------------------------------------------------


def _decode_fake(q, v):
    N, T = q.shape[0], q.shape[1]
    return q.new_empty((N, T, v.shape[2], v.shape[3]))


def _gdn_decode_impl(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                   state_pool: Tensor, state_indices: Tensor, scale: Optional[float], use_qk_l2norm: bool,
                   state_layout: str, intermediate_states: Optional[Tensor],
                   intermediate_state_indices: Optional[Tensor], disable_state_update: bool,
                   num_accepted_tokens: Optional[Tensor], softplus_beta: float, softplus_threshold: float,
                   backend: str, validate: bool) -> Tensor:
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool,
                state_indices=state_indices, scale=scale, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                intermediate_states=intermediate_states, intermediate_state_indices=intermediate_state_indices,
                disable_state_update=disable_state_update, num_accepted_tokens=num_accepted_tokens,
                softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    return _call("gdn_decode", args, backend, validate)


_gdn_decode_op = torch.library.custom_op("linattn::gdn_decode",
                                         mutates_args=("state_pool", "intermediate_states"))(_gdn_decode_impl)


@_gdn_decode_op.register_fake
def _(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, *rest):
    return _decode_fake(q, v)


def gdn_decode(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
               state_pool: Tensor, state_indices: Tensor, *, scale: Optional[float] = None,
               use_qk_l2norm: bool = True, state_layout: str = "vk", intermediate_states: Optional[Tensor] = None,
               intermediate_state_indices: Optional[Tensor] = None, disable_state_update: bool = False,
               num_accepted_tokens: Optional[Tensor] = None, softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0, backend: Optional[str] = None, validate: bool = True) -> Tensor:
    """Gated DeltaNet decode over a state pool, in place (ops.md "Ops"; Yang et al., ICLR 2025).

    Args:
        q, k: ``[N, T, H, K]`` bf16/fp16/fp32. v: ``[N, T, HV, V]`` (``HV % H == 0``, GVA).
        a, b: ``[N, T, HV]`` raw gate inputs; A_log, dt_bias: ``[HV]`` (gating fused, fp32 inside).
        state_pool: ``[P, HV, V, K]`` (``state_layout="vk"``) or ``[P, HV, K, V]`` (``"kv"``), fp32 or
            bf16; updated in place at the rows named by ``state_indices``; slot pitch ``stride(0)``.
        state_indices: ``[N]`` int32/int64 slots (negative = padding: zero output, pool untouched),
            or ``[N, T]`` per-token slots for speculative verify (state after token t stored there).
        scale: query scale (default ``K ** -0.5``, must be > 0). use_qk_l2norm: L2-normalise q, k.
        intermediate_states: optional ``[S, steps >= T, HV, V, K]`` receiving the state after every
            token at row ``intermediate_state_indices[n]`` (negative = skip); pitch from ``stride(0)``.
        disable_state_update: leave the pool untouched (verify only).
        num_accepted_tokens: ``[N]`` in ``0..T`` with an ``[N, T]`` table: the state is loaded from the
            slot of token ``num_accepted_tokens[n] - 1``; 0 starts from a zero state.
        backend: force a backend. validate: run checks that sync with the device (index range,
            duplicate slots); skipped automatically during CUDA-graph capture.
    Returns:
        ``o [N, T, HV, V]`` in q's dtype.
    Raises:
        ValueError / TypeError: bad inputs, before any kernel launch. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> N, H, HV, K, V, P = 2, 1, 2, 8, 8, 4
        >>> pool = torch.zeros(P, HV, V, K)
        >>> o = linattn.gdn_decode(torch.randn(N, 1, H, K), torch.randn(N, 1, H, K), torch.randn(N, 1, HV, V),
        ...     torch.zeros(N, 1, HV), torch.zeros(N, 1, HV), torch.zeros(HV), torch.zeros(HV), pool,
        ...     torch.tensor([3, -1]))
        >>> tuple(o.shape), bool(o[1].abs().sum() == 0)
        ((2, 1, 2, 8), True)
    """
    fn = _gdn_decode_op if _compiling() else _gdn_decode_impl
    return fn(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm, state_layout,
              intermediate_states, intermediate_state_indices, disable_state_update, num_accepted_tokens,
              softplus_beta, softplus_threshold, backend or "", validate)


def _kda_decode_impl(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                   state_pool: Tensor, state_indices: Tensor, scale: Optional[float], use_qk_l2norm: bool,
                   state_layout: str, intermediate_states: Optional[Tensor],
                   intermediate_state_indices: Optional[Tensor], disable_state_update: bool,
                   num_accepted_tokens: Optional[Tensor], lower_bound: Optional[float], softplus_beta: float,
                   softplus_threshold: float, backend: str, validate: bool) -> Tensor:
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool,
                state_indices=state_indices, scale=scale, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                intermediate_states=intermediate_states, intermediate_state_indices=intermediate_state_indices,
                disable_state_update=disable_state_update, num_accepted_tokens=num_accepted_tokens,
                lower_bound=lower_bound, softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    return _call("kda_decode", args, backend, validate)


_kda_decode_op = torch.library.custom_op("linattn::kda_decode",
                                         mutates_args=("state_pool", "intermediate_states"))(_kda_decode_impl)


@_kda_decode_op.register_fake
def _(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, *rest):
    return _decode_fake(q, v)


def kda_decode(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
               state_pool: Tensor, state_indices: Tensor, *, scale: Optional[float] = None,
               use_qk_l2norm: bool = True, state_layout: str = "vk", intermediate_states: Optional[Tensor] = None,
               intermediate_state_indices: Optional[Tensor] = None, disable_state_update: bool = False,
               num_accepted_tokens: Optional[Tensor] = None, lower_bound: Optional[float] = None,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0, backend: Optional[str] = None,
               validate: bool = True) -> Tensor:
    """Kimi Delta Attention decode over a state pool, in place (ops.md; Kimi Linear report, 2025).

    As :func:`gdn_decode`, with per-key-channel gates: ``a [N, T, HV, K]``, ``dt_bias [HV, K]``,
    ``A_log [HV]``, and ``lower_bound`` (None, or e.g. -5.0 for the bounded gate).

    Returns:
        ``o [N, T, HV, V]`` in q's dtype.
    Raises:
        ValueError / TypeError: bad inputs, before any kernel launch. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> pool = torch.zeros(2, 1, 4, 4)
        >>> o = linattn.kda_decode(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4),
        ...     torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1), torch.zeros(1), torch.zeros(1, 4), pool,
        ...     torch.tensor([0]))
        >>> bool(pool[1].abs().sum() == 0)
        True
    """
    fn = _kda_decode_op if _compiling() else _kda_decode_impl
    return fn(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm, state_layout,
              intermediate_states, intermediate_state_indices, disable_state_update, num_accepted_tokens,
              lower_bound, softplus_beta, softplus_threshold, backend or "", validate)


# -- prefill -----------------------------------------------------------------------------------------


def _prefill_fake(q, v, cu_seqlens, state_pool, initial_state, state_layout):
    o = q.new_empty((q.shape[0], v.shape[1], v.shape[2]))
    if state_pool is not None:
        return o, q.new_empty((0,), dtype=torch.float32)
    N, HV, K, V = cu_seqlens.shape[0] - 1, v.shape[1], q.shape[2], v.shape[2]
    shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
    dtype = initial_state.dtype if initial_state is not None else torch.float32
    return o, q.new_empty(shape, dtype=dtype)


def _make_prefill(op: str):
    """(plain implementation, custom op) for ``gdn_prefill`` / ``kda_prefill``. The custom op always
    returns a second tensor (empty in pool mode): custom-op outputs cannot be None."""

    def impl(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
             state_pool: Optional[Tensor], state_indices: Optional[Tensor], initial_state: Optional[Tensor],
             scale: Optional[float], use_qk_l2norm: bool, state_layout: str, backend: str,
             validate: bool) -> tuple[Tensor, Tensor]:
        args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                    state_indices=state_indices, initial_state=initial_state, scale=scale,
                    use_qk_l2norm=use_qk_l2norm, state_layout=state_layout)
        o, final = _call(op, args, backend, validate)
        return o, (final if final is not None else q.new_empty((0,), dtype=torch.float32))

    custom = torch.library.custom_op(f"linattn::{op}", mutates_args=("state_pool",))(impl)

    @custom.register_fake
    def _(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale, use_qk_l2norm,
          state_layout, backend, validate):
        return _prefill_fake(q, v, cu_seqlens, state_pool, initial_state, state_layout)

    return impl, custom


_gdn_prefill_impl, _gdn_prefill_op = _make_prefill("gdn_prefill")
_kda_prefill_impl, _kda_prefill_op = _make_prefill("kda_prefill")


def _prefill(impl, custom, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
             use_qk_l2norm, state_layout, backend, validate):
    fn = custom if _compiling() else impl
    o, final = fn(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
                  use_qk_l2norm, state_layout, backend or "", validate)
    return o if state_pool is not None else (o, final)


def gdn_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                initial_state: Optional[Tensor] = None, scale: Optional[float] = None, use_qk_l2norm: bool = True,
                state_layout: str = "vk", backend: Optional[str] = None, validate: bool = True):
    """Gated DeltaNet chunked prefill over varlen sequences (ops.md; Yang et al., ICLR 2025 / NeurIPS 2024).

    Args:
        q, k: ``[T, H, K]``. v: ``[T, HV, V]``. g, beta: ``[T, HV]`` fp32 from :func:`gdn_gating`.
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of sequence lengths (zero lengths legal).
        state_pool, state_indices: **pool mode**: h0 read from ``state_pool[state_indices[n]]`` and the
            final state written back to that row in place. A negative index makes that sequence
            padding: zero output for its tokens, the pool neither read nor written.
        initial_state: **dense mode** (no pool): ``[N, HV, V, K]`` (``"vk"``) or None for zeros.
        scale, use_qk_l2norm, state_layout, backend, validate: as in :func:`gdn_decode`.
    Returns:
        pool mode: ``o [T, HV, V]``; dense mode: ``(o, final_state [N, HV, V, K])``.
    Raises:
        ValueError / TypeError: bad inputs (before any launch). NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> T, H, K, V = 5, 1, 8, 8
        >>> g, beta = linattn.gdn_gating(torch.zeros(1), torch.zeros(T, 1), torch.zeros(T, 1), torch.zeros(1))
        >>> o, ht = linattn.gdn_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V), g, beta,
        ...     torch.tensor([0, 2, 5]))
        >>> tuple(ht.shape)
        (2, 1, 8, 8)
    """
    return _prefill(_gdn_prefill_impl, _gdn_prefill_op, q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                    initial_state, scale, use_qk_l2norm, state_layout, backend, validate)


def kda_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                initial_state: Optional[Tensor] = None, scale: Optional[float] = None, use_qk_l2norm: bool = True,
                state_layout: str = "vk", backend: Optional[str] = None, validate: bool = True):
    """Kimi Delta Attention chunked prefill: as :func:`gdn_prefill` with ``g [T, HV, K]`` (per key channel).

    Returns:
        pool mode: ``o [T, HV, V]``; dense mode: ``(o, final_state)``.
    Raises:
        ValueError / TypeError: bad inputs. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> T, H, K, V = 3, 1, 4, 4
        >>> o, ht = linattn.kda_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V),
        ...     -torch.rand(T, H, K), torch.rand(T, H), torch.tensor([0, 3]))
        >>> tuple(o.shape)
        (3, 1, 4)
    """
    return _prefill(_kda_prefill_impl, _kda_prefill_op, q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                    initial_state, scale, use_qk_l2norm, state_layout, backend, validate)


# -- SwiGLU clamp ------------------------------------------------------------------------------------


def _silu_and_mul_clamp_impl(x: Tensor, limit: Optional[float], backend: str, validate: bool) -> Tensor:
    return _call("silu_and_mul_clamp", dict(x=x, limit=limit), backend, validate)


_silu_and_mul_clamp_op = torch.library.custom_op("linattn::silu_and_mul_clamp",
                                                 mutates_args=())(_silu_and_mul_clamp_impl)


@_silu_and_mul_clamp_op.register_fake
def _(x, limit, backend, validate):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def silu_and_mul_clamp(x: Tensor, limit: Optional[float] = None, *, backend: Optional[str] = None,
                       validate: bool = True) -> Tensor:
    """SwiGLU with a clamp: ``silu(min(gate, L)) * clamp(up, -L, L)`` (ops.md; DeepSeek-V4-class MoE).

    Args:
        x: ``[M, 2D]`` = gate ‖ up, bf16/fp16/fp32; any ``M >= 0``, any ``D >= 1``.
        limit: None (plain ``silu(gate) * up``, bitwise) or a finite float > 0.
    Returns:
        ``[M, D]`` in x's dtype (``M = 0``: an empty tensor, nothing launched).
    Raises:
        ValueError: limit 0, negative, inf or NaN; odd last dim. TypeError: non-float x.
    Example:
        >>> import torch, linattn
        >>> linattn.silu_and_mul_clamp(torch.tensor([[100.0, -100.0]]), 10.0)
        tensor([[-99.9955]])
    """
    fn = _silu_and_mul_clamp_op if _compiling() else _silu_and_mul_clamp_impl
    return fn(x, limit, backend or "", validate)
