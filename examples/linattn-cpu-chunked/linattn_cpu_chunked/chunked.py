"""Chunked-form GDN and KDA prefill, vectorised PyTorch for CPUs.

The maths is linattn's docs/ops.md "Chunked form" (Yang, Kautz, Hatamizadeh, "Gated Delta Networks",
ICLR 2025; Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", NeurIPS 2024, the WY representation; the Kimi Linear report, 2025, for KDA). Within one
chunk of ``C`` rows, with ``q`` already scaled, ``S0 [K, V]`` the state entering the chunk and
``G_r = g_1 + ... + g_r`` the chunk-local cumulative log decay::

    A   = strictly_lower( beta_r * sum_d k_rd k_sd exp(G_rd - G_sd) )
    W   = (I + A)^-1 diag(beta) (K * exp(G))        U = (I + A)^-1 diag(beta) V
    Vn  = U - W S0
    O   = (Q * exp(G)) S0 + lower_incl_diag( sum_d q_rd k_sd exp(G_rd - G_sd) ) Vn
    S1  = diag(exp(G_C)) S0 + (K * exp(G_C - G))^T Vn

(GDN has one decay per row, so ``exp(G_r - G_s)`` factors out of the sums.) Decays enter as
exponentials of differences that are <= 0, or, in KDA's factorised Gram matrices, bounded by
:data:`SAFE_HALF`; never as a ratio of two exponentials. So strongly negative gates (g = -20 per
token, or the reference's floor of -1000) give zeros, never inf or NaN.

The cumulative gates are two-float sums ``G + Gl`` (:func:`cumsum2`, the same split as the
Triton fp32 path's ``kernels/triton/_gates.py``; docs/ops-decisions.md, "Chunked prefill,
state-update weights"), and every decay is taken from ``G_r - G_s + Gl_r - Gl_s``. A plain
fp32 prefix sum after a floor gate (-1000) sits where fp32's spacing is 6e-5, and every later
difference of mild gates carries that rounding, past docs/ops.md's fp32 tolerance of 1e-5 (field case
F28, measured: docs/performance.md#cpu-chunked-two-float-gates).

How the work is laid out: every sequence is cut into chunks of ``C`` tokens. The last one is
padded with copies of a real token whose ``g`` and ``beta`` are set to 0: a row with ``beta = 0``
has ``A``, ``W`` and ``U`` rows of zero, so it adds nothing to the state, and ``g = 0`` keeps
``G_C`` the decay of the last real row; padded rows' outputs are dropped.
Sequences are sorted by chunk count, longest first, so at chunk step ``j`` the sequences still
running are a prefix of that order: one batched step covers chunk ``j`` of every sequence and
every value head at once, and only the chunk index is a Python loop (32 steps for 2,048 tokens).
Every batch entry is one (value head, sequence) pair and every op is per entry (batched matmuls,
elementwise maths, the per-entry choice of KDA's Gram path), so a sequence's output and state do
not depend on the other sequences in the call, bitwise: a NaN in one sequence's q, k, v or beta
stays in that sequence (a padded row copies a token of its own sequence). Padding sequences
(negative slot) and empty ones are not batched at all: zero output, their slot neither read nor
written.
All arithmetic is float32 (bf16 / fp16 inputs are upcast once, the output is cast once).
"""

from __future__ import annotations

import torch

from linattn.precision import pinned_fp32_matmul  # IEEE fp32 matmuls whatever the caller's flags (F36)

