"""gdn_gating / kda_gating: hand-computed values, the softplus threshold, F18 extremes, F11 views."""

import math

import pytest
import torch

from linattn.backends.torch_ref import G_MIN, gdn_gating_ref, kda_gating_ref

F64, F32 = torch.float64, torch.float32
LN2 = 0.6931471805599453
SOFTPLUS_1 = 1.3132616875182228  # log(1 + e)


@pytest.mark.parametrize("cd,tol", [(F64, 1e-15), (F32, 1e-6)])
def test_gdn_gating_hand_computed_values(cd, tol):
    # head 0: A_log 0 (rate 1), x = 0   -> softplus = ln 2, g = -ln 2;  b = 0    -> beta 1/2
    # head 1: A_log ln 2 (rate 2), x = 1 -> softplus = ln(1+e), g = -2 ln(1+e); b = ln 3 -> beta 3/4
    A_log = torch.tensor([0.0, LN2], dtype=F64)
    a = torch.tensor([[0.0, 0.5]], dtype=F64)
    dt_bias = torch.tensor([0.0, 0.5], dtype=F64)
    b = torch.tensor([[0.0, math.log(3.0)]], dtype=F64)
    g, beta = gdn_gating_ref(A_log, a, b, dt_bias, compute_dtype=cd)
    assert g.dtype == cd and beta.dtype == cd and g.shape == (1, 2)
    torch.testing.assert_close(g, torch.tensor([[-LN2, -2 * SOFTPLUS_1]], dtype=cd), rtol=tol, atol=0)
    torch.testing.assert_close(beta, torch.tensor([[0.5, 0.75]], dtype=cd), rtol=tol, atol=0)


def test_softplus_threshold_and_beta():
    A_log = torch.zeros(4, dtype=F64)
    dt_bias = torch.zeros(4, dtype=F64)
    b = torch.zeros(1, 4, dtype=F64)
    # 25 > 20: identity; 19.5 < 20: log1p(exp(19.5)) = 19.5 + 3.4e-9
    g, _ = gdn_gating_ref(A_log, torch.tensor([[25.0, 19.5, 1.0, 15.0]], dtype=F64), b, dt_bias, compute_dtype=F64)
    assert g[0, 0].item() == -25.0
    assert g[0, 1].item() == pytest.approx(-(19.5 + math.exp(-19.5)), rel=1e-15)
    assert g[0, 1].item() != -19.5
    # softplus_beta = 2: x = 1 -> log1p(e^2) / 2; x = 15 -> 2 * 15 = 30 > 20, identity
    g2, _ = gdn_gating_ref(A_log, torch.tensor([[25.0, 19.5, 1.0, 15.0]], dtype=F64), b, dt_bias,
                           softplus_beta=2.0, compute_dtype=F64)
    assert g2[0, 2].item() == pytest.approx(-1.0634640055214863, rel=1e-15)
    assert g2[0, 3].item() == -15.0


@pytest.mark.parametrize("cd", [F32, F64])
def test_f18_extreme_gdn_gates_are_finite_and_exact(cd):
    # A_log=100, a=-200: decay 1; A_log=0, a=+100 (threshold 20): softplus 100; A_log=100, a=1: decay 0
    A_log = torch.tensor([100.0, 0.0, 100.0])
    a = torch.tensor([[-200.0, 100.0, 1.0]])
    g, beta = gdn_gating_ref(A_log, a, torch.zeros(1, 3), torch.zeros(3), compute_dtype=cd)
    assert torch.isfinite(g).all() and torch.isfinite(beta).all()
    decay = torch.exp(g)
    assert decay[0, 0].item() == 1.0
    assert g[0, 1].item() == -100.0
    assert decay[0, 2].item() == 0.0 and g[0, 2].item() == G_MIN


