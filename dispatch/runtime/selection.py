"""Selection: a verdict for every backend, ranking, forcing, the decision cache, and the
:class:`Dispatcher` that owns them.

One :class:`Dispatcher` holds everything selection remembers: the backend registry (loaded on
first use), the decision cache, the last decisions and the first-call self-check log. The
process has one, :func:`dispatcher`; the module functions (:func:`explain`, :func:`select`,
:func:`last_decision`, :func:`clear_cache`, :func:`get_registry`, :func:`reset_registry`, ...) are
thin wrappers over it, and nothing else in linattn keeps selection state.

``explain(problem, device)`` is the pure, uncached form used by the CLI; ``select()`` is the
cached form every op call goes through (on a call-plan miss: ``dispatch/runtime/fast_path.py``). The cache
key is (device, shape class, policy, forced backend, registry generation, CUDA-graph capture
state): the shape class is the signature without its sizes (``n``, ``t``, ``max_seqlen``) and,
per registered backend, :meth:`~linattn.backends.base.Backend.size_class`, what that backend's
predicates and rank read of the sizes. So a new prefill length or decode batch in a class already
decided costs one size-class evaluation per backend, not a verdict from each (issue 28). The
cached decision is returned with the call's own :class:`Problem`; its verdicts' messages are
those of the class's first call. The cache is a bounded LRU (``dispatch/lru.py``). Selection never touches device memory, so it never syncs and decode stays
capturable in a CUDA graph. A rejection lists every predicate that failed (``Rejected.reasons``).

One exception, eager calls only: before a backend first runs an (op, shape class) on a GPU
architecture its kernels were never verified on (``Backend.verified_archs``), ``select()`` runs
its self-check against torch-ref (:mod:`linattn.dispatch.runtime.self_check`), which syncs; a failure
disables it there (``self_check_failed``) and the next backend is chosen. During capture an
unchecked backend is rejected instead (``unverified``), which is why the capture state is part
of the key: a decision made in capture is never reused eagerly, nor the other way round.

Selection by measurement (:mod:`linattn.dispatch.plugin.tuning`): where a tuned table is in force for the
device, ``explain`` marks each accepted backend the table timed in the problem's bucket with its
time (``Accepted.measured_ms``) and those run fastest first, ahead of the untimed ones, which keep
their rank order (:func:`~linattn.dispatch.plugin.verdict.run_order`); ``Decision.tuning`` says which
table and what it holds for the bucket. The shape class then carries the bucket's two logarithms,
so the table is read on a cache miss only. With ``LINATTN_AUTOTUNE=1`` a miss in an eager call
whose bucket the table lacks measures the bucket first (``linattn/tune.py``), never in capture.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, NamedTuple, Optional, Union

import torch

from linattn.capabilities import DeviceCapabilities, probe, profile

from ..env import check_kernel_switches
from ..lru import DECISIONS_MAX, FIRST_CHOICE_LOG_MAX, LRUCache, clear_process_caches, process_caches
from .policy import Policy, current_policy
from ..plugin.problem import Problem
from .registry import ENTRY_POINT_GROUP, Registry
from .self_check import SelfChecks
from ..plugin.tuning import TUNED_OPS, Tuned, Tuning
from ..rules import value_rules
from ..plugin.verdict import (Accepted, Decision, DecisionPolicy, Failure, NoBackendError, Reason, Rejected, join_plan,
                              run_order)

log = logging.getLogger("linattn")
AUTOTUNE = "LINATTN_AUTOTUNE=1"

DeviceLike = Union[DeviceCapabilities, torch.device, str, None]

__all__ = ["CachedDecision", "Dispatcher", "backend_verdict", "clear_cache", "dispatcher", "explain", "get_registry",
           "last_decision", "note_decision", "reset_registry", "resolve_device", "select", "shape_class",
           "stream_capturing"]


# -- devices and capture ---------------------------------------------------------------------------

def resolve_device(device: DeviceLike) -> DeviceCapabilities:
    """Capabilities for a profile name, a torch device (or its string), or None (the CPU).

    Device strings (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"xpu"``) are probed; other strings are
    profile names (``"sm90"``, ``"sm100"``, ``"mi300x"``, ``"xpu-pvc"``; the CPU's profile is
    ``linattn.capabilities.profile("cpu")``). A device type linattn has no probe for is asked of
    the plugins (``linattn_probe_device``) of the process registry.

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


