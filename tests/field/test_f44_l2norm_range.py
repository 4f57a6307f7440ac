"""F44: ``use_qk_l2norm`` normalises finite q and k of any magnitude (scale before squaring).

The fault: the l2norm squared fp32 rows directly, so a finite q or k with ``|x| >= 1.8e19`` (the sum
of squares overflows) was normalised to 0, with no error. The rule (docs/ops-decisions.md, "F44";
docs/ops.md, "l2norm"): a row with ``max|x| >= 2**32`` is multiplied by the power of two bringing it
under ``2**32`` before squaring, the eps by its square (the same value exactly); every other row runs
the plain formula, bit for bit. Held on every backend: torch-ref, the example plugin cpu-chunked,
the Triton decode and the Triton chunked prefill (its stages, shared with the CuTe DSL prefill,
square or dot scaled rows where a chunk needs it; run here through the interpreter at K = 64).
"""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.backends.torch_ref import L2NORM_EPS, l2norm_ref
from linattn.testing.compare import rel_error_exact_zero as _rel

from field_cases import DEVICE, H, HV, backends_for, decode_inputs

MAGNITUDES = [1e20, 1e30, 3e37]


def test_l2norm_ref_of_huge_rows_is_the_unit_vector():
    # a seeded draw: unseeded, a draw past 3.4 in the 1e38 row (about one run in 25, by whatever the
    # worker ran before) overflowed fp32 to inf and made the expected row NaN
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, dtype=torch.float64, generator=gen).mul(torch.tensor([1e20, 1e30, 1e38, 1.0])[:, None]).float()
    assert torch.isfinite(x).all()  # huge but finite rows: what F44 is about
    want = x.double() / x.double().norm(dim=-1, keepdim=True)
    assert (l2norm_ref(x).double() - want).abs().max() < 1e-6


def test_l2norm_ref_of_ordinary_rows_is_the_plain_formula_bitwise():
    for scale in (1e-9, 1e-3, 1.0, 30.0, 1e4, 1e9):
        x = torch.randn(2000, 128) * scale
        x[0] = 0.0  # a zero row stays zero
        plain = x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)
        assert torch.equal(l2norm_ref(x), plain), scale
    assert torch.equal(l2norm_ref(torch.zeros(3, 16)), torch.zeros(3, 16))


def _prefill(lens=(6, 4), K: int = 16, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    return dict(q=torch.randn(T, H, K, generator=gen), k=torch.randn(T, H, K, generator=gen),
                v=torch.randn(T, HV, K, generator=gen), g=-torch.rand(T, HV, generator=gen),
                beta=torch.rand(T, HV, generator=gen), cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0)]))


def _scaled(a: dict, mag: float, which: str) -> dict:
    """``a`` with one sequence's q and / or k scaled by ``mag`` (l2norm makes it the same problem)."""
    b = dict(a)
    for n in which:
        b[n] = a[n].clone()
        b[n][:6] = b[n][:6] * mag
    return b


@pytest.mark.parametrize("which", ["q", "k", "qk"])
@pytest.mark.parametrize("mag", MAGNITUDES)
def test_prefill_with_huge_q_or_k_equals_the_unscaled_problem(which, mag):
    a = _prefill()
    ref_o, ref_f = linattn.gdn_prefill(**{n: x.double() if x.is_floating_point() else x for n, x in a.items()},
                                       backend="torch-ref")
    for backend in ("torch-ref", "torch-chunked", "cpu-chunked"):
        if backend not in linattn.list_backends():
            continue
        o, f = linattn.gdn_prefill(**_scaled(a, mag, which), backend=backend, check_finite=True)
        assert _rel(o, ref_o) < 1e-5 and _rel(f, ref_f) < 1e-5, backend


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("mag", [1e20, 3e37])
def test_decode_with_huge_k_equals_the_unscaled_problem_on_every_backend(family, mag):
    args, pool0 = decode_inputs(N=3, kda=family == "kda")
    op = getattr(linattn, f"{family}_decode")
    idx = torch.tensor([2, 0, 5], device=DEVICE)
    want_pool = pool0.clone().double()
    want = op(**{n: x.double() for n, x in args.items()}, state_pool=want_pool, state_indices=idx,
              backend="torch-ref")
    for backend in backends_for(f"{family}_decode"):
        pool = pool0.clone()
        big = dict(args, k=args["k"] * mag, q=args["q"] * mag)
        o = op(**big, state_pool=pool, state_indices=idx, backend=backend, check_finite=True)
        assert _rel(o, want) < 1e-5, backend
        assert _rel(pool, want_pool) < 1e-5, backend
        keep = [r for r in range(pool.shape[0]) if r not in (2, 0, 5)]
        assert torch.equal(pool[keep], pool0[keep]), backend


