"""The segment-parallel state pass (docs/ops.md, "Segment-parallel state pass"), checked in float64
with plain torch: no Triton, no kernel.

The chunked form is written out here per chunk, in the maths layout ``S [K, V]``, for GDN and KDA
(a GDN gate is a KDA gate equal on every key channel): a chunk's update is affine in the state that
enters it, ``S1 = M_c S0 + B_c``. A sequence is cut into segments of ``L`` chunks on its own
64-token grid; each segment's summary ``(M_seg, B_seg)`` is computed twice, by the kernel's
augmented loop (the ordinary state loop on ``K + V`` columns, started from ``[I | 0]`` with ``U``
replaced by ``[0 | U]``) and by explicit products of the chunk matrices; the summaries are combined
from the sequence's initial state (``S_{j+1} = M_j S_j + B_j``) and the state loop is rerun per
segment from its entering state (pass 2) for the outputs. Everything is compared against the
token-serial float64 reference (``backends/torch_ref.py``): outputs, final states, and the state
entering every segment against the reference state after that many tokens.

The errors measured on these cases are in docs/ops.md ("Segment-parallel state pass"); the
bounds asserted here, 1e-12 and 1e-13, keep a wide margin above them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import pytest
import torch

from linattn.backends.torch_ref import G_MIN, gdn_prefill_ref, kda_prefill_ref
from linattn.testing.compare import rel_error_exact_zero as rel

C = 64  # the chunk length (ops.md, "Chunked form")
H, HV, K, V = 1, 2, 16, 8  # GVA (HV = 2H); K != V, so a transposed state or summary cannot pass
#: sequence lengths on and off the 64-token grid, zero-length and length-1 ones among long ones
LENS = [0, 1, 63, 64, 65, 200, 333, 0, 1, 130]
#: segment lengths in chunks: 3 does not divide 200's 4 chunks, 4 not 333's 6; 8 is one segment
SEGMENTS = (1, 2, 3, 4, 8)
F64 = torch.float64

BOUND = 1e-12  #: outputs, final and entering states against the token-serial reference
SUMMARY_BOUND = 1e-13  #: the augmented loop against the explicit products; segments against one


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: the products here are 64 x 16, and on a busy two-core machine a second
    OpenMP thread only waits."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# -- inputs -----------------------------------------------------------------------------------------

def _l2n(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def make_case(family: str, gates: str, seed: int, lens=LENS) -> dict:
    """float64 inputs, q and k already l2-normalised and q scaled (the reference then runs with
    ``use_qk_l2norm=False, scale=1.0``, so both sides read the same q and k), GDN ``g [T, HV]`` or
    KDA ``g [T, HV, K]``.

    ``gates``: ``slow`` about -0.016 per token (a twentieth of a gating op's usual range), so that a
    state carries over hundreds of tokens and every transition ``M_seg`` weighs in the result;
    ``floor`` those with the floor ``G_MIN = -1000`` on every 37th token and around the chunk
    boundaries 63/64 and 127/128; ``strong`` -5 .. -50 per token (per channel for KDA), about one
    in ten at the floor."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)
    gshape = (T, HV, K) if family == "kda" else (T, HV)
    g = -0.05 * torch.nn.functional.softplus(r(*gshape) - 1.0)
    if gates == "floor":
        for t in [*range(0, T, 37), 63, 64, 127, 128]:
            if t < T:
                g[t] = G_MIN
    elif gates == "strong":
        g = -5.0 - 45.0 * torch.rand(*gshape, generator=gen, dtype=F64)
        g[torch.rand(*gshape, generator=gen, dtype=F64) < 0.1] = G_MIN
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return dict(q=_l2n(r(T, H, K)) * K ** -0.5, k=_l2n(r(T, H, K)), v=r(T, HV, V), g=g,
                beta=torch.rand(T, HV, generator=gen, dtype=F64), cu=cu,
                h0=r(len(lens), HV, K, V))  # maths layout [N, HV, K, V]


def reference(family: str, case: dict, h0_kv: torch.Tensor, cu: list | None = None, take=None):
    """The token-serial float64 reference in dense mode, ``"kv"`` layout (``S [K, V]`` as here).
    ``cu`` / ``take``: run it on another packing of the same tokens (``take`` indexes them)."""
    fn = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    cu = case["cu"] if cu is None else cu
    x = {n: case[n] if take is None else case[n][take] for n in ("q", "k", "v", "g", "beta")}
    return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], torch.tensor(cu), initial_state=h0_kv, scale=1.0,
              use_qk_l2norm=False, state_layout="kv", compute_dtype=F64)


