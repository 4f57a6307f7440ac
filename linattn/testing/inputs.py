"""Seeded inputs for checks against the float64 reference: the draws, and the self-check's small cases.

Every input is drawn on the CPU from a ``torch.Generator`` seeded by a string key
(:func:`generator`: CRC-32 of the key), never from the global RNG, so a case replays bit for bit.
The draws shared by the first-call self-check (``dispatch/runtime/self_check.py``) and the conformance
suite (:mod:`linattn.testing.execute`): :func:`qkv`, :func:`decays`, :func:`betas`, :func:`states`.
The self-check's cases of a ``linattn.dispatch.Problem``'s shape class: :data:`CASES` (one builder
per phase), with the slots, lengths and tables they use (module constants; the check reads them
back to know which rows each case owns).

Torch only (``dispatch/`` imports it as ``import linattn`` runs); the gates of a case with
``precomputed_gates`` come from the reference maths (:mod:`linattn.reference`, below every layer),
imported when such a case is built.
"""

from __future__ import annotations

import zlib

import torch

from linattn._namespace import public_dir

from .compare import DTYPES

__all__ = [
    "CASES", "CLAMP_ROWS", "DECODE_INTERMEDIATE", "DECODE_NUM_ACCEPTED", "DECODE_OUT_SLOTS", "DECODE_P", "DECODE_S",
    "DECODE_SLOTS", "DECODE_TABLE", "DECODE_TABLE_P", "GATING_ROWS", "HAS_INITIAL_STATE", "PREFILL_CHECKPOINTS",
    "PREFILL_CHECKPOINTS_WRITTEN", "PREFILL_CHECKPOINT_EVERY", "PREFILL_LENS", "PREFILL_OUT_SLOTS", "PREFILL_P",
    "PREFILL_SLOTS", "betas", "clamp_case", "decays", "decode_case", "decode_rows", "gating_case", "generator",
    "prefill_case", "qkv", "randn", "state_shape", "states", "to_float64",
]
__dir__ = public_dir(__name__, __all__)

# The self-check's small cases (chunk C = 64 for the chunked prefill). Prefill: an empty sequence
# that owns a slot (its state must come back unchanged), one token, one chunk + 1, two chunks + 2,
# and a padding sequence with tokens (slot -1: zero output, nothing read or written). Rows 2, 4, 5,
# 7 of the pool are never named and must stay bitwise unchanged.
PREFILL_LENS = (0, 1, 65, 130, 7)
PREFILL_SLOTS = (1, 6, 0, 3, -1)
PREFILL_P = 8
# Decode: five rows, two of them padding; with a per-token table (``num_accepted_tokens``) the
# state after token t goes to table[n, t]; intermediate states land in rows of a larger buffer.
DECODE_SLOTS = (4, -1, 0, 6, -1)
DECODE_P = 8
DECODE_TABLE = ((4, 1, 2), (-1, -1, -1), (0, 3, 3), (6, 5, 7), (-1, -1, -1))
DECODE_NUM_ACCEPTED = (2, 0, 3, 1, 0)
DECODE_TABLE_P = 10
DECODE_INTERMEDIATE = (2, -1, 0, 5, -1)
DECODE_S = 6
HAS_INITIAL_STATE = (True, False, True, False, True)  # prefill sequences / decode rows (False: fresh)
# output_state_indices: the final states go to other slots than the read ones (one sequence in place:
# prefill's empty sequence 0 copies slot 1 into slot 2); the read slots must stay bitwise unchanged
PREFILL_OUT_SLOTS = (2, 6, 4, 5, -1)
DECODE_OUT_SLOTS = (1, -1, 0, 5, -1)
# checkpoints (prefill, every 64 tokens): in five rows added after the pool's PREFILL_P (so they
# combine with output_state_indices): the 65-token sequence's after 64 tokens, the 130-token one's
# after 64 and 128; the 1-token and the padding sequence name slots that must not be written
PREFILL_CHECKPOINT_EVERY = 64
PREFILL_CHECKPOINTS = ((-1, -1), (PREFILL_P + 3, -1), (PREFILL_P, -1), (PREFILL_P + 1, PREFILL_P + 2),
                       (PREFILL_P + 4, -1))
PREFILL_CHECKPOINTS_WRITTEN = (PREFILL_P, PREFILL_P + 1, PREFILL_P + 2)
GATING_ROWS = 7
CLAMP_ROWS = 5


# -- the draws ----------------------------------------------------------------------------------------

def generator(key: str) -> torch.Generator:
    """A CPU generator seeded by ``key`` (its CRC-32): the self-check keys it ``"op|shape class"``,
    the conformance suite by the case id."""
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard normal fp32 draws of ``shape`` from ``gen``."""
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def state_shape(layout: str, hv: int, k: int, v: int) -> tuple[int, int, int]:
    """One state's shape: ``[HV, V, K]`` for layout ``vk``, ``[HV, K, V]`` for ``kv``."""
    return (hv, v, k) if layout == "vk" else (hv, k, v)


