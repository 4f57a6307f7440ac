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
call (``dispatch/validate.py``) and run under ``torch.no_grad()``; the reference runs on float64 CPU
copies. The comparison is :mod:`linattn.testing.compare`'s, at its tolerances (docs/ops.md: 1e-5
with fp32 inputs and state, else 2e-2 on outputs and 1e-2 on states); pool rows the case does not
own must stay bitwise unchanged and padding outputs exactly zero.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from linattn.testing import inputs
from linattn.testing.compare import Comparison, tolerance_for
from linattn.testing.inputs import (DECODE_INTERMEDIATE, PREFILL_CHECKPOINTS_WRITTEN, PREFILL_LENS, PREFILL_OUT_SLOTS,
                                    PREFILL_SLOTS)

from .ops_table import FLAGS
from .problem import Problem
from .registry import reference
from .verdict import Accepted, Check, Reason, Rejected

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


def kernel_class(p: Problem) -> str:
    """The default shape class of ``p``: what the built-in kernels specialise on, as one line.

    Decode and prefill: q/k/v dtype, state dtype and layout, prefill mode, ``H``, ``HV``, ``K``,
    ``V`` and the optional features; gating: dtype, ``HV`` (and ``K`` for KDA), the bounded gate;
    the clamp: dtype, ``D``, whether a limit is given. Never ``N`` or ``T`` (runtime sizes).

    Example:
        >>> kernel_class(Problem(op="gdn_prefill", n=4, t=8192, h=16, hv=32, k=128, v=128))
        'bfloat16 state=float32/vk pool H=16 HV=32 K=128 V=128'
    """
    if p.spec.method == "clamp":
        return f"{p.dtype} D={p.d}" + (" limit" if p.clamp_limit else "")
    if p.phase == "gating":
        return f"{p.dtype} HV={p.hv}" + (f" K={p.k}" if p.spec.per_channel_gates else "") + (
            " lower_bound" if p.lower_bound else "")
    flags = [f.name for f in FLAGS if getattr(p, f.name)]  # the op table's flags, in Problem's order
    mode = f" {p.mode}" if p.phase == "prefill" else ""
    return (f"{p.dtype} state={p.state_dtype}/{p.state_layout}{mode} H={p.h} HV={p.hv} K={p.k} V={p.v}"
            + "".join(f" {f}" for f in flags))


# -- state: one log of results per dispatcher ---------------------------------------------------

def key_for(backend, p: Problem, caps) -> tuple[str, str, str, str]:
    """``(backend name, arch, op, shape class)``: what one self-check stands for."""
    return backend.name, caps.arch, p.op, backend.self_check_class(p)


class SelfChecks:
    """The self-checks one dispatcher ran: their results by key, and the ones running now.

    The dispatcher (``dispatch/selection.py``) owns one; its ``clear_cache`` resets it. Thread
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


# -- the default check ---------------------------------------------------------------------------

def _gen(p: Problem) -> torch.Generator:
    """The case's generator, seeded by ``"op|shape class"``."""
    return inputs.generator(f"{p.op}|{kernel_class(p)}")


def _as_check(c: Comparison) -> Check:
    if not c.ok:
        return Check.failed(Reason.SELF_CHECK_FAILED, c.message())
    return Check.passed(c.summary())


def check_against_reference(backend, p: Problem, device) -> Check:
    """The default :meth:`~linattn.backends.base.Backend.self_check`: a small case of ``p``'s shape
    class through ``backend.run`` on ``device``, against torch-ref in float64 on the CPU.

    Args:
        backend: the backend under test.
        p: the problem whose shape class is checked (dtypes, layout, mode, heads, flags; small sizes).
        device: a ``torch.device`` (or string) to run the backend on.
    Returns:
        Check: passed with the measured relative errors, or failed (reason ``self_check_failed``)
        naming every difference (errors beyond docs/ops.md's tolerances, non-finite values, padding not
        zero, pool rows not owned by the case changed).
    Raises:
        whatever the backend raises (the caller records it as a failure).
    Example:
        >>> from linattn.backends.torch_ref import TorchRefBackend
        >>> p = Problem(op="gdn_decode", n=1, t=1, h=1, hv=2, k=8, v=8, dtype="float32")
        >>> check_against_reference(TorchRefBackend(), p, "cpu").ok
        True
    """
    from .validate import validate

    device = torch.device(device)
    tensors, opts = inputs.CASES[p.phase](p, _gen(p), device)
    args = {**tensors, **opts}
    ref_args = {n: inputs.to_float64(x) for n, x in args.items()}
    before = {n: x.detach().cpu().clone() for n, x in tensors.items() if n in ("state_pool", "intermediate_states")}
    nargs, _ = validate(p.op, args, check_values=True)
    out = backend.run(p.op, **nargs)
    ref = reference(p.op)  # torch-ref's, loaded by name through the registry (dispatch/ imports no backend)
    c = Comparison()
    tol_o, tol_s = tolerance_for(p)
    if p.phase == "prefill":
        ro, rfinal = ref(**ref_args, compute_dtype=torch.float64)
        o, final = out if isinstance(out, tuple) else (out, None)
        c.close("o", o, ro, tol_o)
        cu = [0, *torch.tensor(PREFILL_LENS).cumsum(0).tolist()]
        if p.mode == "pool":
            pad = [t for n, s in enumerate(PREFILL_SLOTS) if s < 0 for t in range(cu[n], cu[n + 1])]
            c.zero("o", o[pad], "tokens of the padding sequence (slot -1)")
            written = PREFILL_OUT_SLOTS if p.output_state_indices else PREFILL_SLOTS
            written += PREFILL_CHECKPOINTS_WRITTEN if p.checkpoints else ()
            owned = sorted({s for s in written if s >= 0})
            c.close("state", args["state_pool"][owned], ref_args["state_pool"][owned], tol_s)
            c.untouched("state_pool", args["state_pool"], before["state_pool"], set(owned), "pool rows")
        elif final is None:
            c.fail("dense mode returned no final state")
        else:
            c.close("final_state", final, rfinal, tol_s)
    elif p.phase == "decode":
        ro = ref(**ref_args, compute_dtype=torch.float64)
        c.close("o", out, ro, tol_o)
        owned, padding = inputs.decode_rows(tensors, opts)
        c.zero("o", out[padding], "padding rows (slot -1)")
        if owned:
            rows = sorted(owned)
            c.close("state", args["state_pool"][rows], ref_args["state_pool"][rows], tol_s)
        c.untouched("state_pool", args["state_pool"], before["state_pool"], owned, "pool rows")
        if p.intermediate_states:
            rows = sorted({r for n, r in enumerate(DECODE_INTERMEDIATE) if r >= 0 and n not in padding})
            c.close("intermediate_states", args["intermediate_states"][rows], ref_args["intermediate_states"][rows],
                    tol_s)
    elif p.phase == "gating":
        rg, rb = ref(**ref_args, compute_dtype=torch.float64)
        g, beta = out
        c.close("g", g, rg, tol_o)
        c.close("beta", beta, rb, tol_o)
    else:
        ref_out = ref(ref_args["x"], ref_args["limit"], compute_dtype=torch.float64)
        c.close("out", out, ref_out, tol_o)
    return _as_check(c)