CHUNK = 64
"""Chunk size ``C`` (docs/ops.md)."""
SUB = 16
"""Sub-block size: the blocked inverse of ``I + A`` and the KDA Gram matrices work on
``SUB x SUB`` blocks of the chunk."""
EXP_FLOOR = 80.0
"""Log decays are floored at -80 before ``exp`` (``e^-80`` ~ 2e-35, a decay that is zero at
float32 precision): ``exp`` of anything below about -87 lands in float32's denormal range,
which CPUs compute far more slowly (docs/performance.md#cpu-chunked-denormals), and strongly
decaying gates produce plenty of them."""
SAFE_HALF = 40.0
"""KDA Gram matrices: a block is factorised around the midpoint of its decay range when that
range is at most ``2 * SAFE_HALF`` nats, so every factor lies in ``[e^-40, e^40]`` (normal
float32, and entries above the diagonal stay below ``e^80``, finite)."""
GRAM_BLOCKS = (16, 4)
"""KDA Gram matrices: block sizes a steeper block is cut into, level by level (blocks below the
diagonal are matmuls; the smallest diagonal blocks are summed pairwise)."""
G_MIN = -1000.0
"""Per-token log decays are floored here (linattn's gating floor): ``exp(-1000)`` is 0 either way,
and a finite floor keeps the cumulative sums finite."""
GATE_GRID = 128.0
""":func:`cumsum2` splits each gate into a multiple of ``1 / GATE_GRID`` (``2**-7``) and a
remainder of at most ``2**-8``."""
MAX_CHUNK_HEADS = 2048
"""At most this many (chunk, value head) pairs are processed in one batched step (memory bound)."""
L2NORM_EPS = 1e-6


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim without overflow (F44, docs/ops.md "l2norm"): a
    row with ``max|x| >= 2**32`` is scaled by the power of two ``s`` bringing it under ``2**32`` and
    normalised as ``(s x) / sqrt(sum((s x)^2) + s^2 eps)`` (the same value); other rows: ``s = 1``."""
    m = x.abs().amax(-1, keepdim=True)
    s = torch.ldexp(torch.ones_like(m), -(torch.frexp(m).exponent - 32).clamp(min=0))
    y = x * s
    return y * torch.rsqrt((y * y).sum(-1, keepdim=True) + L2NORM_EPS * s * s)


def cumsum2(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk-local cumulative log decays along dim 1 as a two-float sum ``(G, Gl)``.

    Each gate is split into a coarse part on the grid of ``2**-7`` and a remainder
    (``|rem| <= 2**-8``, exact in float32). The coarse parts of one chunk sum exactly in any order:
    gates are floored at :data:`G_MIN` and a chunk has at most 64 rows, so every partial sum is a
    multiple of ``2**-7`` below ``64 * 1000 * 2**7 < 2**24`` grid units. The remainders sum to at
    most 0.25 in magnitude, where float32's spacing is 3e-8. ``G`` is the sum rounded to float32,
    ``Gl`` the part of it that ``G`` misses, so ``(G_r - G_s) + (Gl_r - Gl_s)`` is accurate to the
    rounding of the difference itself, also after a floor gate where ``G`` sits near -1000 (the
    spacing there is 6e-5). As ``kernels/triton/_gates.py`` on the Triton fp32 path.

    Args:
        g: float32 log decays in ``[G_MIN, 0]``, ``[B, C]`` (GDN) or ``[B, C, K]`` (KDA), ``C <= 64``.
    Returns:
        ``(G, Gl)``, both float32 in ``g``'s shape; ``G + Gl`` rounds to ``G``.
    Example:
        >>> g = torch.tensor([[-1000.0] + [-0.05] * 63])  # a floor gate, then mild ones
        >>> G, Gl = cumsum2(g)
        >>> exact = g.double().cumsum(1)
        >>> def off(x): return float((x - exact).abs().max())
        >>> off(G.double() + Gl.double()) < 3e-8 < 1e-5 < off(G.double())  # G alone: rounded at -1000
        True
    """
    coarse = (g * GATE_GRID).round_().mul_(1.0 / GATE_GRID)
    lo = torch.sub(g, coarse).cumsum_(1)
    hi = coarse.cumsum_(1)  # exact (see above)
    G = hi + lo
    return G, hi.sub_(G).add_(lo)  # in place where it can: three new tensors in all


