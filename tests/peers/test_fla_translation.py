"""The ``fla`` peer's translation, up to FLA's launch, on the CPU: what it hands FLA (packed
``[1, T, ...]``, int64 ``cu_seqlens``, ``state_v_first`` for the layout, fp32 states gathered from
the pool with zeros for padding and fresh rows) and what it does with the result (the final
states scattered to the owned slots only, padding outputs zeroed), checked end to end against
torch-ref with FLA's functions replaced by reference stand-ins (``fakes.py``)."""

from __future__ import annotations

import pytest
import torch

from linattn.backends import fla as fla_backend
from linattn.backends import peer
from linattn.backends.fla import FLABackend
from linattn.backends.torch_ref import gdn_decode_ref, gdn_prefill_ref, kda_decode_ref, kda_prefill_ref
from linattn.dispatch.plugin.calls import make_call

from peer_fakes import Log, default_scale, fla_chunk, fla_recurrent


@pytest.fixture
def fla_log(monkeypatch) -> Log:
    log = Log()
    makers = {"prefill": fla_chunk, "decode": fla_recurrent}
    monkeypatch.setattr(fla_backend, "fla_function", lambda family, phase: makers[phase](family, log))
    return log


def _prefill_inputs(family, lens, layout="vk", state_dtype=torch.float32, H=1, HV=2, K=8, V=4, P=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(T, H, K).bfloat16(), r(T, H, K).bfloat16(), r(T, HV, V).bfloat16()
    g = -torch.rand(T, HV, *((K,) if family == "kda" else ()), generator=gen)
    beta = torch.rand(T, HV, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    tile = (V, K) if layout == "vk" else (K, V)
    pool = (0.1 * r(P, HV, *tile)).to(state_dtype)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu), pool


def _run_prefill(family, d, pool, slots, layout, has_initial_state=None):
    call = make_call(f"{family}_prefill", dict(**d, state_pool=pool, state_indices=slots, initial_state=None,
                                               scale=default_scale(d["q"].shape[-1]), use_qk_l2norm=True,
                                               state_layout=layout, has_initial_state=has_initial_state))
    return FLABackend().prefill(call)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_prefill_pool_matches_reference_and_leaves_other_rows_alone(fla_log, family, layout):
    lens, slots = (3, 0, 9, 5), torch.tensor([4, 1, 0, -1])
    d, pool = _prefill_inputs(family, lens, layout)
    pool[5] = float("nan")  # a row nobody owns: never read into a result, never written
    mine, ref_pool = pool.clone(), pool.clone()
    o, final = _run_prefill(family, d, mine, slots, layout)
    ref = gdn_prefill_ref if family == "gdn" else kda_prefill_ref
    o_ref = ref(**d, state_pool=ref_pool, state_indices=slots, scale=default_scale(8), state_layout=layout)[0]
    assert final is None
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine[[4, 1, 0]], ref_pool[[4, 1, 0]], rtol=0, atol=1e-6)
    assert torch.equal(mine[[2, 3]], pool[[2, 3]]) and bool(mine[5].isnan().all())  # not owned: same bits
    assert bool(o[17:].eq(0).all())  # the padding sequence's 5 tokens
    call = fla_log[0]
    assert call["q"].shape[0] == 1 and call["cu_seqlens"].dtype == torch.int64
    assert call["state_v_first"] is (layout == "vk") and call["use_qk_l2norm_in_kernel"] is True
    h0 = call["initial_state"]
    assert h0.dtype == torch.float32 and torch.equal(h0[3], torch.zeros_like(h0[3]))  # padding: zeros, not slot 0
    assert torch.equal(h0[0], pool[4].float())


def test_prefill_has_initial_state_starts_fresh_rows_from_zero_without_reading_them(fla_log):
    lens, slots = (4, 6), torch.tensor([2, 0])
    d, pool = _prefill_inputs("gdn", lens)
    pool[0] = float("nan")  # stale contents of the fresh sequence's slot
    mine, ref_pool = pool.clone(), pool.clone()
    fresh = torch.tensor([True, False])
    o, _ = _run_prefill("gdn", d, mine, slots, "vk", has_initial_state=fresh)
    o_ref = gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=slots, has_initial_state=fresh)[0]
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    assert bool(torch.isfinite(mine[0]).all()) and torch.equal(fla_log[0]["initial_state"][1],
                                                               torch.zeros_like(pool[0]))
    torch.testing.assert_close(mine[[0, 2]], ref_pool[[0, 2]], rtol=0, atol=1e-6)


def test_prefill_hands_fp32_gates_over_when_linattn_is_given_fp64_ones(fla_log):
    d, pool = _prefill_inputs("kda", (4, 3))
    d64 = {**d, "g": d["g"].double(), "beta": d["beta"].double()}
    mine, ref_pool = pool.clone(), pool.clone()
    o, _ = _run_prefill("kda", d64, mine, torch.tensor([0, 2]), "vk")
    o_ref = kda_prefill_ref(**d, state_pool=ref_pool, state_indices=torch.tensor([0, 2]), scale=default_scale(8))[0]
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=1e-6)
    assert fla_log[0]["g"].dtype == torch.float32


