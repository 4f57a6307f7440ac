"""``has_initial_state`` (issue 16, item 3; docs/ops-decisions.md "has_initial_state"): a sequence
marked False starts from a zero state without reading its slot and writes its final state there.

On torch-ref and the Triton interpreter, for decode and pool-mode prefill, GDN and KDA:
``has_initial_state=False`` on NaN-filled slots gives bitwise the outputs and pool of the same call
on zeroed slots without the mask (the kernels mask the state load, so the slot's contents never
enter); all-True equals omitting the argument, bitwise; mixed batches with padding; every call
checks that unowned pool rows are bitwise unchanged. The bf16 prefill cases run the pinned bf16
stage options in the interpreter (KDA's fused output, GDN's grouped output with HSTEP = 2 and U in
the state stage, ``prefill.stage_options``). Refusals (dense mode, wrong dtype or shape) leave the
pool bitwise unchanged.
"""

from __future__ import annotations

import pytest
import torch

import linattn

from prefill_cases import make_inputs

NAN = float("nan")


def _owned_unchanged(before: torch.Tensor, after: torch.Tensor, owned: set):
    for s in range(before.shape[0]):
        if s not in owned:
            assert torch.equal(before[s], after[s]), f"unowned slot {s} changed"


# -- decode ---------------------------------------------------------------------------------------

N, T, H, HV, K, V, P = 4, 2, 1, 2, 8, 8, 9


def _decode_inputs(family: str, layout: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    kda = family == "kda"
    d = dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V),
             a=r(*((N, T, HV, K) if kda else (N, T, HV))), b=r(N, T, HV),
             A_log=r(HV) * 0.5, dt_bias=r(*((HV, K) if kda else (HV,))) * 0.5)
    pool = r(P, HV, *((V, K) if layout == "vk" else (K, V)))
    return d, pool


def _decode(family, d, pool, idx, backend, **kw):
    fn = linattn.kda_decode if family == "kda" else linattn.gdn_decode
    return fn(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], pool, idx, backend=backend, **kw)


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["torch-ref", "triton-split", "triton-folded"])
def test_decode_fresh_rows_on_nan_slots_equal_zeroed_slots_bitwise(backend, family, layout):
    d, pool = _decode_inputs(family, layout, seed=len(family) + len(layout))
    idx = torch.tensor([3, -1, 7, 0], dtype=torch.int32)
    his = torch.tensor([False, False, True, False])  # row 1 is padding: its flag is irrelevant
    fresh = [3, 0]
    owned = {3, 7, 0}
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[fresh] = NAN
    zero_pool[fresh] = 0.0
    o1 = _decode(family, d, nan_pool, idx, backend, state_layout=layout, has_initial_state=his)
    assert linattn.last_decision().chosen == backend
    o2 = _decode(family, d, zero_pool, idx, backend, state_layout=layout)
    assert torch.isfinite(o1).all() and torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool)
    assert o1[1].eq(0).all()
    _owned_unchanged(pool, nan_pool, owned)
    # all True equals omitting it
    p3, p4 = pool.clone(), pool.clone()
    o3 = _decode(family, d, p3, idx, backend, state_layout=layout, has_initial_state=torch.ones(N, dtype=torch.bool))
    o4 = _decode(family, d, p4, idx, backend, state_layout=layout)
    assert torch.equal(o3, o4) and torch.equal(p3, p4)
    _owned_unchanged(pool, p3, owned)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["torch-ref", "triton-split"])
