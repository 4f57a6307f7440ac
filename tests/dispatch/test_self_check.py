"""First-call self-checks on an architecture a backend's kernels were never verified on (issue 15
item 7, field case F32), driven on the CPU.

The backends here claim NVIDIA GPUs verified on ``sm_90`` only; their kernels are the reference's,
computed on the CPU (some deliberately wrong). Calls use CPU tensors while the dispatcher is told
the device is an ``sm100`` profile (``selection.resolve_device`` patched) whose Triton and CuTe DSL
are absent, so the built-in GPU backends are out (reason ``toolchain``) and torch-ref is the
fallback. Capture is simulated by patching ``selection.stream_capturing``.
"""

from __future__ import annotations

import logging

import pytest
import torch

import linattn
from linattn.backends.base import Backend
from linattn.backends.cutedsl import CuteDSLBackend
from linattn.backends.torch_ref import TorchRefBackend, gdn_decode_ref
from linattn.backends.triton_folded import TritonFoldedBackend
from linattn.backends.triton_split import TritonSplitBackend
from linattn.capabilities import DeviceCapabilities, profile
from linattn.dispatch import NoBackendError, Problem, Reason, explain, reset_registry
from linattn.dispatch.runtime import selection
from linattn.dispatch.runtime import self_check as sc
from linattn.dispatch.plugin import self_check_case
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.runtime.registry import Registry
from linattn.dispatch.rules.validate import validate
from linattn.testing import inputs

SM100 = profile("sm100").with_toolchain(triton=None, cutlass_dsl=None)  # only torch-ref and the fakes fit
N, T, H, HV, K, V, P = 3, 1, 2, 4, 16, 8, 6


class Claims90(TorchRefBackend):
    """NVIDIA only, verified on sm_90; correct kernels (the reference's, on the CPU). Counts."""

    name = "claims-sm90"
    ops = frozenset({"gdn_decode", "silu_and_mul_clamp"})
    vendors = frozenset({"nvidia"})
    verified_archs = frozenset({"sm_90"})
    events: list = []
    in_check = False

    def rank(self, p, caps) -> int:
        return 1

    def self_check(self, p, caps, device):
        type(self).events.append(("check", p.op, caps.arch, str(torch.device(device))))
        type(self).in_check = True
        try:
            return super().self_check(p, caps, device)
        finally:
            type(self).in_check = False

    def gdn_decode(self, **kw):
        type(self).events.append(("run", "in-check" if type(self).in_check else "user"))
        return super().gdn_decode(**kw)


class WrongOnSm100(Claims90):
    """Verified on sm_90 only; on this 'arch' its decode output is 5% off (a miscompile)."""

    name = "wrong-on-sm100"
    events: list = []

    def gdn_decode(self, **kw):
        type(self).events.append(("run", "in-check" if type(self).in_check else "user"))
        return TorchRefBackend.gdn_decode(self, **kw) * 1.05


class RaisesOnSm100(Claims90):
    """Verified on sm_90 only; its kernel raises here (an illegal instruction, say)."""

    name = "raises-on-sm100"
    events: list = []

    def gdn_decode(self, **kw):
        raise RuntimeError("CUDA error: an illegal instruction was encountered")


def _as_sm100(device):
    """What the patched dispatcher sees: the given capabilities, or the sm100 profile for any device."""
    return device if isinstance(device, DeviceCapabilities) else SM100


@pytest.fixture
def sim(monkeypatch):
    """Built-ins plus the fakes; the dispatcher sees the sm100 profile for CPU tensors."""
    for cls in (Claims90, WrongOnSm100, RaisesOnSm100):
        cls.events = []
    reg = Registry().load(entry_points=False)
    reg.add_plugin(BackendPlugin(Claims90, WrongOnSm100, RaisesOnSm100), name="sim", distribution="linattn-tests")
    reset_registry(reg)
    monkeypatch.setattr(selection, "resolve_device", _as_sm100)
    yield reg
    monkeypatch.undo()
    reset_registry()


