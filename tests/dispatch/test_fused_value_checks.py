"""The decode and prefill value checks as one kernel each (kernels/triton/value_checks.py,
dispatch/rules/value_rules.py ``fused_value_check``): each flags exactly the calls the torch rules refuse
(prefill: exactly the checks they refuse), and a refused call raises the torch rules' error before
anything is written. Run in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import os  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # the cases are CPU tensors; on a GPU machine see the note
    pytest.skip("runs the check kernel in the Triton interpreter on CPU tensors (the suite's default on a "
                "machine without a GPU); compiled on a GPU: tests/gpu/test_value_checks_gpu.py", allow_module_level=True)

import linattn  # noqa: E402
from linattn.dispatch.runtime import fast_path  # noqa: E402
from linattn.dispatch.rules import value_rules  # noqa: E402
from linattn.dispatch.rules.validate import validate_call, value_rules_of  # noqa: E402

from value_check_cases import verdicts  # noqa: E402

N, H, HV, K, V, P, T = 4, 1, 2, 8, 8, 6, 2
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", True)
    monkeypatch.setattr(value_rules, "HOST_VALUE_RULES", False)  # the kernel is compared with the torch probes
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
    bits, error = verdicts("gdn_decode", _decode_args(**over))
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
    bits, error = verdicts("gdn_decode", _table_args(table, accepted))
    assert (error is not None) == refused and (bits != 0) == refused, (bits, error)


@pytest.mark.parametrize("rows,expect_error", [([0, 2, -1, 1], False), ([0, 3, -1, 1], True), ([0, 2, 2, 1], True)],
                         ids=["valid", "out of range", "shared"])
def test_intermediate_state_indices(fused, rows, expect_error):
    x = _decode_args(intermediate_states=torch.zeros(3, 1, HV, V, K), intermediate_state_indices=_idx(*rows))
    bits, error = verdicts("gdn_decode", x)
    assert (error is not None) == expect_error and (bits != 0) == expect_error, (bits, error)


@pytest.mark.parametrize("g0,expect_error", [(-0.5, False), (0.0, False), (0.25, True), (NAN, True)],
                         ids=["negative", "zero", "positive", "nan"])
def test_precomputed_gates_must_be_log_decays(fused, g0, expect_error):
    x = _decode_args(a=None, b=None, A_log=None, dt_bias=None, g=-torch.rand(N, 1, HV), beta=torch.rand(N, 1, HV))
    x["g"][2, 0, 1] = g0
    bits, error = verdicts("gdn_decode", x)
    assert (error is not None) == expect_error and (bits != 0) == expect_error, (bits, error)


def test_kda_per_channel_dt_bias_is_checked_whole(fused):
    x = _decode_args("kda")
    x["dt_bias"][1, K - 1] = NAN
    bits, error = verdicts("kda_decode", x)
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


@pytest.mark.parametrize("over,refused", [
    (dict(state_indices=torch.cat([torch.arange(999), torch.tensor([5])]).to(torch.int32)), True),  # across tiles
    (dict(state_indices=torch.arange(1000, dtype=torch.int32).flip(0)), False),
    (dict(state_indices=torch.arange(1000, dtype=torch.int32).index_fill(0, torch.tensor([700]), 5000)), True),
], ids=["shared-across-tiles", "valid-1000", "out-of-range-at-700"])
def test_many_rows_cross_the_kernels_tiles_and_blocks(fused, over, refused):
    n = over["state_indices"].shape[0]
    args = _decode_args(n=n, state_pool=torch.zeros(1001, HV, V, K), A_log=torch.randn(HV), **over)
    bits, error = verdicts("gdn_decode", args)
    assert (error is not None) == refused and (bits != 0) == refused, (bits, error)


def test_a_gate_parameter_array_longer_than_a_block_is_read_whole(fused):
    hv = 500  # KDA's dt_bias [HV, K]: 4,000 elements, many of the kernel's blocks
    dt = torch.zeros(hv, K)
    dt[450, 3] = INF
    x = _decode_args("kda", n=2, v=torch.randn(2, 1, hv, V), a=torch.randn(2, 1, hv, K),
                     b=torch.randn(2, 1, hv), A_log=torch.randn(hv), dt_bias=dt, state_pool=torch.zeros(3, hv, V, K))
    bits, error = verdicts("kda_decode", x)
    assert error is not None and "dt_bias" in error and bits != 0, (bits, error)
    dt[450, 3] = 0.0
    assert verdicts("kda_decode", x) == (0, None)


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
        bits, error = verdicts("gdn_decode", x)
        assert (bits != 0) == (error is not None), (table, frozen, bits, error)
    agree()



# -- prefill (gdn_prefill, kda_prefill) ------------------------------------------------------------

#: a fragment of each prefill check's torch-rule message -> the check's name (value_checks.PREFILL_CHECKS)
_PREFILL_MESSAGES = {"it must be 0": "cu_seqlens[0] == 0", "non-decreasing": "cu_seqlens non-decreasing",
                     "must equal the total token count": "cu_seqlens[-1] == T", "out of range": "state_indices range",
                     "write race": "state_indices shared slot", "log-space decay": "g <= 0"}


def _prefill_args(family="gdn", lens=(2, 0, 3, 1), seed=0, pool=True, **over):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cu = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    t, n = int(cu[-1]), len(lens)
    gk = (K,) if family == "kda" else ()
    x = dict(q=r(t, H, K), k=r(t, H, K), v=r(t, HV, V), g=-torch.rand(t, HV, *gk, generator=g),
             beta=torch.rand(t, HV, generator=g), cu_seqlens=cu)
    if pool:
        x.update(state_pool=r(P, HV, V, K), state_indices=torch.arange(n, dtype=torch.int32).flip(0))
    x.update(over)
    return x


def _prefill_failures(op: str, args: dict) -> tuple:
    """(the checks the fused kernel flags, the checks the torch rules refuse, the first torch error or
    None) for one call: every torch probe is evaluated and each failing one explained."""
    from linattn.kernels.triton.value_checks import PREFILL_CHECKS

    nargs, _, dims = validate_call(op, args, check_values=False)
    rules = value_rules_of(op, check_values=True, check_finite=False)
    check = value_rules.fused_value_check(rules, nargs, dims)
    assert check is not None, "the fused check should apply to this call"
    bits = check.check(nargs)
    flagged = {name for i, name in enumerate(PREFILL_CHECKS) if bits >> i & 1}
    refused, first = set(), None
    for rule in rules:
        for bad, explain in rule(nargs, dims):
            if bool(bad):
                with pytest.raises(ValueError) as info:
                    explain()
                first = first or str(info.value)
                refused |= {c for m, c in _PREFILL_MESSAGES.items() if m in str(info.value)}
    return flagged, refused, first


def _cu(*v, dtype=torch.int32):
    return torch.tensor(v, dtype=dtype)


#: case -> (arguments changed, the checks the torch rules refuse); the default call: lens 2, 0, 3, 1
#: (T = 6, N = 4) in slots 3, 2, 1, 0 of P = 6
PREFILL_CASES = {
    "valid": ({}, set()),
    "one sequence": (dict(lens=(6,)), set()),
    "only empty sequences, T = 0": (dict(lens=(0, 0, 0)), set()),
    "no sequence, T = 0": (dict(lens=()), set()),
    "slots at the bounds": (dict(state_indices=_idx(0, P - 1, -1, 1)), set()),
    "negative indices other than -1, repeated": (dict(state_indices=_idx(-5, -2, -5, 4)), set()),
    "slot out of range": (dict(state_indices=_idx(0, P, 1, 2)), {"state_indices range"}),
    "slot far out of range, int64": (dict(state_indices=_idx(0, 2 ** 40, 1, 2, dtype=torch.int64)),
                                     {"state_indices range"}),
    "shared slot": (dict(state_indices=_idx(0, 3, 5, 3)), {"state_indices shared slot"}),
    "shared slot, out of range too": (dict(state_indices=_idx(P, 2, P, 2)),
                                      {"state_indices range", "state_indices shared slot"}),
    "cu_seqlens starts at 1": (dict(cu_seqlens=_cu(1, 2, 2, 5, 6)), {"cu_seqlens[0] == 0"}),
    "cu_seqlens decreasing": (dict(cu_seqlens=_cu(0, 4, 2, 5, 6)), {"cu_seqlens non-decreasing"}),
    "cu_seqlens decreasing at the end": (dict(cu_seqlens=_cu(0, 2, 2, 7, 6)), {"cu_seqlens non-decreasing"}),
    "cu_seqlens beyond T": (dict(cu_seqlens=_cu(0, 2, 2, 5, 7)), {"cu_seqlens[-1] == T"}),
    "cu_seqlens short of T": (dict(cu_seqlens=_cu(0, 2, 2, 5, 5)), {"cu_seqlens[-1] == T"}),
    "cu_seqlens negative start, int64 huge": (dict(cu_seqlens=_cu(-1, 2, 2 ** 40, 5, 6, dtype=torch.int64)),
                                              {"cu_seqlens[0] == 0", "cu_seqlens non-decreasing"}),
    "strided cu_seqlens and indices": (dict(cu_seqlens=_cu(0, 9, 2, 9, 2, 9, 5, 9, 6, 9)[::2],
                                            state_indices=_idx(0, 9, 1, 9, 2, 9, 4, 9)[::2]), set()),
    "strided indices, shared": (dict(state_indices=_idx(0, 9, 1, 9, 1, 9, 4, 9)[::2]), {"state_indices shared slot"}),
    "strided cu_seqlens, decreasing": (dict(cu_seqlens=_cu(0, 9, 3, 9, 2, 9, 5, 9, 6, 9)[::2]),
                                       {"cu_seqlens non-decreasing"}),
}


@pytest.mark.parametrize("case", PREFILL_CASES, ids=list(PREFILL_CASES))
def test_prefill_kernel_flags_exactly_the_checks_the_torch_rules_refuse(fused, case):
    over, refused = dict(PREFILL_CASES[case][0]), PREFILL_CASES[case][1]
    lens = over.pop("lens", (2, 0, 3, 1))
    x = _prefill_args(lens=lens, **{"state_indices": torch.arange(len(lens), dtype=torch.int32), **over})
    flagged, torch_refused, _ = _prefill_failures("gdn_prefill", x)
    assert torch_refused == refused and flagged == refused, (flagged, torch_refused)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("g0,refused", [(-0.5, False), (0.0, False), (-float("inf"), False), (0.25, True),
                                        (NAN, True), (INF, True)],
                         ids=["negative", "zero", "-inf", "positive", "nan", "inf"])
def test_prefill_gates_must_be_log_decays(fused, family, g0, refused):
    x = _prefill_args(family)
    x["g"][4, 1, ...] = g0  # KDA: every channel of the head; the next test sets one channel
    flagged, torch_refused, _ = _prefill_failures(f"{family}_prefill", x)
    assert flagged == torch_refused == ({"g <= 0"} if refused else set()), (flagged, torch_refused)


def test_prefill_kda_one_bad_key_channel_is_found(fused):
    x = _prefill_args("kda")
    x["g"][5, HV - 1, K - 1] = 1.0
    flagged, torch_refused, first = _prefill_failures("kda_prefill", x)
    assert flagged == torch_refused == {"g <= 0"} and "g[5, 1, 7]" in first


def test_prefill_dense_mode_checks_cu_seqlens_and_gates(fused):
    x = _prefill_args(pool=False, cu_seqlens=_cu(0, 2, 2, 1, 6))
    x["g"][0, 0] = NAN
    flagged, torch_refused, _ = _prefill_failures("gdn_prefill", x)
    assert flagged == torch_refused == {"cu_seqlens non-decreasing", "g <= 0"}
    assert _prefill_failures("gdn_prefill", _prefill_args(pool=False))[:2] == (set(), set())


def test_prefill_with_has_initial_state_keeps_the_fused_check(fused):
    x = _prefill_args(has_initial_state=torch.tensor([True, False, True, False]), state_indices=_idx(2, 0, 2, 1))
    flagged, torch_refused, _ = _prefill_failures("gdn_prefill", x)
    assert flagged == torch_refused == {"state_indices shared slot"}


@pytest.mark.parametrize("over", [dict(g=torch.zeros(HV, 6).T),
                                  dict(state_indices=torch.arange(8, dtype=torch.int32).view(4, 2)[:, 0])],
                         ids=["strided g", "strided indices"])
def test_prefill_strided_g_keeps_the_torch_rules_strided_indices_do_not(fused, over):
    nargs, _, dims = validate_call("gdn_prefill", _prefill_args(**over), check_values=False)
    rules = value_rules_of("gdn_prefill", check_values=True, check_finite=False)
    assert (value_rules.fused_value_check(rules, nargs, dims) is None) == ("g" in over)


def test_prefill_above_the_pairwise_limit_keeps_the_torch_rules(fused, monkeypatch):
    from linattn.kernels.triton import value_checks

    monkeypatch.setattr(value_checks, "PREFILL_MAX_PAIRWISE", 3)
    nargs, _, dims = validate_call("gdn_prefill", _prefill_args(), check_values=False)
    rules = value_rules_of("gdn_prefill", check_values=True, check_finite=False)
    assert value_rules.fused_value_check(rules, nargs, dims) is None
    nargs, _, dims = validate_call("gdn_prefill", _prefill_args(pool=False), check_values=False)
    assert value_rules.fused_value_check(rules, nargs, dims) is not None  # no indices: no pairwise check


def test_prefill_check_finite_and_the_cpu_default_keep_the_torch_rules(fused, monkeypatch):
    nargs, _, dims = validate_call("gdn_prefill", _prefill_args(), check_values=False)
    assert value_rules.fused_value_check(value_rules_of("gdn_prefill", check_values=True, check_finite=True),
                                         nargs, dims) is None
    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", None)
    monkeypatch.delenv("LINATTN_FUSED_VALUE_CHECKS", raising=False)  # the default is CUDA-only: CPU keeps the rules
    assert value_rules.fused_value_check(value_rules_of("gdn_prefill", check_values=True, check_finite=False),
                                         nargs, dims) is None


@pytest.mark.parametrize("where", ["first program", "last program"])
def test_prefill_work_spread_over_programs_is_read_whole(fused, monkeypatch, where):
    """With a few elements per program the grid has many programs; a bad value in any one's share,
    and a slot shared between the tile rows of two programs, is found; the words are ORed."""
    from linattn.kernels.triton import value_checks

    monkeypatch.setattr(value_checks, "STREAM_PER_PROGRAM", 16)
    monkeypatch.setattr(value_checks, "PREFILL_BLOCK", 16)  # block b of g, cu_seqlens, ... in program b % 8
    n = 2 * value_checks.TILE + 3  # three rows of tiles: three programs for the pairwise check at least
    lens = [0] * (n - 2) + [40, 24]
    slots = torch.arange(n, dtype=torch.int32)
    x = _prefill_args(lens=lens, state_pool=torch.zeros(n + 1, HV, V, K), state_indices=slots)
    nargs, _, dims = validate_call("gdn_prefill", x, check_values=False)
    rules = value_rules_of("gdn_prefill", check_values=True, check_finite=False)
    check = value_rules.fused_value_check(rules, nargs, dims)
    assert check.check.programs == 8 and check.check(nargs) == 0  # g: 128 elements, 16 per program
    at = 0 if where == "first program" else -1
    x["g"].view(-1)[at] = 0.5
    x["state_indices"] = slots.index_fill(0, torch.tensor([n - 1 if at else 0]), n - 2 if at else 2 * value_checks.TILE)
    x["cu_seqlens"] = x["cu_seqlens"].index_fill(0, torch.tensor([n - 1 if at else 1]), 65 if at else 1)
    flagged, torch_refused, _ = _prefill_failures("gdn_prefill", x)
    assert flagged == torch_refused == {"state_indices shared slot", "g <= 0", "cu_seqlens non-decreasing"}, \
        (flagged, torch_refused)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_a_cached_call_runs_the_kernel_and_not_the_torch_rules(fused, monkeypatch, phase):
    from linattn.kernels.triton import value_checks

    x = _decode_args() if phase == "decode" else _prefill_args()
    op = getattr(linattn, f"gdn_{phase}")
    check_cls = value_checks.DecodeValueCheck if phase == "decode" else value_checks.PrefillValueCheck
    op(**x)  # the plan (full validation: the torch rules)
    ran, kernel = [], []
    real_rules, real_check = value_rules._run_value_rules, check_cls.__call__
    spy = lambda *a, **k: (ran.append(1), real_rules(*a, **k))[1]  # noqa: E731
    monkeypatch.setattr(value_rules, "_run_value_rules", spy)
    monkeypatch.setattr(fast_path, "_run_value_rules", spy)  # fast_path holds its own reference
    monkeypatch.setattr(check_cls, "__call__", lambda self, a: (kernel.append(1), real_check(self, a))[1])
    op(**x)
    assert kernel == [1]  # the cached call ran the check kernel once
    assert ran == []  # every check passed in the kernel: no torch rule ran


_REFUSED_CALLS = {
    "slot out of range": (dict(state_indices=_idx(0, 1, P, 2)), "out of range"),
    "shared slot": (dict(state_indices=_idx(0, 1, 1, 2)), "write race"),
    "cu_seqlens decreasing": (dict(cu_seqlens=_cu(0, 4, 2, 5, 6)), "non-decreasing"),
    "cu_seqlens beyond T": (dict(cu_seqlens=_cu(0, 2, 2, 5, 7)), "total token count"),
    "cu_seqlens start": (dict(cu_seqlens=_cu(1, 2, 2, 5, 6)), "must be 0"),
    "g NaN": (dict(g=torch.full((6, HV), NAN)), "log-space decay"),
}


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("case", _REFUSED_CALLS, ids=list(_REFUSED_CALLS))
def test_prefill_cached_call_with_bad_values_raises_the_rules_error_and_writes_nothing(fused, family, case):
    over, match = _REFUSED_CALLS[case]
    if family == "kda" and "g" in over:
        over = dict(g=torch.full((6, HV, K), NAN))
    x = _prefill_args(family)
    op = getattr(linattn, f"{family}_prefill")
    op(**x)  # the plan
    assert fast_path._plans and all(p.value_check is not None for p in fast_path._plans.values())
    x.update(over)
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match=match):
        op(**x)
    assert torch.equal(x["state_pool"], before)


def test_prefill_random_tables_agree_with_the_torch_rules(fused):
    """cu_seqlens, slots and gates drawn at random: empty sequences, padding, repeats, slots out of
    range, broken prefix sums and bad gates included; the kernel flags exactly the checks the
    torch rules refuse."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(lens=st.lists(st.integers(0, 3), min_size=0, max_size=5), data=st.data(), wide=st.booleans())
    def agree(lens, data, wide):
        x = _prefill_args(lens=lens)
        itype = torch.int64 if wide else torch.int32
        slots = data.draw(st.lists(st.integers(-3, P + 1), min_size=len(lens), max_size=len(lens)))
        x["state_indices"] = torch.tensor(slots, dtype=itype)
        cu = x["cu_seqlens"].to(itype)
        if data.draw(st.booleans()):  # one prefix sum moved
            cu[data.draw(st.integers(0, len(lens)))] += data.draw(st.integers(-2, 2))
        x["cu_seqlens"] = cu
        if x["g"].numel() and data.draw(st.booleans()):
            x["g"].view(-1)[data.draw(st.integers(0, x["g"].numel() - 1))] = data.draw(
                st.sampled_from([0.0, -INF, 1e-30, INF, NAN]))
        flagged, torch_refused, _ = _prefill_failures("gdn_prefill", x)
        assert flagged == torch_refused, (lens, slots, cu.tolist(), flagged, torch_refused)
    agree()


