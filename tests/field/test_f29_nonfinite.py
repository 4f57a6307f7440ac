"""F29: one request in a batch of four with a NaN in its q (or k, v, beta, decode's a / b).

The rule (docs/ops-decisions.md, "Non-finite inputs"):

- per-sequence inputs (q, k, v, a, b, g, beta) may hold NaN / inf; the non-finite value reaches that
  sequence's outputs and slot only: every other sequence's outputs and slot, padding rows and rows
  the call does not name are bitwise as without it, on every backend;
- shared per-head inputs (decode's ``A_log``, ``dt_bias``) would poison every row: refused in the
  value checks (``validate=True``, the default);
- ``check_finite=True`` refuses any non-finite input before launch; a NaN in prefill's ``g`` (or
  ``g > 0``) is always refused, since g is a log decay.
"""

from __future__ import annotations

import functools

import pytest
import torch

import linattn

from field_cases import DEVICE, backends_for, decode_inputs, prefill_inputs, assert_rows_unchanged

POISONED = 2  # the request with the NaN


def _poison(x: torch.Tensor, rows) -> torch.Tensor:
    y = x.clone()
    y[rows] = float("nan")
    return y


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
@pytest.mark.parametrize("name", ["q", "k", "v", "a", "b"])
def test_decode_nan_stays_in_its_request(op, name):
    idx = torch.tensor([3, -1, 0, 8], device=DEVICE)  # request 1 is padding
    for backend in backends_for(op):
        args, pool0 = decode_inputs(kda=op == "kda_decode")
        runs = []
        for poisoned in (False, True):
            a = dict(args)
            if poisoned:
                a[name] = _poison(a[name], POISONED)
            pool = pool0.clone()
            o = getattr(linattn, op)(**a, state_pool=pool, state_indices=idx, backend=backend)
            assert_rows_unchanged(pool, pool0, idx.tolist())
            runs.append((o, pool))
        (o, pool), (o_bad, pool_bad) = runs
        others = [n for n in range(4) if n != POISONED]
        assert torch.equal(o_bad[others], o[others]), f"{backend}: NaN in {name} reached another request"
        assert torch.equal(o_bad[1], torch.zeros_like(o_bad[1])), f"{backend}: padding row not zero"
        keep = [s for s in range(pool.shape[0]) if s != int(idx[POISONED])]
        assert torch.equal(pool_bad[keep], pool[keep]), f"{backend}: NaN in {name} reached another slot"


PREFILL_LENS = (5, 70, 9, 3)
PREFILL_CU = [0, 5, 75, 84, 87]
PREFILL_SLOTS = [3, -1, 0, 8]


@functools.lru_cache(maxsize=None)
def _clean_prefill(op: str, backend: str):
    """The clean runs the poisoned ones are held against, once per op and backend (every poisoned
    input of the test below compares with the same two calls): pool mode (its rows not owned checked
    bitwise unchanged here) and dense mode. Returns the inputs, the pool before, and both results."""
    args, pool0 = prefill_inputs(lens=PREFILL_LENS, kda=op == "kda_prefill")
    idx = torch.tensor(PREFILL_SLOTS, device=DEVICE)
    pool = pool0.clone()
    o = getattr(linattn, op)(**args, state_pool=pool, state_indices=idx, backend=backend)
    assert_rows_unchanged(pool, pool0, PREFILL_SLOTS)
    o_d, final = getattr(linattn, op)(**args, backend=backend)
    return args, pool0, (o, pool), (o_d, final)


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
@pytest.mark.parametrize("name", ["q", "k", "v", "beta"])
def test_prefill_nan_stays_in_its_sequence(op, name):
    cu = PREFILL_CU
    idx = torch.tensor(PREFILL_SLOTS, device=DEVICE)
    rows = slice(cu[POISONED] + 4, cu[POISONED] + 5)  # one token of sequence 2
    for backend in backends_for(op):
        args, pool0, (o, pool), (o_d, final) = _clean_prefill(op, backend)
        a = {**args, name: _poison(args[name], rows)}
        pool_bad = pool0.clone()
        o_bad = getattr(linattn, op)(**a, state_pool=pool_bad, state_indices=idx, backend=backend)
        assert_rows_unchanged(pool_bad, pool0, idx.tolist())
        other = torch.ones(cu[-1], dtype=torch.bool, device=DEVICE)
        other[cu[POISONED]:cu[POISONED + 1]] = False
        assert torch.equal(o_bad[other], o[other]), f"{backend}: NaN in {name} reached another sequence"
        assert torch.equal(o_bad[cu[1]:cu[2]], torch.zeros_like(o_bad[cu[1]:cu[2]])), f"{backend}: padding"
        keep = [s for s in range(pool.shape[0]) if s != int(idx[POISONED])]
        assert torch.equal(pool_bad[keep], pool[keep]), f"{backend}: NaN in {name} reached another slot"
        # dense mode: the other sequences' outputs and final states are those of the clean run
        o_db, final_b = getattr(linattn, op)(**a, backend=backend)
        assert torch.equal(o_db[other], o_d[other]), f"{backend} dense: NaN in {name} reached another sequence"
        seqs = [n for n in range(4) if n != POISONED]
        assert torch.equal(final_b[seqs], final[seqs]), f"{backend} dense: NaN reached another final state"


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
def test_shared_gate_parameters_must_be_finite(name):
    args, pool = decode_inputs()
    args[name] = _poison(args[name], 0)
    before = pool.clone()
    with pytest.raises(ValueError, match=f"{name}\\[0\\] = nan is not finite; A_log and dt_bias are shared"):
        linattn.gdn_decode(**args, state_pool=pool, state_indices=torch.tensor([3, -1, 0, 8], device=DEVICE))
    assert torch.equal(pool, before)


