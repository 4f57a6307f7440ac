"""Selection, forcing, policies, env vars, the decision cache and plugins registered via the hook."""

import logging

import pytest
import torch

import linattn
from linattn.backends.base import Backend
from linattn.capabilities import profile
from linattn.dispatch import NoBackendError, Problem, Reason, explain, last_decision, policy, select
from linattn.dispatch.plugin.hookspecs import BackendPlugin, hookimpl
from linattn.dispatch.runtime.policy import parse_force
from linattn.dispatch.plugin.verdict import Check

DECODE = Problem(op="gdn_decode", n=4, t=1, h=2, hv=4, k=16, v=16, dtype="float32")


from dispatch_backends import FastCpuDecode  # noqa: E402


class RaisingPredicate(Backend):
    name = "test-raises"
    ops = frozenset({"gdn_decode"})

    def predicates(self):
        return super().predicates() + [self.boom]

    def boom(self, p, caps) -> Check:
        raise RuntimeError("predicate exploded")


def test_cpu_decode_default_is_torch_chunked(fresh_registry):
    d = explain(DECODE, "cpu")
    assert d.chosen == "torch-chunked"
    assert {v.backend for v in d.verdicts} == set(fresh_registry.backends)


def test_every_backend_gets_a_verdict_with_a_reason_code(fresh_registry):
    for prof in ("sm90", "sm100", "mi300x", "xpu-pvc", "cpu"):
        d = explain(DECODE, prof)
        assert len(d.verdicts) == len(fresh_registry.backends)
        for v in d.verdicts:
            assert v.ok or (isinstance(v.reason, Reason) and v.message)


def test_plugin_registered_through_the_hook_is_discovered_ranked_and_explained(fresh_registry):
    rec = fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin", distribution="tests")
    assert rec.status == "loaded" and rec.backends == ("test-fast",)
    d = explain(DECODE, "cpu")
    assert d.chosen == "test-fast"
    assert "torch-ref" in d.runners_up
    # a shape it does not declare: rejected with the field, the value and the supported set
    d = explain(DECODE.model_copy(update={"k": 32}), "cpu")
    assert d.chosen == "torch-chunked"
    v = d.verdict("test-fast")
    assert v.reason == Reason.SHAPE and "K=32" in v.message and "16" in v.message
    # wrong vendor
    v = explain(DECODE, "sm90").verdict("test-fast")
    assert v.reason == Reason.DEVICE and "nvidia" in v.message


def test_plugin_with_wrong_api_version_is_rejected_not_loaded(fresh_registry):
    p = BackendPlugin(FastCpuDecode)
    p.LINATTN_API_VERSION = "99"
    rec = fresh_registry.add_plugin(p, name="future-plugin")
    assert rec.status == "api_version" and "test-fast" not in fresh_registry.backends
    d = explain(DECODE, "cpu")
    assert d.verdict("plugin:future-plugin").reason == Reason.API_VERSION
    assert d.chosen == "torch-chunked"


def test_predicate_that_raises_is_reported_and_skipped(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(RaisingPredicate), name="raising")
    d = explain(DECODE, "cpu")
    v = d.verdict("test-raises")
    assert v.reason == Reason.BACKEND_ERROR and "predicate exploded" in v.message
    assert d.chosen == "torch-chunked"


def test_duplicate_backend_name_is_a_load_failure(fresh_registry):
    class Dup(FastCpuDecode):
        name = "torch-ref"

    rec = fresh_registry.add_plugin(BackendPlugin(Dup), name="dup")
    assert rec.status == "plugin_load_failed" and "already registered" in rec.error
    assert type(fresh_registry.backends["torch-ref"]).__name__ == "TorchRefBackend"


