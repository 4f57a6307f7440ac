"""Shared machinery of the property-based suite: settings, counters, bitwise checks, op calls.

Kept apart from ``conftest.py`` so that test modules can import it by name (``tests/fuzz`` is on
``sys.path`` like the other test folders, which have no ``__init__.py``).

- :func:`fuzz_settings`: hypothesis settings for one property, from the active profile
  (``ci`` by default, ``long`` with ``LINATTN_FUZZ_PROFILE=long``) with the property's own
  example budget scaled by the profile.
- :data:`COUNTS` and :func:`record`: cases tried per (property kind, op, backend) and how each
  ended; ``conftest.py`` prints them at the end of the run and writes them as JSON when
  ``LINATTN_FUZZ_JSON=path`` is set.
- :func:`bits_equal`: bitwise equality that treats NaN payloads as bits (a snapshot of a buffer
  holding NaN junk must compare equal to itself).
- :func:`call_op`: run a public op, forcing a backend, and sort the outcome into "ran",
  "refused" (ValueError / TypeError / NoBackendError raised by linattn before anything ran) or an
  unexpected exception.
"""

from __future__ import annotations

import collections
import os
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from hypothesis import HealthCheck, Phase, seed, settings

import linattn
from linattn.dispatch.plugin.verdict import NoBackendError
from linattn.testing.compare import rel_error_exact_zero as rel

# -- profiles ---------------------------------------------------------------------------------

PROFILE_ENV = "LINATTN_FUZZ_PROFILE"
JSON_ENV = "LINATTN_FUZZ_JSON"

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much, HealthCheck.large_base_example,
                                      HealthCheck.function_scoped_fixture])
#: ci: fixed seed (derandomize), no example database, no shrinking (a failure is reported as
#: found: the suite must stay bounded; run the long profile to shrink it).
settings.register_profile("ci", derandomize=True, database=None, max_examples=10,
                          phases=(Phase.explicit, Phase.generate), **_COMMON)
#: long: random seeds, shrinking on, ten times the examples of every property.
settings.register_profile("long", derandomize=False, max_examples=100,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
                          **_COMMON)
#: shrink: the ci profile's examples with shrinking on (minimal failing examples for a report).
settings.register_profile("shrink", derandomize=True, database=None, max_examples=10,
                          phases=(Phase.explicit, Phase.generate, Phase.shrink), **_COMMON)
_SCALE = {"ci": 1, "long": 10, "shrink": 1}


def profile_name() -> str:
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in _SCALE:
        raise ValueError(f"{PROFILE_ENV}={name!r}: known profiles are {', '.join(_SCALE)}")
    return name


def fuzz_settings(examples: int, key: Optional[str] = None):
    """Settings of one property: the active profile with ``examples`` (ci) scaled by the profile.

    ``key`` (e.g. the pytest id) fixes the seed in the ci and shrink profiles: every parametrised
    copy of a property draws its own examples (derandomize alone seeds from the source, which the
    copies share), and the same ones on every run. The long profile takes random seeds.
    """
    name = profile_name()
    cfg = settings(settings.get_profile(name), max_examples=max(1, examples * _SCALE[name]))
    if key is None or name == "long":
        return cfg

    def apply(test):
        return seed(zlib.crc32(key.encode()))(cfg(test))
    return apply


def current_id() -> str:
    """The running pytest item's id (``path::test[params]``), a stable per-copy seed key."""
    cur = os.environ.get("PYTEST_CURRENT_TEST", "")
    return cur.rsplit(" (", 1)[0] or "fuzz"


# -- counters ---------------------------------------------------------------------------------

OUTCOMES = ("passed", "declined", "refused", "failed")


@dataclass
class _Row:
    cases: int = 0
    passed: int = 0  # a valid problem ran and every property held
    declined: int = 0  # a valid problem the forced backend refused in its predicates (allowed ones only)
    refused: int = 0  # an invalid problem refused before any write (the expected outcome)
    failed: int = 0  # a property did not hold (includes re-runs of a failing example)
    failures: list = field(default_factory=list)


COUNTS: dict[tuple[str, str, str], _Row] = collections.defaultdict(_Row)
_lock = threading.Lock()


