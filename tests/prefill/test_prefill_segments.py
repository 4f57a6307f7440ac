"""The segment-parallel state pass of the Triton chunked prefill (issue 18; docs/ops.md,
"Segment-parallel state pass"), on the CPU through the Triton interpreter at K = V = 64 (the
smallest supported head dim; K = 128 where a transposed state must show).

``segment_chunks=L`` forces segments of ``L`` chunks (GDN's bf16 path may round ``L`` up to even),
``0`` the single-segment path. The segmented path must match the float64 token-serial reference
within ops.md's tolerances (fp32 inputs: 1e-5 on outputs and states; bf16: 2e-2 / 1e-2) and stay
close to the single-segment path (the same maths, rounded in another order: not bitwise); pool
mode equals dense mode bitwise; pool rows the call does not own keep their bits; a
``has_initial_state`` False slot full of NaN behaves as a zeroed slot; a padding sequence (negative
index) has zero output rows and touches no row; GVA (HV = 2H) reads the right key head.

Most inputs use slow gates (a twentieth of a gating op's usual decay, about -0.016 per token): with
the usual ones (about -0.3) a state entering a segment has decayed by e^-20 before the segment ends,
and a wrong transition ``M_seg`` would vanish inside 1e-5.
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import profile  # noqa: E402
from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import check_two_bf16_pool_runs, make_inputs, nan_run, random_states, reference, rel, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FAMILIES = ("gdn", "kda")
HV = 2  # H = 1: GVA at group 2 throughout, H = 2 / HV = 4 where said
#: chunk counts 1, 0, 1, 1, 2, 4, 0: at and off the 64 grid, empty and length-1 sequences among
#: long ones; L = 3 cuts 200's four chunks into 3 + 1, L = 2 into 2 + 2, L = 1 into four
LENS = [1, 0, 63, 64, 65, 200, 0]
FP32_TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for torch's small CPU ops (the reference, the tables): on a busy
    two-core machine a second OpenMP thread only waits."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def slow(inp: dict) -> dict:
    """The inputs with gates a twentieth as strong: states carry across segments (module docstring)."""
    return dict(inp, g=inp["g"] * 0.05)


def _per_sequence(o, ro, ht, rht, lens, tol, what=""):
    """Every non-empty sequence's output rows and every given final state within ``tol`` on their own
    (a short sequence would vanish in a batch-wide norm)."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    for n, L in enumerate(lens):
        if L:
            assert rel(o[cu[n]:cu[n + 1]], ro[cu[n]:cu[n + 1]]) < tol, (what, n, L, rel(o[cu[n]:cu[n + 1]], ro[cu[n]:cu[n + 1]]))
        if ht is not None and L:
            assert rel(ht[n], rht[n]) < tol, (what, n, L, rel(ht[n], rht[n]))


def _rows_unchanged(before: torch.Tensor, after: torch.Tensor, owned) -> None:
    """Every pool row not in ``owned`` keeps its exact bits."""
    for s in range(before.shape[0]):
        if s not in owned:
            assert torch.equal(before[s], after[s]), f"pool row {s}, not owned by the call, changed"