# -- the chunked form, one chunk of one (sequence, value head) -----------------------------------------

class Chunk(NamedTuple):
    """One chunk's matrices (ops.md, "Chunked form"; ``n <= 64`` rows)."""

    W: torch.Tensor  # [n, K]   Tm diag(beta) (K * exp(G))
    U: torch.Tensor  # [n, V]   Tm diag(beta) V
    Kd: torch.Tensor  # [n, K]  K * exp(G_C - G)
    eGC: torch.Tensor  # [K]    exp(G_C) (GDN: one value on every channel)
    Qg: torch.Tensor  # [n, K]  Q * exp(G)
    Aqk: torch.Tensor  # [n, n] (q_r . k_s) exp(G_r - G_s) on and below the diagonal

    @property
    def M(self) -> torch.Tensor:
        """The transition ``M_c = diag(exp(G_C)) - (K * exp(G_C - G))^T W`` (``[K, K]``)."""
        return torch.diag(self.eGC) - self.Kd.T @ self.W

    @property
    def B(self) -> torch.Tensor:
        """The zero-state contribution ``B_c = (K * exp(G_C - G))^T U`` (``[K, V]``)."""
        return self.Kd.T @ self.U


def _segsum(g: torch.Tensor) -> torch.Tensor:
    """``D[r, s] = g_{s+1} + ... + g_r`` for ``s < r`` (0 elsewhere), ``[n, n, K]`` from ``g [n, K]``:
    every decay exponent summed from the gates between the two rows, never as the difference of two
    large cumulative sums (ops.md's numerical rule), so exp(D) is exact to rounding at any gate."""
    n = g.shape[0]
    i = torch.arange(n)
    x = torch.where((i[:, None] > i[None, :])[:, :, None], g[:, None, :].expand(n, n, g.shape[1]), 0.0)
    return x.cumsum(0)  # D[r, s] = sum over i <= r of x[i, s] = sum_{s < i <= r} g_i


def chunk_matrices(q, k, v, g, beta) -> Chunk:
    """``q, k [n, K]`` (normalised, q scaled), ``v [n, V]``, ``g [n, K]`` (GDN: broadcast), ``beta [n]``."""
    n = q.shape[0]
    D = _segsum(g)
    G = g.cumsum(0)  # G_r, chunk-local: a floor gate makes exp(G_r) 0 whatever its rounding
    eD = torch.exp(D)  # exp(G_r - G_s) for s <= r (1 on the diagonal)
    strict = torch.tril(torch.ones(n, n, dtype=F64), -1)
    A = beta[:, None] * torch.einsum("rd,sd,rsd->rs", k, k, eD) * strict
    Tm = torch.linalg.solve_triangular(torch.eye(n, dtype=F64) + A, torch.eye(n, dtype=F64), upper=False,
                                       unitriangular=True)
    return Chunk(W=Tm @ (beta[:, None] * k * torch.exp(G)), U=Tm @ (beta[:, None] * v),
                 Kd=k * torch.exp(D[n - 1]),  # D[n-1, r] = G_C - G_r, exactly 0 on the last row
                 eGC=torch.exp(G[n - 1]), Qg=q * torch.exp(G),
                 Aqk=torch.einsum("rd,sd,rsd->rs", q, k, eD) * torch.tril(torch.ones(n, n, dtype=F64)))


