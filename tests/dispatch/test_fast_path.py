"""The per-call fast path (dispatch/runtime/fast_path.py): a call whose key was seen reuses its plan, and
the plan never lets through what the full validation would refuse."""

from __future__ import annotations

import pytest
import torch

import linattn
import linattn.dispatch
from linattn.dispatch import policy
from linattn.dispatch.runtime import fast_path
from linattn.dispatch.rules import validate as validate_module

N, H, HV, K, V, P = 2, 1, 2, 8, 8, 4


def _inputs(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V), a=r(n, 1, HV), b=r(n, 1, HV),
                A_log=r(HV), dt_bias=r(HV), state_pool=r(P, HV, V, K), state_indices=torch.arange(n, dtype=torch.int32))


@pytest.fixture
def count_validations(monkeypatch):
    """How often the full validation ran (the slow path), from a spy on validate_call."""
    calls = []
    real = validate_module.validate_call

    def spy(*a, **k):
        calls.append(a[0])
        return real(*a, **k)
    monkeypatch.setattr(fast_path, "validate_call", spy)
    fast_path.clear()
    return calls


def test_a_repeated_call_reuses_its_plan_and_gives_the_same_result(count_validations):
    x = _inputs()
    pool0 = x["state_pool"].clone()
    first = linattn.gdn_decode(**x)
    pool1 = x["state_pool"].clone()
    x["state_pool"].copy_(pool0)
    second = linattn.gdn_decode(**x)
    assert count_validations == ["gdn_decode"]  # the second call was a key hit
    assert torch.equal(first, second) and torch.equal(pool1, x["state_pool"])
    assert linattn.last_decision("gdn_decode").chosen == "torch-chunked"


@pytest.mark.parametrize("change", ["stride", "dtype", "scalar", "shape", "grad"])
def test_any_change_of_metadata_or_scalars_is_a_new_key(count_validations, change):
    x = _inputs()
    linattn.gdn_decode(**x)
    if change == "stride":
        x["q"] = torch.randn(N, 1, H, 2 * K)[..., ::2]
    elif change == "dtype":
        x["state_indices"] = x["state_indices"].long()
    elif change == "shape":
        x["state_pool"] = torch.randn(P + 1, HV, V, K)
    if change == "scalar":
        linattn.gdn_decode(**x, scale=0.3)
    elif change == "grad":
        x["q"].requires_grad_(True)
        with pytest.raises(linattn.GradModeError):
            linattn.gdn_decode(**x)
    else:
        linattn.gdn_decode(**x)
    assert count_validations == ["gdn_decode", "gdn_decode"]


def test_an_aliasing_pool_is_refused_on_a_cached_key_and_nothing_is_written(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x)
    # the same metadata, but v now lies inside the pool (a view of its first slot's memory)
    pool = torch.randn(P, HV, V, K)
    x["state_pool"] = pool
    x["v"] = pool.view(-1)[: N * HV * V].view(N, 1, HV, V)
    before = pool.clone()
    with pytest.raises(ValueError, match="overlaps"):
        linattn.gdn_decode(**x)
    assert torch.equal(pool, before)


def test_value_rules_run_on_a_cached_key(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x)
    x["state_indices"] = torch.tensor([0, P], dtype=torch.int32)  # same metadata, slot P out of range
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match="out of range"):
        linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], before)
    assert count_validations == ["gdn_decode"]  # refused by the plan's own value rules


def test_validate_off_is_its_own_key_and_skips_the_value_rules(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x, validate=False)
    linattn.gdn_decode(**x, validate=False)
    linattn.gdn_decode(**x)
    assert count_validations == ["gdn_decode", "gdn_decode"]


def test_a_policy_change_is_a_new_key(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x)
    with policy(disable=("torch-ref", "torch-chunked")):
        with pytest.raises(linattn.NoBackendError):
            linattn.gdn_decode(**x)
    assert linattn.gdn_decode(**x) is not None
    assert count_validations == ["gdn_decode", "gdn_decode"]


