"""IEEE fp32 matmuls inside linattn's PyTorch computations, whatever the caller's global flags say.

torch's float32 matmul precision is a process-wide setting: ``torch.set_float32_matmul_precision
("medium")`` lets an fp32 matmul run in bf16 (oneDNN on CPUs with AMX / AVX512-BF16) and
``"high"`` in TF32 (cuBLAS on Ampere and later; ``torch.backends.cuda.matmul.allow_tf32`` is the
same switch). linattn's PyTorch paths (``torch-ref``, the ``cpu-chunked`` plugin, the
context-parallel combine) promise docs/ops.md's fp32 tolerance (1e-5 against float64), which a
bf16 matmul misses by 300x (field case F36). :func:`ieee_fp32_matmul` pins IEEE fp32 for the
duration of a call and gives the caller's values back afterwards, also when the call raises.
The Triton kernels never read these flags (their ``tl.dot`` calls pass ``input_precision``).

Which flags: on torch >= 2.9 (the per-backend API) ``torch.backends.mkldnn.matmul.fp32_precision``,
``torch.backends.cuda.matmul.fp32_precision`` and ``torch.backends.cudnn.conv.fp32_precision``
(set to ``"ieee"``); before it, ``torch.get_float32_matmul_precision()`` (set to ``"highest"``),
``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (set to False).
Only one API is touched on a given torch, so a caller who uses the other is never left in torch's
"mix of the legacy and new APIs" state.

Threads: the flags are global to the process, so the pin is reference counted under a lock. The
first call to enter saves the caller's values and pins. Every later entry, at any depth, reads the
flags again and re-pins those some other code changed while calls were in flight, taking the
changed values as the caller's (so the entering call runs in IEEE fp32 whatever happened
meanwhile). The last to leave restores the caller's values, where a flag still holds the pinned
value. The restore rule, then: the caller's most recent setting wins at the end, whether it was
made before the first entry, between two entries, or after the last entry while a call was still
in flight (that flag is left as set). What remains, by the nature of process-wide flags:

- a call already past its entry when other code changes a flag runs the rest of its matmuls under
  the new value (a later entry re-pins; nothing re-pins a call in flight);
- while any linattn call is in flight, fp32 matmuls of other threads also run in IEEE fp32: more
  precise, never less;
- a change to exactly the pinned value (``"highest"``, ``"ieee"``) during a call cannot be told
  from the pin, and the value saved at the first entry comes back at the end.

Cost: one lock and a few flag reads and writes per call, 7-8 us per enter and exit on a CPU
(torch 2.13's per-backend API, a shared 2-core machine: ``timeit`` of an empty ``with``), not
paid by the Triton and CuTe DSL backends.

Example:
    >>> import torch
    >>> from linattn.precision import ieee_fp32_matmul
    >>> before = torch.get_float32_matmul_precision()
    >>> with ieee_fp32_matmul():
    ...     torch.get_float32_matmul_precision()
    'highest'
    >>> torch.get_float32_matmul_precision() == before
    True
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, TypeVar

import torch

__all__ = ["ieee_fp32_matmul", "pinned_fp32_matmul", "precision_flags"]

F = TypeVar("F", bound=Callable)


def _new_api() -> bool:
    """True on a torch with the per-backend ``fp32_precision`` attributes (2.9 and later)."""
    mkldnn = getattr(torch.backends, "mkldnn", None)
    return hasattr(getattr(mkldnn, "matmul", None), "fp32_precision")


_NEW_API = _new_api()

#: (object, attribute, pinned value) of every flag touched; the objects are torch's own modules.
if _NEW_API:
    _FLAGS = ((torch.backends.mkldnn.matmul, "fp32_precision", "ieee"),
              (torch.backends.cuda.matmul, "fp32_precision", "ieee"),
              (torch.backends.cudnn.conv, "fp32_precision", "ieee"))
else:  # torch 2.4 .. 2.8: the legacy switches (set_float32_matmul_precision sets cuBLAS's allow_tf32 too)
    _FLAGS = ((torch.backends.cuda.matmul, "allow_tf32", False),
              (torch.backends.cudnn, "allow_tf32", False))



def _accessors(obj, attr: str) -> tuple[Callable[[], object], Callable[[object], None]]:
    """(read, write) of one flag of :data:`_FLAGS`: for the new API's ``fp32_precision`` attributes,
    the torch C functions their own ``__getattr__`` / ``__setattr__`` call (``backend``, ``op`` of
    an ``_FP32Precision``; ``("cuda", "matmul")`` for cuBLAS), since reading the attribute goes
    through Python's failed-lookup fallback first (2-3 us a read on torch 2.13, six reads and up to
    six writes per pinned call); else ``getattr`` / ``setattr`` of the attribute."""
    get_c = getattr(torch._C, "_get_fp32_precision_getter", None)
    set_c = getattr(torch._C, "_set_fp32_precision_setter", None)
    if _NEW_API and attr == "fp32_precision" and get_c is not None and set_c is not None:
        if obj is torch.backends.cuda.matmul:
            backend, op = "cuda", "matmul"
        else:
            backend, op = getattr(obj, "backend", None), getattr(obj, "op", None)
        if isinstance(backend, str) and isinstance(op, str) and get_c(backend, op) == getattr(obj, attr):
            return functools.partial(get_c, backend, op), functools.partial(set_c, backend, op)
    return (lambda: getattr(obj, attr)), (lambda value: setattr(obj, attr, value))


#: per flag of :data:`_FLAGS`: its (read, write) functions
_ACCESS = tuple(_accessors(obj, attr) for obj, attr, _ in _FLAGS)
_lock = threading.Lock()
_depth = 0
_saved: tuple = ()
#: the values :func:`_read` gives while pinned
_PINNED = tuple(value for _, _, value in _FLAGS) if _NEW_API else ("highest", *(value for _, _, value in _FLAGS))


def precision_flags() -> dict[str, object]:
    """The current values of the flags :func:`ieee_fp32_matmul` pins, by dotted name (for tests and reports)."""
    names = {id(torch.backends.mkldnn.matmul): "mkldnn.matmul", id(torch.backends.cuda.matmul): "cuda.matmul",
             id(torch.backends.cudnn): "cudnn"}
    if _NEW_API:
        names[id(torch.backends.cudnn.conv)] = "cudnn.conv"
    out: dict[str, object] = {f"{names[id(obj)]}.{attr}": getattr(obj, attr) for obj, attr, _ in _FLAGS}
    if not _NEW_API:
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return out


def _read() -> tuple:
    values = tuple([read() for read, _ in _ACCESS])
    return values if _NEW_API else (torch.get_float32_matmul_precision(), *values)


def _pin(saved: tuple) -> None:
    if not _NEW_API:
        torch.set_float32_matmul_precision("highest")
        saved = saved[1:]
    for (_, _, value), (_, write), old in zip(_FLAGS, _ACCESS, saved):
        if old != value:
            write(value)


def _restore(saved: tuple) -> None:
    """Give back the caller's values, except where a flag no longer holds the pinned value (changed meanwhile)."""
    if not _NEW_API:
        if torch.get_float32_matmul_precision() == "highest":
            torch.set_float32_matmul_precision(saved[0])
        saved = saved[1:]
    for (_, _, value), (read, write), old in zip(_FLAGS, _ACCESS, saved):
        if old != value and read() == value:
            write(old)


