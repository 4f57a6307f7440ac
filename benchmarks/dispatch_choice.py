"""The dispatcher's choice against the fastest eligible backend, per benchmark shape (issue 29's target).

For each shape (decode N = 1, 8, 64, 256, 1,024, 4,096 tokens of one step; the prefill shapes of
``benchmarks/prefill.py``, 16x4096 / 64x1024 / 256x256, and long single prompts of
``benchmarks/prefill_long.py``, 1x8192 / 1x32768 / 1x65536; GDN at Qwen3-Next's heads, KDA at
Kimi-Linear's, ``linattn tune``'s family presets) it:

a. asks :func:`linattn.explain` for the dispatcher's choice and its eligible (accepted) backends,
   under the policy and tuned table in force (``tuned`` column: the table's origin, or ``static``);
b. times every eligible backend forced through the public op (``backend=NAME``), with
   ``linattn tune``'s own measuring code (:func:`linattn.tune.inputs`, :func:`linattn.tune.time_call`:
   a warm-up call, then the median of one-by-one calls, CUDA events after a device sync, so the host
   cost of a call is inside its time);
c. times the dispatcher's own choice through the public op, unforced, in alternation with the
   fastest backend forced (one call of each per round, medians: ``choice_ms``, ``fastest_ms``), so
   the ratio of the two is not a comparison of two moments of the machine;
d. for a peer backend (``fla``, ``flashinfer``: registered with ``LINATTN_PEERS=all`` where
   installed), also the library function called directly: the library calls linattn made in one
   forced call are recorded (their arguments already translated) and replayed alone
   (``direct_ms``); ``host_cost_us`` = (forced through linattn - direct) in microseconds: validation
   when on, selection, the translation and, for FLA (no state pool), the gather and scatter of the
   pool rows around its kernel, device time included.

Row (``kind: dispatch_choice``): ``shape``, ``op``, ``family``, ``n``, ``tokens``, ``choice``,
``call_choice`` (what the unforced call ran, from :func:`linattn.last_decision`), ``fastest``,
``eligible``, ``backends_ms`` (step b), ``failed``, ``choice_ms``, ``fastest_ms``, ``ratio`` =
``choice_ms / fastest_ms``, ``within_3pct`` (``ratio <= 1.03``), ``host_cost_us`` per peer (None
where no peer was eligible), ``direct_ms``. One ``kind: dispatch_choice_summary`` row: how many shapes meet the
target. Inputs: bf16 q/k/v, fp32 pool ``[2N, HV, V, K]`` in pool mode, distinct slots, as ``linattn
tune`` times them; ``validate=False`` unless ``--validate`` (the ratio then compares two validated calls).

Writes one ``benchmarks/_results.py`` file to ``--out`` (default ``$LINATTN_RESULTS_DIR`` or
``/tmp``, ``dispatch_choice_<device>.json``): not into ``benchmarks/results/`` (full at 15 files).
Its rows are meant to join ``benchmarks/results/e2e_h200.json`` (the dispatcher through the public
op: ``demo`` and ``explain`` rows) as ``kind: dispatch_choice`` / ``dispatch_choice_summary`` rows.

    .venv/bin/python benchmarks/dispatch_choice.py --device cpu --quick        # seconds, CPU backends
    python benchmarks/dispatch_choice.py --device cuda --shapes gdn_decode:1,gdn_prefill:16x4096

On the H200: ``benchmarks/dispatch_choice_device.sh`` (installs fla from ``.whl`` and FlashInfer
from ``.flashinfer`` as ``benchmarks/peers_device.sh`` does, sets ``LINATTN_PEERS=all``,
``FLA_DISABLE_BACKEND_DISPATCH=1``, runs this script into ``$OUT``). Device calls:
    fla only:          carry [".whl"]                 command: bash benchmarks/dispatch_choice_device.sh
    fla + FlashInfer:  the CuTe DSL calls of peers_device.sh's header first (carry [".cute_a"], then
                       [".cute_b"]), then carry [".flashinfer", ".whl"], the same command.
Rows are written after every shape; shapes not started in time are named in the summary row's
``not_started``: a second call with ``--shapes`` naming them (arguments pass through the wrapper).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import device_tag, write_results  # noqa: E402

import linattn  # noqa: E402
from linattn import tune as measuring  # noqa: E402
from linattn.apps import tune  # noqa: E402

#: the target: the choice within 3% of the fastest eligible backend
TARGET = 1.03
#: shapes in ``linattn tune --buckets`` syntax, per family (op prefix); decode N, prefill NxL
DECODE_N = (1, 8, 64, 256, 1024, 4096)
PREFILL = ("16x4096", "64x1024", "256x256")  # benchmarks/prefill.py SHAPES
PREFILL_LONG = ("1x8192", "1x32768", "1x65536")  # benchmarks/prefill_long.py, one long prompt
QUICK = {"cuda": ("decode:1", "decode:256", "decode:4096", "prefill:16x4096", "prefill:1x65536"),
         "cpu": ("decode:1", "decode:8", "prefill:2x64")}
#: the CPU's default head shape (H, HV, K, V): the presets' 128-wide heads make torch-ref's prefill
#: take seconds per call on a 2-core machine
CPU_SHAPE = (2, 4, 16, 16)
#: peer backend -> the name, in its module, of the function that hands it the library's function
LIBRARY_GETTER = {"fla": "fla_function", "flashinfer": "flashinfer_function"}


def default_shapes(device_type: str, quick: bool) -> str:
    """The shapes of both families, as ``linattn tune --buckets`` items."""
    if quick:
        sizes = QUICK["cuda" if device_type == "cuda" else "cpu"]
    else:
        sizes = tuple(f"decode:{n}" for n in DECODE_N) + tuple(f"prefill:{s}" for s in PREFILL + PREFILL_LONG)
    return ",".join(f"{fam}_{s}" for fam in ("gdn", "kda") for s in sizes)


# -- the ratio ----------------------------------------------------------------------------------------

def judge(choice: Optional[str], backends_ms: dict[str, float], choice_ms: Optional[float],
          fastest_ms: Optional[float], target: float = TARGET) -> dict:
    """The verdict of one shape: the fastest backend of step b, ``ratio = choice_ms / fastest_ms``
    (step c's paired medians) and whether it is within ``target``; None fields where nothing ran."""
    fastest = min(backends_ms, key=backends_ms.get) if backends_ms else None
    ratio = choice_ms / fastest_ms if choice_ms is not None and fastest_ms else None
    return {"choice": choice, "fastest": fastest, "choice_is_fastest": choice is not None and choice == fastest,
            "choice_ms": choice_ms, "fastest_ms": fastest_ms, "ratio": ratio,
            "within_3pct": None if ratio is None else ratio <= target}


def summary(rows: list[dict], target: float = TARGET, not_started: tuple = ()) -> dict:
    """How many measured shapes meet the target; the shapes that do not, that ran no backend, that
    were ``not_started`` (the time cap)."""
    judged = [r for r in rows if r.get("within_3pct") is not None]
    return {"kind": "dispatch_choice_summary", "target_ratio": target, "shapes": len(rows), "measured": len(judged),
            "within_3pct": sum(bool(r["within_3pct"]) for r in judged),
            "missed": [f"{r['shape']}: {r['choice']} {r['ratio']:.3f}x {r['fastest']}" for r in judged
                       if not r["within_3pct"]],
            "not_measured": [r["shape"] for r in rows if r.get("within_3pct") is None],
            "not_started": list(not_started)}


# -- timing -------------------------------------------------------------------------------------------

def paired_ms(a: Callable[[], object], b: Callable[[], object], device: torch.device,
              repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``a`` and of ``b``, timed one call of each per round (each warmed up
    once), with the one-call timer ``linattn tune`` uses (:class:`linattn.measure.Timer`, no L2 flush)."""
    from linattn.measure import Timer

    once = Timer(device, flush=False).once
    a(), b()
    ta, tb = [], []
    for _ in range(max(repeats, 1)):
        ta.append(once(a))
        tb.append(once(b))
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def library_module(backend: str):
    """The module of registered peer ``backend`` (where its :data:`LIBRARY_GETTER` function lives)."""
    return importlib.import_module(type(linattn.list_backends()[backend]).__module__)


@contextmanager
def recording(module, getter_name: str, calls: list):
    """Within the block, every function ``module.<getter_name>(...)`` hands out (the library
    function a peer backend calls) records each call ``(fn, args, kwargs)`` into ``calls`` before
    running it."""
    getter = getattr(module, getter_name)

    def recorded_getter(*a, **k):
        fn = getter(*a, **k)

        def rec(*args, **kwargs):
            calls.append((fn, args, kwargs))
            return fn(*args, **kwargs)
        return rec

    with mock.patch.object(module, getter_name, recorded_getter):
        yield


def replay(calls: list) -> Callable[[], None]:
    """One call that runs the recorded library calls again, as they were made."""
    def run():
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    return run


def direct_ms(backend: str, forced: Callable[[], object], device: torch.device, repeats: int) -> Optional[float]:
    """Milliseconds of the library calls ``backend`` made in one ``forced`` call, replayed alone;
    None when the call reached no library function."""
    calls: list = []
    with recording(library_module(backend), LIBRARY_GETTER[backend], calls):
        forced()
    return measuring.time_call(replay(calls), device, repeats) if calls else None


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


# -- one shape ----------------------------------------------------------------------------------------

def measure(item: str, bucket, device: torch.device, repeats: int, validate: bool) -> dict:
    """The row of one shape (module docstring, steps a to d)."""
    p = bucket.problem()
    d = linattn.explain(p, device)
    eligible = [v.backend for v in sorted((v for v in d.verdicts if v.ok), key=lambda v: (v.rank, v.backend))]
    args = measuring.inputs(p, device)
    op = getattr(linattn, p.op)
    call = functools.partial(op, **args, validate=validate)
    times: dict[str, float] = {}
    failed: dict[str, str] = {}
    direct: dict[str, Optional[float]] = {}
    host: dict[str, Optional[float]] = {}
    with torch.no_grad():
        for b in eligible:  # step b
            forced = functools.partial(call, backend=b)
            try:
                times[b] = measuring.time_call(forced, device, repeats, min(times.values(), default=None))
            except Exception as e:  # noqa: BLE001 - a backend that raises is recorded, not ranked
                failed[b] = _error(e)
                continue
            if b in LIBRARY_GETTER:  # step d
                try:
                    direct[b] = direct_ms(b, forced, device, repeats)
                except Exception as e:  # noqa: BLE001 - the replay's failure is reported, the forced time kept
                    failed[f"{b} direct"] = _error(e)
                    continue
                host[b] = None if direct[b] is None else round((times[b] - direct[b]) * 1e3, 2)
        fastest = min(times, key=times.get) if times else None
        choice_ms = fastest_ms = call_choice = None
        if fastest is not None and d.chosen is not None:  # step c
            choice_ms, fastest_ms = paired_ms(call, functools.partial(call, backend=fastest), device, repeats)
            call()
            last = linattn.last_decision(p.op)
            call_choice = last.chosen if last is not None else None
    tuned = d.tuning.origin if d.tuning is not None and d.tuning.measured else "static"
    return {"kind": "dispatch_choice", "shape": item, "op": p.op, "family": p.family, "n": p.n, "tokens": p.t,
            "heads": f"H{p.h}/HV{p.hv} K{p.k}/V{p.v}", "dtype": f"{p.dtype}/{p.state_dtype}", "tuned": tuned,
            "eligible": eligible, "call_choice": call_choice, "backends_ms": times, "failed": failed,
            **judge(d.chosen, times, choice_ms, fastest_ms), "direct_ms": direct, "host_cost_us": host or None}


# -- the command --------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda when visible)")
    ap.add_argument("--quick", action="store_true", help="a few shapes per family")
    ap.add_argument("--shapes", default=None, help="linattn tune --buckets items, e.g. gdn_decode:1,kda_prefill:16x4096")
    ap.add_argument("--shape", default=None, help="H,HV,K,V for every shape (default: the family presets on CUDA, "
                                                  f"{','.join(map(str, CPU_SHAPE))} on the CPU)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (default: 25 CUDA, 5 CPU)")
    ap.add_argument("--validate", action="store_true", help="every call with validate=True (default False)")
    ap.add_argument("--max-seconds", type=float, default=480.0, help="start no shape after this many seconds")
    ap.add_argument("--out", default=None, help="JSON path (default $LINATTN_RESULTS_DIR or /tmp, "
                                                "dispatch_choice_<device>.json)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = (tuple(int(x) for x in a.shape.split(",")) if a.shape
             else None if dev.type == "cuda" else CPU_SHAPE)
    items = [x.strip() for x in (a.shapes or default_shapes(dev.type, a.quick)).split(",") if x.strip()]
    buckets = [tune.parse_buckets(x, shape, "bfloat16", "float32")[0] for x in items]
    repeats = a.repeats or measuring.REPEATS.get(dev.type, 5)
    tag = "cpu" if dev.type == "cpu" else device_tag()
    out = Path(a.out or Path(os.environ.get("LINATTN_RESULTS_DIR") or "/tmp") / f"dispatch_choice_{tag}.json")
    notes = [f"issue 29's target: the dispatcher's choice within {TARGET:.2f}x of the fastest eligible backend; "
             "benchmarks/dispatch_choice.py's docstring says what each column is",
             f"validate={a.validate}; {repeats} timed calls per measurement; LINATTN_PEERS="
             f"{os.environ.get('LINATTN_PEERS', '')!r}; backends registered: {', '.join(linattn.list_backends())}"]
    rows: list[dict] = []
    left: tuple = ()
    t0 = time.monotonic()
    for item, b in zip(items, buckets):
        if time.monotonic() - t0 > a.max_seconds:
            left = tuple(items[len(rows):])
            notes.append(f"stopped after {a.max_seconds:.0f} s: not started: {', '.join(left)}")
            break
        rows.append(measure(item, b, dev, repeats, a.validate))
        r = rows[-1]
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        print(f"{item}: choice {r['choice']} fastest {r['fastest']} ratio {ratio} "
              f"({', '.join(f'{k} {v:.4g} ms' for k, v in sorted(r['backends_ms'].items(), key=lambda x: x[1]))})"
              + (f" host_cost_us {r['host_cost_us']}" if r["host_cost_us"] else ""), flush=True)
        write_results(out, [*rows, summary(rows)], notes)
    s = summary(rows, not_started=left)
    write_results(out, [*rows, s], notes)
    print(f"{s['within_3pct']} of {s['measured']} measured shapes within {TARGET:.2f}x; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
