"""GPU tests of decode from precomputed gates and ``has_initial_state`` (issue 16, items 2 and 3),
compiled Triton (``triton-split``, ``triton-folded``) and cutedsl on the H200.

- Gate form equals the raw-gate decode fed ``gdn_gating`` / ``kda_gating``'s outputs within fp32
  rounding (the kernel's fused gating is its own expression), at Qwen3-Next / Kimi-Linear head
  shapes, with padding, a per-token table with ``num_accepted_tokens`` and intermediate states.
- ``has_initial_state=False`` on NaN-filled slots equals zeroed slots bitwise (decode and pool-mode
  prefill, GDN and KDA, bf16; cutedsl for prefill), unowned rows bitwise unchanged.
- The launch count is unchanged by ``has_initial_state`` (torch profiler: the same CUDA kernels,
  no extra zeroing or copy launch): the mask is a masked load inside the existing kernels.
"""

from __future__ import annotations

import pytest
import torch

import linattn
from cuda_launches import cuda_kernels

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
NAN = float("nan")
BF = torch.bfloat16


def _decode_inputs(family, N, T, H, HV, K, V, P, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    kda = family == "kda"
    d = dict(q=r(N, T, H, K).to(BF), k=r(N, T, H, K).to(BF), v=r(N, T, HV, V).to(BF),
             a=r(*((N, T, HV, K) if kda else (N, T, HV))).to(BF), b=r(N, T, HV).to(BF),
             A_log=r(HV) * 0.5, dt_bias=r(*((HV, K) if kda else (HV,))) * 0.5)
    return d, r(P, HV, V, K)


def _decode(family, d, pool, idx, backend, **kw):
    fn = linattn.kda_decode if family == "kda" else linattn.gdn_decode
    return fn(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], pool, idx, backend=backend, **kw)


def _gate_decode(family, d, pool, idx, backend, g, beta, **kw):
    fn = linattn.kda_decode if family == "kda" else linattn.gdn_decode
    return fn(d["q"], d["k"], d["v"], None, None, None, None, pool, idx, g=g, beta=beta, backend=backend, **kw)


SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}


