"""Selection: a verdict for every backend, ranking, forcing, the decision cache.

``explain(problem, device)`` is the pure, uncached form used by the CLI; ``select()`` is the
cached form every op call goes through. The cache key is (device, problem signature, policy,
forced backend, registry generation, CUDA-graph capture state); a hit is one tuple build and one
dict lookup. Selection never touches device memory, so it never syncs and decode stays
capturable in a CUDA graph.

One exception, eager calls only: before a backend first runs an (op, shape class) on a GPU
architecture its kernels were never verified on (``Backend.verified_archs``), ``select()`` runs
its self-check against torch-ref (:mod:`linattn.dispatch.self_check`), which syncs; a failure
disables it there (``self_check_failed``) and the next backend is chosen. During capture an
unchecked backend is rejected instead (``unverified``), which is why the capture state is part
of the key: a decision made in capture is never reused eagerly, nor the other way round.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional, Union

import torch

from linattn.capabilities import DeviceCapabilities, probe, profile

from . import self_check as _self_check
from .policy import Policy, current_policy
from .problem import Problem
from .registry import get_registry
from .verdict import Accepted, Decision, NoBackendError, Reason, Rejected

log = logging.getLogger("linattn")

DeviceLike = Union[DeviceCapabilities, torch.device, str, None]


def resolve_device(device: DeviceLike) -> DeviceCapabilities:
    """Capabilities for a profile name, a torch device (or its string), or None (the CPU).

    Device strings (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"xpu"``) are probed; other strings are
    profile names (``"sm90"``, ``"sm100"``, ``"mi300x"``, ``"xpu-pvc"``; the CPU's profile is
    ``linattn.capabilities.profile("cpu")``).

    Raises:
        ValueError: neither a known profile nor a device string, a device that is not present, or
            the ``meta`` device (shapes without data: nothing can run there).
    """
    if isinstance(device, DeviceCapabilities):
        return device
    if isinstance(device, str):
        from linattn.capabilities import PROFILES

        if device in PROFILES and device != "cpu":
            return profile(device)
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{device!r} is neither a device profile ({', '.join(sorted(PROFILES))}) nor a "
                             f"torch device string ('cpu', 'cuda', 'cuda:1', 'xpu')") from None
    dev = device if device is not None else torch.device("cpu")
    if dev.type == "meta":
        raise ValueError("device 'meta' holds shapes but no data, so no backend can run or be asked about "
                         "there; use a real device ('cpu', 'cuda') or a profile (e.g. 'sm90'); for shapes "
                         "only, trace with torch.compile or FakeTensorMode (the ops' fake implementations)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} was asked for but no CUDA/ROCm device is visible to torch "
                         f"{torch.__version__}; use a profile (e.g. 'sm90') to ask what would be chosen there")
    custom = get_registry().probe_device(dev) if dev.type not in ("cpu", "cuda") else None
    return custom if custom is not None else probe(dev)


def _verdict(backend, problem: Problem, caps: DeviceCapabilities, pol: Policy, forced: Optional[str],
             capturing: bool = False):
    name = backend.name
    reg = get_registry()
    if name in pol.disable:
        return Rejected(backend=name, reason=Reason.DISABLED, message=f"disabled by {pol.source}",
                        hint="remove it from LINATTN_DISABLE / policy(disable=...)")
    if name in reg.broken:
        return Rejected(backend=name, reason=Reason.BACKEND_ERROR, message=f"a run raised: {reg.broken[name]}",
                        hint="report it to the backend's authors; restart to retry it")
    try:
        for pred in backend.predicates():
            check = pred(problem, caps)
            if not check.ok:
                return Rejected(backend=name, reason=check.reason, message=check.message, hint=check.hint)
        needs = getattr(backend, "needs_forcing", None)
        msg = needs(problem, caps) if needs is not None else None
        if msg and forced != name:
            return Rejected(backend=name, reason=Reason.NOT_FORCED, message=msg,
                            hint=f"force it: backend={name!r} or LINATTN_BACKEND={problem.phase}={name}")
        accepted = Accepted(backend=name, rank=int(backend.rank(problem, caps)))
        return _self_check.verdict_for(backend, problem, caps, accepted, capturing)
    except Exception as e:  # noqa: BLE001 - a plugin's predicate must not break dispatch
        return Rejected(backend=name, reason=Reason.BACKEND_ERROR,
                        message=f"a predicate raised {type(e).__name__}: {e}", hint="report it to the backend's authors")


def explain(problem: Problem, device: DeviceLike = None, *, backend: Optional[str] = None,
            policy: Optional[Policy] = None, capturing: bool = False) -> Decision:
    """The decision trace for ``problem`` on ``device``: a verdict for every registered backend.

    Args:
        problem: what is asked (:class:`Problem`).
        device: a profile name (``"sm90"``, ``"sm100"``, ``"mi300x"``, ``"xpu-pvc"``, ``"cpu"``),
            a torch device, :class:`DeviceCapabilities`, or None for the CPU.
        backend: force this backend (as a call's ``backend=`` does).
        policy: the policy to apply (default: the current scoped/env policy).
        capturing: decide as for a call during CUDA-graph capture: a backend that still needs its
            first-call self-check on this arch is rejected (``unverified``) instead of accepted
            with ``verified=False``. ``explain`` itself never runs a self-check.
    Returns:
        Decision: ``chosen`` is None when nothing fits or the forced backend is not eligible. An
        accepted verdict with ``verified=False`` is a backend whose kernels were never verified
        on this arch: its first eager call self-checks against torch-ref.
    Raises:
        ValueError: ``backend`` (or a policy's forced backend) names no registered backend.
    Example:
        >>> from linattn.dispatch import Problem, explain
        >>> explain(Problem(op="gdn_decode", n=4, h=16, hv=32, k=128, v=128), "cpu").chosen
        'torch-ref'
    """
    caps = resolve_device(device)
    pol = policy if policy is not None else current_policy()
    reg = get_registry()
    forced, forced_by = (backend, "backend= argument") if backend else (pol.forced_for(problem.op), pol.source)
    if forced is not None and forced not in reg.backends:
        known = ", ".join(sorted(reg.backends))
        raise ValueError(f"{forced_by} forces backend {forced!r} for {problem.op}, which is not registered; "
                         f"registered: {known}. Check `linattn backends` / `linattn plugins`.")
    _warn_unknown_disabled(pol, reg)
    verdicts = [_verdict(b, problem, caps, pol, forced, capturing) for b in reg.backends.values()]
    for rec in reg.failed_plugins():
        reason = Reason.API_VERSION if rec.status == "api_version" else Reason.PLUGIN_LOAD_FAILED
        verdicts.append(Rejected(backend=f"plugin:{rec.name}", reason=reason, message=rec.error,
                                 hint=f"fix or upgrade the plugin's distribution {rec.distribution!r}"))
    if forced is not None:
        ok = next(v for v in verdicts if v.backend == forced).ok
        chosen = forced if ok else None
    else:
        accepted = sorted((v for v in verdicts if v.ok), key=lambda v: (v.rank, v.backend))
        chosen = accepted[0].backend if accepted else None
    return Decision(
        op=problem.op, problem=problem.model_dump(), device=caps.name, profile=caps.profile,
        verdicts=verdicts, chosen=chosen, forced=forced, forced_by=forced_by if forced else None,
        policy={"force": dict(pol.force), "disable": sorted(pol.disable), "source": pol.source},
        capturing=capturing,
    )


_warned_disabled: set[str] = set()


def _warn_unknown_disabled(pol: Policy, reg) -> None:
    for name in sorted(pol.disable - set(reg.backends) - _warned_disabled):
        _warned_disabled.add(name)
        log.warning("linattn: %s disables %r, which is not a registered backend (registered: %s); "
                    "a typo disables nothing", pol.source, name, ", ".join(sorted(reg.backends)))


# -- the cached path every op call takes ---------------------------------------------------------

_cache: dict[tuple, tuple[object, Decision]] = {}
_CACHE_MAX = 4096
_local = threading.local()
_last_by_op: dict[str, Decision] = {}
_logged: set[tuple] = set()


def clear_cache() -> None:
    """Forget cached decisions and self-check results (the registry does this when it is reset)."""
    _cache.clear()
    _logged.clear()
    _self_check.reset()


def stream_capturing(device: torch.device) -> bool:
    """True while the current CUDA stream is being captured into a graph (no sync allowed then).
    The one place selection asks (tests simulate capture by patching it)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _decide(problem: Problem, device: torch.device, backend: Optional[str], pol: Policy,
            capturing: bool) -> Decision:
    """``explain()``, and while the chosen backend still needs its first-call self-check here
    (eager calls only: in capture ``explain`` rejects it), run that check and decide again."""
    backends = get_registry().backends
    decision = explain(problem, device, backend=backend, policy=pol, capturing=capturing)
    for _ in range(len(backends)):  # each round checks one backend, which then passes or is rejected
        if decision.chosen is None or decision.verdict(decision.chosen).verified:
            break
        try:
            chosen = backends[decision.chosen]
        except KeyError:  # registered after this snapshot: the caller's lookup fetches it unchecked
            break
        _self_check.run_self_check(chosen, problem, resolve_device(device), device)
        _cache.clear()  # decisions cached before this result may be stale
        decision = explain(problem, device, backend=backend, policy=pol, capturing=capturing)
    return decision


def select(op: str, signature: tuple, device: torch.device, backend: Optional[str] = None):
    """The backend to run for a validated call, and its decision (cached).

    Args:
        op: the op name.
        signature: the validation layer's hashable problem signature.
        device: the device of the call's tensors.
        backend: a per-call forced backend, or None.
    Returns:
        (backend instance, Decision)
    Raises:
        NoBackendError: nothing fits, or the forced backend is not eligible (with every reason).

    On a miss in an eager call, a chosen backend whose kernels were never verified on this
    device's arch first passes its self-check (once per process and shape class; see the module
    docstring) or is rejected with ``self_check_failed`` and the next one is chosen.
    """
    pol = current_policy()
    reg = get_registry()
    capturing = stream_capturing(device)
    key = (device.type, device.index, signature, pol, backend, reg.generation, capturing)
    hit = _cache.get(key)
    if hit is None:
        problem = Problem(**dict(signature))
        decision = _decide(problem, device, backend, pol, capturing)
        if decision.chosen is None:
            if decision.forced:
                head = (f"{op}: forced backend {decision.forced!r} ({decision.forced_by}) is not eligible for "
                        f"{problem.brief()} on {decision.device}")
            else:
                head = f"{op}: no backend accepts {problem.brief()} on {decision.device}"
            raise NoBackendError(decision, head)
        hit = (reg.backends[decision.chosen], decision)
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = hit
        logkey = (device.type, device.index, signature, decision.chosen)
        if logkey not in _logged:
            _logged.add(logkey)
            log.info("linattn: %s on %s -> %s (runners-up: %s)", op, decision.device, decision.chosen,
                     ", ".join(decision.runners_up) or "none")
            if device.type != "cpu" and decision.chosen == "torch-ref" and not decision.forced:
                log.warning("linattn: %s on %s falls back to the token-serial reference (slow): %s",
                            op, decision.device, decision.summary())
    _local.last = hit[1]
    _last_by_op[op] = hit[1]
    return hit


def last_decision(op: Optional[str] = None) -> Optional[Decision]:
    """The decision behind the last op call (in this thread), or the last call of ``op`` (any thread)."""
    if op is not None:
        return _last_by_op.get(op)
    return getattr(_local, "last", None)
