"""The built-in chunked PyTorch backend ``torch-chunked`` (backends/torch_chunked.py) against the
float64 token-serial recurrence (torch-ref in float64), in every regime its code distinguishes,
and its place in the dispatcher (CPU prefill default above a length, fallback elsewhere)."""

import pytest
import torch

import linattn
from linattn.backends import torch_chunked as tc
from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref

from chunked_inputs import chunked_inputs as _inputs, rel as _rel

FP32_TOL = 1e-5  # docs/ops.md's fp32 tolerance against float64


def _oracle(kda, *args, **kw):
    ref = kda_prefill_ref if kda else gdn_prefill_ref
    return ref(*args, compute_dtype=torch.float64, **kw)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("gates", ["moderate", "strong", "floor", "mixed", "floor-then-mild"])
def test_dense_prefill_matches_the_float64_recurrence(kda, gates):
    lens = (0, 1, 63, 64, 0, 65, 200)  # empty, one token, a chunk minus/plus one, several chunks
    q, k, v, g, beta, cu = _inputs(kda, lens, gates)
    h0 = torch.randn(len(lens), 4, 16, 32) * 3
    o, ht = tc.chunked_prefill(q, k, v, g, beta, cu, initial_state=h0)
    ro, rht = _oracle(kda, q, k, v, g, beta, cu, initial_state=h0.double())
    assert o.dtype == torch.float32 and ht.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert _rel(o, ro) < FP32_TOL and _rel(ht, rht) < FP32_TOL
    assert torch.equal(ht[0], h0[0]) and torch.equal(ht[4], h0[4])  # empty sequences keep their state


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_pool_mode_in_place_padding_and_has_initial_state(kda, layout, pool_dtype):
    """Slots read and written in place in either layout; a padding slot (-1) gives zero output and
    is never touched; has_initial_state False starts from zero without reading its slot; an empty
    fresh sequence zeroes its slot; every row the call does not own stays bitwise unchanged."""
    lens = (70, 5, 0, 130, 0)
    q, k, v, g, beta, cu = _inputs(kda, lens, "mixed")
    shape = (9, 4, 16, 32) if layout == "vk" else (9, 4, 32, 16)
    pool = (torch.randn(shape) * 2).to(pool_dtype)
    slots = torch.tensor([6, -1, 2, 0, 4])
    fresh = torch.tensor([True, True, True, False, False])
    mine = pool.clone()
    o, none = tc.chunked_prefill(q, k, v, g, beta, cu, mine, slots, state_layout=layout, has_initial_state=fresh)
    ref = pool.double()
    ro, _ = _oracle(kda, q, k, v, g, beta, cu, ref, slots, state_layout=layout, has_initial_state=fresh)
    tol = FP32_TOL if pool_dtype == torch.float32 else 1e-2
    assert none is None
    assert _rel(o, ro) < tol
    assert _rel(mine[[6, 0]], ref[[6, 0]]) < tol
    assert torch.equal(o[70:75], torch.zeros_like(o[70:75]))  # padding: zero output
    assert torch.equal(mine[4], torch.zeros_like(mine[4]))  # empty and fresh: its zero start state
    untouched = [1, 2, 3, 5, 7, 8]  # slot 2: an empty sequence that carries its state
    assert torch.equal(mine[untouched], pool[untouched])


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_float64_inputs_compute_in_float64(kda):
    q, k, v, g, beta, cu = (x.double() if x.is_floating_point() else x
                            for x in _inputs(kda, (100, 33), "mixed"))
    o, ht = tc.chunked_prefill(q, k, v, g, beta, cu, use_qk_l2norm=False, scale=0.3)
    ro, rht = _oracle(kda, q, k, v, g, beta, cu, use_qk_l2norm=False, scale=0.3)
    assert o.dtype == torch.float64 and ht.dtype == torch.float64
    assert _rel(o, ro) < 1e-12 and _rel(ht, rht) < 1e-12


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_windows_of_chunk_steps_give_the_one_window_result(monkeypatch, kda):
    """A window keeps at most WINDOW_BYTES of entering states: cut into one step a window, with
    sequences finishing inside a window and between windows, the result is the same."""
    q, k, v, g, beta, cu = _inputs(kda, (300, 64, 129, 1), "moderate")
    ran = []
    window = tc._window
    monkeypatch.setattr(tc, "_window", lambda *a, **kw: ran.append((a[5], a[6])) or window(*a, **kw))
    o1, h1 = tc.chunked_prefill(q, k, v, g, beta, cu)
    assert len(ran) == 1, ran  # one window for the whole call
    monkeypatch.setattr(tc, "WINDOW_BYTES", 1)
    _, _, windows = tc._plan([300, 64, 129, 1], [0, 2, 1, 3], 4, 32, 16, 4)
    assert len(windows) == 5  # 5 chunk steps for 300 tokens, one step a window
    ran.clear()
    o2, h2 = tc.chunked_prefill(q, k, v, g, beta, cu)  # the same arguments: the kept layout must not be reused
    assert len(ran) == 5, ran
    assert _rel(o2, o1) < 1e-6 and _rel(h2, h1) < 1e-6


