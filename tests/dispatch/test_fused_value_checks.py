"""The decode value checks as one kernel (kernels/triton/value_checks.py, dispatch/value_rules.py
``fused_value_check``): it flags exactly the calls the torch rules refuse, and a refused call
raises the torch rules' error before anything is written. Run in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import os  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # the cases are CPU tensors; on a GPU machine see the note
    pytest.skip("runs the check kernel in the Triton interpreter on CPU tensors (the suite's default on a "
                "machine without a GPU); compiled on a GPU: tests/gpu/test_value_checks_gpu.py", allow_module_level=True)

import linattn  # noqa: E402
from linattn.dispatch import fast_path, value_rules  # noqa: E402
from linattn.dispatch.validate import validate_call, value_rules_of  # noqa: E402

N, H, HV, K, V, P, T = 4, 1, 2, 8, 8, 6, 2
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", True)
    fast_path.clear()
    yield
    fast_path.clear()


def _decode_args(family="gdn", n=N, t=1, seed=0, **over):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kda = family == "kda"
    x = dict(q=r(n, t, H, K), k=r(n, t, H, K), v=r(n, t, HV, V), a=r(n, t, HV, K) if kda else r(n, t, HV),
             b=r(n, t, HV), A_log=r(HV), dt_bias=r(HV, K) if kda else r(HV), state_pool=r(P, HV, V, K),
             state_indices=torch.arange(n, dtype=torch.int32))
    x.update(over)
    return x


def _verdicts(op: str, args: dict):
    """(fused bits, the torch rules' error or None) for one call's arguments."""
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


def _idx(*v, dtype=torch.int32):
    return torch.tensor(v, dtype=dtype)


#: case -> (arguments changed, whether the torch rules refuse it)
CASES = {
    "valid": ({}, False),
    "padding": (dict(state_indices=_idx(-1, 3, -1, 0)), False),
    "slot out of range": (dict(state_indices=_idx(0, 1, P, 2)), True),
    "slot far out of range, int64": (dict(state_indices=_idx(0, 2 ** 40, 1, 2, dtype=torch.int64)), True),
    "shared slot": (dict(state_indices=_idx(0, 3, 5, 3)), True),
    "padding repeated": (dict(state_indices=_idx(-1, -1, 2, -5)), False),
    "shared slot, pool not written": (dict(state_indices=_idx(1, 1, 2, 3), disable_state_update=True), False),
    "strided indices": (dict(state_indices=torch.tensor([0, 9, 1, 9, 2, 9, 4, 9], dtype=torch.int32)[::2]), False),
    "strided indices, shared": (dict(state_indices=torch.tensor([0, 9, 1, 9, 1, 9, 4, 9], dtype=torch.int32)[::2]),
                                True),
    "A_log NaN": (dict(A_log=torch.tensor([0.0, NAN])), True),
    "dt_bias -inf": (dict(dt_bias=torch.tensor([-INF, 0.0])), True),
    "dt_bias float64 huge but finite": (dict(dt_bias=torch.tensor([1e300, 0.0], dtype=torch.float64)), False),
    "A_log bf16 inf": (dict(A_log=torch.tensor([INF, 0.0], dtype=torch.bfloat16)), True),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_kernel_flags_exactly_the_calls_the_torch_rules_refuse(fused, case):
    over, refused = CASES[case]
    bits, error = _verdicts("gdn_decode", _decode_args(**over))
    assert (error is not None) == refused and (bits != 0) == refused, (bits, error)


def _table_args(table, accepted=None, **over):
    table = torch.tensor(table, dtype=torch.int32)
    x = _decode_args(n=table.shape[0], t=table.shape[1], state_indices=table, **over)
    if accepted is not None:
        x["num_accepted_tokens"] = torch.tensor(accepted, dtype=torch.int32)
    return x


TABLE_CASES = {
    "valid table": ([[0, 1], [2, 3], [4, 5], [-1, -1]], None, False),
    "a row repeats its own slot": ([[0, 0], [2, 2], [4, -1], [-1, 5]], None, False),
    "two rows share a slot": ([[0, 1], [2, 3], [4, 1], [-1, -1]], None, True),
    "table slot out of range": ([[0, 1], [2, 3], [4, P], [-1, -1]], None, True),
    "accepted in range": ([[0, 1], [2, 3], [4, 5], [-1, -1]], [0, 1, 2, 2], False),
    "accepted above T": ([[0, 1], [2, 3], [4, 5], [-1, -1]], [0, 1, 3, 2], True),
    "accepted negative": ([[0, 1], [2, 3], [4, 5], [-1, -1]], [0, -1, 2, 2], True),
}


@pytest.mark.parametrize("case", TABLE_CASES, ids=list(TABLE_CASES))
def test_per_token_tables_and_accepted_counts(fused, case):
    table, accepted, refused = TABLE_CASES[case]
    bits, error = _verdicts("gdn_decode", _table_args(table, accepted))
    assert (error is not None) == refused and (bits != 0) == refused, (bits, error)


@pytest.mark.parametrize("rows,expect_error", [([0, 2, -1, 1], False), ([0, 3, -1, 1], True), ([0, 2, 2, 1], True)],
                         ids=["valid", "out of range", "shared"])
def test_intermediate_state_indices(fused, rows, expect_error):
    x = _decode_args(intermediate_states=torch.zeros(3, 1, HV, V, K), intermediate_state_indices=_idx(*rows))
    bits, error = _verdicts("gdn_decode", x)
    assert (error is not None) == expect_error and (bits != 0) == expect_error, (bits, error)


@pytest.mark.parametrize("g0,expect_error", [(-0.5, False), (0.0, False), (0.25, True), (NAN, True)],
                         ids=["negative", "zero", "positive", "nan"])
def test_precomputed_gates_must_be_log_decays(fused, g0, expect_error):
    x = _decode_args(a=None, b=None, A_log=None, dt_bias=None, g=-torch.rand(N, 1, HV), beta=torch.rand(N, 1, HV))
    x["g"][2, 0, 1] = g0
    bits, error = _verdicts("gdn_decode", x)
    assert (error is not None) == expect_error and (bits != 0) == expect_error, (bits, error)


def test_kda_per_channel_dt_bias_is_checked_whole(fused):
    x = _decode_args("kda")
    x["dt_bias"][1, K - 1] = NAN
    bits, error = _verdicts("kda_decode", x)
    assert bits != 0 and "dt_bias" in error


def test_a_table_above_the_pairwise_limit_keeps_the_torch_rules(fused, monkeypatch):
    from linattn.kernels.triton import value_checks

    monkeypatch.setattr(value_checks, "MAX_PAIRWISE", N - 1)
    nargs, _, dims = validate_call("gdn_decode", _decode_args(), check_values=False)
    rules = value_rules_of("gdn_decode", check_values=True, check_finite=False)
    assert value_rules.fused_value_check(rules, nargs, dims) is None


def test_check_finite_keeps_the_torch_rules(fused):
    nargs, _, dims = validate_call("gdn_decode", _decode_args(), check_values=False)
    rules = value_rules_of("gdn_decode", check_values=True, check_finite=True)
    assert value_rules.fused_value_check(rules, nargs, dims) is None


def test_on_the_cpu_without_the_override_the_torch_rules_run():
    nargs, _, dims = validate_call("gdn_decode", _decode_args(), check_values=False)
    rules = value_rules_of("gdn_decode", check_values=True, check_finite=False)
    assert value_rules.fused_value_check(rules, nargs, dims) is None


def test_a_cached_call_runs_the_kernel_and_not_the_torch_rules(fused, monkeypatch):
    from linattn.kernels.triton.value_checks import DecodeValueCheck

    x = _decode_args()
    linattn.gdn_decode(**x)  # the plan (full validation: the torch rules)
    ran, kernel = [], []
    real_rules, real_check = value_rules._run_value_rules, DecodeValueCheck.__call__
    spy = lambda *a, **k: (ran.append(1), real_rules(*a, **k))[1]  # noqa: E731
    monkeypatch.setattr(value_rules, "_run_value_rules", spy)
    monkeypatch.setattr(fast_path, "_run_value_rules", spy)  # fast_path holds its own reference
    monkeypatch.setattr(DecodeValueCheck, "__call__", lambda self, a: (kernel.append(1), real_check(self, a))[1])
    linattn.gdn_decode(**x)
    assert kernel == [1]  # the cached call ran the check kernel once
    assert ran == []  # every check passed in the kernel: no torch rule ran


@pytest.mark.parametrize("over,refused", [
    (dict(state_indices=torch.cat([torch.arange(999), torch.tensor([5])]).to(torch.int32)), True),  # across tiles
    (dict(state_indices=torch.arange(1000, dtype=torch.int32).flip(0)), False),
    (dict(state_indices=torch.arange(1000, dtype=torch.int32).index_fill(0, torch.tensor([700]), 5000)), True),
], ids=["shared-across-tiles", "valid-1000", "out-of-range-at-700"])
def test_many_rows_cross_the_kernels_tiles_and_blocks(fused, over, refused):
    n = over["state_indices"].shape[0]
    args = _decode_args(n=n, state_pool=torch.zeros(1001, HV, V, K), A_log=torch.randn(HV), **over)
    bits, error = _verdicts("gdn_decode", args)
    assert (error is not None) == refused and (bits != 0) == refused, (bits, error)


def test_a_gate_parameter_array_longer_than_a_block_is_read_whole(fused):
    hv = 500  # KDA's dt_bias [HV, K]: 4,000 elements, many of the kernel's blocks
    dt = torch.zeros(hv, K)
    dt[450, 3] = INF
    x = _decode_args("kda", n=2, v=torch.randn(2, 1, hv, V), a=torch.randn(2, 1, hv, K),
                     b=torch.randn(2, 1, hv), A_log=torch.randn(hv), dt_bias=dt, state_pool=torch.zeros(3, hv, V, K))
    bits, error = _verdicts("kda_decode", x)
    assert error is not None and "dt_bias" in error and bits != 0, (bits, error)
    dt[450, 3] = 0.0
    assert _verdicts("kda_decode", x) == (0, None)


@pytest.mark.parametrize("over,match", [(dict(state_indices=_idx(0, 1, P, 2)), "out of range"),
                                        (dict(state_indices=_idx(0, 1, 1, 2)), "write race"),
                                        (dict(A_log=torch.tensor([NAN, 0.0])), "A_log")],
                         ids=["range", "shared", "A_log"])
def test_a_cached_call_with_bad_values_raises_the_rules_error_and_writes_nothing(fused, over, match):
    x = _decode_args()
    linattn.gdn_decode(**x)
    x.update(over)
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match=match):
        linattn.gdn_decode(**x)
    assert torch.equal(x["state_pool"], before)


def test_random_tables_agree_with_the_torch_rules(fused):
    """Index tables drawn at random, padding, repeats and out-of-range slots included."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(n=st.integers(1, 5), t=st.integers(1, 3), data=st.data(), frozen=st.booleans(),
                      wide=st.booleans())
    def agree(n, t, data, frozen, wide):
        values = st.integers(-2, P + 1)
        table = data.draw(st.lists(st.lists(values, min_size=t, max_size=t), min_size=n, max_size=n))
        idx = torch.tensor(table, dtype=torch.int64 if wide else torch.int32)
        if t == 1 and data.draw(st.booleans()):
            idx = idx[:, 0]
        x = _decode_args(n=n, t=t, state_indices=idx, disable_state_update=frozen)
        bits, error = _verdicts("gdn_decode", x)
        assert (bits != 0) == (error is not None), (table, frozen, bits, error)
    agree()