def qkv(gen: torch.Generator, lead: tuple, h: int, hv: int, k: int, v: int, dtype: torch.dtype, strided: bool = False):
    """q, k ``[*lead, H, K]`` and v ``[*lead, HV, V]`` of ``dtype``, drawn in that order; when
    ``strided``, views sliced from one fused projection ``[*lead, 2*H*K + HV*V]`` (row stride larger
    than the row, as engines pass them)."""
    if not strided:
        return randn(gen, *lead, h, k).to(dtype), randn(gen, *lead, h, k).to(dtype), randn(gen, *lead, hv, v).to(dtype)
    fused = randn(gen, *lead, 2 * h * k + hv * v).to(dtype)
    return (fused[..., : h * k].unflatten(-1, (h, k)), fused[..., h * k: 2 * h * k].unflatten(-1, (h, k)),
            fused[..., 2 * h * k:].unflatten(-1, (hv, v)))


def decays(gen: torch.Generator, shape: tuple) -> torch.Tensor:
    """Log decays ``g`` of a prefill, fp32, uniform in ``[-0.51, -0.01)``."""
    return -(torch.rand(shape, generator=gen) * 0.5 + 0.01)


def betas(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Write strengths ``beta``, fp32, uniform in ``[0.05, 0.95)``."""
    return torch.rand(*shape, generator=gen) * 0.9 + 0.05


def states(gen: torch.Generator, n: int, shape: tuple, dtype: torch.dtype, scale: float = 0.5) -> torch.Tensor:
    """``n`` states (pool rows or initial states) ``[n, *shape]`` of ``dtype``: normal draws times ``scale``."""
    return (randn(gen, n, *shape) * scale).to(dtype)


def to_float64(x):
    """A float64 CPU copy of a floating tensor, a CPU copy of any other tensor (never an alias: the
    op under test writes its pool in place); anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64, copy=True) if x.is_floating_point() else x.detach().to("cpu", copy=True)
    return x


# -- the self-check's cases of a Problem's shape class ------------------------------------------------

def prefill_case(p, gen: torch.Generator, device):
    """``(tensors on device, options)`` of a prefill of ``p``'s class over :data:`PREFILL_LENS`."""
    dt, sdt = DTYPES[p.dtype], DTYPES[p.state_dtype]
    kda = p.spec.per_channel_gates
    T = sum(PREFILL_LENS)
    one = state_shape(p.state_layout, p.hv, p.k, p.v)
    q, k, v = qkv(gen, (T,), p.h, p.hv, p.k, p.v, dt)
    args = dict(q=q, k=k, v=v, g=decays(gen, (T, p.hv, p.k) if kda else (T, p.hv)), beta=betas(gen, T, p.hv),
                cu_seqlens=torch.tensor([0, *torch.tensor(PREFILL_LENS).cumsum(0).tolist()], dtype=torch.int32))
    if p.mode == "pool":
        args["state_pool"] = states(gen, PREFILL_P, one, sdt)
        args["state_indices"] = torch.tensor(PREFILL_SLOTS, dtype=torch.int32)
    else:
        args["initial_state"] = states(gen, len(PREFILL_LENS), one, sdt)
    if p.has_initial_state and p.mode == "pool":  # fresh sequences start from zeros, slot unread
        args["has_initial_state"] = torch.tensor(HAS_INITIAL_STATE[:len(PREFILL_LENS)])
    if p.output_state_indices and p.mode == "pool":
        args["output_state_indices"] = torch.tensor(PREFILL_OUT_SLOTS, dtype=torch.int32)
    opts = dict(state_layout=p.state_layout)
    if p.checkpoints and p.mode == "pool":
        args["state_pool"] = torch.cat([args["state_pool"], states(gen, 5, one, sdt)])
        args["checkpoint_indices"] = torch.tensor(PREFILL_CHECKPOINTS, dtype=torch.int32)
        opts["checkpoint_every"] = PREFILL_CHECKPOINT_EVERY
    return {n: x.to(device) for n, x in args.items()}, opts