def test_kda_blocked_and_factorised_gram_matrices_agree():
    """Every chunk's range fits: one factorised matmul; the blocked path (forced) gives the same."""
    q, k, _, g, _, _ = _inputs(True, (64,), "moderate", HV=2)
    qk = torch.stack([q, k], 1).transpose(0, 2)[:1].double()  # [1, 2, C, K]: head 0
    G, Gl = tc.cumsum2(g[None, :, 0].double())
    whole = tc._factorised(qk, G, Gl)
    blocked = tc._blocked(qk, G, Gl)
    low = torch.ones(64, 64, dtype=torch.bool).tril()
    assert torch.allclose(whole[..., low], blocked[..., low], rtol=1e-12, atol=1e-12)


def test_unit_lower_inverse_inverts_i_plus_a():
    A = (torch.randn(3, 64, 64, dtype=torch.float64) * 0.3).tril(-1)
    X = tc._unit_lower_inverse(A)
    assert torch.allclose(X @ (torch.eye(64, dtype=torch.float64) + A), torch.eye(64, dtype=torch.float64),
                          atol=1e-10)


def test_cpu_prefill_default_and_fallback_ranks():
    """On the CPU torch-chunked is the prefill default from SHORT tokens per sequence (torch-ref below
    it); its decode step is the CPU's decode default, torch-ref right behind; on a GPU profile its prefill
    ranks behind the kernels and ahead of torch-ref."""
    def problem(op, n, t):
        return linattn.Problem(op=op, n=n, t=t, h=4, hv=8, k=128, v=128, dtype="float32", state_dtype="float32",
                               mode="pool")

    long_ = linattn.explain(problem("gdn_prefill", 4, 4 * tc.SHORT["gdn"]), "cpu")
    short = linattn.explain(problem("kda_prefill", 4, 4 * tc.SHORT["kda"] - 4), "cpu")
    decode = linattn.explain(problem("gdn_decode", 4, 4), "cpu")
    assert long_.chosen == "torch-chunked" and "chunked form" in long_.verdict("torch-chunked").message
    assert short.chosen == "torch-ref" and short.verdict("torch-chunked").ok
    assert decode.chosen == "torch-chunked" and decode.runners_up[0] == "torch-ref"
    gpu = linattn.explain(problem("gdn_prefill", 4, 4096), "sm90").verdict("torch-chunked")
    assert gpu.ok and linattn.dispatch.Rank.NATIVE < gpu.rank < linattn.explain(
        problem("gdn_prefill", 4, 4096), "sm90").verdict("torch-ref").rank


