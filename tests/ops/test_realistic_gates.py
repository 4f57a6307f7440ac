"""linattn.testing.gates (issue 32 item 3): the realistic gate draws stay in the ranges their module
documents (each model's own initialisation), give log decays through linattn's gating that match a
float64 evaluation of the gate maths, and their strong-decay heads take KDA's exact level path in
every full chunk, as the rule of kernels/triton/chunk_intra.py decides it."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.testing import gates as G

D64 = torch.float64


def _gate_maths_f64(mg: G.ModelGates) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/ops.md "Gating" in float64, written here: softplus with threshold 20, the bounded form."""
    m = mg.model
    A = mg.A_log.to(D64).exp()
    x = mg.a.to(D64) + mg.dt_bias.to(D64)
    A = A[:, None] if m.family == "kda" else A
    if m.lower_bound is None:
        sp = torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))
        g = -A * sp
    else:
        g = m.lower_bound * torch.sigmoid(A * x)
    return g, m.beta_scale * torch.sigmoid(mg.b.to(D64))


@pytest.mark.parametrize("name", list(G.MODELS))
def test_parameters_stay_in_each_models_documented_initialisation_ranges(name):
    m = G.MODELS[name]
    mg = G.model_gates(name, 96, hv=16, k=32, seed=3)
    lo, hi = m.a_range
    A = mg.A_log.double().exp()
    assert bool(((A >= lo * (1 - 1e-6)) & (A <= hi * (1 + 1e-6))).all()), (A.min(), A.max())
    assert torch.allclose(A[mg.strong], torch.full_like(A[mg.strong], hi), rtol=1e-6)
    assert mg.strong.tolist() == [hv % 8 == 7 for hv in range(16)]
    dlo, dhi = m.dt_bias_range()
    assert bool(((mg.dt_bias >= dlo - 1e-6) & (mg.dt_bias <= dhi + 1e-6)).all())
    assert mg.dt_bias.shape == ((16, 32) if m.family == "kda" else (16,))
    if m.dt_bias == "inverse_softplus":  # softplus(dt_bias) is the drawn dt, within [max(dt_min, floor), dt_max]
        dt = torch.nn.functional.softplus(mg.dt_bias.double())
        assert float(dt.min()) >= max(m.dt_range[0], m.dt_floor) * (1 - 1e-5) and float(dt.max()) <= m.dt_range[1] * (1 + 1e-5)
        assert float(dt.max() - dt.min()) > 0.05, "dt must spread over the range, not sit at one value"
    else:
        assert torch.equal(mg.dt_bias, torch.ones(16))
    ordinary = mg.a[:, ~mg.strong]
    assert abs(float(ordinary.std()) / m.a_std - 1) < 0.1 and abs(float(ordinary.mean())) < 0.1 * m.a_std + 0.02


@pytest.mark.parametrize("name", list(G.MODELS))
def test_log_decay_through_linattns_gating_matches_the_float64_gate_maths(name):
    mg = G.model_gates(name, 80, hv=8, k=16, seed=4)
    g, beta = mg.log_decay()
    rg, rbeta = _gate_maths_f64(mg)
    assert g.dtype == torch.float32 and g.shape == rg.shape and beta.shape == (80, 8)
    torch.testing.assert_close(g.double(), rg, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(beta.double(), rbeta, rtol=2e-6, atol=1e-7)
    assert bool((g <= 0).all())
    m = G.MODELS[name]
    assert bool((beta > 0).all() & (beta < m.beta_scale).all())
    if m.lower_bound is not None:
        assert float(g.min()) >= m.lower_bound
    mg64 = G.model_gates(name, 80, hv=8, k=16, seed=4, dtype=D64)
    g64, _ = mg64.log_decay()
    assert g64.dtype == D64
    torch.testing.assert_close(g64, _gate_maths_f64(mg64)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["kimi-linear", "glm5-next"])
def test_strong_kda_heads_leave_the_fast_path_in_every_full_chunk_and_ordinary_ones_stay(name):
    lens = [200, 128, 37]
    mg = G.model_gates(name, sum(lens), hv=8, k=64, seed=5, strong_every=4)
    g, _ = mg.log_decay()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    miss = G.kda_fast_path_misses(g, cu)
    full = [c for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()) for c in range(s, e, 64) if e - c >= 64]
    chunk_starts = [c for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()) for c in range(s, e, 64)]
    assert miss.shape == (len(chunk_starts), 8, 2)
    is_full = torch.tensor([c in full for c in chunk_starts])
    assert bool(miss[is_full][:, mg.strong].all()), "a strong head must leave the fast path in every full chunk"
    # the initialisation alone never decays by e^-60 over half a chunk (module docstring: at most ~51)
    assert not bool(miss[:, ~mg.strong].any())
    summary = G.decay_summary(g, cu)
    assert summary["kda_level_path_fraction"] == pytest.approx(float(miss.double().mean()))
    assert 0 < summary["kda_level_path_fraction"] < 1