@pytest.mark.parametrize("env, fast, want", [(None, True, True), ("1", True, True), ("0", True, False),
                                             (None, False, False)])
def test_the_fused_checks_are_the_cuda_default_where_the_direct_launch_runs(monkeypatch, env, fast, want):
    """On CUDA the fused checks run where the direct Triton launch does, unless
    LINATTN_FUSED_VALUE_CHECKS=0 opts out; on the CPU never (FUSED_VALUE_CHECKS unset)."""
    from linattn.kernels.triton import launch as launch_mod

    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", None)
    monkeypatch.setattr(launch_mod, "fast_launch_status", lambda: (fast, "patched"))
    if env is None:
        monkeypatch.delenv("LINATTN_FUSED_VALUE_CHECKS", raising=False)
    else:
        monkeypatch.setenv("LINATTN_FUSED_VALUE_CHECKS", env)
    assert value_rules._fusable_device(torch.device("cuda", 0)) is want
    assert value_rules._fusable_device(torch.device("cpu")) is False


@pytest.mark.parametrize("op", ["gdn_decode", "gdn_prefill"])
def test_a_new_length_of_a_class_derives_its_check_and_it_is_a_fresh_plans(fused, op):
    """A class plan's new N or T takes its fused check from the class's (``like``): the same launch
    (scalars, grid, constexprs) as a check planned afresh, and it refuses what the torch rules refuse."""
    def args(n, slots):
        if op == "gdn_decode":
            return _decode_args(n=n, state_indices=slots)
        t = 3 * n
        g = torch.Generator().manual_seed(n)
        return dict(q=torch.randn(t, H, K, generator=g), k=torch.randn(t, H, K, generator=g),
                    v=torch.randn(t, HV, V, generator=g), g=-torch.rand(t, HV, generator=g),
                    beta=torch.rand(t, HV, generator=g), cu_seqlens=torch.arange(0, t + 1, 3, dtype=torch.int32),
                    state_pool=torch.randn(P, HV, V, K, generator=g), state_indices=slots)
    call = getattr(linattn, op)
    call(**args(3, _idx(0, 1, 2)))
    x = args(5, _idx(4, 0, 3, 1, 2))
    call(**x)
    (plan,) = [p for k, p in fast_path._plans.items() if k[0] == op and p.dims["n"] == 5]
    (first,) = [p for k, p in fast_path._plans.items() if k[0] == op and p.dims["n"] == 3]
    assert plan.value_check.check.launch._compiled is first.value_check.check.launch._compiled  # derived
    nargs, _, dims = validate_call(op, x, check_values=False)
    fresh = value_rules.fused_value_check(plan.rules, nargs, dims)
    got, want = plan.value_check.check.launch, fresh.check.launch
    assert (got.scalars, got.grid, got.constexprs) == (want.scalars, want.grid, want.constexprs)
    bad = args(4, _idx(0, 1, P, 2))  # a slot out of range, in the same class
    pool0 = bad["state_pool"].clone()
    with pytest.raises(ValueError, match="state_indices"):
        call(**bad)
    assert torch.equal(bad["state_pool"], pool0)
