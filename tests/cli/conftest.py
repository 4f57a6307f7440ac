import pytest

from linattn.backends.base import Backend
from linattn.dispatch import reset_registry
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.runtime.registry import Registry


class NvidiaOnlyDecode(Backend):
    """A test backend that only runs on NVIDIA GPUs: ineligible on the CPU and its profile."""

    name = "test-nvidia-only"
    summary = "test backend (NVIDIA only)"
    ops = frozenset({"gdn_decode"})
    vendors = frozenset({"nvidia"})


@pytest.fixture
def nvidia_only_registry():
    """The built-ins plus the NVIDIA-only test backend (no entry-point plugins); restored afterwards."""
    reg = Registry().load(entry_points=False)
    reg.add_plugin(BackendPlugin(NvidiaOnlyDecode), name="test-plugin", distribution="linattn-tests", version="9.9")
    reset_registry(reg)
    yield reg
    reset_registry()
