"""What a measurement of linattn's ops is made of: seeded input cases of the public ops and a timer
of single calls, shared by ``linattn bench`` (``apps/bench.py``, which imports them from here) and
the tuning measurement (:mod:`linattn.tune`: ``linattn tune`` and ``LINATTN_AUTOTUNE``).

A library module: the library does not import its tools (``linattn.apps``), so what both time with
lives here (``tests/test_layering.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from linattn.dispatch.rules.ops_table import OP_TABLE

__all__ = ["FLUSH_BYTES", "Case", "Timer", "clamp_case", "decode_case", "prefill_case"]

#: Bytes the CUDA timer writes before each call (``Timer(flush=True)``) so no input is served from L2.
FLUSH_BYTES = 256 << 20


# -- inputs ----------------------------------------------------------------------------------------

@dataclass
class Case:
    """One shape of one op: the public op's keyword arguments and what the op moves.

    Attributes:
        op: the op name. label: ``N=8``, ``16x4096`` or ``M=64``. sizes: the shape symbols.
        args: keyword arguments of ``linattn.<op>`` (tensors on the bench device).
        nbytes: bytes the op must read and write (decode, clamp), else None.
        index_bytes: bytes of ``state_indices`` inside ``nbytes`` (dense-state baselines skip them).
        tokens: packed tokens (prefill), else None.
    """

    op: str
    label: str
    sizes: dict
    args: dict
    nbytes: Optional[int] = None
    index_bytes: int = 0
    tokens: Optional[int] = None


def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def decode_case(op: str, n: int, shape: tuple[int, int, int, int], device: torch.device, seed: int = 0, *,
                t: int = 1, dtype: torch.dtype = torch.bfloat16, state_dtype: torch.dtype = torch.float32) -> Case:
    """GDN/KDA decode inputs: ``N`` rows of ``t`` tokens (default one), a pool ``[2N, HV, V, K]``
    (default fp32), distinct random slots.

    Args:
        op: ``gdn_decode`` or ``kda_decode``. n: rows N. shape: ``(H, HV, K, V)``.
        device: where the tensors live. seed: the generator seed. t: tokens per row T.
        dtype: of ``q, k, v, a, b`` (default bf16). state_dtype: of the pool (default fp32).
    Returns:
        Case: args ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``, ``a [N, T, HV]`` (KDA
        ``[N, T, HV, K]``) and ``b [N, T, HV]`` in ``dtype``, ``A_log [HV]``, ``dt_bias [HV]`` (KDA
        ``[HV, K]``) fp32, ``state_pool [2N, HV, V, K]`` in ``state_dtype``, ``state_indices [N]`` int32.
    """
    H, HV, K, V = shape
    kda = OP_TABLE[op].per_channel_gates
    g = _gen(device, seed)
    bf = dtype
    P = 2 * n

    def rnd(*s, scale=1.0):
        return torch.randn(*s, device=device, generator=g) * scale

    args = dict(
        q=rnd(n, t, H, K).to(bf), k=rnd(n, t, H, K).to(bf), v=rnd(n, t, HV, V).to(bf),
        a=rnd(n, t, HV, *((K,) if kda else ())).to(bf), b=rnd(n, t, HV).to(bf),
        A_log=rnd(HV, scale=0.5), dt_bias=rnd(HV, *((K,) if kda else ()), scale=0.5),
        state_pool=rnd(P, HV, V, K, scale=0.1).to(state_dtype),
        state_indices=torch.randperm(P, device=device, generator=g)[:n].to(torch.int32),
    )
    state = 2 * n * HV * V * K * state_dtype.itemsize
    qkvo = n * t * (2 * H * K + 2 * HV * V) * bf.itemsize
    gates = n * t * HV * ((K if kda else 1) + 1) * bf.itemsize
    return Case(op=op, label=f"N={n}", sizes=dict(N=n, T=t, H=H, HV=HV, K=K, V=V, P=P), args=args,
                nbytes=state + qkvo + gates + 4 * n, index_bytes=4 * n)


def prefill_case(op: str, n: int, L: int, shape: tuple[int, int, int, int], device: torch.device,
                 seed: int = 0, *, dtype: torch.dtype = torch.bfloat16,
                 state_dtype: torch.dtype = torch.float32) -> Case:
    """Varlen pool-mode prefill inputs: ``N`` sequences of ``L`` tokens, a pool ``[2N, HV, V, K]``
    (default fp32).

    Args:
        op: ``gdn_prefill`` or ``kda_prefill``. n: sequences N. L: tokens per sequence.
        shape: ``(H, HV, K, V)``. device, seed, dtype, state_dtype: as :func:`decode_case`.
    Returns:
        Case: args ``q, k [T, H, K]``, ``v [T, HV, V]`` in ``dtype`` (``T = N L``), ``g [T, HV]`` (KDA
        ``[T, HV, K]``) fp32 log-decays (``logsigmoid(x + 3)``), ``beta [T, HV]`` fp32,
        ``cu_seqlens [N + 1]`` int32, ``state_pool`` in ``state_dtype``, ``state_indices [N]`` int32.
    """
    H, HV, K, V = shape
    kda = OP_TABLE[op].per_channel_gates
    g = _gen(device, seed)
    T = n * L
    bf = dtype

    def rnd(*s):
        return torch.randn(*s, device=device, generator=g)

    P = 2 * n
    args = dict(
        q=rnd(T, H, K).to(bf), k=rnd(T, H, K).to(bf), v=rnd(T, HV, V).to(bf),
        g=torch.nn.functional.logsigmoid(rnd(T, HV, *((K,) if kda else ())) + 3.0),
        beta=torch.sigmoid(rnd(T, HV)),
        cu_seqlens=torch.arange(0, T + 1, L, device=device, dtype=torch.int32),
        state_pool=(rnd(P, HV, V, K) * 0.1).to(state_dtype),
        state_indices=torch.randperm(P, device=device, generator=g)[:n].to(torch.int32),
    )
    return Case(op=op, label=f"{n}x{L}", sizes=dict(N=n, L=L, T=T, H=H, HV=HV, K=K, V=V, P=P), args=args,
                tokens=T)


def clamp_case(m: int, d: int, limit: Optional[float], device: torch.device, seed: int = 0) -> Case:
    """SwiGLU-clamp inputs: ``x [M, 2D]`` bf16 (gate ‖ up, scaled by 8 so the clamp bites).

    Returns:
        Case: args ``x``, ``limit``; ``nbytes = 3 M D x 2`` (x read, out written).
    """
    g = _gen(device, seed)
    x = (torch.randn(m, 2 * d, device=device, generator=g) * 8).to(torch.bfloat16)
    return Case(op="silu_and_mul_clamp", label=f"M={m}", sizes=dict(M=m, D=d), args=dict(x=x, limit=limit),
                nbytes=3 * m * d * 2)


# -- timing ----------------------------------------------------------------------------------------

class Timer:
    """Times single calls on one device: CUDA events around a synchronised call, or perf_counter.

    Args:
        device: the bench device. flush: on CUDA, write a 256 MiB buffer before each call so no
            input is served from L2.
    """

    def __init__(self, device: torch.device, flush: bool = True):
        self.device = device
        self.cuda = device.type == "cuda"
        self._flush = (torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
                       if self.cuda and flush else None)

    @property
    def method(self) -> str:
        return "cuda-events" if self.cuda else "perf_counter"

    def once(self, fn: Callable[[], object]) -> float:
        """Seconds of one call of ``fn``."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        if self._flush is not None:
            self._flush.zero_()
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def measure(self, fn: Callable[[], object], repeats: int, warmup: int, budget_s: float) -> list[float]:
        """Warm up (at least one call, which also compiles; further ones while they took under a
        quarter of ``budget_s``), then time up to ``repeats`` calls.

        Fewer calls (at least 3) are timed when the warm-up shows that ``repeats`` would exceed
        ``budget_s`` seconds. Every call is a separate op call: nothing is re-run inside one.
        """
        first = spent = self.once(fn)
        for _ in range(max(0, warmup - 1)):
            if spent > budget_s / 4:  # slow calls: one warm-up (it compiled) is enough
                break
            first = self.once(fn)
            spent += first
        n = repeats if first * repeats <= budget_s else max(3, min(repeats, int(budget_s / max(first, 1e-9))))
        return [self.once(fn) for _ in range(n)]