def test_clear_cache_forgets_the_plans(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x)
    linattn.dispatch.clear_cache()
    linattn.gdn_decode(**x)
    assert count_validations == ["gdn_decode", "gdn_decode"]


def test_shared_gate_parameters_are_checked_on_every_call_of_a_cached_key():
    x = _inputs()
    linattn.gdn_decode(**x)
    x["A_log"].data[0] = float("nan")  # a write through .data bumps no version counter
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match="A_log"):
        linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], before)


def test_a_scalar_of_another_type_is_a_new_key_and_validated(count_validations):
    x = _inputs()
    linattn.gdn_decode(**x, use_qk_l2norm=True)
    with pytest.raises(TypeError, match="bool"):
        linattn.gdn_decode(**x, use_qk_l2norm=1)  # equal to True as a value, refused as a type


def test_a_pool_that_requires_grad_is_refused_on_a_cached_key_under_no_grad(count_validations):
    x = _inputs()
    with torch.no_grad():
        linattn.gdn_decode(**x)
        x["state_pool"] = x["state_pool"].clone().requires_grad_(True)
        with pytest.raises(ValueError):
            linattn.gdn_decode(**x)


def test_an_unhashable_argument_gets_the_validation_error():
    x = _inputs()
    x["state_indices"] = [0, 1]
    with pytest.raises(TypeError, match="state_indices"):
        linattn.gdn_decode(**x)


# -- class plans (issue 28): a new T or N derives its plan from its class's ----------------------------

def _decode_rows(n, pool_slots=8, seed=0):
    x = _inputs(seed, n)
    x["state_pool"] = torch.randn(pool_slots, HV, V, K, generator=torch.Generator().manual_seed(9))
    x["state_indices"] = torch.arange(n, dtype=torch.int32)
    return x


