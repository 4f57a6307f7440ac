"""gdn_prefill / kda_prefill reference: hand-computed values, varlen, pool vs dense mode, F11/F18/F19/F23."""

import math

import pytest
import torch

from linattn.backends.torch_ref import (gdn_decode_ref, gdn_gating_ref, gdn_prefill_ref,
                                        kda_decode_ref, kda_gating_ref, kda_prefill_ref)

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16


# -- helpers ------------------------------------------------------------------------------------

def same_bits(x, y):
    """Bitwise equality (NaN payloads and signed zeros included)."""
    return x.dtype == y.dtype and x.shape == y.shape and \
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def assert_rows_unchanged(after, before, owned):
    for p in range(before.shape[0]):
        if p not in owned:
            assert same_bits(after[p], before[p]), f"pool row {p} not owned by the call was modified"


def make_inputs(family, T, H, HV, K, V, dtype=F32):
    """Packed q, k, v and fp32 gates from the gating reference (as a caller would pass them)."""
    kda = family == "kda"
    a = torch.randn(T, HV, K) if kda else torch.randn(T, HV)
    b = torch.randn(T, HV)
    A_log = torch.randn(HV) * 0.5 - 1.0
    dt_bias = torch.randn(HV, K) if kda else torch.randn(HV)
    g, beta = (kda_gating_ref if kda else gdn_gating_ref)(A_log, a, b, dt_bias)
    return dict(q=torch.randn(T, H, K).to(dtype), k=torch.randn(T, H, K).to(dtype),
                v=torch.randn(T, HV, V).to(dtype), g=g, beta=beta), dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias)


def prefill(family, inp, cu, **kw):
    fn = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    return fn(**inp, cu_seqlens=cu, **kw)


def to_maths(state, layout):
    return state.transpose(-1, -2) if layout == "vk" else state


def from_maths(state, layout):
    return state.transpose(-1, -2) if layout == "vk" else state


def random_states(P, HV, K, V, layout, dtype=F32):
    return torch.randn((P, HV, V, K) if layout == "vk" else (P, HV, K, V)).to(dtype)


def oracle(naive, inp, cu, S0):
    """Per sequence, the naive float64 recurrence; ``S0[n]`` maths ``[HV, K, V]`` or None."""
    o = torch.zeros(inp["v"].shape, dtype=F64)
    finals = []
    for n in range(len(cu) - 1):
        lo, hi = cu[n], cu[n + 1]
        if hi == lo:
            finals.append(None if S0[n] is None else S0[n].double())
            continue
        on, st = naive.recurrence(inp["q"][lo:hi], inp["k"][lo:hi], inp["v"][lo:hi], inp["g"][lo:hi],
                                  inp["beta"][lo:hi], S0[n])
        o[lo:hi] = on
        finals.append(st[-1])
    return o, finals


# -- hand-computed ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["pool", "dense"])
@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-6)])
def test_gdn_prefill_hand_computed_two_tokens(mode, cd, tol):
    # S0 = [[1, 2], [3, 4]] (maths), no l2norm, scale 1, one head K = V = 2.
    # token 1: decay 1/2, beta 1/2, k = [1, 0], v = [1, 1], q = [0, 1]
    #   S = [[.5, 1], [1.5, 2]]; u = .5 * ([1, 1] - [.5, 1]) = [.25, 0]; S = [[.75, 1], [1.5, 2]]; o = [1.5, 2]
    # token 2: decay 1, beta 1, k = [0, 1], v = [0, 0], q = [1, 1]
    #   S^T k = [1.5, 2]; u = -[1.5, 2]; S = [[.75, 1], [0, 0]]; o = S^T [1, 1] = [.75, 1]
    inp = dict(q=torch.tensor([[[0.0, 1.0]], [[1.0, 1.0]]], dtype=cd),
               k=torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=cd),
               v=torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]], dtype=cd),
               g=torch.tensor([[math.log(0.5)], [0.0]], dtype=cd), beta=torch.tensor([[0.5], [1.0]], dtype=cd))
    S0 = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=cd)
    cu = torch.tensor([0, 2])
    kw = dict(scale=1.0, use_qk_l2norm=False, compute_dtype=cd)
    if mode == "pool":
        pool = torch.full((3, 1, 2, 2), -7.0, dtype=cd)
        pool[2, 0] = S0.T
        before = pool.clone()
        o, final = gdn_prefill_ref(**inp, cu_seqlens=cu, state_pool=pool, state_indices=torch.tensor([2]), **kw)
        assert final is None
        final = pool[2:3]
        assert_rows_unchanged(pool, before, {2})
    else:
        o, final = gdn_prefill_ref(**inp, cu_seqlens=cu, initial_state=S0.T.reshape(1, 1, 2, 2), **kw)
    torch.testing.assert_close(o[:, 0], torch.tensor([[1.5, 2.0], [0.75, 1.0]], dtype=cd), rtol=tol, atol=tol)
    torch.testing.assert_close(final[0, 0], torch.tensor([[0.75, 1.0], [0.0, 0.0]], dtype=cd).T, rtol=tol, atol=tol)