def _plan(family: str, inp: dict, **kw) -> pm.PrefillPlan:
    return pm.plan_prefill(family, q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"], **kw)


@functools.lru_cache(maxsize=None)
def _dense_case(family: str):
    """The inputs, initial states, float64 reference and single-segment run of the main test."""
    inp = slow(make_inputs(family, LENS, HV=HV, seed=61, device=DEV))
    h0 = random_states(len(LENS), HV, 64, 64, seed=62, device=DEV)
    ro, rht = reference(family, inp, initial_state=h0)
    # the states do carry across segments here: without h0 the long sequences' final states differ
    _, rht0 = reference(family, inp, initial_state=torch.zeros_like(h0))
    assert rel(rht0[5], rht[5]) > 1e-2 and rel(rht0[4], rht[4]) > 1e-2
    one = run(family, inp, initial_state=h0, segment_chunks=0)
    return inp, h0, ro, rht, one


# -- against the reference and the single-segment path ----------------------------------------------

@pytest.mark.parametrize("L", [1, 2, 3], ids=["L1", "L2", "L3"])
@pytest.mark.parametrize("family", FAMILIES)
def test_segmented_path_matches_the_reference_and_the_single_segment_path(monkeypatch, family, L):
    """Dense mode with random initial states, every buffer starting as NaN: each sequence's output
    rows and final state within 1e-5 of float64, the whole call within 1e-5 of the single-segment
    path (close, not bitwise: the combine rounds in another order), empty sequences' final states
    their initial states bitwise."""
    inp, h0, ro, rht, (o1, ht1) = _dense_case(family)
    assert _plan(family, inp, initial_state=h0, segment_chunks=L).segment_chunks == L
    assert _plan(family, inp, initial_state=h0, segment_chunks=0).segment_chunks == 0
    o, ht = nan_run(monkeypatch, family, inp, initial_state=h0, segment_chunks=L)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    _per_sequence(o, ro, ht, rht, LENS, FP32_TOL, f"L={L}")
    _per_sequence(o1, ro, ht1, rht, LENS, FP32_TOL, "single segment")
    assert rel(o, o1) < FP32_TOL and rel(ht, ht1) < FP32_TOL
    for n, length in enumerate(LENS):
        if length == 0:
            assert torch.equal(ht[n], h0[n])


@pytest.mark.parametrize("family", FAMILIES)
def test_strongly_negative_gates_on_the_segmented_path_match_the_reference(family):
    """Pool mode, segments of 1 chunk: a sequence with the floor gate -1000 on the first and last row
    of every chunk (the segment boundaries) and -0.02 between, one at -20 per token, one whose last
    token is at the floor, a length-1 one; every pool row not owned keeps its bits."""
    lens, slots = [130, 129, 70, 1], [4, 0, 2, 5]
    inp = make_inputs(family, lens, HV=HV, seed=63, device=DEV)
    g = inp["g"]
    g[:130] = -0.02
    g[0:130:64] = -1000.0
    g[63:130:64] = -1000.0
    g[129] = -1000.0
    g[130:259] = -20.0
    g[328] = -1000.0
    pool = random_states(6, HV, 64, 64, seed=64, device=DEV)
    before = pool.clone()
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    o, _ = run(family, inp, state_pool=pool, state_indices=idx, segment_chunks=1)
    rp = before.clone().double()
    ro, _ = reference(family, inp, state_pool=rp, state_indices=idx)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    _per_sequence(o, ro, pool[slots], rp[slots], lens, FP32_TOL)
    _rows_unchanged(before, pool, set(slots))


# -- pool and dense mode, pool rows, has_initial_state, padding -------------------------------------

@pytest.mark.parametrize("family,pool_dtype", [("gdn", torch.bfloat16), ("kda", torch.float32)],
                         ids=["gdn-bf16pool", "kda-fp32pool"])
def test_pool_mode_equals_dense_mode_bitwise_on_the_segmented_path(family, pool_dtype):
    """The same call in pool mode and in dense mode (the initial states the pool rows hold): the
    outputs and the final states bitwise equal, pool rows the call does not own bitwise unchanged,
    an empty sequence's row bitwise unchanged, the owned rows advanced."""
    lens = [0, 130, 1, 65]  # L = 2 cuts 130's three chunks into 2 + 1
    P = 8
    gen = torch.Generator().manual_seed(65)
    slots = torch.randperm(P, generator=gen)[:len(lens)].to(torch.int32).to(DEV)
    inp = slow(make_inputs(family, lens, HV=HV, seed=66, device=DEV))
    pool = random_states(P, HV, 64, 64, dtype=pool_dtype, seed=67, device=DEV)
    before = pool.clone()
    o_pool, none = run(family, inp, state_pool=pool, state_indices=slots, segment_chunks=2)
    o_dense, ht = run(family, inp, initial_state=before[slots.long()].clone(), segment_chunks=2)
    assert none is None and ht.dtype == pool_dtype
    assert torch.equal(o_pool, o_dense)
    assert torch.equal(pool[slots.long()], ht)
    live = {int(s) for s, n in zip(slots.tolist(), lens) if n}
    _rows_unchanged(before, pool, live)
    assert torch.equal(pool[int(slots[0])], before[int(slots[0])])  # the empty sequence's row
    for s in live:
        assert not torch.equal(pool[s], before[s])


def test_a_strided_pool_view_honours_the_slot_pitch_on_the_segmented_path():
    """A pool that is every other slot of a larger buffer (``stride(0)`` = 2 slots): the combine reads
    and writes the named rows through the pitch (dense mode's bits), the other half of the buffer
    keeps its bits."""
    inp = slow(make_inputs("gdn", [130, 5], HV=HV, seed=76, device=DEV))
    big = random_states(8, HV, 64, 64, seed=77, device=DEV)
    before = big.clone()
    pool = big[::2]
    idx = torch.tensor([3, 0], dtype=torch.int32, device=DEV)
    o, _ = run("gdn", inp, state_pool=pool, state_indices=idx, segment_chunks=1)
    o2, ht = run("gdn", inp, initial_state=before[::2][idx.long()].clone(), segment_chunks=1)
    assert torch.equal(o, o2) and torch.equal(pool[idx.long()], ht)
    assert torch.equal(big[1::2], before[1::2]) and torch.equal(pool[[1, 2]], before[::2][[1, 2]])


@pytest.mark.parametrize("family", FAMILIES)
def test_has_initial_state_false_on_nan_slots_equals_zeroed_slots_bitwise_on_the_segmented_path(family):
    """Segments of 1 chunk. Fresh sequences (a long one, a short one, an empty one) on NaN-filled
    slots with the mask give bitwise the outputs and pool of the same call on zeroed slots without
    it; a padding sequence among them; the empty fresh sequence's slot becomes zeros; the rows not
    owned keep their bits; both match the float64 reference."""
    lens, slots = [5, 130, 0, 3, 70], [4, 0, 2, -1, 5]
    fresh = [True, True, True, True, False]
    inp = slow(make_inputs(family, lens, HV=HV, seed=68, device=DEV))
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    his = torch.tensor([not f for f in fresh], device=DEV)
    fresh_slots = [s for s, f in zip(slots, fresh) if f and s >= 0]
    pool = random_states(7, HV, 64, 64, seed=69, device=DEV)
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[fresh_slots] = float("nan")
    zero_pool[fresh_slots] = 0.0
    before_zero = zero_pool.clone()
    o1, _ = run(family, inp, state_pool=nan_pool, state_indices=idx, has_initial_state=his, segment_chunks=1)
    o2, _ = run(family, inp, state_pool=zero_pool, state_indices=idx, segment_chunks=1)
    assert torch.isfinite(o1).all() and torch.isfinite(nan_pool).all()
    assert torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool)
    assert nan_pool[2].eq(0).all()  # the empty fresh sequence
    assert o1[135:138].eq(0).all()  # the padding sequence's rows
    _rows_unchanged(pool, nan_pool, {4, 0, 2, 5})
    rp = before_zero.clone().double()
    ro, _ = reference(family, inp, state_pool=rp, state_indices=idx)
    live = [4, 0, 5]
    _per_sequence(o1, ro, None, None, lens, FP32_TOL)
    assert rel(nan_pool[live], rp[live]) < FP32_TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_and_gva_with_two_key_heads_on_the_segmented_path_match_the_reference(family):
    """H = 2, HV = 4 (value heads 2 and 3 read key head 1), pool mode, segments of 2 chunks: a
    padding sequence's rows are zeros and it touches no row; an empty sequence's row keeps its bits;
    the live sequences match the float64 reference; rows not owned keep their bits."""
    lens, slots = [130, 40, 70, 0], [3, -1, 0, 5]
    H, hv = 2, 4
    inp = slow(make_inputs(family, lens, H=H, HV=hv, seed=70, device=DEV))
    pool = random_states(6, hv, 64, 64, seed=71, device=DEV)
    before = pool.clone()
    idx = torch.tensor(slots, dtype=torch.int64, device=DEV)
    o, _ = run(family, inp, state_pool=pool, state_indices=idx, segment_chunks=2)
    rp = before.clone().double()
    ro, _ = reference(family, inp, state_pool=rp, state_indices=idx)
    assert torch.equal(o[130:170], torch.zeros_like(o[130:170]))
    _per_sequence(o, ro, None, None, lens, FP32_TOL)
    assert rel(pool[[3, 0]], rp[[3, 0]]) < FP32_TOL
    for s in (3, 0):  # each value head on its own: a wrong key head would show on heads 2, 3
        for h in range(hv):
            assert rel(pool[s, h], rp[s, h]) < FP32_TOL, (s, h)
    _rows_unchanged(before, pool, {3, 0})


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_layout_with_K_ne_V_is_not_misread_by_the_combine(family):
    """K = 128, V = 64, a "kv" pool ([P, HV, K, V], S itself) against the default "vk" ([P, HV, V, K],
    S^T): the combine reads and writes the pool rows in their layout (a transposed read would not
    even have the shape); both match the reference, rows not owned keep their bits."""
    K, V = 128, 64
    inp = slow(make_inputs(family, [130, 5], HV=HV, K=K, V=V, seed=72, device=DEV))
    idx = torch.tensor([4, 1], device=DEV)
    for layout in ("kv", "vk"):
        pool = random_states(6, HV, K, V, layout=layout, seed=73, device=DEV)
        before = pool.clone()
        o, _ = run(family, inp, state_pool=pool, state_indices=idx, state_layout=layout, segment_chunks=1)
        rp = before.clone().double()
        ro, _ = reference(family, inp, state_pool=rp, state_indices=idx, state_layout=layout)
        assert rel(o, ro) < FP32_TOL and rel(pool[[4, 1]], rp[[4, 1]]) < FP32_TOL, layout
        _rows_unchanged(before, pool, {4, 1})


