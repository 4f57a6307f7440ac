"""gdn_decode / kda_decode reference: hand-computed values, the pool contract, speculative verify.

Every test that touches a pool checks that the rows the call does not own are bitwise unchanged.
"""

import math

import pytest
import torch

from linattn.backends.torch_ref import (gdn_decode_ref, gdn_gating_ref, kda_decode_ref,
                                        kda_gating_ref)

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
LN2 = math.log(2.0)


# -- helpers ------------------------------------------------------------------------------------

def make_inputs(family, N, T, H, HV, K, V, dtype=F32):
    kda = family == "kda"
    return dict(
        q=torch.randn(N, T, H, K).to(dtype), k=torch.randn(N, T, H, K).to(dtype),
        v=torch.randn(N, T, HV, V).to(dtype),
        a=torch.randn(N, T, HV, K) if kda else torch.randn(N, T, HV), b=torch.randn(N, T, HV),
        A_log=torch.randn(HV) * 0.5 - 1.0, dt_bias=torch.randn(HV, K) if kda else torch.randn(HV),
    )


def decode(family, inp, pool, idx, **kw):
    fn = kda_decode_ref if family == "kda" else gdn_decode_ref
    return fn(**inp, state_pool=pool, state_indices=idx, **kw)


def to_maths(state, layout):
    """A pool row ``[HV, V, K]`` ("vk") or ``[HV, K, V]`` ("kv") in the maths layout ``[HV, K, V]``."""
    return state.transpose(-1, -2) if layout == "vk" else state


def random_pool(P, HV, K, V, layout, dtype=F32):
    return torch.randn((P, HV, V, K) if layout == "vk" else (P, HV, K, V)).to(dtype)


def oracle(naive, family, inp, S0, scale=None, use_qk_l2norm=True, lower_bound=None):
    """float64 per row: gates from the gating reference, then the naive recurrence.

    ``S0``: a list with, per row, the maths-layout initial state ``[HV, K, V]`` (None = zeros).
    Returns ``o [N, T, HV, V]`` and ``states [N, T, HV, K, V]``.
    """
    os_, sts = [], []
    for n, s0 in enumerate(S0):
        if family == "kda":
            g, beta = kda_gating_ref(inp["A_log"], inp["a"][n], inp["b"][n], inp["dt_bias"],
                                     lower_bound=lower_bound, compute_dtype=F64)
        else:
            g, beta = gdn_gating_ref(inp["A_log"], inp["a"][n], inp["b"][n], inp["dt_bias"], compute_dtype=F64)
        o, st = naive.recurrence(inp["q"][n], inp["k"][n], inp["v"][n], g, beta, s0, scale, use_qk_l2norm)
        os_.append(o)
        sts.append(st)
    return torch.stack(os_), torch.stack(sts)


def same_bits(x, y):
    """Bitwise equality (NaN payloads and signed zeros included)."""
    return x.dtype == y.dtype and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def assert_rows_unchanged(after, before, owned):
    for p in range(before.shape[0]):
        if p not in owned:
            assert same_bits(after[p], before[p]), f"pool row {p} not owned by the call was modified"


# -- hand-computed ------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-6)])
def test_gdn_decode_hand_computed_one_head(layout, cd, tol):
    # S0 = [[1, 2], [3, 4]] (maths, rows = key channels). A_log = a = dt_bias = 0: g = -ln 2, decay 1/2;
    # b = 0: beta 1/2. k = [1, 0], v = [1, 1], q = [0, 1], no l2norm, scale 1.
    # S = S0 / 2 = [[.5, 1], [1.5, 2]]; S^T k = [.5, 1]; u = .5 * ([1, 1] - [.5, 1]) = [.25, 0]
    # S += k u^T -> [[.75, 1], [1.5, 2]];  o = S^T q = [1.5, 2]
    S0 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    pool = torch.full((2, 1, 2, 2), 9.0)
    pool[1, 0] = S0.T if layout == "vk" else S0
    before = pool.clone()
    inp = dict(q=torch.tensor([0.0, 1.0]).view(1, 1, 1, 2), k=torch.tensor([1.0, 0.0]).view(1, 1, 1, 2),
               v=torch.tensor([1.0, 1.0]).view(1, 1, 1, 2), a=torch.zeros(1, 1, 1), b=torch.zeros(1, 1, 1),
               A_log=torch.zeros(1), dt_bias=torch.zeros(1))
    o = gdn_decode_ref(**inp, state_pool=pool, state_indices=torch.tensor([1]), scale=1.0,
                       use_qk_l2norm=False, state_layout=layout, compute_dtype=cd)
    assert o.dtype == F32 and o.shape == (1, 1, 1, 2)
    torch.testing.assert_close(o.view(2).double(), torch.tensor([1.5, 2.0], dtype=F64), rtol=tol, atol=tol)
    S1 = torch.tensor([[0.75, 1.0], [1.5, 2.0]])
    torch.testing.assert_close(pool[1, 0], S1.T if layout == "vk" else S1, rtol=tol, atol=tol)
    assert torch.equal(pool[0], before[0])


