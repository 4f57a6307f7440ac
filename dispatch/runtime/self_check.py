"""First-call self-checks: a backend proves itself on an architecture its kernels never ran on.

A backend declares the architectures its kernels were verified on
(:attr:`~linattn.backends.base.Backend.verified_archs`). On any other GPU arch the dispatcher runs,
before the first user call the backend would take, a small case of the same kernel class through
the backend and compares it with torch-ref in float64 (:func:`check_against_reference`):

- **once** per process and key ``(backend, arch, op, shape class)``; the shape class is what the
  kernels specialise on (:meth:`~linattn.backends.base.Backend.self_check_class`, default
  :func:`kernel_class`: dtypes, state layout, mode, head counts and dims, flags; never N or T);
- **eagerly only**: the check syncs with the device, so during CUDA-graph capture an unchecked
  backend is not chosen (reason ``unverified``: run one eager call before capture);
- a mismatch or an exception **disables** the backend for that key (reason
  ``self_check_failed``, a WARNING on the ``linattn`` logger); the dispatcher falls back to the
  next backend, and ``explain`` says why;
- until it has run, ``explain`` marks the verdict ``verified=False`` with a note.

Inputs are made on the CPU from a generator seeded by the key (the global RNG is not touched;
the cases are :mod:`linattn.testing.inputs`'), moved to the call's device, validated like a user
call (``dispatch/rules/validate.py``) and run under ``torch.no_grad()``; the reference runs on float64 CPU
copies. The comparison is :mod:`linattn.testing.compare`'s, at its tolerances (docs/ops.md: 1e-5
with fp32 inputs and state, else 2e-2 on outputs and 1e-2 on states); pool rows the case does not
own must stay bitwise unchanged and padding outputs exactly zero. That default check and shape
class (:func:`check_against_reference`, :func:`kernel_class`) are ``dispatch/plugin/self_check_case.py``'s,
a plugin API module that ``backends/base.py`` imports (re-exported here); this module is the runtime:
when a check runs, its results, the verdicts and the log.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from ..plugin.problem import Problem
# the default check and shape class live in the plugin API (backends/base.py uses them): re-exported
from ..plugin.self_check_case import check_against_reference, kernel_class  # noqa: F401
from ..plugin.verdict import Accepted, Check, Reason, Rejected

log = logging.getLogger("linattn")


class SelfCheckResult(BaseModel):
    """What one self-check found: the key it stands for, ``ok``, and the measured errors or failure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    arch: str
    op: str
    shape_class: str
    ok: bool
    message: str
    device: str
    seconds: float


# -- state: one log of results per dispatcher ---------------------------------------------------

def key_for(backend, p: Problem, caps) -> tuple[str, str, str, str]:
    """``(backend name, arch, op, shape class)``: what one self-check stands for."""
    return backend.name, caps.arch, p.op, backend.self_check_class(p)


