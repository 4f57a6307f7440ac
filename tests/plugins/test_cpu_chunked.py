"""The example out-of-tree backend's maths (``examples/linattn-cpu-chunked``): the chunked form
against the float64 token-serial reference, in every regime its code distinguishes."""

import sys
from pathlib import Path

import pytest
import torch

from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "prefill"))
from chunked_inputs import chunked_inputs as _inputs, rel as _rel  # noqa: E402

chunked = pytest.importorskip(
    "linattn_cpu_chunked.chunked",
    reason="the example plugin is not installed: pip install -e examples/linattn-cpu-chunked (CI does)")


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("gates", ["moderate", "strong", "floor", "mixed"])
def test_chunked_form_matches_the_float64_recurrence(kda, gates):
    lens = (0, 1, 63, 64, 0, 65, 200)  # empty, one token, a chunk minus/plus one, several chunks
    q, k, v, g, beta, cu = _inputs(kda, lens, gates)
    h0 = torch.randn(len(lens), 4, 16, 32) * 3
    o, ht = chunked.chunked_prefill(q, k, v, g, beta, cu, initial_state=h0)
    ref = kda_prefill_ref if kda else gdn_prefill_ref
    ro, rht = ref(q, k, v, g, beta, cu, initial_state=h0.double(), compute_dtype=torch.float64)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert _rel(o, ro) < 1e-5 and _rel(ht, rht) < 1e-5
    assert torch.equal(ht[0], h0[0]) and torch.equal(ht[4], h0[4])  # empty sequences keep their state


@pytest.mark.parametrize("gates", ["moderate", "mixed", "strong"])
def test_kda_gram_paths_agree(monkeypatch, gates):
    """Factorised chunks, split blocks and pairwise sums give the same result."""
    q, k, v, g, beta, cu = _inputs(True, (150,), gates)
    o1, h1 = chunked.chunked_prefill(q, k, v, g, beta, cu)
    monkeypatch.setattr(chunked, "SAFE_HALF", -1.0)  # every block is "steep": split down to pairwise 4 x 4
    o2, h2 = chunked.chunked_prefill(q, k, v, g, beta, cu)
    monkeypatch.setattr(chunked, "GRAM_BLOCKS", ())  # ... or one 64 x 64 block summed pairwise
    o3, h3 = chunked.chunked_prefill(q, k, v, g, beta, cu)
    for o, h in ((o2, h2), (o3, h3)):
        assert _rel(o1, o) < 1e-6 and _rel(h1, h) < 1e-6


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_pool_and_dense_mode_are_bitwise_identical(layout):
    lens = (70, 0, 5, 129)
    q, k, v, g, beta, cu = _inputs(True, lens, "moderate", K=32, V=16)
    shape = (4, 16, 32) if layout == "vk" else (4, 32, 16)
    h0 = torch.randn(len(lens), *shape)
    pool = torch.randn(7, *shape)
    slots = torch.tensor([5, 0, 3, 1])
    pool[slots] = h0
    before = pool.clone()
    o_pool, none = chunked.chunked_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=slots,
                                           state_layout=layout)
    o_dense, ht = chunked.chunked_prefill(q, k, v, g, beta, cu, initial_state=h0, state_layout=layout)
    assert none is None and torch.equal(o_pool, o_dense)
    assert torch.equal(pool[slots], ht)
    untouched = [i for i in range(7) if i not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_padding_sequence_gives_zero_output_and_touches_no_slot():
    q, k, v, g, beta, cu = _inputs(False, (10, 80, 3), "moderate")
    pool = torch.randn(4, 4, 16, 32)
    before = pool.clone()
    o, _ = chunked.chunked_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=torch.tensor([2, -1, 0]))
    assert torch.equal(o[10:90], torch.zeros_like(o[10:90]))
    assert torch.equal(pool[[1, 3]], before[[1, 3]])
    assert not torch.equal(pool[[0, 2]], before[[0, 2]])


def test_bf16_inputs_and_bf16_pool_stay_within_tolerance():
    q, k, v, g, beta, cu = _inputs(False, (130, 7), "moderate", dtype=torch.bfloat16)
    pool = (torch.randn(3, 4, 16, 32)).to(torch.bfloat16)
    before = pool.clone()
    ref_pool = pool.double()
    o, _ = chunked.chunked_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=torch.tensor([1, 2]))
    ro, _ = gdn_prefill_ref(q.double(), k.double(), v.double(), g, beta, cu, state_pool=ref_pool,
                            state_indices=torch.tensor([1, 2]), compute_dtype=torch.float64)
    assert o.dtype == torch.bfloat16 and pool.dtype == torch.bfloat16
    assert _rel(o, ro) < 2e-2 and _rel(pool[1:], ref_pool[1:]) < 1e-2
    assert torch.equal(pool[0], before[0])  # not named by the call


def test_unit_lower_inverse_inverts_i_plus_a():
    A = (torch.randn(3, 64, 64, dtype=torch.float64) * 0.2).tril(-1)
    X = chunked._unit_lower_inverse(A)
    assert torch.allclose(X @ (torch.eye(64, dtype=torch.float64) + A), torch.eye(64, dtype=torch.float64), atol=1e-10)


# -- F28: the cumulative gates as two floats ---------------------------------------------------------