def _only(*names):
    """A policy leaving exactly these fakes (the others disabled); torch-ref stays."""
    fakes = {"claims-sm90", "wrong-on-sm100", "raises-on-sm100"}
    return linattn.policy(disable=tuple(sorted(fakes - set(names))))


def _decode_inputs(seed=0, n=N):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(n, T, H, K), k=r(n, T, H, K), v=r(n, T, HV, V), a=r(n, T, HV), b=r(n, T, HV),
                A_log=r(HV) * 0.1, dt_bias=r(HV) * 0.1, state_pool=r(P, HV, V, K),
                state_indices=torch.tensor([4, -1, 0, 2, 5][:n]))


def _problem(**kw):
    return Problem(**dict(dict(op="gdn_decode", n=N, t=T, h=H, hv=HV, k=K, v=V, dtype="float32"), **kw))


# -- the claims and the rule ---------------------------------------------------------------------------

def test_builtins_claim_sm90_and_the_reference_and_plugins_claim_nothing():
    assert CuteDSLBackend.verified_archs == frozenset({"sm_90"})
    assert TritonSplitBackend.verified_archs == frozenset({"sm_90"})
    assert TritonFoldedBackend.verified_archs == frozenset({"sm_90"})
    assert TorchRefBackend.verified_archs is None and Backend.verified_archs is None


@pytest.mark.parametrize("backend,prof,needs", [
    (CuteDSLBackend(), "sm90", False), (CuteDSLBackend(), "sm100", True), (CuteDSLBackend(), "sm103", True),
    (TritonSplitBackend(), "sm90", False), (TritonSplitBackend(), "sm100", True),
    (TritonSplitBackend(), "sm120", True), (TritonFoldedBackend(), "mi300x", True),
    (TritonSplitBackend(), "cpu", False),  # the interpreter: covered by the test suite on any host
    (TorchRefBackend(), "sm100", False), (Backend(), "sm100", False)])
def test_a_self_check_is_needed_only_off_the_verified_archs_and_never_on_the_cpu(backend, prof, needs):
    assert backend.needs_self_check(_problem(), profile(prof)) is needs


def test_the_shape_class_is_what_the_kernels_specialise_on_never_the_batch_or_token_count():
    cls = sc.kernel_class
    assert cls(_problem(n=1)) == cls(_problem(n=4096)) == cls(_problem(t=3))
    p = Problem(op="gdn_prefill", n=1, t=100, h=16, hv=32, k=128, v=128)
    assert cls(p) == cls(p.model_copy(update={"n": 64, "t": 65536}))
    for change in ({"state_layout": "kv"}, {"state_dtype": "bfloat16"}, {"k": 64}, {"hv": 64},
                   {"mode": "dense"}, {"dtype": "float16"}):
        assert cls(p.model_copy(update=change)) != cls(p), change
    assert "intermediate_states" in cls(_problem(intermediate_states=True))
    assert cls(Problem(op="silu_and_mul_clamp", n=4, d=64, clamp_limit=True)) != cls(
        Problem(op="silu_and_mul_clamp", n=4, d=64))


# -- the default check, against real reference code -----------------------------------------------------

CLASSES = [
    dict(op="gdn_decode", dtype="float32"),
    dict(op="gdn_decode", dtype="bfloat16", state_layout="kv", t=3, intermediate_states=True),
    dict(op="kda_decode", dtype="float32", t=3, num_accepted_tokens=True, lower_bound=True),
    dict(op="kda_decode", dtype="bfloat16", state_dtype="bfloat16", t=2, disable_state_update=True),
    dict(op="gdn_prefill", dtype="bfloat16", mode="pool"),
    dict(op="kda_prefill", dtype="float32", mode="dense", state_layout="kv"),
    dict(op="gdn_gating", dtype="bfloat16", mode="none", h=1, k=0, v=0),
    dict(op="kda_gating", dtype="float32", mode="none", h=1, v=0, lower_bound=True),
    dict(op="silu_and_mul_clamp", dtype="bfloat16", mode="none", d=24, clamp_limit=True),
]