# -- the bf16 stage options -------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_stage_options_on_the_segmented_path(family):
    """bf16 inputs run the pinned bf16 stage options in the interpreter (GDN at group 2: the grouped
    output, every second chunk's state only, U in the state stage; KDA: the output written by the
    state stage, here by the rerun). Segments of 3 chunks asked for (GDN rounds up to an even
    length: its every-second-chunk store counts from the segment's start) against the
    single-segment path, pool mode with padding, an empty sequence and foreign rows: both within
    bf16's tolerances of float64 (check_two_bf16_pool_runs), and within 1e-5 of each other (the
    interpreter computes the bf16 path in fp32)."""
    lens, slots = [70, 0, 5, 260, 64], [3, 1, -1, 0, 5]
    inp = slow(make_inputs(family, lens, HV=HV, dtype=torch.bfloat16, seed=74, device=DEV))
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    before = random_states(7, HV, 64, 64, seed=75, device=DEV)
    plan = _plan(family, inp, state_pool=before, state_indices=idx, segment_chunks=3)
    if plan.stages.every_second_state:
        assert plan.segment_chunks in (3, 4) and plan.segment_chunks % 2 == 0
    else:
        assert plan.segment_chunks == 3
    assert plan.stages.every_second_state == (family == "gdn") and plan.state_writes_output == (family == "kda")
    outs, pools = [], []
    for L in (3, 0):
        pool = before.clone()
        o, _ = run(family, inp, state_pool=pool, state_indices=idx, segment_chunks=L)
        outs.append(o)
        pools.append(pool)
    check_two_bf16_pool_runs(family, inp, idx, before, outs, pools, pool_close=FP32_TOL)
    assert rel(outs[0], outs[1]) < FP32_TOL


