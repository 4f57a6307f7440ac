"""The validation layer every op call goes through before a backend sees it.

:func:`validate` checks every rule of ops.md for one op, fills in the defaults and returns the
normalised keyword arguments (exactly the op-method contract of ``backends/base.py``) together
with a hashable signature from which :class:`~linattn.dispatch.problem.Problem` is built.

Two kinds of rules:

- **host rules** (always run): ranks, shapes, dtypes, devices, strides and Python scalars. They
  never read tensor values, so they cost no host-device sync and are safe inside CUDA graph
  capture. One small function per rule group, in :mod:`~linattn.dispatch.host_rules`; each op
  has a table of them (``_SPECS``, below).
- **value rules** (``check_values=True``, eager mode only): slot ranges, write-race duplicates,
  ``num_accepted_tokens`` and ``cu_seqlens`` contents. Each rule yields a 0-d "bad" flag computed
  on the device plus a function that explains the failure; all flags come to the host in a single
  sync, and only a failing rule pays for its diagnosis (:mod:`~linattn.dispatch.value_rules`).

Every error is raised before any kernel runs, so a rejected call never touches a pool. Inputs are
never modified. ``ValueError`` means a bad shape or value, ``TypeError`` a wrong type or dtype.

Source of the rules: /work/shared/spec/ops.md (shapes, pool and padding rules) and the field
reports F05 (clamp limit sentinels), F11 (strided gate views), F23 (in-place without indices).
"""

from __future__ import annotations

from typing import NamedTuple

from .host_rules import (FLOAT_DTYPES, GATE_DTYPES, INDEX_DTYPES, STATE_DTYPES, STATE_LAYOUTS, Dims,
                         _clamp_input, _cu_seqlens, _decode_flags, _decode_indices, _decode_qkv,
                         _gdn_decode_gates, _gdn_gating_inputs, _gdn_prefill_gates, _grad_mode, _has_initial_state,
                         _intermediate,
                         _kda_decode_gates, _kda_gating_inputs, _kda_prefill_gates, _lower_bound,
                         _pool, _prefill_qkv, _prefill_state, _same_device, _scale_and_norm,
                         _softplus, _state_layout, _written_buffers)
from .value_rules import (_run_value_rules, _v_cu_seqlens, _v_decode_log_decay, _v_finite_inputs,
                          _v_intermediate, _v_log_decay, _v_num_accepted, _v_shared_gate_params, _v_state_indices)

__all__ = ["validate", "FLOAT_DTYPES", "STATE_DTYPES", "INDEX_DTYPES", "STATE_LAYOUTS"]


# -- the table -----------------------------------------------------------------------------------

class _OpSpec(NamedTuple):
    required: tuple
    defaults: dict  # optional contract keys -> default (None = unset; scale is filled by a rule)
    host_rules: tuple
    value_rules: tuple
    mode: str
    written: tuple = ()  # tensor arguments the op writes in place (never copied, alias-checked)


_SOFTPLUS = {"softplus_beta": 1.0, "softplus_threshold": 20.0}
_DECODE_REQ = ("q", "k", "v", "state_pool")
#: decode's gates: the raw form (a, b, A_log, dt_bias) or the precomputed form (g, beta), exactly one
#: (host rule ``_decode_gates``); has_initial_state [N] bool (pool mode, decode and prefill)
_DECODE_OPT = {"a": None, "b": None, "A_log": None, "dt_bias": None, "g": None, "beta": None,
               "has_initial_state": None, "state_indices": None, "scale": None, "use_qk_l2norm": True, "state_layout": "vk",
               "intermediate_states": None, "intermediate_state_indices": None,
               "disable_state_update": False, "num_accepted_tokens": None, **_SOFTPLUS}
_PREFILL_REQ = ("q", "k", "v", "g", "beta", "cu_seqlens")
_PREFILL_OPT = {"state_pool": None, "state_indices": None, "initial_state": None, "has_initial_state": None,
                "scale": None, "use_qk_l2norm": True, "state_layout": "vk"}
_DECODE_RULES = (_decode_flags, _state_layout, _pool, _decode_indices, _has_initial_state, _intermediate,
                 _scale_and_norm, _softplus)
_DECODE_VALUES = (_v_state_indices, _v_intermediate, _v_num_accepted, _v_shared_gate_params,
                  _v_decode_log_decay)
_PREFILL_RULES = (_cu_seqlens, _state_layout, _pool, _prefill_state, _has_initial_state, _scale_and_norm,
                  _same_device)