@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-6)])
def test_kda_prefill_hand_computed_per_channel_decay(cd, tol):
    # decay per key channel [1/2, 1]: diag(decay) S0 = [[.5, 1], [3, 4]]; k = [1, 0], v = [1, 1], beta 1/2
    # u = [.25, 0]; S = [[.75, 1], [3, 4]]; o = S^T [0, 1] = [3, 4]
    inp = dict(q=torch.tensor([[[0.0, 1.0]]]), k=torch.tensor([[[1.0, 0.0]]]), v=torch.tensor([[[1.0, 1.0]]]),
               g=torch.tensor([[[math.log(0.5), 0.0]]]), beta=torch.tensor([[0.5]]))
    S0 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    o, final = kda_prefill_ref(**inp, cu_seqlens=torch.tensor([0, 1]), initial_state=S0.reshape(1, 1, 2, 2),
                               state_layout="kv", scale=1.0, use_qk_l2norm=False, compute_dtype=cd)
    torch.testing.assert_close(o.view(2), torch.tensor([3.0, 4.0]), rtol=tol, atol=tol)
    torch.testing.assert_close(final.view(2, 2), torch.tensor([[0.75, 1.0], [3.0, 4.0]]), rtol=tol, atol=tol)
    assert final.dtype == F32  # initial_state's dtype


# -- against the naive oracle -------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("mode", ["pool", "dense"])
@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-5)])
def test_prefill_matches_naive_oracle_varlen_gva_kneqv(naive, family, layout, mode, cd, tol):
    H, HV, K, V = 2, 4, 32, 16
    cu = [0, 5, 6, 6, 15]  # lengths 5, 1, 0, 9
    inp, _ = make_inputs(family, cu[-1], H, HV, K, V, cd)
    N = len(cu) - 1
    if mode == "pool":
        idx = [3, 0, 5, 1]
        pool = random_states(7, HV, K, V, layout, cd)
        before = pool.clone()
        o, final = prefill(family, inp, torch.tensor(cu, dtype=torch.int32), state_pool=pool,
                           state_indices=torch.tensor(idx), state_layout=layout, compute_dtype=cd)
        assert final is None
        S0 = [to_maths(before[s], layout) for s in idx]
        got = [to_maths(pool[s], layout) for s in idx]
        assert_rows_unchanged(pool, before, set(idx))
    else:
        init = random_states(N, HV, K, V, layout, cd)
        o, final = prefill(family, inp, torch.tensor(cu), initial_state=init, state_layout=layout, compute_dtype=cd)
        assert final.dtype == cd and final.shape == init.shape
        S0 = [to_maths(init[n], layout) for n in range(N)]
        got = [to_maths(final[n], layout) for n in range(N)]
    o_ref, finals = oracle(naive, inp, cu, S0)
    assert o.dtype == cd and naive.rel(o, o_ref) < tol
    for n in range(N):
        assert naive.rel(got[n], finals[n]) < tol