@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-6)])
def test_kda_decode_hand_computed_per_channel_decay(cd, tol):
    # bounded gate, lower_bound = -2 ln 2, A_log = 0: a = [0, -200] -> g = [-ln 2, ~0], decay [1/2, 1]
    # S0 = [[1, 2], [3, 4]] -> diag(decay) S0 = [[.5, 1], [3, 4]]; k = [1, 0]: S^T k = [.5, 1]
    # u = .5 * ([1, 1] - [.5, 1]) = [.25, 0]; S = [[.75, 1], [3, 4]]; o = S^T [0, 1] = [3, 4]
    pool = torch.zeros(1, 1, 2, 2)
    pool[0, 0] = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).T
    inp = dict(q=torch.tensor([0.0, 1.0]).view(1, 1, 1, 2), k=torch.tensor([1.0, 0.0]).view(1, 1, 1, 2),
               v=torch.tensor([1.0, 1.0]).view(1, 1, 1, 2), a=torch.tensor([0.0, -200.0]).view(1, 1, 1, 2),
               b=torch.zeros(1, 1, 1), A_log=torch.zeros(1), dt_bias=torch.zeros(1, 2))
    o = kda_decode_ref(**inp, state_pool=pool, state_indices=torch.tensor([0]), scale=1.0,
                       use_qk_l2norm=False, lower_bound=-2 * LN2, compute_dtype=cd)
    torch.testing.assert_close(o.view(2), torch.tensor([3.0, 4.0]), rtol=tol, atol=tol)
    torch.testing.assert_close(pool[0, 0], torch.tensor([[0.75, 1.0], [3.0, 4.0]]).T, rtol=tol, atol=tol)


@pytest.mark.parametrize("l2", [True, False])
def test_decode_l2norm_and_scale_hand_computed(l2):
    # zero state, beta 1/2, k = [3, 4], v = [2, -2], q = [0, 5], scale 1/2 (the decay acts on a zero state)
    # u = .5 * v = [1, -1]; S = k u^T; o = u * (k . q_scaled)
    #   l2norm: k . q = (4 * 5) / (25 + 1e-6) * .5 = 10 / 25.000001;  no l2norm: 20 * .5 = 10
    pool = torch.zeros(1, 1, 2, 2, dtype=F64)
    inp = dict(q=torch.tensor([0.0, 5.0], dtype=F64).view(1, 1, 1, 2),
               k=torch.tensor([3.0, 4.0], dtype=F64).view(1, 1, 1, 2),
               v=torch.tensor([2.0, -2.0], dtype=F64).view(1, 1, 1, 2), a=torch.zeros(1, 1, 1), b=torch.zeros(1, 1, 1),
               A_log=torch.zeros(1), dt_bias=torch.zeros(1))
    o = gdn_decode_ref(**inp, state_pool=pool, state_indices=torch.tensor([0]), scale=0.5,
                       use_qk_l2norm=l2, compute_dtype=F64)
    dot = 10 / 25.000001 if l2 else 10.0
    torch.testing.assert_close(o.view(2), torch.tensor([dot, -dot], dtype=F64), rtol=1e-14, atol=0)
    kn = 1 / math.sqrt(25.000001) if l2 else 1.0
    expected_S = torch.outer(torch.tensor([3.0, 4.0], dtype=F64) * kn, torch.tensor([1.0, -1.0], dtype=F64))
    torch.testing.assert_close(pool[0, 0], expected_S.T, rtol=1e-14, atol=0)