def test_decode_fresh_rows_with_a_slot_table_intermediates_and_verify_only(backend, family):
    d, pool = _decode_inputs(family, "vk", seed=17)
    idx = torch.tensor([[1, 2], [-1, -1], [5, 6], [0, 4]], dtype=torch.int64)
    nat = torch.tensor([2, 1, 1, 2], dtype=torch.int32)  # load slots 2, -1 (padding), 5, 4
    his = torch.tensor([False, True, True, False])
    owned = {1, 2, 5, 6, 0, 4}
    inter0 = torch.randn(5, T, HV, V, K)
    ii = torch.tensor([3, 0, -1, 1], dtype=torch.int32)
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[[2, 4]] = NAN  # the load slots of the fresh rows
    zero_pool[[2, 4]] = 0.0
    i1, i2 = inter0.clone(), inter0.clone()
    o1 = _decode(family, d, nan_pool, idx, backend, num_accepted_tokens=nat, intermediate_states=i1,
                 intermediate_state_indices=ii, has_initial_state=his)
    o2 = _decode(family, d, zero_pool, idx, backend, num_accepted_tokens=nat, intermediate_states=i2,
                 intermediate_state_indices=ii)
    assert torch.isfinite(o1).all()
    assert torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool) and torch.equal(i1, i2)
    _owned_unchanged(pool, nan_pool, owned)
    _owned_unchanged(inter0, i1, {3, 1})
    # verify only (disable_state_update): nothing is written, the NaN slots stay as they were
    ro = pool.clone()
    ro[[2, 4]] = NAN
    before = ro.clone()
    o3 = _decode(family, d, ro, idx, backend, num_accepted_tokens=nat, disable_state_update=True,
                 has_initial_state=his)
    assert torch.equal(o3, o2) and torch.equal(ro.nan_to_num(), before.nan_to_num())
    assert ro[[2, 4]].isnan().all()


# -- prefill --------------------------------------------------------------------------------------

LENS = [5, 70, 0, 3, 9]  # two chunks, an empty sequence, padding (slot -1 at n = 3)
SLOTS = [4, 0, 2, -1, 5]
FRESH = [True, False, True, True, False]  # sequence 2 is empty and fresh: its slot becomes zeros
PP = 7


def _prefill(family, inp, pool, idx, backend, **kw):
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    return fn(**inp, state_pool=pool, state_indices=idx, backend=backend, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["torch-ref", "triton-split"])
def test_prefill_fresh_sequences_on_nan_slots_equal_zeroed_slots_bitwise(backend, family, dtype):
    inp = make_inputs(family, LENS, H=1, HV=2, dtype=dtype, seed=len(family) + dtype.itemsize)
    idx = torch.tensor(SLOTS, dtype=torch.int32)
    his = torch.tensor([not f for f in FRESH])
    fresh_slots = [s for s, f in zip(SLOTS, FRESH) if f and s >= 0]
    owned = {s for s in SLOTS if s >= 0}
    pool = torch.randn(PP, 2, 64, 64)
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[fresh_slots] = NAN
    zero_pool[fresh_slots] = 0.0
    o1 = _prefill(family, inp, nan_pool, idx, backend, has_initial_state=his)
    assert linattn.last_decision().chosen == backend
    o2 = _prefill(family, inp, zero_pool, idx, backend)
    assert torch.isfinite(o1).all() and torch.isfinite(nan_pool).all()
    assert torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool)
    assert nan_pool[2].eq(0).all()  # the empty fresh sequence's final state: zeros
    _owned_unchanged(pool, nan_pool, owned)
    pad = slice(sum(LENS[:3]), sum(LENS[:4]))
    assert o1[pad].eq(0).all()


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("backend", ["torch-ref", "triton-split"])
def test_prefill_all_true_equals_omitting_it(backend, family, layout):
    inp = make_inputs(family, [7, 66], H=1, HV=2, seed=3)
    idx = torch.tensor([1, 3], dtype=torch.int64)
    pool = torch.randn(4, 2, 64, 64)
    p1, p2 = pool.clone(), pool.clone()
    o1 = _prefill(family, inp, p1, idx, backend, state_layout=layout, has_initial_state=torch.ones(2, dtype=torch.bool))
    o2 = _prefill(family, inp, p2, idx, backend, state_layout=layout)
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    _owned_unchanged(pool, p1, {1, 3})


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_fresh_sequences_match_dense_mode_without_initial_state(family):
    """A fresh sequence is exactly a dense call without an initial state (torch-ref)."""
    inp = make_inputs(family, [7, 12], H=1, HV=2, seed=8)
    pool = torch.full((3, 2, 64, 64), NAN)
    o1 = _prefill(family, inp, pool, torch.tensor([2, 0]), "torch-ref",
                  has_initial_state=torch.zeros(2, dtype=torch.bool))
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    o2, final = fn(**inp, backend="torch-ref")
    assert torch.equal(o1, o2) and torch.equal(pool[[2, 0]], final)
    assert pool[1].isnan().all()