def test_public_op_runs_it_and_honours_ieee_fp32_under_medium_precision():
    """Through linattn.kda_prefill on the CPU (the dispatcher's choice), with the caller's fp32 matmul
    precision at "medium" (bf16 matmuls where the CPU has them, F36): still within fp32's tolerance."""
    q, k, v, g, beta, cu = _inputs(True, (200, 90), "mixed")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        o, ht = linattn.kda_prefill(q, k, v, g, beta, cu)
    finally:
        torch.set_float32_matmul_precision(before)
    assert linattn.last_decision("kda_prefill").chosen == "torch-chunked"
    ro, rht = _oracle(True, q, k, v, g, beta, cu)
    assert _rel(o, ro) < FP32_TOL and _rel(ht, rht) < FP32_TOL


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("lens,chunk", [((3, 9, 0, 1), 16), ((17, 5, 30), 32)])
def test_short_calls_use_a_smaller_chunk_and_match_the_float64_recurrence(kda, lens, chunk):
    assert tc.chunk_size(max(lens)) == chunk
    q, k, v, g, beta, cu = _inputs(kda, lens, "mixed")
    h0 = torch.randn(len(lens), 4, 16, 32)
    o, ht = tc.chunked_prefill(q, k, v, g, beta, cu, initial_state=h0)
    ro, rht = _oracle(kda, q, k, v, g, beta, cu, initial_state=h0.double())
    assert _rel(o, ro) < FP32_TOL and _rel(ht, rht) < FP32_TOL


def _decode_inputs(kda, layout, N=4, H=2, HV=4, K=32, V=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(N, 1, H, K, generator=gen) for _ in range(2))
    v = torch.randn(N, 1, HV, V, generator=gen)
    a = torch.randn(N, 1, HV, *((K,) if kda else ()), generator=gen)
    b = torch.randn(N, 1, HV, generator=gen)
    A_log, dt = torch.rand(HV, generator=gen), torch.rand(HV, *((K,) if kda else ()), generator=gen)
    pool = torch.randn(7, HV, *((V, K) if layout == "vk" else (K, V)), generator=gen)
    return (q, k, v, a, b, A_log, dt), pool


#: slot patterns of decode_step's state paths: one view of the pool (consecutive, every other slot,
#: after a padding row), gathered rows (scattered), row by row (scattered, GATHER_ROW_BYTES = 0)
DECODE_SLOTS = {"scattered": [5, -1, 0, 3], "consecutive": [2, 3, 4, 5], "strided": [0, 2, 4, 6],
                "padded_block": [-1, 3, 4, 5], "rowwise": [5, -1, 0, 3]}


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("frozen", [False, True], ids=["update", "disable_state_update"])
@pytest.mark.parametrize("slots", list(DECODE_SLOTS))
def test_decode_step_matches_the_float64_recurrence_in_place(kda, layout, frozen, slots, monkeypatch):
    """One token over an fp32 pool through the public op, forced (torch-chunked's own step), on each of
    its state paths: within fp32's tolerance of float64, padding rows zero, padding and unowned slots
    bitwise unchanged (every slot with disable_state_update)."""
    if slots == "rowwise":
        monkeypatch.setattr(tc, "GATHER_ROW_BYTES", 0)
    args, pool = _decode_inputs(kda, layout)
    idx = torch.tensor(DECODE_SLOTS[slots])
    extra = {"lower_bound": -5.0} if kda else {}
    op = linattn.kda_decode if kda else linattn.gdn_decode
    mine = pool.clone()
    o = op(*args, mine, idx, state_layout=layout, disable_state_update=frozen, backend="torch-chunked", **extra)
    assert linattn.last_decision().chosen == "torch-chunked"
    ref = pool.double()
    ref_fn = tc.kda_decode_ref if kda else tc.gdn_decode_ref
    ro = ref_fn(*(x.double() for x in args), ref, idx, state_layout=layout, disable_state_update=frozen,
                compute_dtype=torch.float64, **extra)
    assert _rel(o, ro) < FP32_TOL and _rel(mine, ref) < FP32_TOL
    pad = [n for n, s in enumerate(idx.tolist()) if s < 0]
    assert torch.equal(o[pad], torch.zeros_like(o[pad]))
    untouched = [s for s in range(pool.shape[0]) if frozen or s not in idx.tolist()]
    assert torch.equal(mine[untouched], pool[untouched])


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("form", ["raw", "gates"])
def test_decode_prepared_launch_runs_decode_step_with_the_first_calls_scalars(kda, form):
    """The dispatcher's cached launch (TorchChunkedBackend.prepare) gives decode_step's bits through the
    call object, on the first call with a key and on a later one with other values (GVA, scale, KDA's
    lower_bound, gate or raw form); slots not owned unchanged."""
    from linattn.dispatch.plugin.calls import make_call

    op = linattn.kda_decode if kda else linattn.gdn_decode
    extra = {"lower_bound": -5.0} if kda else {}
    for seed in (0, 1):
        (q, k, v, a, b, A_log, dt), pool = _decode_inputs(kda, "kv", seed=seed)
        idx = torch.tensor([4, 0, 6, 2])
        kw = dict(scale=0.3, state_layout="kv", **(extra if form == "raw" else {}))  # the gate form: g is bounded
        if form == "raw":
            gates = dict(a=a, b=b, A_log=A_log, dt_bias=dt)
        else:
            g, beta = (linattn.kda_gating if kda else linattn.gdn_gating)(A_log, a.squeeze(1), b.squeeze(1), dt, **extra)
            gates = dict(g=g.unsqueeze(1), beta=beta.unsqueeze(1))
        mine, want = pool.clone(), pool.clone()
        raw = [gates.get(n) for n in ("a", "b", "A_log", "dt_bias")]
        o = op(q, k, v, *raw, mine, idx, backend="torch-chunked", g=gates.get("g"), beta=gates.get("beta"), **kw)
        call = make_call(op.__name__, dict(q=q, k=k, v=v, state_pool=want, state_indices=idx, use_qk_l2norm=True,
                                           **gates, **kw))
        assert torch.equal(o, tc.decode_step(call)) and torch.equal(mine, want)
        assert torch.equal(mine[[1, 3, 5]], pool[[1, 3, 5]])