def _heads_first(x: torch.Tensor, hv: int) -> torch.Tensor:
    """Gathered rows ``[n, C, H, D]`` -> float32 ``[HV * n, C, D]`` in one copy (GVA: value head
    hv reads q/k head ``hv // (HV // H)``)."""
    n, c, h, d = x.shape
    out = torch.empty(h, hv // h, n, c, d, dtype=torch.float32, device=x.device)
    out.copy_(x.permute(2, 0, 1, 3)[:, None].expand(h, hv // h, n, c, d))
    return out.view(hv * n, c, d)


def _tril(c: int, diagonal: int, device) -> torch.Tensor:
    return torch.ones(c, c, dtype=torch.bool, device=device).tril(diagonal)


def _decay(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` of a log decay ``x <= 0``, with ``x`` floored at ``-EXP_FLOOR`` (see there).
    Overwrites ``x`` when it is a temporary the caller owns (call with a fresh tensor)."""
    return x.clamp_(min=-EXP_FLOOR).exp_()


def _masked_exp(diff: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``exp(diff)`` where ``keep`` (there ``diff <= 0``), else 0 (the positive entries above the
    diagonal are clamped to 0 before exp, so they never overflow). ``diff`` is overwritten."""
    return diff.clamp_(min=-EXP_FLOOR, max=0.0).exp_().mul_(keep)


def _set_diag_blocks(out: torch.Tensor, blocks: torch.Tensor) -> None:
    """Write ``blocks [.., nb, b, b]`` onto the diagonal blocks of ``out [.., nb * b, nb * b]``."""
    *batch, c, _ = out.shape
    nb, b = blocks.shape[-3], blocks.shape[-1]
    grid = out.view(*batch, nb, b, nb, b).diagonal(dim1=-4, dim2=-2)  # [.., b, b, nb]
    grid.copy_(blocks.movedim(-3, -1))


def _pair_diffs(G, Gl):
    """``D[:, r, s] = G_r - G_s + Gl_r - Gl_s``, the two-float differences of :func:`cumsum2`'s
    sums for every pair of rows (dim 1), the large parts first (each step rounds at the
    difference's magnitude): ``[B, C, C]`` from ``[B, C]``, or ``[B, C, C, K]`` from
    ``[B, C, K]``; a fresh tensor."""
    return (G[:, :, None] - G[:, None]).add_(Gl[:, :, None]).sub_(Gl[:, None])


def _grams_gdn(qk, G, Gl):
    """GDN Gram matrices, stacked ``[B, 2, C, C]``: ``[0]`` = ``(q_r . k_s) exp(G_r - G_s)``
    (lower incl. diagonal), ``[1]`` = ``(k_r . k_s) exp(G_r - G_s)`` (strictly lower).
    ``qk [B, 2, C, K]`` (q and k), ``G, Gl [B, C]`` (:func:`cumsum2`)."""
    B, _, c, kd = qk.shape
    decay = _masked_exp(_pair_diffs(G, Gl), _tril(c, 0, G.device))
    grams = (qk.view(B, 2 * c, kd) @ qk[:, 1].transpose(1, 2)).view(B, 2, c, c) * decay[:, None]
    grams[:, 1].diagonal(dim1=-2, dim2=-1).zero_()
    return grams


def _grams_kda(qk, G, Gl):
    """KDA Gram matrices ``sum_d x_rd k_sd exp(G_rd - G_sd)``, stacked ``[B, 2, C, C]``:
    x = q (lower incl. diagonal) and x = k (strictly lower). ``qk [B, 2, C, K]``,
    ``G, Gl [B, C, K]`` (:func:`cumsum2`; every exponent below is a two-float difference).

    With one decay per key channel, ``exp(G_r - G_s)`` does not factor out of the sum over d, so
    it is split around a per-channel constant ``c``: ``exp(G_r - c) * exp(c - G_s)``, one matmul.
    That is exact while every factor is a normal float32 number; :func:`_decay_grams` picks ``c``
    and falls back to smaller blocks where the decay inside a block is too steep for it.
    """
    grams = _decay_grams(qk, G, Gl, GRAM_BLOCKS)
    c = G.shape[1]
    keep = torch.stack([_tril(c, 0, G.device), _tril(c, -1, G.device)])  # [2, C, C]: q incl., k strict
    return grams * keep


def _decay_grams(qk, G, Gl, blocks):
    """``[M, 2, n, n]``: ``sum_d x_rd k_sd exp(G_rd - G_sd)``, exact for r >= s (entries above the
    diagonal are finite junk or zero; the caller masks them). ``qk [M, 2, n, K]``, ``G [M, n, K]``
    (non-increasing along n: g <= 0) and its low part ``Gl [M, n, K]`` (:func:`cumsum2`).

    A block whose decay range (per channel, ``G_first - G_last``) is at most ``2 * SAFE_HALF``
    nats is factorised around the midpoint ``c`` of that range: every factor lies in
    ``[exp(-SAFE_HALF), exp(SAFE_HALF)]``. A steeper block is cut into ``blocks[0]``-row blocks:
    those below the diagonal are matmuls around the last row of their column block (both
    exponents <= 0, always safe), the diagonal ones recurse; the smallest are summed pairwise.
    """
    M, _, n, kd = qk.shape
    steep = (G[:, 0, :] - G[:, -1, :]).amax(-1) > 2 * SAFE_HALF  # [M]
    if not bool(steep.any()):
        return _factorised(qk, G, Gl)
    if bool(steep.all()):
        return _split(qk, G, Gl, blocks) if blocks else _pairwise(qk, G, Gl)
    out = _factorised(qk, G, Gl)  # junk (maybe inf) in the steep rows, overwritten below
    sq, sG, sGl = qk[steep], G[steep], Gl[steep]
    out[steep] = _split(sq, sG, sGl, blocks) if blocks else _pairwise(sq, sG, sGl)
    return out


def _factorised(qk, G, Gl):
    M, _, n, kd = qk.shape
    c = (G[:, :1, :] + G[:, -1:, :]) * 0.5  # [M, 1, K]: midpoint of each channel's decay range
    # exponents in [-SAFE_HALF, SAFE_HALF]; c is one float32 number per channel, so the two-float
    # G + Gl enters as (G - c) + Gl
    right = (qk[:, 1] * (c - G).sub_(Gl).exp_()).transpose(1, 2)  # [M, K, n]
    left = qk * (G - c).add_(Gl).exp_()[:, None]  # [M, 2, n, K]
    return (left.reshape(M, 2 * n, kd) @ right).view(M, 2, n, n)


def _split(qk, G, Gl, blocks):
    M, _, n, kd = qk.shape
    sub = blocks[0]
    nb = n // sub
    out = qk.new_zeros(M, 2, n, n)
    k = qk[:, 1]
    for j in range(nb - 1):
        cols, rows = slice(j * sub, (j + 1) * sub), slice((j + 1) * sub, n)
        last = slice((j + 1) * sub - 1, (j + 1) * sub)  # the last row of column block j
        ref, ref_l = G[:, last, :], Gl[:, last, :]  # [M, 1, K]
        # both exponents <= 0, two-float differences
        right = (k[:, cols] * _decay((ref - G[:, cols]).add_(ref_l).sub_(Gl[:, cols]))).transpose(1, 2)  # [M, K, sub]
        left = qk[:, :, rows] * _decay((G[:, rows] - ref).add_(Gl[:, rows]).sub_(ref_l))[:, None]  # [M, 2, R, K]
        out[:, :, rows, cols] = (left.reshape(M, -1, kd) @ right).view(M, 2, -1, sub)
    inner = _decay_grams(qk.view(M, 2, nb, sub, kd).transpose(1, 2).reshape(M * nb, 2, sub, kd),
                         G.reshape(M * nb, sub, kd), Gl.reshape(M * nb, sub, kd), blocks[1:])
    _set_diag_blocks(out, inner.view(M, nb, 2, sub, sub).transpose(1, 2))
    return out


def _pairwise(qk, G, Gl):
    """Small blocks summed pairwise: only ``exp(G_rd - G_sd)`` with r >= s is evaluated.
    ``qk [M, 2, n, K]``, ``G, Gl [M, n, K]``; returns ``[M, 2, n, n]`` (zero above the diagonal)."""
    n = G.shape[1]
    decay = _masked_exp(_pair_diffs(G, Gl), _tril(n, 0, G.device)[:, :, None])
    ek = decay * qk[:, 1, None, :, :]  # [M, r, s, K]: exp(G_r - G_s) k_s
    return (ek[:, None] @ qk[..., None]).squeeze(-1)


def _unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` for strictly lower triangular ``A [B, C, C]`` (blocked forward substitution).

    Diagonal ``SUB x SUB`` blocks are inverted row by row, batched over all blocks; block row i of
    the inverse is then ``-D_i^-1 A[i, :i] X[:i, :i]``. Only matmuls, so it stays fast on CPUs
    where batched small triangular solves are not.
    """
    B, c, _ = A.shape
    nb = c // SUB
    D = A.view(B, nb, SUB, nb, SUB).diagonal(dim1=1, dim2=3).movedim(-1, 1)  # [B, nb, SUB, SUB]
    Dinv = torch.eye(SUB, dtype=A.dtype, device=A.device).expand(B, nb, SUB, SUB).clone()
    for r in range(1, SUB):
        Dinv[..., r:r + 1, :r] = -(D[..., r:r + 1, :r] @ Dinv[..., :r, :r])
    X = torch.zeros_like(A)
    _set_diag_blocks(X, Dinv)
    for i in range(1, nb):
        rows = slice(i * SUB, (i + 1) * SUB)
        X[:, rows, :i * SUB] = -(Dinv[:, i] @ (A[:, rows, :i * SUB] @ X[:, :i * SUB, :i * SUB]))
    return X


def _chunk_step(q, k, v, g, beta, S0, kda: bool):
    """One chunk for a batch of (head, sequence) pairs.

    Args:
        q, k: float32 ``[B, C, K]`` (q scaled). v: ``[B, C, V]``. g: ``[B, C]`` (GDN) or
        ``[B, C, K]`` (KDA) log decays <= 0. beta: ``[B, C]``. S0: ``[B, K, V]`` (maths layout).
    Returns:
        ``(O [B, C, V], S1 [B, K, V])``.
    """
    B, c, kd = k.shape
    qk = torch.cat([q, k], dim=1).view(B, 2, c, kd)
    G, Gl = cumsum2(g)
    # G_C - G_r as a two-float difference: exactly 0 at the last row, and no rounding at G's
    # magnitude after an early floor gate (the state-update weights)
    tail = (G[:, -1:] - G).add_(Gl[:, -1:]).sub_(Gl).clamp_(-EXP_FLOOR, 0.0).exp_()
    if kda:
        grams = _grams_kda(qk, G, Gl)
        eG, GC = _decay(G.clone()), G[:, -1:, :]  # [B, C, K], [B, 1, K]
        k_tail = k * tail
        decay_state = _decay(GC.clone()).transpose(1, 2)  # [B, K, 1]
    else:
        grams = _grams_gdn(qk, G, Gl)
        eG, GC = _decay(G.clone())[:, :, None], G[:, -1:]  # [B, C, 1], [B, 1]
        k_tail = k * tail[:, :, None]
        decay_state = _decay(GC.clone())[:, :, None]  # [B, 1, 1]
    m_qk, m_kk = grams[:, 0], grams[:, 1]
    b = beta[:, :, None]
    # Vn = U - W S0 = (I + A)^-1 diag(beta) (V - (K * exp(G)) S0): one C x C solve on V columns
    P = (qk * eG[:, None]).view(B, 2 * c, kd) @ S0  # [B, 2C, V]: (Q * exp(G)) S0, (K * exp(G)) S0
    vn = _unit_lower_inverse(m_kk * b) @ (b * (v - P[:, c:]))
    O = torch.baddbmm(P[:, :c], m_qk, vn)
    S1 = torch.baddbmm(decay_state * S0, k_tail.transpose(1, 2), vn)
    return O, S1


def _to_kv(state: torch.Tensor, layout: str) -> torch.Tensor:
    """A stored state (``[.., HV, V, K]`` for "vk", ``[.., HV, K, V]`` for "kv") -> ``[.., K, V]``."""
    return state.transpose(-1, -2) if layout == "vk" else state


def _load_chunk(q, k, v, g, beta, idx, real, hv: int, scale: float, l2norm: bool):
    """Rows ``idx [n, C]`` of every input, heads first and float32: ``q, k [HV*n, C, K]`` (q
    normalised and scaled), ``v [HV*n, C, V]``, ``g [HV*n, C(, K)]``, ``beta [HV*n, C]``;
    padded rows (``real`` False) get ``g = beta = 0``."""
    qc, kc = q[idx].to(torch.float32), k[idx].to(torch.float32)
    if l2norm:
        qc, kc = _l2norm(qc), _l2norm(kc)
    qc = qc * scale
    keep = real.view(real.shape + (1,) * (g.dim() - 1)) > 0
    gc = torch.where(keep, g[idx].clamp(min=G_MIN), 0.0)  # [n, C, HV(, K)]; -inf would give NaN in cumsum
    bc = beta[idx] * real[:, :, None]
    if gc.dim() == 3:
        gc = gc[..., None]
    return (_heads_first(qc, hv), _heads_first(kc, hv), _heads_first(v[idx], hv),
            _heads_first(gc, hv).squeeze(-1) if g.dim() == 2 else _heads_first(gc, hv),
            _heads_first(bc[..., None], hv).squeeze(-1))


@pinned_fp32_matmul
def chunked_prefill(q, k, v, g, beta, cu_seqlens, *, state_pool=None, state_indices=None,
                    initial_state=None, scale=None, use_qk_l2norm=True, state_layout="vk"):
    """GDN (``g [T, HV]``) or KDA (``g [T, HV, K]``) varlen prefill in chunked form.

    Args:
        q, k: ``[T, H, K]`` bf16 / fp16 / fp32 (all sequences packed). v: ``[T, HV, V]``.
        g: float32 log decays (<= 0), ``[T, HV]`` (GDN) or ``[T, HV, K]`` (KDA).
        beta: float32 ``[T, HV]``.
        cu_seqlens: ``[N + 1]`` int32/int64 prefix sums (zero-length sequences anywhere).
        state_pool, state_indices: pool mode: ``[P, HV, V, K]`` ("vk") or ``[P, HV, K, V]``
            ("kv"), fp32 or bf16, read at and written back to ``state_indices[n]`` in place;
            a negative index is padding (zero output, slot neither read nor written).
        initial_state: dense mode: ``[N, HV, V, K]`` / ``[N, HV, K, V]`` or None (zeros).
        scale: q scale (None = ``K ** -0.5``). use_qk_l2norm: l2-normalise q and k.
        state_layout: ``"vk"`` or ``"kv"``.
    Returns:
        ``(o [T, HV, V] in q's dtype, final_state)``: None in pool mode; in dense mode a new
        tensor in ``initial_state``'s layout and dtype (float32 zeros-based without one).
    Example:
        >>> T, H, K = 70, 1, 8
        >>> o, ht = chunked_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K),
        ...                         -torch.rand(T, H), torch.rand(T, H), torch.tensor([0, 5, 70]))
        >>> tuple(o.shape), tuple(ht.shape)
        ((70, 1, 8), (2, 1, 8, 8))
    """
    T, _, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    cu = [int(c) for c in cu_seqlens.tolist()]
    lens = [cu[n + 1] - cu[n] for n in range(len(cu) - 1)]
    slots = [int(s) for s in state_indices.tolist()] if state_pool is not None else None
    final = None if state_pool is not None else _dense_final(initial_state, len(lens), HV, K, V, state_layout, dev)
    # padding (negative slot) and empty sequences are not batched; the rest longest first
    active = sorted((n for n in range(len(lens)) if lens[n] > 0 and (slots is None or slots[n] >= 0)),
                    key=lambda n: -lens[n])
    if not active:
        return torch.zeros(T, HV, V, dtype=q.dtype, device=dev), final
    act = torch.tensor(active, dtype=torch.long, device=dev)
    if state_pool is not None:
        act_slots = torch.tensor([slots[n] for n in active], dtype=torch.long, device=dev)
        src = state_pool[act_slots]
    else:
        src = initial_state[act] if initial_state is not None else None
    if src is None:
        S = torch.zeros(HV, len(active), K, V, dtype=torch.float32, device=dev)
    else:  # [Nact, HV, ., .] -> [HV, Nact, K, V] float32
        S = _to_kv(src, state_layout).to(torch.float32).transpose(0, 1).contiguous()
    scale = K ** -0.5 if scale is None else scale
    o = _run_chunks((q, k, v, g, beta), S, [cu[n] for n in active], [lens[n] for n in active], scale,
                    use_qk_l2norm, g.dim() == 3)
    out_state = _to_kv(S.transpose(0, 1), state_layout)  # back to the stored layout: [Nact, HV, ., .]
    if state_pool is not None:
        state_pool[act_slots] = out_state.to(state_pool.dtype)
    else:
        final[act] = out_state.to(final.dtype)
    return o.to(q.dtype), final


def _dense_final(initial_state, N: int, HV: int, K: int, V: int, state_layout: str, dev) -> torch.Tensor:
    """Dense mode's final state before the run: a copy of ``initial_state``, or float32 zeros."""
    if initial_state is not None:
        return initial_state.clone(memory_format=torch.contiguous_format)
    shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
    return torch.zeros(shape, dtype=torch.float32, device=dev)


def _run_chunks(inputs, S: torch.Tensor, starts: list[int], lens: list[int], scale: float, l2norm: bool,
                kda: bool) -> torch.Tensor:
    """Every chunk of the active sequences (``lens`` non-increasing), states ``S [HV, Nact, K, V]``
    updated in place; returns float32 ``o [T, HV, V]`` (rows of sequences not run stay zero)."""
    q, k, v, g, beta = inputs
    T, HV, V = v.shape
    K, dev = S.shape[2], q.device
    # rows of inactive sequences (padding, empty) stay zero; row T takes the padded rows' output
    o = (torch.empty if sum(lens) == T else torch.zeros)(T + 1, HV, V, dtype=torch.float32, device=dev)
    start_t = torch.tensor(starts, dtype=torch.long, device=dev)
    left = torch.tensor(lens, dtype=torch.long, device=dev)
    rows = torch.arange(CHUNK, device=dev)
    chunks = [-(-n // CHUNK) for n in lens]  # non-increasing
    group = max(1, MAX_CHUNK_HEADS // HV)
    for j in range(chunks[0]):
        running = sum(1 for c in chunks if c > j)
        for a in range(0, running, group):
            b = min(running, a + group)
            n = b - a
            off = rows[None, :] + j * CHUNK
            real = off < left[a:b, None]  # [n, C]
            tok = torch.where(real, start_t[a:b, None] + off, start_t[a:b, None])  # pad: a real row
            chunk = _load_chunk(q, k, v, g, beta, tok, real.to(torch.float32), HV, scale, l2norm)
            O, S1 = _chunk_step(*chunk, S[:, a:b].reshape(HV * n, K, V), kda)
            S[:, a:b] = S1.view(HV, n, K, V)
            o[torch.where(real, tok, T)] = O.view(HV, n, CHUNK, V).permute(1, 2, 0, 3)
    return o[:T]
