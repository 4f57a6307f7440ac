"""GPU tests of the peer backends ``fla`` (fla-core 0.6) and ``flashinfer`` (flashinfer-python 0.7.4):
the conformance suite (``linattn check --backend fla|flashinfer --device cuda``) against the
float64 reference, FlashInfer's decode replayed in a CUDA graph, and the peers' outputs against the
libraries called directly (the translation adds no error of its own).

Run on the H200 with ``bash benchmarks/peers_device.sh`` (its header gives the device calls: the
CuTe DSL bundle and ``.flashinfer`` for FlashInfer, ``.whl`` for fla-core). A library that does
not import here skips its tests with the reason.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import linattn  # noqa: E402
from linattn.testing import run_suite  # noqa: E402


@pytest.fixture(autouse=True)
def _peers_enabled(monkeypatch):
    """Both peers registered (``LINATTN_PEERS=all``: opt-in until verified here), a fresh registry."""
    monkeypatch.setenv("LINATTN_PEERS", "all")
    linattn.dispatch.reset_registry()
    yield
    monkeypatch.undo()
    linattn.dispatch.reset_registry()

LIBRARY = {"fla": "fla", "flashinfer": "flashinfer.gdn_prefill"}


def _need(name: str) -> None:
    pytest.importorskip(LIBRARY[name], reason=f"{LIBRARY[name]} does not import here")


@pytest.mark.parametrize("name", ["fla", "flashinfer"])
def test_conformance_suite_passes_on_this_gpu(name):
    _need(name)
    rep = run_suite(name, device="cuda")
    assert rep.available, f"{name} is not available on this GPU: {rep.availability}"
    runs = [r for r in rep.results if r.kind in ("accuracy", "pool")]
    ran = [r for r in runs if r.status == "passed"]
    declined = [r for r in runs if r.status == "skipped"]
    # a declined case names the predicate that refused it; nothing is skipped for any other cause
    assert all(r.message.startswith("declined by its predicates") for r in declined), \
        [(r.id, r.message) for r in declined if not r.message.startswith("declined")]
    assert len(ran) >= 10, [(r.id, r.status, r.message) for r in runs]
    assert rep.status == "passed", "\n".join(f"{r.id}: {r.message}" for r in rep.failures())


def _decode_args(N=64, H=2, HV=8, K=128, P=80, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    slots = torch.randperm(P - 1, device="cuda", generator=g)[:N].to(torch.int32)
    slots[::7] = -1  # padding rows
    return dict(q=r(N, 1, H, K).bfloat16(), k=r(N, 1, H, K).bfloat16(), v=r(N, 1, HV, K).bfloat16(),
                a=r(N, 1, HV).bfloat16(), b=r(N, 1, HV).bfloat16(), A_log=r(HV), dt_bias=r(HV),
                state_pool=0.1 * r(P, HV, K, K), state_indices=slots)


@pytest.mark.parametrize("name", ["fla", "flashinfer"])
def test_peer_decode_replays_in_a_cuda_graph_like_eager(name):
    _need(name)
    args = _decode_args()
    pool0 = args["state_pool"].clone()
    eager_pool = pool0.clone()
    o_eager = linattn.gdn_decode(**{**args, "state_pool": eager_pool}, backend=name)  # self-check, compile
    assert linattn.last_decision().chosen == name
    args["state_pool"].copy_(pool0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = linattn.gdn_decode(**args, backend=name, validate=False)
    args["state_pool"].copy_(pool0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_eager) and torch.equal(args["state_pool"], eager_pool)
    pad = (args["state_indices"] < 0).nonzero().squeeze(1)
    assert bool(o_eager[pad].eq(0).all())
    untouched = torch.ones(pool0.shape[0], dtype=torch.bool, device="cuda")
    untouched[args["state_indices"][args["state_indices"] >= 0].long()] = False
    assert torch.equal(eager_pool[untouched], pool0[untouched])


def test_fla_prefill_is_refused_in_capture_and_another_backend_is_chosen():
    _need("fla")
    # linattn.dispatch.explain decides as for a call during capture (capturing=True); linattn.explain,
    # the user's, takes a Problem alone or an op name with shape keywords
    d = linattn.dispatch.explain(linattn.Problem(op="gdn_prefill", n=2, t=512, h=2, hv=8, k=128, v=128), "cuda",
                                 capturing=True)
    fla = next(v for v in d.verdicts if v.backend == "fla")
    assert not fla.ok and fla.reason == linattn.dispatch.Reason.CAPTURE and d.chosen not in (None, "fla")


def test_flashinfer_prefill_equals_flashinfer_called_directly_on_the_pool():
    _need("flashinfer")
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    g = torch.Generator(device="cuda").manual_seed(1)
    lens, H, HV, K, P = (300, 1000, 65), 2, 8, 128, 8
    T = sum(lens)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k, v = r(T, H, K).bfloat16(), r(T, H, K).bfloat16(), r(T, HV, K).bfloat16()
    gate = torch.nn.functional.logsigmoid(r(T, HV) + 3.0)
    beta = torch.sigmoid(r(T, HV))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    slots = torch.tensor([5, 0, 2], device="cuda", dtype=torch.int32)
    pool = 0.1 * r(P, HV, K, K)
    mine, theirs = pool.clone(), pool.clone()
    o = linattn.gdn_prefill(q, k, v, gate, beta, cu, state_pool=mine, state_indices=slots, backend="flashinfer")
    # 1,365 tokens < CP_MIN_TOKENS: the backend hands FlashInfer use_cp=False (its non-CP kernel)
    o_fi, _ = chunk_gated_delta_rule(q, k, v, gate.exp(), beta, scale=K ** -0.5, initial_state=theirs,
                                     output_state=theirs, output_final_state=True, cu_seqlens=cu,
                                     use_qk_l2norm_in_kernel=True, state_indices=slots, backend="flashinfer",
                                     use_cp=False)
    assert torch.equal(o, o_fi) and torch.equal(mine, theirs)
    assert torch.equal(mine[[1, 3, 4, 6, 7]], pool[[1, 3, 4, 6, 7]])


def _fi_inputs(lens, H=2, HV=8, K=128, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    return dict(q=r(T, H, K).bfloat16(), k=r(T, H, K).bfloat16(), v=r(T, HV, K).bfloat16(),
                g=torch.nn.functional.logsigmoid(r(T, HV) + 3.0), beta=torch.sigmoid(r(T, HV)),
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                                        dtype=torch.int32))


def test_flashinfer_long_plain_prefill_keeps_flashinfers_own_cp_rule():
    """From CP_MIN_TOKENS tokens on, a call in the plain form is handed use_cp='auto' as before:
    bitwise FlashInfer called directly with its defaults."""
    _need("flashinfer")
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    from linattn.backends.flashinfer import CP_MIN_TOKENS

    d = _fi_inputs([CP_MIN_TOKENS])
    pool = 0.1 * torch.randn(4, 8, 128, 128, device="cuda")
    slots = torch.tensor([2], device="cuda", dtype=torch.int32)
    mine, theirs = pool.clone(), pool.clone()
    o = linattn.gdn_prefill(**d, state_pool=mine, state_indices=slots, backend="flashinfer")
    o_fi, _ = chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"].exp(), d["beta"], scale=128 ** -0.5,
                                     initial_state=theirs, output_state=theirs, output_final_state=True,
                                     cu_seqlens=d["cu_seqlens"], use_qk_l2norm_in_kernel=True, state_indices=slots,
                                     backend="flashinfer")
    assert torch.equal(o, o_fi) and torch.equal(mine, theirs)


def test_flashinfer_separate_slots_and_checkpoints_equal_flashinfer_called_directly():
    """The translation of output_state_indices and of the [N, M] checkpoint table (FlashInfer's
    checkpoint_state_indices with per-sequence starts) against FlashInfer 0.7.4 called directly with
    the rows written out by hand: bitwise outputs and pool; a fork of an empty sequence gets its read
    row (FlashInfer writes nothing for it), rows not named unchanged."""
    _need("flashinfer")
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    lens = [300, 0, 129, 64]
    d = _fi_inputs(lens)
    P = 16
    pool = 0.1 * torch.randn(P, 8, 128, 128, device="cuda")
    read = torch.tensor([3, 3, 5, 7], device="cuda", dtype=torch.int32)
    write = torch.tensor([0, 1, 5, 2], device="cuda", dtype=torch.int32)
    marks = torch.tensor([[8, 9, 10], [11, -1, -1], [12, 13, -1], [14, -1, -1]], device="cuda", dtype=torch.int32)
    mine = pool.clone()
    o = linattn.gdn_prefill(**d, state_pool=mine, state_indices=read, output_state_indices=write,
                            checkpoint_every=64, checkpoint_indices=marks, backend="flashinfer")
    # by hand: checkpoints per sequence len // 64 = 4, 0, 2, 1 at starts 0, 4, 4, 6; M = 3 columns
    rows = torch.tensor([8, 9, 10, -1, 12, 13, 14], device="cuda", dtype=torch.int32)
    theirs = pool.clone()
    o_fi, _ = chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"].exp(), d["beta"], scale=128 ** -0.5,
                                     initial_state=theirs, output_state=theirs, output_final_state=True,
                                     cu_seqlens=d["cu_seqlens"], use_qk_l2norm_in_kernel=True, state_indices=read,
                                     output_state_indices=write, use_cp=False, backend="flashinfer",
                                     state_checkpoints=theirs, checkpoint_every_n_tokens=64,
                                     checkpoint_cu_starts=torch.tensor([0, 4, 4, 6], device="cuda",
                                                                       dtype=torch.int32),
                                     checkpoint_state_indices=rows)
    theirs[1] = pool[3]  # the empty fork: FlashInfer leaves its write row alone
    assert torch.equal(o, o_fi) and torch.equal(mine, theirs)
    assert torch.equal(mine[[3, 4, 6, 7, 11, 15]], pool[[3, 4, 6, 7, 11, 15]])  # read slots, 11: empty's


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_fla_prefill_equals_fla_called_directly_with_the_gathered_state(layout):
    _need("fla")
    import inspect

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    own = inspect.unwrap(chunk_gated_delta_rule)  # FLA's Triton path, as the backend calls it
    g = torch.Generator(device="cuda").manual_seed(2)
    lens, H, HV, K, V, P = (300, 0, 129), 2, 8, 128, 64, 6
    T = sum(lens)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k, v = r(T, H, K).bfloat16(), r(T, H, K).bfloat16(), r(T, HV, V).bfloat16()
    gate = torch.nn.functional.logsigmoid(r(T, HV) + 3.0)
    beta = torch.sigmoid(r(T, HV))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    slots = torch.tensor([4, 1, 0], device="cuda")
    tile = (V, K) if layout == "vk" else (K, V)
    pool = 0.1 * r(P, HV, *tile)
    mine = pool.clone()
    o = linattn.gdn_prefill(q, k, v, gate, beta, cu, state_pool=mine, state_indices=slots, state_layout=layout,
                            backend="fla")
    o_fla, ht = own(q[None], k[None], v[None], gate[None], beta[None], scale=K ** -0.5,
                    initial_state=pool[slots], output_final_state=True, use_qk_l2norm_in_kernel=True,
                    state_v_first=layout == "vk", cu_seqlens=cu.long())
    assert torch.equal(o, o_fla[0]) and torch.equal(mine[slots], ht)
    assert torch.equal(mine[[2, 3, 5]], pool[[2, 3, 5]])
