"""linattn.compat.fla's four functions have fla-core 0.6.0's parameter lists (names, order, kinds,
defaults), read from the PyPI wheel's source with ``ast`` (nothing of FLA is imported; no GPU).

The wheel is fetched with ``pip download`` into a temporary directory; set ``LINATTN_FLA_WHEEL`` to
a local copy of ``fla_core-0.6.0-py3-none-any.whl`` to run offline. Skipped (with the reason) only
when PyPI cannot be reached."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import linattn.compat.fla as compat

FLA_FUNCTIONS = {
    "chunk_gated_delta_rule": "fla/ops/gated_delta_rule/chunk.py",
    "fused_recurrent_gated_delta_rule": "fla/ops/gated_delta_rule/fused_recurrent.py",
    "chunk_kda": "fla/ops/kda/chunk.py",
    "fused_recurrent_kda": "fla/ops/kda/fused_recurrent.py",
}
_NETWORK_ERRORS = ("Could not find a version", "No matching distribution", "NewConnectionError",
                   "Network is unreachable", "Temporary failure in name resolution", "ConnectTimeout",
                   "ReadTimeout", "Max retries exceeded", "ProxyError", "SSLError", "Connection refused")


@pytest.fixture(scope="module")
def fla_wheel(tmp_path_factory) -> Path:
    local = os.environ.get("LINATTN_FLA_WHEEL")
    if local:
        return Path(local)
    dest = tmp_path_factory.mktemp("fla_wheel")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", f"fla-core=={compat.FLA_VERSION}", "-d", str(dest)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("PyPI unreachable: `pip download fla-core==0.6.0` timed out after 180 s")
    wheels = sorted(dest.glob("fla_core-*.whl"))
    if res.returncode != 0 or not wheels:
        text = res.stdout + res.stderr
        if any(e in text for e in _NETWORK_ERRORS):
            pytest.skip(f"PyPI unreachable, cannot download fla-core {compat.FLA_VERSION}: {text.strip()[-300:]}")
        pytest.fail(f"pip download fla-core=={compat.FLA_VERSION} failed (rc {res.returncode}):\n{text}")
    return wheels[0]


def _fla_params(wheel: Path, path: str, name: str) -> list:
    """[(name, kind, default)] of FLA's ``def name`` in ``path``, defaults as Python values."""
    with zipfile.ZipFile(wheel) as zf:
        tree = ast.parse(zf.read(path).decode())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(defs) == 1, f"{name} not found exactly once at module level of {path}"
    a = defs[0].args
    out = []
    positional = [*a.posonlyargs, *a.args]
    pos_defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    for i, (arg, d) in enumerate(zip(positional, pos_defaults)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, d))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


def _our_params(name: str) -> list:
    sig = inspect.signature(getattr(compat, name))
    return [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]


def test_fla_version_pinned():
    assert compat.FLA_VERSION == "0.6.0"


@pytest.mark.parametrize("name", sorted(FLA_FUNCTIONS))
def test_parameter_list_matches_fla(fla_wheel, name):
    theirs = _fla_params(fla_wheel, FLA_FUNCTIONS[name], name)
    ours = _our_params(name)
    assert [p[0] for p in ours] == [p[0] for p in theirs], "names / order differ"
    assert ours == theirs, "kinds or defaults differ"


def test_wheel_is_the_pinned_release(fla_wheel):
    with zipfile.ZipFile(fla_wheel) as zf:
        meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta[0]).decode()
    assert f"Version: {compat.FLA_VERSION}" in text