_DECODE_WRITES = ("state_pool", "intermediate_states")
_PREFILL_WRITES = ("state_pool",)
_PREFILL_VALUES = (_v_cu_seqlens, _v_state_indices, _v_log_decay)

_SPECS: dict[str, _OpSpec] = {
    "gdn_gating": _OpSpec(("A_log", "a", "b", "dt_bias"), dict(_SOFTPLUS),
                          (_gdn_gating_inputs, _softplus, _same_device), (), "none"),
    "kda_gating": _OpSpec(("A_log", "a", "b", "dt_bias"), {"lower_bound": None, **_SOFTPLUS},
                          (_kda_gating_inputs, _lower_bound, _softplus, _same_device), (), "none"),
    "gdn_decode": _OpSpec(_DECODE_REQ, dict(_DECODE_OPT),
                          (_decode_qkv, _gdn_decode_gates, *_DECODE_RULES, _same_device),
                          _DECODE_VALUES, "pool", _DECODE_WRITES),
    "kda_decode": _OpSpec(_DECODE_REQ, {**_DECODE_OPT, "lower_bound": None},
                          (_decode_qkv, _kda_decode_gates, *_DECODE_RULES, _lower_bound, _same_device),
                          _DECODE_VALUES, "pool", _DECODE_WRITES),
    "gdn_prefill": _OpSpec(_PREFILL_REQ, dict(_PREFILL_OPT),
                           (_prefill_qkv, _gdn_prefill_gates, *_PREFILL_RULES), _PREFILL_VALUES, "dense",
                           _PREFILL_WRITES),
    "kda_prefill": _OpSpec(_PREFILL_REQ, dict(_PREFILL_OPT),
                           (_prefill_qkv, _kda_prefill_gates, *_PREFILL_RULES), _PREFILL_VALUES, "dense",
                           _PREFILL_WRITES),
    "silu_and_mul_clamp": _OpSpec(("x",), {"limit": None}, (_clamp_input, _same_device), (), "none"),
}
_KEYS = {op: frozenset(s.required) | frozenset(s.defaults) for op, s in _SPECS.items()}
#: Arguments of the second release that are handed to a backend only when given (not None): a
#: backend written before them (a v1 plugin) never sees them, and the ``features`` predicate
#: (``backends/base.py``) rejects it for a call that uses them.
_ONLY_WHEN_GIVEN = {"gdn_decode": ("g", "beta", "has_initial_state"),
                    "kda_decode": ("g", "beta", "has_initial_state"),
                    "gdn_prefill": ("has_initial_state",), "kda_prefill": ("has_initial_state",)}
#: Per op, the arguments that may be tensors and are only read (all but ``written``), in table order.
_READ = {op: tuple(k for k in (*s.required, *s.defaults) if k not in s.written) for op, s in _SPECS.items()}


def read_arguments(op: str) -> tuple:
    """The arguments of ``op`` that are read but never written (``dispatch/layouts.py`` copies the
    ones a backend cannot read through their strides)."""
    return _READ[op]


def written_arguments(op: str) -> tuple:
    """The tensor arguments ``op`` writes in place (``state_pool``, ``intermediate_states``)."""
    return _SPECS[op].written


def _normalise(op: str, spec: _OpSpec, args: dict) -> dict:
    keys = _KEYS[op]
    for key in args:
        if key not in keys:
            raise TypeError(f"{op}() got an unexpected argument {key!r}; its arguments are "
                            f"{', '.join(spec.required + tuple(spec.defaults))}.")
    out = {}
    for key in spec.required:
        val = args.get(key)
        if val is None:
            raise TypeError(f"{op}() is missing the required argument {key!r}; pass it (see ops.md).")
        out[key] = val
    for key, default in spec.defaults.items():
        val = args.get(key)
        out[key] = default if val is None else val
    return out


def _signature(op: str, out: dict, dims: Dims) -> tuple:
    get = out.get
    return (("op", op), ("n", dims["n"]), ("t", dims["t"]), ("h", dims["h"]), ("hv", dims["hv"]),
            ("k", dims["k"]), ("v", dims["v"]), ("d", dims["d"]), ("dtype", dims["dtype"]),
            ("state_dtype", dims["state_dtype"]), ("state_layout", get("state_layout", "vk")),
            ("mode", dims["mode"]), ("max_seqlen", dims["max_seqlen"]),
            ("intermediate_states", get("intermediate_states") is not None),
            ("num_accepted_tokens", get("num_accepted_tokens") is not None),
            ("disable_state_update", get("disable_state_update", False)),
            ("lower_bound", get("lower_bound") is not None), ("clamp_limit", get("limit") is not None),
            ("state_tiles_contiguous", dims["state_tiles_contiguous"]), ("requires_grad", dims["requires_grad"]),
            ("precomputed_gates", dims.get("precomputed_gates", False)),
            ("has_initial_state", dims.get("has_initial_state", False)))


