"""F47 (the compat part): errors from ``linattn.compat.fla`` speak the caller's ``[B, T, ...]`` shapes.

The fault: ``beta [B, T, HV, 1]`` was refused with linattn's flattened ``[T, HV]`` shape (``B * T``
rows), and a value error quoted a flattened position (``g[7, 1]`` for the caller's ``g[1, 2, 1]``).
The rule (docs/ops-decisions.md, "F47"): the compat layer checks every input's shape itself in FLA's
vocabulary before flattening (a ``[B, T, HV, 1]`` beta is refused with ``beta.squeeze(-1)`` as the
fix: fla-core 0.6.0's ``chunk_kda`` asserts ``[B, T, HV]`` and its recurrent kernel reads a 4-d beta
per value channel), and re-raises linattn's errors with positions in the caller's coordinates.
"""

from __future__ import annotations

import re

import pytest
import torch

import linattn.compat.fla as fla

B, T, H, HV, K, V = 2, 5, 1, 2, 16, 16
FUNCS = [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule, fla.chunk_kda, fla.fused_recurrent_kda]


def _inputs(fn) -> dict:
    gen = torch.Generator().manual_seed(0)
    gshape = (B, T, HV, K) if "kda" in fn.__name__ else (B, T, HV)
    return dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, HV, V, generator=gen), g=-torch.rand(gshape, generator=gen),
                beta=torch.rand(B, T, HV, generator=gen))


def _refusal(fn, **over) -> str:
    a = {**_inputs(fn), **over}
    with pytest.raises(ValueError) as info:
        fn(a.pop("q"), a.pop("k"), a.pop("v"), **a)
    return str(info.value)


@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_a_trailing_unit_beta_is_refused_in_the_callers_shape_with_the_fix(fn):
    msg = _refusal(fn, beta=torch.rand(B, T, HV, 1))
    assert f"beta must be [B, T, HV] = [{B}, {T}, {HV}], got [{B}, {T}, {HV}, 1]" in msg
    assert "beta.squeeze(-1)" in msg and fn.__name__ in msg
    assert f"[{B * T}, " not in msg  # never linattn's flattened [T, HV]


@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", ["g", "beta", "v", "k", "initial_state"])
def test_every_shape_refusal_names_the_callers_dims(fn, name):
    good = _inputs(fn)
    bad = {"g": good["g"][:, :-1], "beta": good["beta"][:, :, :1], "v": good["v"][:, :-1], "k": good["k"][..., :-1],
           "initial_state": torch.zeros(B, HV, K, V + 1)}[name]
    msg = _refusal(fn, **{name: bad})
    assert re.search(rf"{name} must be \[[BN], ", msg), msg
    assert f"got {list(bad.shape)}" in msg
    assert "state_pool" not in msg and "state_layout" not in msg  # linattn's names for the caller's state


@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_a_value_error_quotes_the_callers_position(fn):
    g = _inputs(fn)["g"].clone()
    g[1, 2, 1] = 0.5  # a log decay must be <= 0
    msg = _refusal(fn, g=g)
    assert re.search(r"g\[1, 2, 1(, \d+)?\] = 0\.5", msg), msg


def test_a_varlen_value_error_quotes_the_position_in_the_single_batch_row():
    a = _inputs(fla.chunk_gated_delta_rule)
    flat = {n: x.reshape(1, B * T, *x.shape[2:]) for n, x in a.items()}
    flat["g"][0, 7, 1] = 0.5
    with pytest.raises(ValueError, match=r"g\[0, 7, 1\] = 0\.5"):
        fla.chunk_gated_delta_rule(**flat, cu_seqlens=torch.tensor([0, 3, 10]))


@pytest.mark.parametrize("fn", [fla.fused_recurrent_gated_delta_rule, fla.fused_recurrent_kda],
                         ids=lambda f: f.__name__)
def test_a_per_value_channel_beta_stays_an_unimplemented_feature(fn):
    a = _inputs(fn)
    with pytest.raises(NotImplementedError, match=r"beta \[B, T, HV, V\]"):
        fn(a.pop("q"), a.pop("k"), a.pop("v"), g=a["g"], beta=torch.rand(B, T, HV, V))
