"""The main job: serve a stream of requests through one linear-attention layer, like an engine.

What an inference engine (sglang, vLLM) does with a hybrid model's GDN or KDA layer, reduced to
that layer:

- a **state pool** ``[P, HV, V, K]`` in fp32 (layout ``"vk"``), one slot per running request,
  handed out by a :class:`SlotAllocator` (FIFO free list, slot 0 included) and released when a
  request finishes, so freed slots are reused; ``P`` is smaller than the number of requests. The
  pool starts filled with stale values (as after earlier traffic); a slot is zeroed when it is
  allocated, like an engine resetting a request's state;
- requests arrive over time with random prompt and output lengths;
- every scheduler iteration admits the requests that arrived (while slots and decode rows are
  free) and runs a **varlen chunked prefill** of their prompts in **pool mode**
  (``gating`` then ``prefill(..., state_pool=pool, state_indices=slots)``), then **one decode
  step** for every running request, padded with ``-1`` rows to a fixed batch size (as engines
  replaying a CUDA graph do);
- every call goes through the dispatcher; ``linattn.last_decision()`` records which backend ran.

Correctness, on the same run: every call checks that rows of the pool it does not own are bitwise
unchanged and every decode that padding rows gave zeros; sampled calls (the first prefill, every
``check_every``-th prefill and decode step) are recomputed with the float64 reference
(``linattn.backends.torch_ref``) on copies of the involved pool rows, and the relative errors
``||x - ref|| / ||ref||`` of outputs and states are held against the docs/ops.md tolerances for bf16
inputs with an fp32 state (2e-2 outputs, 1e-2 states; gates are computed in fp32 from exact
inputs and held to the fp32 tolerance 1e-5); the error and the bounds are
:mod:`linattn.testing.compare`'s.

Example:
    >>> from linattn.apps.demo import run_demo
    >>> rep = run_demo(requests=3, decode_batch=2, steps=2, shape=(1, 2, 8, 8), prompt_len=(2, 5),
    ...                output_len=(1, 2), device="cpu")
    >>> rep.passed
    True
"""

from __future__ import annotations

import collections
import math
import time
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

import linattn
from linattn.dispatch import find_op
from linattn.testing.compare import rel_error, tolerances

#: Defaults of :func:`run_demo` and ``linattn demo``: small enough for a CPU with the torch-ref
#: backend at Qwen3-Next shapes (how long that takes: docs/performance.md#demo).
DEFAULTS = dict(model="qwen3-next", requests=12, decode_batch=8, steps=24, prompt_len=(16, 256),
                output_len=(2, 12), check_every=4, seed=0)

#: docs/ops.md tolerances against the float64 reference (relative): bf16 inputs with an fp32 state.
TOL_OUTPUT_BF16, TOL_STATE_BF16 = tolerances("bfloat16", "float32", phase="prefill")
#: Gates are computed in fp32 from exact inputs: the gating ops' tolerance (the fp32 one).
TOL_FP32 = tolerances("bfloat16", phase="gating")[0]


class DemoConfigError(ValueError):
    """A bad argument to :func:`run_demo` (unknown model, sizes out of range)."""


# -- the report --------------------------------------------------------------------------------------

class PhaseStats(BaseModel):
    """Wall time and throughput of one phase (host-synchronised around the op calls only)."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    padded_rows: int = Field(0, description="decode: padding rows (-1) run alongside the real ones")


class OpDecisionSummary(BaseModel):
    """Which backend ran for one op, and why not the others (every distinct decision seen)."""

    model_config = ConfigDict(extra="forbid")

    op: str
    calls: int
    chosen: list[str]
    chosen_calls: dict[str, int] = Field(default_factory=dict, description="calls per chosen backend")
    forced: Optional[str] = None
    others: dict[str, str] = Field(description="backend -> reason code (or 'rank N' if accepted but outranked)")
    summaries: list[str]


class ErrorStat(BaseModel):
    """Max relative error of one op's sampled calls against the float64 reference."""

    model_config = ConfigDict(extra="forbid")

    op: str
    checked_calls: int
    output_error: float
    state_error: Optional[float] = None
    output_tol: float
    state_tol: Optional[float] = None
    passed: bool


class RequestStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int
    admitted: int
    finished: int
    running_at_end: int
    waiting_at_end: int
    slot_allocations: int
    slot_reuses: int = Field(description="allocations of a slot an earlier request had used")


class InvariantStat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checks: int
    ok: bool


