"""Context-parallel prefill (linattn/context_parallel.py) on the CPU: 2 and 3 spawned gloo ranks, one
process group of one rank in this process, and the host-only plan.

Each world size is spawned once (one test per world size); every case of tests/distributed/cp_cases.py
runs inside it on every rank and reports its failures by name, so the test fails with each failing
case's and rank's messages. The oracle is the single-process call and the float64 reference
(docs/ops.md "Tolerances"); pool rows a rank must not write are compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from cp_cases import Case, cases, make_inputs, run_cases

import linattn
from linattn.context_parallel import context_parallel_prefill, make_plan, summary_mode
from linattn.testing.spawn import spawn_ranks

SPAWN_TIMEOUT_S = 150


def _spawned(world: int) -> list[dict]:
    return spawn_ranks(run_cases, world, backend="gloo", timeout_s=SPAWN_TIMEOUT_S)


def _failures(results: list[dict], name: str) -> str:
    bad = {r: res.get(name, ["case did not run"]) for r, res in enumerate(results)}
    return "\n".join(f"rank {r}: " + "\n  ".join(errs) for r, errs in bad.items() if errs)


# One test per world size, not one per case: a spawned group costs 6-23 s, and pytest-xdist would spawn
# a module fixture's group once in each worker that ran one of its cases (twice under make test's -n 2).
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_ranks_agree_with_the_single_process_call_in_every_case(world):
    results = _spawned(world)
    names = sorted(cases(world))
    assert names and all(set(names) <= set(r) for r in results), (names, [sorted(r) for r in results])
    failed = {n: _failures(results, n) for n in names}
    failed = {n: f for n, f in failed.items() if f}
    assert not failed, "\n".join(f"case {n} ({world} ranks):\n{f}" for n, f in failed.items())


# -- one rank: the ordinary call ----------------------------------------------------------------------

@pytest.fixture
def one_rank_group():
    assert not dist.is_initialized(), "a process group leaked from another test"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _args(d: dict, mode: str) -> dict:
    if mode == "pool":
        return dict(state_pool=d["pool"], state_indices=d["idx"], has_initial_state=d["his"])
    return dict(initial_state=d["init"])


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("mode", ["pool", "dense"])
@pytest.mark.parametrize("backend", [None, "torch-ref"])
def test_one_rank_is_bitwise_the_ordinary_call(one_rank_group, family, mode, backend):
    c = Case(family, (5, 0, 30, 9), (44,), mode=mode, slots=(3, 0, -1, 1) if mode == "pool" else None,
             fresh=(1, 3) if mode == "pool" else None)
    d, e = make_inputs(c), make_inputs(c)
    x = [d[n] for n in ("q", "k", "v", "g", "beta")]
    got = context_parallel_prefill(family, *x, cu_seqlens=d["cu"], token_offset=0, backend=backend, **_args(d, mode))
    want = getattr(linattn, f"{family}_prefill")(*x, d["cu"], backend=backend, **_args(e, mode))
    for a, b in zip(*(((r,) if mode == "pool" else r) for r in (got, want))):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if mode == "pool":
        assert torch.equal(d["pool"].view(torch.uint8), e["pool"].view(torch.uint8))


def test_one_rank_refuses_a_nonzero_token_offset(one_rank_group):
    d = make_inputs(Case("gdn", (6,), (6,), mode="dense"))
    with pytest.raises(ValueError, match="token_offset=2 in a group of one rank"):
        context_parallel_prefill("gdn", *(d[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens=d["cu"],
                                 token_offset=2)


def test_an_uninitialised_process_group_is_refused_with_what_to_do():
    assert not dist.is_initialized()
    d = make_inputs(Case("gdn", (6,), (6,), mode="dense"))
    with pytest.raises(ValueError, match="init_process_group"):
        context_parallel_prefill("gdn", *(d[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens=d["cu"],
                                 token_offset=0)


# -- the plan (host only) ------------------------------------------------------------------------------

def test_plan_of_a_sequence_spanning_every_rank_chains_first_middle_and_last():
    p = make_plan([0, 3, 44, 46], [(0, 15), (15, 14), (29, 17)])
    kinds = [[(x.seq, x.kind) for x in r.pieces] for r in p.ranks]
    assert kinds == [[(0, "whole"), (1, "first")], [(1, "middle")], [(1, "last"), (2, "whole")]]
    assert [r.entry for r in p.ranks] == ["absolute", "affine", None]
    assert [r.chain for r in p.ranks] == [(), (0,), (0, 1)]
    assert [tuple(x.seq for x in r.known) for r in p.ranks] == [(0,), (), (2,)]
    assert p.exchange


def test_plan_skips_an_empty_rank_and_gives_zero_length_sequences_to_rank_0():
    p = make_plan([0, 6, 36, 36, 41], [(0, 20), (20, 0), (20, 21)])
    assert p.ranks[1].pieces == () and p.ranks[1].entry is None
    assert p.ranks[2].chain == (0,)  # the empty rank is not in the chain
    assert p.ranks[0].empty == (2,) and p.ranks[2].empty == ()


def test_plan_without_spanning_sequences_needs_no_exchange_and_padding_never_enters_it():
    assert not make_plan([0, 16, 32], [(0, 16), (16, 16)]).exchange
    p = make_plan([0, 10, 30, 40], [(0, 15), (15, 25)], padding=[False, True, False])
    assert not p.exchange and p.ranks[1].entering is None
    assert [(x.seq, x.kind, x.padding) for x in p.ranks[1].known] == [(1, "last", True), (2, "whole", False)]


@pytest.mark.parametrize("slices, words", [
    ([(0, 10), (11, 19)], "rank 1 has token_offset=11 and 19 tokens, expected token_offset=10"),
    ([(0, 10), (9, 21)], "rank 1 has token_offset=9"),
    ([(0, 10), (10, 10)], "cover 20 tokens but cu_seqlens[-1] = 30"),
    ([(1, 29)], "rank 0 has token_offset=1"),
])
def test_plan_refuses_gaps_overlaps_and_slices_that_do_not_cover_the_stream(slices, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        make_plan([0, 10, 30], slices)


def test_plan_refuses_decreasing_cu_seqlens():
    with pytest.raises(ValueError, match="never decrease"):
        make_plan([0, 10, 5], [(0, 5)])


# -- how the summary runs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("K, V, mode", [(64, 64, "wide"), (128, 128, "wide"), (256, 256, "split"), (128, 64, "split")])
def test_summary_is_split_where_the_wide_call_would_leave_the_backend(K, V, mode):
    """triton-split takes head dims 64, 128, 256: V + K = 512 is not one of them (torch-ref would take it)."""
    q, v = torch.zeros(64, 1, K), torch.zeros(64, 1, V)
    got, why = summary_mode("gdn", q, v, backend="triton-split")
    assert got == mode, why
    assert summary_mode("gdn", q, v, backend="torch-ref")[0] == "wide"


def test_a_rank_local_refusal_names_the_global_token():
    """A value refused in this rank's slice is quoted at its index in the whole stream (token_offset + i)."""
    from linattn.context_parallel import _check_local

    T, H, K = 4, 1, 8
    q, k, v, beta = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K), torch.rand(T, H)
    g = -torch.rand(T, H)
    g[1, 0] = 0.5
    args = dict(state_pool=None, state_indices=None, initial_state=None, has_initial_state=None, scale=None,
                use_qk_l2norm=True, state_layout="vk", backend=None)
    with pytest.raises(ValueError, match=r"g\[11, 0\].*\(token positions global: this rank's first token is 10\)"):
        _check_local("gdn", (q, k, v, g, beta), [0, 20], 10, args, True, False)
    with pytest.raises(ValueError, match=r"g\[1, 0\]") as e:  # rank 0: the positions are already global
        _check_local("gdn", (q, k, v, g, beta), [0, 20], 0, args, True, False)
    assert "token positions global" not in str(e.value) and e.value.__cause__ is not e.value