def test_prefill_t0_zeroes_the_slots_of_fresh_sequences_only():
    inp = make_inputs("gdn", [0, 0], H=1, HV=2, seed=1)
    for backend in ("torch-ref", "triton-split"):
        pool = torch.full((3, 2, 64, 64), NAN)
        _prefill("gdn", inp, pool, torch.tensor([2, 0]), backend, has_initial_state=torch.tensor([False, True]))
        assert pool[2].eq(0).all() and pool[0].isnan().all() and pool[1].isnan().all()


# -- refusals -------------------------------------------------------------------------------------

def test_refusals_leave_the_pool_unchanged():
    inp = make_inputs("gdn", [4, 5], H=1, HV=2, seed=2)
    pool = torch.randn(3, 2, 64, 64)
    idx = torch.tensor([0, 2])
    cases = [
        (dict(has_initial_state=torch.tensor([1, 0])), TypeError, "has_initial_state has dtype"),
        (dict(has_initial_state=torch.tensor([1.0, 0.0])), TypeError, "has_initial_state has dtype"),
        (dict(has_initial_state=torch.tensor([True])), ValueError, r"shape \[N\] = \[2\]"),
        (dict(has_initial_state=torch.tensor([[True, False]])), ValueError, r"shape \[N\]"),
    ]
    for kw, exc, says in cases:
        p = pool.clone()
        with pytest.raises(exc, match=says):
            linattn.gdn_prefill(**inp, state_pool=p, state_indices=idx, **kw)
        assert torch.equal(p, pool)
    with pytest.raises(ValueError, match="dense mode pass initial_state"):
        linattn.gdn_prefill(**inp, has_initial_state=torch.tensor([True, False]))
    d, dpool = _decode_inputs("gdn", "vk", seed=4)
    p = dpool.clone()
    with pytest.raises(TypeError, match="has_initial_state has dtype"):
        _decode("gdn", d, p, torch.tensor([0, 1, 2, 3]), None, has_initial_state=torch.zeros(N, dtype=torch.int32))
    assert torch.equal(p, dpool)
    with pytest.raises(ValueError, match=r"shape \[N\] = \[4\]"):
        _decode("gdn", d, p, torch.tensor([0, 1, 2, 3]), None, has_initial_state=torch.zeros(3, dtype=torch.bool))
    assert torch.equal(p, dpool)


def test_problem_field_and_strided_mask():
    from linattn.dispatch.rules.validate import validate

    inp = make_inputs("gdn", [4, 5], H=1, HV=2, seed=2)
    args = dict(**inp, state_pool=torch.zeros(3, 2, 64, 64), state_indices=torch.tensor([0, 2]))
    kw, sig = validate("gdn_prefill", args)
    assert dict(sig)["has_initial_state"] is False and "has_initial_state" not in kw
    mask = torch.tensor([True, False, False, True])[::2]  # a strided view: copied for Triton
    kw, sig = validate("gdn_prefill", dict(args, has_initial_state=mask))
    assert dict(sig)["has_initial_state"] is True and kw["has_initial_state"] is mask
    pool = torch.randn(3, 2, 64, 64)
    p1, p2 = pool.clone(), pool.clone()
    o1 = _prefill("gdn", inp, p1, torch.tensor([0, 2]), "triton-split", has_initial_state=mask)
    o2 = _prefill("gdn", inp, p2, torch.tensor([0, 2]), "triton-split", has_initial_state=mask.contiguous())
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