# -- against the naive oracle -------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("cd,tol", [(F64, 1e-12), (F32, 1e-5)])
def test_decode_matches_naive_oracle_gva_kneqv(naive, family, layout, cd, tol):
    N, T, H, HV, K, V, P = 3, 3, 2, 4, 32, 16, 6
    inp = make_inputs(family, N, T, H, HV, K, V, cd)  # float64 data for the float64 mode
    pool = random_pool(P, HV, K, V, layout, cd)
    before = pool.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)  # slot 0 owned by a real request (F07)
    lb = -3.0 if family == "kda" else None
    kw = {"lower_bound": lb} if family == "kda" else {}
    o = decode(family, inp, pool, idx, state_layout=layout, compute_dtype=cd, **kw)
    o_ref, st_ref = oracle(naive, family, inp, [to_maths(before[s], layout) for s in idx.tolist()], lower_bound=lb)
    assert naive.rel(o, o_ref) < tol
    for n, s in enumerate(idx.tolist()):
        assert naive.rel(to_maths(pool[s], layout), st_ref[n, -1]) < tol
    assert_rows_unchanged(pool, before, set(idx.tolist()))


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_kv_pool_is_the_vk_pool_transposed(family):
    N, T, H, HV, K, V, P = 3, 2, 1, 2, 32, 16, 5
    inp = make_inputs(family, N, T, H, HV, K, V)
    vk = random_pool(P, HV, K, V, "vk")
    kv = vk.transpose(-1, -2).contiguous()
    vk_before = vk.clone()
    idx = torch.tensor([3, 1, 0])
    o_vk = decode(family, inp, vk, idx, state_layout="vk")
    o_kv = decode(family, inp, kv, idx, state_layout="kv")
    assert torch.equal(o_vk, o_kv)
    assert torch.equal(kv, vk.transpose(-1, -2))
    assert_rows_unchanged(vk, vk_before, {3, 1, 0})


@pytest.mark.parametrize("dtype,out_tol,state_tol", [(F32, 1e-5, 1e-5), (BF16, 2e-2, 1e-2)])
def test_decode_fp32_mode_within_ops_md_tolerance_of_fp64(dtype, out_tol, state_tol, naive):
    N, T, H, HV, K, V, P = 4, 2, 2, 4, 64, 64, 4
    inp = make_inputs("gdn", N, T, H, HV, K, V, dtype)
    pool = random_pool(P, HV, K, V, "vk")
    p32, p64 = pool.clone(), pool.double()
    idx = torch.tensor([2, 0, 3, 1])
    o32 = decode("gdn", inp, p32, idx)
    o64 = decode("gdn", inp, p64, idx, compute_dtype=F64)
    assert o32.dtype == dtype and p32.dtype == F32
    assert naive.rel(o32, o64) < out_tol
    assert naive.rel(p32, p64) < state_tol


# -- padding, slot 0, strided pools -------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_f07_padding_rows_give_zeros_and_touch_nothing_slot0_is_a_real_slot(naive, family):
    N, T, H, HV, K, V, P = 4, 1, 1, 2, 8, 8, 5
    inp = make_inputs(family, N, T, H, HV, K, V)
    inp["q"][1] = float("nan")  # a padding row's inputs are never read
    inp["v"][3] = 1e30
    pool = random_pool(P, HV, K, V, "vk")
    before = pool.clone()
    idx = torch.tensor([0, -1, 3, -1])
    o = decode(family, inp, pool, idx)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.equal(o[3], torch.zeros_like(o[3]))
    o_ref, st_ref = oracle(naive, family, inp, [to_maths(before[0], "vk"), None, to_maths(before[3], "vk"), None])
    assert naive.rel(o[0], o_ref[0]) < 1e-5 and naive.rel(o[2], o_ref[2]) < 1e-5
    assert naive.rel(to_maths(pool[0], "vk"), st_ref[0, -1]) < 1e-5  # slot 0 updated like any other
    assert not torch.equal(pool[0], before[0])
    assert_rows_unchanged(pool, before, {0, 3})