# -- the plan ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_plan_records_the_segment_length_from_metadata_alone(family, dtype):
    """``segment_chunks`` on the plan: 0 when forced off, the forced ``L`` (rounded up to even on
    GDN's every-second-chunk path only), an int >= 0 for the planner's choice; planned from meta
    tensors (no values); a negative length, or any at K = 256, is refused and says so."""
    meta = dict(device="meta")
    T, H, hv, K, V, N = 4000, 1, 2, 64, 64, 3
    kw = dict(q=torch.empty(T, H, K, dtype=dtype, **meta), v=torch.empty(T, hv, V, dtype=dtype, **meta),
              cu_seqlens=torch.empty(N + 1, dtype=torch.int32, **meta), caps=profile("sm90"),
              state_pool=torch.empty(5, hv, V, K, **meta), state_indices=torch.empty(N, dtype=torch.int32, **meta))
    assert pm.plan_prefill(family, **kw, segment_chunks=0).segment_chunks == 0
    for L in (1, 2, 3, 8):
        plan = pm.plan_prefill(family, **kw, segment_chunks=L)
        if plan.stages.every_second_state:
            assert plan.segment_chunks in (L, L + 1) and plan.segment_chunks % 2 == 0
        else:
            assert plan.segment_chunks == L
    plan = pm.plan_prefill(family, **kw)  # 65 chunks per sequence on average: fewer than 4 segments
    assert plan.segment_chunks == 0 and ("fewer than 4 segments" in plan.segment_reason or "fp32" in plan.segment_reason)
    long = dict(kw, q=torch.empty(200_000, H, K, dtype=dtype, **meta), v=torch.empty(200_000, hv, V, dtype=dtype, **meta),
                cu_seqlens=torch.empty(2, dtype=torch.int32, **meta), state_indices=torch.empty(1, dtype=torch.int32, **meta))
    chosen = pm.plan_prefill(family, **long)  # one long prompt on 2 value heads: cut, unless fp32
    if dtype == torch.float32:
        assert chosen.segment_chunks == 0 and "fp32" in chosen.segment_reason
    else:
        assert chosen.segment_chunks >= pm.SEGMENT_MIN_CHUNKS and "segments of" in chosen.segment_reason
    assert pm.plan_prefill(family, **long).segment_chunks == chosen.segment_chunks  # metadata alone: the same
    with pytest.raises(ValueError, match="segment_chunks"):
        pm.plan_prefill(family, **kw, segment_chunks=-1)
    # K = 256: past the pass's key dim (SEGMENT_MAX_K = 128), the planner keeps one segment and a
    # forced length is refused
    wide = dict(kw, q=torch.empty(T, H, 256, dtype=dtype, **meta), state_pool=torch.empty(5, hv, V, 256, **meta))
    assert pm.plan_prefill(family, **wide).segment_chunks == 0
    assert pm.plan_prefill(family, **wide, segment_chunks=0).segment_chunks == 0
    with pytest.raises(ValueError, match="segment_chunks"):
        pm.plan_prefill(family, **wide, segment_chunks=2)