def _prefill(t, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cu = torch.tensor([0, t // 2, t][: n + 1] if n == 2 else [0, t], dtype=torch.int32)
    return dict(q=r(t, H, K), k=r(t, H, K), v=r(t, HV, V), g=-torch.rand(t, HV, generator=g), beta=torch.rand(t, HV, generator=g),
                cu_seqlens=cu, state_pool=torch.randn(8, HV, V, K, generator=g), state_indices=torch.arange(n, dtype=torch.int32))


def test_a_new_decode_batch_of_a_known_class_skips_the_full_validation_and_matches_it(count_validations):
    linattn.gdn_decode(**_decode_rows(3))
    x = _decode_rows(5, seed=1)
    pool0 = x["state_pool"].clone()
    got = linattn.gdn_decode(**x)
    assert count_validations == ["gdn_decode"]  # N = 5 came from N = 3's class plan
    assert linattn.last_decision("gdn_decode").problem.n == 5
    assert torch.equal(x["state_pool"][5:], pool0[5:])  # rows the call does not own
    pool_got = x["state_pool"].clone()
    fast_path.clear()
    x["state_pool"].copy_(pool0)
    want = linattn.gdn_decode(**x)  # the full path
    assert count_validations == ["gdn_decode", "gdn_decode"]
    assert torch.equal(got, want) and torch.equal(pool_got, x["state_pool"])


def test_a_new_prefill_length_of_a_known_class_skips_the_full_validation(count_validations):
    linattn.gdn_prefill(**_prefill(10))
    x = _prefill(14, seed=1)
    linattn.gdn_prefill(**x)
    assert count_validations == ["gdn_prefill"]
    assert linattn.last_decision("gdn_prefill").problem.t == 14


def test_a_size_class_outcome_seen_before_in_a_class_skips_the_full_validation(count_validations):
    """Lengths going back and forth across a backend's size threshold (torch-chunked's tokens per
    sequence on the CPU) take the full path once per outcome, then derive from that outcome's plan
    with that outcome's decision."""
    chosen = {}
    for t in (10, 40, 12, 44):  # 5 and 20 tokens per sequence, then 6 and 22: below and above it
        linattn.gdn_prefill(**_prefill(t, seed=t))
        decision = linattn.last_decision("gdn_prefill")
        assert decision.problem.t == t
        chosen[t] = decision.chosen
    assert count_validations == ["gdn_prefill", "gdn_prefill"]
    assert chosen[10] == chosen[12] and chosen[40] == chosen[44] and chosen[10] != chosen[40]
    fast_path.clear()
    for t in (12, 44):  # the full path decides the same
        linattn.gdn_prefill(**_prefill(t, seed=t))
        assert linattn.last_decision("gdn_prefill").chosen == chosen[t]


@pytest.mark.parametrize("case", ["decode_v_rows", "decode_indices", "prefill_k_tokens", "prefill_indices"])
def test_lengths_that_disagree_in_a_known_class_get_the_full_validation_refusal(count_validations, case):
    """The size check sends a call whose T or N disagree across arguments to the full validation,
    which raises exactly what it raises without any cached plan; the pool is not written."""
    def bad():
        if case.startswith("decode"):
            x = _decode_rows(5)
            if case == "decode_v_rows":
                x["v"] = torch.randn(6, 1, HV, V)
            else:
                x["state_indices"] = torch.arange(4, dtype=torch.int32)
            return linattn.gdn_decode, x
        x = _prefill(14)
        if case == "prefill_k_tokens":
            x["k"] = torch.randn(13, H, K)
        else:
            x["state_indices"] = torch.arange(3, dtype=torch.int32)
        return linattn.gdn_prefill, x

    op, x = bad()
    with pytest.raises(ValueError) as cold:
        op(**x)
    fast_path.clear()
    op(**(_decode_rows(3) if case.startswith("decode") else _prefill(10)))  # the class's plan
    op, x = bad()
    pool0 = x["state_pool"].clone()
    with pytest.raises(ValueError) as warm:
        op(**x)
    assert str(warm.value) == str(cold.value)
    assert torch.equal(x["state_pool"], pool0)


def test_an_overlap_in_a_known_class_is_refused(count_validations):
    linattn.gdn_decode(**_decode_rows(3))
    x = _decode_rows(5)
    x["q"] = x["state_pool"].view(-1)[: 5 * H * K].view(5, 1, H, K)  # q inside the pool (same strides)
    pool0 = x["state_pool"].clone()
    with pytest.raises(ValueError, match="overlaps"):
        linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], pool0)


def test_a_negated_view_of_a_new_length_in_a_known_class_is_refused(count_validations):
    linattn.gdn_prefill(**_prefill(10))
    x = _prefill(14)
    x["q"] = torch._neg_view(x["q"])
    with pytest.raises(ValueError, match="negated"):
        linattn.gdn_prefill(**x)


@pytest.mark.parametrize("name", ["q", "state_pool"])
def test_a_negated_view_of_a_cached_key_is_refused_and_the_pool_is_unchanged(count_validations, name):
    """``torch._neg_view(x)`` has ``x``'s dtype, shape and strides: the negation is part of the key,
    so after two plain calls the negated one is a new key, refused as a cold call."""
    x = _inputs()
    with torch.no_grad():
        linattn.gdn_decode(**x)
        linattn.gdn_decode(**x)
        assert count_validations == ["gdn_decode"]
        x[name] = torch._neg_view(x[name].neg())  # shows the same values; its memory holds their negation
        pool0 = x["state_pool"].clone()
        with pytest.raises(ValueError, match=f"{name} is a lazily negated view"):
            linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], pool0)
    assert count_validations == ["gdn_decode", "gdn_decode"]


