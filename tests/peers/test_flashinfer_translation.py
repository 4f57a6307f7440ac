"""The ``flashinfer`` peer's translation, up to FlashInfer's launch, on the CPU, against a stand-in
module with FlashInfer 0.7.4's keywords (``peer_fakes.py``; the 100 MB wheel is not needed): the
linear gate ``alpha = exp(max(g, -80))``, the pool by index with ``-1`` never read or written,
the read / write index pair when there is padding or ``has_initial_state``, zeroed padding outputs,
FlashInfer's own kernels pinned (``backend="flashinfer"``), negative decode slots as ``-1``."""

from __future__ import annotations

import types

import pytest
import torch

from linattn.backends import flashinfer as fi_backend
from linattn.backends.flashinfer import LOG_ALPHA_MIN, FlashInferBackend
from linattn.backends.torch_ref import gdn_decode_ref, gdn_prefill_ref
from linattn.dispatch.plugin.calls import make_call

from peer_fakes import Log, default_scale, flashinfer_decode, flashinfer_prefill

K = V = 8  # the stand-in takes any head dim; the backend's predicates declare 128 (tests/peers/test_peer_dispatch.py)


@pytest.fixture
def fi_log(monkeypatch) -> Log:
    log = Log()
    fake = {"flashinfer.gdn_prefill": types.SimpleNamespace(chunk_gated_delta_rule=flashinfer_prefill(log)),
            "flashinfer.gdn_decode": types.SimpleNamespace(
                gated_delta_rule_decode_pretranspose=flashinfer_decode(log))}
    monkeypatch.setattr(fi_backend, "import_library", lambda name: (fake[name], ""))
    return log


def _prefill(lens, P=6, HV=2, H=1, seed=0, state_dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen)
    d = dict(q=r(T, H, K).bfloat16(), k=r(T, H, K).bfloat16(), v=r(T, HV, V).bfloat16(),
             g=-torch.rand(T, HV, generator=gen), beta=torch.rand(T, HV, generator=gen),
             cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64))
    return d, (0.1 * r(P, HV, V, K)).to(state_dtype)


def _call(d, pool, slots, has_initial_state=None, initial_state=None):
    return make_call("gdn_prefill", dict(**d, state_pool=pool, state_indices=slots, initial_state=initial_state,
                                         scale=default_scale(K), use_qk_l2norm=True, state_layout="vk",
                                         has_initial_state=has_initial_state))


def test_prefill_without_padding_hands_the_pool_and_indices_over_as_they_are(fi_log):
    d, pool = _prefill((5, 0, 9))
    slots = torch.tensor([3, 0, 1], dtype=torch.int32)
    mine, ref_pool = pool.clone(), pool.clone()
    o, final = FlashInferBackend().prefill(_call(d, mine, slots))
    o_ref = gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=slots)[0]
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=1e-6)
    call = fi_log[0]
    assert final is None and call["initial_state"] is mine and call["output_state"] is mine
    # 14 tokens < CP_MIN_TOKENS: FlashInfer's non-CP kernel (test_flashinfer_slots.py: the CP rule)
    assert call["output_state_indices"] is None and call["use_cp"] is False and call["backend"] == "flashinfer"
    torch.testing.assert_close(call["g"], d["g"].exp(), rtol=0, atol=0)


def test_prefill_padding_and_fresh_rows_use_minus_one_read_and_write_indices(fi_log):
    d, pool = _prefill((4, 6, 3))
    slots = torch.tensor([2, -3, 0])
    fresh = torch.tensor([True, True, False])
    pool[0] = float("nan")  # the fresh sequence's stale slot: never read
    mine, ref_pool = pool.clone(), pool.clone()
    o, _ = FlashInferBackend().prefill(_call(d, mine, slots, has_initial_state=fresh))
    o_ref = gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=slots, has_initial_state=fresh)[0]
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine[[0, 2]], ref_pool[[0, 2]], rtol=0, atol=1e-6)
    assert torch.equal(mine[[1, 3, 4, 5]], pool[[1, 3, 4, 5]]) and bool(o[4:10].eq(0).all())
    call = fi_log[0]
    assert call["state_indices"].tolist() == [2, -1, -1] and call["output_state_indices"].tolist() == [2, -1, 0]
    assert call["use_cp"] is False


def test_prefill_clamps_the_log_gate_so_alpha_stays_positive(fi_log):
    d, pool = _prefill((6,))
    d["g"][2] = -1000.0  # the contract's floor: exp(-1000) is 0, whose log FlashInfer cannot take
    FlashInferBackend().prefill(_call(d, pool.clone(), torch.tensor([1])))
    alpha = fi_log[0]["g"]
    assert bool((alpha > 0).all()) and float(alpha[2].min()) == pytest.approx(torch.tensor(LOG_ALPHA_MIN).exp().item())


def test_prefill_pool_without_dense_rows_is_gathered_and_written_back(fi_log):
    d, pool = _prefill((3, 5), P=4)
    big = torch.zeros(4, 2, V + 1, K)  # dense [V, K] tiles, head pitch (V + 1) K: rows are not dense blocks
    big[:, :, :V] = pool
    view, ref_pool = big[:, :, :V], pool.clone()
    FlashInferBackend().prefill(_call(d, view, torch.tensor([3, -1])))
    gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=torch.tensor([3, -1]))
    torch.testing.assert_close(view, ref_pool, rtol=0, atol=1e-6)
    assert bool(big[:, :, V].eq(0).all())  # outside the view: untouched
    assert fi_log[0]["initial_state"] is not view and fi_log[0]["initial_state"].is_contiguous()


