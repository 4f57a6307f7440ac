"""The chunked PyTorch backend ``torch-chunked``: GDN and KDA prefill in chunked form, any device.

The maths is docs/ops.md's "Chunked form" (Yang, Kautz, Hatamizadeh, "Gated Delta Networks",
ICLR 2025; Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", NeurIPS 2024, the WY / UT representation; the Kimi Linear report, 2025, for KDA's
per-channel decay). Within a chunk of ``C`` rows, with ``q`` normalised and scaled, ``S0 [K, V]``
the state entering the chunk and ``G_r = g_1 + ... + g_r`` the chunk-local cumulative log decay
(one per row for GDN, one per row and key channel for KDA)::

    Akk = strictly_lower( beta_r * sum_d k_rd k_sd exp(G_rd - G_sd) )
    Aqk = lower_incl_diag( sum_d q_rd k_sd exp(G_rd - G_sd) )
    U   = (I + Akk)^-1 diag(beta) V            W = (I + Akk)^-1 diag(beta) (K * exp(G))
    Vn  = U - W S0                              (the only product with the state on the serial path)
    S1  = diag(exp(G_C)) S0 + (K * exp(G_C - G))^T Vn
    O   = (Q * exp(G)) S0 + Aqk Vn

How the work is laid out. Every sequence is cut into chunks of :data:`CHUNK` rows (fewer, a power
of two, when every sequence is shorter: :func:`chunk_size`); a short last
chunk is padded with copies of a real row of its own sequence whose ``g`` and ``beta`` are 0 (a
row with ``beta = 0`` has zero rows in ``Akk``, ``U`` and ``W``, so it adds nothing, and ``g = 0``
keeps ``G_C`` the decay of the last real row; its output is dropped). Sequences are sorted longest
first and chunks are numbered step-major: step ``j`` holds chunk ``j`` of every sequence still
running, which are a prefix of that order. Everything that does not read the state (``Akk``,
``Aqk``, the inverse ``X = (I + Akk)^-1`` times ``diag(beta)``, ``[Q; K] * exp(G)``,
``K * exp(G_C - G)``) runs batched over every chunk and value head of a window of steps. The
recurrence then runs over the steps only, over the running sequences and heads: ``P = [Q exp(G);
K exp(G)] S0`` (one matmul), ``Vn = X diag(beta) (V - K exp(G) S0)`` (the same ``Vn`` as
``U - W S0``, with no ``U`` or ``W`` formed), ``O = P_q + Aqk Vn`` and the state update, all in
place on preallocated buffers; a checkpoint is copied from the state before its chunk runs. A
window holds at most :data:`WINDOW_BYTES` of these per-chunk buffers, so memory stays bounded for
any length.

Numerics. Decays enter as exponentials of differences that are ``<= 0``, or (KDA's factorised
matrices) bounded by :data:`SAFE_HALF`, never as a ratio of exponentials: gates at the floor
(-1000) give zeros, never inf or NaN. The chunk-local sums are two-float (``G + Gl``, as the Triton
fp32 path's ``kernels/triton/_gates.py``; docs/ops-decisions.md, "Chunked prefill, state-update
weights"). KDA's ``exp(G_rd - G_sd)`` does not factor out of the sum over ``d``: a chunk whose
decay range is at most ``2 * SAFE_HALF`` nats in every channel is factorised around its midpoint
(one matmul); otherwise every chunk of the window is cut into blocks of :data:`SUB` rows, the
blocks below the diagonal factorised around the last row of their column block (both exponents
``<= 0``), the diagonal blocks around their midpoint where that range fits, else summed pairwise
(docs/ops-decisions.md, "KDA's intra-chunk matrices", the same rule as the Triton path).
Log decays are floored at ``-EXP_FLOOR`` before ``exp``: ``e^-80`` is zero at fp32 precision, and
below ``e^-87`` CPUs compute denormals far more slowly.
Computes in float32 (bf16 / fp16 inputs upcast once, the output cast once), or float64 when q,
the pool or the initial state is float64; matmuls run in IEEE fp32 whatever the caller's flags
(:mod:`linattn.precision`, F36).
"""

from __future__ import annotations

import math
import threading
from typing import Optional

import torch

from linattn.dispatch.lru import LRUCache
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.plugin.verdict import Rank
from linattn.precision import pinned_fp32_matmul  # IEEE fp32 matmuls whatever the caller's flags (F36)

from .base import ALL_VENDORS, Backend, DecodeCall, PrefillCall
from .torch_ref import (G_MIN, gdn_decode_ref, gdn_gating_ref, kda_decode_ref, kda_gating_ref, l2norm_ref, seq_lengths,
                        store_empty_sequences)

__all__ = ["CHUNK", "TorchChunkedBackend", "chunked_prefill"]

CHUNK = 64
"""Chunk size ``C`` (docs/ops.md) of any call whose longest sequence has at least 64 tokens."""
MIN_CHUNK = 16
"""Shorter calls use the smallest power of two ``>= MIN_CHUNK`` that holds their longest sequence
(less padding for short prefills; the chunked form is exact for any ``C``)."""


def chunk_size(max_len: int) -> int:
    """``C`` for a call whose longest sequence has ``max_len`` tokens: a power of two in
    ``[MIN_CHUNK, CHUNK]``."""
    c = MIN_CHUNK
    while c < min(max_len, CHUNK):
        c *= 2
    return c


SUB = 16
"""KDA's blocked Gram matrices: rows per block when a chunk's decay range is too steep to factorise."""
EXP_FLOOR = 80.0
"""Log decays are floored at -80 before ``exp`` (``e^-80`` ~ 2e-35 is zero at fp32 precision)."""
SAFE_HALF = 40.0
"""A factorised KDA block keeps every factor in ``[e^-40, e^40]`` (normal fp32 numbers)."""
GATE_GRID = 128.0
""":func:`cumsum2` splits each gate into a multiple of ``2**-7`` and a remainder of at most ``2**-8``."""
WINDOW_BYTES = 128 << 20
"""The per-chunk buffers of one window of chunk steps (:func:`_plan`): 1 x 2,048 tokens at HV = 8,
K = V = 128, fp32 (about 63 MiB) is one window."""
SHORT = {"gdn": 16, "kda": 16}
"""Average tokens per sequence below which torch-ref's token-serial prefill is the CPU's default
(a chunk is mostly padding there; measured in benchmarks/cpu_chunked.py, docs/performance.md)."""