def test_decode_separate_write_slots_in_one_view_equal_the_in_place_call():
    """Read slots 0-2, write slots 3-5 (both one view of the pool): the bits of an in-place call on the
    write slots holding copies of the read states; the read slots and slot 6 unchanged."""
    args, pool = _decode_inputs(False, "vk", N=3)
    read, write = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    mine = pool.clone()
    o = linattn.gdn_decode(*args, mine, read, output_state_indices=write, backend="torch-chunked")
    want = pool.clone()
    want[3:6] = pool[0:3]
    o_want = linattn.gdn_decode(*args, want, write, backend="torch-chunked")
    assert torch.equal(o, o_want) and torch.equal(mine, want)
    assert torch.equal(mine[[0, 1, 2, 6]], pool[[0, 1, 2, 6]])


def test_decode_other_than_one_token_over_an_fp32_pool_runs_torch_refs_code_bitwise():
    """A verify with intermediate states and num_accepted_tokens is not the plain step: torch-chunked
    runs torch-ref's decode, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    N, T, H, HV, K, V = 2, 3, 1, 2, 16, 16
    q, k = (torch.randn(N, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(N, T, HV, V, generator=gen)
    g, beta = -torch.rand(N, T, HV, generator=gen), torch.rand(N, T, HV, generator=gen)
    pool = torch.randn(4, HV, V, K, generator=gen)
    table = torch.tensor([[0, 1, 2], [3, -1, -1]])
    nacc = torch.tensor([2, 1])
    outs = []
    for backend in ("torch-chunked", "torch-ref"):
        p, inter = pool.clone(), torch.zeros(2, T, HV, V, K)
        o = linattn.gdn_decode(q, k, v, None, None, None, None, p, table, g=g, beta=beta, intermediate_states=inter,
                               intermediate_state_indices=torch.tensor([1, 0]),
                               num_accepted_tokens=nacc, backend=backend)
        outs.append((o, p, inter))
    assert all(torch.equal(x, y) for x, y in zip(*outs))


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_buffers_kept_between_calls_change_no_result_and_no_returned_tensor(kda):
    """The per-thread buffers reused between prefills: a second call of the same size leaves the first
    call's output and state untouched and gives the same bits; a call of another size in between, and
    a call after clear_workspace, too."""
    tc.clear_workspace()
    a = _inputs(kda, (130, 64), "mixed")
    b = _inputs(kda, (70,), "strong", seed=1)
    o1, h1 = tc.chunked_prefill(*a)
    keep = (o1.clone(), h1.clone())
    tc.chunked_prefill(*b)
    o2, h2 = tc.chunked_prefill(*a)
    assert torch.equal(o1, keep[0]) and torch.equal(h1, keep[1])
    assert torch.equal(o2, o1) and torch.equal(h2, h1)
    tc.clear_workspace()
    o3, h3 = tc.chunked_prefill(*a)
    assert torch.equal(o3, o1) and torch.equal(h3, h1)


def test_buffers_kept_between_calls_stay_within_window_bytes(monkeypatch):
    """A window of one step of many sequences can be larger than WINDOW_BYTES: its buffers are then
    used for that call but not all kept, so a thread keeps at most WINDOW_BYTES between prefills; the
    outputs are those of the same call again (the buffers not kept are fresh, the kept reused)."""
    tc.clear_workspace()
    monkeypatch.setattr(tc, "WINDOW_BYTES", 1 << 20)  # one step of 12 chunks: 2.1 MiB of buffers
    a = _inputs(False, (64,) * 12, "mixed")
    o1, h1 = tc.chunked_prefill(*a)
    kept = sum(b.nbytes for b in tc._WORKSPACE.buffers.values())
    assert 0 < kept <= tc.WINDOW_BYTES
    o2, h2 = tc.chunked_prefill(*a)
    assert torch.equal(o2, o1) and torch.equal(h2, h1)
    tc.clear_workspace()


def test_buffers_kept_under_inference_mode_serve_a_later_no_grad_call():
    """A call under torch.inference_mode keeps inference tensors, which cannot be written outside it:
    a later call under torch.no_grad on the same thread replaces them and gives the same bits."""
    tc.clear_workspace()
    a = _inputs(False, (130, 64), "mixed")
    with torch.inference_mode():
        o1, h1 = tc.chunked_prefill(*a)
    with torch.no_grad():
        o2, h2 = tc.chunked_prefill(*a)
    with torch.inference_mode():
        o3, h3 = tc.chunked_prefill(*a)
    assert torch.equal(o2, o1) and torch.equal(h2, h1) and torch.equal(o3, o1) and torch.equal(h3, h1)
    tc.clear_workspace()


def test_decode_constants_kept_under_inference_mode_and_permuted_inputs_give_the_same_bits():
    """decode_step keeps its l2norm/scale constants per (scale, device): made under torch.inference_mode,
    they serve later calls under no_grad and with grad mode on, same bits; a value tensor and gates
    handed in a permuted (non-contiguous, dense) layout give the bits of their contiguous copies."""
    tc._SCALES.clear()
    (q, k, v, a, b, A_log, dt), pool = _decode_inputs(False, "kv", N=2, H=1, HV=2, K=16, V=16)
    g, beta = linattn.gdn_gating(A_log, a.squeeze(1), b.squeeze(1), dt)
    g, beta = g.unsqueeze(1), beta.unsqueeze(1)
    idx = torch.tensor([2, 0])

    def run(v, g):
        p = pool.clone()
        return linattn.gdn_decode(q, k, v, None, None, None, None, p, idx, g=g, beta=beta, state_layout="kv",
                                  backend="torch-chunked"), p
    with torch.inference_mode():
        first = run(v, g)
    with torch.no_grad():
        assert all(torch.equal(x, y) for x, y in zip(run(v, g), first))
    assert all(torch.equal(x, y) for x, y in zip(run(v, g), first))
    vt = v.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, V-major strides
    gt = g.squeeze(1).t().contiguous().t().unsqueeze(1)
    assert not vt.is_contiguous() and not gt.is_contiguous()
    o, p = run(vt, gt)
    assert torch.equal(o, first[0]) and torch.equal(p, first[1]) and torch.equal(p[1], pool[1])


def _strided(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a view with every stride doubled (last stride 2, storage offset 1)."""
    big = torch.zeros(*x.shape, 2, dtype=x.dtype)
    big[..., 1] = x
    return big[..., 1]


