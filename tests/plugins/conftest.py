import sys

import pytest

from linattn.dispatch import reset_registry


@pytest.fixture
def registry(monkeypatch):
    """The process registry reloaded from the real entry points (plugin env vars unset), and
    reloaded again afterwards so no test leaks a plugin into the next."""
    for var in ("LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS", "LINATTN_BACKEND", "LINATTN_DISABLE"):
        monkeypatch.delenv(var, raising=False)
    yield reset_registry()
    monkeypatch.undo()
    reset_registry()


@pytest.fixture
def site(tmp_path, monkeypatch, registry):
    """A fresh folder on sys.path for fake distributions; their modules are forgotten afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", "") or "").startswith(str(root)):
            del sys.modules[name]
