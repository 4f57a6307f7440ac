"""Call streams as an engine makes them, for the host-overhead benchmarks (issue 28).

``host_overhead.py`` (GPU) and ``host_overhead_cpu.py`` (CPU, kernels stubbed) used to time one
call repeated: the cost of a cache hit. An engine's packed prefill length changes almost every
step and its decode batch often does. This module builds, from one seed, the argument dicts of:

- ``same_t`` / ``new_t``: prefill calls of N = 4 packed sequences, T = 200 tokens every call, or
  a T not seen before every call (200, 199, 201, 198, ...: the same mean);
- ``same_n`` / ``new_n``: decode calls of N = 150 rows every call, or a new N every call
  (N = 1, 2, 3, ...; rows beyond the pool's 8 slots are padding, index -1);
- ``engine``: a served trace of ``steps`` steps. Requests arrive (Poisson, 0.4 per step) with
  prompt lengths drawn log-normal (median 400 tokens, sigma 1, clipped to [16, 4,096]; a step's
  prefill at most :data:`MAX_T` tokens) and output
  lengths geometric (mean 64); a step with arrivals runs one packed prefill of them, then every
  step runs one decode of the running batch (at most 64 rows). Fixed seed.

The tensors are views into one buffer per argument (made once), so building a call costs no
allocation and the loop times only the op. Every call writes pool slots 0..7 only (prefill:
slots 0..N-1, N <= 8).
"""

from __future__ import annotations

import random
from typing import Iterator

import torch

H, HV, K, V = 16, 32, 128, 128
POOL = 8
#: an engine's token budget per step (max_num_batched_tokens): a packed prefill's T is at most this
MAX_T = 8192
MAX_N = 512


class StreamInputs:
    """The buffers every call's arguments are views of, for one family on one device."""

    def __init__(self, family: str, device: str, max_t: int = MAX_T, max_n: int = MAX_N):
        g = torch.Generator().manual_seed(0)
        kda = family == "kda"

        def r(*s, dtype=torch.bfloat16):
            return torch.randn(*s, generator=g).to(device, dtype)

        self.family, self.device = family, device
        self.pool = torch.zeros(POOL, HV, V, K, device=device)
        self.pq, self.pk, self.pv = r(max_t, H, K), r(max_t, H, K), r(max_t, HV, V)
        gate = -torch.rand(max_t, HV, K, generator=g) if kda else -torch.rand(max_t, HV, generator=g)
        self.pg, self.pbeta = (gate * 0.1).to(device), torch.rand(max_t, HV, generator=g).to(device)
        self.dq, self.dk, self.dv = r(max_n, 1, H, K), r(max_n, 1, H, K), r(max_n, 1, HV, V)
        self.da = r(max_n, 1, HV, K) if kda else r(max_n, 1, HV)
        self.db = r(max_n, 1, HV)
        self.A_log = r(HV, dtype=torch.float32)
        self.dt_bias = r(HV, K, dtype=torch.float32) if kda else r(HV, dtype=torch.float32)
        idx = torch.full((max_n,), -1, dtype=torch.int32)
        idx[:POOL] = torch.arange(POOL, dtype=torch.int32)
        self.didx = idx.to(device)

    def prefill(self, lengths: list[int]) -> dict:
        """One packed prefill of ``lengths`` (one sequence per slot 0..N-1; N <= 8)."""
        assert 1 <= len(lengths) <= POOL, lengths
        t = sum(lengths)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return dict(q=self.pq[:t], k=self.pk[:t], v=self.pv[:t], g=self.pg[:t], beta=self.pbeta[:t],
                    cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=self.device),
                    state_pool=self.pool, state_indices=torch.arange(len(lengths), dtype=torch.int32, device=self.device))

    def decode(self, n: int) -> dict:
        """One decode of ``n`` rows (rows >= 8 are padding)."""
        return dict(q=self.dq[:n], k=self.dk[:n], v=self.dv[:n], a=self.da[:n], b=self.db[:n], A_log=self.A_log,
                    dt_bias=self.dt_bias, state_pool=self.pool, state_indices=self.didx[:n])


