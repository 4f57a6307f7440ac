"""The reference maths: docs/ops.md written as token-serial PyTorch.

Every backend is tested against the functions here; the ``torch-ref`` backend
(``backends/torch_ref.py``, which re-exports them) runs them, and the self-checks (the dispatcher's,
the CuTe DSL sign-off) and the seeded input builders (:mod:`linattn.testing.inputs`) call them
directly. Torch and :mod:`linattn.precision` only: every layer of linattn may import this module. They follow docs/ops.md literally:

```
x        = a + dt_bias
softplus = x if softplus_beta * x > softplus_threshold else log1p(exp(softplus_beta * x)) / softplus_beta
g        = -exp(A_log) * softplus          (KDA bounded gate: g = lower_bound * sigmoid(exp(A_log) * x))
beta     = sigmoid(b)
q, k     = l2norm(q), l2norm(k)            (l2norm(x) = x / sqrt(sum(x^2) + 1e-6))
q        = q * scale
S        = exp(g) * S                      (KDA: per key channel)
u        = beta * (v - S^T k)
S        = S + k u^T
o        = S^T q
```

Sources: Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(ICLR 2025) for GDN; the Kimi Linear technical report (2025) for KDA's per-channel gate.

Numerics. ``compute_dtype=torch.float32`` (the default) accumulates the state token by token in
fp32, like a recurrent kernel; ``compute_dtype=torch.float64`` is the oracle mode of the tests.
Inputs are upcast once, outputs are cast once to q's dtype; a state is cast to its storage dtype
once, when it is stored (an fp32 pool is never round-tripped through 16 bits).

Work is vectorised over sequences and value heads; only the time axis is a Python loop (varlen
prefill sorts the sequences longest first, so the ones still running at step ``t`` are a prefix
of the batch). Rows are processed in blocks of about :data:`BLOCK_BYTES` of state, which stay in
the CPU's caches across their tokens; rows of one call never share a slot (the validation layer
rejects that), so blocks are independent. The state is held as ``[B, HV, V, K]`` (K contiguous)
while computed; ``state_layout="kv"`` pools (``[P, HV, K, V]``) are transposed on load and store.
Strided inputs are copied contiguous once, so a view gives the same bits as its ``.contiguous()``.

Decisions where docs/ops.md is silent (pinned by ``tests/reference``):

- ``g`` is floored at :data:`G_MIN` (-1000). ``exp(-1000)`` is 0 in float32 and float64, so the
  decay is unchanged, but ``g`` stays finite: ``exp(A_log) = inf`` with ``softplus > 0`` gives
  ``g = -1000`` (full decay), never ``-inf`` (a chunked form would compute ``-inf - -inf``).
  A zero factor (``softplus = 0``, ``exp(A_log) = 0``) gives ``g = 0``, never ``0 * inf``. The
  bounded KDA gate reads ``exp(A_log) * 0`` as 0.
- Decode with a per-token slot table ``state_indices [N, T]``: the *load slot* of row ``n`` is
  ``state_indices[n, num_accepted_tokens[n] - 1]`` (``state_indices[n, 0]`` without
  ``num_accepted_tokens``). ``num_accepted_tokens[n] == 0`` means "no cached state": the row
  starts from a zero state and reads nothing from the pool; its load slot for the padding rule
  is ``state_indices[n, 0]``. A row whose load slot is negative is padding: zero output, and
  neither the pool nor ``intermediate_states`` is read or written for it.
- ``intermediate_state_indices=None`` with ``intermediate_states`` given means row ``n`` of the
  batch writes row ``n`` of the buffer.
- Prefill in pool mode with a negative ``state_indices[n]``: sequence ``n`` is padding (its
  tokens' outputs are zero; the pool is untouched for it).
- Dense prefill returns a final state in ``initial_state``'s dtype, or, without an initial
  state, in float32 (float64 when ``compute_dtype`` is float64).
"""

from __future__ import annotations

import bisect
from typing import Optional

import torch
import torch.nn.functional as F

from linattn.precision import pinned_fp32_matmul  # IEEE fp32 matmuls whatever the caller's flags (F36)