class SelfChecks:
    """The self-checks one dispatcher ran: their results by key, and the ones running now.

    The dispatcher (``dispatch/runtime/selection.py``) owns one; its ``clear_cache`` resets it. Thread
    safe; re-entrant, since a backend's ``self_check`` may itself call a public op.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._results: dict[tuple[str, str, str, str], SelfCheckResult] = {}
        self._running: set[tuple[str, str, str, str]] = set()

    def result_for(self, key: tuple) -> Optional[SelfCheckResult]:
        """The recorded result for ``key``, or None when no self-check ran for it."""
        return self._results.get(key)

    def results(self) -> list[SelfCheckResult]:
        """Every self-check that ran, in the order they ran."""
        return list(self._results.values())

    def reset(self) -> None:
        """Forget every result (a later call checks again)."""
        with self._lock:
            self._results.clear()

    def run(self, backend, p: Problem, caps, device: torch.device) -> SelfCheckResult:
        """Run ``backend.self_check`` for ``p``'s key once (later calls return the recorded result).

        Args:
            backend: the backend instance.
            p: the problem of the call about to run (its shape class is checked, at small sizes).
            caps: the call's device capabilities (their ``arch`` is part of the key).
            device: the ``torch.device`` the case runs on (the call's).
        Returns:
            SelfCheckResult. A failure (a mismatch, or anything raised) is logged as a WARNING on
            the ``linattn`` logger; the backend is rejected with ``self_check_failed`` for that key
            from then on.
        """
        key = key_for(backend, p, caps)
        with self._lock:
            done = self._results.get(key)
            if done is not None:
                return done
            if key in self._running:  # the check calls its own op: let that inner call run, record nothing
                return SelfCheckResult(backend=key[0], arch=key[1], op=key[2], shape_class=key[3], ok=True,
                                       message="inside its own self-check", device=str(device), seconds=0.0)
            self._running.add(key)
            try:
                res = _timed_check(backend, p, caps, device, key)
            finally:
                self._running.discard(key)
            self._results[key] = res
        _log(res)
        return res

    def verdict_for(self, backend, p: Problem, caps, accepted: Accepted, capturing: bool):
        """``accepted`` as it stands after verification: unchanged where no self-check applies;
        ``verified=False`` with a note before the check has run (eager); rejected with
        ``unverified`` during CUDA-graph capture; rejected with ``self_check_failed`` after a
        failed check."""
        if not backend.needs_self_check(p, caps):
            return accepted
        key = key_for(backend, p, caps)
        return _verdict(backend, p, caps, accepted, capturing, key, self._results.get(key))


def _joined(note: str, plan_note: str) -> str:
    """The verification note, then the backend's own plan note (``Backend.plan_note``) if any."""
    return f"{note}; {plan_note}" if plan_note else note


def _timed_check(backend, p: Problem, caps, device, key: tuple) -> SelfCheckResult:
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            check = backend.self_check(p, caps, device)
        if not isinstance(check, Check):
            raise TypeError(f"self_check returned {type(check).__name__}, not a linattn.dispatch.Check")
        ok, message = check.ok, check.message
    except Exception as e:  # noqa: BLE001 - a raising check is a failed check, never a crashed call
        ok, message = False, f"raised {type(e).__name__}: {e}"
    return SelfCheckResult(backend=key[0], arch=key[1], op=key[2], shape_class=key[3], ok=ok,
                           message=message or ("passed" if ok else "failed"), device=str(device),
                           seconds=round(time.perf_counter() - t0, 4))


def _log(res: SelfCheckResult) -> None:
    if res.ok:
        log.info("linattn: %s passed its self-check against torch-ref on %s (%s, %s) in %.2f s: %s",
                 res.backend, res.arch, res.op, res.shape_class, res.seconds, res.message)
    else:
        log.warning("linattn: %s failed its self-check against torch-ref on %s (%s, %s): %s. It is disabled "
                    "for this shape class on %s in this process (reason self_check_failed); the dispatcher "
                    "falls back to the next backend. Please report this to the backend's authors.",
                    res.backend, res.arch, res.op, res.shape_class, res.message, res.arch)


# -- the process's log (the default dispatcher's), for callers that ask this module ----------------

def results() -> list[SelfCheckResult]:
    """Every self-check the default dispatcher ran in this process, in the order they ran."""
    return _default_log().results()


def result_for(key: tuple) -> Optional[SelfCheckResult]:
    """The default dispatcher's recorded result for ``key``, or None."""
    return _default_log().result_for(key)


def reset() -> None:
    """Forget the default dispatcher's results (``linattn.dispatch.clear_cache`` does this)."""
    _default_log().reset()


def _default_log() -> SelfChecks:
    from .selection import dispatcher  # the dispatcher owns the log; it imports this module

    return dispatcher().self_checks


# -- the verdict --------------------------------------------------------------------------------

def _archs(backend) -> str:
    return "{" + ", ".join(sorted(backend.verified_archs or ())) + "}"


def _verdict(backend, p: Problem, caps, accepted: Accepted, capturing: bool, key: tuple,
             res: Optional[SelfCheckResult]):
    arch, cls = caps.arch, key[3]
    if res is None:
        if capturing:
            return Rejected(backend=backend.name, reason=Reason.UNVERIFIED,
                            message=f"not yet self-checked on {arch} for {p.op} ({cls}); its kernels were "
                                    f"verified on {_archs(backend)} only and the self-check needs a device "
                                    f"sync, which CUDA-graph capture forbids",
                            hint="run one eager call of this shape before capture (a warm-up step); it "
                                 "self-checks then and is chosen in later captures")
        return accepted.model_copy(update={
            "verified": False,
            "message": _joined(f"unverified on {arch}: self-checks against torch-ref on its first eager call "
                               f"({p.op}, {cls}); verified on {_archs(backend)}", accepted.message)})
    if res.ok:
        return accepted.model_copy(update={
            "verified": True,
            "message": _joined(f"self-checked against torch-ref on {arch} in this process ({p.op}, {cls}): "
                               f"{res.message}", accepted.message)})
    return Rejected(backend=backend.name, reason=Reason.SELF_CHECK_FAILED,
                    message=f"its self-check against torch-ref failed on {arch} for {p.op} ({cls}): {res.message}",
                    hint=f"disabled for this shape class on {arch} until the process restarts; the dispatcher "
                         f"falls back. Report it to the backend's authors (plugin {backend.plugin!r})")
