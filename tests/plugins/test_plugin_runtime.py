"""Plugins at run time: registered through the pluggy hook, a predicate or a run that raises, a
device probe contributed by a plugin."""

import pytest
import torch

import linattn
from linattn.capabilities import profile
from linattn.dispatch import Problem, Reason, explain, get_registry
from linattn.dispatch.verdict import Check

from plugin_fakes import Plugin, RaisesInRun

CLAMP = Problem(op="silu_and_mul_clamp", n=4, d=8, dtype="float32", mode="none")


class FirstOnCpu(RaisesInRun):
    """Ranked first for the clamp on CPUs, and correct."""

    name = "first-on-cpu"

    def silu_and_mul_clamp(self, *, x, limit=None):
        from linattn.backends.torch_ref import silu_and_mul_clamp_ref

        return silu_and_mul_clamp_ref(x, limit)


class PredicateRaises(FirstOnCpu):
    name = "predicate-raises"

    def supports_shape(self, p, caps) -> Check:
        raise ZeroDivisionError("vendor shape table is empty")


class OtherVendor(FirstOnCpu):
    """Runs on a vendor linattn has no probe for ("other"), described by the plugin's probe."""

    name = "other-vendor"
    vendors = frozenset({"other"})


def test_plugin_added_through_the_hook_is_discovered_ranked_explained_and_run(registry):
    rec = registry.add_plugin(Plugin(FirstOnCpu), name="hook-plugin", distribution="tests", version="9")
    assert rec.status == "loaded" and rec.backends == ("first-on-cpu",)
    assert rec in linattn.list_plugins() and "first-on-cpu" in linattn.list_backends()
    d = explain(CLAMP, "cpu")
    assert d.chosen == "first-on-cpu" and d.runners_up[0] == "torch-ref"
    assert d.verdict("first-on-cpu").rank == 1
    out = linattn.silu_and_mul_clamp(torch.tensor([[20.0, -30.0]]), 10.0)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "first-on-cpu"
    assert torch.allclose(out, torch.tensor([[-99.9955]]), atol=1e-3)


def test_predicate_that_raises_is_backend_error_and_others_are_still_chosen(registry):
    registry.add_plugin(Plugin(PredicateRaises), name="raising", distribution="tests")
    d = explain(CLAMP, "cpu")
    v = d.verdict("predicate-raises")
    assert v.reason == Reason.BACKEND_ERROR and "ZeroDivisionError" in v.message and "shape table" in v.message
    assert d.chosen == "torch-ref"
    out = linattn.silu_and_mul_clamp(torch.randn(3, 8), 10.0)
    assert out.shape == (3, 4) and linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"


def test_run_that_raises_is_a_backend_run_error_then_backend_error(registry):
    registry.add_plugin(Plugin(RaisesInRun), name="crashy", distribution="vendor-crashy")
    assert explain(CLAMP, "cpu").chosen == "raises-in-run"
    x = torch.randn(4, 16)
    with pytest.raises(linattn.BackendRunError, match="raises-in-run.*crashy.*vendor kernel crashed"):
        linattn.silu_and_mul_clamp(x, 10.0)
    d = explain(CLAMP, "cpu")
    v = d.verdict("raises-in-run")
    assert v.reason == Reason.BACKEND_ERROR and "vendor kernel crashed" in v.message
    assert d.chosen == "torch-ref"
    # the next call is not retried on the broken backend: it runs the reference
    out = linattn.silu_and_mul_clamp(x, 10.0)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref" and out.shape == (4, 8)
    # and forcing the broken backend names why it is not eligible
    with pytest.raises(linattn.NoBackendError, match="backend_error"):
        linattn.silu_and_mul_clamp(x, 10.0, backend="raises-in-run")


def test_plugin_probe_describes_a_device_linattn_does_not_know(registry):
    def probe(device):
        if device.type == "meta":
            return profile("cpu").model_copy(update=dict(vendor="other", device_type="other", name="VendorChip 1"))
        return None

    registry.add_plugin(Plugin(OtherVendor, probe=probe), name="vendor-chip", distribution="tests")
    d = explain(CLAMP, torch.device("meta"))
    assert d.device == "VendorChip 1" and d.chosen == "other-vendor"
    assert explain(CLAMP, "cpu").verdict("other-vendor").reason == Reason.DEVICE
    assert get_registry().probe_device(torch.device("cpu")) is None  # no answer: linattn's own probe
