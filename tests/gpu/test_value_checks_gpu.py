"""The decode value checks with validate=True on a CUDA GPU (the fused check kernel of
kernels/triton/value_checks.py where the direct launch is on, the torch rules otherwise): bad
state indices and non-finite shared gate parameters are refused with the torch rules' errors on the
first call and on cached calls, and a good call gives the same bits as validate=False."""

from __future__ import annotations

import pytest
import torch

import linattn

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


@pytest.mark.parametrize("name", list(BAD))
def test_bad_values_are_refused_on_first_and_cached_calls_and_nothing_is_written(name):
    over, msg = BAD[name]
    x = _args(**{k: v.to(DEV) for k, v in over.items()})
    before = x["state_pool"].clone()
    for _ in range(3):  # the first call plans; the later ones take the cached path
        with pytest.raises(ValueError, match=msg):
            linattn.gdn_decode(**x)
    torch.cuda.synchronize()
    assert torch.equal(x["state_pool"], before)


def test_a_good_call_with_padding_equals_validate_off_bitwise():
    idx = torch.tensor([0, -1, 2, 3, 4, 5, 6, 7], dtype=torch.int32, device=DEV)
    x1, x2 = _args(state_indices=idx), _args(state_indices=idx.clone())
    for _ in range(3):
        o1 = linattn.gdn_decode(**x1, validate=True)
        o2 = linattn.gdn_decode(**x2, validate=False)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(x1["state_pool"], x2["state_pool"])
