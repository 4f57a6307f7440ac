"""Plugins and the second release's arguments (issue 16, item 7): a backend declares the optional
call features it implements (``Backend.features``: ``precomputed_gates``, ``has_initial_state``); a
call using one it does not declare rejects it with reason ``feature`` (so the dispatcher falls back),
and a backend written for the first release is never handed an argument it does not know."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.backends.base import Backend
from linattn.backends.torch_ref import TorchRefBackend, gdn_decode_ref, gdn_prefill_ref
from linattn.dispatch.plugin.verdict import Reason
from plugin_fakes import Plugin

N, T, H, HV, K, V, P = 3, 1, 1, 2, 8, 8, 5
CALLS: list = []


class V1Decode(TorchRefBackend):
    """A first-release plugin: subclasses torch-ref, rewrote gdn_decode / gdn_prefill with exactly the
    v1 keywords (no g, beta, has_initial_state) and declares no features. Ranked first on CPUs."""

    name = "v1-decode"
    ops = frozenset({"gdn_decode", "gdn_prefill"})
    vendors = frozenset({"cpu"})

    def rank(self, p, caps):
        return 1

    def gdn_decode(self, *, q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale,
                   use_qk_l2norm, state_layout, intermediate_states, intermediate_state_indices,
                   disable_state_update, num_accepted_tokens, softplus_beta, softplus_threshold):
        CALLS.append("gdn_decode")
        return gdn_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
                              state_layout, intermediate_states, intermediate_state_indices,
                              disable_state_update, num_accepted_tokens, softplus_beta, softplus_threshold)

    def gdn_prefill(self, *, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
                    use_qk_l2norm, state_layout):
        CALLS.append("gdn_prefill")
        return gdn_prefill_ref(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
                               use_qk_l2norm, state_layout)


class V2Decode(V1Decode):
    """The same plugin once it takes the new arguments and declares them."""

    name = "v2-decode"
    features = frozenset({"precomputed_gates", "has_initial_state"})

    def gdn_decode(self, **kw):
        CALLS.append("v2:gdn_decode")
        return TorchRefBackend.gdn_decode(self, **kw)

    def gdn_prefill(self, **kw):
        CALLS.append("v2:gdn_prefill")
        return TorchRefBackend.gdn_prefill(self, **kw)


def _decode_args(seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V), a=r(N, T, HV), b=r(N, T, HV),
                A_log=r(HV) * 0.5, dt_bias=r(HV) * 0.5), r(P, HV, V, K)


def _rejection(backend: str):
    return next(v for v in linattn.last_decision().verdicts if v.backend == backend)


def test_v1_plugin_runs_calls_without_the_new_arguments(registry):
    registry.add_plugin(Plugin(V1Decode), name="v1-plugin", distribution="tests")
    CALLS.clear()
    d, pool = _decode_args()
    p = pool.clone()
    o = linattn.gdn_decode(**d, state_pool=p, state_indices=torch.tensor([4, -1, 0]))
    assert linattn.last_decision().chosen == "v1-decode" and CALLS == ["gdn_decode"]
    ref = pool.clone()
    assert torch.equal(o, linattn.gdn_decode(**d, state_pool=ref, state_indices=torch.tensor([4, -1, 0]),
                                             backend="torch-ref"))
    assert torch.equal(p, ref)


@pytest.mark.parametrize("feature", ["precomputed_gates", "has_initial_state"])
def test_v1_plugin_is_rejected_for_a_new_argument_and_the_call_falls_back(registry, feature):
    registry.add_plugin(Plugin(V1Decode), name="v1-plugin", distribution="tests")
    CALLS.clear()
    d, pool = _decode_args(1)
    idx = torch.tensor([4, -1, 0])
    kw = {}
    if feature == "precomputed_gates":
        g, beta = linattn.gdn_gating(d["A_log"], d["a"], d["b"], d["dt_bias"])
        d.update(a=None, b=None, A_log=None, dt_bias=None)
        kw = dict(g=g, beta=beta)
    else:
        kw = dict(has_initial_state=torch.tensor([False, True, True]))
    p = pool.clone()
    o = linattn.gdn_decode(**d, state_pool=p, state_indices=idx, **kw)
    dec = linattn.last_decision()
    assert dec.chosen == "torch-chunked" and CALLS == []
    rej = _rejection("v1-decode")
    assert rej.reason == Reason.FEATURE and feature in rej.message
    assert ("g=, beta=" if feature == "precomputed_gates" else "has_initial_state=") in rej.message
    ref = pool.clone()
    assert torch.equal(o, linattn.gdn_decode(**d, state_pool=ref, state_indices=idx, backend=dec.chosen, **kw))  # the fallback's bits
    assert torch.equal(p, ref)
    assert torch.equal(p[[1, 2, 3]], pool[[1, 2, 3]])  # unowned rows


def test_v1_plugin_is_rejected_for_has_initial_state_in_prefill(registry):
    registry.add_plugin(Plugin(V1Decode), name="v1-plugin", distribution="tests")
    CALLS.clear()
    Tt = 6
    q, k, v = torch.randn(Tt, H, K), torch.randn(Tt, H, K), torch.randn(Tt, HV, V)
    g, beta = -torch.rand(Tt, HV), torch.rand(Tt, HV)
    cu = torch.tensor([0, 2, 6])
    pool = torch.randn(P, HV, V, K)
    p = pool.clone()
    linattn.gdn_prefill(q, k, v, g, beta, cu, state_pool=p, state_indices=torch.tensor([1, 3]))
    assert linattn.last_decision().chosen == "v1-decode" and CALLS == ["gdn_prefill"]
    p = pool.clone()
    linattn.gdn_prefill(q, k, v, g, beta, cu, state_pool=p, state_indices=torch.tensor([1, 3]),
                        has_initial_state=torch.tensor([True, False]))
    assert linattn.last_decision().chosen == "torch-ref" and CALLS == ["gdn_prefill"]
    assert _rejection("v1-decode").reason == Reason.FEATURE
    assert torch.equal(p[[0, 2, 4]], pool[[0, 2, 4]])


def test_forcing_a_v1_plugin_for_a_new_argument_raises_with_the_reason(registry):
    registry.add_plugin(Plugin(V1Decode), name="v1-plugin", distribution="tests")
    d, pool = _decode_args(2)
    p = pool.clone()
    with pytest.raises(linattn.NoBackendError, match="has_initial_state"):
        linattn.gdn_decode(**d, state_pool=p, state_indices=torch.tensor([4, -1, 0]), backend="v1-decode",
                           has_initial_state=torch.tensor([False, True, True]))
    assert torch.equal(p, pool)


def test_a_plugin_that_declares_the_features_gets_them(registry):
    registry.add_plugin(Plugin(V2Decode), name="v2-plugin", distribution="tests")
    CALLS.clear()
    d, pool = _decode_args(3)
    g, beta = linattn.gdn_gating(d["A_log"], d["a"], d["b"], d["dt_bias"])
    p = pool.clone()
    linattn.gdn_decode(d["q"], d["k"], d["v"], None, None, None, None, p, torch.tensor([4, -1, 0]), g=g, beta=beta,
                       has_initial_state=torch.tensor([False, True, True]))
    assert linattn.last_decision().chosen == "v2-decode" and CALLS == ["v2:gdn_decode"]


def test_declared_features_follow_the_class_that_defines_the_op_method():
    assert TorchRefBackend().declared_features("gdn_decode") == {"precomputed_gates", "has_initial_state",
                                                                 "output_state_indices", "checkpoints"}
    assert V1Decode().declared_features("gdn_decode") == frozenset()  # rewrote the method, declared nothing
    assert V1Decode().declared_features("kda_decode") == TorchRefBackend.features  # inherited untouched
    assert V2Decode().declared_features("gdn_decode") == V2Decode.features
    from linattn.backends.cutedsl import CuteDSLBackend
    from linattn.backends.triton_folded import TritonFoldedBackend
    from linattn.backends.triton_split import TritonSplitBackend

    for cls in (TritonSplitBackend, TritonFoldedBackend):
        assert cls().declared_features("kda_decode") == {"precomputed_gates", "has_initial_state",
                                                         "output_state_indices", "checkpoints"}
        assert {"has_initial_state", "checkpoints"} <= cls().declared_features("gdn_prefill")
    assert CuteDSLBackend().declared_features("kda_prefill") == {"has_initial_state", "output_state_indices",
                                                                 "checkpoints"}
    assert Backend.features == frozenset()


def test_cpu_chunked_example_plugin_falls_back_for_has_initial_state():
    """The example plugin gets the mask only if it declares it; otherwise it is rejected by reason."""
    pytest.importorskip("linattn_cpu_chunked")
    from linattn_cpu_chunked.backend import CpuChunkedBackend

    from linattn.capabilities import probe
    from linattn.dispatch.plugin.problem import Problem

    declared = CpuChunkedBackend().declared_features("gdn_prefill")
    p = Problem(op="gdn_prefill", n=2, t=8, h=1, hv=2, k=64, v=64, dtype="float32", has_initial_state=True)
    check = CpuChunkedBackend().supports_features(p, probe(torch.device("cpu")))
    assert check.ok == ("has_initial_state" in declared)  # rejected unless it declares the feature
    if not check.ok:
        assert check.reason == Reason.FEATURE and "has_initial_state" in check.message