@pytest.mark.parametrize("spec", CLASSES, ids=lambda s: s["op"] + "-" + "-".join(f"{k}" for k in s if k != "op"))
def test_the_default_check_builds_a_case_of_the_problems_own_class_and_the_reference_passes_it(spec):
    p = _problem(**spec)
    tensors, opts = inputs.CASES[p.phase](p, self_check_case._gen(p), torch.device("cpu"))
    _, signature = validate(p.op, {**tensors, **opts})
    assert sc.kernel_class(Problem(**dict(signature))) == sc.kernel_class(p)  # the case is of the call's class
    check = sc.check_against_reference(TorchRefBackend(), p, "cpu")
    assert check.ok, check.message
    assert check.message  # the measured errors


class _Faulty(TorchRefBackend):
    fault = ""

    def gdn_decode(self, *, state_pool, **kw):
        o = super().gdn_decode(state_pool=state_pool, **kw)
        if self.fault == "scale":
            return o * 1.001  # 1e-3 off: beyond fp32's 1e-5
        if self.fault == "nan":
            o[0, 0, 0, 0] = float("nan")
        if self.fault == "stray-row":
            state_pool[1] += 1.0  # row 1 is named by nobody in the case
        if self.fault == "padding":
            o[1] = 1.0  # row 1 of the case is padding
        return o


@pytest.mark.parametrize("fault,needle", [("scale", "o: relative error"), ("nan", "o: not finite"),
                                          ("stray-row", "pool rows [1] changed"),
                                          ("padding", "padding rows (slot -1) must be exactly zero")])
def test_the_default_check_catches_what_a_miscompiled_kernel_does(fault, needle):
    b = _Faulty()
    b.fault = fault
    check = sc.check_against_reference(b, _problem(), "cpu")
    assert not check.ok and check.reason == Reason.SELF_CHECK_FAILED
    assert needle in check.message


# -- through the dispatcher ------------------------------------------------------------------------------

def test_a_failed_check_disables_the_backend_logs_a_warning_and_the_call_falls_back(sim, caplog):
    x = _decode_inputs()
    pool0 = x["state_pool"].clone()
    with _only("wrong-on-sm100"), caplog.at_level(logging.WARNING, logger="linattn"):
        o = linattn.gdn_decode(**x)
        d = linattn.last_decision("gdn_decode")
    # the fake checked itself before any user data, failed, and never ran on the user's tensors
    assert WrongOnSm100.events == [("check", "gdn_decode", "sm_100", "cpu"), ("run", "in-check")]
    v = d.verdict("wrong-on-sm100")
    assert not v.ok and v.reason == Reason.SELF_CHECK_FAILED
    assert "failed on sm_100" in v.message and "o: relative error" in v.message and v.hint
    assert d.chosen == "torch-ref"
    warn = [r for r in caplog.records if r.levelno == logging.WARNING and "wrong-on-sm100" in r.getMessage()]
    assert len(warn) == 1 and "self_check_failed" in warn[0].getMessage() and "sm_100" in warn[0].getMessage()
    # the result is the fallback's, and correct
    ref_pool = pool0.double()
    ref = gdn_decode_ref(**{k: t.double() if t.is_floating_point() else t for k, t in x.items() if k != "state_pool"},
                         state_pool=ref_pool, compute_dtype=torch.float64)
    assert (o.double() - ref).norm() / ref.norm() < 1e-5
    assert (x["state_pool"].double() - ref_pool).norm() / ref_pool.norm() < 1e-5
    # later calls (another batch size: same shape class) show the reason; no second check
    with _only("wrong-on-sm100"):
        linattn.gdn_decode(**_decode_inputs(1, n=5))
        again = linattn.last_decision("gdn_decode")
        assert again.verdict("wrong-on-sm100").reason == Reason.SELF_CHECK_FAILED and again.chosen == "torch-ref"
        assert explain(_problem(n=64), SM100).verdict("wrong-on-sm100").reason == Reason.SELF_CHECK_FAILED
    assert [e for e in WrongOnSm100.events if e[0] == "check"] == [("check", "gdn_decode", "sm_100", "cpu")]
    assert sc.results()[0].ok is False and sc.results()[0].backend == "wrong-on-sm100"