def test_check_finite_refuses_before_launch_on_every_op():
    args, pool = decode_inputs()
    before = pool.clone()
    bad = {**args, "v": _poison(args["v"], POISONED)}
    with pytest.raises(ValueError, match=r"v\[2, 0, 0, 0\] = nan is not finite; check_finite=True"):
        linattn.gdn_decode(**bad, state_pool=pool, state_indices=torch.tensor([3, -1, 0, 8], device=DEVICE),
                           check_finite=True)
    assert torch.equal(pool, before)
    pargs, ppool = prefill_inputs()
    pbefore = ppool.clone()
    with pytest.raises(ValueError, match=r"beta\[1, 0\] = inf"):
        beta = pargs["beta"].clone()
        beta[1, 0] = float("inf")
        linattn.gdn_prefill(**{**pargs, "beta": beta}, state_pool=ppool,
                            state_indices=torch.tensor([0, 1, 2, 3], device=DEVICE), check_finite=True)
    assert torch.equal(ppool, pbefore)
    x = torch.randn(3, 8, device=DEVICE)
    x[1, 5] = float("-inf")
    with pytest.raises(ValueError, match=r"x\[1, 5\] = -inf"):
        linattn.silu_and_mul_clamp(x, 10.0, check_finite=True)
    a = torch.randn(4, 2, device=DEVICE)
    a[0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"a\[0, 1\] = nan"):
        linattn.gdn_gating(torch.zeros(2, device=DEVICE), a, a, torch.zeros(2, device=DEVICE), check_finite=True)
    # finite inputs pass, and the flag changes nothing else
    out = linattn.silu_and_mul_clamp(x.nan_to_num(neginf=0.0), 10.0, check_finite=True)
    assert torch.equal(out, linattn.silu_and_mul_clamp(x.nan_to_num(neginf=0.0), 10.0))


def test_nan_in_prefill_g_is_refused():
    args, pool = prefill_inputs()
    g = args["g"].clone()
    g[3, 1] = float("nan")
    before = pool.clone()
    with pytest.raises(ValueError, match=r"g\[3, 1\] = nan: g is a log-space decay"):
        linattn.gdn_prefill(**{**args, "g": g}, state_pool=pool, state_indices=torch.tensor([0, 1, 2, 3], device=DEVICE))
    assert torch.equal(pool, before)


def test_readme_says_which_non_finite_inputs_are_contained_and_which_refused():
    """The README's sentence on non-finite inputs holds what the code does: g is refused (a NaN in g
    is never 'contained'), the per-sequence inputs above are contained, A_log / dt_bias refused."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    contained = re.search(r"a NaN or inf in one sequence's (.*?) stays in that sequence's outputs and slot", text)
    assert contained, "the README no longer says which inputs a NaN stays in"
    names = set(re.findall(r"`(\w+)`", contained.group(1)))
    assert names == {"q", "k", "v", "beta", "a", "b"}, names  # the inputs test_*_nan_stays_in_* poison
    assert re.search(r"a NaN or positive `g` .*? are refused by the value checks", text)
    args, pool = prefill_inputs()
    g = args["g"].clone()
    g[0, 0] = float("nan")
    with pytest.raises(ValueError, match="g is a log-space decay"):
        linattn.gdn_prefill(**{**args, "g": g}, state_pool=pool, state_indices=torch.tensor([0, 1, 2, 3], device=DEVICE))
