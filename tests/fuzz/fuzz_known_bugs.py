"""Properties that fail today because of a library bug, one entry per (op, backend, focus).

The focused property of each entry runs under ``pytest.mark.xfail(strict=True)`` and the
``mixed`` property of that (op, backend) leaves the argument out of its draws, so the rest of the
suite stays strict. When a bug is fixed the focused test XPASSes (a strict failure): delete its
entry here and everything is checked again.
"""

from __future__ import annotations

import pytest

#: (op, backend, focus) -> the bug. Keys, by test file:
#:   test_fuzz_valid:     (op, backend, focus), e.g. ("gdn_decode", "triton-split", "A_log"); foci are
#:                        fuzz_strategies.DECODE_FOCI / PREFILL_FOCI;
#:   test_fuzz_invalid:   ("decode" | "prefill", backend or "auto", mutation), e.g.
#:                        ("decode", "torch-ref", "pool_overlapping_slots");
#:   test_fuzz_nonfinite: (op, backend, "nonfinite_input" | "stale_slots");
#:   test_fuzz_gpu:       (op, backend + "@gpu" (None: "auto@gpu"), focus).
#: Empty: no property fails on the working tree this suite was last run on (see the report).
KNOWN_BUGS: dict[tuple[str, str, str], str] = {
}


def marks(op: str, backend: str, focus: str) -> list:
    reason = KNOWN_BUGS.get((op, backend, focus))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def excluded(op: str, backend: str) -> frozenset:
    """Arguments the ``mixed`` property of (op, backend) must not view while a bug is open."""
    return frozenset(f for (o, b, f) in KNOWN_BUGS if o == op and b == backend)