def test_all_padding_batch_changes_nothing():
    inp = make_inputs("gdn", 3, 2, 1, 2, 4, 4)
    pool = random_pool(3, 2, 4, 4, "vk")
    before = pool.clone()
    o = decode("gdn", inp, pool, torch.tensor([-1, -1, -1]))
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(pool, before)


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_strided_pool_view_writes_through_its_stride(layout):
    N, T, H, HV, K, V, P = 3, 2, 1, 2, 16, 8, 5
    inp = make_inputs("gdn", N, T, H, HV, K, V)
    row = (HV, V, K) if layout == "vk" else (HV, K, V)
    big = torch.randn(P, 2, *row)
    view = big[:, 1]  # slot pitch stride(0) = 2 rows
    assert view.stride(0) == 2 * HV * V * K and not view.is_contiguous()
    big_before = big.clone()
    dense = view.clone()
    idx = torch.tensor([4, 0, 2])
    o_view = decode("gdn", inp, view, idx, state_layout=layout)
    o_dense = decode("gdn", inp, dense, idx, state_layout=layout)
    assert torch.equal(o_view, o_dense)
    assert torch.equal(big[:, 1], dense)
    assert torch.equal(big[:, 0], big_before[:, 0])  # the interleaved rows of the larger pool
    assert_rows_unchanged(big[:, 1], big_before[:, 1], {4, 0, 2})


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_bf16_pool_final_state_is_cast_once(family):
    N, T, H, HV, K, V, P = 2, 3, 1, 2, 16, 16, 3
    inp = make_inputs(family, N, T, H, HV, K, V)
    p16 = random_pool(P, HV, K, V, "vk", BF16)
    p32 = p16.float()
    before = p16.clone()
    idx = torch.tensor([2, 0])
    o16 = decode(family, inp, p16, idx)
    o32 = decode(family, inp, p32, idx)
    assert p16.dtype == BF16 and torch.equal(o16, o32)
    assert torch.equal(p16[idx], p32[idx].to(BF16))
    assert_rows_unchanged(p16, before, {0, 2})