class DemoReport(BaseModel):
    """Everything ``linattn demo`` prints (``--json`` gives this model's JSON)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    title: str
    family: str
    device: str
    device_name: str
    shape: dict[str, int]
    dtype: str = "bfloat16"
    pool: dict
    decode_batch: int
    steps: int
    seed: int
    requests: RequestStats
    prefill: PhaseStats
    decode: PhaseStats
    decisions: list[OpDecisionSummary]
    errors: list[ErrorStat]
    padding_zero: InvariantStat
    idle_rows_unchanged: InvariantStat
    warmup_s: float = Field(0.0, description="untimed warm-up (kernel compilation) before serving")
    wall_s: float
    passed: bool


# -- the engine parts ---------------------------------------------------------------------------------

class SlotAllocator:
    """Hands out state-pool slots: FIFO free list (freed slots go to the back), slot 0 first.

    Example:
        >>> a = SlotAllocator(2); s0, s1 = a.alloc(), a.alloc(); a.alloc() is None
        True
        >>> a.release(s0); a.alloc() == s0 and a.reuses == 1
        True
    """

    def __init__(self, slots: int):
        self.free = collections.deque(range(slots))
        self.used: set[int] = set()
        self.allocations = 0
        self.reuses = 0

    def alloc(self) -> Optional[int]:
        if not self.free:
            return None
        slot = self.free.popleft()
        self.allocations += 1
        self.reuses += slot in self.used
        self.used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot in self.free:
            raise ValueError(f"slot {slot} released twice")
        self.free.append(slot)

    def __len__(self) -> int:
        return len(self.free)


class _Request:
    __slots__ = ("rid", "arrival", "prompt_len", "output_len", "slot", "decoded")

    def __init__(self, rid: int, arrival: int, prompt_len: int, output_len: int):
        self.rid, self.arrival, self.prompt_len, self.output_len = rid, arrival, prompt_len, output_len
        self.slot: Optional[int] = None
        self.decoded = 0


class _Tracker:
    """Collects decisions and errors per op."""

    def __init__(self):
        self.decisions: dict[str, dict[str, object]] = {}
        self.calls: collections.Counter = collections.Counter()
        self.ran: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.err: dict[str, dict] = {}

    def record(self, op: str) -> None:
        d = linattn.last_decision()
        if d is None or d.op != op:
            raise RuntimeError(f"linattn.last_decision() does not describe the {op} call just made: {d}")
        self.calls[op] += 1
        self.ran[op][d.chosen] += 1
        self.decisions.setdefault(op, {})[d.summary()] = d

    def error(self, op: str, out_err: float, out_tol: float, state_err: Optional[float] = None,
              state_tol: Optional[float] = None) -> None:
        e = self.err.setdefault(op, dict(n=0, out=0.0, state=None, out_tol=out_tol, state_tol=state_tol))
        e["n"] += 1
        e["out"] = max(e["out"], out_err)
        if state_err is not None:
            e["state"] = max(e["state"] or 0.0, state_err)

    def decision_summaries(self) -> list[OpDecisionSummary]:
        out = []
        for op, by in self.decisions.items():
            ds = list(by.values())
            chosen = sorted({d.chosen for d in ds})
            others: dict[str, str] = {}
            for d in ds:
                for v in d.verdicts:
                    if v.backend not in chosen:
                        others.setdefault(v.backend, f"rank {v.rank}" if v.ok else v.reason.value)
            out.append(OpDecisionSummary(op=op, calls=self.calls[op], chosen=chosen,
                                         chosen_calls=dict(self.ran[op]), forced=ds[0].forced, others=others,
                                         summaries=list(by)))
        return out

    def error_stats(self) -> list[ErrorStat]:
        out = []
        for op, e in self.err.items():
            ok = e["out"] <= e["out_tol"] and (e["state"] is None or e["state"] <= e["state_tol"])
            out.append(ErrorStat(op=op, checked_calls=e["n"], output_error=e["out"], state_error=e["state"],
                                 output_tol=e["out_tol"], state_tol=e["state_tol"] if e["state"] is not None else None,
                                 passed=ok))
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resolve_device(device: Optional[str]) -> torch.device:
    """The torch device the demo serves on; a device it cannot serve on is refused up front.

    Raises:
        DemoConfigError: not a torch device string, ``meta`` (shapes without data), or CUDA asked
            for where torch sees none (or fewer devices than the index).
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise DemoConfigError(f"--device {device!r} is not a torch device; use --device cpu or --device cuda "
                              f"(cuda:N for one GPU of several)") from None
    if dev.type == "meta":
        raise DemoConfigError("--device meta: meta tensors hold shapes but no data, so the demo cannot serve "
                              "(or check) anything there; use --device cpu or --device cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DemoConfigError("--device cuda was asked for, but torch sees no CUDA device; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DemoConfigError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s); "
                              f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return dev


# -- the layer and the request stream ---------------------------------------------------------------

