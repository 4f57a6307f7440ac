"""Plugin API 2: a backend implements one method per phase taking a typed call object; first-release
(API 1) backends keep working through the adapter; the API version tells them apart; the built-ins
and the example plugin are dispatched through the phase methods."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import linattn
from linattn.backends.base import Backend, DecodeCall, PrefillCall
from linattn.backends.torch_ref import TorchRefBackend, gdn_decode_ref, kda_decode_ref, kda_prefill_ref
from linattn.dispatch import OP_TABLE, OPS, make_call
from linattn.dispatch.plugin.calls import CALL_TYPES, ClampCall, GatingCall
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.rules.validate import validate
from linattn.testing.cases import base_spec
from linattn.testing.execute import _BUILDERS

N, T, H, HV, K, V, P = 3, 1, 1, 2, 8, 8, 5
SEEN: list = []


class PhaseMethods(Backend):
    """API 2: one method per phase; records the calls it gets and runs the reference."""

    name = "phase-methods"
    api_version = "2"
    ops = frozenset({"gdn_decode", "kda_decode", "kda_prefill", "silu_and_mul_clamp"})
    vendors = frozenset({"cpu"})
    features = frozenset({"has_initial_state"})

    def rank(self, p, caps):
        return 1

    def decode(self, call: DecodeCall):
        SEEN.append(call)
        return TorchRefBackend().run(call.op, **call.arguments())

    def prefill(self, call: PrefillCall):
        SEEN.append(call)
        return TorchRefBackend().run(call.op, **call.arguments())

    def clamp(self, call):
        SEEN.append(call)
        return TorchRefBackend().run(call.op, **call.arguments())


class FirstRelease(Backend):
    """API 1 (class says nothing; its plugin says "1"): a keyword method per op, and its own ``run``."""

    name = "first-release"
    ops = frozenset({"gdn_decode"})
    vendors = frozenset({"cpu"})

    def rank(self, p, caps):
        return 1

    def run(self, op, **kwargs):
        SEEN.append(("run", op, tuple(sorted(kwargs))))
        return super().run(op, **kwargs)

    def gdn_decode(self, *, q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
                   state_layout, intermediate_states, intermediate_state_indices, disable_state_update,
                   num_accepted_tokens, softplus_beta, softplus_threshold):
        SEEN.append(("gdn_decode",))
        return gdn_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
                              state_layout, intermediate_states, intermediate_state_indices, disable_state_update,
                              num_accepted_tokens, softplus_beta, softplus_threshold)


class FirstReleaseRef(TorchRefBackend):
    """API 1 subclass of a built-in (which is API 2): its plugin's version rules, so it is API 1."""

    name = "first-release-ref"
    ops = frozenset({"gdn_decode"})
    vendors = frozenset({"cpu"})


class DeclaresNothing(Backend):
    """API 2 and declares the clamp, but implements neither ``clamp(call)`` nor the op method."""

    name = "declares-nothing"
    api_version = "2"
    ops = frozenset({"silu_and_mul_clamp"})
    vendors = frozenset({"cpu"})

    def rank(self, p, caps):
        return 1


def _decode(kda=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    a = r(N, T, HV, K) if kda else r(N, T, HV)
    return dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V), a=a, b=r(N, T, HV), A_log=r(HV) * 0.5,
                dt_bias=(r(HV, K) if kda else r(HV)) * 0.5, state_pool=r(P, HV, V, K),
                state_indices=torch.tensor([4, -1, 0]))


def test_a_phase_method_gets_a_typed_call_with_the_contracts_fields(registry):
    registry.add_plugin(BackendPlugin(PhaseMethods), name="v2", distribution="tests")
    SEEN.clear()
    args = _decode(kda=True)
    ref_pool = args["state_pool"].clone()
    o = linattn.kda_decode(**args, lower_bound=-5.0)
    (call,) = SEEN
    assert isinstance(call, DecodeCall) and (call.op, call.family, call.mode) == ("kda_decode", "kda", "pool")
    assert call.scale == K ** -0.5 and call.lower_bound == -5.0 and call.state_layout == "vk"
    assert call.g is None and call.beta is None and not call.precomputed_gates and call.state_pool is args["state_pool"]
    ref = kda_decode_ref(**{**args, "state_pool": ref_pool}, lower_bound=-5.0)
    assert torch.equal(o, ref) and torch.equal(args["state_pool"], ref_pool)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.scale = 1.0