class ieee_fp32_matmul:  # noqa: N801 (a context manager, named as one)
    """Context manager: fp32 matmuls in IEEE fp32 inside, the caller's flags back on exit (also on an exception).

    Re-entrant and safe across threads (reference counted; module docstring). Use the decorator
    :func:`pinned_fp32_matmul` on a function.
    """

    __slots__ = ()

    def __enter__(self) -> "ieee_fp32_matmul":
        global _depth, _saved
        with _lock:
            if _depth == 0:
                _saved = _read()
                _pin(_saved)
            else:  # a call in flight: re-pin what other code changed since, keeping its value to restore
                now = _read()
                if now != _PINNED:
                    _saved = tuple(old if cur == pinned else cur for cur, pinned, old in zip(now, _PINNED, _saved))
                    _pin(now)
            _depth += 1
        return self

    def __exit__(self, *exc) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore(_saved)


def pinned_fp32_matmul(fn: F) -> F:
    """Decorator: run ``fn`` inside :class:`ieee_fp32_matmul` (the PyTorch reference paths use it).

    Example:
        >>> @pinned_fp32_matmul
        ... def f():
        ...     return torch.get_float32_matmul_precision()
        >>> f()
        'highest'
    """

    @functools.wraps(fn)
    def pinned(*args, **kwargs):
        with ieee_fp32_matmul():
            return fn(*args, **kwargs)

    return pinned