#: Floor of the log-space decay ``g`` in every backend (docs/ops-decisions.md): ``exp(G_MIN)`` is 0
#: in float32 and float64, so flooring changes no result and keeps chunked forms free of ``-inf``.
#: (The Triton and CuTe DSL kernels read it through ``linattn.kernels.triton.limits``.)
G_MIN = -1000.0

L2NORM_EPS = 1e-6

__all__ = [
    "G_MIN", "L2NORM_EPS", "gdn_gating_ref", "kda_gating_ref", "l2norm_ref", "gdn_decode_ref", "kda_decode_ref",
    "gdn_prefill_ref", "kda_prefill_ref", "silu_and_mul_clamp_ref", "seq_lengths", "store_empty_sequences",
]


def _up(x: torch.Tensor, cd) -> torch.Tensor:
    """Upcast to the compute dtype as a contiguous tensor: PyTorch's CPU kernels may round
    differently on strided and contiguous data, and a strided view must give the same bits."""
    return x.to(cd).contiguous()


# -- gating -------------------------------------------------------------------------------------

def _softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    bx = beta * x
    # the clamp only keeps the branch that torch.where discards from overflowing
    soft = torch.log1p(torch.exp(torch.clamp(bx, max=threshold))) / beta
    return torch.where(bx > threshold, x, soft)


