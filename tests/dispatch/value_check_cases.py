"""Helpers shared by the fused value-check tests (tests/dispatch/test_fused_value_checks.py in the
Triton interpreter, tests/gpu/test_value_checks_gpu.py compiled on a GPU)."""

from __future__ import annotations

from typing import Optional

from linattn.dispatch.rules import value_rules
from linattn.dispatch.rules.validate import validate_call, value_rules_of


def verdicts(op: str, args: dict) -> tuple[int, Optional[str]]:
    """``(the fused check's failed-check bits, the torch rules' error message or None)`` for one
    call's arguments, both computed on the same validated arguments (no op is run)."""
    nargs, _, dims = validate_call(op, args, check_values=False)
    rules = value_rules_of(op, check_values=True, check_finite=False)
    check = value_rules.fused_value_check(rules, nargs, dims)
    assert check is not None, "the fused check should apply to this call"
    try:
        value_rules._run_value_rules(rules, nargs, dims)
        error = None
    except ValueError as e:
        error = str(e)
    return check.check(nargs), error