def test_forced_ineligible_backend_raises_with_its_reasons(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin")
    sig = tuple(DECODE.model_copy(update={"k": 32}).model_dump().items())
    with pytest.raises(NoBackendError) as ei:
        select("gdn_decode", sig, torch.device("cpu"), backend="test-fast")
    msg = str(ei.value)
    assert "forced backend 'test-fast'" in msg and "[shape]" in msg and "K=32" in msg
    assert ei.value.decision.forced == "test-fast"


def test_forcing_an_unknown_backend_names_the_registered_ones(fresh_registry):
    with pytest.raises(ValueError, match="not registered.*torch-ref"):
        explain(DECODE, "cpu", backend="no-such-backend")


def test_policy_forces_and_disables_scoped_and_nested(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin")
    assert explain(DECODE, "cpu").chosen == "test-fast"
    with policy(decode="torch-ref"):
        d = explain(DECODE, "cpu")
        assert d.chosen == "torch-ref" and d.forced_by == "policy()"
        with policy(disable=["torch-ref"]):
            d = explain(DECODE, "cpu")
            assert d.chosen is None  # forced (outer) and disabled (inner): never a silent fallback
            assert d.verdict("torch-ref").reason == Reason.DISABLED
    with policy(disable=["test-fast"]):
        assert explain(DECODE, "cpu").chosen == "torch-chunked"
    assert explain(DECODE, "cpu").chosen == "test-fast"


def test_policy_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown key 'decoder'"):
        with policy(decoder="torch-ref"):
            pass
    with pytest.raises(ValueError, match="LINATTN_BACKEND"):
        parse_force("decoder=torch-ref", "LINATTN_BACKEND")


def test_op_key_beats_phase_key_beats_all():
    force = dict(parse_force("all=a,decode=b,gdn_decode=c", "x"))
    from linattn.dispatch.runtime.policy import Policy

    pol = Policy(force=tuple(sorted(force.items())))
    assert pol.forced_for("gdn_decode") == "c"
    assert pol.forced_for("kda_decode") == "b"
    assert pol.forced_for("gdn_prefill") == "a"


def test_env_vars_force_and_disable(fresh_registry, monkeypatch):
    fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin")
    monkeypatch.setenv("LINATTN_BACKEND", "decode=torch-ref")
    d = explain(DECODE, "cpu")
    assert d.chosen == "torch-ref" and d.forced_by == "env"
    monkeypatch.setenv("LINATTN_BACKEND", "")
    monkeypatch.setenv("LINATTN_DISABLE", "test-fast")
    assert explain(DECODE, "cpu").chosen == "torch-chunked"
    # a scoped policy beats the environment
    monkeypatch.setenv("LINATTN_DISABLE", "")
    monkeypatch.setenv("LINATTN_BACKEND", "torch-ref")
    with policy(decode="test-fast"):
        assert explain(DECODE, "cpu").chosen == "test-fast"


def test_cache_is_keyed_by_policy_and_hits_return_the_same_decision(fresh_registry):
    fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin")
    sig = tuple(DECODE.model_dump().items())
    cpu = torch.device("cpu")
    b1, d1 = select("gdn_decode", sig, cpu)
    b2, d2 = select("gdn_decode", sig, cpu)
    assert d1 is d2 and b1.name == "test-fast"
    with policy(decode="torch-ref"):
        b3, d3 = select("gdn_decode", sig, cpu)
        assert b3.name == "torch-ref" and d3 is not d1
    assert select("gdn_decode", sig, cpu)[1] is d1
    assert last_decision() is d1 and last_decision("gdn_decode") is d1


def test_first_choice_is_logged_once_with_runners_up(fresh_registry, caplog):
    fresh_registry.add_plugin(BackendPlugin(FastCpuDecode), name="test-plugin")
    sig = tuple(DECODE.model_dump().items())
    with caplog.at_level(logging.INFO, logger="linattn"):
        select("gdn_decode", sig, torch.device("cpu"))
        select("gdn_decode", sig, torch.device("cpu"))
    lines = [r.getMessage() for r in caplog.records if "gdn_decode" in r.getMessage()]
    assert len(lines) == 1 and "test-fast" in lines[0] and "torch-ref" in lines[0]


def test_nothing_fits_error_lists_every_backend(fresh_registry):
    with policy(disable=["torch-ref", "torch-chunked"]):
        sig = tuple(DECODE.model_dump().items())
        with pytest.raises(NoBackendError) as ei:
            select("gdn_decode", sig, torch.device("cpu"))
    msg = str(ei.value)
    for name in fresh_registry.backends:
        assert name in msg
    assert "problem:" in msg


def test_decision_serialises_to_json(fresh_registry):
    d = explain(DECODE, "sm90")
    again = type(d).model_validate_json(d.model_dump_json())
    assert again == d


def test_toolchain_missing_is_a_toolchain_rejection(fresh_registry):
    caps = profile("sm90").with_toolchain(triton=None)
    for name, b in fresh_registry.backends.items():
        if "triton" in b.requires and DECODE.op in b.ops:
            v = explain(DECODE, caps).verdict(name)
            assert v.reason == Reason.TOOLCHAIN and "triton" in v.message


def test_public_explain_accepts_an_op_name_and_shape():
    d = linattn.explain("gdn_decode", "cpu", n=8, h=16, hv=32, k=128, v=128)
    assert d.chosen is not None and d.problem.n == 8


def test_problem_rejects_missing_or_impossible_shapes():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="needs k >= 1"):
        Problem(op="gdn_decode", n=4096, h=16, hv=32, v=128)
    with pytest.raises(pydantic.ValidationError, match="multiple of h"):
        Problem(op="gdn_decode", n=1, h=3, hv=32, k=128, v=128)
    with pytest.raises(pydantic.ValidationError, match="n=0 sequences"):
        Problem(op="gdn_prefill", n=0, t=100, h=16, hv=32, k=128, v=128)
    with pytest.raises(pydantic.ValidationError, match="d >= 1"):
        Problem(op="silu_and_mul_clamp", n=4)


def test_device_strings_are_probed_and_unknown_names_list_the_profiles():
    from linattn.dispatch import resolve_device

    assert resolve_device("cpu").profile is None  # the real CPU, probed
    assert resolve_device("sm90").profile == "sm90"
    with pytest.raises(ValueError, match="sm90"):
        resolve_device("sm999")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")


def test_disabling_an_unknown_backend_is_logged(fresh_registry, caplog):
    with caplog.at_level(logging.WARNING, logger="linattn"):
        with policy(disable=["torch_ref_typo"]):
            d = explain(DECODE, "cpu")
    assert d.chosen == "torch-chunked"
    assert any("torch_ref_typo" in r.getMessage() and "not a registered backend" in r.getMessage()
               for r in caplog.records)


def test_policy_source_is_default_without_env(monkeypatch):
    from linattn.dispatch.runtime.policy import env_policy

    monkeypatch.delenv("LINATTN_BACKEND", raising=False)
    monkeypatch.delenv("LINATTN_DISABLE", raising=False)
    assert env_policy().source == "default"


def test_a_raising_device_probe_is_logged_and_skipped(fresh_registry, caplog):
    class BadProbe:
        LINATTN_API_VERSION = "1"

        @hookimpl
        def linattn_register_backends(self):
            return []

        @hookimpl
        def linattn_probe_device(self, device):
            raise RuntimeError("probe exploded")

    fresh_registry.add_plugin(BadProbe(), name="bad-probe")
    with caplog.at_level(logging.WARNING, logger="linattn"):
        assert fresh_registry.probe_device(torch.device("meta")) is None
    assert any("probe exploded" in r.getMessage() for r in caplog.records)