def test_fast_path_rule_at_its_edge_and_the_tail_chunk():
    K = 40  # two channel blocks, the second padded
    cu = torch.tensor([0, 64, 64 + 40])
    g = torch.full((104, 1, K), -0.01)
    g[:64, 0, 35] = -1.9  # half a chunk (rows 32..63) decays by 60.8 > 60: block 1 misses, block 0 does not
    g[64:, 0, 3] = -1.8  # tail chunk of 40 rows: 31 rows up to row 31 give 55.8, the 8 after 14.4
    miss = G.kda_fast_path_misses(g, cu)
    assert miss.tolist() == [[[False, True]], [[False, False]]]
    g[64:, 0, 3] = -2.0  # rows 1..31: 62 > 60
    assert G.kda_fast_path_misses(g, cu).tolist() == [[[False, True]], [[True, False]]]
    g[:64, 0, 35] = -1.8  # 57.6 (rows 32..63) and 55.8 (rows 1..31): fast
    assert G.kda_fast_path_misses(g, cu)[0].tolist() == [[False, False]]
    g[10, 0, 0] = float("-inf")  # floored at -1000 like the kernels: far off the fast path, no NaN
    assert G.kda_fast_path_misses(g, cu)[0].tolist() == [[True, False]]


def test_fast_path_span_is_the_kernels_constant():
    chunk_intra = pytest.importorskip("linattn.kernels.triton.chunk_intra")
    assert G.KDA_FAST_SPAN == chunk_intra.KDA_FAST_SPAN


def test_gate_tensors_kinds_and_refusals():
    g, beta = G.gate_tensors("mild", "kda", 70, 2, 16, seed=1)
    assert g.shape == (70, 2, 16) and float(g.min()) > -3 and float(g.max()) < 0
    g2, beta2 = G.gate_tensors("realistic", "gdn", 70, 8, 16, seed=1)
    assert g2.shape == (70, 8) and beta2.shape == (70, 8)
    g3, _ = G.gate_tensors("qwen3-next", "gdn", 70, 8, 16, seed=1)
    assert torch.equal(g2, g3), "'realistic' is the family's default model"
    assert float(g2.min()) < -20, "Qwen3-Next's strong head decays by more than e^-20 per token"
    with pytest.raises(ValueError, match="KDA model, not GDN"):
        G.gate_tensors("kimi-linear", "gdn", 4, 2, 8)
    with pytest.raises(ValueError, match="unknown gate model 'nope'"):
        G.resolve("nope")
    with pytest.raises(ValueError, match="hv >= 1"):
        G.model_gates("qwen3-next", 4, hv=0)


def test_dt_bias_range_is_the_inverse_softplus_of_the_dt_range():
    m = G.MODELS["kimi-linear"]
    lo, hi = m.dt_bias_range()
    assert math.log1p(math.exp(lo)) == pytest.approx(1e-3, rel=1e-9)
    assert math.log1p(math.exp(hi)) == pytest.approx(1e-1, rel=1e-9)
