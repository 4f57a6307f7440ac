"""The conformance suite: generate a backend's cases, run them, apply the xfail file, report.

:func:`run_suite` is what ``linattn check`` and the pytest plugin call. The report is data
(:class:`SuiteReport`, a frozen pydantic model) rendered as a table or as ``--json``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Literal, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from linattn.dispatch import get_registry, resolve_device
from linattn.dispatch.plugin.verdict import Reason

from .cases import Case, base_spec, generate_cases, problem_of
from .execute import Outcome, execute
from .xfail import XfailRule, match

from linattn._namespace import public_dir

__all__ = ["Status", "UNAVAILABLE", "CaseResult", "SuiteReport", "availability", "apply_xfail", "run_case", "plan",
           "run_suite"]
__dir__ = public_dir(__name__, __all__)

Status = Literal["passed", "failed", "skipped", "xfail", "xpass"]
#: Reasons that mean "this backend does not run on this device", not "this case is declined".
UNAVAILABLE = frozenset({Reason.DEVICE, Reason.ARCH, Reason.TOOLCHAIN, Reason.INTERPRETER, Reason.DISABLED})


class CaseResult(BaseModel):
    """One case's result. ``errors`` holds the relative errors measured against the reference."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    op: str
    kind: str
    status: Status
    message: str = ""
    what: str = ""
    errors: dict[str, float] = {}
    xfail_reason: str = ""
    seconds: float = 0.0


