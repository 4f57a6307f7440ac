"""A float64 token-serial oracle written from ops.md, independent of ``backends/torch_ref.py``.

Plain PyTorch in float64: one Python loop over tokens per sequence, the state held in the maths
layout ``S [HV, K, V]`` (the pool's ``"vk"`` slots are transposed on load and store), no
batching across sequences, no blocks. It reads every argument through PyTorch indexing (so views
are read by their strides) and never writes an argument: it returns what the op must produce and
what it may write.

Rules implemented (ops.md and docs/ops-decisions.md):

- gating: ``x = a + dt_bias``, softplus with ``beta`` and ``threshold``, ``g = -exp(A_log) *
  softplus`` (KDA bounded: ``g = lower_bound * sigmoid(exp(A_log) * x)``), floored at -1000;
  ``beta = sigmoid(b)``;
- recurrence: l2norm (eps 1e-6) and scale, ``S = exp(g) S``, ``u = beta (v - S^T k)``,
  ``S = S + k u^T``, ``o = S^T q``;
- decode load slot: ``idx[n]``; ``idx[n, 0]`` with a table; ``idx[n, nacc - 1]`` with
  ``num_accepted_tokens`` (``nacc = 0``: zero state, nothing read, padding status of column 0);
  negative load slot: padding (zero output, nothing read or written, no intermediate rows);
- decode stores: ``[N]``: final state to the load slot; table: state after token ``t`` to
  ``idx[n, t]`` when ``>= 0``; none with ``disable_state_update``; intermediate row
  ``inter_idx[n]`` (negative: skipped) receives the state after every token;
- prefill: pool mode reads ``h0`` from ``pool[idx[n]]`` and stores the final state there
  (negative index: padding; a zero-length sequence stores nothing, its slot keeps its bits);
  dense mode returns the final states (``initial_state`` or zeros for an empty sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

G_MIN = -1000.0
EPS = 1e-6
F64 = torch.float64


def _d(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if x is None else x.detach().to("cpu", F64)


def softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    bx = beta * x
    soft = torch.log1p(torch.exp(torch.clamp(bx, max=threshold))) / beta
    return torch.where(bx > threshold, x, soft)


def gdn_gates(A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):
    """(g, beta) in float64 for ``a, b [..., HV]``."""
    x = _d(a) + _d(dt_bias)
    g = -torch.exp(_d(A_log)) * softplus(x, softplus_beta, softplus_threshold)
    return torch.clamp(g, min=G_MIN), torch.sigmoid(_d(b))


def kda_gates(A_log, a, b, dt_bias, lower_bound=None, softplus_beta=1.0, softplus_threshold=20.0):
    """(g [..., HV, K], beta [..., HV]) in float64."""
    x = _d(a) + _d(dt_bias)
    rate = torch.exp(_d(A_log))[:, None]
    if lower_bound is not None:
        g = lower_bound * torch.sigmoid(rate * x)
    else:
        g = -rate * softplus(x, softplus_beta, softplus_threshold)
    return torch.clamp(g, min=G_MIN), torch.sigmoid(_d(b))


def silu_and_mul_clamp(x, limit=None):
    x = _d(x)
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    if limit is not None:
        gate = torch.clamp(gate, max=limit)
        up = torch.clamp(up, min=-limit, max=limit)
    return gate * torch.sigmoid(gate) * up


def _prep(x: torch.Tensor, hv: int, l2norm: bool, scale: Optional[float]) -> torch.Tensor:
    """``x [H, K]`` float64 -> ``[HV, K]`` (normalised, scaled, repeated over the GVA group)."""
    if l2norm:
        x = x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)
    if scale is not None:
        x = x * scale
    return x.repeat_interleave(hv // x.shape[0], dim=0)


def step(S: torch.Tensor, q, k, v, g, beta) -> torch.Tensor:
    """One token for all value heads: ``S [HV, K, V]`` updated in place; returns ``o [HV, V]``.
    ``q, k [HV, K]``, ``v [HV, V]``, ``g [HV]`` or ``[HV, K]``, ``beta [HV]``."""
    decay = torch.exp(torch.clamp(g, min=G_MIN))
    if decay.dim() == 1:
        S.mul_(decay[:, None, None])
    else:
        S.mul_(decay[:, :, None])
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
    S.add_(torch.einsum("hk,hv->hkv", k, u))
    return torch.einsum("hkv,hk->hv", S, q)


def to_maths(slot: torch.Tensor, layout: str) -> torch.Tensor:
    """A pool slot ``[HV, V, K]`` ("vk") or ``[HV, K, V]`` ("kv") as float64 ``[HV, K, V]``."""
    s = _d(slot)
    return (s.transpose(-1, -2) if layout == "vk" else s).clone()


def from_maths(S: torch.Tensor, layout: str) -> torch.Tensor:
    return S.transpose(-1, -2).clone() if layout == "vk" else S.clone()


@dataclass
class Expected:
    """What a call must produce: float64 outputs, the values of the written rows, the masks."""

    o: torch.Tensor  # decode [N, T, HV, V], prefill [T, HV, V]
    live_out: torch.Tensor  # bool over the output's leading dims: rows that are not padding
    pool_rows: dict = field(default_factory=dict)  # slot -> float64 slot contents (pool layout)
    inter_rows: dict = field(default_factory=dict)  # (row, step) -> float64 contents
    final: Optional[torch.Tensor] = None  # dense prefill: [N, HV, ...] in the pool layout
    read_slots: set = field(default_factory=set)  # slots whose contents the call reads


def decode(op: str, *, q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale=None,
           use_qk_l2norm=True, state_layout="vk", intermediate_states=None,
           intermediate_state_indices=None, disable_state_update=False, num_accepted_tokens=None,
           softplus_beta=1.0, softplus_threshold=20.0, lower_bound=None, g=None, beta=None,
           has_initial_state=None) -> Expected:
    N, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(N, T, HV, V, dtype=F64)
    live = torch.zeros(N, T, dtype=torch.bool)
    exp = Expected(o=o, live_out=live)
    if N == 0 or T == 0:
        return exp
    idx = state_indices.detach().cpu().long()
    table = idx.dim() == 2
    nacc = None if num_accepted_tokens is None else num_accepted_tokens.detach().cpu().long()
    if g is not None:  # precomputed gates: g floored where it is loaded, beta as given
        g_all, beta_all = torch.clamp(_d(g), min=G_MIN), _d(beta)
    elif op == "kda_decode":
        g_all, beta_all = kda_gates(A_log, a, b, dt_bias, lower_bound, softplus_beta, softplus_threshold)
    else:
        g_all, beta_all = gdn_gates(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    carry = None if has_initial_state is None else [bool(x) for x in has_initial_state.detach().cpu().tolist()]
    q64, k64, v64 = _d(q), _d(k), _d(v)
    irow = None
    if intermediate_states is not None:
        irow = (list(range(N)) if intermediate_state_indices is None
                else intermediate_state_indices.detach().cpu().long().tolist())
    for n in range(N):
        fresh = False
        if table:
            if nacc is not None:
                fresh = int(nacc[n]) == 0
                load = int(idx[n, 0]) if fresh else int(idx[n, int(nacc[n]) - 1])
            else:
                load = int(idx[n, 0])
        else:
            load = int(idx[n])
        if load < 0:
            continue  # padding
        live[n] = True
        if carry is not None and not carry[n]:
            fresh = True  # has_initial_state False: a zero state, the slot is not read
        if fresh:
            S = torch.zeros(HV, K, V, dtype=F64)
        else:
            S = to_maths(state_pool[load], state_layout)
            exp.read_slots.add(load)
        for t in range(T):
            qt = _prep(q64[n, t], HV, use_qk_l2norm, scale)
            kt = _prep(k64[n, t], HV, use_qk_l2norm, None)
            o[n, t] = step(S, qt, kt, v64[n, t], g_all[n, t], beta_all[n, t])
            if irow is not None and irow[n] >= 0:
                exp.inter_rows[(irow[n], t)] = from_maths(S, state_layout)
            if table and not disable_state_update and int(idx[n, t]) >= 0:
                exp.pool_rows[int(idx[n, t])] = from_maths(S, state_layout)
        if not table and not disable_state_update:
            exp.pool_rows[load] = from_maths(S, state_layout)
    return exp


def prefill(op: str, *, q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
            initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk",
            has_initial_state=None) -> Expected:
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    scale = K ** -0.5 if scale is None else scale
    cu = [int(c) for c in cu_seqlens.detach().cpu().tolist()]
    N = len(cu) - 1
    o = torch.zeros(T, HV, V, dtype=F64)
    live = torch.zeros(T, dtype=torch.bool)
    exp = Expected(o=o, live_out=live)
    pool_mode = state_pool is not None
    if not pool_mode:
        shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
        exp.final = _d(initial_state).clone() if initial_state is not None else torch.zeros(shape, dtype=F64)
    slots = state_indices.detach().cpu().long().tolist() if pool_mode else None
    carry = [True] * N if has_initial_state is None else [bool(x) for x in has_initial_state.detach().cpu().tolist()]
    q64, k64, v64, g64, b64 = _d(q), _d(k), _d(v), _d(g), _d(beta)
    for n in range(N):
        lo, hi = cu[n], cu[n + 1]
        if pool_mode and slots[n] < 0:
            continue  # padding: zero output, slot neither read nor written
        live[lo:hi] = True
        fresh = pool_mode and not carry[n]  # has_initial_state False: h0 = 0, the slot is not read
        if hi == lo:
            if fresh:  # an empty fresh sequence: its final state, the zero state, goes to its slot
                exp.pool_rows[slots[n]] = torch.zeros_like(to_maths(state_pool[slots[n]], "kv"))
            continue  # empty: final == initial (pool slot keeps its bits)
        if fresh:
            S = torch.zeros(HV, K, V, dtype=F64)
        elif pool_mode:
            S = to_maths(state_pool[slots[n]], state_layout)
            exp.read_slots.add(slots[n])
        elif initial_state is not None:
            S = to_maths(initial_state[n], state_layout)
        else:
            S = torch.zeros(HV, K, V, dtype=F64)
        for t in range(lo, hi):
            qt = _prep(q64[t], HV, use_qk_l2norm, scale)
            kt = _prep(k64[t], HV, use_qk_l2norm, None)
            o[t] = step(S, qt, kt, v64[t], g64[t], b64[t])
        if pool_mode:
            exp.pool_rows[slots[n]] = from_maths(S, state_layout)
        else:
            exp.final[n] = from_maths(S, state_layout)
    return exp


def decode_row_writes(kw: dict, n: int) -> tuple[bool, set, set]:
    """(row n is live, pool slots it writes, intermediate (row, step) entries it writes)."""
    idx = kw["state_indices"].detach().cpu().long()
    T = kw["q"].shape[1]
    nat = kw.get("num_accepted_tokens")
    if idx.dim() == 2:
        c = 0
        if nat is not None and int(nat[n]) > 0:
            c = int(nat[n]) - 1
        load = int(idx[n, c])
    else:
        load = int(idx[n])
    if load < 0 or T == 0:
        return False, set(), set()
    slots = set()
    if not kw.get("disable_state_update", False):
        slots = {int(s) for s in idx[n].reshape(-1).tolist() if s >= 0} if idx.dim() == 2 else {load}
    inter = set()
    if kw.get("intermediate_states") is not None:
        ii = kw.get("intermediate_state_indices")
        r = n if ii is None else int(ii[n])
        if r >= 0:
            inter = {(r, t) for t in range(T)}
    return True, slots, inter
