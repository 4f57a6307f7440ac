"""The validation layer every op call goes through before a backend sees it.

:func:`validate` checks every rule of docs/ops.md for one op, fills in the defaults and returns the
normalised keyword arguments (exactly the op-method contract of ``backends/base.py``) together
with a hashable signature from which :class:`~linattn.dispatch.plugin.problem.Problem` is built.

Two kinds of rules:

- **host rules** (always run): ranks, shapes, dtypes, devices, strides and Python scalars. They
  never read tensor values, so they cost no host-device sync and are safe inside CUDA graph
  capture. One small function per rule group, in :mod:`~linattn.dispatch.rules.host_rules`; each op
  has a row of the op table (:mod:`~linattn.dispatch.rules.ops_table`) naming them.
- **value rules** (``check_values=True``, eager mode only): slot ranges, write-race duplicates,
  ``num_accepted_tokens`` and ``cu_seqlens`` contents. Each rule yields a 0-d "bad" flag computed
  on the device plus a function that explains the failure; all flags come to the host in a single
  sync, and only a failing rule pays for its diagnosis (:mod:`~linattn.dispatch.rules.value_rules`).

Every error is raised before any kernel runs, so a rejected call never touches a pool. Inputs are
never modified. ``ValueError`` means a bad shape or value, ``TypeError`` a wrong type or dtype.

Source of the rules: docs/ops.md (shapes, pool and padding rules) and the field
reports F05 (clamp limit sentinels), F11 (strided gate views), F23 (in-place without indices),
F33 (written buffers torch would refuse to write: refused before the first write), F47 (sparse and
other non-strided layouts).
"""

from __future__ import annotations

from typing import Optional

from .host_rules import (FLOAT_DTYPES, INDEX_DTYPES, STATE_DTYPES, STATE_LAYOUTS, Dims, _dense_tensors, _grad_mode,
                         _written_buffers)
from .ops_table import FLAGS, OP_TABLE, OpSpec, op_spec
from .value_rules import _run_value_rules, _v_finite_inputs

__all__ = ["validate", "FLOAT_DTYPES", "STATE_DTYPES", "INDEX_DTYPES", "STATE_LAYOUTS"]


# -- the table: dispatch/rules/ops_table.py (required arguments, defaults, rules, mutated arguments) ------

def read_arguments(op: str) -> tuple:
    """The arguments of ``op`` that are read but never written (``dispatch/rules/layouts.py`` copies the
    ones a backend cannot read through their strides)."""
    return OP_TABLE[op].reads


def written_arguments(op: str) -> tuple:
    """The tensor arguments ``op`` writes in place (``state_pool``, ``intermediate_states``)."""
    return OP_TABLE[op].mutates


def _normalise(op: str, spec: OpSpec, args: dict) -> dict:
    keys = spec.keys
    for key in args:
        if key not in keys:
            raise TypeError(f"{op}() got an unexpected argument {key!r}; its arguments are "
                            f"{', '.join(spec.arguments)}.")
    out = {}
    for key in spec.required:
        val = args.get(key)
        if val is None:
            raise TypeError(f"{op}() is missing the required argument {key!r}; pass it (see docs/ops.md).")
        out[key] = val
    for key, default in spec.defaults.items():
        val = args.get(key)
        out[key] = default if val is None else val
    return out


def check_options(validate, check_finite=False, where: str = "") -> None:
    """The call options ``validate`` and ``check_finite`` are bools (``validate="no"`` would validate, and
    ``None`` skip the checks: a TypeError, as for the op's own flags); ``where`` (e.g. the function that
    takes them) begins the message."""
    for name, value in (("validate", validate), ("check_finite", check_finite)):
        if type(value) is not bool:
            kind = type(value)
            kind = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            raise TypeError(f"{where + ': ' if where else ''}{name} must be a bool (True or False), got {kind} "
                            f"({value!r}).")


def _flag_args(spec: OpSpec, feature: bool) -> tuple:
    """(flag, the first argument of ``spec`` setting it, or None) per flag of ``FLAGS`` (plain ones or features)."""
    first: dict = {}
    for a in spec.args:
        first.setdefault(a.flag, a)
    return tuple((f.name, first.get(f.name)) for f in FLAGS if f.feature == feature)


