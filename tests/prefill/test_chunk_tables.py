"""The one-launch Triton chunk tables (``kernels/triton/chunk_tables.py``) equal the torch version
(:func:`linattn.kernels.triton.prefill.chunk_tables`) bit for bit, same dtypes and shapes, on any
``cu_seqlens``: zero lengths anywhere, N = 0 and 1, N in the thousands, one long sequence, int32
and int64, and at the kernel's block boundaries (sequences per scanned block, chunks per
program), with the production tiles and with small ones (many programs, blocks and skipped
blocks at small inputs). CPU: the Triton interpreter (the suite's conftest sets
``TRITON_INTERPRET=1``); GPU: the same tests compiled.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import linattn.kernels.triton.chunk_tables as ct  # noqa: E402
from linattn.kernels.triton.chunk_tables import chunk_tables_triton  # noqa: E402
from linattn.kernels.triton.prefill import chunk_tables  # noqa: E402

pytestmark = pytest.mark.interpreter

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: small tiles (chunks per program, sequences per scanned block, block boundaries tested for the
#: skip, sequences per step of the skipped sum): many programs and blocks, the skip and its cap at
#: interpreter-sized inputs
SMALL_TILES = dict(BC=16, BNO=16, NSKIP=2, BSUM=32, NUM_WARPS=4)


def _tiles(which: str):
    """The kernel's production tiles (``"default"``), or :data:`SMALL_TILES` patched in."""
    return mock.patch.multiple(ct, **SMALL_TILES) if which == "small" else nullcontext()


def _cu(lens, dtype=torch.int64) -> torch.Tensor:
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    if lens:
        cu[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    return cu.to(dtype).to(DEV)


def _assert_same(cu: torch.Tensor, T: int | None = None):
    """Both versions' tables, bitwise equal with equal dtypes and shapes; returns the Triton ones."""
    T = int(cu[-1]) if T is None else T
    want = chunk_tables(cu, T)
    empty = torch.empty
    # the outputs start poisoned, so an entry the kernel fails to write cannot pass for a right one
    with mock.patch.object(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(-7)):
        got = chunk_tables_triton(cu, T)
    assert got[3] == want[3] == T // 64 + cu.numel() - 1
    for name, w, g in zip(("chunk_off", "chunk_seq", "chunk_start"), want[:3], got[:3]):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, name
        assert torch.equal(g, w), f"{name} differs at {(g != w).nonzero().flatten()[:10].tolist()}"
    return got


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lens", [
    [], [0], [1], [64], [65], [0, 0, 0], [0, 5], [5, 0], [0, 1, 64, 65, 0, 130], [1, 0, 70, 130, 0],
    [0] * 33, [63, 0, 0, 1, 0, 128, 0],
], ids=repr)
def test_matches_torch_tables_bitwise_on_edge_lengths(lens, dtype):
    _assert_same(_cu(lens, dtype))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.one_of(st.just(0), st.integers(0, 300)), min_size=1, max_size=40),
       int32=st.booleans(), small=st.booleans())
def test_matches_torch_tables_bitwise_on_random_lengths(lens, int32, small):
    with _tiles("small" if small else "default"):  # small: many programs and blocks, the skip
        _assert_same(_cu(lens, torch.int32 if int32 else torch.int64))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_torch_tables_when_programs_skip_many_leading_blocks(seed):
    """Small tiles with room to skip up to 16 blocks of 16 sequences: most programs skip some."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 201, (300,), generator=gen)
    lens[torch.randperm(300, generator=gen)[:60]] = 0
    with mock.patch.multiple(ct, **dict(SMALL_TILES, NSKIP=16)):
        _assert_same(_cu(lens.tolist()))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_matches_torch_tables_bitwise_for_thousands_of_sequences(dtype):
    gen = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 41, (3000,), generator=gen)
    lens[torch.randperm(3000, generator=gen)[:600]] = 0
    lens[-5:] = 0  # zero-length sequences at the end too
    _assert_same(_cu(lens.tolist(), dtype))


def test_matches_torch_tables_for_one_long_sequence_and_all_zero_lengths():
    _assert_same(_cu([5000]))
    _assert_same(_cu([0, 7000, 0], torch.int32))
    _assert_same(_cu([0] * 1500))  # NT_max = N: every chunk past the (zero) real count


def test_matches_torch_tables_for_no_sequences():
    off, seq, start, nt = _assert_same(_cu([]))
    assert off.tolist() == [0] and nt == 0 and seq.numel() == 0 and start.numel() == 0


@pytest.mark.parametrize("n_over", [-1, 0, 1], ids=["minus1", "exact", "plus1"])
@pytest.mark.parametrize("tiles", ["default", "small"])
def test_matches_torch_tables_at_the_sequence_block_boundary(tiles, n_over):
    """N at the sequences per scanned block (BNO) and one either side: the carry between blocks."""
    with _tiles(tiles):
        N = ct.BNO + n_over
        lens = [(7 * i) % 97 for i in range(N)]  # 0..96 tokens: zero, one and two chunks
        _assert_same(_cu(lens))
        _assert_same(_cu([0] * N))


@pytest.mark.parametrize("nt_over", [-1, 0, 1], ids=["minus1", "exact", "plus1"])
@pytest.mark.parametrize("tiles", ["default", "small"])
def test_matches_torch_tables_at_the_chunks_per_program_boundary(tiles, nt_over):
    """NT_max = T // 64 + N at BC - 1, BC and BC + 1: a second program with 0, 0 and 1 chunks."""
    with _tiles(tiles):
        nt = ct.BC + nt_over
        _assert_same(_cu([64 * (nt - 2) + 10, 3]))  # N = 2, T // 64 = nt - 2
        _assert_same(_cu([0, 64 * (nt - 3) + 63, 0]))  # N = 3, zero lengths either side
        _assert_same(_cu([1] * nt))  # N = nt, T // 64 = 0: one chunk per sequence


