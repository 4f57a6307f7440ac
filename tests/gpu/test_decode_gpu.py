"""The Triton decode kernels and SwiGLU clamp compiled on a CUDA GPU, at real shapes.

Field cases (../shared/cases/field-reports.md) pinned here: F01 (N*HV past 65,535 programs),
F03/F04 (clamp widths), F08 (CUDA graph capture and replay of a padded batch), F09 (speculative
verify into a view of a longer intermediate buffer), F15 (4,096 decode steps keep fp32 gates).
F22 (compute-sanitizer) runs the same kernels through ``benchmarks/decode.py --sanitize``.
Not covered here: ROCm/XPU hardware (the folded layout runs on CUDA where its grid fits).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

from linattn.backends.torch_ref import gdn_decode_ref, kda_decode_ref, silu_and_mul_clamp_ref  # noqa: E402
from linattn.capabilities import probe  # noqa: E402
from linattn.kernels.grid import GridLimitError, plan_grid  # noqa: E402
from linattn.kernels.triton.decode import decode_launch_config, recurrent_decode  # noqa: E402
from linattn.kernels.triton.probe import probe_visits  # noqa: E402
from linattn.kernels.triton.silu_clamp import silu_and_mul_clamp  # noqa: E402
from linattn.testing.compare import rel_error_exact_zero as _rel  # noqa: E402

DEV = torch.device("cuda")
CAPS = probe(DEV)


def make_decode(N, *, gate="gdn", T=1, H=16, HV=32, K=128, V=128, P=None, dtype=torch.bfloat16,
                pool_dtype=torch.float32, seed=0, pad_every=0, table=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    P = P or (2 * N * T if table else 2 * N)
    kda = gate == "kda"
    d = dict(
        q=torch.randn(N, T, H, K, device=DEV, generator=g).to(dtype),
        k=torch.randn(N, T, H, K, device=DEV, generator=g).to(dtype),
        v=torch.randn(N, T, HV, V, device=DEV, generator=g).to(dtype),
        a=torch.randn(N, T, HV, *((K,) if kda else ()), device=DEV, generator=g).to(dtype),
        b=torch.randn(N, T, HV, device=DEV, generator=g).to(dtype),
        A_log=torch.randn(HV, device=DEV, generator=g) * 0.5,
        dt_bias=torch.randn(HV, *((K,) if kda else ()), device=DEV, generator=g) * 0.5,
        state_pool=torch.randn(P, HV, V, K, device=DEV, generator=g).to(pool_dtype),
    )
    perm = torch.randperm(P, device=DEV, generator=g)
    idx = perm[: N * T].view(N, T) if table else perm[:N]
    idx = idx.to(torch.int32).clone()
    if pad_every:
        idx[::pad_every] = -1
    d["state_indices"] = idx
    d["scale"] = K ** -0.5
    return d


def run(d, layout="split", **kw):
    gate = kw.pop("gate", "gdn")
    return recurrent_decode(gate=gate, **d, caps=CAPS, layout=layout, **kw)


def clone(d):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def reference_rows(d, rows, gate="gdn"):
    """float64 reference for a subset of rows (rows are independent), on compact slots."""
    sub = {k: (v[rows] if k in ("q", "k", "v", "a", "b") else v) for k, v in d.items()}
    idx = d["state_indices"][rows].long()
    valid = idx >= 0
    pool = torch.zeros(len(rows), *d["state_pool"].shape[1:], dtype=torch.float64, device=DEV)
    pool[valid] = d["state_pool"][idx[valid]].double()
    sub["state_pool"] = pool
    sub["state_indices"] = torch.where(valid, torch.arange(len(rows), device=DEV), -1)
    sub = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in sub.items()}
    fn = gdn_decode_ref if gate == "gdn" else kda_decode_ref
    o = fn(**sub, compute_dtype=torch.float64)
    return o, pool, valid


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [2_050, 8_192])
@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_split_past_65535_programs_visits_once_and_matches_reference(N, gate, pool_dtype):
    """HV=32: N*HV = 65,600 and 262,144 (sequence, head) pairs on the split grid (CUDA), fp32 and
    bf16 pools (each its own pinned config: the grid is planned from the pool dtype's BV x blocks)."""
    d = make_decode(N, gate=gate, pad_every=97, P=N + 64, pool_dtype=pool_dtype)
    _, cfg = decode_launch_config(128, 128, N, gate=gate, state_dtype=pool_dtype)
    plan = plan_grid(N, 32, -(-128 // (cfg.block_v * cfg.blocks)), CAPS, "split")
    counts, overflow = probe_visits(plan, DEV)
    assert overflow == 0 and bool((counts == 1).all())
    before = d["state_pool"].clone()
    out_pool = d["state_pool"]
    o = run(d, gate=gate)
    torch.cuda.synchronize()
    idx = d["state_indices"].long()
    owned = torch.zeros(out_pool.shape[0], dtype=torch.bool, device=DEV)
    owned[idx[idx >= 0]] = True
    assert torch.equal(out_pool[~owned], before[~owned]), "rows not owned by the call changed"
    assert bool((o[idx < 0] == 0).all())
    rows = torch.cat([torch.arange(0, 200), torch.arange(N - 200, N)]).to(DEV)
    d0 = dict(d, state_pool=before)
    o_ref, pool_ref, valid = reference_rows(d0, rows, gate)
    assert _rel(o[rows], o_ref) <= 2e-2
    got = out_pool[idx[rows][valid]]
    assert _rel(got, pool_ref[valid]) <= 1e-2


@pytest.mark.parametrize("N,HV,H", [(10_923, 6, 2), (2_050, 32, 16)])
def test_F01_batch_past_65535_programs_equals_two_halves_bitwise(N, HV, H):
    d = make_decode(N, HV=HV, H=H, pad_every=13)
    whole = clone(d)
    o = run(whole)
    halves = clone(d)
    h = N // 2
    parts = []
    for sl in (slice(0, h), slice(h, N)):
        part = {k: (v[sl] if k in ("q", "k", "v", "a", "b", "state_indices") else v) for k, v in halves.items()}
        parts.append(run(part))
    assert torch.equal(o, torch.cat(parts))
    assert torch.equal(whole["state_pool"], halves["state_pool"])


@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_folded_equals_split_bitwise_on_cuda_where_its_grid_fits_and_is_refused_past_it(gate):
    N = 2_047  # 2,047 * 32 = 65,504 programs on axis z: the largest folded batch on CUDA
    d = make_decode(N, gate=gate, pad_every=31)
    s, f = clone(d), clone(d)
    assert torch.equal(run(s, "split", gate=gate), run(f, "folded", gate=gate))
    assert torch.equal(s["state_pool"], f["state_pool"])
    big = make_decode(2_050, gate=gate)
    before = big["state_pool"].clone()
    with pytest.raises(GridLimitError, match="65,535"):
        run(big, "folded", gate=gate)
    assert torch.equal(big["state_pool"], before), "a refused launch must not touch the pool"


def test_F08_padded_batch_replays_in_a_cuda_graph_like_eager_and_the_reference():
    from linattn.backends.triton_split import TritonSplitBackend

    be = TritonSplitBackend()
    N = 64
    d = make_decode(N, pad_every=4)  # every fourth row is padding (-1)
    static = clone(d)
    eager = clone(d)
    kw = {k: static[k] for k in static}
    be.gdn_decode(**clone(d))  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static["state_pool"].copy_(d["state_pool"])
        with torch.cuda.graph(graph):
            o_static = be.gdn_decode(**kw)
    torch.cuda.current_stream().wait_stream(s)
    static["state_pool"].copy_(d["state_pool"])  # capture does not run the kernel
    for step in range(3):
        fresh = make_decode(N, pad_every=4, seed=10 + step)
        for name in ("q", "k", "v", "a", "b"):
            static[name].copy_(fresh[name])
            eager[name].copy_(fresh[name])
        before = eager["state_pool"].clone()
        graph.replay()
        o_eager = be.gdn_decode(**eager)
        torch.cuda.synchronize()
        assert torch.equal(o_static, o_eager)
        assert torch.equal(static["state_pool"], eager["state_pool"])
        rows = torch.arange(N, device=DEV)
        o_ref, _, _ = reference_rows(dict(eager, state_pool=before), rows)
        assert _rel(o_eager, o_ref) <= 2e-2
        assert bool((o_static[d["state_indices"] < 0] == 0).all())


@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_F09_verify_writes_through_a_view_of_a_longer_intermediate_buffer(gate):
    N, T, HV, K, V = 8, 4, 32, 128, 128
    d = make_decode(N, gate=gate, T=T, table=True)
    d["state_indices"][3] = -1  # one padding row
    buf = torch.randn(N + 2, 8, HV, V, K, device=DEV)  # allocated for 8 steps
    view = buf[:, :T]
    assert view.stride(0) == 8 * HV * V * K
    inter_idx = torch.arange(N, device=DEV).flip(0)
    inter_idx[1] = -1
    na = torch.tensor([4, 3, 2, 1, 0, 4, 1, 2], device=DEV, dtype=torch.int32)
    before_buf, before_pool = buf.clone(), d["state_pool"].clone()
    o = run(d, gate=gate, intermediate_states=view, intermediate_state_indices=inter_idx, num_accepted_tokens=na)
    ref = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in d.items()}
    ref["state_pool"] = before_pool.double()
    rbuf = before_buf.double()
    fn = gdn_decode_ref if gate == "gdn" else kda_decode_ref
    o_ref = fn(**ref, intermediate_states=rbuf[:, :T], intermediate_state_indices=inter_idx,
               num_accepted_tokens=na, compute_dtype=torch.float64)
    assert _rel(o, o_ref) <= 2e-2
    assert torch.equal(buf[:, T:], before_buf[:, T:]), "steps past the view must be untouched"
    written = torch.zeros(N + 2, dtype=torch.bool, device=DEV)
    idx, na_l = d["state_indices"].long(), na.long()
    load = idx.gather(1, (na_l - 1).clamp(min=0)[:, None]).squeeze(1)
    for n in range(N):
        if load[n] >= 0 and inter_idx[n] >= 0:
            written[inter_idx[n]] = True
    assert torch.equal(buf[~written], before_buf[~written])
    assert _rel(buf[written, :T], rbuf[written, :T]) <= 1e-2
    assert _rel(d["state_pool"], ref["state_pool"]) <= 1e-2


def test_F15_4096_decode_steps_keep_fp32_gates_in_the_kernel():
    """bf16 q/k/v/a/b, fp32 pool, 4,096 single-token steps against a float64 token-serial
    reference: the state error stays well under the error of a beta rounded to bf16."""
    N, H, HV, K, V, steps = 4, 16, 32, 128, 128, 4096
    g = torch.Generator(device=DEV).manual_seed(7)
    d = make_decode(N, H=H, HV=HV, P=N)
    d["state_indices"] = torch.arange(N, device=DEV, dtype=torch.int32)
    d["state_pool"].zero_()
    d["A_log"] = torch.full((HV,), -3.0, device=DEV)  # slow decay: the state remembers ~100 steps
    d["dt_bias"] = torch.zeros(HV, device=DEV)
    S64 = torch.zeros(N, HV, V, K, dtype=torch.float64, device=DEV)
    S64_b16beta = S64.clone()
    idx = torch.arange(N, device=DEV)
    for _ in range(steps):
        for name, shape in (("q", (N, 1, H, K)), ("k", (N, 1, H, K)), ("v", (N, 1, HV, V)),
                            ("a", (N, 1, HV)), ("b", (N, 1, HV))):
            d[name] = torch.randn(shape, device=DEV, generator=g).to(torch.bfloat16)
        run(d)
        dd = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in d.items()}
        gdn_decode_ref(**dict(dd, state_pool=S64, state_indices=idx), compute_dtype=torch.float64)
        b16 = torch.logit(torch.sigmoid(dd["b"]).to(torch.bfloat16).double())  # beta rounded to bf16
        gdn_decode_ref(**dict(dd, b=b16, state_pool=S64_b16beta, state_indices=idx), compute_dtype=torch.float64)
    err = _rel(d["state_pool"], S64)
    err_bf16_beta = _rel(S64_b16beta, S64)
    assert err < 1e-4 and err < 0.1 * err_bf16_beta, (err, err_bf16_beta)


@pytest.mark.parametrize("D", [16_384, 18_432, 352, 7, 1_000, 1])
@pytest.mark.parametrize("limit", [None, 10.0])
def test_F03_F04_silu_and_mul_clamp_any_width(D, limit):
    M = 33
    x = (torch.randn(M, 2 * D, device=DEV) * 20).to(torch.bfloat16)
    out = silu_and_mul_clamp(x, limit, caps=CAPS, layout="split")
    ref = silu_and_mul_clamp_ref(x.double(), limit, compute_dtype=torch.float64)
    assert out.shape == (M, D) and out.dtype == x.dtype
    assert _rel(out, ref) <= 2e-2
    assert torch.equal(out, silu_and_mul_clamp(x, limit, caps=CAPS, layout="folded"))


def test_F03_silu_with_no_rows_launches_nothing():
    x = torch.empty(0, 2 * 18_432, device=DEV, dtype=torch.bfloat16)
    out = silu_and_mul_clamp(x, 10.0, caps=CAPS, layout="split")
    assert out.shape == (0, 18_432)


def test_silu_limit_none_is_bitwise_the_unclamped_kernel():
    x = torch.randn(64, 2 * 4096, device=DEV).to(torch.bfloat16)  # |x| < 10: a clamp at 1e30 changes nothing
    assert torch.equal(silu_and_mul_clamp(x, None, caps=CAPS, layout="split"),
                       silu_and_mul_clamp(x, 1e30, caps=CAPS, layout="split"))


def test_F08_public_api_with_default_validation_captures_and_replays():
    """The engine's path: ``linattn.gdn_decode`` (validation on by default, dispatcher, cache) inside
    ``torch.cuda.graph``. Value checks must skip themselves during capture (no sync), selection
    must not sync, and replays must equal eager calls bitwise."""
    import linattn

    N = 64
    d = make_decode(N, pad_every=4)
    static, eager = clone(d), clone(d)
    linattn.gdn_decode(**clone(d))  # compile and cache the decision outside the capture
    torch.cuda.synchronize()
    graph, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph):
            o_static = linattn.gdn_decode(**static)
    torch.cuda.current_stream().wait_stream(s)
    static["state_pool"].copy_(d["state_pool"])
    assert linattn.last_decision("gdn_decode").chosen == "triton-split"
    for step in range(2):
        fresh = make_decode(N, pad_every=4, seed=20 + step)
        for name in ("q", "k", "v", "a", "b"):
            static[name].copy_(fresh[name])
            eager[name].copy_(fresh[name])
        graph.replay()
        o_eager = linattn.gdn_decode(**eager)
        torch.cuda.synchronize()
        assert torch.equal(o_static, o_eager)
        assert torch.equal(static["state_pool"], eager["state_pool"])