def stream_capturing(device: torch.device) -> bool:
    """True while the current CUDA stream is being captured into a graph (no sync allowed then).
    The one place selection asks (tests simulate capture by patching it)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# -- one backend's verdict ---------------------------------------------------------------------------

def _failures(backend, problem: Problem, caps: DeviceCapabilities) -> list[Failure]:
    """Every predicate that fails, in order. An op the backend does not implement ends the list
    (nothing else about it matters); a predicate that raises is a ``backend_error`` and ends it."""
    failures: list[Failure] = []
    for pred in backend.predicates():
        try:
            check = pred(problem, caps)
        except Exception as e:  # noqa: BLE001 - a plugin's predicate must not break dispatch
            failures.append(Failure(reason=Reason.BACKEND_ERROR, message=f"a predicate raised {type(e).__name__}: "
                                    f"{e}", hint="report it to the backend's authors"))
            break
        if not check.ok:
            failures.append(Failure(reason=check.reason, message=check.message, hint=check.hint))
            if check.reason == Reason.OP:
                break
    return failures


def backend_verdict(backend, problem: Problem, caps: DeviceCapabilities, pol: Policy, forced: Optional[str],
                    registry: Registry, self_checks: SelfChecks, capturing: bool = False):
    """The verdict of one backend: rejected with every failing reason, or accepted with its rank
    (and, where it never ran on this arch, its self-check state)."""
    name = backend.name
    if name in pol.disable:
        return Rejected(backend=name, reason=Reason.DISABLED, message=f"disabled by {pol.source}",
                        hint="remove it from LINATTN_DISABLE / policy(disable=...)")
    if name in registry.broken:
        return Rejected(backend=name, reason=Reason.BACKEND_ERROR, message=f"a run raised: {registry.broken[name]}",
                        hint="report it to the backend's authors; restart to retry it")
    try:
        failures = _failures(backend, problem, caps)
        if failures:
            return Rejected(backend=name, reasons=failures)
        refusal = backend.capture_refusal(problem, caps) if capturing else None
        if refusal:
            return Rejected(backend=name, reason=Reason.CAPTURE, message=refusal,
                            hint="run this call eagerly (outside the captured graph), or let another backend run it")
        msg = backend.needs_forcing(problem, caps)
        if msg and forced != name:
            return Rejected(backend=name, reason=Reason.NOT_FORCED, message=msg,
                            hint=f"force it: backend={name!r} or LINATTN_BACKEND={problem.phase}={name}")
        note, parts = _plan(backend, problem, caps)
        accepted = Accepted(backend=name, rank=int(backend.rank(problem, caps)), message=note, plan=parts)
        return self_checks.verdict_for(backend, problem, caps, accepted, capturing)
    except Exception as e:  # noqa: BLE001 - a plugin's rank or forcing rule must not break dispatch
        return Rejected(backend=name, reason=Reason.BACKEND_ERROR, message=f"a predicate raised {type(e).__name__}: "
                        f"{e}", hint="report it to the backend's authors")


def _plan(backend, problem: Problem, caps: DeviceCapabilities) -> tuple[str, dict[str, str]]:
    """The accepted verdict's message and plan from the backend's ``plan_parts`` (asked once): its own
    ``plan_note`` where it writes one, else the parts joined (``join_plan``, as the default ``plan_note``
    does: ``joins_parts`` marks it). The parts' names and texts as strings (a plugin's ``None``: none)."""
    parts = {str(k): str(v) for k, v in (backend.plan_parts(problem, caps) or {}).items()}
    if getattr(backend.__class__.plan_note, "joins_parts", False):
        return join_plan(parts), parts
    return backend.plan_note(problem, caps), parts


def _plugin_verdicts(registry: Registry) -> list[Rejected]:
    out = []
    for rec in registry.failed_plugins():
        reason = Reason.API_VERSION if rec.status == "api_version" else Reason.PLUGIN_LOAD_FAILED
        out.append(Rejected(backend=f"plugin:{rec.name}", reason=reason, message=rec.error,
                            hint=f"fix or upgrade the plugin's distribution {rec.distribution!r}"))
    return out


def _choose(verdicts: list, forced: Optional[str]) -> Optional[str]:
    if forced is not None:
        return forced if next(v for v in verdicts if v.backend == forced).ok else None
    accepted = sorted((v for v in verdicts if v.ok), key=run_order)
    return accepted[0].backend if accepted else None


#: the Problem fields that vary from call to call of one model: read by selection only through
#: each backend's Backend.size_class
SIZE_FIELDS = frozenset({"n", "t", "max_seqlen"})


def shape_class(problem: Problem, signature: tuple, caps: DeviceCapabilities, registry: Registry,
                tuning: Optional[Tuning] = None) -> tuple:
    """The key under which a decision for ``problem`` is cached: ``signature`` without the sizes
    (:data:`SIZE_FIELDS`), then each registered backend's name and
    :meth:`~linattn.backends.base.Backend.size_class` (a backend whose ``size_class`` raises, or returns
    something unhashable, is keyed by the exact sizes; one that does not implement the op is not
    asked). Two problems with one shape class get the same verdict from every backend: ok or not,
    reason codes, rank (``tests/dispatch/test_shape_class.py``). While a tuned table or
    autotuning applies to the device (``tuning``, default the process dispatcher's), the sizes part
    ends with ``("tuning", (log2 tokens, log2 sequences))``: the tuned table's bucket."""
    fixed = tuple(kv for kv in signature if kv[0] not in SIZE_FIELDS)
    sizes = []
    for name, b in registry.backends.items():
        if problem.op not in b.ops:  # rejected for the op whatever the sizes (reason ``op``)
            continue
        try:
            size = b.size_class(problem, caps)
            hash(size)  # an unhashable one (a list) would break every later call's cache key: as a raise
        except Exception:  # noqa: BLE001 - a plugin's size class must not break dispatch: exact sizes then
            size = (problem.n, problem.t, problem.max_seqlen)
        sizes.append((name, size))
    bucket = (tuning if tuning is not None else _DEFAULT.tuning).bucket_key(problem, caps)
    if bucket is not None:
        sizes.append(("tuning", bucket))
    return fixed, tuple(sizes)


class CachedDecision(NamedTuple):
    """One entry of the decision cache, as :meth:`Dispatcher.cached_decisions` lists it."""

    device_type: str
    device_index: Optional[int]
    signature: tuple
    policy: Policy
    backend: Optional[str]
    generation: int
    capturing: bool
    decision: Decision


# -- the dispatcher --------------------------------------------------------------------------------

class Dispatcher:
    """The registry, the decision cache, the last decisions and the self-check log, in one object.

    Args:
        registry: the backend registry to use (default: the built-ins and the installed plugins,
            loaded on first use).
        cache_size: decisions kept (least recently used dropped first; default
            :data:`~linattn.dispatch.lru.DECISIONS_MAX`).

    Example:
        >>> from linattn.dispatch import Problem, dispatcher
        >>> dispatcher().explain(Problem(op="gdn_decode", n=4, h=16, hv=32, k=128, v=128), "cpu").chosen
        'torch-chunked'
    """

    #: ``measure_bucket(bucket, device, *, dispatch)``: times a tuned-table bucket through the public ops
    #: for :meth:`autotune`. The ops layer installs it (``linattn/ops.py``: ``linattn.tune.measure_bucket``),
    #: so that this layer imports nothing above it (``tests/test_layering.py``); None: nothing to measure with.
    measure_bucket: Optional[Callable] = None

    def __init__(self, registry: Optional[Registry] = None, *, cache_size: int = DECISIONS_MAX) -> None:
        self._lock = threading.RLock()  # re-entrant: a plugin may ask for the registry while it loads
        self._registry: Optional[Registry] = registry
        self._loading: Optional[Registry] = None
        self._cache: LRUCache = LRUCache(cache_size)  # shape-class key -> (backend, Decision)
        self._local = threading.local()
        self._last_by_op: dict = {}  # op -> its last Decision, or a call plan standing for it (note_decision)
        self._logged: LRUCache = LRUCache(FIRST_CHOICE_LOG_MAX)  # (device, op, backend, reason) already logged
        self._warned_disabled: set[str] = set()
        self._warned_plugins: set[tuple[str, str]] = set()  # (variable, name) warned about (_warn_unknown_plugins)
        self.self_checks = SelfChecks()
        self.tuning = Tuning()

    # -- the registry --------------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """The registry, loaded on first use. A plugin that asks for it while it is being loaded
        (from its import or its hook, e.g. to ``add_plugin`` itself) gets the registry being
        loaded instead of deadlocking."""
        reg = self._registry
        if reg is not None:
            return reg
        with self._lock:
            if self._registry is None:
                if self._loading is not None:  # re-entered by a plugin from inside load() (same thread)
                    return self._loading
                self._loading = Registry()
                try:
                    self._registry = self._loading.load()
                finally:
                    self._loading = None
                self._warn_unknown_plugins(self._registry)
        return self._registry

    def reset(self, registry: Optional[Registry] = None) -> Registry:
        """Reload the plugins (after changing ``LINATTN_PLUGINS`` etc.) or install ``registry``;
        forget every cached decision and self-check."""
        with self._lock:
            self._registry = registry if registry is not None else Registry().load()
        self._warn_unknown_plugins(self._registry)
        self.clear_cache()
        return self._registry

    def _warn_unknown_plugins(self, reg: Registry) -> None:
        """One WARNING per name, per process, that ``LINATTN_PLUGINS`` / ``LINATTN_DISABLE_PLUGINS``
        gives and no installed plugin has (:attr:`Registry.unknown_names`): a typo there would
        otherwise load nothing, or disable nothing, silently."""
        effect = {"LINATTN_PLUGINS": "only the plugins it names load, so a misspelt one is not loaded",
                  "LINATTN_DISABLE_PLUGINS": "a misspelt name leaves the plugin it meant loaded"}
        for var, names in reg.unknown_names.items():
            new = [n for n in names if (var, n) not in self._warned_plugins]
            if not new:
                continue
            self._warned_plugins.update((var, n) for n in new)
            log.warning("linattn: %s names %s, but no installed plugin has that entry-point or distribution name "
                        "(group %r); installed plugins: %s. %s.", var, ", ".join(map(repr, new)),
                        ENTRY_POINT_GROUP, ", ".join(reg.installed) or "none", effect[var].capitalize())

    # -- explaining and selecting ---------------------------------------------------------------

    def explain(self, problem: Problem, device: DeviceLike = None, *, backend: Optional[str] = None,
                policy: Optional[Policy] = None, capturing: bool = False) -> Decision:
        """The decision trace for ``problem`` on ``device``: see :func:`explain`."""
        check_kernel_switches()  # a malformed LINATTN_CUTEDSL_* is refused here, not inside a plan's note
        caps = resolve_device(device)
        if problem.op in TUNED_OPS:  # a call of the op reads LINATTN_AUTOTUNE (shape class, autotuning): refused alike
            self.tuning.autotune(caps)
        pol = policy if policy is not None else current_policy()
        reg = self.registry
        forced, forced_by = (backend, "backend= argument") if backend else (pol.forced_for(problem.op), pol.forced_by(problem.op))
        if forced is not None and forced not in reg.backends:
            known = ", ".join(sorted(reg.backends))
            by = "LINATTN_BACKEND (env)" if forced_by == "env" else forced_by
            why = reg.why_unregistered(forced)
            raise ValueError(f"{by} forces backend {forced!r} for {problem.op}, which is not registered"
                             f"{': ' + why if why else ''}; registered: {known}. Check `linattn backends` / "
                             "`linattn plugins`.")
        self._warn_unknown_disabled(pol, reg)
        verdicts = [backend_verdict(b, problem, caps, pol, forced, reg, self.self_checks, capturing)
                    for b in reg.backends.values()]
        tuned = self.tuning.table_for(caps)
        note = tuned.note(problem) if tuned is not None else None
        if note is not None and note.measured:
            verdicts = [v.model_copy(update={"measured_ms": note.times_ms[v.backend]})
                        if v.ok and v.backend in note.times_ms else v for v in verdicts]
        verdicts += _plugin_verdicts(reg)
        return Decision(
            op=problem.op, problem=problem, device=caps.name, profile=caps.profile, verdicts=verdicts,
            chosen=_choose(verdicts, forced), forced=forced, forced_by=forced_by if forced else None,
            policy=DecisionPolicy(force=dict(pol.force), disable=sorted(pol.disable), source=pol.source),
            capturing=capturing, tuning=note,
        )

    def select(self, op: str, signature: tuple, device: torch.device, backend: Optional[str] = None):
        """The backend to run for a validated call, and its decision (cached): see :func:`select`."""
        pol = current_policy()
        reg = self.registry
        capturing = stream_capturing(device)
        problem = Problem(**dict(signature))
        caps = resolve_device(device)
        key = (device.type, device.index, shape_class(problem, signature, caps, reg, self.tuning), pol,
               backend, reg.generation, capturing)
        hit = self._cache.get(key)
        if hit is None:
            if not capturing and backend is None and pol.forced_for(op) is None and self._may_autotune(problem, caps):
                self._autotune_or_static(problem, device)
            decision = self._decide(problem, device, backend, pol, capturing)
            if decision.chosen is None:
                raise _no_backend(op, problem, decision)
            hit = (reg.backends[decision.chosen], decision)
            self._cache.put(key, hit)
            self._log_first(op, device, decision)
        elif hit[1].problem != problem:  # another call of the class: its own problem, the class's verdicts
            hit = (hit[0], hit[1].model_copy(update={"problem": problem}))
        self._local.last = hit[1]
        self._last_by_op[op] = hit[1]
        return hit

    def _may_autotune(self, problem: Problem, caps: DeviceCapabilities) -> bool:
        """``LINATTN_AUTOTUNE`` is on, the table lacks the bucket, and this thread is not measuring already
        (the measurement's own calls are forced, so they never get here; this guards a plugin that calls an op)."""
        return not getattr(self._local, "tuning", False) and self.tuning.missing(problem, caps)

    def _autotune_or_static(self, problem: Problem, device: torch.device) -> None:
        """:meth:`autotune` before a call's decision. A measurement that cannot run (its own inputs do
        not fit in the device memory the engine left, say) must not fail the call it precedes: one
        WARNING, the bucket is not measured again in this process, and the static ranks decide."""
        try:
            self.autotune(problem, device)
        except Exception as e:  # noqa: BLE001 - the call itself is still valid and is decided as without tuning
            self.tuning.skip(problem)
            log.warning("linattn: %s could not measure %s on %s (%s: %s); static ranks decide that bucket in this "
                        "process", AUTOTUNE, problem.brief(), device, type(e).__name__, str(e).splitlines()[0] if str(e)
                        else "")

    def autotune(self, problem: Problem, device: torch.device) -> Tuned:
        """Measure ``problem``'s bucket on ``device`` (every eligible backend, through the public op)
        and add it to the user's table (``LINATTN_AUTOTUNE``; ``linattn/tune.py``). Eager only: the
        measurement syncs.

        Raises:
            RuntimeError: the current stream is being captured into a CUDA graph.
        """
        if stream_capturing(device):
            raise RuntimeError("a tuning measurement syncs with the device: it cannot run during CUDA-graph capture")
        measure_bucket = Dispatcher.measure_bucket
        if measure_bucket is None:
            raise RuntimeError("no bucket measurement is installed (linattn/ops.py installs linattn.tune's on import)")
        from ..plugin.tuning import bucket_of

        self._local.tuning = True
        try:
            entry = measure_bucket(bucket_of(problem), device, dispatch=self)
        finally:
            self._local.tuning = False
        log.info("linattn: autotuned %s on %s: %s", entry.bucket.label(), device,
                 ", ".join(f"{b} {ms:.4g} ms" for b, ms in sorted(entry.times_ms.items(), key=lambda x: x[1])) or "nothing ran")
        return self.tuning.record(resolve_device(device), [entry], command=f"{AUTOTUNE} (first eager call)")

    def _decide(self, problem: Problem, device: torch.device, backend: Optional[str], pol: Policy,
                capturing: bool) -> Decision:
        """``explain()``, and while the chosen backend still needs its first-call self-check here
        (eager calls only: in capture ``explain`` rejects it), run that check and decide again."""
        backends = self.registry.backends
        decision = self.explain(problem, device, backend=backend, policy=pol, capturing=capturing)
        for _ in range(len(backends)):  # each round checks one backend, which then passes or is rejected
            if decision.chosen is None or decision.verdict(decision.chosen).verified:
                break
            try:
                chosen = backends[decision.chosen]
            except KeyError:  # registered after this snapshot: the caller's lookup fetches it unchecked
                break
            self.self_checks.run(chosen, problem, resolve_device(device), device)
            self._forget_decisions()  # decisions cached before this result may be stale
            decision = self.explain(problem, device, backend=backend, policy=pol, capturing=capturing)
        return decision

    def _log_first(self, op: str, device: torch.device, decision: Decision) -> None:
        """The first choice of a backend for an op on a device, for each reason (ranked first, or
        forced and by whom), once at INFO with the runners-up (and a warning when a GPU falls back
        to the reference without being told to). Not once per signature: an engine's ever new
        shapes would log a line each and keep a key each (F41)."""
        logkey = (device.type, device.index, op, decision.chosen, decision.forced_by or "ranked first")
        if self._logged.get(logkey) is not None:
            return
        self._logged.put(logkey, True)
        log.info("linattn: %s on %s -> %s (runners-up: %s)", op, decision.device, decision.chosen,
                 ", ".join(decision.runners_up) or "none")
        if device.type != "cpu" and decision.chosen == "torch-ref" and not decision.forced:
            log.warning("linattn: %s on %s falls back to the token-serial reference (slow): %s",
                        op, decision.device, decision.summary())

    def _warn_unknown_disabled(self, pol: Policy, reg: Registry) -> None:
        for name in sorted(pol.disable - set(reg.backends) - self._warned_disabled):
            self._warned_disabled.add(name)
            log.warning("linattn: %s disables %r, which is not a registered backend (registered: %s); "
                        "a typo disables nothing", pol.source, name, ", ".join(sorted(reg.backends)))

    # -- what it remembers -------------------------------------------------------------------------

    def note_decision(self, op: str, decision) -> None:
        """Record ``decision`` as the last one (of this thread, and of ``op``): for calls that reuse a
        cached call plan (``dispatch/runtime/fast_path.py``) instead of calling :meth:`select`. ``decision``:
        a :class:`Decision`, or an object whose ``decision`` attribute gives one (a call plan, whose
        decision for a new length is made only when read), read by :meth:`last_decision`."""
        self._local.last = decision
        self._last_by_op[op] = decision

    def last_decision(self, op: Optional[str] = None) -> Optional[Decision]:
        """The decision behind the last op call (in this thread), or the last call of ``op`` (any thread)."""
        got = self._last_by_op.get(op) if op is not None else getattr(self._local, "last", None)
        return got if got is None or isinstance(got, Decision) else got.decision

    def cached_decisions(self) -> list[CachedDecision]:
        """The decision cache's entries, each with the parts of its key (a snapshot; ``signature`` is
        the shape class, :func:`shape_class`)."""
        return [CachedDecision(*key, decision) for key, (_, decision) in list(self._cache.items())]

    def clear(self) -> None:
        """Empty every per-process cache, in one place (issue 30): :meth:`clear_cache`'s (this
        dispatcher's decisions, first-choice log lines, self-check results and tuned tables read;
        the call and class plans, with the prepared launches they hold) and, for the process's
        dispatcher (:func:`dispatcher`), every other module-level cache of the call path
        (:data:`~linattn.dispatch.lru.PROCESS_CACHES`: input-copy plans, policies, memoised
        configurations and probes, compiled kernels). Results after it are bitwise those before
        (``tests/dispatch/test_cache_owner.py``); only their cost differs."""
        self.clear_cache()
        if self is _DEFAULT:
            clear_process_caches()

    def clear_cache(self) -> None:
        """Forget cached decisions, first-choice log lines, self-check results, call plans and the
        tuned tables read (the next decision reads them again); the caches of what does not
        change with them (probes, configurations, compiled kernels) stay: :meth:`clear` drops all."""
        self.tuning.reload()
        self._forget_decisions()
        self._logged.clear()
        self.self_checks.reset()

    def caches(self) -> dict:
        """This dispatcher's caches and (the process's dispatcher) the module-level ones it clears, by
        name: each a dict or a ``functools.lru_cache`` function (:func:`~linattn.dispatch.lru.cache_size`)."""
        own = {"decisions": self._cache, "first_choice_log": self._logged, "self_checks": self.self_checks._results,
               "tuned_tables": self.tuning._tables}
        return {**own, **process_caches()} if self is _DEFAULT else own

    def tuning_changed(self) -> None:
        """Read the tuned tables again and forget the decisions and call plans made under the old
        ones (after ``linattn tune`` wrote a table in this process)."""
        self.tuning.reload()
        self._forget_decisions()

    def _forget_decisions(self) -> None:
        self._cache.clear()
        if self is _DEFAULT:
            _clear_call_plans()


def _clear_call_plans() -> None:
    from . import fast_path  # the per-call plans are keyed on the default dispatcher's decisions

    fast_path.clear()


def _no_backend(op: str, problem: Problem, decision: Decision) -> NoBackendError:
    if decision.forced:
        head = (f"{op}: forced backend {decision.forced!r} ({decision.forced_by}) is not eligible for "
                f"{problem.brief()} on {decision.device}")
    else:
        head = f"{op}: no backend accepts {problem.brief()} on {decision.device}"
    return NoBackendError(decision, head)


_DEFAULT = Dispatcher()


def _value_check_hook():
    """The registry's value-check hook (the Triton backends'), for ``dispatch/rules/value_rules.py``."""
    return _DEFAULT.registry.value_check_hook


value_rules.hook_source = _value_check_hook


def dispatcher() -> Dispatcher:
    """The process's dispatcher (what every public op call, ``linattn.explain`` and the CLI use)."""
    return _DEFAULT


# -- the public functions: thin wrappers over the process's dispatcher ----------------------------------

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
        Decision: ``chosen`` is None when nothing fits or the forced backend is not eligible. A
        rejected verdict lists every failing reason (``reasons``; ``reason`` is the first). An
        accepted verdict with ``verified=False`` is a backend whose kernels were never verified
        on this arch: its first eager call self-checks against torch-ref.
    Raises:
        ValueError: ``backend`` (or a policy's forced backend) names no registered backend.
        ConfigError: a malformed ``LINATTN_*`` switch a call would refuse (``LINATTN_AUTOTUNE`` for a
            decode or prefill op, ``LINATTN_CUTEDSL_*``).
    Example:
        >>> from linattn.dispatch import Problem, explain
        >>> explain(Problem(op="gdn_decode", n=4, h=16, hv=32, k=128, v=128), "cpu").chosen
        'torch-chunked'
    """
    return _DEFAULT.explain(problem, device, backend=backend, policy=policy, capturing=capturing)


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
    return _DEFAULT.select(op, signature, device, backend)


def note_decision(op: str, decision: Decision) -> None:
    """Record ``decision`` as the last one (see :meth:`Dispatcher.note_decision`)."""
    _DEFAULT.note_decision(op, decision)


def last_decision(op: Optional[str] = None) -> Optional[Decision]:
    """The decision behind the last op call (in this thread), or the last call of ``op`` (any thread)."""
    return _DEFAULT.last_decision(op)


def clear_cache() -> None:
    """Forget cached decisions and self-check results (resetting the registry does this too)."""
    _DEFAULT.clear_cache()


def get_registry() -> Registry:
    """The process-wide registry (the dispatcher's), loaded on first use."""
    return _DEFAULT.registry


def reset_registry(registry: Optional[Registry] = None) -> Registry:
    """Reload plugins (after changing ``LINATTN_PLUGINS`` etc.) or install a given registry."""
    return _DEFAULT.reset(registry)