def _times_rate(rate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``rate * x`` where a zero factor wins over an infinite one (``inf * 0 = 0``)."""
    prod = rate * x
    return torch.where((rate == 0) | (x == 0), torch.zeros_like(prod), prod)


def _gate(A_log, a, dt_bias, lower_bound, softplus_beta, softplus_threshold, cd, per_channel):
    x = _up(a, cd) + _up(dt_bias, cd)
    rate = torch.exp(_up(A_log, cd))
    if per_channel:
        rate = rate.unsqueeze(-1)  # [HV, 1] against x [..., HV, K]
    if lower_bound is not None:
        g = lower_bound * torch.sigmoid(_times_rate(rate, x))
    else:
        g = -_times_rate(rate, _softplus(x, softplus_beta, softplus_threshold))
    return torch.clamp(g, min=G_MIN)


def gdn_gating_ref(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                   softplus_beta: float = 1.0, softplus_threshold: float = 20.0, *,
                   compute_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN gates from the raw projections (docs/ops.md, "Gating").

    Args:
        A_log: ``[HV]``, any float dtype.
        a: ``[..., HV]`` raw decay projection (e.g. ``[T, HV]`` or ``[N, T, HV]``); may be strided.
        b: ``[..., HV]`` raw beta projection.
        dt_bias: ``[HV]``.
        softplus_beta, softplus_threshold: the softplus parameters (``> 0``; docs/ops.md: 1.0, 20.0).
        compute_dtype: float32 (the op's contract) or float64 (oracle mode).

    Returns:
        ``(g, beta)``, both ``[..., HV]`` in ``compute_dtype``: ``g = -exp(A_log) * softplus(a +
        dt_bias)`` floored at :data:`G_MIN` (never NaN or inf for finite inputs) and
        ``beta = sigmoid(b)``.

    Example:
        >>> g, beta = gdn_gating_ref(torch.zeros(2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2))
        >>> round(float(g[0, 0]), 6), float(beta[0, 0])
        (-0.693147, 0.5)
    """
    g = _gate(A_log, a, dt_bias, None, softplus_beta, softplus_threshold, compute_dtype, False)
    return g, torch.sigmoid(_up(b, compute_dtype))


def kda_gating_ref(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                   lower_bound: Optional[float] = None, softplus_beta: float = 1.0,
                   softplus_threshold: float = 20.0, *,
                   compute_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA gates: one decay per key channel (docs/ops.md, "Gating"; Kimi Linear report).

    Args:
        A_log: ``[HV]``.
        a: ``[..., HV, K]`` raw per-channel decay projection.
        b: ``[..., HV]``.
        dt_bias: ``[HV, K]``.
        lower_bound: None for the softplus gate; a negative float (e.g. -5.0) for the bounded gate
            ``g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``.
        softplus_beta, softplus_threshold: as in :func:`gdn_gating_ref`.
        compute_dtype: float32 or float64.

    Returns:
        ``(g [..., HV, K], beta [..., HV])`` in ``compute_dtype``, ``g`` floored at :data:`G_MIN`.

    Example:
        >>> g, _ = kda_gating_ref(torch.zeros(1), torch.zeros(1, 1, 2), torch.zeros(1, 1),
        ...                       torch.zeros(1, 2), lower_bound=-5.0)
        >>> g.tolist()
        [[[-2.5, -2.5]]]
    """
    g = _gate(A_log, a, dt_bias, lower_bound, softplus_beta, softplus_threshold, compute_dtype, True)
    return g, torch.sigmoid(_up(b, compute_dtype))


# -- the recurrence -----------------------------------------------------------------------------

#: Rows whose largest magnitude is at least ``2 ** L2NORM_SAFE_LOG2`` are scaled before squaring (F44).
L2NORM_SAFE_LOG2 = 32


def l2norm_ref(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last dim (docs/ops.md, "l2norm"), without overflow.

    A row with ``max|x| >= 2**32`` is first multiplied by the power of two ``s`` that brings its
    ``max|x|`` into ``[2**31, 2**32)``, and ``n(x) = (s x) / sqrt(sum((s x)^2) + s^2 eps)``, the same
    value exactly; every other row has ``s = 1``: the plain formula, bit for bit. Squaring an
    unscaled fp32 row of magnitude 1.8e19 or more would overflow and normalise it to 0 (F44).
    """
    m = x.abs().amax(-1, keepdim=True)
    e = torch.frexp(m).exponent  # max|x| = f * 2**e, f in [0.5, 1)
    s = torch.ldexp(torch.ones_like(m), -(e - L2NORM_SAFE_LOG2).clamp(min=0))
    y = x * s
    return y / torch.sqrt((y * y).sum(-1, keepdim=True) + L2NORM_EPS * s * s)


def _prep_qk(x: torch.Tensor, hv: int, scale: Optional[float], l2norm: bool, cd) -> torch.Tensor:
    """Upcast, l2-normalise, scale and expand ``[..., H, K]`` to the value heads (GVA)."""
    x = _up(x, cd)
    if l2norm:
        x = l2norm_ref(x)
    if scale is not None:
        x = x * scale
    h = x.shape[-2]
    if hv != h:
        x = x.repeat_interleave(hv // h, dim=-2)  # value head hv reads q/k head hv // (HV // H)
    return x


def _step_(S: torch.Tensor, q, k, v, decay, beta) -> torch.Tensor:
    """One token for a batch, in place on a contiguous ``S [B, HV, V, K]``; returns ``o [B, HV, V]``.

    ``q, k [B, HV, K]``, ``v [B, HV, V]``, ``decay = exp(g)`` ``[B, HV]`` (GDN) or
    ``[B, HV, K]`` (KDA), ``beta [B, HV]``. The products are written as ``k^T S^T`` and a
    rank-1 ``baddbmm_``: the forms that are fast on the CPU (row-vector gemm, no temporaries).
    """
    B, HV, V, K = S.shape
    if decay.dim() == 2:
        S.mul_(decay[:, :, None, None])  # S = exp(g) * S
    else:
        S.mul_(decay[:, :, None, :])  # KDA: diag(exp(g)) S, per key channel
    St = S.transpose(-1, -2)
    sk = torch.matmul(k.unsqueeze(-2), St).squeeze(-2)  # S^T k  [B, HV, V]
    u = beta.unsqueeze(-1) * (v - sk)
    S.view(B * HV, V, K).baddbmm_(u.reshape(B * HV, V, 1), k.reshape(B * HV, 1, K))  # S += k u^T
    return torch.matmul(q.unsqueeze(-2), St).squeeze(-2)  # o = S^T q


def _to_vk(state: torch.Tensor, layout: str) -> torch.Tensor:
    return state if layout == "vk" else state.transpose(-1, -2)


def _from_vk(S: torch.Tensor, layout: str) -> torch.Tensor:
    return S if layout == "vk" else S.transpose(-1, -2)


def _load(S: torch.Tensor, states: torch.Tensor, rows: list, layout: str) -> None:
    """``S[j] = states[rows[j]]`` (``S [B, HV, V, K]`` in the compute dtype); a row None is zeroed.

    One ``copy_`` per row: it reads only the named rows, through any strides, and upcasts as it
    copies (cheaper on the CPU than an index kernel for rows of megabytes).
    """
    for j, r in enumerate(rows):
        if r is None:
            S[j].zero_()
        else:
            S[j].copy_(_to_vk(states[r], layout))


def _store(states: torch.Tensor, rows: list, S: torch.Tensor, layout: str) -> None:
    """``states[rows[j]] = S[j]`` in place, cast once to the storage dtype; a negative row is skipped."""
    for j, r in enumerate(rows):
        if r >= 0:
            states[r].copy_(_from_vk(S[j], layout))


BLOCK_BYTES = 8 << 20
"""Working-state bytes per block of rows: rows are independent, and a block that stays in the
CPU's caches across its tokens (and never needs fresh pages) is several times faster."""


def _blocks(n: int, hv: int, v: int, k: int, cd) -> range:
    per_row = hv * v * k * torch.finfo(cd).bits // 8
    return range(0, n, max(1, BLOCK_BYTES // per_row))


# -- decode -------------------------------------------------------------------------------------

@pinned_fp32_matmul
def _decode(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
            state_layout, intermediate_states, intermediate_state_indices, disable_state_update,
            num_accepted_tokens, softplus_beta, softplus_threshold, lower_bound, per_channel, cd,
            g=None, beta=None, has_initial_state=None, output_state_indices=None):
    N, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    o = torch.zeros(N, T, HV, V, dtype=cd, device=dev)
    if N == 0 or T == 0:
        return o.to(q.dtype)
    idx = state_indices.to(device=dev, dtype=torch.long)
    table = idx.dim() == 2
    if num_accepted_tokens is not None:
        if not table:
            raise ValueError("num_accepted_tokens needs a per-token slot table state_indices [N, T]; "
                             f"got state_indices of shape {tuple(state_indices.shape)}")
        nacc = num_accepted_tokens.to(device=dev, dtype=torch.long)
        fresh = nacc == 0
        load_col = torch.clamp(nacc - 1, min=0)
    else:
        fresh = torch.zeros(N, dtype=torch.bool, device=dev)
        load_col = torch.zeros(N, dtype=torch.long, device=dev)
    if has_initial_state is not None:  # False: a zero state, the slot is not read
        fresh = fresh | ~has_initial_state.to(device=dev, dtype=torch.bool)
    load_slot = idx.gather(1, load_col[:, None]).squeeze(1) if table else idx
    rows = (load_slot >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return o.to(q.dtype)

    if g is not None:  # precomputed gates: g floored as everywhere (G_MIN), beta as given
        g, beta = torch.clamp(_up(g[rows], cd), min=G_MIN), _up(beta[rows], cd)
    else:
        gate = kda_gating_ref if per_channel else gdn_gating_ref
        extra = {"lower_bound": lower_bound} if per_channel else {}
        g, beta = gate(A_log, a[rows], b[rows], dt_bias, softplus_beta=softplus_beta,
                       softplus_threshold=softplus_threshold, compute_dtype=cd, **extra)
    decay = torch.exp(g)
    qc = _prep_qk(q[rows], HV, K ** -0.5 if scale is None else scale, use_qk_l2norm, cd)
    kc = _prep_qk(k[rows], HV, None, use_qk_l2norm, cd)
    vc = _up(v[rows], cd)
    write_pool = not disable_state_update
    inter = intermediate_states
    rows_l = rows.tolist()
    load_l = load_slot.tolist()
    fresh_l = fresh.tolist()
    table_l = idx.tolist() if table else None
    # [N] form: the final state goes to output_state_indices[n] when given, else back to the load slot
    store_l = load_l if output_state_indices is None else output_state_indices.tolist()
    if inter is not None:
        inter_l = list(range(N)) if intermediate_state_indices is None else intermediate_state_indices.tolist()

    # rows never share a slot (the validation layer rejects that), so blocks are independent
    blocks = _blocks(len(rows_l), HV, V, K, cd)
    for lo in blocks:
        blk = slice(lo, lo + blocks.step)
        rs = rows_l[blk]
        S = torch.empty(len(rs), HV, V, K, dtype=cd, device=dev)
        # num_accepted_tokens == 0 or has_initial_state False: a zero state, nothing read from the pool
        _load(S, state_pool, [None if fresh_l[n] else load_l[n] for n in rs], state_layout)
        ob = torch.empty(len(rs), T, HV, V, dtype=cd, device=dev)
        for t in range(T):
            ob[:, t] = _step_(S, qc[blk, t], kc[blk, t], vc[blk, t], decay[blk, t], beta[blk, t])
            if inter is not None:
                _store(inter[:, t], [inter_l[n] for n in rs], S, state_layout)
            if table and write_pool:
                _store(state_pool, [table_l[n][t] for n in rs], S, state_layout)
        if not table and write_pool:
            _store(state_pool, [store_l[n] for n in rs], S, state_layout)
        o[rows[blk]] = ob
    return o.to(q.dtype)


_DECODE_DOC = """

    Args:
        q, k: ``[N, T, H, K]`` (bf16, fp16, fp32 or fp64; may be strided views).
        v: ``[N, T, HV, V]``.
        a: GDN ``[N, T, HV]``; KDA ``[N, T, HV, K]`` (raw gate projections).
        b: ``[N, T, HV]``.
        A_log: ``[HV]``. dt_bias: GDN ``[HV]``; KDA ``[HV, K]``.
        state_pool: ``[P, HV, V, K]`` (``state_layout="vk"``) or ``[P, HV, K, V]`` (``"kv"``),
            fp32, bf16 or fp64; written in place (slot pitch ``stride(0)``; views are legal).
        state_indices: ``[N]`` (load from and store the final state to that slot) or ``[N, T]``
            (per-token slot table: the state after token ``t`` goes to ``state_indices[n, t]``,
            negative = skip). int32 or int64. Negative load slot = padding row.
        scale: q scale (None = ``K ** -0.5``). use_qk_l2norm: l2-normalise q and k first.
        state_layout: ``"vk"`` or ``"kv"``; also the layout of ``intermediate_states``.
        intermediate_states: optional ``[S, steps >= T, HV, V, K]`` (or ``[.., K, V]``): the state
            after token ``t`` is written to ``[intermediate_state_indices[n], t]`` through the
            tensor's strides.
        intermediate_state_indices: optional ``[N]``, negative = skip (None = row ``n``).
        disable_state_update: when True the pool is only read.
        num_accepted_tokens: optional ``[N]`` in ``0 .. T`` (needs the ``[N, T]`` table): load from
            ``state_indices[n, num_accepted_tokens[n] - 1]``; 0 = start from a zero state.
        softplus_beta, softplus_threshold: gating parameters.
        compute_dtype: float32 (token-serial fp32 accumulation) or float64 (oracle).
        g, beta: the precomputed-gate form (then ``a, b, A_log, dt_bias`` are None): ``g`` the
            log decay ``[N, T, HV]`` (KDA ``[N, T, HV, K]``, floored at :data:`G_MIN`), ``beta``
            ``[N, T, HV]`` as given (already sigmoided).
        has_initial_state: optional ``[N]`` bool: False starts that row from a zero state without
            reading its slot (its stores are as usual).
        output_state_indices: optional ``[N]`` (with ``state_indices [N]`` only): the final state
            of row ``n`` is stored to ``output_state_indices[n]`` instead of its load slot, which
            is then only read. Padding on the same rows as ``state_indices`` (the validation layer
            refuses the rest: docs/ops.md "Separate read and write slots").

    Returns:
        ``o [N, T, HV, V]`` in q's dtype; padding rows are zero.

    Raises:
        ValueError: ``num_accepted_tokens`` given with a one-dimensional ``state_indices``.
"""


def gdn_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale=None,
                   use_qk_l2norm=True, state_layout="vk", intermediate_states=None,
                   intermediate_state_indices=None, disable_state_update=False,
                   num_accepted_tokens=None, softplus_beta=1.0, softplus_threshold=20.0, *,
                   g=None, beta=None, has_initial_state=None, output_state_indices=None,
                   compute_dtype=torch.float32):
    return _decode(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
                   state_layout, intermediate_states, intermediate_state_indices,
                   disable_state_update, num_accepted_tokens, softplus_beta, softplus_threshold,
                   None, False, compute_dtype, g, beta, has_initial_state, output_state_indices)


def kda_decode_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale=None,
                   use_qk_l2norm=True, state_layout="vk", intermediate_states=None,
                   intermediate_state_indices=None, disable_state_update=False,
                   num_accepted_tokens=None, softplus_beta=1.0, softplus_threshold=20.0,
                   lower_bound=None, *, g=None, beta=None, has_initial_state=None,
                   output_state_indices=None, compute_dtype=torch.float32):
    return _decode(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
                   state_layout, intermediate_states, intermediate_state_indices,
                   disable_state_update, num_accepted_tokens, softplus_beta, softplus_threshold,
                   lower_bound, True, compute_dtype, g, beta, has_initial_state, output_state_indices)


gdn_decode_ref.__doc__ = ("GDN decode over a state pool (T = 1), or speculative verify (T > 1): "
                          "gates computed inside from raw ``a, b``." + _DECODE_DOC + """
    Example:
        >>> N, T, H, HV, K, V = 2, 1, 1, 2, 4, 4
        >>> pool = torch.zeros(3, HV, V, K)
        >>> o = gdn_decode_ref(torch.randn(N, T, H, K), torch.randn(N, T, H, K), torch.randn(N, T, HV, V),
        ...                    torch.zeros(N, T, HV), torch.zeros(N, T, HV), torch.zeros(HV), torch.zeros(HV),
        ...                    pool, torch.tensor([2, -1]))
        >>> o.shape, bool(o[1].eq(0).all())
        (torch.Size([2, 1, 2, 4]), True)
""")
kda_decode_ref.__doc__ = ("KDA decode / speculative verify: as :func:`gdn_decode_ref` with one decay "
                          "per key channel and the optional bounded gate ``lower_bound``." + _DECODE_DOC + """
    Example:
        >>> pool = torch.zeros(1, 1, 2, 2)
        >>> o = kda_decode_ref(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2),
        ...                    torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1), torch.zeros(1), torch.zeros(1, 2),
        ...                    pool, torch.tensor([0]), lower_bound=-5.0)
        >>> o.shape
        torch.Size([1, 1, 1, 2])
""")


# -- prefill ------------------------------------------------------------------------------------

def store_empty_sequences(state_pool: torch.Tensor, slots: list, dests: list, carry: list, lens: list) -> None:
    """Pool mode of the PyTorch prefills: an empty sequence's final state is the state it starts
    from, so for each ``n`` with ``lens[n] == 0`` and a read slot ``slots[n] >= 0``, its write slot
    ``dests[n]`` gets zeros when fresh (``carry[n]`` False) or a copy of the read slot when it is
    another. A negative write slot (reachable only with ``validate=False``) stores nothing, as
    :func:`_store` skips one."""
    for n, (s, d) in enumerate(zip(slots, dests)):
        if s < 0 or d < 0 or lens[n]:
            continue
        if not carry[n]:
            state_pool[d].zero_()
        elif d != s:
            state_pool[d].copy_(state_pool[s])


def seq_lengths(cu_seqlens: torch.Tensor) -> tuple[list[int], list[int]]:
    """``(cu, lens)``: the offsets of ``cu_seqlens [N + 1]`` as Python ints (one host read) and each
    sequence's length ``cu[n + 1] - cu[n]`` (the PyTorch prefills' loop bounds)."""
    cu = [int(c) for c in cu_seqlens.tolist()]
    return cu, [cu[n + 1] - cu[n] for n in range(len(cu) - 1)]


@pinned_fp32_matmul
def _prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
             use_qk_l2norm, state_layout, cd, has_initial_state=None, output_state_indices=None,
             checkpoint_every=None, checkpoint_indices=None):
    T, _, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    cu, lens = seq_lengths(cu_seqlens)
    N = len(lens)
    pool_mode = state_pool is not None
    if pool_mode:
        slots = [int(s) for s in state_indices.tolist()]
        valid = [s >= 0 for s in slots]
        # has_initial_state False: h0 = 0, the slot is not read (its final state is written as usual)
        carry = [True] * N if has_initial_state is None else [bool(x) for x in has_initial_state.tolist()]
        # the final state goes to output_state_indices[n] when given (padding on the same rows)
        dests = slots if output_state_indices is None else [int(s) for s in output_state_indices.tolist()]
        # checkpoints: the state after (j + 1) * every tokens of sequence n goes to marks[n][j] (-1: none)
        every = checkpoint_every or 0
        marks = checkpoint_indices.tolist() if checkpoint_indices is not None else [[] for _ in range(N)]
        final = None
    else:
        valid = [True] * N
        if initial_state is not None:
            final = initial_state.clone(memory_format=torch.contiguous_format)
        else:
            shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
            final = torch.zeros(shape, dtype=torch.promote_types(torch.float32, cd), device=dev)

    o = torch.zeros(T, HV, V, dtype=cd, device=dev)
    # sequences that run, longest first, so that at step t a block's running ones are a prefix
    active = sorted((n for n in range(N) if valid[n] and lens[n] > 0), key=lambda n: -lens[n])
    if pool_mode:
        store_empty_sequences(state_pool, slots, dests, carry, lens)
    if not active:
        return o.to(q.dtype), final
    qc = _prep_qk(q, HV, K ** -0.5 if scale is None else scale, use_qk_l2norm, cd)
    kc = _prep_qk(k, HV, None, use_qk_l2norm, cd)
    vc = _up(v, cd)
    decay = torch.exp(_up(g, cd))
    bc = _up(beta, cd)

    blocks = _blocks(len(active), HV, V, K, cd)
    for lo in blocks:
        seqs = active[lo:lo + blocks.step]
        S = torch.empty(len(seqs), HV, V, K, dtype=cd, device=dev)
        if pool_mode:
            _load(S, state_pool, [slots[n] if carry[n] else None for n in seqs], state_layout)
        else:
            _load(S, initial_state, [None if initial_state is None else n for n in seqs], state_layout)
        neg_lens = [-lens[n] for n in seqs]  # ascending
        starts = torch.tensor([cu[n] for n in seqs], dtype=torch.long, device=dev)
        for t in range(lens[seqs[0]]):
            width = bisect.bisect_left(neg_lens, -t)  # sequences with len > t
            tok = starts[:width] + t
            o[tok] = _step_(S[:width], qc[tok], kc[tok], vc[tok], decay[tok], bc[tok])
            if pool_mode and every and (t + 1) % every == 0:  # the state after t + 1 tokens
                j = (t + 1) // every - 1
                _store(state_pool, [marks[n][j] if j < len(marks[n]) else -1 for n in seqs[:width]], S,
                       state_layout)
        _store(state_pool if pool_mode else final, [dests[n] for n in seqs] if pool_mode else seqs, S,
               state_layout)
    return o.to(q.dtype), final


_PREFILL_DOC = """

    Args:
        q, k: ``[T, H, K]`` (all sequences packed; bf16, fp16, fp32 or fp64; may be strided).
        v: ``[T, HV, V]``.
        g: fp32 log decay, GDN ``[T, HV]``, KDA ``[T, HV, K]`` (from the gating op).
        beta: fp32 ``[T, HV]``.
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums; zero-length sequences anywhere, ``T = 0``.
        state_pool: pool mode: ``[P, HV, V, K]`` ("vk") or ``[P, HV, K, V]`` ("kv"); ``h0`` read
            from slot ``state_indices[n]`` and ``ht`` written back in place (negative = padding:
            zero output, slot untouched). None for dense mode.
        state_indices: ``[N]`` int32/int64 (pool mode only).
        initial_state: dense mode: ``[N, HV, V, K]`` ("vk") or ``[N, HV, K, V]`` ("kv"), or None
            (zeros).
        scale: q scale (None = ``K ** -0.5``). use_qk_l2norm: l2-normalise q and k first.
        state_layout: ``"vk"`` or ``"kv"``.
        has_initial_state: pool mode only, optional ``[N]`` bool: False starts that sequence from a
            zero state without reading its slot; its final state is written there as usual.
        output_state_indices: pool mode only, optional ``[N]``: the final state of sequence ``n``
            (an empty sequence's: its initial state) goes to ``output_state_indices[n]``, and
            ``state_indices[n]`` is only read. None = write where read.
        checkpoint_every, checkpoint_indices: pool mode only, both or neither: the state of sequence
            ``n`` after ``(j + 1) * checkpoint_every`` of its tokens is stored (pool dtype and layout)
            to slot ``checkpoint_indices[n, j]`` (``[N, max_checkpoints]``, -1 = none) when the
            sequence has that many tokens (at exactly its length: its final state); the validation
            layer refuses the rest (docs/ops.md "State checkpoints").
        compute_dtype: float32 (token-serial fp32 accumulation) or float64 (oracle).

    Returns:
        ``(o [T, HV, V] in q's dtype, final_state)``: ``final_state`` is None in pool mode; in
        dense mode a new tensor in ``initial_state``'s layout and dtype (float32 without an
        initial state, float64 when ``compute_dtype`` is float64). An empty sequence's final
        state equals its initial state.
"""


def gdn_prefill_ref(q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", *,
                    has_initial_state=None, output_state_indices=None, checkpoint_every=None,
                    checkpoint_indices=None, compute_dtype=torch.float32):
    return _prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
                    use_qk_l2norm, state_layout, compute_dtype, has_initial_state, output_state_indices,
                    checkpoint_every, checkpoint_indices)


def kda_prefill_ref(q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk", *,
                    has_initial_state=None, output_state_indices=None, checkpoint_every=None,
                    checkpoint_indices=None, compute_dtype=torch.float32):
    return _prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
                    use_qk_l2norm, state_layout, compute_dtype, has_initial_state, output_state_indices,
                    checkpoint_every, checkpoint_indices)


gdn_prefill_ref.__doc__ = ("GDN varlen prefill, token-serial (the oracle for chunked kernels)."
                           + _PREFILL_DOC + """
    Example:
        >>> T, H, K = 5, 1, 4
        >>> o, ht = gdn_prefill_ref(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K),
        ...                         -torch.rand(T, H), torch.rand(T, H), torch.tensor([0, 2, 5]))
        >>> o.shape, ht.shape
        (torch.Size([5, 1, 4]), torch.Size([2, 1, 4, 4]))
""")
kda_prefill_ref.__doc__ = ("KDA varlen prefill: as :func:`gdn_prefill_ref` with ``g [T, HV, K]``."
                           + _PREFILL_DOC + """
    Example:
        >>> T, H, K = 3, 1, 2
        >>> o, ht = kda_prefill_ref(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K),
        ...                         -torch.rand(T, H, K), torch.rand(T, H), torch.tensor([0, 3]))
        >>> ht.shape
        torch.Size([1, 1, 2, 2])
""")


# -- SwiGLU with clamp --------------------------------------------------------------------------

def silu_and_mul_clamp_ref(x: torch.Tensor, limit: Optional[float] = None, *,
                           compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``silu(min(gate, L)) * clamp(up, -L, L)`` with ``x = gate ‖ up`` (docs/ops.md, "Ops").

    Args:
        x: ``[M, 2D]``, bf16 / fp16 / fp32 / fp64; the first D columns are the gate.
        limit: None (no clamp: exactly ``silu(gate) * up``) or a finite float > 0 (checked by
            the validation layer, not here).
        compute_dtype: float32 (default) or float64; the result is cast once to x's dtype.

    Returns:
        ``[M, D]`` in x's dtype (``M = 0`` gives an empty ``[0, D]``).

    Example:
        >>> silu_and_mul_clamp_ref(torch.tensor([[20.0, -30.0]]), limit=10.0)
        tensor([[-99.9955]])
    """
    d = x.shape[-1] // 2
    gate = _up(x[..., :d], compute_dtype)
    up = _up(x[..., d:], compute_dtype)
    if limit is not None:
        gate = torch.clamp(gate, max=limit)
        up = torch.clamp(up, min=-limit, max=limit)
    return (F.silu(gate) * up).to(x.dtype)