@pytest.mark.parametrize("cd", [F32, F64])
def test_f18_extreme_kda_gates_are_finite(cd):
    A_log = torch.tensor([100.0, 0.0])
    a = torch.tensor([[[-200.0, 1.0], [100.0, -200.0]]])  # [1, HV=2, K=2]
    g, _ = kda_gating_ref(A_log, a, torch.zeros(1, 2), torch.zeros(2, 2), compute_dtype=cd)
    assert torch.isfinite(g).all()
    assert torch.exp(g[0, 0]).tolist() == [1.0, 0.0]
    assert g[0, 1, 0].item() == -100.0
    # bounded gate with exp(A_log) = inf (fp32): x = 0 -> sigmoid(0); x < 0 -> 0; x > 0 -> lower_bound
    gb, _ = kda_gating_ref(torch.tensor([100.0]), torch.tensor([[[0.0, -1.0, 1.0]]]), torch.zeros(1, 1),
                           torch.zeros(1, 3), lower_bound=-5.0, compute_dtype=cd)
    assert gb.tolist() == [[[-2.5, 0.0, -5.0]]]


@pytest.mark.parametrize("cd,tol", [(F64, 1e-15), (F32, 1e-6)])
def test_kda_bounded_gate_hand_computed(cd, tol):
    # A_log = 0 -> rate 1; sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-200) ~ 1.4e-87
    a = torch.tensor([[[0.0, math.log(3.0), -200.0]]], dtype=F64)
    g, beta = kda_gating_ref(torch.zeros(1, dtype=F64), a, torch.zeros(1, 1, dtype=F64),
                             torch.zeros(1, 3, dtype=F64), lower_bound=-4.0, compute_dtype=cd)
    torch.testing.assert_close(g, torch.tensor([[[-2.0, -3.0, 0.0]]], dtype=cd), rtol=tol, atol=1e-80)
    assert beta.item() == 0.5


def test_kda_gate_is_the_gdn_gate_per_key_channel():
    T, HV, K = 5, 3, 4
    A_log, a, b, dt_bias = torch.randn(HV), torch.randn(T, HV, K) * 3, torch.randn(T, HV), torch.randn(HV, K)
    g, beta = kda_gating_ref(A_log, a, b, dt_bias)
    assert g.shape == (T, HV, K) and beta.shape == (T, HV)
    for c in range(K):
        gc, bc = gdn_gating_ref(A_log, a[..., c], b, dt_bias[:, c])
        torch.testing.assert_close(g[..., c], gc, rtol=1e-6, atol=0)
        torch.testing.assert_close(beta, bc, rtol=0, atol=0)


def test_gating_fp32_mode_matches_fp64_oracle():
    T, HV = 64, 8
    A_log, a, b, dt_bias = torch.randn(HV), torch.randn(T, HV) * 4, torch.randn(T, HV) * 4, torch.randn(HV)
    g32, b32 = gdn_gating_ref(A_log, a, b, dt_bias)
    g64, b64 = gdn_gating_ref(A_log, a, b, dt_bias, compute_dtype=F64)
    assert (g32.double() - g64).norm() / g64.norm() < 1e-6
    assert (b32.double() - b64).norm() / b64.norm() < 1e-6


def test_gating_outputs_fp32_for_bf16_inputs():
    HV = 4
    g, beta = gdn_gating_ref(torch.randn(HV), torch.randn(3, HV, dtype=torch.bfloat16),
                             torch.randn(3, HV, dtype=torch.bfloat16), torch.randn(HV))
    assert g.dtype == F32 and beta.dtype == F32


def test_f11_strided_a_b_views_read_the_right_elements():
    T, HV, K = 7, 4, 3
    ab = torch.randn(T, 2 * HV) * 3
    a, b = ab[:, 0::2], ab[:, 1::2]  # element stride 2 along heads
    assert a.stride() == (2 * HV, 2)
    A_log, dt_bias = torch.randn(HV), torch.randn(HV)
    g, beta = gdn_gating_ref(A_log, a, b, dt_bias)
    gc, bc = gdn_gating_ref(A_log, a.contiguous(), b.contiguous(), dt_bias)
    assert torch.equal(g, gc) and torch.equal(beta, bc)
    # KDA: a [T, HV, K] as a view into [T, HV, 2K]
    ak = (torch.randn(T, HV, 2 * K) * 3)[..., :K]
    dtk = torch.randn(HV, K)
    gk, _ = kda_gating_ref(A_log, ak, b, dtk)
    gk2, _ = kda_gating_ref(A_log, ak.contiguous(), b.contiguous(), dtk)
    assert torch.equal(gk, gk2)