def chunk_step(c: Chunk, S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ordinary state loop's step: ``(O [n, V], S1 [K, V])`` from ``S0 = S``."""
    Vn = c.U - c.W @ S
    return c.Qg @ S + c.Aqk @ Vn, c.eGC[:, None] * S + c.Kd.T @ Vn


def summary_augmented(chunks: list[Chunk]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 1 as the kernel runs it: the state loop on ``K + V`` columns from ``[I | 0]`` with ``U``
    replaced by ``[0 | U]``; the columns end as ``[M_seg | B_seg]``."""
    X = torch.cat([torch.eye(K, dtype=F64), torch.zeros(K, V, dtype=F64)], 1)
    for c in chunks:
        Vn = torch.cat([torch.zeros(c.U.shape[0], K, dtype=F64), c.U], 1) - c.W @ X
        X = c.eGC[:, None] * X + c.Kd.T @ Vn
    return X[:, :K], X[:, K:]


def summary_products(chunks: list[Chunk]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same summary by explicit products: ``M_seg = M_last ... M_first`` and
    ``B_seg = sum_j (M_last ... M_{j+1}) B_j``."""
    prod = lambda ms, x: functools.reduce(lambda acc, m: m @ acc, ms, x)
    Ms = [c.M for c in chunks]
    return prod(Ms, torch.eye(K, dtype=F64)), sum(prod(Ms[j + 1:], c.B) for j, c in enumerate(chunks))


def sequence_chunks(case: dict, n: int, hv: int) -> list[Chunk]:
    """The chunks of sequence ``n``, value head ``hv``, on the sequence's own 64-token grid."""
    a, b = case["cu"][n], case["cu"][n + 1]
    h = hv // (HV // H)
    g = case["g"][a:b, hv]
    g = g if g.dim() == 2 else g[:, None].expand(b - a, K)  # GDN: one gate on every key channel
    return [chunk_matrices(case["q"][t:min(t + C, b), h], case["k"][t:min(t + C, b), h], case["v"][t:min(t + C, b), hv],
                           g[t - a:min(t + C, b) - a], case["beta"][t:min(t + C, b), hv]) for t in range(a, b, C)]


class Segmented(NamedTuple):
    o: torch.Tensor  # [T, HV, V]
    final: torch.Tensor  # [N, HV, K, V]
    entering: dict  # (n, hv) -> the states entering the segments, then the final state
    summaries_gap: float  # max relative gap, augmented loop against explicit products


def segmented_prefill(case: dict, h0: torch.Tensor, L: int, summary=summary_augmented) -> Segmented:
    """The segment-parallel pass over every (sequence, value head): pass 1 (summaries), the combine
    from ``h0 [N, HV, K, V]``, pass 2 (the state loop per segment from its entering state)."""
    cu, N = case["cu"], len(case["cu"]) - 1
    o = torch.zeros(cu[-1], HV, V, dtype=F64)
    final = torch.empty(N, HV, K, V, dtype=F64)
    entering, gap = {}, 0.0
    for n in range(N):
        for hv in range(HV):
            chunks = sequence_chunks(case, n, hv)
            segments = [chunks[i:i + L] for i in range(0, len(chunks), L)]  # none for an empty sequence
            sums = [summary(s) for s in segments]
            for s, (M, B) in zip(segments, sums):
                Mp, Bp = summary_products(s)
                gap = max(gap, rel(M, Mp), rel(B, Bp) if Bp.norm() > 0 else 0.0)
            states = [h0[n, hv]]
            for M, B in sums:  # the short sequential combine
                states.append(M @ states[-1] + B)
            rows = []
            for s, S in zip(segments, states):  # pass 2
                for c in s:
                    On, S = chunk_step(c, S)
                    rows.append(On)
            if rows:
                o[cu[n]:cu[n + 1], hv] = torch.cat(rows)
            final[n, hv] = states[-1]
            entering[n, hv] = states
    return Segmented(o, final, entering, gap)


def boundary_states(family: str, case: dict, h0: torch.Tensor, L: int) -> dict:
    """The reference state of every (sequence, value head) after each segment boundary's prefix
    (``j * L * 64`` tokens, ``j >= 1``), from one packed reference call over all the prefixes."""
    cu, N = case["cu"], len(case["cu"]) - 1
    idx, pcu, owners = [], [0], []
    for n in range(N):
        for end in range(cu[n] + L * C, cu[n + 1], L * C):  # the last segment's end is the final state
            idx.append(torch.arange(cu[n], end))
            pcu.append(pcu[-1] + end - cu[n])
            owners.append(n)
    if not owners:
        return {}
    _, states = reference(family, case, h0[owners], cu=pcu, take=torch.cat(idx))
    out = {}
    for j, n in enumerate(owners):
        out.setdefault(n, []).append(states[j])
    return out


# -- the tests ---------------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _per_sequence(o, ref_o, final, ref_final, cu, bound):
    worst = 0.0
    for n in range(len(cu) - 1):
        if cu[n + 1] > cu[n]:
            worst = max(worst, rel(o[cu[n]:cu[n + 1]], ref_o[cu[n]:cu[n + 1]]), rel(final[n], ref_final[n]))
    assert worst < bound, worst
    return worst


@pytest.mark.parametrize("L", SEGMENTS, ids=[f"L{L}" for L in SEGMENTS])
@pytest.mark.parametrize("gates", ["slow", "floor", "strong"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_segments_combined_from_the_initial_state_match_the_token_serial_reference(family, gates, L):
    """Outputs and final states per sequence, the state entering every segment against the
    reference state after that prefix, the augmented summary against explicit products, and the
    segmented pass against one segment, all in float64; empty sequences keep their state exactly."""
    case = make_case(family, gates, seed=len(family) * 10 + L + len(gates))
    h0 = case["h0"]
    seg = segmented_prefill(case, h0, L)
    ref_o, ref_final = reference(family, case, h0.clone())
    _per_sequence(seg.o, ref_o, seg.final, ref_final, case["cu"], BOUND)
    for n, states in boundary_states(family, case, h0, L).items():
        for hv in range(HV):
            for j, S in enumerate(states, start=1):
                assert rel(seg.entering[n, hv][j], S[hv]) < BOUND, (n, hv, j)
    assert seg.summaries_gap < SUMMARY_BOUND
    one = segmented_prefill(case, h0, L=10 ** 6)  # one segment per sequence: the ordinary loop
    assert rel(seg.o, one.o) < SUMMARY_BOUND and rel(seg.final, one.final) < SUMMARY_BOUND
    for n, length in enumerate(LENS):  # ceil(chunks / L) segments: none for an empty sequence
        assert len(seg.entering[n, 0]) == 1 + _cdiv(_cdiv(length, C), L)
        if length == 0:
            assert torch.equal(seg.final[n], h0[n])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_zero_initial_state_is_the_combine_started_from_zero(family):
    """``has_initial_state`` False (or dense mode without an initial state): the combine starts
    from ``S_0 = 0``, so the first segment's entering state is 0 and its final state is ``B_seg``."""
    case = make_case(family, "slow", seed=5)
    zero = torch.zeros_like(case["h0"])
    seg = segmented_prefill(case, zero, L=2)
    ref_o, ref_final = reference(family, case, None)
    _per_sequence(seg.o, ref_o, seg.final, ref_final, case["cu"], BOUND)
    n = LENS.index(65)  # two chunks: one segment of L = 2
    M, B = summary_augmented(sequence_chunks(case, n, 1))
    assert rel(B, ref_final[n, 1]) < BOUND  # B_seg: the state the segment alone makes from zero
    with_h0 = reference(family, case, case["h0"].clone())[1][n, 1]
    assert rel(B, with_h0) > 1e-2 and rel(M @ case["h0"][n, 1] + B, with_h0) < BOUND  # M_seg weighs in


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_pool_layout_vk_holds_the_transposed_state(family):
    """A "vk" pool row is ``S^T`` (``[V, K]``): the combine reads it transposed,
    ``S_1^T = S_0^T M^T + B^T``; read untransposed (or with ``M`` applied on the wrong side) the
    result is another state. Against the reference in pool mode, "vk" layout."""
    case = make_case(family, "slow", seed=9, lens=[200, 70])
    pool = torch.randn(3, HV, V, K, dtype=F64)
    slots = torch.tensor([2, 0])
    ref_pool = pool.clone()
    fn = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    ro, _ = fn(case["q"], case["k"], case["v"], case["g"], case["beta"], torch.tensor(case["cu"]), ref_pool, slots,
               scale=1.0, use_qk_l2norm=False, compute_dtype=F64)
    seg = segmented_prefill(case, pool[slots].transpose(-1, -2), L=1)
    assert rel(seg.o, ro) < BOUND and rel(seg.final.transpose(-1, -2), ref_pool[slots]) < BOUND
    assert torch.equal(ref_pool[1], pool[1])
    for n in range(2):  # the stored layout's own form of the combine gives the same rows
        S_t = S_w = pool[slots[n], 0]
        for c in sequence_chunks(case, n, 0):
            M, B = summary_augmented([c])
            S_t = S_t @ M.T + B.T
            S_w = S_w @ M + B.T  # M untransposed on a "vk" row: shapes fit, the state is another
        assert rel(S_t, ref_pool[slots[n], 0]) < BOUND
        assert rel(S_w, ref_pool[slots[n], 0]) > 1e-3