@pytest.mark.parametrize("dtype,out_tol,state_tol", [(F32, 1e-5, 1e-5), (BF16, 2e-2, 1e-2)])
def test_prefill_fp32_mode_within_ops_md_tolerance_of_fp64(naive, dtype, out_tol, state_tol):
    cu = torch.tensor([0, 40, 41, 100])
    inp, _ = make_inputs("kda", 100, 2, 4, 64, 64, dtype)
    init = random_states(3, 4, 64, 64, "vk")
    o32, f32 = prefill("kda", inp, cu, initial_state=init)
    o64, f64 = prefill("kda", inp, cu, initial_state=init.double(), compute_dtype=F64)
    assert o32.dtype == dtype and f32.dtype == F32
    assert naive.rel(o32, o64) < out_tol and naive.rel(f32, f64) < state_tol


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("pool_dtype", [F32, BF16])
def test_prefill_pool_mode_equals_dense_mode_bitwise(family, layout, pool_dtype):
    H, HV, K, V = 1, 2, 16, 8
    cu = torch.tensor([0, 3, 3, 10, 11])
    inp, _ = make_inputs(family, 11, H, HV, K, V, BF16)
    pool = random_states(6, HV, K, V, layout, pool_dtype)
    before = pool.clone()
    idx = torch.tensor([4, 1, 0, 5])
    o_pool, none = prefill(family, inp, cu, state_pool=pool, state_indices=idx, state_layout=layout)
    o_dense, final = prefill(family, inp, cu, initial_state=before[idx], state_layout=layout)
    assert none is None and final.dtype == pool_dtype and pool.dtype == pool_dtype
    assert same_bits(o_pool, o_dense)
    assert same_bits(pool[idx], final)
    assert_rows_unchanged(pool, before, set(idx.tolist()))


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_bf16_pool_final_state_is_cast_once(family):
    H, HV, K, V = 1, 2, 16, 16
    cu = torch.tensor([0, 7, 12])
    inp, _ = make_inputs(family, 12, H, HV, K, V)
    p16 = random_states(3, HV, K, V, "vk", BF16)
    p32 = p16.float()
    before = p16.clone()
    idx = torch.tensor([2, 0])
    o16, _ = prefill(family, inp, cu, state_pool=p16, state_indices=idx)
    o32, _ = prefill(family, inp, cu, state_pool=p32, state_indices=idx)
    assert p16.dtype == BF16 and same_bits(o16, o32) and same_bits(p16[idx], p32[idx].to(BF16))
    assert_rows_unchanged(p16, before, {0, 2})


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_equals_a_decode_loop_token_by_token(family):
    H, HV, K, V = 2, 4, 16, 8
    lens = [4, 7, 1]
    cu = [0, 4, 11, 12]
    inp, raw = make_inputs(family, cu[-1], H, HV, K, V)
    pool = random_states(4, HV, K, V, "vk")
    idx = [3, 0, 2]
    p_prefill, p_decode = pool.clone(), pool.clone()
    o_prefill, _ = prefill(family, inp, torch.tensor(cu), state_pool=p_prefill, state_indices=torch.tensor(idx))
    dec = kda_decode_ref if family == "kda" else gdn_decode_ref
    o_decode = torch.zeros_like(o_prefill)
    for n, L in enumerate(lens):
        for t in range(cu[n], cu[n] + L):
            tok = lambda x: x[t:t + 1].unsqueeze(0)  # [1, 1, ...]
            o_decode[t] = dec(tok(inp["q"]), tok(inp["k"]), tok(inp["v"]), tok(raw["a"]), tok(raw["b"]),
                              raw["A_log"], raw["dt_bias"], p_decode, torch.tensor([idx[n]]))[0, 0]
    torch.testing.assert_close(o_prefill, o_decode, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p_prefill, p_decode, rtol=1e-6, atol=1e-6)
    assert same_bits(p_prefill[1], pool[1])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_kv_pool_is_the_vk_pool_transposed(family):
    H, HV, K, V = 2, 4, 32, 16
    cu = torch.tensor([0, 6, 6, 13])
    inp, _ = make_inputs(family, 13, H, HV, K, V)
    vk = random_states(5, HV, K, V, "vk")
    vk_before, kv = vk.clone(), vk.transpose(-1, -2).contiguous()
    idx = torch.tensor([4, 0, 2])
    o_vk, _ = prefill(family, inp, cu, state_pool=vk, state_indices=idx, state_layout="vk")
    o_kv, _ = prefill(family, inp, cu, state_pool=kv, state_indices=idx, state_layout="kv")
    assert same_bits(o_vk, o_kv) and same_bits(kv, vk.transpose(-1, -2).contiguous())
    assert_rows_unchanged(vk, vk_before, {4, 2})  # slot 0 belongs to the empty sequence: unchanged too


# -- F19: zero-length sequences -----------------------------------------------------------------