def test_prefill_dense_mode_returns_the_final_state_in_the_initial_states_dtype(fi_log):
    d, pool = _prefill((4, 7), state_dtype=torch.bfloat16)
    h0 = pool[:2].clone()
    o, ht = FlashInferBackend().prefill(_call(d, None, None, initial_state=h0))
    o_ref, ht_ref = gdn_prefill_ref(**d, initial_state=h0)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    assert ht.dtype == torch.bfloat16 and torch.equal(ht, ht_ref.to(torch.bfloat16)) and torch.equal(h0, pool[:2])


@pytest.mark.parametrize("with_h0", [True, False])
def test_prefill_dense_mode_gives_an_empty_sequence_its_initial_state(fi_log, with_h0):
    """FlashInfer writes no final state for a zero-length sequence: the H200 self-check found the
    dense translation's final state wrong there (relative error 1.07) while it handed over an empty
    buffer. Now the buffer starts as the initial state (zeros without one)."""
    d, pool = _prefill((0, 5, 0, 9))
    h0 = pool[:4].clone() if with_h0 else None
    o, ht = FlashInferBackend().prefill(_call(d, None, None, initial_state=h0))
    o_ref, ht_ref = gdn_prefill_ref(**d, initial_state=h0)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ht, ht_ref, rtol=0, atol=1e-6)
    expect_empty = pool[[0, 2]] if with_h0 else torch.zeros_like(pool[[0, 2]])
    assert torch.equal(ht[[0, 2]], expect_empty)
    assert fi_log[0]["output_state"] is not h0 and fi_log[0]["state_indices"] is None


def test_decode_hands_negative_slots_over_as_minus_one_with_fp32_gating_parameters(fi_log):
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen)
    N, HV = 4, 2
    d = dict(q=r(N, 1, 1, K).bfloat16(), k=r(N, 1, 1, K).bfloat16(), v=r(N, 1, HV, V).bfloat16(),
             a=r(N, 1, HV).bfloat16(), b=r(N, 1, HV).bfloat16(), A_log=r(HV).bfloat16(), dt_bias=r(HV).bfloat16())
    pool = 0.1 * r(5, HV, V, K)
    slots = torch.tensor([4, -7, 0, -1])
    mine, ref_pool = pool.clone(), pool.clone()
    call = make_call("gdn_decode", dict(**d, state_pool=mine, state_indices=slots, scale=default_scale(K),
                                        use_qk_l2norm=True, state_layout="vk"))
    o = FlashInferBackend().decode(call)
    o_ref = gdn_decode_ref(**d, state_pool=ref_pool, state_indices=slots)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=1e-6)
    logged = fi_log[0]
    assert logged["initial_state_indices"].tolist() == [4, -1, 0, -1] and logged["backend"] == "flashinfer"
    assert logged["A_log"].dtype == torch.float32 and logged["dt_bias"].dtype == torch.float32
    assert logged["state"] is None


@pytest.mark.parametrize("softplus", [dict(softplus_beta=2.0), dict(softplus_threshold=10.0)])
def test_decode_with_another_softplus_is_refused_before_flashinfer_runs(fi_log, softplus):
    """FlashInfer's decode fixes softplus(beta=1, threshold=20); the Problem does not carry the softplus
    parameters, so the backend refuses them itself rather than compute another gate."""
    gen = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    N, HV = 2, 2
    d = dict(q=r(N, 1, 1, K).bfloat16(), k=r(N, 1, 1, K).bfloat16(), v=r(N, 1, HV, V).bfloat16(),
             a=r(N, 1, HV).bfloat16(), b=r(N, 1, HV).bfloat16(), A_log=r(HV), dt_bias=r(HV))
    pool = r(3, HV, V, K)
    before = pool.clone()
    call = make_call("gdn_decode", dict(**d, state_pool=pool, state_indices=torch.tensor([2, 0]),
                                        scale=default_scale(K), use_qk_l2norm=True, state_layout="vk", **softplus))
    with pytest.raises(ValueError, match="softplus"):
        FlashInferBackend().decode(call)
    assert len(fi_log) == 0 and torch.equal(pool, before)


def test_prefill_empty_fresh_sequence_gets_zeros_although_flashinfer_writes_nothing_for_it(fi_log):
    d, pool = _prefill((5, 0, 4))
    slots, fresh = torch.tensor([2, 4, 0]), torch.tensor([True, False, True])
    mine, ref_pool = pool.clone(), pool.clone()
    FlashInferBackend().prefill(_call(d, mine, slots, has_initial_state=fresh))
    gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=slots, has_initial_state=fresh)
    assert bool(mine[4].eq(0).all())
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=1e-6)
    d0, _ = _prefill((0,))
    mine2 = pool.clone()
    FlashInferBackend().prefill(_call(d0, mine2, torch.tensor([5]), has_initial_state=torch.tensor([False])))
    assert bool(mine2[5].eq(0).all()) and torch.equal(mine2[:5], pool[:5]) and len(fi_log) == 1  # T = 0: no call


def test_prefill_hands_fp32_gates_over_when_linattn_is_given_fp64_ones(fi_log):
    """linattn accepts fp64 ``g, beta`` for prefill; FlashInfer's kernel takes fp32 alpha and beta only."""
    d, pool = _prefill((5, 3))
    d64 = {**d, "g": d["g"].double(), "beta": d["beta"].double()}
    slots = torch.tensor([1, 4])
    mine, ref_pool = pool.clone(), pool.clone()
    o, _ = FlashInferBackend().prefill(_call(d64, mine, slots))
    o_ref = gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=slots)[0]
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=1e-6)
    assert fi_log[0]["g"].dtype == torch.float32
