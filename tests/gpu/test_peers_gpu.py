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
    o_fi, _ = chunk_gated_delta_rule(q, k, v, gate.exp(), beta, scale=K ** -0.5, initial_state=theirs,
                                     output_state=theirs, output_final_state=True, cu_seqlens=cu,
                                     use_qk_l2norm_in_kernel=True, state_indices=slots, backend="flashinfer")
    assert torch.equal(o, o_fi) and torch.equal(mine, theirs)
    assert torch.equal(mine[[1, 3, 4, 6, 7]], pool[[1, 3, 4, 6, 7]])


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