def test_two_float_cumulative_gates_keep_differences_after_a_floor_gate_exact():
    """F28's gates (-0.05, one token in 50 at the floor -1000): within a chunk, the two-float sum's
    differences ``(G_r - G_s) + (Gl_r - Gl_s)`` stay within 1e-7 nats of float64 where a plain
    fp32 prefix sum is more than 1e-5 off (fp32's spacing at -1000 is 6e-5)."""
    g = torch.full((5, 64), -0.05)
    g.view(-1)[10::50] = -1000.0  # the rows of five 64-token chunks
    G, Gl = chunked.cumsum2(g)
    exact = g.double().cumsum(1)
    plain = g.cumsum(1).double()

    def worst(x):
        d = x[:, :, None] - x[:, None, :]
        de = exact[:, :, None] - exact[:, None, :]
        return float((d - de).abs().max())

    assert worst(G.double() + Gl.double()) < 1e-7 < 1e-5 < worst(plain)
    assert torch.equal(G + Gl, G)  # Gl is below G's rounding: G alone is the fp32 sum


# -- one sequence's result does not depend on the other sequences ------------------------------------

LENS = (70, 0, 5, 129, 64, 1, 200, 3)  # tail chunks, an empty sequence, exact chunks, one token
SLOTS = (5, 0, -1, 1, 3, 7, 8, 2)  # sequence 2 is padding; rows 4, 6, 9 are named by nobody
POOL_ROWS = 10
VICTIM = 3  # the sequence that gets the NaN: three chunks, batched beside the others in each step


@pytest.mark.parametrize("groups", ["one", "many"], ids=["one-batch", "batch-split"])
@pytest.mark.parametrize("gates", ["moderate", "mixed", "f28"])
@pytest.mark.parametrize("name", ["q", "beta"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_a_nan_in_one_sequence_leaves_every_other_sequence_bitwise_unchanged(monkeypatch, kda, name, gates,
                                                                                groups):
    """A NaN in one sequence's q (and, separately, beta), at its first token, in its middle and in
    its last (tail) chunk: every other sequence's output rows and pool row are bitwise as in the
    run without it, the padding sequence's rows are zero, rows nobody names are bitwise untouched.
    ``mixed`` and ``f28`` gates send KDA's chunks down the split / pairwise Gram paths beside
    factorised ones; ``batch-split`` cuts each chunk step into several batches (MAX_CHUNK_HEADS)."""
    if groups == "many":
        monkeypatch.setattr(chunked, "MAX_CHUNK_HEADS", 8)  # HV = 4: two sequences per batch
    lens = LENS
    if gates == "f28":
        q, k, v, g, beta, cu = _inputs(kda, lens, "moderate", seed=3)
        g.fill_(-0.05)
        g[10::50] = -1000.0
    else:
        q, k, v, g, beta, cu = _inputs(kda, lens, gates, seed=3)
    slots = torch.tensor(SLOTS)
    pool0 = torch.randn(POOL_ROWS, 4, 16, 32)
    owned = [s for s in SLOTS if s >= 0]
    cu = cu.tolist()

    def run(inputs):
        pool = pool0.clone()
        o, none = chunked.chunked_prefill(*inputs, state_pool=pool, state_indices=slots)
        assert none is None
        untouched = [i for i in range(POOL_ROWS) if i not in owned]
        assert torch.equal(pool[untouched], pool0[untouched]), "pool rows nobody names changed"
        pad = slice(cu[2], cu[3])
        assert torch.equal(o[pad], torch.zeros_like(o[pad])), "the padding sequence's output is not zero"
        return o, pool

    o, pool = run((q, k, v, g, beta, torch.tensor(cu)))
    a, b = cu[VICTIM], cu[VICTIM + 1]
    for t in (a, a + 70, b - 1):  # chunk 0, chunk 1, the tail chunk
        x = {"q": q.clone(), "beta": beta.clone()}
        x[name][t] = float("nan")
        o_bad, pool_bad = run((x["q"], k, v, g, x["beta"], torch.tensor(cu)))
        # the NaN did arrive: in its own output row (q), in its own state (beta)
        assert torch.isnan(o_bad[t]).all() if name == "q" else torch.isnan(pool_bad[SLOTS[VICTIM]]).all()
        for n in range(len(lens)):
            if n == VICTIM:
                continue
            rows = slice(cu[n], cu[n + 1])
            assert torch.equal(o_bad[rows], o[rows]), f"NaN in sequence {VICTIM}'s {name} reached sequence {n}"
            if SLOTS[n] >= 0:
                assert torch.equal(pool_bad[SLOTS[n]], pool[SLOTS[n]]), f"... sequence {n}'s pool row"


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_a_sequence_gives_the_same_result_alone_and_beside_others(kda):
    """Batched beside sequences of other lengths (so its tail chunk is padded in a batch where
    others have real rows, and the others' tail chunks sit beside its full ones), each sequence's
    output and final state are those of a call with that sequence alone."""
    lens = (70, 5, 129, 64, 1, 200, 3, 130)
    q, k, v, g, beta, cu = _inputs(kda, lens, "mixed", seed=5)
    h0 = torch.randn(len(lens), 4, 16, 32)
    o, ht = chunked.chunked_prefill(q, k, v, g, beta, cu, initial_state=h0)
    cu = cu.tolist()
    for n in range(len(lens)):
        a, b = cu[n], cu[n + 1]
        o1, h1 = chunked.chunked_prefill(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], torch.tensor([0, b - a]),
                                         initial_state=h0[n:n + 1])
        assert _rel(o[a:b], o1) < 1e-6 and _rel(ht[n], h1[0]) < 1e-6, n