def _split_views(q, k, v):
    """q, k, v as views of one projection ``[N, 1, (2H + HV) D]``, as transformers' GDN layer splits them."""
    N, _, H, K = q.shape
    HV, V = v.shape[2:]
    mixed = torch.cat((q.reshape(N, 1, -1), k.reshape(N, 1, -1), v.reshape(N, 1, -1)), -1)
    qs, ks, vs = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    return qs.view(N, 1, H, K), ks.view(N, 1, H, K), vs.view(N, 1, HV, V)


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("views", ["doubled_strides", "split_projection"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_decode_reads_strided_inputs_in_place_with_the_bits_of_contiguous_copies(kda, views, layout):
    """The decode declares every read-only argument readable through its strides: q, k, v, g and beta as
    views (every stride doubled, or transformers' split of one projection) are handed to the step uncopied
    and give the bits of their contiguous copies; the output is contiguous; slots not owned unchanged."""
    from linattn.dispatch.rules.layouts import conform_inputs

    (q, k, v, a, b, A_log, dt), pool = _decode_inputs(kda, layout, N=3, H=1, HV=2, K=16, V=16)
    extra = {"lower_bound": -5.0} if kda else {}
    g, beta = (linattn.kda_gating if kda else linattn.gdn_gating)(A_log, a.squeeze(1), b.squeeze(1), dt, **extra)
    g, beta = g.unsqueeze(1), beta.unsqueeze(1)
    if views == "doubled_strides":
        sq, sk, sv, sg, sb = map(_strided, (q, k, v, g, beta))
    else:
        (sq, sk, sv), sg, sb = _split_views(q, k, v), _strided(g), beta
    assert not any(x.is_contiguous() for x in (sq, sk, sv, sg))
    op = linattn.kda_decode if kda else linattn.gdn_decode
    idx = torch.tensor([4, 0, 6])
    outs = []
    for args in ((q, k, v, g, beta), (sq, sk, sv, sg, sb)):
        p = pool.clone()
        o = op(*args[:3], None, None, None, None, p, idx, g=args[3], beta=args[4], state_layout=layout,
               backend="torch-chunked")
        outs.append((o, p))
    (o, p), (so, sp) = outs
    assert torch.equal(so, o) and torch.equal(sp, p) and so.is_contiguous()
    assert torch.equal(sp[[1, 2, 3, 5]], pool[[1, 2, 3, 5]])
    named = dict(q=sq, k=sk, v=sv, g=sg, beta=sb, state_indices=idx)
    assert conform_inputs(op.__name__, named, tc.TorchChunkedBackend()) is named  # nothing copied


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bit patterns (a NaN compares equal to the same NaN)."""
    return x.view({torch.float64: torch.int64, torch.float32: torch.int32}.get(x.dtype, torch.int16))


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "raw"])
def test_prefill_reads_row_views_of_one_projection_in_place_with_the_bits_of_contiguous_copies(kda, dtype, l2norm):
    """The prefill declares q / k / v readable as rows with a unit last stride: transformers' split of one
    projection ``[T, (2H + HV) D]`` is handed to the backend uncopied and gives the bits of the contiguous
    copies' call, dense and in pool mode, across chunk steps and empty sequences (without the l2norm the
    outputs overflow: NaN where the copies' call has the same NaN); a view with a last stride > 1 is copied."""
    from linattn.dispatch.rules.layouts import conform_inputs

    lens = (80, 0, 5, 200, 17)
    q, k, v, g, beta, cu = _inputs(kda, lens, "moderate", H=1, HV=2, K=32, V=16, dtype=dtype)
    T = q.shape[0]
    mixed = torch.cat((q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1), torch.zeros(T, 3, dtype=dtype)), -1)
    sq, sk, sv = (x.view(T, -1, w) for x, w in zip(torch.split(mixed, [32, 32, 32, 3], -1)[:3], (32, 32, 16)))
    assert torch.equal(sq, q) and torch.equal(sv, v) and not any(x.is_contiguous() for x in (sq, sk, sv))
    op = linattn.kda_prefill if kda else linattn.gdn_prefill
    backend = tc.TorchChunkedBackend()
    named = dict(q=sq, k=sk, v=sv, g=g, beta=beta, cu_seqlens=cu)
    assert conform_inputs(op.__name__, named, backend) is named  # nothing copied
    assert conform_inputs(op.__name__, {**named, "q": _strided(q)}, backend)["q"].is_contiguous()
    h0, pool, idx = torch.randn(len(lens), 2, 16, 32), torch.randn(7, 2, 16, 32), torch.tensor([6, 0, -1, 2, 4])
    for pool_mode in (False, True):
        outs = []
        for x in ((q, k, v), (sq, sk, sv)):
            p = pool.clone()
            kw = dict(state_pool=p, state_indices=idx) if pool_mode else dict(initial_state=h0)
            got = op(*x, g, beta, cu, **kw, use_qk_l2norm=l2norm, backend="torch-chunked")
            outs.append((got, p) if pool_mode else got)
        (o, s), (so, ss) = outs
        assert torch.equal(_bits(so), _bits(o)) and torch.equal(_bits(ss), _bits(s))


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_decode_on_the_whole_pool_gives_the_bits_of_a_view_of_a_larger_pool(kda, layout):
    """Slots 0..N-1 of an N-row pool (the step reads and writes the pool itself) and the same states at
    consecutive slots of a larger pool (a view of it): the same output and states, bit for bit; the
    larger pool's other slots unchanged."""
    args, pool = _decode_inputs(kda, layout)
    N = args[0].shape[0]
    extra = {"lower_bound": -5.0} if kda else {}
    op = linattn.kda_decode if kda else linattn.gdn_decode
    whole, big = pool[:N].clone(), pool.clone()
    outs = [op(*args, p, torch.arange(N), state_layout=layout, backend="torch-chunked", **extra) for p in (whole, big)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(big[:N], whole) and not torch.equal(whole, pool[:N])
    assert torch.equal(big[N:], pool[N:])


@pytest.mark.parametrize("vk", [False, True], ids=["kv", "vk"])
@pytest.mark.parametrize("n,HV,K,V", [(1, 8, 128, 128), (2, 2, 64, 64), (3, 4, 32, 16), (4, 1, 8, 24)])
def test_decode_batched_product_is_matmuls_bits(vk, n, HV, K, V):
    """The step's product over the states: one bmm where the slot and head dims fold (the pool itself, a
    view of consecutive slots, gathered rows), the bits of matmul on the same operands; matmul itself
    where they do not fold (every other row of a buffer)."""
    gen = torch.Generator().manual_seed(n * HV + K)
    dqk = torch.randn(n, HV, 2, K, generator=gen)
    buf = torch.randn(2 * n + 1, HV, *((V, K) if vk else (K, V)), generator=gen)
    real_bmm, calls = torch.bmm, []

    def bmm(*a, **kw):
        calls.append(1)
        return real_bmm(*a, **kw)

    for S, folds in ((buf[:n], True), (buf[1:n + 1], True), (buf[::2][:n], False)):
        want = torch.matmul(dqk, S.transpose(-1, -2) if vk else S)
        calls.clear()
        torch.bmm = bmm
        try:
            got = tc._batched_product(dqk, S, vk)
        finally:
            torch.bmm = real_bmm
        assert torch.equal(got, want) and bool(calls) == folds, (folds, calls)


@pytest.mark.parametrize("slots", [[0, 0, 2], [0, 2, 2], [0, 1, 1], [2, 1, 0], [0, 2, 1]])
def test_decode_without_state_update_reads_repeated_or_unordered_slots_of_the_whole_pool(slots):
    """disable_state_update allows one slot read by two rows (nothing is written): slots that name as many
    rows as the pool holds but not 0..P-1 in order read the slots named, not the pool's rows in order
    (torch-ref's results within fp32's tolerance; the pool unchanged)."""
    args, pool = _decode_inputs(False, "vk", N=3)
    pool = pool[:3].clone()
    idx = torch.tensor(slots)
    mine = pool.clone()
    o = linattn.gdn_decode(*args, mine, idx, disable_state_update=True, backend="torch-chunked")
    ro = tc.gdn_decode_ref(*(x.double() for x in args), pool.double(), idx, disable_state_update=True,
                           compute_dtype=torch.float64)
    assert _rel(o, ro) < FP32_TOL and torch.equal(mine, pool)
