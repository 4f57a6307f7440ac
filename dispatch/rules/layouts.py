"""Tensor layouts at the boundary between the validation layer and a backend.

Two rules (docs/ops-decisions.md, "Strides and aliasing"):

- **Read-only tensor arguments** (everything an op does not write: q, k, v, gates, ``A_log``,
  ``dt_bias``, ``state_indices``, ``cu_seqlens``, ``num_accepted_tokens``, ``initial_state``, ...)
  may be any strided view. A backend declares, per op, which of them its kernels read through
  their strides (:attr:`linattn.backends.base.Backend.input_strides`); every other one is made
  contiguous here, after the decision and before the backend runs. The list of arguments comes
  from the op table (``dispatch/rules/ops_table.py``), so a new argument is copied unless a backend
  says it reads its strides. The small metadata tensors cost nothing to copy; a copy inside
  CUDA-graph capture is captured like any other kernel.
- **Written tensors** (``state_pool``, ``intermediate_states``) are never copied: the caller's
  memory is the result. Their layout facts are :class:`~linattn.dispatch.plugin.problem.Problem` fields
  (``state_tiles_contiguous``), and a backend that cannot write such a layout rejects it in its
  predicate with reason ``layout``, so the dispatcher falls back and ``explain`` says why.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..lru import LAYOUT_PLANS_MAX, LRUCache

#: How a backend reads one read-only tensor argument: ``"any"`` through every stride;
#: ``"inner"`` through every stride but the last, which must be 1 (rows of contiguous elements).
#: An argument a backend does not name is read as a contiguous tensor.
InputStrides = Literal["any", "inner"]


def _inner_ok(x: torch.Tensor) -> bool:
    return x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1


def conform_inputs(op: str, args: dict, backend) -> dict:
    """``args`` with every read-only tensor argument the backend cannot read as given replaced by a
    contiguous copy (the same values). The dict is not modified; it is returned as is when nothing
    needs a copy.

    Args:
        op: the op name (a key of the validation layer's table).
        args: the validated, normalised keyword arguments.
        backend: the chosen backend instance (its ``input_strides`` table is read).
    Returns:
        the keyword arguments to run the backend with.
    """
    key = (op, backend.__class__)  # a plugin-API-1 adapter's is its backend's class
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(op, backend)
        _PLANS.put(key, plan)
    out = args
    for name, how in plan:
        x = args.get(name)
        if not isinstance(x, torch.Tensor) or (how == "inner" and _inner_ok(x)) or x.is_contiguous():
            continue
        if out is args:
            out = dict(args)
        out[name] = x.contiguous()
    return out


#: per (op, backend class): the read-only arguments to look at and how the backend reads each
#: (bounded: a registry reloaded again and again brings new classes; dispatch/lru.py)
_PLANS: LRUCache = LRUCache(LAYOUT_PLANS_MAX)


def _plan(op: str, backend) -> tuple:
    from .ops_table import OP_TABLE  # the table imports this module through host_rules

    if backend.input_strides == "any":
        return ()
    declared = backend.input_strides.get(op, {})
    return tuple((name, declared.get(name)) for name in OP_TABLE[op].reads if declared.get(name) != "any")


def state_tiles_contiguous(x: torch.Tensor) -> bool:
    """True when each (slot, head) state matrix of ``x`` (its last two dims) is one dense block in
    row-major order: ``stride(-1) == 1`` and ``stride(-2) == shape[-1]`` (dims of size 1 are free)."""
    rows, cols = x.shape[-2], x.shape[-1]
    return (cols <= 1 or x.stride(-1) == 1) and (rows <= 1 or x.stride(-2) == cols)


def overlaps_itself(x: torch.Tensor) -> bool:
    """True unless ``x``'s strides provably give every element its own address.

    Sufficient test: with the dims of size > 1 sorted by stride, each stride must exceed the span
    of the smaller dims. A zero stride, or a pool whose slot pitch is smaller than one slot, fails;
    every layout reachable by slicing, transposing or permuting a dense tensor passes.
    """
    dims = sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz > 1)
    reach = 1  # elements spanned by the dims already placed
    for stride, size in dims:
        if stride < reach:
            return True
        reach += stride * (size - 1)
    return False


def byte_range(x: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)`` byte addresses of the elements ``x`` addresses (``(0, 0)`` if empty)."""
    if x.numel() == 0:
        return 0, 0
    span = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))
    lo = x.data_ptr()
    return lo, lo + (span + 1) * x.element_size()


def interleaved_disjoint(x: torch.Tensor, y: torch.Tensor) -> bool:
    """True when ``x`` and ``y`` provably share no element although their address ranges meet:
    both step their leading dim by the same pitch, each leading row's elements lie in a block no
    wider than the pitch, and the two blocks sit in different parts of it (e.g. ``buf[0::2]`` and
    ``buf[1::2]``, or a pool's slots interleaved with another buffer's rows). False means "not
    proven", and the caller refuses the pair."""
    if x.dim() == 0 or y.dim() == 0 or x.element_size() != y.element_size():
        return False
    pitch, es = x.stride(0), x.element_size()
    if pitch <= 0 or y.stride(0) != pitch or x.shape[0] < 1 or y.shape[0] < 1:
        return False
    delta = y.data_ptr() - x.data_ptr()
    if delta % es:
        return False

    def block(t: torch.Tensor) -> int:  # elements spanned by one leading row
        return 1 + sum((size - 1) * stride for size, stride in zip(t.shape[1:], t.stride()[1:]))

    bx, by = block(x), block(y)
    if bx > pitch or by > pitch:
        return False
    d = (delta // es) % pitch  # where y's row block starts inside x's pitch
    return d >= bx and d + by <= pitch