class SuiteReport(BaseModel):
    """The suite's result for one backend on one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    plugin: str
    distribution: str
    version: str
    device: str
    results: list[CaseResult]
    notes: list[str] = []
    #: Per declared op that was asked for: None when the backend runs it on this device, else why
    #: not (``[reason] message`` of its rejection: device, arch, toolchain...).
    availability: dict[str, Optional[str]] = {}

    @property
    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("passed", "failed", "skipped", "xfail", "xpass")}
        for r in self.results:
            out[r.status] += 1
        return out

    @property
    def ok(self) -> bool:
        """True when no case failed (xfail and non-strict xpass do not fail the suite).

        Not a verdict on its own: a backend that is not available on the device runs its negative
        cases only (``available`` is False); :attr:`status` tells the two apart."""
        return not any(r.status == "failed" for r in self.results)

    @property
    def available(self) -> bool:
        """False when every declared op asked for is unavailable on this device, so no accuracy or
        pool case ran (only the negative ones). True when none of its declared ops was asked for."""
        return not self.availability or any(why is None for why in self.availability.values())

    @property
    def status(self) -> Literal["passed", "failed", "not_available"]:
        """``failed`` (a case failed); ``not_available`` (accuracy or pool cases were asked for but
        the backend runs none of its ops on this device, so only negative cases ran: not a pass);
        else ``passed``."""
        if not self.ok:
            return "failed"
        wanted = any(r.kind in ("accuracy", "pool") for r in self.results)
        return "not_available" if wanted and not self.available else "passed"

    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "failed"]

    def to_dict(self) -> dict:
        d = self.model_dump()
        # in JSON, "ok" is false for a backend that does not run here (its status says not_available)
        d["counts"], d["ok"], d["available"], d["status"] = (self.counts, self.ok and self.status != "not_available",
                                                             self.available, self.status)
        return d


def _forget_broken(name: str) -> None:
    """Cases are independent: a run that raised in one case must not reject the next ones."""
    get_registry().forget_broken(name)


def availability(backend, ops: Sequence[str], device) -> dict[str, Optional[str]]:
    """Per declared op: None when the backend can run it here, else why not (device, toolchain...)."""
    import linattn

    out: dict[str, Optional[str]] = {}
    for op in ops:
        if op not in backend.ops:
            continue
        # a torch.device, not the string: "cpu" alone would name the static "cpu" profile
        d = linattn.explain(problem_of(op, base_spec(op, backend)), torch.device(device), backend=backend.name)
        v = d.verdict(backend.name)
        out[op] = None if v.ok or v.reason not in UNAVAILABLE else f"[{v.reason.value}] {v.message}"
    return out


def apply_xfail(result: CaseResult, rules: Sequence[XfailRule]) -> CaseResult:
    """Turn a matching failure into ``xfail`` and a matching pass into ``xpass`` (failed if strict)."""
    rule = match(rules, result.id)
    if rule is None or result.status == "skipped":
        return result
    if result.status == "failed":
        return result.model_copy(update=dict(status="xfail", xfail_reason=rule.reason))
    if rule.strict:
        return result.model_copy(update=dict(status="failed", xfail_reason=rule.reason,
                                             message=f"passes although the xfail file (strict) says: {rule.reason}; "
                                                     f"remove the entry {rule.case!r}"))
    return result.model_copy(update=dict(status="xpass", xfail_reason=rule.reason))


def run_case(case: Case, device="cpu", rules: Sequence[XfailRule] = ()) -> CaseResult:
    """Run one case and apply the xfail rules."""
    _forget_broken(case.backend)
    t0 = time.perf_counter()
    out: Outcome = execute(case, device)
    res = CaseResult(id=case.id, op=case.op, kind=case.kind, status=out.status, message=out.message,
                     what=case.what, errors=out.errors, seconds=round(time.perf_counter() - t0, 4))
    _forget_broken(case.backend)
    return apply_xfail(res, rules)


def plan(backend_name: str, ops: Optional[Iterable[str]] = None, device=None, kinds=None):
    """The backend instance, the device string and the cases (what :func:`run_suite` will run).

    Raises:
        ValueError: ``backend_name`` is not registered (the message lists what is), an unknown op,
            or a device this torch build cannot use.
    """
    reg = get_registry()
    if backend_name not in reg.backends:
        why = reg.why_unregistered(backend_name)
        failed = "; ".join(f"{p.name}: {p.status} ({p.error})" for p in reg.failed_plugins())
        raise ValueError(f"no backend named {backend_name!r} is registered" + (f": {why}" if why else "")
                         + f"; registered: {', '.join(sorted(reg.backends))}"
                         + (f". Plugins that failed: {failed}" if failed else "")
                         + (". See `linattn plugins`." if why.startswith("its plugin") else
                            ". Install its distribution (pip install -e <path>) and see `linattn plugins`."))
    backend = reg.backends[backend_name]
    dev = str(device) if device is not None else "cpu"
    try:  # an unknown or absent device fails here, before any case
        torch.empty(0, device=dev)
        caps = resolve_device(torch.device(dev))
    except (RuntimeError, AssertionError) as e:
        raise ValueError(f"device {dev!r} is not usable here ({type(e).__name__}: {e}); pass --device cpu, "
                         f"or a device this torch build supports") from e
    return backend, dev, generate_cases(backend, ops=ops, kinds=kinds, caps=caps)


def run_suite(backend_name: str, ops: Optional[Iterable[str]] = None, device=None,
              xfail: Sequence[XfailRule] = (), kinds=None,
              on_result: Optional[Callable[[CaseResult, int, int], None]] = None) -> SuiteReport:
    """Run the conformance suite of one registered backend.

    Args:
        backend_name: a registered backend (``linattn backends``).
        ops: restrict to these ops (default all; undeclared ops give negative cases).
        device: a torch device string (``"cpu"``, ``"cuda:0"``); default the CPU.
        xfail: rules from :func:`linattn.testing.load_xfail`.
        kinds: restrict to these case kinds (``accuracy``, ``pool``, ``negative``, ``contract``).
        on_result: called after each case with ``(result, index, total)`` (progress bars).
    Returns:
        :class:`SuiteReport`; ``report.ok`` is False when a case failed; ``report.status`` is
        ``not_available`` when the backend cannot run any op asked for on ``device`` (its accuracy
        and pool cases are skipped with the reason, only the negative cases run).
    Raises:
        ValueError: an unknown backend or op.
    Example:
        >>> from linattn.testing import run_suite
        >>> run_suite("torch-ref", ops=["silu_and_mul_clamp"], kinds=["accuracy"]).ok
        True
    """
    backend, dev, cases = plan(backend_name, ops, device, kinds)
    ops = list(dict.fromkeys(c.op for c in cases))
    avail = availability(backend, ops, dev)
    notes = [f"{op}: not available on {dev}: {why}" for op, why in avail.items() if why]
    notes += [f"{op}: not declared by {backend.name}: only its refusal was checked (no accuracy or pool case)"
              for op in ops if op not in backend.ops]
    results: list[CaseResult] = []
    for i, case in enumerate(cases):
        why = avail.get(case.op)
        if why and case.kind in ("accuracy", "pool"):
            res = CaseResult(id=case.id, op=case.op, kind=case.kind, status="skipped", what=case.what,
                             message=f"backend not available here: {why}")
        else:
            res = run_case(case, dev, xfail)
        results.append(res)
        if on_result is not None:
            on_result(res, i, len(cases))
    results += [apply_xfail(r, xfail) for r in _nothing_accepted(backend, results, avail)]
    return SuiteReport(backend=backend.name, plugin=backend.plugin, distribution=backend.distribution,
                       version=str(backend.version), device=dev, results=results, notes=notes, availability=avail)


def _nothing_accepted(backend, results: list[CaseResult], avail: dict) -> list[CaseResult]:
    """A declared op whose every generated case was declined is a conformance failure."""
    extra = []
    for op, why in avail.items():
        mine = [r for r in results if r.op == op and r.kind in ("accuracy", "pool")]
        if why is None and mine and all(r.status == "skipped" for r in mine):
            extra.append(CaseResult(id=f"{op}/accuracy/any-accepted", op=op, kind="accuracy", status="failed",
                                    what="a declared op accepts at least its base case",
                                    message=f"{backend.name} declares {op} but its predicates declined all "
                                            f"{len(mine)} generated cases (first: {mine[0].message})"))
    return extra