def test_a_raising_kernel_is_a_failed_check_and_the_call_still_succeeds(sim, caplog):
    x = _decode_inputs()
    with _only("raises-on-sm100"), caplog.at_level(logging.WARNING, logger="linattn"):
        linattn.gdn_decode(**x)
        v = linattn.last_decision("gdn_decode").verdict("raises-on-sm100")
    assert v.reason == Reason.SELF_CHECK_FAILED and "raised RuntimeError: CUDA error: an illegal instruction" in v.message
    assert any("raises-on-sm100" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_passing_check_runs_once_per_shape_class_and_the_backend_is_used(sim):
    with _only("claims-sm90"):
        assert explain(_problem(), SM100).verdict("claims-sm90").verified is False
        o = linattn.gdn_decode(**_decode_inputs())
        d = linattn.last_decision("gdn_decode")
        assert d.chosen == "claims-sm90"
        v = d.verdict("claims-sm90")
        assert v.ok and v.verified and "self-checked against torch-ref on sm_100" in v.message
        assert Claims90.events == [("check", "gdn_decode", "sm_100", "cpu"), ("run", "in-check"), ("run", "user")]
        assert o.shape == (N, T, HV, V)
        for n in (1, 5):  # other batch sizes: the same class, no new check
            linattn.gdn_decode(**_decode_inputs(2, n=n))
        x = _decode_inputs(3)  # another class (state layout kv): checked once more
        x["state_pool"] = x["state_pool"].transpose(-1, -2).contiguous()
        linattn.gdn_decode(**x, state_layout="kv")
        linattn.gdn_decode(**x, state_layout="kv")
    checks = [e for e in Claims90.events if e[0] == "check"]
    assert len(checks) == 2
    assert [e for e in Claims90.events if e == ("run", "user")] == [("run", "user")] * 5
    assert {(r.backend, r.ok) for r in sc.results()} == {("claims-sm90", True)}
    assert explain(_problem(), SM100).verdict("claims-sm90").verified is True


def test_another_op_of_the_same_backend_is_checked_on_its_own(sim):
    with _only("claims-sm90"):
        linattn.gdn_decode(**_decode_inputs())
        linattn.silu_and_mul_clamp(torch.randn(4, 16), 10.0)
        assert linattn.last_decision("silu_and_mul_clamp").chosen == "claims-sm90"
    assert [e[1] for e in Claims90.events if e[0] == "check"] == ["gdn_decode", "silu_and_mul_clamp"]


def test_in_capture_an_unchecked_backend_is_rejected_with_its_reason_and_nothing_syncs(sim, monkeypatch):
    monkeypatch.setattr(selection, "stream_capturing", lambda device: True)
    with _only("claims-sm90"):
        linattn.gdn_decode(**_decode_inputs(), validate=False)
        d = linattn.last_decision("gdn_decode")
    v = d.verdict("claims-sm90")
    assert not v.ok and v.reason == Reason.UNVERIFIED
    assert "not yet self-checked on sm_100" in v.message and "eager call" in v.hint
    assert d.chosen == "torch-ref" and d.capturing
    assert Claims90.events == []  # no self-check (it would sync) during capture
    # one eager call checks it; a later capture then chooses it
    monkeypatch.setattr(selection, "stream_capturing", lambda device: False)
    with _only("claims-sm90"):
        linattn.gdn_decode(**_decode_inputs())
        assert linattn.last_decision("gdn_decode").chosen == "claims-sm90"
    monkeypatch.setattr(selection, "stream_capturing", lambda device: True)
    with _only("claims-sm90"):
        linattn.gdn_decode(**_decode_inputs(), validate=False)
        d = linattn.last_decision("gdn_decode")
    assert d.chosen == "claims-sm90" and d.capturing and d.verdict("claims-sm90").verified
    assert len([e for e in Claims90.events if e[0] == "check"]) == 1


def test_the_capture_state_is_part_of_the_decision_cache_key(sim, monkeypatch):
    sig = validate("gdn_decode", _decode_inputs())[1]
    dev = torch.device("cpu")
    with _only("claims-sm90"):
        monkeypatch.setattr(selection, "stream_capturing", lambda device: True)
        impl_c, d_c = selection.select("gdn_decode", sig, dev)
        assert selection.select("gdn_decode", sig, dev)[1] is d_c  # a hit
        monkeypatch.setattr(selection, "stream_capturing", lambda device: False)
        impl_e, d_e = selection.select("gdn_decode", sig, dev)
        monkeypatch.setattr(selection, "stream_capturing", lambda device: True)
        impl_c2, d_c2 = selection.select("gdn_decode", sig, dev)
    assert (impl_c.name, d_c.capturing) == ("torch-ref", True)  # unchecked in capture
    assert (impl_e.name, d_e.capturing) == ("claims-sm90", False)  # the capture decision was not reused
    assert (impl_c2.name, d_c2.capturing) == ("claims-sm90", True)  # nor the stale one after the check
    entries = [e for e in selection.dispatcher().cached_decisions() if e.decision.problem.op == "gdn_decode"]
    assert sorted(e.capturing for e in entries) == [False, True]


def test_a_forced_backend_that_fails_its_check_raises_with_the_reason(sim):
    x = _decode_inputs()
    before = x["state_pool"].clone()
    with pytest.raises(NoBackendError, match="self_check_failed") as e:
        linattn.gdn_decode(**x, backend="wrong-on-sm100")
    assert e.value.decision.verdict("wrong-on-sm100").reason == Reason.SELF_CHECK_FAILED
    assert torch.equal(x["state_pool"], before)  # the user's pool was never touched


def test_explain_never_runs_a_check_and_marks_the_verdict_unverified(sim):
    d = explain(_problem(), SM100, policy=None)
    for name in ("claims-sm90", "wrong-on-sm100", "raises-on-sm100"):
        v = d.verdict(name)
        assert v.ok and v.verified is False and v.message.startswith("unverified on sm_100")
    assert d.verdict("torch-ref").verified is True
    assert "unverified here" in d.summary()
    assert all(not cls.events for cls in (Claims90, WrongOnSm100, RaisesOnSm100))
    on90 = explain(_problem(), profile("sm90").with_toolchain(triton=None, cutlass_dsl=None))
    assert on90.verdict("claims-sm90").verified is True and on90.verdict("claims-sm90").message == ""


def test_clearing_the_cache_forgets_the_results(sim):
    with _only("wrong-on-sm100"):
        linattn.gdn_decode(**_decode_inputs())
    assert sc.results()
    selection.clear_cache()
    assert sc.results() == []
    assert explain(_problem(), SM100).verdict("wrong-on-sm100").verified is False


class CallsItself(Claims90):
    """A plugin whose self-check runs its own op through the public API (must not deadlock)."""

    name = "calls-itself"
    events: list = []

    def self_check(self, p, caps, device):
        out = linattn.silu_and_mul_clamp(torch.ones(2, 4), backend=self.name)
        from linattn.dispatch import Check

        return Check.passed(f"inner call gave {tuple(out.shape)}")


def test_a_self_check_that_calls_its_own_op_completes(monkeypatch):
    reg = Registry().load(entry_points=False)
    reg.add_plugin(BackendPlugin(CallsItself), name="sim2", distribution="linattn-tests")
    reset_registry(reg)
    monkeypatch.setattr(selection, "resolve_device", _as_sm100)
    try:
        linattn.silu_and_mul_clamp(torch.ones(3, 4))
        d = linattn.last_decision("silu_and_mul_clamp")
        assert d.chosen == "calls-itself" and d.verdict("calls-itself").verified
        assert sc.results()[0].message == "inner call gave (2, 2)"
    finally:
        monkeypatch.undo()
        reset_registry()
