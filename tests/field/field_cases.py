"""Shared inputs of the field-case tests (``../shared/cases/field-reports.md``, F25-F32).

Small shapes so the Triton backends run in the interpreter on the CPU (forced) and compiled on the
GPU: decode K = V = 16, prefill K = V = 64 (the chunked kernels' smallest head dim).
"""

from __future__ import annotations

import torch

import linattn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, HV = 1, 2


def backends_for(op: str) -> list:
    """Every registered backend that implements ``op`` and can run here (Triton: forced)."""
    names = []
    for name, b in linattn.list_backends().items():
        if op not in b.ops or "float32" not in b.dtypes:
            continue  # the field inputs are fp32 (cutedsl takes bf16 only: tests/gpu covers it)
        if name == "cutedsl" and not torch.cuda.is_available():
            continue
        if name == "triton-folded" and DEVICE == "cpu" and op.endswith("_prefill"):
            continue  # interpreter time; the folded prefill equals split bitwise (tests/contract)
        names.append(name)
    return sorted(names)


def decode_inputs(N: int = 4, T: int = 1, K: int = 16, V: int = 16, P: int = 9, kda: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    args = dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V),
                a=r(N, T, HV, *((K,) if kda else ())), b=r(N, T, HV), A_log=r(HV) * 0.5,
                dt_bias=r(HV, *((K,) if kda else ())) * 0.5)
    pool = r(P, HV, V, K)
    return {k: v.to(DEVICE) for k, v in args.items()}, pool.to(DEVICE)


def prefill_inputs(lens=(5, 70, 0, 9), K: int = 64, V: int = 64, P: int = 9, kda: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    gate = -torch.nn.functional.softplus(r(T, HV, *((K,) if kda else ())) - 1.0)
    args = dict(q=r(T, H, K), k=r(T, H, K), v=r(T, HV, V), g=gate, beta=torch.rand(T, HV, generator=g),
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))
    pool = r(P, HV, V, K)
    return {k: v.to(DEVICE) for k, v in args.items()}, pool.to(DEVICE)


def assert_rows_unchanged(pool: torch.Tensor, before: torch.Tensor, owned) -> None:
    """Every pool row not in ``owned`` is bitwise as ``before``."""
    keep = torch.ones(pool.shape[0], dtype=torch.bool)
    keep[[int(i) for i in owned if int(i) >= 0]] = False
    keep = keep.to(pool.device)
    assert torch.equal(pool[keep], before[keep]), "pool rows the call does not own changed"
