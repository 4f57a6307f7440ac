"""``linattn bench OP``: every eligible backend side by side at a model preset's shapes.

For one op it builds inputs at the preset's shapes (``qwen3-next`` for GDN, ``kimi-linear`` for
KDA, ``deepseek-v4`` for the SwiGLU clamp), runs each backend **forced through the public op**
(``backend=NAME, validate=False``, exactly what an engine's call does, dispatch included) and
reports, per backend and shape:

- the median time of ``repeats`` calls after a warm-up. On CUDA each call is timed with CUDA
  events between two ``torch.cuda.synchronize()`` calls, after the L2 cache is flushed (a 256 MiB
  write), so small shapes show the eager call latency (Python dispatch included) and large ones
  the kernel time; ``benchmarks/decode.py`` times CUDA-graph replays instead. On the CPU each
  call is timed with ``time.perf_counter``;
- decode and clamp: the effective bandwidth, bytes the op must move over time, against the
  device's copy bandwidth measured in the same run (a large ``copy_``, read + write bytes over
  time). Decode bytes: state rows read and written (``2 N HV K V`` x state itemsize), q, k, v,
  o, the raw gates a, b and the slot indices, each once. Clamp bytes: ``x``
  read and ``out`` written (``3 M D`` x itemsize);
- prefill: tokens per second (``N x L`` packed tokens over time).

Inputs (docs/ops.md): bf16 q/k/v (and raw gates a/b for decode), fp32 ``A_log``/``dt_bias``; decode
uses an fp32 pool ``[2N, HV, V, K]`` and ``N`` distinct random slots; prefill is varlen pool mode
(``N`` sequences of ``L`` tokens, ``cu_seqlens`` int32, fp32 ``g``/``beta`` as the gating op
returns them, the same kind of pool); the clamp uses the preset's ``D`` and ``limit``. Every call
advances the pool it is given; that is fine for timing (the delta rule keeps the state bounded)
and no measured call runs a pool-writing kernel twice (docs/ops.md forbids re-runs inside one call).

flash-linear-attention 0.6 (``fla``) runs on the same data with dense states when it imports and
the device is CUDA: ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda`` for decode
(gates fused in its kernel, ``state_v_first=True`` so the state is the pool's ``[V, K]`` rows
gathered once outside the timing), ``chunk_gated_delta_rule`` / ``chunk_kda`` for prefill (states
``[N, HV, K, V]``), and for prefill also with the gather / scatter around it that an engine with
a pool needs (``flash-linear-attention+gather-scatter``). Its bytes exclude the slot indices.

``--plot PATH`` writes a plot (``apps/bench_plot.py``; a PNG, or the format of the path's suffix that
matplotlib writes: ``.svg``, ``.pdf``, ...): decode and clamp GB/s over N against
the copy ceiling, prefill Mtok/s per shape, each beside FLA when it ran. ``--from RESULTS.json``
plots an earlier run (a ``--out`` file, or a file of ``benchmarks/results/``) without measuring.

Exit codes: 0 done (rejected or failed backends are rows, not errors); 2 a bad argument (unknown
op, model, backend or device, ``--plot`` without matplotlib or with a suffix it cannot write, or a
``--from`` file without the op).

Example:
    $ linattn bench gdn_decode --batch 1 --batch 8 --json
    $ linattn bench gdn_prefill --batch 16 --tokens 4096 --plot prefill.png   # on a GPU
    $ linattn bench kda_decode --from results.json --plot kda_decode.png   # an earlier --out, no GPU
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import typer

import linattn
from linattn.apps.report import SIZE_MAX
from linattn.apps.bench_plot import FLA, FLA_GS
from linattn.apps.cli_common import DEVICE_HELP, JSON_OPT, count_option, echo, fail, hidden_profile_option, no_profile, one_op, op_argument, op_option
from linattn.dispatch import OP_TABLE, NoBackendError, Problem
from linattn.dispatch import explain as _explain
from linattn.dispatch.rules.validate import validate as _validate
from linattn.measure import FLUSH_BYTES, Case, Timer, clamp_case, decode_case, prefill_case  # noqa: F401 (bench's names)

BENCH_OPS = ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill", "silu_and_mul_clamp")
FLA_NAMES = (FLA, FLA_GS)
ALIASES = {"fla": FLA, "fla+gather-scatter": FLA_GS}

#: Default shapes: decode rows N, prefill (sequences N, tokens per sequence L), clamp rows M.
CUDA_DEFAULTS = {"decode": (1, 32, 256, 1024, 4096, 8192), "prefill": ((16, 4096), (64, 1024), (256, 256)),
                 "mlp": (8192,)}
CPU_DEFAULTS = {"decode": (1, 8), "prefill": ((2, 64),), "mlp": (16, 256)}
#: Prefill tokens per shape when only one of ``--batch`` / ``--tokens`` is given (N x L = budget).
PREFILL_TOKEN_BUDGET = {"cuda": 65536, "cpu": 128}
#: Bytes of the copy-bandwidth measurement (each of source and destination).
COPY_BYTES = {"cuda": 2 << 30, "cpu": 64 << 20}
#: Default repeats and warm-up calls per device type.
REPEATS = {"cuda": 25, "cpu": 5}
WARMUP = {"cuda": 3, "cpu": 1}
#: A backend whose warm-up call takes long gets fewer repeats: about this many seconds per row.
ROW_BUDGET_S = {"cuda": 10.0, "cpu": 5.0}
FAMILY_PRESET = {"gdn": "qwen3-next", "kda": "kimi-linear", "swiglu": "deepseek-v4"}


class BenchUsageError(Exception):
    """A bad argument (exit code 2)."""


# -- inputs (the cases are linattn.measure's, shared with the tuning measurement) --------------------

def problem_of(case: Case) -> Problem:
    """The :class:`Problem` a call with ``case.args`` produces (the validation layer's signature)."""
    _, sig = _validate(case.op, case.args, check_values=False)
    return Problem(**dict(sig))


# -- timing (the Timer is linattn.measure's) -------------------------------------------------------

def copy_bandwidth(device: torch.device, nbytes: int, timer: Timer, repeats: int, warmup: int) -> dict:
    """The device's copy bandwidth: ``dst.copy_(src)`` of ``nbytes``, (read + write) bytes over the median time.

    Returns:
        ``{"bytes": nbytes, "median_us": ..., "GBps": ...}`` (GB = 1e9 bytes, read + write counted).
    """
    src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    nb = src.numel() * 4
    times = timer.measure(functools.partial(torch.empty_like(src).copy_, src), max(repeats, 5), warmup,
                          budget_s=30.0)
    med = statistics.median(times)
    del src  # the measured call held the destination; both are freed before the largest shapes
    return {"bytes": nb, "median_us": med * 1e6, "GBps": 2 * nb / med / 1e9}


# -- runners ---------------------------------------------------------------------------------------

class Unavailable(Exception):
    """A baseline that cannot run here: ``reason`` (a verdict reason code) and a message."""

    def __init__(self, reason: str, message: str, hint: str = ""):
        super().__init__(message)
        self.reason, self.message, self.hint = reason, message, hint

    def __reduce__(self):
        return type(self), (self.reason, self.message, self.hint)  # pickles as itself (F40)


def linattn_runner(case: Case, backend: str) -> Callable[[], object]:
    """``linattn.<op>(**args, backend=backend, validate=False)`` as a zero-argument callable."""
    fn = getattr(linattn, case.op)
    args = case.args
    return lambda: fn(**args, backend=backend, validate=False)


def fla_version() -> Optional[str]:
    """flash-linear-attention's version when ``fla`` imports, else None."""
    try:
        mod = importlib.import_module("fla")
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return None
    return getattr(mod, "__version__", "unknown")


def fla_runner(case: Case, name: str, device: torch.device) -> Callable[[], object]:
    """flash-linear-attention 0.6 on ``case``'s data with dense states (see the module docstring).

    Raises:
        Unavailable: not a CUDA device, ``fla`` does not import, or no FLA counterpart of the op.
    """
    spec = OP_TABLE[case.op]
    if spec.method == "clamp" or (name == FLA_GS and spec.phase != "prefill"):
        raise Unavailable("op", f"{name} has no counterpart of {case.op} in this bench",
                          "drop it from --backend")
    if device.type != "cuda":
        raise Unavailable("device", f"{name} needs a CUDA GPU; the bench device is {device}",
                          "run on a GPU (--device cuda)")
    if fla_version() is None:
        raise Unavailable("toolchain", "flash-linear-attention does not import (package fla-core)",
                          "pip install fla-core==0.6.0")
    a = case.args
    kda = spec.per_channel_gates
    scale = a["q"].shape[-1] ** -0.5
    idx = a["state_indices"].long()
    if spec.phase == "decode":
        if kda:
            from fla.ops.kda import fused_recurrent_kda as f
        else:
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as f
        h0 = a["state_pool"].index_select(0, idx)  # dense [N, HV, V, K]: no indexing in the timed call
        kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  A_log=a["A_log"], dt_bias=a["dt_bias"], use_beta_sigmoid_in_kernel=True, state_v_first=True,
                  scale=scale)
        q, k, v, g, beta = a["q"], a["k"], a["v"], a["a"], a["b"]
        return lambda: f(q, k, v, g=g, beta=beta, **kw)
    if kda:
        from fla.ops.kda import chunk_kda as f
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as f
    q, k, v, g, beta = (a[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta"))
    cu = a["cu_seqlens"].long()
    kw = dict(scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
              cu_seqlens_cpu=cu.cpu())
    pool_kv = a["state_pool"].transpose(-1, -2).contiguous()  # FLA's [K, V] state rows
    if name == FLA:
        h0 = pool_kv.index_select(0, idx)
        return lambda: f(q, k, v, g, beta, initial_state=h0, **kw)

    def gather_scatter():
        o, ht = f(q, k, v, g, beta, initial_state=pool_kv.index_select(0, idx), **kw)
        pool_kv.index_copy_(0, idx, ht)
        return o
    return gather_scatter


# -- one row ---------------------------------------------------------------------------------------

def _row(case: Case, name: str, **kw) -> dict:
    row = {"op": case.op, "backend": name, "label": case.label, "shape": dict(case.sizes), "status": "ok",
           "reason": None, "message": "", "hint": "", "default": False, "median_us": None, "min_us": None,
           "repeats": 0, "timing": None, "bytes": None, "GBps": None, "frac_of_copy": None, "tokens": case.tokens,
           "tokens_per_s": None}
    row.update(kw)
    return row


def bench_row(case: Case, name: str, device: torch.device, timer: Timer, repeats: int, warmup: int,
              copy_gbps: float) -> dict:
    """Time ``name`` on ``case``: a row with the median, bandwidth or tokens/s, or why it did not run.

    A forced backend the dispatcher rejects gives ``status="rejected"`` with the verdict's reason
    code, message and hint; one that raises gives ``status="error"`` with the exception.
    """
    try:
        fn = fla_runner(case, name, device) if name in FLA_NAMES else linattn_runner(case, name)
        times = timer.measure(fn, repeats, warmup, ROW_BUDGET_S[device.type])
    except Unavailable as e:
        return _row(case, name, status="rejected", reason=e.reason, message=e.message, hint=e.hint)
    except NoBackendError as e:
        try:
            v = e.decision.verdict(name)
            return _row(case, name, status="rejected", reason=getattr(v.reason, "value", None),
                        message=getattr(v, "message", str(e)), hint=getattr(v, "hint", ""))
        except KeyError:
            return _row(case, name, status="rejected", reason=None, message=str(e))
    except Exception as e:  # noqa: BLE001 - a failing backend is a row, the others still run
        return _row(case, name, status="error", reason="error", message=f"{type(e).__name__}: {e}")
    med = statistics.median(times)
    row = _row(case, name, median_us=med * 1e6, min_us=min(times) * 1e6, repeats=len(times), timing=timer.method)
    if case.nbytes is not None:
        nb = case.nbytes - (case.index_bytes if name in FLA_NAMES else 0)
        gbps = nb / med / 1e9
        row.update(bytes=nb, GBps=gbps, frac_of_copy=gbps / copy_gbps if copy_gbps else None)
    if case.tokens is not None:
        row["tokens_per_s"] = case.tokens / med
    return row


# -- the whole run ---------------------------------------------------------------------------------

def _resolve_bench_device(device: Optional[str]) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise BenchUsageError(f"unknown --device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BenchUsageError(f"--device {device}: no CUDA GPU is visible; use --device cpu")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise BenchUsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise BenchUsageError(f"--device {device}: the bench runs on cpu or cuda")
    return dev


def _parse_shape(text: Optional[str], op: str) -> Optional[tuple]:
    if not text:
        return None
    want = 1 if OP_TABLE[op].method == "clamp" else 4
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != want or min(parts) < 1:
        form = "D" if want == 1 else "H,HV,K,V"
        raise BenchUsageError(f"--shape for {op} must be {want} positive integer(s) {form}, got {text!r}")
    return parts


def _shapes(op: str, dev: torch.device, batch: Optional[list[int]], tokens: Optional[list[int]]) -> list:
    phase = OP_TABLE[op].phase
    defaults = CUDA_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
    for name, vals in (("batch", batch), ("tokens", tokens)):
        if vals and min(vals) < 1:
            raise BenchUsageError(f"--{name} values must be >= 1, got {vals}")
    if phase != "prefill":
        if tokens:
            raise BenchUsageError(f"--tokens (tokens per sequence) is for prefill ops here: bench times {op} at one "
                                  f"token per row (decode) or over --batch rows (the clamp); give --batch only")
        return list(batch) if batch else list(defaults[phase])
    if not batch and not tokens:
        return list(defaults["prefill"])
    budget = PREFILL_TOKEN_BUDGET[dev.type]
    if batch and not tokens:
        return [(n, max(1, budget // n)) for n in batch]
    if tokens and not batch:
        return [(max(1, budget // L), L) for L in tokens]
    if len(batch) == len(tokens):
        return list(zip(batch, tokens))
    if len(tokens) == 1:
        return [(n, tokens[0]) for n in batch]
    if len(batch) == 1:
        return [(batch[0], L) for L in tokens]
    raise BenchUsageError(f"--batch ({len(batch)} values) and --tokens ({len(tokens)} values) pair up one to one; "
                          f"give as many of each, or one of either")


def _backend_names(names: Optional[list[str]]) -> Optional[list[str]]:
    if not names:
        return None
    known = set(linattn.list_backends()) | set(FLA_NAMES)
    out = []
    for n in names:
        n = ALIASES.get(n, n)
        if n not in known:
            raise BenchUsageError(f"unknown backend {n!r}; registered: {', '.join(sorted(linattn.list_backends()))}; "
                                  f"baselines: {', '.join(FLA_NAMES)} (alias fla)")
        if n not in out:
            out.append(n)
    return out


def _preset_of(op: str, model: Optional[str]):
    """``(model, preset)`` for ``op``; an unknown op or model, or one of another family, raises."""
    if op not in BENCH_OPS:
        raise BenchUsageError(f"unknown op {op!r} for bench; ops: {', '.join(BENCH_OPS)}")
    fam = OP_TABLE[op].family
    model = model or FAMILY_PRESET[fam]
    try:
        p = linattn.preset(model)
    except KeyError as e:
        raise BenchUsageError(e.args[0]) from None
    if p.family != fam:
        raise BenchUsageError(f"model {model!r} ({p.title}) is a {p.family!r} model; {op} needs a {fam!r} model "
                              f"such as {FAMILY_PRESET[fam]!r}")
    return model, p


def _make_case(op: str, size, sizes: Optional[tuple], p, dev: torch.device, seed: int) -> Case:
    """The inputs of one shape: clamp rows M, decode rows N, or prefill ``(N, L)``."""
    spec = OP_TABLE[op]
    if spec.method == "clamp":
        return clamp_case(size, sizes[0] if sizes else p.D, p.limit, dev, seed)
    hs = sizes or (p.H, p.HV, p.K, p.V)
    if spec.phase == "decode":
        return decode_case(op, size, hs, dev, seed)
    return prefill_case(op, size[0], size[1], hs, dev, seed)


def _names_for(d, forced: Optional[list[str]], op: str, dev: torch.device, fla_ver: Optional[str]) -> list[str]:
    """The backends to time on one shape: the forced ones, or every accepted one by rank (+ FLA on CUDA)."""
    if forced is not None:
        return forced
    names = [v.backend for v in sorted((v for v in d.verdicts if v.ok), key=lambda v: (v.rank, v.backend))]
    spec = OP_TABLE[op]
    if dev.type == "cuda" and fla_ver is not None and spec.method != "clamp":
        names += [FLA] + ([FLA_GS] if spec.phase == "prefill" else [])
    return names


@dataclass(frozen=True)
class _Session:
    """What every row of one run shares: the device, its timer and settings, the copy bandwidth, FLA."""

    dev: torch.device
    caps: object
    timer: Timer
    repeats: int
    warmup: int
    copy_gbps: float
    fla: Optional[str]


def _time_shapes(op: str, shapes: list, make: Callable[[object], Case], forced: Optional[list[str]],
                 run: _Session) -> tuple[list[dict], dict]:
    """One row per shape x backend, and the dispatcher's default per shape label."""
    rows, defaults = [], {}
    for s in shapes:
        case = make(s)
        d = _explain(problem_of(case), run.caps)
        defaults[case.label] = d.chosen
        for name in _names_for(d, forced, op, run.dev, run.fla):
            row = bench_row(case, name, run.dev, run.timer, run.repeats, run.warmup, run.copy_gbps)
            rows.append(dict(row, default=name == d.chosen))
        del case
        if run.dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, defaults


def run_bench(op: str, *, model: Optional[str] = None, batch: Optional[list[int]] = None,
              tokens: Optional[list[int]] = None, backends: Optional[list[str]] = None, device: Optional[str] = None,
              repeats: Optional[int] = None, warmup: Optional[int] = None, shape: Optional[str] = None,
              copy_bytes: Optional[int] = None, seed: int = 0) -> dict:
    """Run the benchmark and return the JSON document (see :func:`bench`).

    Args:
        op: one of :data:`BENCH_OPS`.
        model: a preset of the op's family (default: qwen3-next, kimi-linear, deepseek-v4).
        batch: decode rows N, prefill sequences N, or clamp rows M (several = several shapes).
        tokens: prefill tokens per sequence L (paired with ``batch``; see :func:`_shapes`).
        backends: backend names (registered ones, ``flash-linear-attention``,
            ``flash-linear-attention+gather-scatter``); default every backend the dispatcher
            accepts for each shape on this device, plus FLA on CUDA when it imports.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (default: cuda when available).
        repeats, warmup: timed calls per row (median reported) and warm-up calls.
        shape: override ``H,HV,K,V`` (or ``D`` for the clamp), for tests.
        copy_bytes: size of the copy-bandwidth measurement.
        seed: input generator seed.
    Returns:
        dict: ``command, op, model, preset, device, capabilities, copy_bandwidth, fla, repeats,
        warmup, timing, defaults, rows`` (one row per shape x backend).
    Raises:
        BenchUsageError: unknown op, model, backend or device, or bad sizes.
    """
    model, p = _preset_of(op, model)
    dev = _resolve_bench_device(device)
    sizes = _parse_shape(shape, op)
    shapes = _shapes(op, dev, batch, tokens)
    forced = _backend_names(backends)
    repeats = repeats if repeats is not None else REPEATS[dev.type]
    warmup = warmup if warmup is not None else WARMUP[dev.type]
    if repeats < 1 or warmup < 0:
        raise BenchUsageError(f"--repeats must be >= 1 (got {repeats}) and warm-up >= 0 (got {warmup})")
    caps = linattn.device_capabilities(dev)
    on_device = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.no_grad():  # CUDA events record on dev's current stream
        timer = Timer(dev)
        copy = copy_bandwidth(dev, copy_bytes or COPY_BYTES[dev.type], timer, repeats, warmup)
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # give the copy buffers back before the largest shapes
        fla_ver = fla_version() if dev.type == "cuda" or (forced and set(forced) & set(FLA_NAMES)) else None
        run = _Session(dev, caps, timer, repeats, warmup, copy["GBps"], fla_ver)
        rows, defaults = _time_shapes(op, shapes, lambda s: _make_case(op, s, sizes, p, dev, seed), forced, run)
    return {
        "command": "linattn bench", "op": op, "model": model,
        "preset": p.model_dump(mode="json"),
        "device": {"type": dev.type, "index": dev.index, "name": caps.name},
        "capabilities": caps.model_dump(mode="json"),
        "copy_bandwidth": copy, "fla": fla_ver, "repeats": repeats, "warmup": warmup, "timing": timer.method,
        "defaults": defaults, "rows": rows,
    }


# -- output ----------------------------------------------------------------------------------------

def _num(x: float) -> str:
    """Three significant digits without exponents: 4,123 / 41.2 / 0.0412."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.3g}" if x < 10 else f"{x:.1f}"
    return f"{x:.3g}"


def _row_cells(r: dict, prefill: bool) -> tuple[list[str], object]:
    """The median and rate cells of one row, and its status cell."""
    from rich.text import Text

    if r["status"] != "ok":
        return ["-", "-"] + ([] if prefill else ["-"]), Text(f"{r['status']}: [{r['reason']}] {r['message']}",
                                                              style="red")
    us = r["median_us"]
    med = f"{us:,.1f} us" if us < 10_000 else f"{us / 1e3:,.2f} ms"
    if prefill:
        tps = r["tokens_per_s"]
        rate = f"{_num(tps / 1e6)} M" if tps >= 1e6 else f"{_num(tps / 1e3)} k" if tps >= 1e3 else _num(tps)
        cells = [med, rate]
    else:
        frac = r["frac_of_copy"]
        cells = [med, _num(r["GBps"]), f"{frac:.1%}" if frac is not None else "-"]
    return cells, Text(f"ok ({r['repeats']} calls)", style="green")


def render(doc: dict, console=None) -> None:
    """The rich table of a bench document (on ``console``, default stdout: whole cells when piped)."""
    from rich.table import Table
    from rich.text import Text

    if console is None:
        from linattn.apps.cli import stdout_console

        console = stdout_console()
    cb = doc["copy_bandwidth"]
    console.print(Text.assemble(("bench ", "bold"), doc["op"], ("   model ", "bold"), doc["model"],
                                ("   device ", "bold"), f"{doc['device']['name']} ({doc['device']['type']})",
                                ("   copy ", "bold"), f"{_num(cb['GBps'])} GB/s", ("   timing ", "bold"),
                                f"{doc['timing']}, median of <= {doc['repeats']}",
                                ("   fla ", "bold"), str(doc["fla"] or "-")))
    prefill = OP_TABLE[doc["op"]].phase == "prefill"
    t = Table(title=f"{doc['op']}: backends side by side (* = the dispatcher's default)", title_justify="left")
    for c in ("shape", "backend", "median", "tokens/s" if prefill else "GB/s", "" if prefill else "% copy", "status"):
        if c:
            right = c in ("median", "GB/s", "% copy", "tokens/s")
            t.add_column(c, overflow="fold", justify="right" if right else "left")
    for r in doc["rows"]:
        name = ("* " if r["default"] else "") + r["backend"]
        cells, status = _row_cells(r, prefill)
        t.add_row(r["label"], Text(name, style="bold" if r["default"] else ""), *cells, status)
    console.print(t)


# -- the command -----------------------------------------------------------------------------------

def bench(
    op: Optional[str] = op_argument(BENCH_OPS),
    model: Optional[str] = typer.Option(None, "--model", help="A model preset (default by op family: qwen3-next for "
                                                              "GDN, kimi-linear for KDA, deepseek-v4 for the clamp)."),
    batch: Optional[list[int]] = count_option(None, "--batch", "--seqs", metavar="N",
                                              help="Sequences N: decode rows, prefill sequences; clamp rows M. Repeat "
                                                   "for several shapes."),
    tokens: Optional[list[int]] = count_option(None, "--tokens", metavar="L",
                                               help="Prefill only: tokens per sequence L, paired with --batch (alone: "
                                                    "N = 65,536 / L on CUDA). Decode is timed at one token per row."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="Backends to time (repeat); default: every "
                                                                        "backend the dispatcher accepts here, plus "
                                                                        "flash-linear-attention on CUDA."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEV", help=DEVICE_HELP + " Default: cuda if "
                                                                                           "visible, else cpu."),
    repeats: Optional[int] = count_option(None, "--repeats", help="Timed calls per row, median reported "
                                                                  "(default 25 on CUDA, 5 on the CPU)."),
    json_: bool = JSON_OPT,
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON document to this file."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the plot here (needs matplotlib; a PNG, or the "
                                                             "format of the suffix: .pdf, .svg, ...): decode and clamp "
                                                             "GB/s over N with the copy ceiling, prefill Mtok/s per "
                                                             "shape, each against FLA when it ran."),
    from_: Optional[Path] = typer.Option(None, "--from", help="Plot this results JSON instead of measuring (a "
                                                              "--out file, or benchmarks/results/*.json, old or "
                                                              "common schema); needs --plot."),
    warmup: Optional[int] = count_option(None, "--warmup", hidden=True, minimum=0, help="Warm-up calls per row."),
    shape: Optional[str] = typer.Option(None, "--shape", hidden=True, help="Override H,HV,K,V (or D for the clamp)."),
    copy_mib: Optional[int] = count_option(None, "--copy-mib", hidden=True, maximum=SIZE_MAX >> 20,
                                           help="MiB of the copy measurement."),
    seed: int = typer.Option(0, "--seed", hidden=True, help="Input seed."),
    op_opt: Optional[str] = op_option(),
    profile: Optional[str] = hidden_profile_option(),
) -> None:
    """Time every eligible backend of OP at a model preset's shapes, against the copy bandwidth (and FLA on CUDA).

    Decode and clamp report effective GB/s (bytes the op must move / median time) and the fraction
    of the device's copy bandwidth measured in the same run; prefill reports tokens/s. A forced
    backend that is not eligible is a row with its rejection reason. With --from, nothing is
    measured: OP's rows of that results file are plotted. Runs on --device. Exit 2 on a bad
    argument.
    """
    from linattn.apps.bench_plot import PlotError, check_plot_format, png_path

    op = one_op(op, op_opt)
    no_profile(profile, "bench")
    measuring = {"--batch": batch, "--tokens": tokens, "--backend": backend, "--device": device,
                 "--repeats": repeats, "--out": out}
    try:
        outputs = [("--out", out)] + ([("--plot", plot), ("--plot", png_path(plot))] if plot is not None else [])
        for option, path in outputs:  # a directory (given, or as the PNG's name) or an unwritable path
            if path is not None:
                check_writable(path, option)  # before minutes of measuring, not after
        if plot is not None:
            check_plot_format(plot)  # matplotlib there, and a format it writes: before minutes of measuring
        if from_ is not None:
            return _plot_results(op, from_, plot, [k for k, v in measuring.items() if v], json_)
        doc = run_bench(op, model=model, batch=batch, tokens=tokens, backends=backend, device=device,
                        repeats=repeats, warmup=warmup, shape=shape,
                        copy_bytes=copy_mib << 20 if copy_mib else None, seed=seed)
        _write_outputs(doc, out, plot, json_)
    except (BenchUsageError, PlotError) as e:
        _fail_usage(e, json_)


def check_writable(path: Path, option: str) -> None:
    """Refuse an output path that cannot be written, before anything is measured.

    ``path`` must not be a directory, and its folder must exist (and take the file: probed by
    opening it for appending; a file made by the probe is removed) or be creatable under the
    nearest existing folder (probed by making a temporary folder there and removing it; the
    folder itself is created when writing). Permission bits are not trusted (root passes
    ``os.access`` on folders such as /proc that take no new entry): the probes are real.

    Raises:
        BenchUsageError: naming ``option``, the path and why, and what to give instead.
    """
    if path.is_dir():
        raise BenchUsageError(f"{option} {path} is a directory; give a file path, e.g. {path / 'bench'}"
                              f"{'.png' if option == '--plot' else '.json'}")
    folder = path.parent
    nearest = next(p for p in (folder, *folder.parents) if p.exists())
    if not nearest.is_dir():
        raise BenchUsageError(f"{option} {path}: {nearest} is a file, not a folder; give a path in a writable folder")
    if nearest != folder:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".linattn-probe-", dir=nearest))
        except OSError as e:
            raise BenchUsageError(f"{option} {path}: folder {folder} cannot be created in {nearest} ({e.strerror or e}); "
                                  "give a path in a writable folder") from None
        return
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise BenchUsageError(f"{option} {path} cannot be written ({e.strerror or e}); give a path in a writable "
                              "folder") from None
    if not existed:
        path.unlink(missing_ok=True)  # another process may have removed the probe file already


def _fail_usage(err: Exception, json_: bool) -> None:
    fail(err, json_, 2)


def _write_outputs(doc: dict, out: Optional[Path], plot: Optional[Path], json_: bool) -> None:
    """The JSON file, the PNG, and the document on stdout (JSON or the table)."""
    from linattn.apps.bench_plot import plot_data, render_png

    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, default=str))
    if plot is not None:
        plot = render_png(plot_data(doc), plot)
    if json_:
        echo(json.dumps(doc, indent=2, default=str))
        return
    render(doc)
    if out is not None or plot is not None:
        echo("wrote " + ", ".join(str(x) for x in (out, plot) if x is not None))


def _plot_results(op: str, results: Path, plot: Optional[Path], measuring: list[str], json_: bool) -> None:
    """``--from``: plot ``op``'s rows of an existing results file; nothing is measured."""
    from linattn.apps.bench_plot import load_plot_data, render_png

    if op not in BENCH_OPS:
        raise BenchUsageError(f"unknown op {op!r} for bench; ops: {', '.join(BENCH_OPS)}")
    if plot is None:
        raise BenchUsageError("--from plots an existing results file: give --plot PATH for the plot")
    if measuring:
        raise BenchUsageError(f"--from plots an existing results file without measuring; {', '.join(measuring)} "
                              f"{'does' if len(measuring) == 1 else 'do'} not apply to it")
    data = load_plot_data(results, op)
    plot = render_png(data, plot)
    if json_:
        echo(json.dumps({"plot": str(plot), "source": str(results), **data.model_dump(mode="json")}, indent=2))
    else:
        echo(f"wrote {plot} ({op} from {results}: {', '.join(data.series)})")