def test_one_prefill_method_serves_both_modes_and_sees_declared_features(registry):
    registry.add_plugin(BackendPlugin(PhaseMethods), name="v2", distribution="tests")
    SEEN.clear()
    gen = torch.Generator().manual_seed(1)
    Tt = 7
    q, k, v = (torch.randn(Tt, H, K, generator=gen) for _ in range(3))
    g, beta = -torch.rand(Tt, H, K, generator=gen), torch.rand(Tt, H, generator=gen)
    cu = torch.tensor([0, 3, 7])
    o, ht = linattn.kda_prefill(q, k, v, g, beta, cu)
    pool = torch.randn(4, H, K, K, generator=gen)
    linattn.kda_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=torch.tensor([2, 0]),
                        has_initial_state=torch.tensor([True, False]))
    dense, pooled = SEEN
    assert isinstance(dense, PrefillCall) and (dense.mode, pooled.mode) == ("dense", "pool")
    assert dense.has_initial_state is None and pooled.has_initial_state.tolist() == [True, False]
    ro, rht = kda_prefill_ref(q, k, v, g, beta, cu)
    assert torch.equal(o, ro) and torch.equal(ht, rht)


def test_a_first_release_backend_runs_through_the_adapter_with_its_own_run(registry):
    registry.add_plugin(BackendPlugin(FirstRelease, FirstReleaseRef, api_version="1"), name="v1", distribution="tests")
    registered = registry.backends["first-release"]
    assert registered.effective_api_version() == "1" and registry.backends["first-release-ref"].effective_api_version() == "1"
    assert FirstRelease.effective_api_version("1") == "1" and FirstReleaseRef.effective_api_version("1") == "1"
    SEEN.clear()
    args = _decode()
    ref_pool = args["state_pool"].clone()
    o = linattn.gdn_decode(**args)
    assert linattn.last_decision().chosen == "first-release"
    assert SEEN[0][:2] == ("run", "gdn_decode") and SEEN[1] == ("gdn_decode",)
    assert "g" not in SEEN[0][2] and "has_initial_state" not in SEEN[0][2]  # never handed an unknown keyword
    assert torch.equal(o, gdn_decode_ref(**{**args, "state_pool": ref_pool}))
    # a call object reaches the same method through the adapter
    SEEN.clear()
    nargs, _ = validate("gdn_decode", _decode())
    registered.execute(make_call("gdn_decode", nargs))
    assert [s[0] for s in SEEN] == ["run", "gdn_decode"]


def test_the_api_version_tells_them_apart():
    assert TorchRefBackend.effective_api_version() == "2"  # its own declaration
    from linattn.backends.cutedsl import CuteDSLBackend
    from linattn.backends.triton_folded import TritonFoldedBackend
    from linattn.backends.triton_split import TritonSplitBackend

    for cls in (CuteDSLBackend, TritonSplitBackend, TritonFoldedBackend):
        assert cls.effective_api_version() == "2"
    assert PhaseMethods.own_phase_methods == {"decode", "prefill", "clamp"}
    assert TorchRefBackend.own_phase_methods == frozenset()  # its per-op methods run behind the defaults


def test_a_class_declaring_an_unsupported_api_version_fails_its_plugin(registry):
    class Future(PhaseMethods):
        name = "future"
        api_version = "3"

    rec = registry.add_plugin(BackendPlugin(Future), name="future-plugin")
    assert rec.status == "plugin_load_failed" and "api_version='3'" in rec.error and "future" not in registry.backends


def test_a_backend_that_implements_nothing_is_a_named_run_error(registry):
    registry.add_plugin(BackendPlugin(DeclaresNothing), name="nothing")
    with pytest.raises(linattn.BackendRunError, match="implements neither clamp\\(call\\).*silu_and_mul_clamp"):
        linattn.silu_and_mul_clamp(torch.ones(2, 4))
    assert "declares-nothing" in registry.broken
    assert linattn.silu_and_mul_clamp(torch.ones(2, 4)).shape == (2, 2)  # the next backend takes it


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_a_call_type_whose_arguments_are_the_validated_keywords(op):
    from linattn.testing.cases import Case

    spec = OP_TABLE[op]
    case = Case(id=f"{op}/x", op=op, kind="accuracy", backend="torch-ref", spec={}, what="")
    raw = _BUILDERS[spec.method](case, base_spec(op, TorchRefBackend), "cpu")
    nargs, _ = validate(op, raw)
    call = make_call(op, nargs)
    assert type(call) is CALL_TYPES[spec.method] and call.spec is spec and call.arguments() == nargs
    ref = TorchRefBackend()
    out_call, out_run = ref.execute(call), ref.run(op, **validate(op, _BUILDERS[spec.method](
        case, base_spec(op, TorchRefBackend), "cpu"))[0])
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (out_call, out_run))):
        assert (a is None and b is None) or torch.equal(a, b)
    assert {GatingCall, ClampCall} <= set(CALL_TYPES.values())


def test_the_example_plugin_is_written_for_api_2():
    chunked = pytest.importorskip("linattn_cpu_chunked.backend")
    cls = chunked.CpuChunkedBackend
    assert cls.effective_api_version() == "2" and cls.own_phase_methods == {"prefill"}
    assert not any(op in cls.__dict__ for op in OPS)  # no per-op methods left
