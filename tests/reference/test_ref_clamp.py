"""silu_and_mul_clamp reference: hand-computed values, F03/F04 widths, F05 limit=None is plain SwiGLU."""

import pytest
import torch
import torch.nn.functional as F

from linattn.backends.torch_ref import silu_and_mul_clamp_ref

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def same_bits(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and \
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


@pytest.mark.parametrize("cd,tol", [(F64, 1e-15), (F32, 1e-6)])
def test_clamp_hand_computed_values(cd, tol):
    # gate | up = [0, 1, 20, -30] | [5, 2, -30, 40], limit 10:
    #   silu(0) * 5 = 0;  silu(1) * 2 = 2 / (1 + e^-1);  silu(min(20, 10)) * clamp(-30) = -10 * 10 / (1 + e^-10)
    #   silu(-30) * clamp(40) = -30 / (1 + e^30) * 10
    x = torch.tensor([[0.0, 1.0, 20.0, -30.0, 5.0, 2.0, -30.0, 40.0]], dtype=F64)
    out = silu_and_mul_clamp_ref(x, 10.0, compute_dtype=cd)
    assert out.dtype == F64 and out.shape == (1, 4)
    expected = torch.tensor([[0.0, 1.4621171572600098, -99.99546021312975, -2.8072868906517897e-11]], dtype=F64)
    torch.testing.assert_close(out, expected, rtol=tol, atol=0)
    # without a limit: silu(20) * -30 and silu(-30) * 40
    free = silu_and_mul_clamp_ref(x, None, compute_dtype=F64)
    assert free[0, 2].item() == pytest.approx(-30 * 20 / (1 + 2.061153622438558e-09), rel=1e-15)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("D", [1, 7, 352, 1000])
def test_f05_limit_none_is_plain_silu_and_mul_bitwise(dtype, D):
    x = (torch.randn(5, 2 * D) * 20).to(dtype)
    plain = (F.silu(x[:, :D].float().contiguous()) * x[:, D:].float().contiguous()).to(dtype)
    assert same_bits(silu_and_mul_clamp_ref(x, None), plain)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_a_limit_above_every_value_changes_nothing(dtype):
    x = torch.randn(6, 2 * 33).to(dtype)
    assert same_bits(silu_and_mul_clamp_ref(x, 1e6), silu_and_mul_clamp_ref(x, None))


@pytest.mark.parametrize("D", [1, 7, 352, 16384, 18432])
def test_f03_f04_clamp_matches_its_definition_for_any_width(D):
    x = torch.randn(3, 2 * D, dtype=F64) * 30
    L = 10.0
    expected = F.silu(torch.minimum(x[:, :D], torch.tensor(L, dtype=F64))) * x[:, D:].clamp(-L, L)
    out = silu_and_mul_clamp_ref(x, L, compute_dtype=F64)
    torch.testing.assert_close(out, expected, rtol=1e-15, atol=0)
    assert out.abs().max() <= L * L  # |silu(min(g, L))| <= L for g >= -1.28 ..., |up| <= L


def test_gate_is_clamped_from_above_only():
    # gate -50 stays -50 (silu(-50) ~ -1e-20), it is not raised to -L
    x = torch.tensor([[-50.0, 10.0]], dtype=F64)
    out = silu_and_mul_clamp_ref(x, 5.0, compute_dtype=F64)
    assert out.item() == pytest.approx(-50 / (1 + 5.184705528587072e21) * 5.0, rel=1e-12)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_f03_zero_rows_give_an_empty_result(dtype):
    out = silu_and_mul_clamp_ref(torch.empty(0, 2 * 18432, dtype=dtype), 10.0)
    assert out.shape == (0, 18432) and out.dtype == dtype


def test_clamp_fp32_mode_matches_fp64_oracle():
    x = torch.randn(64, 2 * 128) * 12
    o32 = silu_and_mul_clamp_ref(x, 10.0)
    o64 = silu_and_mul_clamp_ref(x.double(), 10.0, compute_dtype=F64)
    assert ((o32.double() - o64).norm() / o64.norm()).item() < 1e-6