def test_prefill_bf16_pool_keeps_its_dtype_and_rounds_the_final_state(fla_log):
    d, pool = _prefill_inputs("gdn", (7,), state_dtype=torch.bfloat16)
    mine, ref_pool = pool.clone(), pool.clone()
    _run_prefill("gdn", d, mine, torch.tensor([3]), "vk")
    gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=torch.tensor([3]))
    assert mine.dtype == torch.bfloat16 and fla_log[0]["initial_state"].dtype == torch.float32
    assert torch.equal(mine, ref_pool)


def test_prefill_dense_mode_returns_a_new_state_in_the_initial_states_dtype(fla_log):
    d, pool = _prefill_inputs("kda", (5, 3), layout="kv")
    h0 = pool[:2].clone()
    call = make_call("kda_prefill", dict(**d, state_pool=None, state_indices=None, initial_state=h0,
                                         scale=default_scale(8), use_qk_l2norm=True, state_layout="kv",
                                         has_initial_state=None))
    o, ht = FLABackend().prefill(call)
    o_ref, ht_ref = kda_prefill_ref(**d, initial_state=h0, scale=default_scale(8), state_layout="kv")
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ht, ht_ref, rtol=0, atol=1e-6)
    assert ht.dtype == h0.dtype and ht.data_ptr() != h0.data_ptr() and torch.equal(h0, pool[:2])


def test_prefill_of_no_tokens_launches_nothing(fla_log):
    d, pool = _prefill_inputs("gdn", (0, 0))
    mine = pool.clone()
    o, _ = _run_prefill("gdn", d, mine, torch.tensor([1, -1]), "vk")
    assert o.shape == (0, 2, 4) and not fla_log and torch.equal(mine, pool)


def _decode_inputs(family, N, T, HV=2, H=1, K=8, V=4, P=8, seed=1):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    d = dict(q=r(N, T, H, K).bfloat16(), k=r(N, T, H, K).bfloat16(), v=r(N, T, HV, V).bfloat16(),
             a=r(N, T, HV, *((K,) if family == "kda" else ())), b=r(N, T, HV), A_log=r(HV),
             dt_bias=r(HV, *((K,) if family == "kda" else ())))
    return d, 0.1 * r(P, HV, V, K)


def _decode_call(family, d, pool, slots, **extra):
    args = dict(**d, state_pool=pool, state_indices=slots, scale=default_scale(8), use_qk_l2norm=True,
                state_layout="vk", **extra)
    if family == "kda":
        args.setdefault("lower_bound", None)
    return make_call(f"{family}_decode", args)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_gathers_gates_and_scatters_like_the_reference(fla_log, family):
    d, pool = _decode_inputs(family, N=4, T=2)
    slots = torch.tensor([5, -1, 0, 2])
    pool[7] = float("nan")
    mine, ref_pool = pool.clone(), pool.clone()
    o = FLABackend().decode(_decode_call(family, d, mine, slots))
    ref = gdn_decode_ref if family == "gdn" else kda_decode_ref
    o_ref = ref(**d, state_pool=ref_pool, state_indices=slots, scale=default_scale(8))
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=2e-6)
    torch.testing.assert_close(mine[[5, 0, 2]], ref_pool[[5, 0, 2]], rtol=0, atol=2e-6)
    assert torch.equal(mine[[1, 3, 4, 6]], pool[[1, 3, 4, 6]]) and bool(mine[7].isnan().all())
    assert len(fla_log) == 1 and bool(o[1].eq(0).all())  # one FLA call for both tokens; padding row zero


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_verify_table_accepted_tokens_and_intermediate_states(fla_log, family):
    d, pool = _decode_inputs(family, N=3, T=3, P=10)
    table = torch.tensor([[4, 1, 2], [-1, -1, -1], [0, 3, 9]])
    accepted = torch.tensor([2, 0, 0])
    inter = torch.full((4, 5, 2, 4, 8), 7.0)  # a view of its first 3 steps is handed over
    rows = torch.tensor([1, -1, 3])
    mine, ref_pool = pool.clone(), pool.clone()
    inter_ref = inter.clone()
    call = _decode_call(family, d, mine, table, num_accepted_tokens=accepted, intermediate_states=inter[:, :3],
                        intermediate_state_indices=rows)
    o = FLABackend().decode(call)
    ref = gdn_decode_ref if family == "gdn" else kda_decode_ref
    o_ref = ref(**d, state_pool=ref_pool, state_indices=table, scale=default_scale(8),
                num_accepted_tokens=accepted, intermediate_states=inter_ref[:, :3], intermediate_state_indices=rows)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=2e-6)
    torch.testing.assert_close(mine, ref_pool, rtol=0, atol=2e-6, equal_nan=True)
    torch.testing.assert_close(inter, inter_ref, rtol=0, atol=2e-6)
    assert len(fla_log) == 3  # one call per token, each handed contiguous [N, 1, ...] tensors
    assert all(c["q"].shape[1] == 1 and c["q"].is_contiguous() and c["g"].is_contiguous() for c in fla_log)
    assert torch.equal(fla_log[0]["initial_state"][2], torch.zeros_like(pool[0]))  # num_accepted 0: reads nothing


