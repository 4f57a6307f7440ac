"""Provenance belongs to the registered instance, never to its class (issue 30, section 2): two
plugins that register the same backend class (or a subclass of it) each keep their own plugin,
distribution, version and API version; a first-release (API 1) backend is registered behind the
adapter that presents it through API 2, and its provenance is its own too."""

from __future__ import annotations

import pytest
import torch

from linattn.backends.base import FirstReleaseAdapter
from linattn.backends.torch_ref import TorchRefBackend
from linattn.dispatch.plugin.calls import make_call
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.rules.layouts import _PLANS, conform_inputs
from linattn.dispatch.runtime.registry import Registry

TAGS = ("plugin", "distribution", "version", "plugin_api_version")


class Shared(TorchRefBackend):
    """One class that several plugins register (a vendor library's backend, say)."""

    name = "shared"
    ops = frozenset({"silu_and_mul_clamp"})
    vendors = frozenset({"cpu"})


class SharedChild(Shared):
    """A subclass of it that another plugin registers under its own name."""

    name = "shared-child"


def _tags(backend) -> tuple:
    return tuple(getattr(backend, t) for t in TAGS)


def _add(reg: Registry, *classes, name: str, dist: str, version: str, api: str = "2"):
    rec = reg.add_plugin(BackendPlugin(*classes, api_version=api), name=name, distribution=dist, version=version)
    assert rec.status == "loaded", rec.error
    return rec


@pytest.mark.parametrize("api", ["1", "2"])
def test_two_plugins_registering_one_class_keep_their_own_provenance(api):
    first, second = Registry(), Registry()
    _add(first, Shared, name="vendor-a", dist="dist-a", version="1.0", api=api)
    _add(second, Shared, name="vendor-b", dist="dist-b", version="2.0", api=api)
    assert _tags(first.backends["shared"]) == ("vendor-a", "dist-a", "1.0", api)
    assert _tags(second.backends["shared"]) == ("vendor-b", "dist-b", "2.0", api)
    assert not set(TAGS) & set(vars(Shared))  # the class is never tagged
    assert first.backends["shared"].effective_api_version() == api


def test_a_subclass_registered_by_another_plugin_keeps_its_own_provenance():
    reg = Registry()
    _add(reg, Shared, name="vendor-a", dist="dist-a", version="1.0")
    _add(reg, SharedChild, name="vendor-b", dist="dist-b", version="2.0", api="1")
    assert _tags(reg.backends["shared"]) == ("vendor-a", "dist-a", "1.0", "2")
    assert _tags(reg.backends["shared-child"]) == ("vendor-b", "dist-b", "2.0", "1")
    assert not set(TAGS) & (set(vars(Shared)) | set(vars(SharedChild)))
    # an unregistered instance reports the class defaults, not the last registration
    assert _tags(SharedChild()) == ("linattn", "linattn", "", None)


def test_a_removed_plugins_backend_keeps_its_provenance_when_another_registers_the_class():
    reg = Registry()
    _add(reg, Shared, name="vendor-a", dist="dist-a", version="1.0")
    old = reg.backends["shared"]
    reg.remove_plugin("vendor-a")
    _add(reg, Shared, name="vendor-b", dist="dist-b", version="2.0", api="1")
    assert _tags(reg.backends["shared"]) == ("vendor-b", "dist-b", "2.0", "1")
    assert _tags(old) == ("vendor-a", "dist-a", "1.0", "2")  # a decision on the older snapshot still runs it


def test_an_api_1_backend_is_registered_behind_the_adapter():
    reg = Registry()
    _add(reg, Shared, name="vendor-a", dist="dist-a", version="1.0", api="1")
    b = reg.backends["shared"]
    assert type(b) is FirstReleaseAdapter and isinstance(b, Shared) and b.__class__ is Shared
    assert type(b.adapted) is Shared and b.adapted.own_phase_methods == frozenset()
    assert b.name == "shared" and b.ops == Shared.ops
    x = torch.randn(3, 8)
    want = TorchRefBackend().run("silu_and_mul_clamp", x=x, limit=None)
    for got in (b.run("silu_and_mul_clamp", x=x, limit=None), b.clamp(make_call("silu_and_mul_clamp", {"x": x})),
                b.execute(make_call("silu_and_mul_clamp", {"x": x}))):
        assert torch.equal(got, want)
    # a per-class cache keys the backend's class, not the adapter's
    conform_inputs("silu_and_mul_clamp", {"x": x, "limit": None}, b)
    assert ("silu_and_mul_clamp", Shared) in _PLANS and ("silu_and_mul_clamp", FirstReleaseAdapter) not in _PLANS


def test_an_unregistered_first_release_backend_runs_its_op_method_not_a_helper_named_like_a_phase():
    """A class that says ``api_version = "1"`` keeps API 1's one path outside the registry too (a
    plugin author's own unit test): ``run`` and ``execute`` reach the op method, never a method of
    its own that happens to be called ``clamp``."""
    from linattn.backends.base import Backend

    class V1(Backend):
        name = "v1-bare"
        api_version = "1"
        ops = frozenset({"silu_and_mul_clamp"})

        def clamp(self, *args, **kwargs):  # a helper, not API 2's phase method
            raise AssertionError("the helper named clamp ran")

        def silu_and_mul_clamp(self, x, **kwargs):
            return ("op method", x.shape)

    b = V1()
    assert b.own_phase_methods == frozenset()
    x = torch.zeros(2, 8)
    assert b.run("silu_and_mul_clamp", x=x) == ("op method", x.shape)
    call = make_call("silu_and_mul_clamp", {"x": x})
    assert b.execute(call) == ("op method", x.shape)
