import pytest

from linattn.dispatch import reset_registry
from linattn.dispatch.runtime.registry import Registry


@pytest.fixture
def fresh_registry():
    """A registry with the built-ins only (no entry points), restored afterwards."""
    reg = reset_registry(Registry().load(entry_points=False))
    yield reg
    reset_registry()