def test_decode_disable_state_update_only_reads_the_pool(fla_log):
    d, pool = _decode_inputs("gdn", N=2, T=1)
    mine = pool.clone()
    FLABackend().decode(_decode_call("gdn", d, mine, torch.tensor([3, 1]), disable_state_update=True))
    assert torch.equal(mine, pool)


def test_decode_gate_form_hands_the_given_gates_over(fla_log):
    d, pool = _decode_inputs("gdn", N=2, T=1)
    g, beta = -torch.rand(2, 1, 2), torch.rand(2, 1, 2)
    mine, ref_pool = pool.clone(), pool.clone()
    gate = {k: v for k, v in d.items() if k in ("q", "k", "v")}
    o = FLABackend().decode(_decode_call("gdn", gate, mine, torch.tensor([0, 6]), g=g, beta=beta))
    o_ref = gdn_decode_ref(**gate, a=None, b=None, A_log=None, dt_bias=None, state_pool=ref_pool,
                           state_indices=torch.tensor([0, 6]), g=g, beta=beta)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=2e-6)
    assert torch.equal(fla_log[0]["g"], g) and torch.equal(fla_log[0]["beta"], beta)


def test_prefill_empty_fresh_sequences_leave_zeros_in_their_slots_even_when_nothing_launches(fla_log):
    d, pool = _prefill_inputs("gdn", (0, 0))
    mine, ref_pool = pool.clone(), pool.clone()
    fresh = torch.tensor([False, True])
    o, _ = _run_prefill("gdn", d, mine, torch.tensor([1, 3]), "vk", has_initial_state=fresh)
    gdn_prefill_ref(**d, state_pool=ref_pool, state_indices=torch.tensor([1, 3]), has_initial_state=fresh)
    assert not fla_log and o.shape[0] == 0
    assert bool(mine[1].eq(0).all()) and torch.equal(mine, ref_pool)


def test_dense_prefill_of_no_tokens_returns_a_copy_of_the_initial_state(fla_log):
    d, pool = _prefill_inputs("gdn", (0,))
    h0 = pool[:1].clone()
    call = make_call("gdn_prefill", dict(**d, state_pool=None, state_indices=None, initial_state=h0,
                                         scale=default_scale(8), use_qk_l2norm=True, state_layout="vk",
                                         has_initial_state=None))
    _, ht = FLABackend().prefill(call)
    assert torch.equal(ht, h0) and ht.data_ptr() != h0.data_ptr() and not fla_log


def test_write_rows_without_a_sync_writes_only_the_targeted_rows():
    from linattn.backends.peer import write_rows

    for dtype in (torch.float32, torch.bfloat16):
        dst = torch.randn(5, 2, 3).to(dtype)
        dst[0] = float("nan")  # an odd payload would show if slot 0 were rewritten through another dtype
        dst.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[0, 0, 0] += 1
        before = dst.clone()
        states = torch.randn(4, 2, 3)
        write_rows(dst, torch.tensor([-1, 3, -2, 1]), states)
        assert torch.equal(dst[3], states[1].to(dtype)) and torch.equal(dst[1], states[3].to(dtype))
        same = [0, 2, 4]
        assert torch.equal(dst[same].view(torch.uint8), before[same].view(torch.uint8))
        dst2 = before.clone()
        write_rows(dst2, torch.tensor([-1, -1]), states[:2])  # nothing valid: every row keeps its bits
        assert torch.equal(dst2.view(torch.uint8), before.view(torch.uint8))


def test_the_stand_ins_take_flas_own_parameter_lists():
    """With the real fla-core installed: each stand-in's parameters (names, order, defaults) are the
    ones of the FLA function the backend calls, so an argument handed over by position lands in the
    same parameter in both (FLA 0.6's GDN recurrent function is ``(q, k, v, g, gk, gv, beta, ...)``:
    a positional ``beta`` is a per-key decay there)."""
    if not peer.installed("fla"):
        pytest.skip("fla-core is not installed (pip install 'linattn[peers]')")
    import inspect

    from peer_fakes import FLA_STAND_INS

    for (family, phase), maker in FLA_STAND_INS.items():
        theirs = inspect.signature(fla_backend.fla_function(family, phase)).parameters
        ours = inspect.signature(maker(family, Log())).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == \
            [(p.name, p.kind, p.default) for p in theirs.values()], (family, phase)
