"""Context-parallel agreement (F37, F38): ranks that disagree, or one rank that refuses, raise together.

Two gloo ranks are spawned once with a short process-group timeout (:data:`PG_TIMEOUT_S`) and run
every case of ``cp_agreement_cases.CASES`` in order: rank 1 changes one agreed argument (or fails
on its own), rank 0 does not. Every rank must raise the same class within :data:`PROMPT_S`
seconds (a rank left in a collective would wait for the timeout), name the argument or the
failing rank, and leave its pool and initial state bitwise unchanged. This is the fuzz suite's kind
"context-parallel disagreement in every agreed argument" (tests/fuzz/README.md).
"""

from __future__ import annotations

import pytest
from cp_agreement_cases import AGREED, CASES, _base, global_inputs, run_all

from linattn.context_parallel import _agreed, _check_local
from linattn.testing.spawn import spawn_ranks

PG_TIMEOUT_S = 45  # the whole spawn and every collective; a hang fails the module's tests within it
K_DEFAULT = 8 ** -0.5  # the scale validation fills in for K = 8
PROMPT_S = 10.0  # a prompt refusal takes well under a second; a rank waiting for a peer takes PG_TIMEOUT_S


@pytest.fixture(scope="module")
def outcomes() -> list[dict]:
    return spawn_ranks(run_all, 2, sorted(CASES), backend="gloo", timeout_s=PG_TIMEOUT_S)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rank_raises_together_when_one_rank_differs(outcomes, name):
    results = [o[name] for o in outcomes]
    shown = "\n".join(f"rank {r}: {res[:4]}" for r, res in enumerate(results))
    assert all(res[0] == "err" for res in results), f"not refused on every rank:\n{shown}"
    if name != "failure_after_agreement_before_exchange":  # there rank 1 raises its own error, rank 0 a RuntimeError
        assert len({res[1] for res in results}) == 1, f"different error classes:\n{shown}"
    for r, (_, _, msg, secs, unchanged) in enumerate(results):
        words = CASES[name][3]
        assert all(w in msg for w in words), f"rank {r}'s message does not name {words}: {msg}"
        assert secs < PROMPT_S, f"rank {r} took {secs:.1f} s (waited in a collective?)"
        if name != "failure_after_agreement_before_exchange":  # a failure after the agreement may follow writes
            assert unchanged, f"rank {r}'s state changed in a refused call"


def test_f37_message_names_initial_state_on_both_ranks(outcomes):
    for o in outcomes:
        assert "initial_state given (dense mode) (rank 0: True; rank 1: False)" in o["initial_state_one_rank_F37"][2]


def test_f38_a_bad_family_on_one_rank_is_raised_on_the_other_with_its_message(outcomes):
    msg0, msg1 = outcomes[0]["family_typo_F38"][2], outcomes[1]["family_typo_F38"][2]
    assert "refused on rank 1:" in msg0 and "'GDN'" in msg0
    assert "refused on rank 1 (this rank)" in msg1


def test_the_agreement_covers_exactly_the_agreed_arguments_and_each_has_a_case():
    """The library's agreed keys and this file's list name the same arguments; every one that a rank
    can change without its own validation refusing it has a disagreement case."""
    d = global_inputs()
    x, kw = _base(0, d, dense=False)
    args = dict(state_pool=kw["state_pool"], state_indices=kw["state_indices"], initial_state=None,
                has_initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", backend="torch-ref")
    cu = d["cu"].tolist()
    out, _ = _check_local("gdn", tuple(x), cu, 0, args, True, False)
    keys = _agreed("gdn", tuple(x), args, out, cu, True, False)
    assert {a for a in AGREED if any(k.startswith(a) for k in keys)} == AGREED
    assert all(any(k.startswith(a) for a in AGREED) for k in keys), sorted(keys)
    covered = {c[0] for c in CASES.values() if c[0] is not None}
    assert AGREED - covered == {"g shape", "g/beta dtypes"}  # refused by each rank's own validation first


def test_scale_agrees_as_validated_so_none_and_the_default_value_agree():
    d = global_inputs()
    x, kw = _base(0, d, dense=False)
    base = dict(state_pool=kw["state_pool"], state_indices=kw["state_indices"], initial_state=None,
                has_initial_state=None, use_qk_l2norm=True, state_layout="vk", backend="torch-ref")
    cu = d["cu"].tolist()
    got = []
    for scale in (None, K_DEFAULT):
        args = dict(base, scale=scale)
        out, _ = _check_local("gdn", tuple(x), cu, 0, args, True, False)
        got.append(_agreed("gdn", tuple(x), args, out, cu, True, False)["scale"])
    assert got[0] == got[1]