@pytest.mark.parametrize("tiles", ["default", "small"])
def test_matches_torch_tables_when_T_understates_the_tokens(tiles):
    """T below cu_seqlens[-1] (a caller's error): NT_max is smaller than the real chunk count, so
    sequences end past every program's chunks; chunk_off is still written in full (the last
    program scans on) and the rest agrees with the torch version."""
    with _tiles(tiles):
        _assert_same(_cu([128] * 40 + [0, 5]), T=0)
        _assert_same(_cu([3000] * 4), T=64)


def test_chunks_never_cross_a_sequence_and_cover_every_token_once():
    gen = torch.Generator().manual_seed(9)
    lens = torch.randint(0, 301, (40,), generator=gen)
    lens[::7] = 0
    cu = _cu(lens.tolist())
    N, T = len(lens), int(cu[-1])
    off, seq, start, nt = chunk_tables_triton(cu, T)
    real = int(off[-1])
    assert real <= nt
    cu, seq, start = cu.cpu(), seq.cpu().long(), start.cpu()
    covered = torch.zeros(T, dtype=torch.int64)
    for c in range(real):
        n = int(seq[c])
        assert int(off[n]) <= c < int(off[n + 1])
        s, e = int(start[c]), min(int(start[c]) + 64, int(cu[n + 1]))
        assert int(cu[n]) <= s < e <= int(cu[n + 1]), f"chunk {c} leaves sequence {n}"
        assert (s - int(cu[n])) % 64 == 0
        covered[s:e] += 1
    assert bool((covered == 1).all()), "every token lies in exactly one chunk"
    assert bool((seq[real:] == N).all())


def test_rejects_a_cu_seqlens_that_is_not_a_1d_integer_tensor():
    with pytest.raises(ValueError, match="int32/int64"):
        chunk_tables_triton(torch.zeros(3, device=DEV), 0)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        chunk_tables_triton(torch.zeros(2, 2, dtype=torch.int64, device=DEV), 0)


# -- the segment-parallel state pass's tables ------------------------------------------------------

def _segment_plan(lens, L):
    from linattn.kernels.triton.prefill import plan_prefill

    T = sum(lens)
    q = torch.empty(T, 1, 64, device=DEV)
    return plan_prefill("gdn", q=q, v=torch.empty(T, 1, 64, device=DEV), cu_seqlens=_cu(lens),
                        segment_chunks=L)


@pytest.mark.parametrize("small", [False, True], ids=["tiles", "small-tiles"])
@pytest.mark.parametrize("lens,L", [
    ([1], 1), ([64], 1), ([65], 1), ([0, 200, 0, 1, 333], 2), ([700, 3], 3), ([5000], 16),
    ([0, 1, 64, 65, 0, 130] * 7, 1), ([129] * 40, 2),
])
def test_segment_tables_kernel_matches_torch_bitwise(lens, L, small):
    from linattn.kernels.triton import prefill as pm

    plan = _segment_plan(lens, L)
    cu = _cu(lens)
    off = chunk_tables(cu, plan.T)[0]
    slots = torch.randperm(len(lens) + 3)[:len(lens)].to(DEV) - 1  # one may be -1 (padding)
    want = pm.segment_tables_torch(plan, cu, off, slots)
    empty = torch.empty
    tiles = mock.patch.multiple(ct, SEG_BN=4, SEG_BS=8) if small else nullcontext()
    with tiles, mock.patch.object(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(-7)):
        got = pm.segment_tables(plan, cu, off, slots)
    for name, w, g in zip(want._fields, want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name}: {g.tolist()} != {w.tolist()}"
    n_real = int(want.seg_first[-1])
    assert n_real == sum(math.ceil(math.ceil(n / 64) / L) for n in lens)