def validate(op: str, args: dict, *, check_values: bool = True,
             check_finite: bool = False) -> tuple[dict, tuple]:
    """Check every ops.md rule for ``op``; return (normalised args, signature).

    Args:
        op: one of ``gdn_gating``, ``kda_gating``, ``gdn_decode``, ``kda_decode``, ``gdn_prefill``,
            ``kda_prefill``, ``silu_and_mul_clamp``.
        args: the caller's keyword arguments, named as in the op-method contract of
            ``backends/base.py``; optional ones may be missing or None. Shapes (ops.md): decode
            ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``, ``a, b [N, T, HV]`` (KDA ``a [N, T, HV, K]``),
            ``A_log [HV]``, ``dt_bias [HV]`` (KDA ``[HV, K]``) or instead precomputed ``g`` (shaped
            as ``a``) and ``beta`` (as ``b``) fp32, ``state_pool [P, HV, V, K]``
            (``state_layout="vk"``) or ``[P, HV, K, V]`` (``"kv"``) in fp32/bf16/fp64,
            ``state_indices [N]`` or ``[N, T]`` int32/int64 (negative = padding); prefill
            ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g [T, HV]`` (KDA ``[T, HV, K]``), ``beta [T, HV]``
            fp32, ``cu_seqlens [N + 1]``, pool mode (``state_pool`` + ``state_indices [N]``) or dense
            mode (``initial_state [N, HV, V, K]`` or None); clamp ``x [M, 2D]``, ``limit``.
            The dict is not modified.
        check_values: also run the checks that read index values (one device->host sync): slot
            range, duplicate slots in a call that writes the pool, ``intermediate_state_indices``,
            ``num_accepted_tokens``, ``cu_seqlens``, the sign of prefill's ``g`` and finite shared
            gate parameters (``A_log``, ``dt_bias``) of decode. Skipped anyway while the current
            CUDA stream is being captured into a graph.
        check_finite: also refuse NaN and +-inf in every floating-point input the op reads (not
            the pool or other written buffers), in the same single sync (one sync of its own for
            an op without value checks). Refused during CUDA-graph capture (no sync is allowed).

    Returns:
        ``(kwargs, signature)``: a new dict with exactly the contract's keys, defaults filled in
        (``scale`` a Python float, ``K ** -0.5`` by default; ``state_layout`` ``"vk"``; ...; the
        second release's optional arguments, decode's ``g`` / ``beta`` and ``has_initial_state``,
        only when given, so a first-release backend never sees them), and a
        hashable tuple of ``(field, value)`` pairs with ``Problem(**dict(signature))`` valid.

    Raises:
        ValueError: a bad shape, layout, scalar or index value (the message names the argument,
            the value given, what is allowed and what to do).
        TypeError: a wrong type or dtype, a missing required or an unknown argument.

    Example:
        >>> import torch
        >>> q = torch.zeros(2, 1, 1, 4); v = torch.zeros(2, 1, 2, 4); ab = torch.zeros(2, 1, 2)
        >>> kw, sig = validate("gdn_decode", dict(q=q, k=q, v=v, a=ab, b=ab, A_log=torch.zeros(2),
        ...     dt_bias=torch.zeros(2), state_pool=torch.zeros(3, 2, 4, 4),
        ...     state_indices=torch.tensor([0, -1])))
        >>> kw["scale"], dict(sig)["n"]
        (0.5, 2)
    """
    spec = _SPECS.get(op)
    if spec is None:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(_SPECS)}.")
    out = _normalise(op, spec, args)
    dims = {"n": 1, "t": 1, "h": 1, "hv": 1, "k": 0, "v": 0, "d": 0, "dtype": "float32",
            "state_dtype": "float32", "mode": spec.mode, "max_seqlen": 0, "writes_pool": True,
            "state_tiles_contiguous": True, "requires_grad": False}
    for rule in spec.host_rules:
        rule(out, dims)
    _written_buffers(out, dims, spec.written)
    _grad_mode(out, dims)
    rules = spec.value_rules if check_values else ()
    if check_finite:
        rules = (*rules, _v_finite_inputs(spec.written))
    if rules:
        _run_value_rules(rules, out, dims, refuse_in_capture="check_finite=True" if check_finite else None)
    for key in _ONLY_WHEN_GIVEN.get(op, ()):
        if out[key] is None:
            del out[key]
    return out, _signature(op, out, dims)
