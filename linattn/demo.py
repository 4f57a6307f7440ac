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
``||x - ref|| / ||ref||`` of outputs and states are held against the ops.md tolerances for bf16
inputs with an fp32 state (2e-2 outputs, 1e-2 states; gates are computed in fp32 from exact
inputs and held to the fp32 tolerance 1e-5).

Example:
    >>> from linattn.demo import run_demo
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

#: Defaults of :func:`run_demo` and ``linattn demo`` (chosen to finish in seconds on 2 CPU cores
#: at Qwen3-Next shapes with the torch-ref backend).
DEFAULTS = dict(model="qwen3-next", requests=12, decode_batch=8, steps=24, prompt_len=(16, 256),
                output_len=(2, 12), check_every=4, seed=0)

#: ops.md tolerances against the float64 reference (relative): bf16 inputs with an fp32 state.
TOL_OUTPUT_BF16 = 2e-2
TOL_STATE_BF16 = 1e-2
#: Gates are computed in fp32 from exact inputs: the fp32 tolerance.
TOL_FP32 = 1e-5


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


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


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


# -- the run ------------------------------------------------------------------------------------------

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
    from linattn.backends import torch_ref as ref

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
    kda = pre.family == "kda"
    dev = _resolve_device(device)
    P = pool_slots if pool_slots is not None else decode_batch + 2
    if P < decode_batch:
        raise DemoConfigError(f"pool_slots={P} must be >= decode_batch={decode_batch}")
    gating, prefill, decode = ((linattn.kda_gating, linattn.kda_prefill, linattn.kda_decode) if kda else
                               (linattn.gdn_gating, linattn.gdn_prefill, linattn.gdn_decode))
    gating_ref, prefill_ref, decode_ref = ((ref.kda_gating_ref, ref.kda_prefill_ref, ref.kda_decode_ref) if kda else
                                           (ref.gdn_gating_ref, ref.gdn_prefill_ref, ref.gdn_decode_ref))
    fam = pre.family
    op_g, op_p, op_d = f"{fam}_gating", f"{fam}_prefill", f"{fam}_decode"
    f64, bf16 = torch.float64, torch.bfloat16

    gen = torch.Generator().manual_seed(seed)

    def randn(*s, dtype=bf16):
        return torch.randn(*s, generator=gen).to(device=dev, dtype=dtype)

    def randint(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    # layer parameters (fp32), initialised as in Mamba-style layers: A in [1, 16], dt in [1e-3, 0.1]
    gate_shape = (HV, K) if kda else (HV,)
    A_log = torch.empty(HV).uniform_(1, 16, generator=gen).log().to(dev)
    dt = torch.exp(torch.rand(gate_shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = (dt + torch.log(-torch.expm1(-dt))).to(dev)  # inverse softplus: softplus(dt_bias) = dt

    # the request stream
    span = max(1, steps // 2)
    arrivals = sorted([0] + [randint(0, span - 1) for _ in range(requests - 1)])
    stream = [_Request(i, arrivals[i], randint(*prompt_len), randint(*output_len)) for i in range(requests)]
    waiting = collections.deque(stream)
    running: list[_Request] = []
    finished: list[_Request] = []

    # the state pool: stale values everywhere (earlier traffic); zeroed per slot on allocation
    pool = randn(P, HV, V, K, dtype=torch.float32) * 0.1
    alloc = SlotAllocator(P)
    track = _Tracker()
    pre_stats, dec_stats = PhaseStats(), PhaseStats()
    pad_checks = idle_checks = 0
    pad_ok = idle_ok = True
    prefill_calls = 0

    def idle_unchanged(before: torch.Tensor, owned: list[int]) -> bool:
        mask = torch.ones(P, dtype=torch.bool, device=dev)
        if owned:
            mask[torch.tensor(owned, device=dev)] = False
        return torch.equal(pool[mask], before[mask])

    # engines compile/capture their kernels at start-up: one untimed call per op on a scratch pool
    warmup_s = 0.0
    if warmup if warmup is not None else dev.type != "cpu":
        t0 = time.perf_counter()
        scratch = torch.zeros(min(2, decode_batch), HV, V, K, device=dev)
        lens = [prompt_len[0], min(prompt_len[1], 64)][:scratch.shape[0]]
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        T = sum(lens)
        g, beta = gating(A_log, randn(T, *gate_shape), randn(T, HV), dt_bias)
        prefill(randn(T, H, K), randn(T, H, K), randn(T, HV, V), g, beta, cu, state_pool=scratch,
                state_indices=torch.arange(len(lens), dtype=torch.int32, device=dev))
        idx = torch.full((decode_batch,), -1, dtype=torch.int32, device=dev)
        idx[0] = 0
        B = decode_batch
        decode(randn(B, 1, H, K), randn(B, 1, H, K), randn(B, 1, HV, V), randn(B, 1, *gate_shape), randn(B, 1, HV),
               A_log, dt_bias, scratch, idx)
        _sync(dev)
        warmup_s = time.perf_counter() - t0

    t_start = time.perf_counter()
    for it in range(steps):
        # -- admit and prefill ---------------------------------------------------------------------
        new: list[_Request] = []
        while waiting and waiting[0].arrival <= it and len(running) + len(new) < decode_batch and len(alloc):
            r = waiting.popleft()
            r.slot = alloc.alloc()
            pool[r.slot].zero_()  # a new request starts from a zero state
            new.append(r)
        if new:
            lens = [r.prompt_len for r in new]
            T = sum(lens)
            cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
            slots = [r.slot for r in new]
            idx = torch.tensor(slots, dtype=torch.int32, device=dev)
            q, k, v = randn(T, H, K), randn(T, H, K), randn(T, HV, V)
            a, b = randn(T, *gate_shape), randn(T, HV)
            before = pool.clone()
            _sync(dev)
            t0 = time.perf_counter()
            g, beta = gating(A_log, a, b, dt_bias)
            track.record(op_g)
            o = prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=idx)
            track.record(op_p)
            _sync(dev)
            pre_stats.seconds += time.perf_counter() - t0
            pre_stats.calls += 1
            pre_stats.tokens += T
            idle_checks += 1
            idle_ok &= idle_unchanged(before, slots)
            if check_every and prefill_calls % check_every == 0:
                g64, beta64 = gating_ref(A_log.to(f64), a.to(f64), b.to(f64), dt_bias.to(f64), compute_dtype=f64)
                track.error(op_g, max(_rel(g, g64), _rel(beta, beta64)), TOL_FP32)
                ref_pool = before[idx.long()].to(f64)
                o64, _ = prefill_ref(q.to(f64), k.to(f64), v.to(f64), g64, beta64, cu, ref_pool,
                                     torch.arange(len(new), device=dev), compute_dtype=f64)
                track.error(op_p, _rel(o, o64), TOL_OUTPUT_BF16, _rel(pool[idx.long()], ref_pool), TOL_STATE_BF16)
            prefill_calls += 1
            running += new

        # -- one decode step, padded to the fixed batch ---------------------------------------------
        if not running:
            continue
        n = len(running)
        slots = [r.slot for r in running]
        idx = torch.full((decode_batch,), -1, dtype=torch.int32)
        idx[:n] = torch.tensor(slots, dtype=torch.int32)
        idx = idx.to(dev)
        B = decode_batch
        q, k, v = randn(B, 1, H, K), randn(B, 1, H, K), randn(B, 1, HV, V)
        a, b = randn(B, 1, *gate_shape), randn(B, 1, HV)
        before = pool.clone()
        _sync(dev)
        t0 = time.perf_counter()
        o = decode(q, k, v, a, b, A_log, dt_bias, pool, idx)
        track.record(op_d)
        _sync(dev)
        dec_stats.seconds += time.perf_counter() - t0
        step = dec_stats.calls
        dec_stats.calls += 1
        dec_stats.tokens += n
        dec_stats.padded_rows += B - n
        pad_checks += 1
        pad_ok &= bool((o[n:] == 0).all())
        idle_checks += 1
        idle_ok &= idle_unchanged(before, slots)
        if check_every and step % check_every == 0:
            ref_pool = before[idx[:n].long()].to(f64)
            ref_idx = torch.full((B,), -1, dtype=torch.long, device=dev)
            ref_idx[:n] = torch.arange(n, device=dev)
            # float64 copies of the (exact) bf16 inputs: the reference output stays float64
            o64 = decode_ref(q.to(f64), k.to(f64), v.to(f64), a.to(f64), b.to(f64), A_log.to(f64),
                             dt_bias.to(f64), ref_pool, ref_idx, compute_dtype=f64)
            track.error(op_d, _rel(o[:n], o64[:n]), TOL_OUTPUT_BF16, _rel(pool[idx[:n].long()], ref_pool),
                        TOL_STATE_BF16)
        still = []
        for r in running:
            r.decoded += 1
            if r.decoded >= r.output_len:
                alloc.release(r.slot)
                finished.append(r)
            else:
                still.append(r)
        running = still
    wall = time.perf_counter() - t_start

    for st in (pre_stats, dec_stats):
        st.tokens_per_s = st.tokens / st.seconds if st.seconds > 0 else 0.0
    errors = track.error_stats()
    passed = all(e.passed for e in errors) and pad_ok and idle_ok
    from linattn.dispatch import resolve_device

    caps = resolve_device(dev)
    return DemoReport(
        model=model, title=pre.title, family=fam, device=str(dev), device_name=caps.name,
        shape=dict(H=H, HV=HV, K=K, V=V), pool=dict(slots=P, dtype="float32", layout="vk",
                                                     shape=[P, HV, V, K]),
        decode_batch=decode_batch, steps=steps, seed=seed,
        requests=RequestStats(total=requests, admitted=requests - len(waiting), finished=len(finished),
                              running_at_end=len(running), waiting_at_end=len(waiting),
                              slot_allocations=alloc.allocations, slot_reuses=alloc.reuses),
        prefill=pre_stats, decode=dec_stats, decisions=track.decision_summaries(), errors=errors,
        padding_zero=InvariantStat(checks=pad_checks, ok=pad_ok),
        idle_rows_unchanged=InvariantStat(checks=idle_checks, ok=idle_ok),
        warmup_s=warmup_s, wall_s=wall, passed=passed,
    )


# -- rendering ----------------------------------------------------------------------------------------

def render_demo(rep: DemoReport, console=None) -> None:
    """Print a :class:`DemoReport` as rich tables."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = console or Console()
    s = rep.shape
    con.print(Text.assemble(("linattn demo ", "bold"), f"{rep.title} ({rep.family.upper()} layer, H={s['H']} "
                            f"HV={s['HV']} K={s['K']} V={s['V']}, bf16 q/k/v) on {rep.device} ({rep.device_name})"))
    con.print(f"state pool [{', '.join(map(str, rep.pool['shape']))}] {rep.pool['dtype']} layout {rep.pool['layout']}, "
              f"decode batch {rep.decode_batch} (padded with -1), {rep.steps} scheduler steps, seed {rep.seed}")

    r = rep.requests
    t = Table(title="Served", title_justify="left")
    for c in ("phase", "calls", "tokens", "wall s", "tokens/s", "notes"):
        t.add_column(c, justify="right" if c not in ("phase", "notes") else "left")
    t.add_row("prefill (gating + varlen prefill, pool mode)", str(rep.prefill.calls), f"{rep.prefill.tokens:,}",
              f"{rep.prefill.seconds:.3f}", f"{rep.prefill.tokens_per_s:,.0f}", "varlen, h0/ht in the pool")
    t.add_row("decode", str(rep.decode.calls), f"{rep.decode.tokens:,}", f"{rep.decode.seconds:.3f}",
              f"{rep.decode.tokens_per_s:,.0f}", f"{rep.decode.padded_rows} padding rows")
    con.print(t)
    con.print(f"requests: {r.total} in the stream, {r.admitted} admitted, {r.finished} finished, "
              f"{r.running_at_end} still running, {r.waiting_at_end} waiting; "
              f"{r.slot_allocations} slot allocations, {r.slot_reuses} reused a freed slot; "
              f"wall {rep.wall_s:.2f} s (incl. checks)"
              + (f", warm-up {rep.warmup_s:.2f} s before serving" if rep.warmup_s else ""))

    d = Table(title="Backends (through the dispatcher)", title_justify="left")
    for c in ("op", "calls", "chosen", "why not the others"):
        d.add_column(c, overflow="fold")
    for x in rep.decisions:
        why = ", ".join(f"{b}: {code}" for b, code in x.others.items()) or "-"
        chosen = ", ".join(f"{b} x{x.chosen_calls[b]}" if len(x.chosen) > 1 else b for b in x.chosen)
        chosen += f" (forced: {x.forced})" if x.forced else ""
        d.add_row(x.op, str(x.calls), Text(chosen, style="bold green"), why)
    con.print(d)

    e = Table(title="Errors against the float64 reference (sampled calls; ||x-ref||/||ref||)", title_justify="left")
    for c in ("op", "checked", "output err", "tol", "state err", "tol", "result"):
        e.add_column(c, justify="right" if c not in ("op", "result") else "left")
    for x in rep.errors:
        e.add_row(x.op, str(x.checked_calls), f"{x.output_error:.2e}", f"{x.output_tol:.0e}",
                  "-" if x.state_error is None else f"{x.state_error:.2e}",
                  "-" if x.state_tol is None else f"{x.state_tol:.0e}",
                  Text("PASS" if x.passed else "FAIL", style="bold green" if x.passed else "bold red"))
    for label, inv in (("padding rows -> zero output", rep.padding_zero),
                       ("idle pool rows bitwise unchanged", rep.idle_rows_unchanged)):
        e.add_row(label, str(inv.checks), "", "", "", "",
                  Text("PASS" if inv.ok else "FAIL", style="bold green" if inv.ok else "bold red"))
    con.print(e)
    con.print(Text("PASS" if rep.passed else "FAIL: an error exceeds its tolerance",
                   style="bold green" if rep.passed else "bold red"))
