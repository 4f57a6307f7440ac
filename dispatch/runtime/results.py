"""What a plugin backend's result must be, checked before the caller sees it (issue 15, F30).

linattn trusts its built-in backends; a plugin's result is checked against the op contract (the
module docstring of ``backends/base.py``, the docstrings of ``linattn/ops.py``, and
``backends/torch_ref.py``, the reference): the tuple arity, and for each item its shape, dtype and
device, or that it is None. What each op must return is a small table, :data:`RESULTS`, of
functions from the validated, normalised arguments to :class:`Expect` entries.

The checks read tensor metadata only: no device sync, so they are safe inside CUDA graph capture.
A result that breaks the contract raises :class:`ResultError`; ``linattn.ops._call`` turns it into
``BackendRunError`` and marks the backend broken, so the wrong result never reaches the caller.

Dtype rules follow the reference: gates are fp32 (fp64 when an input is fp64, the oracle mode);
``o`` is in q's (or x's) dtype; a dense prefill's final state is in ``initial_state``'s dtype, or
fp32 without one (fp64 also when q is fp64).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Union

import torch
from torch import Tensor

from ..rules.ops_table import OP_TABLE

__all__ = ["Expect", "RESULTS", "ResultError", "check_result", "input_versions", "check_untouched",
           "final_state_dtype", "gate_dtype"]


class ResultError(RuntimeError):
    """A backend's result breaks its op's contract; the message says what came back and what must."""


class Expect(NamedTuple):
    """One item of an op's result.

    Attributes:
        name: the item's name in the contract (``o``, ``final_state``, ``g``, ``beta``, ``out``).
        dims: the contract's symbols, e.g. ``"[T, HV, V]"`` (for messages).
        shape: the exact shape, or None when the item must be None.
        dtypes: the dtypes allowed (the first one is the contract's).
        device: the device it must be on (that of the call's tensors).
        dtype_rule: where the dtype comes from, e.g. ``"q's dtype"`` (for messages; may be empty).
    """

    name: str
    dims: str
    shape: Optional[tuple]
    dtypes: tuple = ()
    device: Optional[torch.device] = None
    dtype_rule: str = ""


Expected = Union[Expect, tuple]  # one tensor, or a tuple of items


# -- the dtype rules the op returns (F39: ops.py's fakes and its real path both read these) ------------

def gate_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """The dtype of the gating ops' ``(g, beta)``: float64 when any given input is float64 (the
    oracle mode, as the reference computes then), else float32. None entries are skipped.

    ``linattn.ops`` casts a backend's gates to it and its fake implementations return it, so an op
    traced by ``torch.compile`` has the dtype it has in eager mode (F39).

    Example:
        >>> gate_dtype(torch.zeros(2), torch.zeros(2, dtype=torch.float64)), gate_dtype(torch.zeros(2), None)
        (torch.float64, torch.float32)
    """
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def final_state_dtype(q: Tensor, initial_state: Optional[Tensor]) -> torch.dtype:
    """The dtype of a dense prefill's ``final_state``: ``initial_state``'s; without one float32,
    float64 when q is float64 (as :func:`gate_dtype`). Read by the real path and the fake (F39)."""
    return initial_state.dtype if initial_state is not None else gate_dtype(q)


# -- the table: what each op returns, from its validated arguments ------------------------------------

def _fp32_unless_fp64(*tensors) -> tuple[tuple, str]:
    """(dtypes, rule): fp32; fp64 as well when an input is fp64 (the reference computes in fp64 then;
    ``linattn.ops`` casts a plugin's fp32 to the op's dtype, :func:`gate_dtype`)."""
    if gate_dtype(*tensors) == torch.float64:
        return (torch.float64, torch.float32), "float64 as the reference gives for float64 inputs"
    return (torch.float32,), ""


def _gating(args: dict) -> tuple:
    a, b = args["a"], args["b"]
    dtypes, rule = _fp32_unless_fp64(args["A_log"], a, b, args["dt_bias"])
    return (Expect("g", "a's shape", tuple(a.shape), dtypes, a.device, rule),
            Expect("beta", "b's shape", tuple(b.shape), dtypes, b.device, rule))


def _decode(args: dict) -> Expect:
    q, v = args["q"], args["v"]
    shape = (q.shape[0], q.shape[1], v.shape[2], v.shape[3])
    return Expect("o", "[N, T, HV, V]", shape, (q.dtype,), q.device, "q's dtype")


def _prefill(args: dict) -> tuple:
    q, v = args["q"], args["v"]
    o = Expect("o", "[T, HV, V]", (q.shape[0], v.shape[1], v.shape[2]), (q.dtype,), q.device, "q's dtype")
    if args["state_pool"] is not None:
        return o, Expect("final_state", "None (pool mode: the final states are written to state_pool)", None)
    n, hv, k, vd = args["cu_seqlens"].shape[0] - 1, v.shape[1], q.shape[2], v.shape[2]
    vk = args["state_layout"] == "vk"
    dims, shape = ("[N, HV, V, K]", (n, hv, vd, k)) if vk else ("[N, HV, K, V]", (n, hv, k, vd))
    init = args["initial_state"]
    if init is not None:
        return o, Expect("final_state", dims, shape, (init.dtype,), q.device, "initial_state's dtype")
    dtypes, rule = _fp32_unless_fp64(q)
    return o, Expect("final_state", dims, shape, dtypes, q.device, rule or "no initial_state was given")


def _clamp(args: dict) -> Expect:
    x = args["x"]
    return Expect("out", "[M, D]", (x.shape[0], x.shape[1] // 2), (x.dtype,), x.device, "x's dtype")


#: op -> function of the validated arguments giving what the op must return (by the op's backend
#: method in the op table: one rule per phase).
RESULTS: dict[str, Callable[[dict], Expected]] = {
    op: {"gating": _gating, "decode": _decode, "prefill": _prefill, "clamp": _clamp}[spec.method]
    for op, spec in OP_TABLE.items()
}


# -- checking ----------------------------------------------------------------------------------------

def check_result(op: str, args: dict, result):
    """Check ``result`` of ``op`` against the contract; return it unchanged when it fits.

    Args:
        op: the op name (a key of :data:`RESULTS`).
        args: the validated, normalised keyword arguments the backend ran with.
        result: what the backend returned.
    Returns:
        ``result``.
    Raises:
        ResultError: wrong arity, a non-tensor, a None where a tensor is due (or the reverse), or
            a wrong shape, dtype, device or a non-contiguous tensor; the message names the item, what
            came back and what the contract asks for.
    """
    expected = RESULTS[op](args)
    if isinstance(expected, Expect):
        _check_item(op, expected, result)
        return result
    _check_arity(op, expected, result)
    for exp, item in zip(expected, result):
        _check_item(op, exp, item)
    return result


def input_versions(op: str, args: dict) -> tuple:
    """``(name, tensor, version)`` of every read-only tensor argument of ``op`` whose version counter
    torch keeps (not inference tensors, which have none), taken before a plugin runs; see
    :func:`check_untouched`. Metadata only: no sync."""
    out = []
    for name in OP_TABLE[op].reads:
        x = args.get(name)
        if isinstance(x, Tensor) and not x.is_inference():
            out.append((name, x, x._version))
    return tuple(out)


def check_untouched(op: str, args: dict, result, versions: tuple):
    """Refuse a plugin's result that shares memory with the call's arguments, or a run that
    modified a read-only argument (field case F43); return ``result`` when neither happened.

    Args:
        op: the op name.
        args: the validated, normalised keyword arguments the backend ran with.
        result: what the backend returned (already through :func:`check_result`).
        versions: :func:`input_versions` of ``args``, taken before the run.
    Returns:
        ``result``.
    Raises:
        ResultError: a returned tensor shares its storage with an argument (the pool included:
            every output must be a new tensor), or a read-only argument's version counter moved
            (it was written in place through torch; a write through a raw pointer, or into an
            inference tensor, leaves no trace and is not seen).
    """
    for name, x, version in versions:
        if x._version != version:
            raise ResultError(f"{op} modified its read-only input {name} in place (its version counter went "
                              f"from {version} to {x._version}); inputs are never modified (docs/ops.md), so "
                              f"write the output into a new tensor")
    storages = {}
    for name, x in args.items():
        if isinstance(x, Tensor) and x.numel():
            storages.setdefault(x.untyped_storage().data_ptr(), name)
    for i, item in enumerate(result if isinstance(result, tuple) else (result,)):
        if isinstance(item, Tensor) and item.numel():
            name = storages.get(item.untyped_storage().data_ptr())
            if name is not None:
                expected = RESULTS[op](args)
                what = (expected if isinstance(expected, Expect) else expected[i]).name
                raise ResultError(f"{op} returned {what} sharing memory with its argument {name} (the same "
                                  f"storage); every output must be a new tensor and inputs are never modified "
                                  f"(docs/ops.md)")
    return result


def _check_arity(op: str, expected: tuple, result) -> None:
    names = ", ".join(e.name for e in expected)
    if not isinstance(result, tuple):
        raise ResultError(f"{op} returned {_what(result)}; the contract is a tuple ({names}) of "
                          f"{len(expected)} items")
    if len(result) != len(expected):
        raise ResultError(f"{op} returned a tuple of {len(result)} items; the contract is ({names}), "
                          f"{len(expected)} items")


def _check_item(op: str, exp: Expect, item) -> None:
    if exp.shape is None:
        if item is not None:
            raise ResultError(f"{op} returned {exp.name} = {_what(item)}; the contract is {exp.dims}: "
                              f"return None there")
        return
    want = _want(exp)
    if not isinstance(item, Tensor):
        raise ResultError(f"{op} returned {exp.name} = {_what(item)}; the contract is {want}")
    if tuple(item.shape) != exp.shape:
        raise ResultError(f"{op} returned {exp.name} of shape {_shape(item.shape)}; the contract is {want}")
    if item.dtype not in exp.dtypes:
        raise ResultError(f"{op} returned {exp.name} in {_dtype(item.dtype)}; the contract is {want}")
    if item.device != exp.device:
        raise ResultError(f"{op} returned {exp.name} on {item.device}; the contract is {want}")
    if not item.is_contiguous():  # the op's fake (what torch.compile traces) declares contiguous strides (F39)
        raise ResultError(f"{op} returned {exp.name} with strides {tuple(item.stride())}, not contiguous; the contract "
                          f"is a contiguous {want} (torch.compile traces the op's contiguous fake): return "
                          f"{exp.name}.contiguous()")


def _want(exp: Expect) -> str:
    dtypes = " or ".join(_dtype(d) for d in exp.dtypes)
    rule = f" ({exp.dtype_rule})" if exp.dtype_rule else ""
    return (f"{exp.dims} = {_shape(exp.shape)} in {dtypes}{rule} on {exp.device} "
            f"(backends/base.py lists every op's result)")


def _what(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, Tensor):
        return f"a tensor of shape {_shape(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} items"
    return f"a {type(x).__qualname__}"


def _shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