def _triton_device() -> str:
    """Where the Triton prefill runs here (tests/conftest.py sets TRITON_INTERPRET=1 on a CPU)."""
    pytest.importorskip("triton")
    from linattn.capabilities import interpreter_enabled

    if torch.cuda.is_available() and not interpreter_enabled():
        return "cuda"
    if not interpreter_enabled():
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    return "cpu"


def _huge_rows(a: dict, mag: float, which: str, rows: tuple) -> dict:
    """``a`` with the rows ``rows`` of q and / or k scaled by ``mag``."""
    b = dict(a)
    for n in which:
        b[n] = a[n].clone()
        for lo, hi in rows:
            b[n][lo:hi] = b[n][lo:hi] * mag
    return b


@pytest.mark.parametrize("which", ["k", "qk"])
@pytest.mark.parametrize("mag", [1e20, 3e37])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_triton_chunked_prefill_with_huge_q_or_k_equals_the_unscaled_problem(family, mag, which):
    """fp32: stage 1 (GDN's system, KDA's norms) and the output stage on scaled rows, against the
    float64 reference of the unscaled problem; huge rows in both sequences' chunks."""
    dev = _triton_device()
    a = _prefill(lens=(6, 64), K=64)
    if family == "kda":
        a["g"] = -torch.rand(70, HV, 64, generator=torch.Generator().manual_seed(1))
    op = getattr(linattn, f"{family}_prefill")
    ref_o, ref_f = op(**{n: x.double() if x.is_floating_point() else x for n, x in a.items()}, backend="torch-ref")
    big = _huge_rows(a, mag, which, ((0, 6), (30, 40)))
    o, f = op(**{n: x.to(dev) for n, x in big.items()}, backend="triton-split", check_finite=True)
    assert _rel(o, ref_o) < 1e-5 and _rel(f, ref_f) < 1e-5


def test_triton_grouped_bf16_prefill_with_huge_q_and_k_matches_the_reference():
    """bf16 GDN at GVA group 2: the output stage per key head, which rebuilds every second chunk's
    state from the chunk before (huge keys there, ordinary rows in its own chunk), against the
    float64 reference of the same (scaled) bf16 inputs within bf16's tolerances."""
    dev = _triton_device()
    a = _prefill(lens=(129,), K=64, seed=3)
    a = _huge_rows(a, 1e30, "qk", ((0, 6), (128, 129)))  # chunks 0 and 2; chunk 1 ordinary
    a.update(q=a["q"].bfloat16(), k=a["k"].bfloat16(), v=a["v"].bfloat16(), g=0.1 * a["g"])
    ref_o, ref_f = linattn.gdn_prefill(**{n: x.double() if x.is_floating_point() else x for n, x in a.items()},
                                       backend="torch-ref")
    o, f = linattn.gdn_prefill(**{n: x.to(dev) for n, x in a.items()}, backend="triton-split", check_finite=True)
    assert _rel(o, ref_o) < 2e-2 and _rel(f, ref_f) < 1e-2