def record(kind: str, op: str, backend: Optional[str], outcome: str, detail: str = "") -> None:
    assert outcome in OUTCOMES, outcome
    with _lock:
        row = COUNTS[(kind, op, backend or "auto")]
        row.cases += 1
        setattr(row, outcome, getattr(row, outcome) + 1)
        if outcome == "failed" and len(row.failures) < 5:
            row.failures.append(detail[:2000])


class Tally:
    """Context manager around one example: counts it as failed if the body raises, else as the
    outcome set on it (``passed`` by default)."""

    def __init__(self, kind: str, op: str, backend: Optional[str], spec: Any = None):
        self.kind, self.op, self.backend, self.spec = kind, op, backend, spec
        self.outcome = "passed"

    def __enter__(self) -> "Tally":
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if et is None:
            record(self.kind, self.op, self.backend, self.outcome)
        elif not issubclass(et, (KeyboardInterrupt,)) and et.__name__ not in ("UnsatisfiedAssumption", "Skipped"):
            record(self.kind, self.op, self.backend, "failed", f"{et.__name__}: {ev} | spec: {self.spec!r}")
        return False


def counts_as_rows() -> list[dict]:
    rows = []
    for (kind, op, backend), r in sorted(COUNTS.items()):
        rows.append(dict(kind=kind, op=op, backend=backend, cases=r.cases, passed=r.passed,
                         declined=r.declined, refused=r.refused, failed=r.failed, failures=r.failures))
    return rows


# -- tensors ----------------------------------------------------------------------------------

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(x: torch.Tensor) -> torch.Tensor:
    """The tensor's elements reinterpreted as integers of the same width (NaN-safe comparisons)."""
    if x.dtype.is_floating_point:
        return x.view(_INT_OF[x.element_size()])
    return x


def bits_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(bits(x), bits(y))


def twin_equal(x: torch.Tensor, y: torch.Tensor, tol: float) -> bool:
    """A call on views against the same call on contiguous copies: bitwise on the CPU (torch-ref and
    the Triton interpreter run the same operations in the same order); compiled on a GPU within the
    op's tolerance, since Triton specialises a kernel on its strides' divisibility, which can pick
    another register layout and so another summation order in the reductions."""
    if x.device.type == "cpu" and y.device.type == "cpu":
        return bits_equal(x, y)
    return x.shape == y.shape and x.dtype == y.dtype and rel(x, y) <= tol


def base_of(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def twin(t: torch.Tensor) -> torch.Tensor:
    """A fresh copy of the view ``t`` and its whole base buffer, same strides and offset."""
    base = base_of(t)
    nb = base.clone()
    return nb.as_strided(t.size(), t.stride(), t.storage_offset() - base.storage_offset() + nb.storage_offset())


def dense_copy(t):
    """A contiguous copy of a tensor argument (None and non-tensors pass through)."""
    return t.clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t


# -- calling the ops --------------------------------------------------------------------------

REFUSALS = (ValueError, TypeError, NoBackendError)


@dataclass
class Outcome:
    value: Any = None
    error: Optional[BaseException] = None

    @property
    def ran(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        return "ran" if self.ran else f"{type(self.error).__name__}: {str(self.error).splitlines()[0][:300]}"


def call_op(op: str, kwargs: dict, backend: Optional[str], **extra) -> Outcome:
    """Run ``linattn.<op>(**kwargs, backend=backend)``. linattn's refusals come back as an Outcome
    with ``error`` set; anything else (a kernel crash, a plugin's BackendRunError) propagates."""
    fn = getattr(linattn, op)
    try:
        return Outcome(value=fn(**kwargs, backend=backend, **extra))
    except REFUSALS as e:
        return Outcome(error=e)


def rejection_reason(err: BaseException, backend: Optional[str]) -> Optional[str]:
    """The forced backend's rejection reason in a NoBackendError (``"layout"``, ``"shape"``, ...)."""
    if not isinstance(err, NoBackendError):
        return None
    for v in err.decision.verdicts:
        if v.backend == backend and not v.ok:
            return v.reason.value
    return None


def heal_plugin(backend: Optional[str]) -> None:
    """A plugin that raised is marked broken for the rest of the process (ops.py); a fuzz failure
    must not turn every later case of that backend into a refusal, so the mark is lifted."""
    from linattn.dispatch.runtime.registry import get_registry

    reg = get_registry()
    if backend and backend in reg.broken:
        del reg.broken[backend]
        reg.generation += 1
