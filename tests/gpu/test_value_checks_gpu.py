"""The decode value checks with validate=True on a CUDA GPU, by the torch rules (the default) and by
the fused check kernel (kernels/triton/value_checks.py; opted in with LINATTN_FUSED_VALUE_CHECKS=1,
forced here): bad state indices and non-finite shared gate parameters are refused with the torch
rules' errors on a first call and on a cached call (a good call of the same signature first), with
nothing written, and a good call gives the same bits as validate=False."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.dispatch import fast_path, value_rules

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

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
