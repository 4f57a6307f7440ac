"""Property-based suite (hypothesis): profiles, the case counter and its report.

Profiles (registered in ``fuzz_support``): ``ci`` is the default: fixed seed (``derandomize``),
small example budgets, no deadline, no shrinking, the whole folder in about two minutes on a
2-core CPU with the Triton interpreter. ``long`` (``LINATTN_FUZZ_PROFILE=long``) takes random
seeds, ten times the examples and shrinks failures: for local runs. ``shrink``
(``LINATTN_FUZZ_PROFILE=shrink``) is ``ci`` with shrinking: minimal failing examples for a report.

Every example is counted per (property, op, backend) with its outcome (passed, declined by the
forced backend's predicates, refused as expected, failed). The table is printed at the end of the
run; ``LINATTN_FUZZ_JSON=path`` also writes it, with the test outcomes, as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import time

import pytest
import torch

if not torch.cuda.is_available():  # before anything imports triton (see tests/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fuzz_support  # noqa: E402

_T0 = time.time()
_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report):
    if "test_fuzz" not in report.nodeid:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.outcome == "skipped" else "xpassed"
        _OUTCOMES[report.nodeid] = outcome
    if report.when == "teardown" and os.environ.get(fuzz_support.JSON_ENV):
        write_json(os.environ[fuzz_support.JSON_ENV])  # after every test: a run cut short keeps its counts


def _table() -> list[str]:
    rows = fuzz_support.counts_as_rows()
    if not rows:
        return []
    lines = [f"{'property':<12} {'op':<20} {'backend':<14} {'cases':>6} {'passed':>6} {'declined':>8} "
             f"{'refused':>7} {'failed':>6}"]
    tot = dict(cases=0, passed=0, declined=0, refused=0, failed=0)
    for r in rows:
        lines.append(f"{r['kind']:<12} {r['op']:<20} {r['backend']:<14} {r['cases']:>6} {r['passed']:>6} "
                     f"{r['declined']:>8} {r['refused']:>7} {r['failed']:>6}")
        for k in tot:
            tot[k] += r[k]
    lines.append(f"{'total':<48} {tot['cases']:>6} {tot['passed']:>6} {tot['declined']:>8} {tot['refused']:>7} "
                 f"{tot['failed']:>6}")
    return lines


def pytest_terminal_summary(terminalreporter):
    lines = _table()
    if not lines:
        return
    terminalreporter.section(f"linattn fuzz cases (profile {fuzz_support.profile_name()})")
    for line in lines:
        terminalreporter.write_line(line)
    path = os.environ.get(fuzz_support.JSON_ENV)
    if path:
        write_json(path)
        terminalreporter.write_line(f"fuzz counts written to {path}")


def write_json(path: str) -> None:
    rows = fuzz_support.counts_as_rows()
    totals = {k: sum(r[k] for r in rows) for k in ("cases", "passed", "declined", "refused", "failed")}
    tests = dict(sorted(_OUTCOMES.items()))
    summary = {}
    for o in tests.values():
        summary[o] = summary.get(o, 0) + 1
    doc = dict(profile=fuzz_support.profile_name(), wall_s=round(time.time() - _T0, 2),
               torch=torch.__version__, python=platform.python_version(),
               cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
               triton_interpret=os.environ.get("TRITON_INTERPRET"), totals=totals, rows=rows,
               tests=summary, test_outcomes=tests)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


@pytest.fixture(autouse=True)
def _one_thread():
    """Fuzz problems are tiny: torch's intra-op threads only spin against each other (on a loaded
    2-core machine a 0.3 s property took 18 s with the default thread count). One thread per
    property, the caller's setting restored after it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