# -- speculative verify -------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_f09_intermediate_view_of_a_longer_buffer_matches_token_by_token(family, layout):
    N, T, H, HV, K, V, P, STEPS = 3, 4, 1, 2, 16, 8, 5, 8
    inp = make_inputs(family, N, T, H, HV, K, V)
    pool = random_pool(P, HV, K, V, layout)
    before = pool.clone()
    row = (HV, V, K) if layout == "vk" else (HV, K, V)
    buf = torch.randn(3, STEPS, *row)
    buf_before = buf.clone()
    view = buf[:, :T]
    assert view.stride(0) == STEPS * HV * V * K
    idx = torch.tensor([4, 0, 2])
    inter_idx = torch.tensor([2, -1, 0])
    o = decode(family, inp, pool, idx, state_layout=layout, intermediate_states=view,
               intermediate_state_indices=inter_idx)

    # the same tokens, one T=1 call at a time
    loop_pool = before.clone()
    o_loop = []
    states = []
    for t in range(T):
        step = {key: (val[:, t:t + 1] if val.dim() >= 3 and val.shape[:2] == (N, T) else val)
                for key, val in inp.items()}
        o_loop.append(decode(family, step, loop_pool, idx, state_layout=layout))
        states.append(loop_pool[idx].clone())
    o_loop = torch.cat(o_loop, dim=1)
    torch.testing.assert_close(o, o_loop, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pool, loop_pool, rtol=1e-6, atol=1e-6)
    for t in range(T):
        torch.testing.assert_close(buf[2, t], states[t][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(buf[0, t], states[t][2], rtol=1e-6, atol=1e-6)
    assert torch.equal(buf[:, T:], buf_before[:, T:])  # steps 4..7 untouched
    assert torch.equal(buf[1], buf_before[1])  # row not named
    assert_rows_unchanged(pool, before, {4, 0, 2})


def test_intermediate_indices_default_to_the_batch_row():
    N, T, H, HV, K, V = 2, 2, 1, 1, 4, 4
    inp = make_inputs("gdn", N, T, H, HV, K, V)
    pool = random_pool(3, HV, K, V, "vk")
    buf_a = torch.zeros(N, T, HV, V, K)
    buf_b = torch.zeros(N, T, HV, V, K)
    p_a, p_b = pool.clone(), pool.clone()
    decode("gdn", inp, p_a, torch.tensor([2, 0]), intermediate_states=buf_a)
    decode("gdn", inp, p_b, torch.tensor([2, 0]), intermediate_states=buf_b,
           intermediate_state_indices=torch.tensor([0, 1]))
    assert torch.equal(buf_a, buf_b) and buf_a.abs().sum() > 0
    assert_rows_unchanged(p_a, pool, {0, 2})


def slot_table(N, T, first=1):
    """``[N, T]`` distinct slots ``first ..``, row-major."""
    return torch.arange(first, first + N * T).view(N, T)


@pytest.mark.parametrize("nacc_values", [[0] * 4, [1] * 4, [2] * 4, [3] * 4, [0, 1, 2, 3], [3, 0, 1, 2]])
def test_num_accepted_tokens_whole_domain(naive, nacc_values):
    N, T, H, HV, K, V = 4, 3, 1, 2, 8, 8
    P = N * T + 2
    inp = make_inputs("gdn", N, T, H, HV, K, V)
    table = slot_table(N, T)
    table[1, 1] = -1  # a token whose state is not kept
    nacc = torch.tensor(nacc_values, dtype=torch.int32)
    pool = random_pool(P, HV, K, V, "vk")
    # every slot of the table that must not be read holds NaN: reading one would poison the output
    for n in range(N):
        for t in range(T):
            if table[n, t] >= 0 and t != nacc_values[n] - 1:
                pool[table[n, t]] = float("nan")
    before = pool.clone()
    o = decode("gdn", inp, pool, table, num_accepted_tokens=nacc)
    assert torch.isfinite(o).all()
    # the load slot is column nacc - 1 (column 0 when nacc is 0); a negative load slot is padding
    padding = [int(table[n, max(nacc_values[n] - 1, 0)]) < 0 for n in range(N)]
    S0 = [None if nacc_values[n] == 0 or padding[n] else to_maths(before[table[n, nacc_values[n] - 1]], "vk")
          for n in range(N)]
    o_ref, st_ref = oracle(naive, "gdn", inp, S0)
    owned = set()
    for n in range(N):
        if padding[n]:
            assert torch.equal(o[n], torch.zeros_like(o[n]))
            continue
        assert naive.rel(o[n], o_ref[n]) < 1e-5
        for t in range(T):
            s = int(table[n, t])
            if s >= 0:
                owned.add(s)
                assert naive.rel(to_maths(pool[s], "vk"), st_ref[n, t]) < 1e-5  # state after token t
    assert_rows_unchanged(pool, before, owned)


def test_slot_table_without_num_accepted_tokens_loads_column_0(naive):
    N, T, H, HV, K, V = 2, 3, 1, 1, 4, 4
    inp = make_inputs("gdn", N, T, H, HV, K, V)
    table = slot_table(N, T)
    pool = random_pool(N * T + 1, HV, K, V, "vk")
    before = pool.clone()
    o = decode("gdn", inp, pool, table)
    o_ref, st_ref = oracle(naive, "gdn", inp, [to_maths(before[table[n, 0]], "vk") for n in range(N)])
    assert naive.rel(o, o_ref) < 1e-5
    for n in range(N):
        assert naive.rel(to_maths(pool[table[n, 2]], "vk"), st_ref[n, 2]) < 1e-5
    assert_rows_unchanged(pool, before, set(table.flatten().tolist()))


def test_slot_table_padding_row_reads_and_writes_nothing():
    N, T, H, HV, K, V = 3, 2, 1, 1, 4, 4
    inp = make_inputs("gdn", N, T, H, HV, K, V)
    table = slot_table(N, T)
    table[1, 0] = -1  # row 1 loads from column 0 (num_accepted 1): padding, although column 1 names a slot
    nacc = torch.tensor([1, 1, 0])
    pool = random_pool(N * T + 1, HV, K, V, "vk")
    before = pool.clone()
    buf = torch.zeros(N, T, HV, V, K)
    o = decode("gdn", inp, pool, table, num_accepted_tokens=nacc, intermediate_states=buf)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.equal(buf[1], torch.zeros_like(buf[1]))
    assert torch.equal(pool[table[1, 1]], before[table[1, 1]])
    assert_rows_unchanged(pool, before, set(table[[0, 2]].flatten().tolist()))


def test_num_accepted_tokens_needs_a_slot_table():
    inp = make_inputs("gdn", 2, 2, 1, 1, 4, 4)
    pool = random_pool(3, 1, 4, 4, "vk")
    before = pool.clone()
    with pytest.raises(ValueError, match="per-token slot table"):
        decode("gdn", inp, pool, torch.tensor([0, 1]), num_accepted_tokens=torch.tensor([1, 1]))
    assert same_bits(pool, before)


@pytest.mark.parametrize("table", [False, True])
def test_disable_state_update_leaves_pool_bitwise_unchanged(table):
    N, T, H, HV, K, V = 3, 3, 1, 2, 8, 8
    inp = make_inputs("kda", N, T, H, HV, K, V)
    idx = slot_table(N, T) if table else torch.tensor([5, 0, 2])
    pool = random_pool(N * T + 1, HV, K, V, "vk")
    before = pool.clone()
    buf_a, buf_b = torch.zeros(N, T, HV, V, K), torch.zeros(N, T, HV, V, K)
    o_ro = decode("kda", inp, pool, idx, disable_state_update=True, intermediate_states=buf_a)
    assert torch.equal(pool, before)
    pool_rw = pool.clone()
    o_rw = decode("kda", inp, pool_rw, idx, intermediate_states=buf_b)
    assert torch.equal(o_ro, o_rw) and torch.equal(buf_a, buf_b)  # verify-only computes the same
    assert_rows_unchanged(pool_rw, before, set(idx.flatten().tolist()))
    assert not same_bits(pool_rw, before)


# -- extremes and views -------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("cd", [F32, F64])
def test_f18_extreme_gates_give_finite_decode(family, cd):
    N, T, H, HV, K, V = 3, 4, 1, 3, 4, 4
    inp = make_inputs(family, N, T, H, HV, K, V)
    inp["A_log"] = torch.tensor([100.0, 0.0, 100.0])
    inp["dt_bias"] = torch.zeros_like(inp["dt_bias"])
    head_a = torch.tensor([-200.0, 100.0, 1.0])  # decay 1, softplus 100, decay 0
    inp["a"] = head_a.view(1, 1, HV, *([1] if family == "kda" else [])).expand_as(inp["a"]).clone()
    pool = random_pool(4, HV, K, V, "vk", F64 if cd == F64 else F32)
    before = pool.clone()
    o = decode(family, inp, pool, torch.tensor([3, 0, 1]), compute_dtype=cd)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    assert_rows_unchanged(pool, before, {3, 0, 1})


def test_f11_strided_gates_and_fused_qkv_views_decode():
    N, T, H, HV, K, V = 2, 3, 2, 4, 8, 8
    proj = torch.randn(N, T, 2 * H * K + HV * V)
    q = proj[..., :H * K].unflatten(-1, (H, K))
    k = proj[..., H * K:2 * H * K].unflatten(-1, (H, K))
    v = proj[..., 2 * H * K:].unflatten(-1, (HV, V))
    ab = torch.randn(N, T, 2 * HV)
    strided = dict(q=q, k=k, v=v, a=ab[..., 0::2], b=ab[..., 1::2], A_log=torch.randn(HV), dt_bias=torch.randn(HV))
    assert not strided["a"].is_contiguous() and not strided["q"].is_contiguous()
    dense = {key: val.contiguous() for key, val in strided.items()}
    pool = random_pool(3, HV, K, V, "vk")
    p1, p2 = pool.clone(), pool.clone()
    o1 = decode("gdn", strided, p1, torch.tensor([2, 0]))
    o2 = decode("gdn", dense, p2, torch.tensor([2, 0]))
    assert same_bits(o1, o2) and same_bits(p1, p2)  # the same elements, the same bits
    assert torch.equal(p1[1], pool[1])


def test_blocks_of_rows_give_the_same_result(monkeypatch):
    """Large states are processed a few rows at a time; blocks of one row must change nothing."""
    import linattn.reference as ref  # the maths torch-ref runs (its block size)
    N, T, H, HV, K, V = 5, 3, 1, 2, 16, 8
    inp = make_inputs("kda", N, T, H, HV, K, V)
    table = slot_table(N, T)
    table[2, 1] = -1
    table[4, 0] = -1  # padding row (loads column 0)
    nacc = torch.tensor([1, 0, 3, 2, 1])
    pool = random_pool(N * T + 2, HV, K, V, "kv")
    before = pool.clone()
    kw = dict(num_accepted_tokens=nacc, state_layout="kv", intermediate_state_indices=torch.tensor([4, 0, -1, 1, 2]))
    p_one, buf_one = pool.clone(), torch.zeros(N, T, HV, K, V)
    o_one = decode("kda", inp, p_one, table, intermediate_states=buf_one, **kw)
    monkeypatch.setattr(ref, "BLOCK_BYTES", 1)  # one row per block
    p_blk, buf_blk = pool.clone(), torch.zeros(N, T, HV, K, V)
    o_blk = decode("kda", inp, p_blk, table, intermediate_states=buf_blk, **kw)
    torch.testing.assert_close(o_blk, o_one, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(p_blk, p_one, rtol=1e-6, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(buf_blk, buf_one, rtol=1e-6, atol=1e-7)
    assert torch.equal(o_blk[4], torch.zeros_like(o_blk[4]))
    assert_rows_unchanged(p_blk, before, set(table[:4].flatten().tolist()))
