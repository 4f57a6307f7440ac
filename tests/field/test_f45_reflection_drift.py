"""Field case F45: fp32 prefill with ``beta = 2`` and ``g = 0`` (a reflection every token, nothing forgotten).

The fp32 rounding stays in the state and the relative error against float64 grows as ``sqrt(T)``;
docs/ops.md ("Known limit: fp32 with beta = 2 and no decay", anchor ``reflection-drift``) documents the
bound ``C * u * sqrt(T)`` (``u = 2^-24``; ``C = 2`` for torch-ref, ``8`` for cpu-chunked and torch-chunked). These
tests hold the three CPU backends to it at T = 1024 (where the worst measured ratio is 1.3, 5.0 and 4.1) and pin the
growth as a square root, not linear, between T = 64 and T = 1024.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import linattn
from linattn.testing.compare import rel_error_exact_zero as _rel

U = 2.0 ** -24
#: docs/ops.md's constants of the bound, per backend
C = {"torch-ref": 2.0, "cpu-chunked": 8.0, "torch-chunked": 8.0}
K = V = 8  # the worst head size measured (larger heads drift less)


def reflection_inputs(T: int, family: str, seed: int = 0) -> dict:
    """One sequence, H = 1, HV = 2: random q, k, v ``[T, ., 8]`` fp32, ``g = 0`` (``[T, 2]``, KDA
    ``[T, 2, 8]``), ``beta = 2`` ``[T, 2]``, ``cu_seqlens = [0, T]``."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(T, 1, K, generator=gen) for _ in range(2))
    v = torch.randn(T, 2, V, generator=gen)
    g = torch.zeros(T, 2, K) if family == "kda" else torch.zeros(T, 2)
    return dict(q=q, k=k, v=v, g=g, beta=torch.full((T, 2), 2.0), cu_seqlens=torch.tensor([0, T]))


def errors(family: str, backend: str, T: int) -> float:
    """The larger of the output's and the final state's relative error against float64 torch-ref."""
    x = reflection_inputs(T, family)
    fn = getattr(linattn, f"{family}_prefill")
    with torch.no_grad():
        ro, rf = fn(**{k: t.double() if t.is_floating_point() else t for k, t in x.items()}, backend="torch-ref")
        o, f = fn(**x, backend=backend)
    return max(_rel(o, ro), _rel(f, rf))


def _available(backend: str) -> None:
    if backend not in linattn.list_backends():
        pytest.skip(f"{backend} is not installed")


@pytest.mark.parametrize("backend", sorted(C))
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_f45_fp32_reflection_error_stays_under_the_documented_bound(family, backend):
    _available(backend)
    T = 1024
    e = errors(family, backend, T)
    assert e <= C[backend] * U * math.sqrt(T), f"{backend} {family}: {e:.2e} > {C[backend]} u sqrt({T})"


@pytest.mark.parametrize("backend", sorted(C))
def test_f45_error_grows_as_a_square_root_not_linearly(backend):
    """16x the tokens: about 4x the error (sqrt); a linear drift would give about 16x."""
    _available(backend)
    ratio = errors("gdn", backend, 1024) / errors("gdn", backend, 64)
    assert ratio < 8.0, f"{backend}: error grew {ratio:.1f}x for 16x the tokens"


def test_f45_docs_state_the_bound_the_tests_hold():
    text = (Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text()
    assert 'id="reflection-drift"' in text
    line = re.search(r"rel_error\(T\) <= C \* u \* sqrt\(T\)\s+C = (\S+) \(torch-ref\),\s+C = (\S+) \(cpu-chunked\),"
                     r"\s+C = (\S+) \(torch-chunked\)", text)
    assert line and tuple(map(float, line.groups())) == (C["torch-ref"], C["cpu-chunked"], C["torch-chunked"])