def _split(t: int, n: int = 4) -> list[int]:
    base = t // n
    return [base + (1 if i < t % n else 0) for i in range(n)]


#: the same-T stream's packed length, and the centre of the new-T stream's lengths
SAME_T = 200
#: the same-N stream's batch, the mean of the new-N stream's (N = 1 .. 299)
SAME_N = 150


def _new_t(i: int) -> int:
    """The i-th new length: SAME_T, SAME_T - 1, SAME_T + 1, SAME_T - 2, ... (all distinct, mean SAME_T)."""
    step = (i + 1) // 2
    return SAME_T - step if i % 2 else SAME_T + step


def stream(kind: str, inputs: StreamInputs, calls: int) -> list[tuple[str, dict]]:
    """``calls`` (phase, arguments) pairs of stream ``kind``: ``same_t`` (T = :data:`SAME_T`),
    ``new_t`` (a distinct T every call, centred on it; calls < 2 * SAME_T - 8), ``same_n``
    (N = :data:`SAME_N`), ``new_n`` (N = 1, 2, 3, ...; calls <= :data:`MAX_N`). The new-length
    streams' mean length is the same-length one's, so per-value work (validation reads every token's
    gate) weighs the same in both."""
    if kind == "same_t":
        return [("prefill", inputs.prefill(_split(SAME_T)))] * calls
    if kind == "new_t":
        return [("prefill", inputs.prefill(_split(_new_t(i)))) for i in range(calls)]
    if kind == "same_n":
        return [("decode", inputs.decode(SAME_N))] * calls
    if kind == "new_n":
        return [("decode", inputs.decode(1 + i % MAX_N)) for i in range(calls)]
    raise ValueError(f"unknown stream {kind!r}")


def engine_trace(steps: int, seed: int = 0) -> Iterator[tuple[str, list[int]]]:
    """The served trace (module docstring): ("prefill", prompt lengths) or ("decode", [rows])."""
    rng = random.Random(seed)
    running: list[int] = []  # tokens left per running request
    for _ in range(steps):
        arrivals = 0
        while rng.random() < 0.4 and arrivals < POOL:
            arrivals += 1
        if arrivals:
            lengths = [max(16, min(4096, int(rng.lognormvariate(5.99, 1.0)))) for _ in range(arrivals)]
            while sum(lengths) > MAX_T:  # the step's token budget: the last arrivals wait (dropped here)
                lengths.pop()
            arrivals = len(lengths)
            yield "prefill", lengths
            for _ in range(arrivals):
                running.append(1 + int(rng.expovariate(1 / 64)))
        running = [r - 1 for r in running if r > 1][:64]
        if running:
            yield "decode", [len(running)]


def engine_calls(inputs: StreamInputs, steps: int, seed: int = 0) -> list[tuple[str, dict]]:
    return [(phase, inputs.prefill(x) if phase == "prefill" else inputs.decode(x[0]))
            for phase, x in engine_trace(steps, seed)]


def prefill_shapes(calls: list[tuple[str, dict]]) -> dict:
    """How many of the prefill calls bring a packed length T, and a (T bucket, N) of the Triton
    prefill's replays (``kernels/triton/prefill/`` ``replay_tokens``), not seen earlier in ``calls``:
    the calls that plan and record (a cold bucket) rather than replay."""
    from linattn.kernels.triton.prefill import replay_tokens

    ts, buckets = set(), set()
    for phase, x in calls:
        if phase == "prefill":
            t, n = x["q"].shape[0], x["cu_seqlens"].shape[0] - 1
            ts.add(t)
            buckets.add((replay_tokens(t), n))
    return dict(prefill_distinct_t=len(ts), prefill_distinct_buckets=len(buckets))