#: per op: the flags of the signature and the argument each is read from (``Problem`` field order:
#: the plain flags, the facts the rules find, the features)
_FLAG_ARGS = {op: (_flag_args(spec, False), _flag_args(spec, True)) for op, spec in OP_TABLE.items()}


def _given(out: dict, flags: tuple) -> tuple:
    """Each flag's value: its argument's value (a bool argument) or whether it is given."""
    get = out.get
    return tuple([(name, False if a is None else get(a.name, False) if a.type is bool else get(a.name) is not None)
                  for name, a in flags])


def _signature(op: str, out: dict, dims: Dims) -> tuple:
    plain, features = _FLAG_ARGS[op]
    return (("op", op), ("n", dims["n"]), ("t", dims["t"]), ("h", dims["h"]), ("hv", dims["hv"]),
            ("k", dims["k"]), ("v", dims["v"]), ("d", dims["d"]), ("dtype", dims["dtype"]),
            ("state_dtype", dims["state_dtype"]), ("state_layout", out.get("state_layout", "vk")),
            ("mode", dims["mode"]), ("max_seqlen", dims["max_seqlen"]), *_given(out, plain),
            ("state_tiles_contiguous", dims["state_tiles_contiguous"]), ("requires_grad", dims["requires_grad"]),
            *_given(out, features))


def validate(op: str, args: dict, *, check_values: bool = True,
             check_finite: bool = False) -> tuple[dict, tuple]:
    """Check every docs/ops.md rule for ``op``; return (normalised args, signature).

    Args:
        op: one of ``gdn_gating``, ``kda_gating``, ``gdn_decode``, ``kda_decode``, ``gdn_prefill``,
            ``kda_prefill``, ``silu_and_mul_clamp``.
        args: the caller's keyword arguments, named as in the op-method contract of
            ``backends/base.py``; optional ones may be missing or None. Shapes (docs/ops.md): decode
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
    out, signature, _dims = validate_call(op, args, check_values=check_values, check_finite=check_finite)
    return out, signature


def validate_call(op: str, args: dict, *, check_values: bool = True,
                  check_finite: bool = False) -> tuple[dict, tuple, dict]:
    """:func:`validate`, also returning the dims the rules derived (shapes, device, mode), which
    the per-call fast path (``dispatch/runtime/fast_path.py``) keeps to re-run the value rules alone."""
    spec = op_spec(op)
    check_options(check_values, check_finite)
    out = _normalise(op, spec, args)
    dims = {"n": 1, "t": 1, "h": 1, "hv": 1, "k": 0, "v": 0, "d": 0, "dtype": "float32",
            "state_dtype": "float32", "mode": spec.mode, "max_seqlen": 0, "writes_pool": True,
            "state_tiles_contiguous": True, "requires_grad": False}
    _dense_tensors(out, dims)
    for rule in spec.host_rules:
        rule(out, dims)
    _written_buffers(out, dims, spec.mutates)
    _grad_mode(out, dims)
    rules = value_rules_of(op, check_values=check_values, check_finite=check_finite)
    if rules:
        _run_value_rules(rules, out, dims, refuse_in_capture="check_finite=True" if check_finite else None)
    for key in spec.only_when_given:
        if out[key] is None:
            del out[key]
    return out, _signature(op, out, dims), dims


def caller_fault(op: str, args: dict) -> Optional[Exception]:
    """After a plugin backend raised: the refusal the call itself earns (every host rule and every
    value rule, whatever ``validate`` the caller passed), or None when the call is valid and the
    backend is at fault. A caller's fault never marks a backend broken (field case F33).

    Args:
        op: the op name. args: the validated, normalised keyword arguments the backend ran with.
    Returns:
        the ``ValueError`` / ``TypeError`` validation raises for ``args``, or None.
    """
    try:
        validate_call(op, args, check_values=True)
    except (ValueError, TypeError) as e:
        return e
    except Exception:  # noqa: BLE001 - e.g. the value rules' sync meets the backend's sticky device error
        return None
    return None


def value_rules_of(op: str, *, check_values: bool, check_finite: bool) -> tuple:
    """The value rules a call of ``op`` runs (what :func:`validate_call` runs after the host rules)."""
    spec = OP_TABLE[op]
    rules = spec.value_rules if check_values else ()
    if check_finite:
        rules = (*rules, _v_finite_inputs(spec.mutates))
    return rules
