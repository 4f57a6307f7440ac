"""Verdicts and decisions: what the dispatcher says about each backend, as data.

A verdict is a tagged union: :class:`Accepted` or :class:`Rejected` with a stable
:class:`Reason` code, a message that names the field, the value and the supported set, and a
hint saying what to do; a rejection lists *every* predicate that failed (:attr:`Rejected.reasons`),
not only the first. A :class:`Decision` holds one verdict per registered backend and the chosen
one, so every choice can be explained (``linattn explain``) and asked after
(``linattn.last_decision()``). :class:`Rank` names the rank tiers every built-in backend uses.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .problem import Problem
from .tuning import TuningNote


class Rank(enum.IntEnum):
    """The rank tiers (lower runs first among the accepted backends), named in one place.

    A backend's ``rank(p, caps)`` returns one of these (a plugin may return any int; these are
    the landmarks to place it against).
    """

    CPU_FIRST = 4  # torch-chunked on a CPU: the prefill default (but for the shortest sequences)
    PREFERRED = 5  # measured ahead of the native kernels here (cutedsl on SM100/SM103, cpu-chunked long prefills)
    CPU_DECODE = 8  # torch-chunked's decode step on a CPU: ahead of torch-ref, behind PREFERRED plugins
    CPU_DEFAULT = 10  # torch-ref on a CPU: the embedded default
    NATIVE = 20  # a compiled-kernel backend on its native vendor (triton-split on NVIDIA, triton-folded on AMD/Intel)
    BEHIND_NATIVE = 60  # eligible but measured slower than the native one (cutedsl on SM90, cpu-chunked short prefills)
    PEER = 80  # another library's kernels (fla, flashinfer): behind linattn's own until a measurement says otherwise
    DEFAULT = 100  # Backend.rank's default: a plugin that says nothing
    CHUNKED_FALLBACK = 500  # torch-chunked: on a GPU where no kernel fits; on a CPU for short prefills (behind torch-ref)
    GPU_REFERENCE = 1000  # torch-ref on a GPU: the token-serial last resort
    BEHIND_REFERENCE = 1500  # behind torch-ref: torch-chunked's decode off the CPU (runs when forced or torch-ref is off)
    FORCED_ONLY = 2000  # off its native vendor or in the Triton interpreter: eligible only when forced


class Reason(str, enum.Enum):
    """Stable reason codes for a rejection (never renamed; new ones may be added)."""

    OP = "op"  # the backend does not implement this op
    DEVICE = "device"  # wrong device type or vendor
    ARCH = "arch"  # the device's architecture is not supported
    TOOLCHAIN = "toolchain"  # a compiler/runtime the backend needs is missing or too old
    INTERPRETER = "interpreter"  # the Triton interpreter cannot run this kernel
    DTYPE = "dtype"
    SHAPE = "shape"
    LAYOUT = "layout"
    FEATURE = "feature"  # an argument the backend cannot honour (it must never ignore one)
    GRID_LIMIT = "grid_limit"
    NOT_FORCED = "not_forced"  # eligible only when forced (e.g. triton-folded on CUDA)
    DISABLED = "disabled"  # LINATTN_DISABLE or policy(disable=...)
    PLUGIN_LOAD_FAILED = "plugin_load_failed"
    API_VERSION = "api_version"
    BACKEND_ERROR = "backend_error"  # a predicate raised
    UNVERIFIED = "unverified"  # never verified on this arch and not yet self-checked (CUDA-graph capture)
    SELF_CHECK_FAILED = "self_check_failed"  # its first-call self-check against torch-ref failed here
    CAPTURE = "capture"  # it cannot run inside CUDA-graph capture (e.g. its library syncs with the host)


def join_plan(parts: dict[str, str]) -> str:
    """A plan note from its parts (``Backend.plan_parts``, ``Accepted.plan``): ``"name: text; ..."``, an
    identifier shown as :data:`PLAN_LABELS` says where it is not how the note names it
    (``state_stage`` -> ``state stage``); "" for no parts."""
    return "; ".join(f"{PLAN_LABELS.get(name, name)}: {text}" for name, text in parts.items())


#: :func:`join_plan`'s labels for parts whose identifier is not how the note says it
PLAN_LABELS = {"state_stage": "state stage"}


class Accepted(BaseModel):
    """The backend may run the problem; ``rank`` orders the accepted ones (lower runs first).

    ``verified`` is False when the backend's kernels were never verified on this device's
    architecture (``Backend.verified_archs``) and no self-check of this op and shape class has
    passed in this process yet: the first eager call runs one against torch-ref before any user
    data (``dispatch/runtime/self_check.py``); ``message`` says so.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["accepted"] = "accepted"
    backend: str
    rank: int = Field(description="lower runs first")
    message: str = ""
    verified: bool = Field(True, description="False: never verified on this arch, self-checks on its first eager call")
    measured_ms: Optional[float] = Field(None, description="its median time in the tuned table's bucket of this "
                                         "problem (dispatch/plugin/tuning.py); None: not measured there")
    plan: dict[str, str] = Field(default_factory=dict, description="the parts of the backend's plan note by name "
                                 "(Backend.plan_parts; the Triton prefill: prefill, prep, walk or state_stage, ...); "
                                 "empty where the backend names none; in a cached decision, as the message, its "
                                 "shape class's first call's (explain plans the problem given)")

    @property
    def ok(self) -> bool:
        return True