@pytest.mark.parametrize("cu", [[0, 128, 128, 256], [0, 0, 5], [0, 5, 5, 5], [0, 0], [0, 0, 0]])
@pytest.mark.parametrize("mode", ["pool", "dense", "dense-none"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_f19_zero_length_sequences(naive, cu, mode, family):
    H, HV, K, V = 1, 2, 8, 8
    T, N = cu[-1], len(cu) - 1
    inp, _ = make_inputs(family, T, H, HV, K, V)
    cu_t = torch.tensor(cu, dtype=torch.int64)
    if mode == "pool":
        idx = list(range(N, 0, -1))  # slots N .. 1; slot 0 and slot N+1 are not named
        pool = random_states(N + 2, HV, K, V, "vk")
        before = pool.clone()
        o, final = prefill(family, inp, cu_t, state_pool=pool, state_indices=torch.tensor(idx, dtype=torch.int32))
        assert final is None
        assert_rows_unchanged(pool, before, set(idx))
        init, got = before[idx], pool[idx]
    else:
        init = random_states(N, HV, K, V, "vk") if mode == "dense" else None
        o, got = prefill(family, inp, cu_t, initial_state=init)
        assert got.shape == (N, HV, V, K) and got.dtype == F32
        if init is None:
            init = torch.zeros(N, HV, V, K)
    assert o.shape == (T, HV, V) and torch.isfinite(o).all()
    o_ref, finals = oracle(naive, inp, cu, [to_maths(init[n], "vk") for n in range(N)])
    if T:
        assert naive.rel(o, o_ref) < 1e-5
    for n in range(N):
        if cu[n + 1] == cu[n]:
            assert same_bits(got[n], init[n]), "an empty sequence's final state must equal its initial state"
        else:
            assert naive.rel(to_maths(got[n], "vk"), finals[n]) < 1e-5


def test_prefill_padding_sequence_in_pool_mode_touches_nothing(naive):
    H, HV, K, V = 1, 2, 8, 8
    cu = [0, 3, 8, 10]
    inp, _ = make_inputs("gdn", 10, H, HV, K, V)
    pool = random_states(4, HV, K, V, "vk")
    before = pool.clone()
    o, _ = prefill("gdn", inp, torch.tensor(cu), state_pool=pool, state_indices=torch.tensor([2, -1, 0]))
    assert torch.equal(o[3:8], torch.zeros_like(o[3:8]))
    o_ref, finals = oracle(naive, inp, cu, [to_maths(before[2], "vk"), None, to_maths(before[0], "vk")])
    assert naive.rel(o[:3], o_ref[:3]) < 1e-5 and naive.rel(o[8:], o_ref[8:]) < 1e-5
    assert naive.rel(to_maths(pool[0], "vk"), finals[2]) < 1e-5
    assert_rows_unchanged(pool, before, {0, 2})


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_prefill_strided_pool_view_writes_through_its_stride(layout):
    H, HV, K, V = 1, 2, 16, 8
    cu = torch.tensor([0, 4, 9])
    inp, _ = make_inputs("kda", 9, H, HV, K, V)
    row = (HV, V, K) if layout == "vk" else (HV, K, V)
    big = torch.randn(4, 3, *row)
    view = big[:, 2]
    assert view.stride(0) == 3 * HV * V * K
    big_before, dense = big.clone(), view.clone()
    idx = torch.tensor([3, 0])
    o_view, _ = prefill("kda", inp, cu, state_pool=view, state_indices=idx, state_layout=layout)
    o_dense, _ = prefill("kda", inp, cu, state_pool=dense, state_indices=idx, state_layout=layout)
    assert same_bits(o_view, o_dense) and same_bits(big[:, 2], dense)
    assert same_bits(big[:, :2], big_before[:, :2])
    assert_rows_unchanged(big[:, 2], big_before[:, 2], {0, 3})


# -- extremes, long sequences, views ------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_f18_extreme_gates_give_finite_prefill(family):
    H, HV, K, V, T = 1, 3, 4, 4, 12
    kda = family == "kda"
    A_log = torch.tensor([100.0, 0.0, 100.0])
    head_a = torch.tensor([-200.0, 100.0, 1.0])  # decay 1, softplus 100, decay 0
    a = head_a.view(1, HV, *([1] if kda else [])).expand(T, HV, *([K] if kda else [])).clone()
    dt_bias = torch.zeros(HV, K) if kda else torch.zeros(HV)
    g, beta = (kda_gating_ref if kda else gdn_gating_ref)(A_log, a, torch.randn(T, HV), dt_bias)
    inp = dict(q=torch.randn(T, H, K), k=torch.randn(T, H, K), v=torch.randn(T, HV, V), g=g, beta=beta)
    pool = random_states(3, HV, K, V, "vk")
    before = pool.clone()
    o, _ = prefill(family, inp, torch.tensor([0, 5, 12]), state_pool=pool, state_indices=torch.tensor([2, 0]))
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    assert_rows_unchanged(pool, before, {0, 2})


def test_strongly_negative_gates_stay_finite_and_match(naive):
    H, HV, K, V, T = 1, 2, 16, 16, 70
    inp, _ = make_inputs("gdn", T, H, HV, K, V)
    inp["g"] = torch.full((T, HV), -20.0)
    init = random_states(1, HV, K, V, "vk") * 1e4
    o, final = prefill("gdn", inp, torch.tensor([0, T]), initial_state=init)
    o_ref, finals = oracle(naive, inp, [0, T], [to_maths(init[0], "vk")])
    assert torch.isfinite(o).all() and naive.rel(o, o_ref) < 1e-5
    assert naive.rel(to_maths(final[0], "vk"), finals[0]) < 1e-5


def test_f23_long_prefill_equals_token_serial(naive):
    H, HV, K, V = 1, 2, 16, 16
    cu = [0, 2990, 3000]
    inp, _ = make_inputs("gdn", 3000, H, HV, K, V)
    init = random_states(2, HV, K, V, "vk")
    o, final = prefill("gdn", inp, torch.tensor(cu), initial_state=init)
    o_ref, finals = oracle(naive, inp, cu, [to_maths(init[n], "vk") for n in range(2)])
    assert naive.rel(o, o_ref) < 1e-5
    for n in range(2):
        assert naive.rel(to_maths(final[n], "vk"), finals[n]) < 1e-5


def test_f11_strided_gates_and_fused_qkv_views_prefill():
    T, H, HV, K, V = 9, 2, 4, 8, 8
    proj = torch.randn(T, 2 * H * K + HV * V)
    q = proj[:, :H * K].unflatten(-1, (H, K))
    k = proj[:, H * K:2 * H * K].unflatten(-1, (H, K))
    v = proj[:, 2 * H * K:].unflatten(-1, (HV, V))
    ab = torch.randn(T, 2 * HV)
    A_log, dt_bias = torch.randn(HV), torch.randn(HV)
    g, beta = gdn_gating_ref(A_log, ab[:, 0::2], ab[:, 1::2], dt_bias)
    gc, bc = gdn_gating_ref(A_log, ab[:, 0::2].contiguous(), ab[:, 1::2].contiguous(), dt_bias)
    cu = torch.tensor([0, 4, 9])
    o1, f1 = gdn_prefill_ref(q, k, v, g, beta, cu)
    o2, f2 = gdn_prefill_ref(q.contiguous(), k.contiguous(), v.contiguous(), gc, bc, cu)
    assert same_bits(g, gc) and same_bits(beta, bc)
    assert same_bits(o1, o2) and same_bits(f1, f2)  # the same elements, the same bits


@pytest.mark.parametrize("mode", ["pool", "dense"])
def test_blocks_of_sequences_give_the_same_result(monkeypatch, mode):
    """Large states are processed a few sequences at a time; blocks of one must change nothing."""
    import linattn.reference as ref  # the maths torch-ref runs (its block size)
    H, HV, K, V = 1, 2, 16, 8
    cu = torch.tensor([0, 3, 3, 11, 12, 17])
    inp, _ = make_inputs("gdn", 17, H, HV, K, V)
    pool = random_states(7, HV, K, V, "vk")
    idx = torch.tensor([6, 0, 2, -1, 3])

    def run():
        if mode == "pool":
            p = pool.clone()
            o, _ = prefill("gdn", inp, cu, state_pool=p, state_indices=idx)
            return o, p
        return prefill("gdn", inp, cu, initial_state=pool[:5])

    o_one, s_one = run()
    monkeypatch.setattr(ref, "BLOCK_BYTES", 1)
    o_blk, s_blk = run()
    torch.testing.assert_close(o_blk, o_one, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(s_blk, s_one, rtol=1e-6, atol=1e-7)
    if mode == "pool":
        assert_rows_unchanged(s_blk, pool, {6, 2, 3})  # slot 0: empty sequence; -1: padding