def cumsum2(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk-local cumulative log decays along dim 1 as a two-float ``(G, Gl)``.

    Each gate is split into a part on the grid of ``2**-7`` (summed exactly: gates are floored at
    -1000 and a chunk has at most 64 rows, under ``2**24`` grid units) and a remainder (``|rem| <=
    2**-8``). ``G`` is the sum rounded, ``Gl`` what ``G`` misses, so ``(G_r - G_s) + (Gl_r - Gl_s)``
    is accurate to the rounding of the difference itself, also after a floor gate.

    Args:
        g: log decays in ``[G_MIN, 0]``, ``[M, C]`` (GDN) or ``[M, C, K]`` (KDA), fp32 or fp64.
    Returns:
        ``(G, Gl)`` in ``g``'s shape and dtype.

    Example:
        >>> g = torch.tensor([[-1000.0] + [-0.05] * 63])  # a floor gate, then mild ones
        >>> G, Gl = cumsum2(g)
        >>> exact = g.double().cumsum(1)
        >>> float((G.double() + Gl.double() - exact).abs().max()) < 3e-8 < 1e-5 < float((G.double() - exact).abs().max())
        True
    """
    coarse = (g * GATE_GRID).round_().mul_(1.0 / GATE_GRID)
    lo = torch.sub(g, coarse).cumsum_(1)
    hi = coarse.cumsum_(1)
    G = hi + lo
    return G, hi.sub_(G).add_(lo)


def _exp_le0(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` of a log decay ``x <= 0`` (a fresh tensor the caller owns: overwritten), floored at
    ``-EXP_FLOOR`` and capped at 0 (entries above a diagonal, masked later, never overflow)."""
    return x.clamp_(-EXP_FLOOR, 0.0).exp_()


def _diffs(Ga, Gla, Gb, Glb) -> torch.Tensor:
    """``Ga - Gb + Gla - Glb``, the large parts first (a fresh tensor)."""
    return (Ga - Gb).add_(Gla).sub_(Glb)


_CONSTANTS = LRUCache(64)


def _constant(key: tuple, make):
    """A small constant tensor kept per ``key`` (its sizes, dtype and device) between calls, made by
    ``make()`` outside inference mode (so that any call may read it); read only. At most 64 are kept."""
    got = _CONSTANTS.get(key)
    if got is None:
        with torch.inference_mode(False):
            got = make()
        _CONSTANTS.put(key, got)
    return got


def _above(c: int, diagonal: int, device) -> torch.Tensor:
    """``[C, C]`` bool, True strictly above the diagonal ``diagonal`` (what a lower-triangular matrix
    with that diagonal leaves out; ``masked_fill_`` reads it); kept per (C, diagonal, device)."""
    return _constant(("above", c, diagonal, device),
                     lambda: torch.ones(c, c, dtype=torch.bool, device=device).triu_(diagonal + 1))


def _zero(dtype, device) -> torch.Tensor:
    """A 0-dim zero of ``dtype`` on ``device`` (the padded rows' ``g`` and ``beta``), kept."""
    return _constant(("zero", dtype, device), lambda: torch.zeros((), dtype=dtype, device=device))


def _grams_gdn(qk: torch.Tensor, G, Gl, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN: ``Aqk`` (lower incl. diagonal) and ``k k^T`` decayed (strictly lower), each ``[M, C, C]``.

    ``qk [M / group, 2, C, K]``: q and k per key head (the dot products are shared by the ``group``
    value heads of a key head, GVA); ``G, Gl [M, C]`` per value head."""
    mk, _, c, kd = qk.shape
    dots = torch.bmm(qk.view(mk, 2 * c, kd), qk[:, 1].transpose(1, 2)).view(mk, 1, 2, c, c)
    decay = _exp_le0(_diffs(G[:, :, None], Gl[:, :, None], G[:, None], Gl[:, None]))  # [M, C, C]
    grams = (dots * decay.view(mk, group, 1, c, c)).view(-1, 2, c, c)
    return grams[:, 0].tril_(), grams[:, 1].tril_(-1)  # (zeros above: as masked_fill_, 3-4x faster on these views)


def _factorised(qk, G, Gl) -> torch.Tensor:
    """``[M, 2, n, n]`` = ``sum_d x_rd k_sd exp(G_rd - G_sd)`` around each channel's midpoint ``c``
    (entries above the diagonal are finite junk: the caller masks them). Exact while every
    channel's range ``G_0 - G_(n-1)`` is at most ``2 * SAFE_HALF``: every factor is then normal."""
    m, _, n, kd = qk.shape
    c = (G[:, :1] + G[:, -1:]) * 0.5  # [M, 1, K]
    right = (qk[:, 1] * (c - G).sub_(Gl).clamp_(-2 * SAFE_HALF, 2 * SAFE_HALF).exp_()).transpose(1, 2)
    left = qk * (G - c).add_(Gl).clamp_(-2 * SAFE_HALF, 2 * SAFE_HALF).exp_()[:, None]
    return (left.reshape(m, 2 * n, kd) @ right).view(m, 2, n, n)


def _pairwise(qk, G, Gl) -> torch.Tensor:
    """``[M, 2, n, n]`` summed pairwise (only ``exp(G_r - G_s)`` with ``r >= s``, all ``<= 0``)."""
    n = G.shape[1]
    decay = _exp_le0(_diffs(G[:, :, None], Gl[:, :, None], G[:, None], Gl[:, None]))  # [M, r, s, K]
    decay.masked_fill_(_above(n, 0, G.device)[:, :, None], 0.0)
    ek = decay * qk[:, 1, None]  # exp(G_r - G_s) k_s
    return (ek[:, None] @ qk[..., None]).squeeze(-1)


def _blocked(qk, G, Gl) -> torch.Tensor:
    """``[M, 2, C, C]`` for chunks too steep to factorise whole: blocks of :data:`SUB` rows."""
    m, _, c, kd = qk.shape
    nb = c // SUB
    out = qk.new_zeros(m, 2, c, c)
    k = qk[:, 1]
    for j in range(nb - 1):
        cols, rows = slice(j * SUB, (j + 1) * SUB), slice((j + 1) * SUB, c)
        ref = slice((j + 1) * SUB - 1, (j + 1) * SUB)  # the last row of column block j
        right = (k[:, cols] * _exp_le0(_diffs(G[:, ref], Gl[:, ref], G[:, cols], Gl[:, cols]))).transpose(1, 2)
        left = qk[:, :, rows] * _exp_le0(_diffs(G[:, rows], Gl[:, rows], G[:, ref], Gl[:, ref]))[:, None]
        out[:, :, rows, cols] = (left.reshape(m, -1, kd) @ right).view(m, 2, -1, SUB)
    dq = qk.view(m, 2, nb, SUB, kd).transpose(1, 2).reshape(m * nb, 2, SUB, kd)
    dG, dGl = G.reshape(m * nb, SUB, kd), Gl.reshape(m * nb, SUB, kd)
    steep = (dG[:, 0] - dG[:, -1]).amax(-1) > 2 * SAFE_HALF
    diag = _factorised(dq, dG, dGl)
    if bool(steep.any()):
        diag[steep] = _pairwise(dq[steep], dG[steep], dGl[steep])
    grid = out.view(m, 2, nb, SUB, nb, SUB).diagonal(dim1=2, dim2=4)  # [M, 2, SUB, SUB, nb]
    grid.copy_(diag.view(m, nb, 2, SUB, SUB).permute(0, 2, 3, 4, 1))
    return out


def _grams_kda(qk: torch.Tensor, G, Gl) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA: ``Aqk`` and the decayed ``k k^T`` (strictly lower), ``[M, C, C]`` each; ``qk [M, 2, C, K]``,
    ``G, Gl [M, C, K]``. One matmul where every chunk's range fits, else :func:`_blocked`."""
    steep = bool(((G[:, 0] - G[:, -1]).amax(-1) > 2 * SAFE_HALF).any())
    grams = _blocked(qk, G, Gl) if steep else _factorised(qk, G, Gl)
    return grams[:, 0].tril_(), grams[:, 1].tril_(-1)  # (zeros above: as masked_fill_, 3-4x faster on these views)


BASE = 16
""":func:`_unit_lower_inverse`: diagonal blocks of this size are inverted by one batched triangular solve."""


def _unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` for strictly lower triangular ``A [M, C, C]`` (``C`` a power of two). The
    diagonal blocks of :data:`BASE` rows by one batched unit-triangular solve; then by doubling: the
    inverses of the diagonal blocks of size ``s`` give those of size ``2 s`` as
    ``[[X11, 0], [-X22 A21 X11, X22]]``, two batched matmuls a level. (Doubling from 1, or one solve
    for the whole ``C``: more operations on tiny matrices, measured slower on a CPU at 8 and 256
    chunk-heads, benchmarks/cpu_chunked.py's shapes.)"""
    m, c, _ = A.shape
    s = min(BASE, c)
    # diag + eye: a contiguous copy in the layout the solve was measured (and its bits pinned) with
    eye = _constant(("eye", s, A.dtype, A.device), lambda: torch.eye(s, dtype=A.dtype, device=A.device))
    diag = A.view(m, c // s, s, c // s, s).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # [M, c / s, s, s]
    X = torch.linalg.solve_triangular(diag + eye, eye.expand(diag.shape), upper=False, unitriangular=True)
    while s < c:
        nb = c // (2 * s)
        a21 = A.view(m, nb, 2 * s, nb, 2 * s).diagonal(dim1=1, dim2=3)[:, s:, :s].permute(0, 3, 1, 2)
        Y = A.new_zeros(m, nb, 2 * s, 2 * s)
        # X11 and X22 of every block in one copy (the diagonal of the 2 x 2 grid of s-blocks)
        Y.view(m, nb, 2, s, 2, s).diagonal(dim1=2, dim2=4).copy_(X.view(m, nb, 2, s, s).permute(0, 1, 3, 4, 2))
        a21x11 = torch.bmm(a21.reshape(-1, s, s), X[:, 0::2].view(-1, s, s))  # the [M, nb] batch as one
        torch.bmm(X[:, 1::2].view(-1, s, s), a21x11, out=Y[:, :, s:, :s].view(-1, s, s)).neg_()
        X, s = Y, 2 * s
    return X.view(m, c, c)


def _gather(x: torch.Tensor, rows: torch.Tensor, n: int, c: int) -> torch.Tensor:
    """Rows ``rows [n * C]`` of ``x [T, H, ...]`` as a ``[n, H, C, ...]`` view (one row gather, no other copy)."""
    return x.index_select(0, rows).view(n, c, *x.shape[1:]).transpose(1, 2)


_WORKSPACE = threading.local()
_inference_mode = torch.is_inference_mode_enabled


def _buffer(name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``shape`` tensor of ``like``'s dtype and device kept by this thread between
    calls under ``name`` (one per name, replaced when the shape changes): repeated prefills of one
    size reuse their largest buffers instead of asking the allocator for fresh pages each call (on
    the 2-vCPU VM of benchmarks/cpu_chunked.py a new page costs a fault of several microseconds).
    A buffer that would take the thread's kept bytes past :data:`WINDOW_BYTES` is returned without
    being kept (a window of one step of many sequences can exceed the window bound). A buffer made
    under ``torch.inference_mode`` is replaced, not written, by a call outside it."""
    cache = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    key = (name, like.dtype, like.device)
    buf = cache.get(key)
    # an inference tensor (made under torch.inference_mode) cannot be written outside it
    if buf is not None and tuple(buf.shape) == tuple(shape) and (not buf.is_inference() or _inference_mode()):
        return buf
    cache.pop(key, None)
    buf = like.new_empty(shape)
    if buf.nbytes + sum(b.nbytes for b in cache.values()) <= WINDOW_BYTES:
        cache[key] = buf
    return buf


def clear_workspace() -> None:
    """Drop the buffers this thread keeps between prefills (:func:`_buffer`; at most
    :data:`WINDOW_BYTES` of them, 56 MiB after a 1 x 2,048-token GDN prefill at HV = 8, K = V = 128)."""
    _WORKSPACE.__dict__.pop("buffers", None)


def _scaled_qk(qs, ks, rows, n: int, c: int) -> torch.Tensor:
    """``[n, H, 2, C, K]``: the chunks' q and k rows as the maths reads them (:func:`_row_factors`)."""
    x = qs[0]
    out = _buffer("qk", (n, x.shape[1], 2, c, x.shape[2]), x)
    for i, (y, f) in enumerate((qs, ks)):
        torch.mul(_gather(y, rows, n, c), _gather(f, rows, n, c) if torch.is_tensor(f) else f, out=out[:, :, i])
    return out


def _window(inp, tok, real, S, steps, lo: int, hi: int, group: int, kda: bool, store=None):
    """Chunks ``lo:hi`` of a window (steps ``[(first chunk, running)]``); ``S [n, HV, K, V]`` updated in
    place. Returns ``O [hi - lo, HV, C, V]``; ``store(first, S[:running])`` is called before each step
    with the states entering its chunks ``first, first + 1, ...`` (the checkpoints read them)."""
    qs, ks, v, g, beta = inp
    if lo or hi < tok.shape[0]:  # one of several windows (one window: no views made)
        tok, real = tok[lo:hi], real[lo:hi]
    n, _, c = tok.shape
    rows, keep = tok.view(-1), real
    qk = _scaled_qk(qs, ks, rows, n, c)  # [n, H, 2, C, K]
    H, kd = qk.shape[1], qk.shape[-1]
    HV = H * group
    M = n * HV
    vv = _gather(v, rows, n, c)  # [n, HV, C, V], a strided view
    gg, zero = _gather(g, rows, n, c), _zero(g.dtype, g.device)  # padded rows: g = beta = 0
    gg = torch.where(keep.view(n, 1, c, *(1,) * (g.dim() - 2)), gg, zero, out=_buffer("g", gg.shape, g))
    bb = torch.where(keep, _gather(beta, rows, n, c), zero, out=_buffer("beta", (n, HV, c), beta)).view(M, c, 1)
    G, Gl = cumsum2(gg.view(M, c, *gg.shape[3:]))
    tail = _exp_le0(_diffs(G[:, -1:], Gl[:, -1:], G, Gl))  # exp(G_C - G_r): 1 on the last row
    if kda:
        if group > 1:  # GVA: value head hv reads q/k head hv // group
            qkv = qk[:, :, None].expand(n, H, group, 2, c, kd).reshape(M, 2, c, kd)
        else:
            qkv = qk.view(M, 2, c, kd)
        Aqk, Akk = _grams_kda(qkv, G, Gl)
        eG = _exp_le0(G)  # [M, C, K] (G is not read again)
        dC = eG[:, -1:].transpose(1, 2)  # [M, K, 1]
        qkE = torch.mul(qkv, eG[:, None], out=_buffer("qkE", qkv.shape, qkv))
        kT = torch.mul(qkv[:, 1], tail, out=_buffer("kT", (M, c, kd), qkv))
    else:
        Aqk, Akk = _grams_gdn(qk.view(n * H, 2, c, kd), G, Gl, group)
        eG = _exp_le0(G)  # [M, C]
        dC = eG[:, -1:, None]  # [M, 1, 1]
        qkE = torch.mul(qk[:, :, None], eG.view(n, H, group, 1, c, 1),  # GVA by broadcasting
                        out=_buffer("qkE", (n, H, group, 2, c, kd), qk)).view(M, 2, c, kd)
        kT = torch.mul(qk[:, :, None, 1], tail.view(n, H, group, c, 1),
                       out=_buffer("kT", (n, H, group, c, kd), qk)).view(M, c, kd)
    Xb = _unit_lower_inverse(Akk.mul_(bb)).mul_(bb.view(M, 1, c))  # (I + Akk)^-1 diag(beta)
    O = _recurrence(S, qkE.view(M, 2 * c, kd), vv, Xb, Aqk, kT.transpose(1, 2), dC, steps, lo, store)
    return O.view(n, HV, c, -1)


def _recurrence(S: torch.Tensor, qkE, vv, Xb, Aqk, kt, dC, steps: list, lo: int, store=None) -> torch.Tensor:
    """The serial part, over the steps ``[(first chunk, running)]`` of a window whose first chunk is
    ``lo``: a step's rows are the running sequences' value heads, a prefix of ``S [n, HV, K, V]``'s
    and consecutive rows of the window's ``qkE [M, 2C, K]`` (``[Q exp(G); K exp(G)]``), ``Xb``,
    ``Aqk [M, C, C]``, ``kt [M, K, C]``, ``dC`` and chunks of ``vv [n, HV, C, V]``. Per step:
    ``P = qkE S`` (one matmul), ``Vn = Xb (V - K exp(G) S)``, the output ``O = P[:C] + Aqk Vn``
    (into a contiguous buffer: a product added into the strided ``P[:, :C]`` ran several times slower
    with two threads) and ``S = dC * S + kt Vn`` in place. Returns ``O [M, C, V]``."""
    hv, kd, vd = S.shape[1:]
    c = Xb.shape[-1]
    Sf = S.view(-1, kd, vd)
    P, O = _buffer("P", (qkE.shape[0], 2 * c, vd), qkE), _buffer("O", (qkE.shape[0], c, vd), qkE)
    width = steps[0][1] * hv  # the most rows a step has
    R, Vn = _buffer("R", (width, c, vd), qkE), _buffer("Vn", (width, c, vd), qkE)
    full = Sf.shape[0]
    for first, running in steps:
        a, b = (first - lo) * hv, running * hv
        s, r, vn = (Sf, R, Vn) if b == full else (Sf[:b], R[:b], Vn[:b])  # (no views made for a full step)
        p = P[a:a + b]
        if store is not None:
            store(first, S[:running])
        torch.bmm(qkE[a:a + b], s, out=p)
        torch.sub(vv[first - lo:first - lo + running], p[:, c:].view(running, hv, c, vd),
                  out=r.view(running, hv, c, vd))  # V - K exp(G) S
        torch.bmm(Xb[a:a + b], r, out=vn)
        torch.baddbmm(p[:, :c], Aqk[a:a + b], vn, out=O[a:a + b])
        s.mul_(dC[a:a + b]).baddbmm_(kt[a:a + b], vn)
    return O


def _plan(lens: list[int], order: list[int], hv: int, kd: int, vd: int, itemsize: int, c: int = CHUNK):
    """Chunk numbering (step-major over the sequences ``order``, longest first) and its windows.

    Returns ``(chunk_seq, chunk_j, windows)``: for every chunk its sequence's position in ``order``
    and its index ``j``; ``windows`` a list of ``(lo, hi, [(first chunk, running)])``, each window
    holding at most :data:`WINDOW_BYTES` of :func:`_window`'s per-chunk buffers (at least one step)."""
    counts = [-(-lens[n] // c) for n in order]  # non-increasing
    chunk_seq, chunk_j, steps = [], [], []
    for j in range(counts[0] if counts else 0):
        running = sum(1 for c in counts if c > j)
        steps.append((len(chunk_seq), running))
        chunk_seq.extend(range(running))
        chunk_j.extend([j] * running)
    per_chunk = hv * itemsize * (c * (3 * kd + 3 * vd) + 3 * c * c)  # [Q; K] exp(G), K exp(G_C - G), P, O, V; Aqk, X, grams
    windows, cur = [], []
    for first, running in steps:
        if cur and (first + running - cur[0][0]) * per_chunk > WINDOW_BYTES:
            windows.append((cur[0][0], first, cur))
            cur = []
        cur.append((first, running))
    if cur:
        windows.append((cur[0][0], len(chunk_seq), cur))
    return chunk_seq, chunk_j, windows


def _load_states(src, rows: list, dims: tuple, layout: str, cd, dev) -> torch.Tensor:
    """``S [n, HV, K, V]`` (maths layout, ``cd``): ``S[i] = src[rows[i]]`` through any strides and
    layout, zeros where ``rows[i]`` is None (nothing read)."""
    if all(r is None for r in rows):  # fresh sequences (a dense call without initial state): one fill
        return torch.zeros(len(rows), *dims, dtype=cd, device=dev)
    S = torch.empty(len(rows), *dims, dtype=cd, device=dev)
    view = None if None in rows else _rows_view(src, rows)
    if view is not None:  # rows in an increasing progression (in order, or consecutive slots): one copy
        return S.copy_(view.transpose(-1, -2) if layout == "vk" else view)
    for i, r in enumerate(rows):
        if r is None:
            S[i].zero_()
        else:
            S[i].copy_(src[r].transpose(-1, -2) if layout == "vk" else src[r])
    return S


def _slots(state_pool, state_indices, initial_state, has_initial_state, output_state_indices, lens: list,
           dims: tuple, layout: str, cd, dev):
    """``(slots, dests, carry, final)``: each sequence's state row to read (pool slot, negative =
    padding; dense: its index) and to write (``output_state_indices`` when given, else the same),
    whether it starts from that row's state, and dense mode's final-state tensor (None in pool
    mode). An empty pool sequence's final state is its initial state: written here (zeros when
    fresh; a copy of the read slot when the write slot is another)."""
    N = len(lens)
    if state_pool is not None:
        slots = [int(s) for s in state_indices.tolist()]
        dests = slots if output_state_indices is None else [int(s) for s in output_state_indices.tolist()]
        carry = [True] * N if has_initial_state is None else [bool(x) for x in has_initial_state.tolist()]
        store_empty_sequences(state_pool, slots, dests, carry, lens)
        return slots, dests, carry, None
    if initial_state is not None:
        rows = list(range(N))
        return rows, rows, [True] * N, initial_state.clone(memory_format=torch.contiguous_format)
    hv, kd, vd = dims
    shape = (N, hv, vd, kd) if layout == "vk" else (N, hv, kd, vd)
    rows = list(range(N))
    return rows, rows, [False] * N, torch.zeros(shape, dtype=cd if cd == torch.float64 else torch.float32, device=dev)


def _rows(chunk_seq: list, chunk_j: list, starts: list, lens: list, c: int, dev):
    """Token rows ``tok [chunks, C]`` of every chunk (``_plan``'s numbering) and which are real; a padded
    row points at its sequence's first token (a real row of its own sequence)."""
    cs = torch.tensor(chunk_seq, dtype=torch.long, device=dev)
    start = torch.tensor(starts, dtype=torch.long, device=dev)[cs, None]
    off = torch.tensor(chunk_j, dtype=torch.long, device=dev)[:, None] * c + torch.arange(c, device=dev)
    real = off < torch.tensor(lens, dtype=torch.long, device=dev)[cs, None]
    return torch.where(real, start + off, start), real


_LAYOUTS = LRUCache(32)
LAYOUT_ROWS = 1 << 16
"""Chunk layouts (:func:`_layout`) of at most this many padded token rows are kept between calls."""


def _layout(starts: tuple, lens: tuple, T: int, c: int, dims: tuple, itemsize: int, dev):
    """``(windows, tok, real, dest, heads)`` for sequences ``starts`` / ``lens`` (longest first): :func:`_plan`'s
    windows, :func:`_rows`' token rows and realness, each chunk row's output row ``dest`` (``T`` for a
    padded row), all three ``[chunks, 1, C]``, and ``heads = arange(HV)[:, None]`` (the output scatter's
    index). Kept per
    argument set (the layers of one forward repeat a call's layout; at most 32 layouts of at most
    :data:`LAYOUT_ROWS` rows), so a repeated layout costs no host planning and no torch operations."""
    key = (starts, lens, T, c, dims, itemsize, dev, WINDOW_BYTES)  # WINDOW_BYTES: _plan's windows depend on it
    got = _LAYOUTS.get(key)
    if got is not None:
        return got
    chunk_seq, chunk_j, windows = _plan(list(lens), list(range(len(lens))), *dims, itemsize, c)
    with torch.inference_mode(False):  # kept: readable by calls in and out of inference mode
        tok, real = _rows(chunk_seq, chunk_j, list(starts), list(lens), c, dev)
        dest = torch.where(real, tok, T)
        got = (windows, tok[:, None], real[:, None], dest[:, None], torch.arange(dims[0], device=dev)[:, None])
    if len(chunk_seq) * c <= LAYOUT_ROWS:
        _LAYOUTS.put(key, got)  # LRUCache: thread-safe eviction (the backend's calls may come from several threads)
    return got


@pinned_fp32_matmul
def chunked_prefill(q, k, v, g, beta, cu_seqlens, state_pool=None, state_indices=None, initial_state=None,
                    scale=None, use_qk_l2norm=True, state_layout="vk", *, has_initial_state=None,
                    output_state_indices=None, checkpoint_every=None, checkpoint_indices=None,
                    compute_dtype: Optional[torch.dtype] = None):
    """GDN (``g [T, HV]``) or KDA (``g [T, HV, K]``) varlen prefill in chunked form (module docstring).

    Args:
        q, k: ``[T, H, K]`` (all sequences packed; bf16, fp16, fp32 or fp64; may be strided).
        v: ``[T, HV, V]``, ``HV`` a multiple of ``H`` (GVA: value head ``hv`` reads q/k head
            ``hv // (HV // H)``).
        g: log decays (<= 0; floored at -1000), GDN ``[T, HV]``, KDA ``[T, HV, K]``.
        beta: ``[T, HV]``.
        cu_seqlens: ``[N + 1]`` int32/int64 prefix sums; zero-length sequences anywhere, ``T = 0``.
        state_pool, state_indices: pool mode: ``[P, HV, V, K]`` ("vk") or ``[P, HV, K, V]``
            ("kv"), fp32 / bf16 / fp64, any strides; ``h0`` read from slot ``state_indices[n]``
            and ``ht`` written back in place (negative: padding, zero output, slot neither read
            nor written; every other row of the pool is left bitwise unchanged).
        initial_state: dense mode: ``[N, HV, V, K]`` / ``[N, HV, K, V]`` or None (zeros).
        scale: q scale (None = ``K ** -0.5``). use_qk_l2norm: l2-normalise q and k (docs/ops.md).
        state_layout: ``"vk"`` or ``"kv"``.
        has_initial_state: pool mode, optional ``[N]`` bool: False starts that sequence from a zero
            state without reading its slot (its final state is written there as usual).
        output_state_indices: pool mode, optional ``[N]``: the final state of sequence ``n`` goes to
            slot ``output_state_indices[n]`` and ``state_indices[n]`` is only read (None: in place).
        checkpoint_every, checkpoint_indices: pool mode (docs/ops.md "State checkpoints"): slot ``[n, j]`` gets
            the state entering the chunk after ``(j + 1) * checkpoint_every`` tokens (at the length: the final state).
        compute_dtype: float32 or float64; None: float64 when q, the pool or the initial state
            is float64, else float32.

    Returns:
        ``(o [T, HV, V] in q's dtype, final_state)``: None in pool mode; in dense mode a new tensor
        in ``initial_state``'s layout and dtype (float32, or float64 when computing in float64,
        without one). An empty sequence's final state is its initial state.

    Example:
        >>> T, H, K = 70, 1, 8
        >>> o, ht = chunked_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K),
        ...                         -torch.rand(T, H), torch.rand(T, H), torch.tensor([0, 5, 70]))
        >>> tuple(o.shape), tuple(ht.shape)
        ((70, 1, 8), (2, 1, 8, 8))
    """
    cd = compute_dtype or (torch.float64 if any(t is not None and t.dtype == torch.float64
                                                 for t in (q, state_pool, initial_state)) else torch.float32)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    cu, lens = seq_lengths(cu_seqlens)
    N = len(lens)
    pool_mode = state_pool is not None
    slots, dests, carry, final = _slots(state_pool, state_indices, initial_state, has_initial_state,
                                        output_state_indices, lens, (HV, K, V), state_layout, cd, dev)
    order = sorted((n for n in range(N) if slots[n] >= 0 and lens[n] > 0), key=lambda n: -lens[n])
    every_row = sum(lens[n] for n in order) == T  # then every output row is written below
    o = (torch.empty if every_row else torch.zeros)(T + 1, HV, V, dtype=cd, device=dev)  # row T: the padded rows
    if not order:
        return o[:T].to(q.dtype), final

    S = _load_states(state_pool if pool_mode else initial_state, [slots[n] if carry[n] else None for n in order],
                     (HV, K, V), state_layout, cd, dev)
    qs = _row_factors(q.to(cd), use_qk_l2norm, K ** -0.5 if scale is None else scale)
    inp = (qs, _row_factors(k.to(cd), use_qk_l2norm, 1.0), v.to(cd), torch.clamp(g.to(cd), min=G_MIN), beta.to(cd))

    C = chunk_size(lens[order[0]])
    windows, tok, real, dest, heads = _layout(tuple(cu[n] for n in order), tuple(lens[n] for n in order), T, C,
                                              (HV, K, V), torch.finfo(cd).bits // 8, dev)
    marks, ends = _checkpoint_marks(checkpoint_every, checkpoint_indices, order, lens, C)
    for lo, hi, steps in windows:
        store = _checkpoint_store(state_pool, marks, state_layout) if any(lo <= ci < hi for ci in marks) else None
        O = _window(inp, tok, real, S, steps, lo, hi, HV // H, g.dim() == 3, store)  # [n, HV, C, V]
        o.index_put_((dest if len(windows) == 1 else dest[lo:hi], heads), O)

    return o[:T].to(q.dtype), _store_states(S, state_pool, final, [dests[n] for n in order], ends, state_layout,
                                            order == list(range(N)))


def _store_states(S, state_pool, final, rows: list, ends: dict, state_layout: str, in_order: bool):
    """Write the final states ``S [n, HV, K, V]`` (in the order of ``rows``) to the pool's rows ``rows`` (pool
    mode) or to ``final``'s (dense), and to each checkpoint row at exactly a sequence's length (``ends``: index
    in ``rows`` -> pool rows); a negative row (padding, or a write slot refused under ``validate=False``) is not
    written. Returns the dense final state: ``S`` itself where it already is one (dense, every sequence
    in order, the maths' ``kv`` layout and dtype), else ``final`` (None in pool mode)."""
    pool_mode = state_pool is not None
    if not pool_mode and state_layout == "kv" and S.dtype == final.dtype and in_order and not ends:
        return S
    dst = state_pool if pool_mode else final
    W = None if ends else _rows_view(dst, rows)
    if W is not None:  # rows in an increasing progression (a dense call in order, consecutive slots): one copy
        W.copy_(S.transpose(-1, -2) if state_layout == "vk" else S)
        return final
    for i, dest in enumerate(rows):
        for row in (r for r in (dest, *ends.get(i, ())) if r >= 0):
            dst[row].copy_(S[i].transpose(-1, -2) if state_layout == "vk" else S[i])
    return final


def _checkpoint_store(pool, marks: dict, layout: str):
    """The ``store`` of :func:`_window`: pool slot ``marks[ci]`` = the state entering chunk ``ci`` (the
    state after the chunks before it), copied before chunk ``ci`` runs."""
    def store(first: int, entering: torch.Tensor) -> None:
        for i in range(entering.shape[0]):
            if first + i in marks:
                pool[marks[first + i]].copy_(entering[i].transpose(-1, -2) if layout == "vk" else entering[i])
    return store


def _checkpoint_marks(every, table, order: list, lens: list, c: int) -> tuple[dict, dict]:
    """Where the checkpoints are, in :func:`_plan`'s chunk numbering: ``({chunk: slot}, {i: [slot]})``,
    the first for a checkpoint that is the state entering that chunk, the second for one at exactly
    the length of sequence ``order[i]`` (its final state). Empty without checkpoints. ``every`` is a
    multiple of the chunk ``c`` (any call with a checkpoint inside a sequence has ``c`` = 64)."""
    out: dict = {}
    ends: dict = {}
    if table is None:
        return out, ends
    rows = table.tolist()
    counts = [-(-lens[n] // c) for n in order]
    for i, n in enumerate(order):
        for j, slot in enumerate(rows[n]):
            t = (j + 1) * every
            if slot < 0 or t > lens[n]:
                continue
            if t == lens[n]:
                ends.setdefault(i, []).append(slot)
                continue
            ci = t // c  # the chunk that starts after t tokens: step ci, sequence position i
            out[sum(min(cnt, ci) for cnt in counts) + i] = slot
    return out, ends


def _row_factors(x: torch.Tensor, l2norm: bool, scale: float) -> tuple:
    """``(x', f)`` with ``x' * f`` the rows of ``x [T, H, K]`` as the maths reads them: l2-normalised
    (docs/ops.md's plain ``x / sqrt(sum(x^2) + 1e-6)``, as ``f = scale / sqrt(...)`` ``[T, H, 1]``, applied
    while the rows are gathered into chunks) and scaled. A row whose sum of squares is not finite (past
    ``2**64``, or NaN / inf in it) takes torch-ref's overflow-safe l2norm (F44) instead, that row only,
    so that the other rows' bits do not depend on it (F29; one host read: whether any row is such)."""
    if not l2norm:
        return x, scale
    ss = torch.linalg.vecdot(x, x).unsqueeze_(-1)
    if math.isfinite(ss.sum().item()):  # the common case, in one reduction and one read (the sum of
        f = ss.add_(1e-6).sqrt_().reciprocal_()  # (the sum of finite squares may overflow: then below)
        return x, f if scale == 1.0 else f.mul_(scale)
    bad = ~torch.isfinite(ss)
    f = ss.add_(1e-6).sqrt_().reciprocal_().mul_(scale)
    return torch.where(bad, l2norm_ref(x), x), torch.where(bad, torch.full_like(f, scale), f)


GATHER_ROW_BYTES = 128 << 10
"""Scattered slots (neither one view of the pool nor ``output_state_indices`` that are) are gathered into
one batch with ``index_select`` and written back with ``index_copy_`` when a row's state is smaller than
this; larger rows run the state passes row by row through views of the pool (the two extra copies would
cost more than the per-row calls)."""


def plain_decode(call: DecodeCall) -> bool:
    """Whether :func:`decode_step` runs the call: one token (``T = 1``, ``state_indices [N]``), an fp32
    pool and non-fp64 inputs, no intermediate states, ``num_accepted_tokens`` or ``has_initial_state``
    (every other decode runs torch-ref's code, the same results)."""
    return _plain(call.q, call.state_indices, call.state_pool, call.intermediate_states, call.num_accepted_tokens,
                  call.has_initial_state)


def _plain(q, state_indices, pool, intermediate_states, num_accepted_tokens, has_initial_state) -> bool:
    return (q.shape[1] == 1 and state_indices.dim() == 1 and pool.dtype == torch.float32
            and q.dtype != torch.float64 and intermediate_states is None
            and num_accepted_tokens is None and has_initial_state is None)


def _rows_view(pool: torch.Tensor, slots: list) -> Optional[torch.Tensor]:
    """``pool[slots]`` as a view when ``slots`` is an increasing arithmetic progression ``s, s + d, ...``
    (one slot, consecutive slots, every other slot, ...; ``pool`` itself for every slot in order), else None."""
    s, n = slots[0], len(slots)
    if s < 0:
        return None
    d = slots[1] - s if n > 1 else 1
    if n > 1 and (d <= 0 or slots != list(range(s, s + d * n, d))):
        return None
    if d == 1:
        return pool if s == 0 and n == pool.shape[0] else pool.narrow(0, s, n)
    return pool[s:s + d * (n - 1) + 1:d]


@pinned_fp32_matmul
def decode_step(call: DecodeCall) -> torch.Tensor:
    """One decode token for every row, in place on an fp32 pool (the case :func:`plain_decode` names).

    Per row and value head, with ``d = exp(g)`` (KDA: per key channel), ``q`` and ``k`` l2-normalised
    (``x * rsqrt(sum(x^2) + 1e-6)``, ``q`` times ``scale``) and ``S`` the stored state: ``[S^T (d q),
    S^T (d k)]`` in one batched product over ``S``, ``u = beta (v - S^T (d k))``, ``o = S^T (d q) +
    (q . k) u`` and ``S = d S + k u^T`` (two in-place passes; skipped with ``disable_state_update``).
    The same maths as torch-ref's ``_step_`` (docs/ops.md, "Decode"), in fewer passes over the state
    and about 20 small torch operations whatever N, HV or GVA (value head ``hv`` reads key head
    ``hv // (HV // H)`` by broadcasting, never an expanded copy).

    The state: one view of the pool when the rows read (and write) slots in an increasing arithmetic
    progression (consecutive slots, one row); else gathered with ``index_select`` and written back
    with ``index_copy_`` (rows of at most :data:`GATHER_ROW_BYTES`), or row by row through views.
    With ``output_state_indices`` a row's read slot is advanced into its write slot (the bits of an
    in-place call on that slot). Padding rows (negative slot): zero output, slot untouched; no slot
    but the rows' own is read or written. A row whose ``sum(q^2)`` or ``sum(k^2)`` is not finite
    takes torch-ref's overflow-safe l2norm (F44), that row only (F29; one host read: whether any is).
    Returns ``o [N, 1, HV, V]`` in q's dtype.
    """
    kda = call.family == "kda"
    if call.g is not None:
        gates = (call.g, call.beta)
    else:
        gates = (call.A_log, call.a, call.b, call.dt_bias,
                 dict(softplus_beta=call.softplus_beta, softplus_threshold=call.softplus_threshold,
                      **({"lower_bound": call.lower_bound} if kda else {})))
    return _decode(kda, call.q, call.k, call.v, gates, call.state_pool, call.state_indices,
                   call.output_state_indices, call.scale, call.use_qk_l2norm, call.state_layout == "vk",
                   not call.disable_state_update)


def _decode(kda: bool, q, k, v, gates: tuple, pool, idx, out_idx, scale: float, l2norm: bool, vk: bool,
            update: bool) -> torch.Tensor:
    """:func:`decode_step`'s body on the call's tensors; ``gates`` is ``(g, beta)`` or ``(A_log, a, b,
    dt_bias, gating keywords)``. Matmuls pinned by the caller."""
    N, _, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    r = HV // H
    per_row = gates if len(gates) == 2 else gates[1:3]  # (g, beta) or (a, b): [N, 1, HV(, K)]
    slots = idx.tolist()
    dests = slots if out_idx is None else out_idx.tolist()
    if N and min(slots) >= 0:  # every row runs: the inputs are read in place
        sel, n = None, N
        x1, y1 = per_row
    else:  # the running rows' inputs gathered
        rows = [i for i in range(N) if slots[i] >= 0]
        if not rows:
            return q.new_zeros(N, 1, HV, V)
        n, sel = len(rows), torch.tensor(rows, device=q.device)
        slots, dests = [slots[i] for i in rows], [dests[i] for i in rows]
        q, k, v, x1, y1 = (x.index_select(0, sel) for x in (q, k, v, *per_row))
    if len(gates) == 2:  # the gate form: g [n, 1, HV] (KDA [n, 1, HV, K]) and beta [n, 1, HV], fp32
        d = torch.exp(x1 if x1.dtype == torch.float32 else x1.float())  # = exp(max(g, G_MIN)) in fp32
        beta1 = y1 if y1.dtype == torch.float32 else y1.float()
    else:  # the raw form (a, b): torch-ref's gating, its bits (g floored at G_MIN)
        g1, beta1 = (kda_gating_ref if kda else gdn_gating_ref)(gates[0], x1, y1, gates[3], **gates[4])
        d = g1.exp_()
    qk = torch.cat((q, k), 1)  # [n, 2, H, K]: q's rows, then k's
    if qk.dtype != torch.float32:
        qk = qk.float()
    if not qk.is_contiguous():  # cat keeps a channels-last order of strided q, k: the row sums below read rows
        qk = qk.contiguous()
    if l2norm:
        fold = 2.0 ** -60 <= scale <= 2.0 ** 60  # scale^-2 within fp32's range: folded into the norm
        c, eps_c = _scale_consts(scale if fold else 1.0, qk.device)
        f = torch.addcmul(eps_c, torch.mul(qk, qk).sum(-1, keepdim=True), c)  # [n, 2, H, 1]: (ss + eps) c
        if not math.isfinite(f.sum().item()):  # one host read: a row past fp32's range (or NaN / inf in it)
            bad = ~torch.isfinite(f)  # takes torch-ref's overflow-safe l2norm (F44), that row only (F29)
            f = torch.where(bad, c, f)
            qk = torch.where(bad, l2norm_ref(qk), qk)
        qk.mul_(f.rsqrt_())  # q * scale / sqrt(sum(q^2) + eps), k / sqrt(sum(k^2) + eps)
        if not fold:
            qk.select(1, 0).mul_(scale)
    elif scale != 1.0:
        qk.select(1, 0).mul_(scale)
    qn, kn = qk.select(1, 0), qk.select(1, 1)  # [n, H, K]
    qk_dot = torch.mul(qn, kn).sum(-1, keepdim=True).unsqueeze(-1)  # q . k per key head [n, H, 1, 1] (vecdot's ops)
    # d grouped as (key head, value heads of that key head): GDN [n, H, r, 1, 1], KDA [n, H, r, 1, K]
    dg = d.view(n, H, r, 1, K) if kda else d.view(n, H, r, 1, 1)
    dqk = torch.empty(n, HV, 2, K, dtype=qk.dtype, device=qk.device)  # (d q, d k) per value head, as rows
    torch.mul(qk.transpose(1, 2).unsqueeze(2), dg, out=dqk.view(n, H, r, 2, K))  # GVA: a broadcast, no copy
    S, gathered = _rows_view(pool, slots), False
    if S is None and HV * K * V * pool.element_size() <= GATHER_ROW_BYTES and min(dests) >= 0:
        S, gathered = pool.index_select(0, idx if sel is None else torch.tensor(slots, device=q.device)), True
    if S is not None:
        P = _batched_product(dqk, S, vk)  # [n, HV, 2, V]
    else:  # large rows at scattered slots: the state passes row by row
        P = torch.cat([torch.matmul(dqk.narrow(0, i, 1), pool.narrow(0, s, 1).transpose(-1, -2) if vk
                                    else pool.narrow(0, s, 1)) for i, s in enumerate(slots)])
    # u = beta (v - (d k)^T S), o = (d q)^T S + (q . k) u, grouped [n, H, r, V]
    u = torch.sub(v.view(n, HV, V), P.select(2, 1)).mul_(beta1.view(n, HV, 1)).view(n, H, r, V)
    o = torch.addcmul(P.select(2, 0).view(n, H, r, V), qk_dot, u)
    if update:
        if vk:  # S [., HV, V, K] grouped [., H, r, V, K]: d S + u k^T
            dS, u5, k5 = (d.view(n, H, r, 1, K) if kda else dg), u.view(n, H, r, V, 1), kn.view(n, H, 1, 1, K)
        else:  # S [., HV, K, V]: d S + k u^T
            dS, u5, k5 = (d.view(n, H, r, K, 1) if kda else dg), u.view(n, H, r, 1, V), kn.view(n, H, 1, K, 1)
        _advance(pool, S, gathered, slots, dests, dS, u5, k5)
    o = o.reshape(n, 1, HV, V)  # a view when o is contiguous (its operands' strides decide)
    if o.dtype != q.dtype:
        o = o.to(q.dtype, memory_format=torch.contiguous_format)
    elif not o.is_contiguous():  # strided v or beta (read as given) can give o their order: the op returns it dense
        o = o.contiguous()
    if sel is None:
        return o
    return q.new_zeros(N, 1, HV, V).index_copy_(0, sel, o)


def _batched_product(dqk: torch.Tensor, S: torch.Tensor, vk: bool) -> torch.Tensor:
    """``dqk [n, HV, 2, K] @ S [n, HV, K, V]`` (``S`` read transposed in the vk layout): one ``bmm`` over the
    ``n * HV`` states where ``S``'s first two dims fold into one (what ``matmul`` runs for these shapes,
    without its reshapes), else ``matmul``."""
    n, HV = S.shape[0], S.shape[1]
    if n * HV and S.stride(0) == HV * S.stride(1):
        S3 = S.view(n * HV, *S.shape[2:])
        P = torch.bmm(dqk.view(n * HV, *dqk.shape[2:]), S3.transpose(1, 2) if vk else S3)
        return P.view(n, HV, *P.shape[1:])
    return torch.matmul(dqk, S.transpose(-1, -2) if vk else S)


_SCALES: dict = {}


def _scale_consts(scale: float, device) -> tuple:
    """``c = [scale^-2, 1]`` and ``eps c`` as ``[2, 1, 1]`` fp32 tensors, kept per (scale, device): the
    l2norm's ``rsqrt(ss c + eps c)`` is ``scale / sqrt(ss + eps)`` for q and ``1 / sqrt(ss + eps)`` for k
    in one operation (a tensor operand also costs less than a Python scalar's conversion)."""
    key = (scale, device)
    got = _SCALES.get(key)
    if got is None:
        if len(_SCALES) > 64:
            _SCALES.clear()
        c = torch.tensor([[[scale ** -2]], [[1.0]]], dtype=torch.float32, device=device)
        got = _SCALES[key] = (c, c * 1e-6)
    return got


def _advance(pool, S: Optional[torch.Tensor], gathered: bool, slots: list, dests: list, dS, u5, k5) -> None:
    """``S = d S + (u k^T or k u^T)`` into the write slots: ``S`` the rows' states gathered (written back
    with ``index_copy_``), a view of the pool (written in place, or copied first into the write slots'
    view), or None (row by row)."""
    n, H, r = dS.shape[:3]
    if gathered:
        S.view(n, H, r, *S.shape[2:]).mul_(dS).addcmul_(u5, k5)
        pool.index_copy_(0, torch.tensor(dests, device=pool.device), S)
        return
    W = None if S is None else S if dests == slots else _rows_view(pool, dests)
    if W is None:
        _update_rows(pool, slots, dests, dS, u5, k5)
        return
    if W is not S:  # separate write slots in one view: the read states copied there first
        W.copy_(S)
    W.view(n, H, r, *W.shape[2:]).mul_(dS).addcmul_(u5, k5)


def _update_rows(pool, slots: list, dests: list, dS, u5, k5) -> None:
    """The state update row by row through views of the pool: row ``i`` reads ``slots[i]`` and writes
    ``dests[i]`` (a negative write slot, only with validate=False, stores nothing, as in torch-ref)."""
    for i, (s, w) in enumerate(zip(slots, dests)):
        if w < 0:
            continue
        S = pool.narrow(0, s, 1)
        if w != s:  # separate write slot: the state is advanced there (validated: no one reads it)
            S = pool.narrow(0, w, 1).copy_(S)
        S.view(1, *dS.shape[1:3], *S.shape[2:]).mul_(dS.narrow(0, i, 1)).addcmul_(u5.narrow(0, i, 1),
                                                                                   k5.narrow(0, i, 1))


class TorchChunkedBackend(Backend):
    """Chunked-form GDN and KDA prefill (``C = 64``) and a lean single-token decode in PyTorch, any device.

    Prefill: ranked ``Rank.CPU_FIRST`` (4: ahead of torch-ref's ``CPU_DEFAULT`` and of the cpu-chunked
    example's ``PREFERRED``) on a CPU when a prefill averages at least :data:`SHORT` tokens per
    sequence, the embedded prefill default; else ``Rank.CHUNKED_FALLBACK`` (500): behind torch-ref
    on a CPU for short sequences, and on a GPU behind every GPU kernel but ahead of the token-serial
    reference, so it runs where no kernel fits (a head dim, dtype or device no kernel takes).
    Decode: :func:`decode_step` for one token over an fp32 pool (fewer passes over the state than
    torch-ref's step), torch-ref's own code for every other decode (verify, intermediate states,
    bf16 or fp64 pools, has_initial_state, bit for bit); the CPU's decode default (``Rank.CPU_DECODE``,
    8: ahead of torch-ref, behind a plugin ranked ``PREFERRED``; measured 1.3-5x faster than torch-ref's
    decode through the public op at the targets' shapes, docs/performance.md#torch-chunked-on-the-cpu),
    behind torch-ref elsewhere (``Rank.BEHIND_REFERENCE``). torch-ref stays the float64 oracle. Computes in float32, or float64 for float64 q, pool or
    initial state.
    """

    name = "torch-chunked"
    api_version = "2"
    summary = f"PyTorch chunked-form (C={CHUNK}) GDN/KDA prefill, batched over chunks and heads; any device"
    ops = frozenset({"gdn_prefill", "kda_prefill", "gdn_decode", "kda_decode"})
    vendors = ALL_VENDORS
    dtypes = frozenset({"float32", "bfloat16", "float16", "float64"})
    state_dtypes = frozenset({"float32", "bfloat16", "float64"})
    state_layouts = frozenset({"vk", "kv"})
    strided_state_ops = frozenset(ops)  # pool rows through views and copy_: any strides
    #: The decode reads every read-only argument through its strides (:func:`_decode`: ``cat``, elementwise
    #: ops, ``index_select`` and views that only split a dim or drop one of size 1; any other decode runs
    #: torch-ref's code, which reads any view), so a layer's strided q / k / v (e.g. transformers' split of
    #: one projection) is not copied per call. The prefill reads q / k / v rows with a unit last stride in place
    #: (:func:`_row_factors` reduces along that dim; ``index_select`` gathers the rows: the bits of their
    #: contiguous copies, tests/prefill/test_torch_chunked.py); it gets contiguous copies of the others.
    input_strides = {**{op: {name: "any" for name in OP_TABLE[op].reads} for op in ("gdn_decode", "kda_decode")},
                     **{op: {"q": "inner", "k": "inner", "v": "inner"} for op in ("gdn_prefill", "kda_prefill")}}
    features = frozenset({"has_initial_state", "precomputed_gates", "output_state_indices", "checkpoints"})

    def rank(self, p, caps) -> int:
        cpu = caps.vendor == "cpu"
        if p.phase == "decode":  # the CPU's decode default (measured faster than torch-ref's step); elsewhere behind it
            return Rank.CPU_DECODE if cpu else Rank.BEHIND_REFERENCE
        return Rank.CPU_FIRST if cpu and self.size_class(p, caps) else Rank.CHUNKED_FALLBACK

    def size_class(self, p, caps) -> bool:
        """What :meth:`rank` reads of the sizes: a prefill of at least :data:`SHORT` tokens per sequence."""
        return p.phase == "prefill" and p.t / max(p.n, 1) >= SHORT[p.family]

    def capture_refusal(self, p, caps) -> Optional[str]:
        return "torch-chunked reads cu_seqlens and the slots back to the host to plan its chunks"

    def plan_note(self, p, caps) -> str:
        if p.phase == "decode":
            return ("one token over an fp32 pool: every row and head in one set of small ops, the state "
                    "updated in place through a view of the pool (slots in an increasing progression), gathered "
                    "and written back (scattered rows of at most 128 KiB) or row by row; any other decode runs "
                    "torch-ref's code")
        per_seq = p.t / max(p.n, 1)
        steps = -(-int(per_seq) // CHUNK)
        note = (f"chunked form, C={CHUNK}: the intra-chunk matrices and triangular inverses batched over "
                f"every chunk and value head, the recurrence over about {steps} chunk step{'' if steps == 1 else 's'} "
                "per sequence")
        if caps.vendor == "cpu" and per_seq < SHORT[p.family]:
            note += f"; below {SHORT[p.family]} tokens per sequence torch-ref's token-serial prefill is first"
        if p.checkpoints:
            note += "; checkpoints: the state entering the chunk at each checkpoint_every boundary, copied from the recurrence"
        return note

    def prepare(self, op: str, args: dict):
        """The dispatcher's cached launch (``dispatch/runtime/fast_path.py``) for a decode that :func:`plain_decode`
        names: the call key fixes what that depends on (dtypes, T, which optional tensors are given), so a
        later call with the key runs :func:`decode_step`'s body straight from its keyword arguments, with
        the first call's scalars (also in the key), no call object built. None for everything else
        (:meth:`run`: the call object and :meth:`decode` / :meth:`prefill`)."""
        spec = OP_TABLE[op]
        if spec.phase != "decode" or not _plain(
                args["q"], args["state_indices"], args["state_pool"], args.get("intermediate_states"),
                args.get("num_accepted_tokens"), args.get("has_initial_state")):
            return None
        kda = spec.per_channel_gates
        fixed = (args["scale"], args["use_qk_l2norm"], args["state_layout"] == "vk", not args["disable_state_update"])
        if args.get("g") is not None:
            def gates(a):
                return a["g"], a["beta"]
        else:
            kw = dict(softplus_beta=args["softplus_beta"], softplus_threshold=args["softplus_threshold"],
                      **({"lower_bound": args["lower_bound"]} if kda else {}))

            def gates(a):
                return a["A_log"], a["a"], a["b"], a["dt_bias"], kw

        @pinned_fp32_matmul
        def run(a: dict) -> torch.Tensor:
            return _decode(kda, a["q"], a["k"], a["v"], gates(a), a["state_pool"], a["state_indices"],
                           a.get("output_state_indices"), *fixed)
        return run

    def decode(self, call: DecodeCall):
        """:func:`decode_step` where :func:`plain_decode` says so, else torch-ref's decode."""
        if plain_decode(call):
            return decode_step(call)
        ref = kda_decode_ref if call.family == "kda" else gdn_decode_ref
        fp64 = any(t is not None and t.dtype == torch.float64 for t in (call.q, call.state_pool))
        return ref(**call.arguments(), compute_dtype=torch.float64 if fp64 else torch.float32)

    def prefill(self, call: PrefillCall):
        """GDN and KDA alike (g's shape tells them apart): ``(o, None)`` in pool mode, ``(o, final_state)``
        in dense mode."""
        return chunked_prefill(call.q, call.k, call.v, call.g, call.beta, call.cu_seqlens,
                               call.state_pool, call.state_indices, call.initial_state, call.scale,
                               call.use_qk_l2norm, call.state_layout, has_initial_state=call.has_initial_state,
                               output_state_indices=call.output_state_indices,
                               checkpoint_every=call.checkpoint_every, checkpoint_indices=call.checkpoint_indices)