class _Layer:
    """One GDN or KDA layer: its ops through the dispatcher, float64 references, fp32 parameters
    and the seeded generator every random input comes from."""

    def __init__(self, family: str, shape: tuple[int, int, int, int], dev: torch.device, seed: int):
        from linattn.backends import torch_ref as ref

        self.family, self.kda, self.dev = family, family == "kda", dev
        self.H, self.HV, self.K, self.V = shape
        self.op_g, self.op_p, self.op_d = (find_op(family, phase) for phase in ("gating", "prefill", "decode"))
        self.gating, self.prefill, self.decode = (getattr(linattn, op) for op in (self.op_g, self.op_p, self.op_d))
        self.gating_ref, self.prefill_ref, self.decode_ref = (getattr(ref, f"{op}_ref")
                                                               for op in (self.op_g, self.op_p, self.op_d))
        self.gate_shape = (self.HV, self.K) if self.kda else (self.HV,)
        self.gen = torch.Generator().manual_seed(seed)
        # layer parameters (fp32), initialised as in Mamba-style layers: A in [1, 16], dt in [1e-3, 0.1]
        self.A_log = torch.empty(self.HV).uniform_(1, 16, generator=self.gen).log().to(dev)
        lo, hi = math.log(1e-3), math.log(0.1)
        dt = torch.exp(torch.rand(self.gate_shape, generator=self.gen) * (hi - lo) + lo)
        self.dt_bias = (dt + torch.log(-torch.expm1(-dt))).to(dev)  # inverse softplus: softplus(dt_bias) = dt

    def randn(self, *s, dtype=torch.bfloat16) -> torch.Tensor:
        return torch.randn(*s, generator=self.gen).to(device=self.dev, dtype=dtype)

    def randint(self, lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=self.gen))

    def tokens_in(self, *lead: int) -> tuple[torch.Tensor, ...]:
        """Random bf16 ``q, k [*lead, H, K]``, ``v [*lead, HV, V]`` and raw gates ``a, b``."""
        q, k = self.randn(*lead, self.H, self.K), self.randn(*lead, self.H, self.K)
        v = self.randn(*lead, self.HV, self.V)
        return q, k, v, self.randn(*lead, *self.gate_shape), self.randn(*lead, self.HV)


def _cu_seqlens(lens: list[int], dev: torch.device) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)


