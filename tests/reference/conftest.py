"""Shared oracle for the reference-backend tests.

``naive`` is an independent, deliberately plain float64 form of ops.md's recurrence: Python
loops over value heads and tokens, the state in the maths layout ``S [K, V]`` (not the
backend's ``[V, K]``), no batching, no pools. The vectorised reference is checked against it.
"""

from __future__ import annotations

import types

import pytest
import torch

from linattn.testing.compare import rel_error_exact_zero as _rel


def _naive_recurrence(q, k, v, g, beta, S0=None, scale=None, use_qk_l2norm=True):
    """One sequence, token by token.

    Args: ``q, k [L, H, K]``, ``v [L, HV, V]``, ``g [L, HV]`` (GDN) or ``[L, HV, K]`` (KDA),
    ``beta [L, HV]``, ``S0 [HV, K, V]`` (maths layout) or None.
    Returns: ``o [L, HV, V]`` and ``states [L, HV, K, V]`` (the state after each token), float64.
    """
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    L, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(L, HV, V, dtype=torch.float64)
    states = torch.zeros(L, HV, K, V, dtype=torch.float64)
    for hv in range(HV):
        h = hv // (HV // H)
        S = torch.zeros(K, V, dtype=torch.float64) if S0 is None else S0[hv].double().clone()
        for t in range(L):
            qt, kt = q[t, h], k[t, h]
            if use_qk_l2norm:
                qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
            qt = qt * scale
            decay = torch.exp(g[t, hv])
            S = decay[:, None] * S if decay.dim() == 1 else decay * S
            u = beta[t, hv] * (v[t, hv] - S.T @ kt)
            S = S + torch.outer(kt, u)
            o[t, hv] = S.T @ qt
            states[t, hv] = S
    return o, states


def _vk(S_kv):
    """Maths layout ``[.., K, V]`` to the pool layout ``[.., V, K]``."""
    return S_kv.transpose(-1, -2)


@pytest.fixture
def naive():
    """The oracle: ``naive.recurrence``, ``naive.rel``, ``naive.vk``."""
    return types.SimpleNamespace(recurrence=_naive_recurrence, rel=_rel, vk=_vk)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