class Failure(BaseModel):
    """One failed predicate: a stable reason code, a message naming the field, the value and the
    supported set, and a hint saying what to do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Reason
    message: str
    hint: str = ""

    def line(self) -> str:
        return f"[{self.reason.value}] {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


def run_order(v: "Accepted") -> tuple:
    """The order in which accepted backends are preferred: those the tuned table timed in this
    problem's bucket first, fastest first; then the others by rank (lower first); the name breaks ties."""
    if v.measured_ms is not None:
        return (0, v.measured_ms, v.backend)
    return (1, v.rank, v.backend)


class Rejected(BaseModel):
    """The backend may not run the problem: ``reasons`` lists every predicate that failed, in
    predicate order; ``reason``, ``message`` and ``hint`` are the first of them (kept for callers
    that read one). Give either ``reasons`` or ``reason`` + ``message`` (+ ``hint``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["rejected"] = "rejected"
    backend: str
    reason: Reason
    message: str
    hint: str = ""
    reasons: list[Failure] = Field(default_factory=list, description="every failing reason, the first one first")

    @model_validator(mode="before")
    @classmethod
    def _first_and_all(cls, data):
        if not isinstance(data, dict):
            return data
        reasons = data.get("reasons")
        if reasons and "reason" not in data:
            first = reasons[0] if isinstance(reasons[0], Failure) else Failure.model_validate(reasons[0])
            data = {**data, "reason": first.reason, "message": first.message, "hint": first.hint}
        elif not reasons and "reason" in data:
            data = {**data, "reasons": [Failure(reason=data["reason"], message=data.get("message", ""),
                                                hint=data.get("hint", ""))]}
        return data

    @property
    def ok(self) -> bool:
        return False


Verdict = Annotated[Union[Accepted, Rejected], Field(discriminator="status")]


class Check(BaseModel):
    """The answer of one predicate: passed, or failed with a reason (verdict and reason together)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    reason: Optional[Reason] = None
    message: str = ""
    hint: str = ""

    @classmethod
    def passed(cls, message: str = "") -> "Check":
        return cls(ok=True, message=message)

    @classmethod
    def failed(cls, reason: Reason, message: str, hint: str = "") -> "Check":
        return cls(ok=False, reason=reason, message=message, hint=hint)


class DecisionPolicy(BaseModel):
    """The policy in force for a decision: forced backends by key, disabled names, and where they came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    force: dict[str, str] = Field(default_factory=dict, description="key (phase, op or 'all') -> backend")
    disable: list[str] = Field(default_factory=list, description="disabled backend names, sorted")
    source: str = "default"


class Decision(BaseModel):
    """One verdict per registered backend and the backend chosen (None when nothing fits)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str
    problem: Problem
    device: str
    profile: Optional[str] = None
    verdicts: list[Verdict]
    chosen: Optional[str]
    forced: Optional[str] = Field(None, description="the backend forced by a call, policy or env, if any")
    forced_by: Optional[str] = None
    policy: DecisionPolicy = Field(default_factory=DecisionPolicy)
    capturing: bool = Field(False, description="decided during CUDA-graph capture (unchecked backends are "
                                               "not chosen then: a self-check needs a sync)")
    tuning: Optional[TuningNote] = Field(None, description="the tuned table in force for this device and what it "
                                         "says of this problem's bucket; None: no table (static ranks)")

    def verdict(self, backend: str):
        for v in self.verdicts:
            if v.backend == backend:
                return v
        raise KeyError(f"no backend named {backend!r} in this decision; backends: {[v.backend for v in self.verdicts]}")

    @property
    def runners_up(self) -> list[str]:
        acc = sorted((v for v in self.verdicts if v.ok and v.backend != self.chosen), key=run_order)
        return [v.backend for v in acc]

    def summary(self) -> str:
        """One line: chosen backend and why the others were not."""
        parts = [f"{self.op}: {self.chosen or 'NO BACKEND'}"]
        if self.chosen and self.verdict(self.chosen).ok and self.verdict(self.chosen).measured_ms is not None:
            parts.append(f"(measured {self.verdict(self.chosen).measured_ms:.4g} ms)")
        if self.chosen and not self.verdict(self.chosen).verified:
            parts.append("(unverified here: self-checks on its first eager call)")
        if self.forced:
            parts.append(f"(forced by {self.forced_by})")
        for v in self.verdicts:
            if v.backend == self.chosen:
                continue
            why = (f"rank {v.rank}" + (f" {v.measured_ms:.4g} ms" if v.measured_ms is not None else "") if v.ok
                   else "+".join(r.reason.value for r in v.reasons))
            parts.append(f"{v.backend}={why}")
        return " ".join(parts)


class NoBackendError(RuntimeError):
    """No registered backend accepts the problem (or a forced one does not). Carries the trace."""

    def __init__(self, decision: Decision, headline: str):
        self.decision, self.headline = decision, headline
        lines = [headline]
        rejected = [v for v in decision.verdicts if not v.ok]
        # actionable reasons first: the forced backend's, then shape/dtype/layout, then the rest
        order = {Reason.SHAPE: 0, Reason.DTYPE: 0, Reason.LAYOUT: 0, Reason.FEATURE: 0, Reason.UNVERIFIED: 0,
                 Reason.GRID_LIMIT: 1}
        rejected.sort(key=lambda v: (v.backend != decision.forced, order.get(v.reason, 2)))
        for v in rejected:  # every failing reason of each backend, the first on its line
            lines.append(f"  - {v.backend}: {v.reasons[0].line()}")
            lines.extend(f"      also {r.line()}" for r in v.reasons[1:])
        lines.append(f"  problem: {decision.problem.model_dump()}")
        super().__init__("\n".join(lines))

    def __reduce__(self):
        """Pickles as its constructor's arguments (F40: crosses a process boundary as itself)."""
        return type(self), (self.decision, self.headline)