def _request_stream(layer: _Layer, requests: int, steps: int, prompt_len: tuple[int, int],
                    output_len: tuple[int, int]) -> list[_Request]:
    """Requests arriving over the first half of the run with random prompt and output lengths."""
    span = max(1, steps // 2)
    arrivals = sorted([0] + [layer.randint(0, span - 1) for _ in range(requests - 1)])
    return [_Request(i, arrivals[i], layer.randint(*prompt_len), layer.randint(*output_len)) for i in range(requests)]


def _warm_up(layer: _Layer, decode_batch: int, prompt_len: tuple[int, int]) -> float:
    """One untimed call per op on a scratch pool, as engines compile their kernels at start-up; seconds."""
    t0 = time.perf_counter()
    dev, HV, gate_shape = layer.dev, layer.HV, layer.gate_shape
    scratch = torch.zeros(min(2, decode_batch), HV, layer.V, layer.K, device=dev)
    lens = [prompt_len[0], min(prompt_len[1], 64)][:scratch.shape[0]]
    T = sum(lens)
    g, beta = layer.gating(layer.A_log, layer.randn(T, *gate_shape), layer.randn(T, HV), layer.dt_bias)
    layer.prefill(layer.randn(T, layer.H, layer.K), layer.randn(T, layer.H, layer.K), layer.randn(T, HV, layer.V),
                  g, beta, _cu_seqlens(lens, dev), state_pool=scratch,
                  state_indices=torch.arange(len(lens), dtype=torch.int32, device=dev))
    idx = torch.full((decode_batch,), -1, dtype=torch.int32, device=dev)
    idx[0] = 0
    layer.decode(*layer.tokens_in(decode_batch, 1), layer.A_log, layer.dt_bias, scratch, idx)
    _sync(dev)
    return time.perf_counter() - t0


# -- the engine ---------------------------------------------------------------------------------------

class _Engine:
    """The serving loop: a state pool with stale values, a slot allocator, the request queues, and
    what every call's checks saw (bitwise invariants on every call, float64 on sampled ones)."""

    def __init__(self, layer: _Layer, stream: list[_Request], pool_slots: int, decode_batch: int, check_every: int):
        self.layer, self.B, self.check_every = layer, decode_batch, check_every
        # the state pool: stale values everywhere (earlier traffic); zeroed per slot on allocation
        self.pool = layer.randn(pool_slots, layer.HV, layer.V, layer.K, dtype=torch.float32) * 0.1
        self.alloc = SlotAllocator(pool_slots)
        self.track = _Tracker()
        self.waiting = collections.deque(stream)
        self.running: list[_Request] = []
        self.finished: list[_Request] = []
        self.prefill_stats, self.decode_stats = PhaseStats(), PhaseStats()
        self.pad_checks = self.idle_checks = 0
        self.pad_ok = self.idle_ok = True
        self.prefill_calls = 0

    def step(self, it: int) -> None:
        """One scheduler iteration: admit and prefill what arrived, then one decode step."""
        new = self._admit(it)
        if new:
            self._prefill(new)
        if self.running:
            self._decode()

    def _admit(self, it: int) -> list[_Request]:
        new: list[_Request] = []
        while (self.waiting and self.waiting[0].arrival <= it and len(self.running) + len(new) < self.B
               and len(self.alloc)):
            r = self.waiting.popleft()
            r.slot = self.alloc.alloc()
            self.pool[r.slot].zero_()  # a new request starts from a zero state
            new.append(r)
        return new

    def _idle_unchanged(self, before: torch.Tensor, owned: list[int]) -> bool:
        mask = torch.ones(self.pool.shape[0], dtype=torch.bool, device=self.layer.dev)
        if owned:
            mask[torch.tensor(owned, device=self.layer.dev)] = False
        return torch.equal(self.pool[mask], before[mask])

    def _timed(self, stats: PhaseStats, fn):
        _sync(self.layer.dev)
        t0 = time.perf_counter()
        out = fn()
        _sync(self.layer.dev)
        stats.seconds += time.perf_counter() - t0
        stats.calls += 1
        return out

    def _prefill(self, new: list[_Request]) -> None:
        """Varlen chunked prefill of the new requests' prompts in pool mode (gating, then prefill)."""
        L, dev = self.layer, self.layer.dev
        lens = [r.prompt_len for r in new]
        T, cu = sum(lens), _cu_seqlens(lens, dev)
        slots = [r.slot for r in new]
        idx = torch.tensor(slots, dtype=torch.int32, device=dev)
        q, k, v, a, b = L.tokens_in(T)
        before = self.pool.clone()

        def call():
            g, beta = L.gating(L.A_log, a, b, L.dt_bias)
            self.track.record(L.op_g)
            o = L.prefill(q, k, v, g, beta, cu, state_pool=self.pool, state_indices=idx)
            self.track.record(L.op_p)
            return g, beta, o

        g, beta, o = self._timed(self.prefill_stats, call)
        self.prefill_stats.tokens += T
        self.idle_checks += 1
        self.idle_ok &= self._idle_unchanged(before, slots)
        if self.check_every and self.prefill_calls % self.check_every == 0:
            self._check_prefill((q, k, v, a, b), g, beta, o, cu, idx, before)
        self.prefill_calls += 1
        self.running += new

    def _check_prefill(self, inputs, g, beta, o, cu, idx, before) -> None:
        """Gating and prefill recomputed in float64 on a copy of the involved pool rows."""
        L, f64 = self.layer, torch.float64
        q, k, v, a, b = inputs
        g64, beta64 = L.gating_ref(L.A_log.to(f64), a.to(f64), b.to(f64), L.dt_bias.to(f64), compute_dtype=f64)
        self.track.error(L.op_g, max(rel_error(g, g64), rel_error(beta, beta64)), TOL_FP32)
        ref_pool = before[idx.long()].to(f64)
        o64, _ = L.prefill_ref(q.to(f64), k.to(f64), v.to(f64), g64, beta64, cu, ref_pool,
                               torch.arange(len(idx), device=L.dev), compute_dtype=f64)
        self.track.error(L.op_p, rel_error(o, o64), TOL_OUTPUT_BF16, rel_error(self.pool[idx.long()], ref_pool), TOL_STATE_BF16)

    def _decode(self) -> None:
        """One decode step for every running request, padded with -1 rows to the fixed batch."""
        L, B = self.layer, self.B
        n = len(self.running)
        slots = [r.slot for r in self.running]
        idx = torch.full((B,), -1, dtype=torch.int32)
        idx[:n] = torch.tensor(slots, dtype=torch.int32)
        idx = idx.to(L.dev)
        inputs = L.tokens_in(B, 1)
        before = self.pool.clone()

        def call():
            o = L.decode(*inputs, L.A_log, L.dt_bias, self.pool, idx)
            self.track.record(L.op_d)
            return o

        step = self.decode_stats.calls
        o = self._timed(self.decode_stats, call)
        self.decode_stats.tokens += n
        self.decode_stats.padded_rows += B - n
        self.pad_checks += 1
        self.pad_ok &= bool((o[n:] == 0).all())
        self.idle_checks += 1
        self.idle_ok &= self._idle_unchanged(before, slots)
        if self.check_every and step % self.check_every == 0:
            self._check_decode(inputs, o, idx, n, before)
        self._retire()

    def _check_decode(self, inputs, o, idx, n: int, before) -> None:
        """The decode step recomputed in float64 on a copy of the running rows of the pool."""
        L, f64 = self.layer, torch.float64
        ref_pool = before[idx[:n].long()].to(f64)
        ref_idx = torch.full((self.B,), -1, dtype=torch.long, device=L.dev)
        ref_idx[:n] = torch.arange(n, device=L.dev)
        # float64 copies of the (exact) bf16 inputs: the reference output stays float64
        o64 = L.decode_ref(*(x.to(f64) for x in inputs), L.A_log.to(f64), L.dt_bias.to(f64), ref_pool, ref_idx,
                           compute_dtype=f64)
        self.track.error(L.op_d, rel_error(o[:n], o64[:n]), TOL_OUTPUT_BF16, rel_error(self.pool[idx[:n].long()], ref_pool),
                         TOL_STATE_BF16)

    def _retire(self) -> None:
        """Requests that decoded their last token finish and give their slot back."""
        still = []
        for r in self.running:
            r.decoded += 1
            if r.decoded >= r.output_len:
                self.alloc.release(r.slot)
                self.finished.append(r)
            else:
                still.append(r)
        self.running = still

    def request_stats(self, total: int) -> RequestStats:
        return RequestStats(total=total, admitted=total - len(self.waiting), finished=len(self.finished),
                            running_at_end=len(self.running), waiting_at_end=len(self.waiting),
                            slot_allocations=self.alloc.allocations, slot_reuses=self.alloc.reuses)


# -- the run ------------------------------------------------------------------------------------------

def _checked_config(model: str, requests: int, decode_batch: int, steps: int,
                    shape: Optional[tuple[int, int, int, int]], prompt_len: tuple[int, int],
                    output_len: tuple[int, int], pool_slots: Optional[int]):
    """The preset, the ``(H, HV, K, V)`` served and the pool slots P; a bad argument raises DemoConfigError."""
    try:
        pre = linattn.preset(model)
    except KeyError as e:
        raise DemoConfigError(e.args[0]) from None
    if pre.family not in ("gdn", "kda"):
        raise DemoConfigError(f"model {model!r} has a {pre.family!r} layer; the demo serves a linear-attention "
                              f"layer: use a gdn or kda preset such as qwen3-next or kimi-linear")
    for name, val in (("requests", requests), ("decode_batch", decode_batch), ("steps", steps)):
        if val < 1:
            raise DemoConfigError(f"{name} must be >= 1, got {val}")
    if not (1 <= prompt_len[0] <= prompt_len[1]) or not (1 <= output_len[0] <= output_len[1]):
        raise DemoConfigError(f"prompt_len {prompt_len} and output_len {output_len} must be ranges 1 <= lo <= hi")
    H, HV, K, V = shape if shape is not None else (pre.H, pre.HV, pre.K, pre.V)
    if HV % H:
        raise DemoConfigError(f"HV={HV} must be a multiple of H={H} (GVA)")
    P = pool_slots if pool_slots is not None else decode_batch + 2
    if P < decode_batch:
        raise DemoConfigError(f"pool_slots={P} must be >= decode_batch={decode_batch}")
    return pre, (H, HV, K, V), P


def run_demo(model: str = DEFAULTS["model"], requests: int = DEFAULTS["requests"],
             decode_batch: int = DEFAULTS["decode_batch"], steps: int = DEFAULTS["steps"],
             device: Optional[str] = None, seed: int = DEFAULTS["seed"], *,
             shape: Optional[tuple[int, int, int, int]] = None,
             prompt_len: tuple[int, int] = DEFAULTS["prompt_len"],
             output_len: tuple[int, int] = DEFAULTS["output_len"],
             check_every: int = DEFAULTS["check_every"],
             pool_slots: Optional[int] = None, warmup: Optional[bool] = None) -> DemoReport:
    """Serve ``requests`` requests through one GDN (or KDA) layer over a state pool; check as it goes.

    Args:
        model: a ``gdn`` or ``kda`` model preset (``qwen3-next``, ``kimi-linear``, ...).
        requests: requests in the stream (arrivals spread over the first half of the run).
        decode_batch: the fixed decode batch B; at most B requests run at once, free rows are padding.
        steps: scheduler iterations (each: admit + prefill if any arrived, then one decode step).
        device: ``"cpu"``, ``"cuda"`` or None (cuda if available).
        seed: seeds the request stream and every random input (bf16 q, k, v; gate inputs).
        shape: ``(H, HV, K, V)`` overriding the preset's (small shapes for tests).
        prompt_len: inclusive range of prompt lengths (tokens).
        output_len: inclusive range of decode steps per request.
        check_every: recompute every k-th prefill call and decode step (and the first of each) in
            float64 (0 = none).
        pool_slots: state-pool slots P (default ``decode_batch + 2``: fewer than ``requests`` so
            slots are reused, and always a few idle slots whose rows must stay untouched).
        warmup: run each op once, untimed, on a scratch pool first, so that kernel compilation
            (Triton JIT) is not counted as serving time (default: on every device but the CPU).
    Returns:
        DemoReport: throughput per phase, backend decisions, errors against float64, ``passed``.
    Raises:
        DemoConfigError: an unknown or non-linear-attention model, or a size out of range.
        NoBackendError: no backend accepts a call on this device (with every backend's reason).
    """
    pre, hs, P = _checked_config(model, requests, decode_batch, steps, shape, prompt_len, output_len, pool_slots)
    dev = _resolve_device(device)
    layer = _Layer(pre.family, hs, dev, seed)
    eng = _Engine(layer, _request_stream(layer, requests, steps, prompt_len, output_len), P, decode_batch,
                  check_every)
    warmup_s = _warm_up(layer, decode_batch, prompt_len) if (warmup if warmup is not None else dev.type != "cpu") \
        else 0.0
    t_start = time.perf_counter()
    for it in range(steps):
        eng.step(it)
    wall = time.perf_counter() - t_start
    for st in (eng.prefill_stats, eng.decode_stats):
        st.tokens_per_s = st.tokens / st.seconds if st.seconds > 0 else 0.0
    errors = eng.track.error_stats()
    from linattn.dispatch import resolve_device

    return DemoReport(
        model=model, title=pre.title, family=pre.family, device=str(dev), device_name=resolve_device(dev).name,
        shape=dict(zip(("H", "HV", "K", "V"), hs)), pool=dict(slots=P, dtype="float32", layout="vk",
                                                               shape=[P, hs[1], hs[3], hs[2]]),
        decode_batch=decode_batch, steps=steps, seed=seed, requests=eng.request_stats(requests),
        prefill=eng.prefill_stats, decode=eng.decode_stats, decisions=eng.track.decision_summaries(), errors=errors,
        padding_zero=InvariantStat(checks=eng.pad_checks, ok=eng.pad_ok),
        idle_rows_unchanged=InvariantStat(checks=eng.idle_checks, ok=eng.idle_ok),
        warmup_s=warmup_s, wall_s=wall, passed=all(e.passed for e in errors) and eng.pad_ok and eng.idle_ok,
    )


# -- rendering ----------------------------------------------------------------------------------------

def _served_table(rep: DemoReport):
    from rich.table import Table

    t = Table(title="Served", title_justify="left")
    for c in ("phase", "calls", "tokens", "wall s", "tokens/s", "notes"):
        t.add_column(c, justify="right" if c not in ("phase", "notes") else "left")
    t.add_row("prefill (gating + varlen prefill, pool mode)", str(rep.prefill.calls), f"{rep.prefill.tokens:,}",
              f"{rep.prefill.seconds:.3f}", f"{rep.prefill.tokens_per_s:,.0f}", "varlen, h0/ht in the pool")
    t.add_row("decode", str(rep.decode.calls), f"{rep.decode.tokens:,}", f"{rep.decode.seconds:.3f}",
              f"{rep.decode.tokens_per_s:,.0f}", f"{rep.decode.padded_rows} padding rows")
    return t


def _decisions_table(rep: DemoReport):
    from rich.table import Table
    from rich.text import Text

    d = Table(title="Backends (through the dispatcher)", title_justify="left")
    for c in ("op", "calls", "chosen", "why not the others"):
        d.add_column(c, overflow="fold")
    for x in rep.decisions:
        why = ", ".join(f"{b}: {code}" for b, code in x.others.items()) or "-"
        chosen = ", ".join(f"{b} x{x.chosen_calls[b]}" if len(x.chosen) > 1 else b for b in x.chosen)
        chosen += f" (forced: {x.forced})" if x.forced else ""
        d.add_row(x.op, str(x.calls), Text(chosen, style="bold green"), why)
    return d


def _pass_fail(ok: bool):
    from rich.text import Text

    return Text("PASS" if ok else "FAIL", style="bold green" if ok else "bold red")


def _errors_table(rep: DemoReport):
    from rich.table import Table

    e = Table(title="Errors against the float64 reference (sampled calls; ||x-ref||/||ref||)", title_justify="left")
    for c in ("op", "checked", "output err", "tol", "state err", "tol", "result"):
        e.add_column(c, justify="right" if c not in ("op", "result") else "left")
    for x in rep.errors:
        e.add_row(x.op, str(x.checked_calls), f"{x.output_error:.2e}", f"{x.output_tol:.0e}",
                  "-" if x.state_error is None else f"{x.state_error:.2e}",
                  "-" if x.state_tol is None else f"{x.state_tol:.0e}", _pass_fail(x.passed))
    for label, inv in (("padding rows -> zero output", rep.padding_zero),
                       ("idle pool rows bitwise unchanged", rep.idle_rows_unchanged)):
        e.add_row(label, str(inv.checks), "", "", "", "", _pass_fail(inv.ok))
    return e


def render_demo(rep: DemoReport, console=None) -> None:
    """Print a :class:`DemoReport` as rich tables."""
    from rich.console import Console
    from rich.text import Text

    con = console or Console()
    s, r = rep.shape, rep.requests
    con.print(Text.assemble(("linattn demo ", "bold"), f"{rep.title} ({rep.family.upper()} layer, H={s['H']} "
                            f"HV={s['HV']} K={s['K']} V={s['V']}, bf16 q/k/v) on {rep.device} ({rep.device_name})"))
    con.print(f"state pool [{', '.join(map(str, rep.pool['shape']))}] {rep.pool['dtype']} layout {rep.pool['layout']}, "
              f"decode batch {rep.decode_batch} (padded with -1), {rep.steps} scheduler steps, seed {rep.seed}")
    con.print(_served_table(rep))
    con.print(f"requests: {r.total} in the stream, {r.admitted} admitted, {r.finished} finished, "
              f"{r.running_at_end} still running, {r.waiting_at_end} waiting; "
              f"{r.slot_allocations} slot allocations, {r.slot_reuses} reused a freed slot; "
              f"wall {rep.wall_s:.2f} s (incl. checks)"
              + (f", warm-up {rep.warmup_s:.2f} s before serving" if rep.warmup_s else ""))
    con.print(_decisions_table(rep))
    con.print(_errors_table(rep))
    con.print(Text("PASS" if rep.passed else "FAIL: an error exceeds its tolerance",
                   style="bold green" if rep.passed else "bold red"))


# -- one long prompt across N ranks (linattn demo --context-parallel N) -------------------------------

#: Prompt tokens of the context-parallel demo (a few seconds on a CPU at Qwen3-Next heads).
CP_TOKENS = 4096
#: The demo scales the layer's log decays by this factor: with the model's own gates the state
#: forgets what entered a rank's slice within it, and the agreement with one rank would not test the
#: exchange at all; at 1/50 the first rank's tokens still weigh on the last rank's outputs and state.
CP_GATE_SCALE = 0.02
#: At most this many ranks per CPU core (gloo) or one per GPU (NCCL).
CP_RANKS_PER_CORE = 2


class ContextParallelReport(BaseModel):
    """What ``linattn demo --context-parallel N`` prints: per-rank time, agreement with one rank."""

    model_config = ConfigDict(extra="forbid")

    model: str
    family: str
    shape: dict[str, int]
    tokens: int
    ranks: int
    process_group: str = Field(description="gloo (CPU) or nccl (one GPU per rank)")
    backend: Optional[str] = Field(None, description="what the dispatcher chose for the ranks' prefill calls")
    rank_tokens: list[int]
    rank_seconds: list[float] = Field(description="wall time of the context-parallel call on each rank")
    one_rank_seconds: float = Field(description="the ordinary call on the whole prompt, on rank 0 (on the CPU "
                                    "with one rank's share of the cores)")
    max_abs_diff_output: float
    max_abs_diff_state: float
    rel_diff_output: float
    rel_diff_state: float
    passed: bool


def _cp_demo_rank(rank: int, world: int, family: str, shape: tuple, tokens: int, seed: int) -> dict:
    """One rank of the demo: the same seeded prompt on every rank, this rank's slice timed, and on
    rank 0 the ordinary call on the whole prompt afterwards (the agreement's reference)."""
    import os

    import torch.distributed as dist

    from linattn.context_parallel import context_parallel_prefill

    dev = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    if dev.type == "cpu":  # one rank's share of the cores (the one-rank call below gets the same)
        torch.set_num_threads(max(1, (os.cpu_count() or world) // world))
    layer = _Layer(family, shape, dev, seed)
    q, k, v, a, b = layer.tokens_in(tokens)
    g, beta = layer.gating(layer.A_log, a, b, layer.dt_bias)
    g = g * CP_GATE_SCALE  # gentle decays, so that the agreement tests the exchange (CP_GATE_SCALE)
    lo, hi = rank * tokens // world, (rank + 1) * tokens // world
    pool = torch.zeros(2, layer.HV, layer.V, layer.K, device=dev)
    kw = dict(cu_seqlens=_cu_seqlens([tokens], dev), state_indices=torch.zeros(1, dtype=torch.int32, device=dev))
    x = [t[lo:hi] for t in (q, k, v, g, beta)]

    def call():
        context_parallel_prefill(family, *x, token_offset=lo, state_pool=pool, **kw)
    if dev.type == "cuda":
        call()  # untimed: compiles the kernels
        pool.zero_()  # the warm-up wrote the final state (one rank: the rank holding the last token)
    dist.barrier()
    t0 = time.perf_counter()
    o = context_parallel_prefill(family, *x, token_offset=lo, state_pool=pool, **kw)
    _sync(dev)
    out = dict(seconds=time.perf_counter() - t0, o=o.float().cpu(), state=pool[0].cpu(), tokens=hi - lo,
               backend=linattn.last_decision().chosen if linattn.last_decision() else None)
    dist.barrier()
    if rank == 0:
        ref_pool = torch.zeros_like(pool)
        if dev.type == "cuda":  # untimed: the one-rank call's own kernels (e.g. the segmented pass) compile
            layer.prefill(q, k, v, g, beta, kw["cu_seqlens"], state_pool=torch.zeros_like(pool),
                          state_indices=kw["state_indices"])
        t0 = time.perf_counter()
        o1 = layer.prefill(q, k, v, g, beta, kw["cu_seqlens"], state_pool=ref_pool, state_indices=kw["state_indices"])
        _sync(dev)
        out.update(one_seconds=time.perf_counter() - t0, o1=o1.float().cpu(), state1=ref_pool[0].cpu())
    return out


def run_context_parallel_demo(ranks: int, model: str = DEFAULTS["model"], tokens: int = CP_TOKENS,
                              seed: int = DEFAULTS["seed"], shape: Optional[tuple[int, int, int, int]] = None
                              ) -> ContextParallelReport:
    """One prompt of ``tokens`` tokens through one GDN / KDA layer's prefill, split over ``ranks`` spawned ranks.

    Ranks get equal contiguous slices; rank ``r`` runs on ``cuda:r`` with NCCL when torch sees at
    least ``ranks`` GPUs, else on the CPU with gloo. The prompt starts from a zeroed slot in pool
    mode; the last rank writes the final state. The layer's log decays are scaled by
    :data:`CP_GATE_SCALE` (gentle decays: the state still remembers the earlier ranks' tokens).
    Agreement: the outputs and that final state against the ordinary call on the whole prompt (bf16
    inputs: docs/ops.md's bf16 tolerances).

    Raises:
        DemoConfigError: an unknown model, fewer than 1 rank, fewer tokens than ranks, or more ranks
            than :data:`CP_RANKS_PER_CORE` per CPU core (gloo).
    """
    import os

    from linattn.testing.spawn import spawn_ranks

    pre, hs, _ = _checked_config(model, 1, 1, 1, shape, (1, 1), (1, 1), None)
    if ranks < 1 or tokens < ranks:
        raise DemoConfigError(f"--context-parallel {ranks} with {tokens} tokens: give 1 <= ranks <= tokens")
    group = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "gloo"
    cap = CP_RANKS_PER_CORE * (os.cpu_count() or 1)
    if group == "gloo" and ranks > cap:
        raise DemoConfigError(f"--context-parallel {ranks}: more gloo ranks than {CP_RANKS_PER_CORE} per CPU core "
                              f"({cap} here); give at most {cap}, or run on as many GPUs as ranks")
    res = spawn_ranks(_cp_demo_rank, ranks, pre.family, hs, tokens, seed, backend=group)
    o, o1 = torch.cat([r["o"] for r in res]), res[0]["o1"]
    st, st1 = res[-1]["state"], res[0]["state1"]
    rel_o, rel_s = rel_error(o, o1), rel_error(st, st1)
    return ContextParallelReport(
        model=model, family=pre.family, shape=dict(zip(("H", "HV", "K", "V"), hs)), tokens=tokens, ranks=ranks,
        process_group=group, backend=res[0]["backend"], rank_tokens=[r["tokens"] for r in res],
        rank_seconds=[r["seconds"] for r in res], one_rank_seconds=res[0]["one_seconds"],
        max_abs_diff_output=float((o - o1).abs().max()), max_abs_diff_state=float((st - st1).abs().max()),
        rel_diff_output=rel_o, rel_diff_state=rel_s, passed=rel_o <= TOL_OUTPUT_BF16 and rel_s <= TOL_STATE_BF16)


def render_context_parallel_demo(rep: ContextParallelReport, console=None) -> None:
    """Print a :class:`ContextParallelReport`: one row per rank, then the agreement with one rank."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    s = rep.shape
    con.print(f"linattn demo --context-parallel {rep.ranks}: {rep.model} ({rep.family.upper()}, H={s['H']} HV={s['HV']} "
              f"K={s['K']} V={s['V']}, bf16), one prompt of {rep.tokens:,} tokens, {rep.process_group}, prefill "
              f"backend {rep.backend}")
    t = Table(title="Per rank", title_justify="left")
    for c in ("rank", "tokens", "seconds"):
        t.add_column(c, justify="right")
    for r, (n, sec) in enumerate(zip(rep.rank_tokens, rep.rank_seconds)):
        t.add_row(str(r), f"{n:,}", f"{sec:.3f}")
    con.print(t)
    con.print(f"context parallel (max over ranks) {max(rep.rank_seconds):.3f} s; one rank {rep.one_rank_seconds:.3f} s")
    con.print(f"against one rank: max |diff| output {rep.max_abs_diff_output:.2e}, final state {rep.max_abs_diff_state:.2e}"
              f" (relative {rep.rel_diff_output:.2e} / {rep.rel_diff_state:.2e}; tolerances {TOL_OUTPUT_BF16:.0e} / "
              f"{TOL_STATE_BF16:.0e})")
    con.print(_pass_fail(rep.passed))
