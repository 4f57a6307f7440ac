"""The decode and prefill value checks with validate=True on a CUDA GPU, by the torch rules
(``LINATTN_FUSED_VALUE_CHECKS=0``) and by the fused check kernels (kernels/triton/value_checks.py,
the default on CUDA), each forced here: bad state indices, non-finite shared gate parameters
(decode), bad cu_seqlens and gates that are no log decays (prefill) are refused with the torch rules'
errors on a first call and on a cached call (a good call of the same signature first), with nothing
written, and a good call gives the same bits as validate=False. The compiled prefill kernel flags
exactly the checks the torch rules refuse on seeded random tables, and on calls whose checks are
spread over many programs."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import linattn
from linattn.dispatch.runtime import fast_path
from linattn.dispatch.rules import value_rules

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dispatch"))
from value_check_cases import verdicts  # noqa: E402

DEV = "cuda"
H, HV, K, V, N, P = 16, 32, 128, 128, 8, 20


def _args(**over):
    g = torch.Generator(device=DEV).manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, device=DEV)

    a = dict(q=r(N, 1, H, K).bfloat16(), k=r(N, 1, H, K).bfloat16(), v=r(N, 1, HV, V).bfloat16(),
             a=r(N, 1, HV).bfloat16(), b=r(N, 1, HV).bfloat16(), A_log=r(HV), dt_bias=r(HV),
             state_pool=torch.zeros(P, HV, V, K, device=DEV),
             state_indices=torch.arange(N, dtype=torch.int32, device=DEV))
    a.update(over)
    return a


def _with(i, value, like):
    x = like.clone()
    x[i] = value
    return x


BAD = {
    "out of range": (dict(state_indices=_with(7, 99, torch.arange(N, dtype=torch.int32))), "out of range"),
    "shared slot": (dict(state_indices=_with(7, 6, torch.arange(N, dtype=torch.int32))), "write race"),
    "A_log nan": (dict(A_log=_with(3, float("nan"), torch.zeros(HV))), "not finite"),
    "dt_bias inf": (dict(dt_bias=_with(0, float("inf"), torch.zeros(HV))), "not finite"),
}


@pytest.fixture(params=[None, True], ids=["torch-rules", "fused-kernel"])
def checks(request, monkeypatch):
    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", request.param)
    monkeypatch.delenv("LINATTN_FUSED_VALUE_CHECKS", raising=False)
    fast_path.clear()
    yield request.param
    fast_path.clear()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_values_are_refused_on_first_and_cached_calls_and_nothing_is_written(name, checks):
    over, msg = BAD[name]
    x = _args(**{k: v.to(DEV) for k, v in over.items()})
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match=msg):  # a first call: full validation
        linattn.gdn_decode(**x)
    good = _args()
    linattn.gdn_decode(**good)  # the same signature, now cached
    for _ in range(2):  # the cached path meets the bad values
        with pytest.raises(ValueError, match=msg):
            linattn.gdn_decode(**x)
    torch.cuda.synchronize()
    assert torch.equal(x["state_pool"], before)


def test_a_good_call_with_padding_equals_validate_off_bitwise(checks):
    idx = torch.tensor([0, -1, 2, 3, 4, 5, 6, 7], dtype=torch.int32, device=DEV)
    x1, x2 = _args(state_indices=idx), _args(state_indices=idx.clone())
    for _ in range(3):
        o1 = linattn.gdn_decode(**x1, validate=True)
        o2 = linattn.gdn_decode(**x2, validate=False)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(x1["state_pool"], x2["state_pool"])



# -- prefill ---------------------------------------------------------------------------------------

LENS = (5, 0, 70, 1, 64, 3, 0, 9)  # N = 8 sequences, empty ones and a chunk boundary crossed
T_PRE = sum(LENS)


def _cu_of(lens, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=dtype, device=DEV)


def _prefill_args(family="gdn", lens=LENS, p=P, **over):
    g = torch.Generator(device=DEV).manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g, device=DEV)

    t, gk = sum(lens), ((K,) if family == "kda" else ())
    a = dict(q=r(t, H, K).bfloat16(), k=r(t, H, K).bfloat16(), v=r(t, HV, V).bfloat16(),
             g=-0.1 * torch.rand(t, HV, *gk, generator=g, device=DEV), beta=torch.rand(t, HV, generator=g, device=DEV),
             cu_seqlens=_cu_of(lens), state_pool=r(p, HV, V, K),
             state_indices=torch.arange(len(lens), dtype=torch.int32, device=DEV).flip(0))
    a.update(over)
    return a


def _bad_gate(family, value):
    g = -0.1 * torch.ones(T_PRE, HV, *((K,) if family == "kda" else ()), device=DEV)
    g[T_PRE - 1, HV - 1, ...] = value
    return g


BAD_PREFILL = {
    "slot out of range": (lambda f: dict(state_indices=_with(7, P, torch.arange(N, dtype=torch.int32))), "out of range"),
    "shared slot": (lambda f: dict(state_indices=_with(7, 0, torch.arange(N, dtype=torch.int32))), "write race"),
    "cu_seqlens start": (lambda f: dict(cu_seqlens=_with(0, 1, _cu_of(LENS))), "must be 0"),
    "cu_seqlens decreasing": (lambda f: dict(cu_seqlens=_with(2, 100, _cu_of(LENS))), "non-decreasing"),
    "cu_seqlens beyond T": (lambda f: dict(cu_seqlens=_with(N, T_PRE + 1, _cu_of(LENS))), "total token count"),
    "g positive": (lambda f: dict(g=_bad_gate(f, 0.5)), "log-space decay"),
    "g nan": (lambda f: dict(g=_bad_gate(f, float("nan"))), "log-space decay"),
}


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("name", list(BAD_PREFILL))
def test_prefill_bad_values_are_refused_on_first_and_cached_calls_and_nothing_is_written(name, family, checks):
    over, msg = BAD_PREFILL[name]
    op = getattr(linattn, f"{family}_prefill")
    x = _prefill_args(family, **{k: v.to(DEV) for k, v in over(family).items()})
    before = x["state_pool"].clone()
    with pytest.raises(ValueError, match=msg):  # a first call: full validation
        op(**x)
    op(**_prefill_args(family))  # the same signature, now cached
    if checks:
        assert all(p.value_check is not None for p in fast_path._plans.values()), "the fused check should run"
    for _ in range(2):  # the cached path meets the bad values
        with pytest.raises(ValueError, match=msg):
            op(**x)
    torch.cuda.synchronize()
    assert torch.equal(x["state_pool"], before)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_good_call_with_padding_equals_validate_off_bitwise(family, checks):
    idx = torch.tensor([0, -1, 2, 3, -7, 5, 6, 19], dtype=torch.int32, device=DEV)
    x1 = _prefill_args(family, state_indices=idx)
    x2 = dict(x1, state_pool=x1["state_pool"].clone(), state_indices=idx.clone())
    op = getattr(linattn, f"{family}_prefill")
    for _ in range(3):
        o1 = op(**x1, validate=True)
        o2 = op(**x2, validate=False)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(x1["state_pool"], x2["state_pool"])


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", True)
    fast_path.clear()
    yield
    fast_path.clear()


def test_prefill_compiled_kernel_agrees_with_the_torch_rules_on_random_tables(fused):
    """Seeded random prefix sums (one moved at times), slots (padding, repeats, out of range) and gates."""
    from linattn.kernels.triton.value_checks import PREFILL_CHECKS

    gen = torch.Generator().manual_seed(7)
    refused = 0
    for case in range(200):
        n = int(torch.randint(0, 9, (1,), generator=gen))
        lens = torch.randint(0, 40, (n,), generator=gen).tolist()
        itype = torch.int64 if case % 2 else torch.int32
        cu = _cu_of(lens, itype)
        if case % 3 == 0:
            cu[int(torch.randint(0, n + 1, (1,), generator=gen))] += int(torch.randint(-3, 4, (1,), generator=gen))
        x = _prefill_args(lens=lens, cu_seqlens=cu,
                          state_indices=torch.randint(-3, P + 2, (n,), generator=gen).to(DEV, itype))
        if x["g"].numel() and case % 4 == 0:
            x["g"].view(-1)[int(torch.randint(0, x["g"].numel(), (1,), generator=gen))] = (0.5, float("nan"))[case % 8 // 4]
        bits, error = verdicts("gdn_prefill", x)
        assert (bits != 0) == (error is not None), (lens, cu.tolist(), x["state_indices"].tolist(), bits, error)
        assert bits < 1 << len(PREFILL_CHECKS)
        refused += error is not None
    assert 40 < refused < 160  # both verdicts are well represented


@pytest.mark.parametrize("where", [0, -1], ids=["first element", "last element"])
def test_prefill_checks_spread_over_many_programs_find_one_bad_value(fused, where):
    """KDA's g [T, HV, K] of 2 x 4,096 tokens (many programs), 300 sequences (pairwise check over
    tiles of several programs): one positive gate or one shared slot anywhere is found."""
    from linattn.dispatch.rules.validate import validate_call, value_rules_of

    lens = (4096, 4096) + (0,) * 298
    x = _prefill_args("kda", lens=lens, p=320, state_indices=torch.arange(300, dtype=torch.int32, device=DEV))
    assert verdicts("kda_prefill", x) == (0, None)
    nargs, _, dims = validate_call("kda_prefill", x, check_values=False)
    rules = value_rules_of("kda_prefill", check_values=True, check_finite=False)
    assert value_rules.fused_value_check(rules, nargs, dims).check.programs > 100
    g = x["g"].clone()
    g.view(-1)[where] = 0.5
    assert verdicts("kda_prefill", dict(x, g=g))[0] == 1 << 5
    idx = x["state_indices"].clone()
    idx[where] = 150  # sequence 150's slot too
    assert verdicts("kda_prefill", dict(x, state_indices=idx))[0] == 1 << 4
