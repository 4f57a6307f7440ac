"""Fixtures shared by the GPU tests."""

import pytest

import linattn


@pytest.fixture
def flashinfer_peer(monkeypatch):
    """FlashInfer importable and registered (``LINATTN_PEERS=all``), a fresh registry."""
    pytest.importorskip("flashinfer.gdn_prefill", reason="flashinfer-python does not import here")
    monkeypatch.setenv("LINATTN_PEERS", "all")
    linattn.dispatch.reset_registry()
    yield
    monkeypatch.undo()
    linattn.dispatch.reset_registry()
