"""Field case F42 (issue 26): which force wins when scopes nest.

An outer op-level force beat an inner ``policy(decode=...)``, and ``LINATTN_BACKEND=gdn_decode=X``
beat ``with policy(all=Y)``. The rule (dispatch/runtime/policy.py, docs/ops-decisions.md): the innermost
scope that covers an op wins, whatever its key's granularity; the environment is the outermost
scope; within one scope the op key beats the phase key, which beats ``all``; a key given two
backends in one scope is refused. Cached decisions and call plans follow every change.
"""

import types

import pytest
import torch

import linattn
from linattn.backends.torch_ref import TorchRefBackend
from linattn.dispatch import NoBackendError, get_registry, policy
from linattn.dispatch.plugin.hookspecs import hookimpl
from linattn.dispatch.runtime.policy import Policy, current_policy, parse_force

OPS = ("gdn_decode", "kda_decode", "gdn_prefill", "gdn_gating")


class OtherRef(TorchRefBackend):
    """torch-ref under another name, ranked first: makes the two choices distinguishable."""

    name = "other-ref"
    api_version = "2"
    features = frozenset({"precomputed_gates", "has_initial_state"})

    def rank(self, p, caps):
        return 50


@pytest.fixture
def other(registry):
    plug = types.ModuleType("f42_plug")
    plug.LINATTN_API_VERSION = "2"
    plug.linattn_register_backends = hookimpl(lambda: [OtherRef])
    get_registry().add_plugin(plug, name="f42-plug")
    return registry


def _resolved() -> dict:
    pol = current_policy()
    return {op: pol.forced_for(op) for op in OPS}


# (outer scope, inner scope, expected force per op of OPS)
NESTINGS = [
    ({"gdn_decode": "A"}, {"decode": "B"}, ("B", "B", None, None)),
    ({"decode": "A"}, {"gdn_decode": "B"}, ("B", "A", None, None)),
    ({"all": "A"}, {"decode": "B"}, ("B", "B", "A", "A")),
    ({"decode": "A"}, {"all": "B"}, ("B", "B", "B", "B")),
    ({"gdn_decode": "A"}, {"all": "B"}, ("B", "B", "B", "B")),
    ({"all": "A"}, {"gdn_decode": "B"}, ("B", "A", "A", "A")),
    ({"gdn_decode": "A", "prefill": "C"}, {"decode": "B"}, ("B", "B", "C", None)),
    ({"all": "A", "gdn_decode": "C"}, {"decode": "B"}, ("B", "B", "A", "A")),
]


@pytest.mark.parametrize("outer, inner, expected", NESTINGS)
def test_f42_the_innermost_scope_wins_in_every_nesting_order(registry, outer, inner, expected):
    with policy(**outer):
        with policy(**inner):
            assert tuple(_resolved().values()) == expected
            assert all(current_policy().forced_by(op) == "policy()" for op, b in zip(OPS, expected) if b)


@pytest.mark.parametrize("outer, inner, expected", NESTINGS)
def test_f42_the_environment_is_the_outermost_scope(registry, monkeypatch, outer, inner, expected):
    monkeypatch.setenv("LINATTN_BACKEND", ",".join(f"{k}={v}" for k, v in outer.items()))
    with policy(**inner):
        assert tuple(_resolved().values()) == expected
        pol = current_policy()
        for op, backend in zip(OPS, expected):  # each force names the scope that set it
            if backend:
                assert pol.forced_by(op) == ("policy()" if backend == "B" else "env"), op


def test_f42_within_one_scope_the_more_specific_key_wins(registry, monkeypatch):
    with policy(all="a", decode="b", gdn_decode="c"):
        assert _resolved() == {"gdn_decode": "c", "kda_decode": "b", "gdn_prefill": "a", "gdn_gating": "a"}
    monkeypatch.setenv("LINATTN_BACKEND", "gdn_decode=c,all=a,decode=b")
    assert _resolved() == {"gdn_decode": "c", "kda_decode": "b", "gdn_prefill": "a", "gdn_gating": "a"}


@pytest.mark.parametrize("spec", ["decode=a,decode=b", "a,all=b", "gdn_decode=a, gdn_decode = b"])
def test_f42_a_key_forced_twice_in_one_scope_is_refused(spec):
    with pytest.raises(ValueError, match=r"LINATTN_BACKEND=.*contradicts an earlier entry"):
        parse_force(spec, "LINATTN_BACKEND")
    assert parse_force("decode=a,decode=a", "LINATTN_BACKEND") == (("decode", "a"),)  # no contradiction


def test_f42_merging_scopes_is_associative():
    outer, middle, inner = (Policy(force=tuple(sorted(f.items())), source=s) for f, s in (
        ({"all": "x", "gdn_prefill": "y"}, "env"), ({"decode": "z", "kda_decode": "w"}, "p1"),
        ({"gdn_decode": "v", "prefill": "u"}, "p2")))
    left = inner.merged_over(middle).merged_over(outer)
    right = inner.merged_over(middle.merged_over(outer))
    assert left == right
    assert {op: left.forced_for(op) for op in OPS} == {
        "gdn_decode": "v", "kda_decode": "w", "gdn_prefill": "u", "gdn_gating": "x"}


def _decode_args(pool_rows=3):
    g = torch.Generator().manual_seed(42)
    q = torch.randn(1, 1, 1, 4, generator=g)
    pool = torch.randn(pool_rows, 1, 4, 4, generator=g)
    return (q, torch.randn(1, 1, 1, 4, generator=g), torch.randn(1, 1, 1, 4, generator=g), torch.zeros(1, 1, 1),
            torch.zeros(1, 1, 1), torch.zeros(1), torch.zeros(1), pool, torch.tensor([1]))


def _run_decode() -> str:
    args = _decode_args()
    pool = args[7]
    before = pool.clone()
    linattn.gdn_decode(*args)
    assert torch.equal(pool[0], before[0]) and torch.equal(pool[2], before[2])  # rows the call does not own
    d = linattn.last_decision()
    return f"{d.chosen}/{d.forced_by}"


def test_f42_calls_follow_the_innermost_scope_through_the_caches(other, monkeypatch):
    assert _run_decode().endswith("/None")
    for _ in range(2):  # the second pass runs on cached decisions and call plans
        with policy(gdn_decode="other-ref"):
            assert _run_decode() == "other-ref/policy()"
            with policy(decode="torch-ref"):
                assert _run_decode() == "torch-ref/policy()"
            with policy(all="torch-ref"):
                assert _run_decode() == "torch-ref/policy()"
        with policy(decode="torch-ref"):
            with policy(gdn_decode="other-ref"):
                assert _run_decode() == "other-ref/policy()"
    monkeypatch.setenv("LINATTN_BACKEND", "gdn_decode=other-ref")
    for _ in range(2):
        assert _run_decode() == "other-ref/env"
        with policy(all="torch-ref"):
            assert _run_decode() == "torch-ref/policy()"
        with policy(prefill="torch-ref"):  # does not cover gdn_decode: the environment's force stays
            assert _run_decode() == "other-ref/env"


def test_f42_disable_accumulates_and_forcing_a_disabled_backend_is_refused(other, monkeypatch):
    monkeypatch.setenv("LINATTN_DISABLE", "other-ref")
    assert _run_decode() == "torch-chunked/None"  # the CPU decode default
    with policy(decode="other-ref"):
        with pytest.raises(NoBackendError, match="other-ref"):
            linattn.gdn_decode(*_decode_args())