@pytest.mark.parametrize("name", ["state_pool", "q"])
def test_a_negated_view_of_a_known_class_is_refused_and_the_pool_is_unchanged(count_validations, name):
    """The class key holds the negation too: a new length with a negated pool (not a length argument)
    or a negated q does not derive its plan from the plain class's."""
    with torch.no_grad():
        linattn.gdn_prefill(**_prefill(10))
        x = _prefill(14)
        x[name] = torch._neg_view(x[name].neg())
        pool0 = x["state_pool"].clone()
        with pytest.raises(ValueError, match=f"{name} is a lazily negated view"):
            linattn.gdn_prefill(**x)
    assert torch.equal(x["state_pool"], pool0)


def test_a_sparse_tensor_with_a_dense_calls_strides_is_a_new_key_and_refused(count_validations):
    """A COO tensor reports strides (all 0 here) that a dense argument may have: the layout is part
    of the call key, so after a dense call of those strides the sparse one is validated and refused."""
    x = _inputs()
    x["q"] = torch.randn(1).as_strided((N, 1, H, K), (0, 0, 0, 0))
    linattn.gdn_decode(**x)
    sparse = x["q"].contiguous().to_sparse()
    assert sparse.stride() == x["q"].stride() and sparse.shape == x["q"].shape
    x["q"] = sparse
    pool0 = x["state_pool"].clone()
    with pytest.raises(TypeError, match="layout torch.sparse_coo"):
        linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], pool0)
    assert count_validations == ["gdn_decode", "gdn_decode"]


def test_a_call_without_a_key_is_not_stored():
    fast_path.clear()
    fast_path.store(None, object())
    assert fast_path.lookup(None) is None and len(fast_path._plans) == 0


@pytest.mark.parametrize("op,make", [("gdn_decode", lambda: _decode_rows(5)), ("gdn_prefill", lambda: _prefill(14)),
                                     ("gdn_prefill", lambda: _prefill(2, n=1))])
def test_the_class_key_derived_from_the_call_key_is_the_class_key(op, make):
    """plan_miss derives the class key from the call key (no second read of the tensors): the same tuple."""
    x = dict(make(), scale=None)
    key = fast_path.call_key(op, x, None, True, False)
    for _ in range(2):  # the key's layout computed, then kept
        assert fast_path._class_of(op, key, x) == fast_path.class_key(op, x, None, True, False)
    y = dict(x, g=torch.zeros(1)) if op == "gdn_decode" else dict(x, initial_state=torch.zeros(1, 1))  # another layout
    assert fast_path._class_of(op, fast_path.call_key(op, y, None, True, False), y) == \
        fast_path.class_key(op, y, None, True, False)
    assert fast_path._class_of("silu_and_mul_clamp", key, x) is None and fast_path._class_of(op, None, x) is None


def test_a_class_shares_its_first_plans_prepared_launch_when_it_serves_the_class():
    """A new length's plan takes its launch from its class's prepared launch where the backend's
    serves every length (``serves_class``: the Triton replays, ``bind``), so no prepared launch is
    built per length."""
    class Replay:
        serves_class = True

        def bind(self, a):
            return ("bound", a["q"].shape[0])
    x = _decode_rows(3)
    fast_path.clear()  # this call's class the only gdn_decode one (other tests of the worker leave theirs)
    linattn.gdn_decode(**x)
    (entry,) = [e for e in fast_path._classes.values() if e.plan.op == "gdn_decode"]
    entry.plan.replay, entry.plan.copies = Replay(), ()
    y = _decode_rows(5, seed=1)
    derived = fast_path._from_class(entry, dict(y, scale=None))
    assert derived is not None and derived.replay is entry.plan.replay and derived.copies == ()
    assert derived.prepared == ("bound", 5)
    entry.plan.replay = None  # no class-serving launch: each length prepares its own
    derived = fast_path._from_class(entry, dict(y, scale=None))
    assert derived.prepared is None and derived.copies is None
    fast_path.clear()  # the class plan changed above is not left to later tests of the worker