def decode_case(p, gen: torch.Generator, device):
    """``(tensors on device, options)`` of a decode of ``p``'s class: :data:`DECODE_SLOTS` (or the
    per-token :data:`DECODE_TABLE`), ``min(max(p.t, 1), 3)`` tokens per row."""
    dt, sdt = DTYPES[p.dtype], DTYPES[p.state_dtype]
    kda = p.spec.per_channel_gates
    T = min(max(p.t, 1), 3)
    N = len(DECODE_SLOTS)
    one = state_shape(p.state_layout, p.hv, p.k, p.v)
    q, k, v = qkv(gen, (N, T), p.h, p.hv, p.k, p.v, dt)
    args = dict(q=q, k=k, v=v, a=randn(gen, *((N, T, p.hv, p.k) if kda else (N, T, p.hv))).to(dt),
                b=randn(gen, N, T, p.hv).to(dt), A_log=randn(gen, p.hv) * 0.5,
                dt_bias=randn(gen, *((p.hv, p.k) if kda else (p.hv,))) * 0.5)
    if p.num_accepted_tokens:
        args["state_pool"] = states(gen, DECODE_TABLE_P, one, sdt)
        args["state_indices"] = torch.tensor([row[:T] for row in DECODE_TABLE], dtype=torch.int32)
        args["num_accepted_tokens"] = torch.tensor([min(x, T) for x in DECODE_NUM_ACCEPTED], dtype=torch.int32)
    else:
        args["state_pool"] = states(gen, DECODE_P, one, sdt)
        args["state_indices"] = torch.tensor(DECODE_SLOTS, dtype=torch.int32)
    if p.intermediate_states:
        args["intermediate_states"] = states(gen, DECODE_S, (T, *one), sdt)
        args["intermediate_state_indices"] = torch.tensor(DECODE_INTERMEDIATE, dtype=torch.int32)
    opts = dict(state_layout=p.state_layout, disable_state_update=p.disable_state_update)
    if p.lower_bound:
        opts["lower_bound"] = -5.0
    if p.has_initial_state:
        args["has_initial_state"] = torch.tensor(HAS_INITIAL_STATE[:N])
    if p.output_state_indices and not p.num_accepted_tokens:  # [N] slots only (the table names its own)
        args["output_state_indices"] = torch.tensor(DECODE_OUT_SLOTS, dtype=torch.int32)
    if p.precomputed_gates:  # the gates as the gating op gives them; the bound goes into the gating
        from linattn.reference import gdn_gating_ref, kda_gating_ref

        lb = opts.pop("lower_bound", None)
        gate = kda_gating_ref if kda else gdn_gating_ref
        g, beta = gate(args["A_log"], args["a"], args["b"], args["dt_bias"], *((lb,) if kda else ()))
        args.update(g=g, beta=beta, a=None, b=None, A_log=None, dt_bias=None)
    return {n: (x.to(device) if x is not None else None) for n, x in args.items()}, opts


def gating_case(p, gen: torch.Generator, device):
    """``(tensors on device, options)`` of a gating op of ``p``'s class over :data:`GATING_ROWS` rows."""
    dt = DTYPES[p.dtype]
    kda = p.spec.per_channel_gates
    args = dict(A_log=randn(gen, p.hv) * 0.5,
                a=randn(gen, *((GATING_ROWS, p.hv, p.k) if kda else (GATING_ROWS, p.hv))).to(dt),
                b=randn(gen, GATING_ROWS, p.hv).to(dt), dt_bias=randn(gen, *((p.hv, p.k) if kda else (p.hv,))) * 0.5)
    return {n: x.to(device) for n, x in args.items()}, ({"lower_bound": -5.0} if p.lower_bound else {})


def clamp_case(p, gen: torch.Generator, device):
    """``(tensors on device, options)`` of the SwiGLU clamp of ``p``'s class: :data:`CLAMP_ROWS` rows."""
    x = (randn(gen, CLAMP_ROWS, 2 * p.d) * 8.0).to(DTYPES[p.dtype])
    return {"x": x.to(device)}, {"limit": 10.0 if p.clamp_limit else None}


#: The self-check's case builder by ``Problem.phase``: ``(p, gen, device) -> (tensors, options)``.
CASES = {"prefill": prefill_case, "decode": decode_case, "gating": gating_case, "mlp": clamp_case}


def decode_rows(args: dict, opts: dict) -> tuple[set, list]:
    """``(pool rows a decode case writes, its rows that are padding)``."""
    idx = args["state_indices"].tolist()
    if args.get("num_accepted_tokens") is not None:
        nat = args["num_accepted_tokens"].tolist()
        load = [row[max(n - 1, 0)] for row, n in zip(idx, nat)]
    else:
        load = [row[0] if isinstance(row, list) else row for row in idx]
    padding = [n for n, s in enumerate(load) if s < 0]
    if opts.get("disable_state_update"):
        return set(), padding
    if isinstance(idx[0], list):
        return {s for n, row in enumerate(idx) if n not in padding for s in row if s >= 0}, padding
    if args.get("output_state_indices") is not None:  # separate write slots: the read slots stay as they were
        idx = args["output_state_indices"].tolist()
    return {s for s in idx if s >= 0}, padding
