"""Selection: a verdict for every backend, ranking, forcing, the decision cache.

``explain(problem, device)`` is the pure, uncached form used by the CLI; ``select()`` is the
cached form every op call goes through. The cache key is (device, problem signature, policy,
forced backend, registry generation); a hit is one tuple build and one dict lookup. Selection
never touches device memory, so it never syncs and decode stays capturable in a CUDA graph.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional, Union

import torch

from linattn.capabilities import DeviceCapabilities, probe, profile

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
        ValueError: neither a known profile nor a device string, or a device that is not present.
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
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} was asked for but no CUDA/ROCm device is visible to torch "
                         f"{torch.__version__}; use a profile (e.g. 'sm90') to ask what would be chosen there")
    custom = get_registry().probe_device(dev) if dev.type not in ("cpu", "cuda") else None
    return custom if custom is not None else probe(dev)


def _verdict(backend, problem: Problem, caps: DeviceCapabilities, pol: Policy, forced: Optional[str]):
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
        return Accepted(backend=name, rank=int(backend.rank(problem, caps)))
    except Exception as e:  # noqa: BLE001 - a plugin's predicate must not break dispatch
        return Rejected(backend=name, reason=Reason.BACKEND_ERROR,
                        message=f"a predicate raised {type(e).__name__}: {e}", hint="report it to the backend's authors")


def explain(problem: Problem, device: DeviceLike = None, *, backend: Optional[str] = None,
            policy: Optional[Policy] = None) -> Decision:
    """The decision trace for ``problem`` on ``device``: a verdict for every registered backend.

    Args:
        problem: what is asked (:class:`Problem`).
        device: a profile name (``"sm90"``, ``"sm100"``, ``"mi300x"``, ``"xpu-pvc"``, ``"cpu"``),
            a torch device, :class:`DeviceCapabilities`, or None for the CPU.
        backend: force this backend (as a call's ``backend=`` does).
        policy: the policy to apply (default: the current scoped/env policy).
    Returns:
        Decision: ``chosen`` is None when nothing fits or the forced backend is not eligible.
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
    verdicts = [_verdict(b, problem, caps, pol, forced) for b in reg.backends.values()]
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
    """Forget cached decisions (the registry does this when it changes)."""
    _cache.clear()
    _logged.clear()


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
    """
    pol = current_policy()
    reg = get_registry()
    key = (device.type, device.index, signature, pol, backend, reg.generation)
    hit = _cache.get(key)
    if hit is None:
        problem = Problem(**dict(signature))
        decision = explain(problem, device, backend=backend, policy=pol)
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
