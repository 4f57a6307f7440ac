"""The public ops: custom-op registration, torch.compile, last_decision, errors before any run."""

import pytest
import torch

import linattn
from linattn.backends.torch_ref import gdn_decode_ref

N, T, H, HV, K, V, P = 3, 1, 2, 4, 16, 8, 6


def _decode_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V), a=r(N, T, HV), b=r(N, T, HV),
                A_log=r(HV) * 0.1, dt_bias=r(HV) * 0.1)


def test_custom_ops_are_registered_with_the_pool_mutated():
    schema = torch.ops.linattn.gdn_decode.default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert "state_pool" in mutated and "intermediate_states" in mutated
    for op in ("gdn_gating", "kda_gating", "kda_decode", "gdn_prefill", "kda_prefill", "silu_and_mul_clamp"):
        assert hasattr(torch.ops.linattn, op)


def test_decode_step_compiles_fullgraph_and_matches_eager():
    x = _decode_inputs()
    idx = torch.tensor([4, -1, 0])
    pool0 = torch.randn(P, HV, V, K)

    def step(q, k, v, a, b, A_log, dt_bias, pool, idx):
        o = linattn.gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, idx, validate=False)
        return o * 2.0

    pool_c, pool_e = pool0.clone(), pool0.clone()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    oc = compiled(**x, pool=pool_c, idx=idx)
    oe = step(**x, pool=pool_e, idx=idx)
    assert torch.equal(oc, oe)
    assert torch.equal(pool_c, pool_e)  # the in-place pool update survives compilation
    assert torch.equal(pool_c[[1, 2, 3, 5]], pool0[[1, 2, 3, 5]])
    assert not torch.equal(pool_c[4], pool0[4])


def test_eager_decode_matches_the_float64_reference_and_reports_its_backend():
    x = _decode_inputs(1)
    idx = torch.tensor([2, 0, -1])
    pool = torch.randn(P, HV, V, K)
    ref_pool = pool.double()
    o = linattn.gdn_decode(**x, state_pool=pool, state_indices=idx)
    o_ref = gdn_decode_ref(**{k: t.double() for k, t in x.items()}, state_pool=ref_pool, state_indices=idx,
                           compute_dtype=torch.float64)
    assert (o.double() - o_ref).norm() / o_ref.norm() < 1e-5
    assert (pool.double() - ref_pool).norm() / ref_pool.norm() < 1e-5
    assert torch.equal(o[2], torch.zeros_like(o[2]))
    d = linattn.last_decision()
    assert d.op == "gdn_decode" and d.chosen == "torch-chunked"
    assert linattn.last_decision("gdn_decode") is d


def test_bad_input_raises_before_the_pool_is_touched():
    x = _decode_inputs()
    pool = torch.randn(P, HV, V, K)
    before = pool.clone()
    with pytest.raises(ValueError, match="state_indices"):
        linattn.gdn_decode(**x, state_pool=pool, state_indices=torch.tensor([0, 1, P]))
    with pytest.raises(ValueError):
        linattn.gdn_decode(**x, state_pool=pool, state_indices=torch.tensor([1, 1, 2]))  # duplicate slot
    assert torch.equal(pool, before)


def test_forcing_an_ineligible_backend_per_call_raises_with_reasons(monkeypatch):
    from linattn.capabilities import clear_cache

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled Triton cannot run on a CPU
    clear_cache()
    x = _decode_inputs()
    pool = torch.randn(P, HV, V, K)
    before = pool.clone()
    with pytest.raises(linattn.NoBackendError, match="triton-split"):
        linattn.gdn_decode(**x, state_pool=pool, state_indices=torch.tensor([0, 1, 2]), backend="triton-split")
    assert torch.equal(pool, before)
    clear_cache()


def test_prefill_returns_output_only_in_pool_mode_and_final_state_in_dense_mode():
    gen = torch.Generator().manual_seed(3)
    Tt = 7
    q, k = torch.randn(Tt, H, K, generator=gen), torch.randn(Tt, H, K, generator=gen)
    v = torch.randn(Tt, HV, V, generator=gen)
    g, beta = linattn.gdn_gating(torch.zeros(HV), torch.randn(Tt, HV, generator=gen),
                                 torch.randn(Tt, HV, generator=gen), torch.zeros(HV))
    cu = torch.tensor([0, 3, 3, 7])
    o_dense, ht = linattn.gdn_prefill(q, k, v, g, beta, cu)
    pool = torch.zeros(P, HV, V, K)
    o_pool = linattn.gdn_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=torch.tensor([5, 1, 0]))
    assert torch.equal(o_pool, o_dense)
    assert torch.equal(pool[[5, 1, 0]], ht)
    assert torch.equal(pool[[2, 3, 4]], torch.zeros(3, HV, V, K))


def test_silu_and_mul_clamp_limit_none_is_plain_swiglu_bitwise():
    x = torch.randn(5, 14) * 20
    gate, up = x[:, :7].contiguous(), x[:, 7:].contiguous()
    assert torch.equal(linattn.silu_and_mul_clamp(x, None), torch.nn.functional.silu(gate) * up)
    out = linattn.silu_and_mul_clamp(x, 10.0)
    assert out.shape == (5, 7) and out.abs().max() <= 10.0 * torch.nn.functional.silu(torch.tensor(10.0)) + 1e-4
    assert linattn.silu_and_mul_clamp(torch.empty(0, 14), 10.0).shape == (0, 7)


@pytest.mark.parametrize("bad", [50.0, float("nan")])
def test_prefill_rejects_a_positive_or_nan_log_decay_before_touching_the_pool(bad):
    Tt = 4
    q, k, v = torch.randn(Tt, H, K), torch.randn(Tt, H, K), torch.randn(Tt, HV, V)
    g = -torch.rand(Tt, HV)
    g[2, 1] = bad
    pool = torch.randn(P, HV, V, K)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"g\[2, 1\].*<= 0"):
        linattn.gdn_prefill(q, k, v, g, torch.rand(Tt, HV), torch.tensor([0, 4]), state_pool=pool,
                            state_indices=torch.tensor([1]))
    assert torch.equal(pool, before)