@pytest.mark.parametrize("N", [1, 64])
@pytest.mark.parametrize("backend", ["triton-split", "triton-folded"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_gate_form_decode_matches_raw_gates_compiled(family, backend, N):
    s = SHAPES[family]
    P = 2 * N + 3
    d, pool = _decode_inputs(family, N, 1, P=P, seed=N, **s)
    idx = torch.randperm(P, device=DEV)[:N].to(torch.int32)
    idx[0] = -1
    gate = linattn.kda_gating if family == "kda" else linattn.gdn_gating
    g, beta = gate(d["A_log"], d["a"], d["b"], d["dt_bias"])
    p1, p2 = pool.clone(), pool.clone()
    o1 = _decode(family, d, p1, idx, backend)
    o2 = _gate_decode(family, d, p2, idx, backend, g, beta)
    assert linattn.last_decision().chosen == backend
    torch.testing.assert_close(o2.float(), o1.float(), atol=1e-2, rtol=1e-2)  # bf16 outputs
    torch.testing.assert_close(p2, p1, atol=1e-5, rtol=1e-5)  # fp32 pool: fp32 rounding of the gates
    owned = set(idx[idx >= 0].tolist())
    for p in (p1, p2):
        rest = [i for i in range(P) if i not in owned]
        assert torch.equal(p[rest], pool[rest])
    assert o2[0].eq(0).all()


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_gate_form_speculative_verify_compiled(family):
    s = SHAPES[family]
    N, T, P = 4, 3, 16
    d, pool = _decode_inputs(family, N, T, P=P, seed=7, **s)
    idx = torch.tensor([[1, 2, 4], [-1, -1, -1], [5, 6, 8], [0, -1, 3]], device=DEV)
    nat = torch.tensor([2, 1, 0, 3], device=DEV, dtype=torch.int32)
    inter0 = torch.randn(6, T, s["HV"], s["V"], s["K"], device=DEV)
    ii = torch.tensor([4, 0, -1, 2], device=DEV, dtype=torch.int32)
    gate = linattn.kda_gating if family == "kda" else linattn.gdn_gating
    g, beta = gate(d["A_log"], d["a"], d["b"], d["dt_bias"])
    out = []
    for form in ("raw", "gate"):
        p, i = pool.clone(), inter0.clone()
        kw = dict(num_accepted_tokens=nat, intermediate_states=i, intermediate_state_indices=ii)
        o = (_decode(family, d, p, idx, "triton-split", **kw) if form == "raw"
             else _gate_decode(family, d, p, idx, "triton-split", g, beta, **kw))
        out.append((o, p, i))
    (o1, p1, i1), (o2, p2, i2) = out
    torch.testing.assert_close(o2.float(), o1.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(p2, p1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(i2, i1, atol=1e-5, rtol=1e-5)
    owned = {1, 2, 4, 5, 6, 8, 0, 3}
    rest = [x for x in range(P) if x not in owned]
    assert torch.equal(p2[rest], pool[rest])
    assert torch.equal(i2[[1, 3, 5]], inter0[[1, 3, 5]])


@pytest.mark.parametrize("backend", ["triton-split", "triton-folded"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_has_initial_state_on_nan_slots_equals_zeroed_slots_bitwise(family, backend):
    s = SHAPES[family]
    N, P = 8, 20
    d, pool = _decode_inputs(family, N, 1, P=P, seed=3, **s)
    idx = torch.tensor([3, -1, 7, 0, 11, 12, 19, 5], device=DEV, dtype=torch.int32)
    his = torch.tensor([False, False, True, False, True, False, True, True], device=DEV)
    fresh = [3, 0, 12]
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[fresh] = NAN
    zero_pool[fresh] = 0.0
    o1 = _decode(family, d, nan_pool, idx, backend, has_initial_state=his)
    o2 = _decode(family, d, zero_pool, idx, backend)
    assert torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool)
    owned = set(idx[idx >= 0].tolist())
    rest = [i for i in range(P) if i not in owned]
    assert torch.equal(nan_pool[rest], pool[rest])


def _prefill_inputs(family, lens, H, HV, K, V, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    Tt = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    gshape = (Tt, HV, K) if family == "kda" else (Tt, HV)
    return dict(q=r(Tt, H, K).to(BF), k=r(Tt, H, K).to(BF), v=r(Tt, HV, V).to(BF),
                g=-torch.nn.functional.softplus(r(*gshape) - 1.0) * 0.1,
                beta=torch.rand(Tt, HV, generator=gen, device=DEV), cu_seqlens=cu)


def _prefill(family, inp, pool, idx, backend, **kw):
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    return fn(**inp, state_pool=pool, state_indices=idx, backend=backend, **kw)


def _prefill_backends():
    out = ["triton-split"]
    try:
        import cutlass.cute  # noqa: F401

        if torch.cuda.get_device_capability()[0] in (9, 10):
            out.append("cutedsl")
    except ImportError:
        pass
    return out


LENS = [100, 3, 0, 250, 64]
SLOTS = [4, 0, 2, -1, 5]
FRESH = [True, False, True, True, False]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32pool", "bf16pool"])
@pytest.mark.parametrize("backend", _prefill_backends())
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_has_initial_state_on_nan_slots_equals_zeroed_slots_bitwise(family, backend, state_dtype):
    s = SHAPES[family]
    inp = _prefill_inputs(family, LENS, seed=5, **s)
    idx = torch.tensor(SLOTS, device=DEV, dtype=torch.int32)
    his = torch.tensor([not f for f in FRESH], device=DEV)
    fresh = [sl for sl, f in zip(SLOTS, FRESH) if f and sl >= 0]
    pool = torch.randn(8, s["HV"], s["V"], s["K"], device=DEV).to(state_dtype)
    nan_pool, zero_pool = pool.clone(), pool.clone()
    nan_pool[fresh] = NAN
    zero_pool[fresh] = 0.0
    o1 = _prefill(family, inp, nan_pool, idx, backend, has_initial_state=his)
    assert linattn.last_decision().chosen == backend
    o2 = _prefill(family, inp, zero_pool, idx, backend)
    assert torch.isfinite(o1.float()).all() and torch.isfinite(nan_pool.float()).all()
    assert torch.equal(o1, o2) and torch.equal(nan_pool, zero_pool)
    assert nan_pool[2].eq(0).all()  # the empty fresh sequence
    rest = [1, 3, 6, 7]
    assert torch.equal(nan_pool[rest], pool[rest])


@pytest.mark.parametrize("backend", _prefill_backends())
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_has_initial_state_adds_no_launch(family, backend):
    """The same CUDA kernels run with and without the mask (the mask is copied nowhere: it is
    contiguous bool, read in place)."""
    s = SHAPES[family]
    inp = _prefill_inputs(family, LENS, seed=6, **s)
    idx = torch.tensor(SLOTS, device=DEV, dtype=torch.int32)
    his = torch.tensor([not f for f in FRESH], device=DEV)
    pool = torch.zeros(8, s["HV"], s["V"], s["K"], device=DEV)
    with_mask = cuda_kernels(lambda: _prefill(family, inp, pool, idx, backend, has_initial_state=his,
                                              validate=False))
    without = cuda_kernels(lambda: _prefill(family, inp, pool, idx, backend, validate=False))
    assert len(with_mask) == len(without) and with_mask == without, (with_mask, without)
    d, dpool = _decode_inputs(family, 8, 1, P=10, seed=1, **s)
    didx = torch.arange(8, device=DEV, dtype=torch.int32)
    dhis = torch.tensor([True, False] * 4, device=DEV)
    with_mask = cuda_kernels(lambda: _decode(family, d, dpool, didx, "triton-split", has_initial_state=dhis,
                                             validate=False))
    without = cuda_kernels(lambda: _decode(family, d, dpool, didx, "triton-split", validate=False))
    assert len(with_mask) == len(without) == 1 and with_mask == without, (with_mask, without)
