"""Host time per call: linattn (validate on and off), FLA, and bare launches of the same kernels.

Tiny problems (Qwen3-Next heads: H = 16, HV = 32, K = V = 128; decode N = 1; prefill one
sequence of T = 64 tokens), so the GPU work per call is a few microseconds and the wall clock of
a loop of eager calls is the host's cost. Per variant: ``--calls`` eager calls after a warm-up,
the host wall clock divided by the calls (no sync inside the loop), the median of ``--repeats``
loops. The floor is the bare launches of the same compiled kernels: the launches one linattn call
made, recorded (``kernels/triton/launch.py`` ``direct_launch_log``) and replayed through the
compiled kernels' launchers with the arguments already built.

Also checked in the same run: fast and ordinary launches (``LINATTN_FAST_LAUNCH=0``) give
bitwise equal outputs and pools, for both families, decode and prefill.

    python benchmarks/host_overhead.py                 # on a CUDA device; writes host_overhead_<dev>.json
    python benchmarks/host_overhead.py --device cpu    # the CPU: dispatch cost of the torch-ref path only
    python benchmarks/host_overhead.py --profile gdn_decode   # a cProfile of eager calls instead
    python benchmarks/host_overhead.py --streams-only  # issue 28's stream rows: host_overhead_streams_<dev>.json
    # ... the stream rows put into the committed file (a 16th results file is not allowed):
    LINATTN_RESULTS_DIR=$OUT python benchmarks/host_overhead.py --streams-only \
        --merge-into benchmarks/results/host_overhead_h200.json    # writes $OUT/host_overhead_h200.json
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import invoked_command, results_path, write_results  # noqa: E402

import linattn  # noqa: E402
from linattn.kernels.triton import launch as launch_mod  # noqa: E402

H, HV, K, V = 16, 32, 128, 128


def host_us(fn, calls: int, repeats: int, sync, hold=None, held=None) -> float:
    """Median over ``repeats`` of the host wall clock per call of ``calls`` calls (no sync inside).

    ``hold``: called (untimed) before each timed loop to keep the device busy for longer than the loop
    (e.g. ``torch.cuda._sleep``), so that no call waits for the GPU's launch queue to drain: the pure
    host cost where the device is slower than the host (without it a device-bound call's figure
    includes the wait). ``held``: called right after each timed loop, True while the device is still
    busy with the hold (else RuntimeError: the hold was too short for the loop)."""
    for _ in range(20):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        if hold is not None:
            hold()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        if held is not None and not held():
            raise RuntimeError("host_us: the device finished its hold before the timed loop did: hold it longer")
        sync()
    return statistics.median(samples)


def decode_inputs(family: str, dev: str, n: int = 1) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dev, dtype)

    kda = family == "kda"
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V),
                a=r(n, 1, HV, K) if kda else r(n, 1, HV), b=r(n, 1, HV),
                A_log=r(HV, dtype=torch.float32), dt_bias=r(HV, K, dtype=torch.float32) if kda else r(HV, dtype=torch.float32),
                state_pool=torch.zeros(8, HV, V, K, device=dev), state_indices=torch.arange(n, dtype=torch.int32, device=dev))


def prefill_inputs(family: str, dev: str, t: int = 64) -> dict:
    g = torch.Generator(device="cpu").manual_seed(1)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dev, dtype)

    kda = family == "kda"
    gate = -torch.rand(t, HV, K, generator=g) * 0.1 if kda else -torch.rand(t, HV, generator=g) * 0.1
    return dict(q=r(t, H, K), k=r(t, H, K), v=r(t, HV, V), g=gate.to(dev), beta=torch.rand(t, HV, generator=g).to(dev),
                cu_seqlens=torch.tensor([0, t], dtype=torch.int32, device=dev),
                state_pool=torch.zeros(4, HV, V, K, device=dev), state_indices=torch.tensor([1], dtype=torch.int32, device=dev))


def _op(family: str, phase: str):
    return getattr(linattn, f"{family}_{phase}")


class value_rules_as:
    """Context manager: validate=True's device value rules as the torch rules (``"torch"``) or as
    the one fused kernel (``"fused"``, ``dispatch/rules/value_rules.py``); cached call plans are dropped
    on entry and exit, since a plan holds its checks."""

    def __init__(self, how: str):
        self.how = how

    def __enter__(self):
        from linattn.dispatch.runtime import fast_path
        from linattn.dispatch.rules import value_rules

        self._old = value_rules.FUSED_VALUE_CHECKS
        value_rules.FUSED_VALUE_CHECKS = self.how == "fused"
        fast_path.clear()

    def __exit__(self, *exc):
        from linattn.dispatch.runtime import fast_path
        from linattn.dispatch.rules import value_rules

        value_rules.FUSED_VALUE_CHECKS = self._old
        fast_path.clear()
        return False


#: (validate, how the value rules run) per measured variant
VARIANTS = ((False, "torch"), (True, "torch"), (True, "fused"))


def variants(dev: str) -> tuple:
    """:data:`VARIANTS` that run on ``dev`` (the fused value checks are a CUDA kernel)."""
    return VARIANTS if dev.startswith("cuda") else tuple(v for v in VARIANTS if v[1] != "fused")


def linattn_rows(dev: str, calls: int, repeats: int, sync) -> list[dict]:
    rows = []
    with torch.inference_mode():
        for phase, make in (("decode", decode_inputs), ("prefill", prefill_inputs)):
            for family in ("gdn", "kda"):
                x, op = make(family, dev), _op(family, phase)
                for validate, how in variants(dev):
                    with value_rules_as(how):
                        us = host_us(lambda: op(**x, validate=validate), calls, repeats, sync)
                    d = linattn.last_decision(f"{family}_{phase}")
                    rows.append(dict(kind="linattn", op=f"{family}_{phase}", validate=validate,
                                     value_checks=how if validate else None, host_us=round(us, 2),
                                     backend=d.chosen if d else None))
    return rows


def stream_rows(dev: str, calls: int, steps: int, sync) -> list[dict]:
    """Issue 28: call streams as an engine makes them (``_streams.py``), GDN at Qwen3-Next heads.
    ``same_t`` / ``new_t``: prefill of 4 packed sequences, T = 200 every call or a new T every call
    (same mean); ``same_n`` / ``new_n``: decode of N = 150 rows or a new N every call (1, 2, ...); ``engine``: a
    served trace of mixed prefill and decode (300 steps, seed 0). Validate off, on with the torch
    rules and on with the fused checks. Per stream: a pass that compiles what the lengths need, then
    ``linattn.dispatch.clear_cache()`` (every call plan and decision forgotten) and the timed pass
    over the same calls, sync after the loop; ``host_us`` is the wall
    clock per call, so for the engine trace it includes GPU time where the GPU is the bottleneck
    (``gpu_busy_us``: the same trace's kernel time per call from torch.profiler, so
    ``1 - gpu_busy_us / host_us`` is the GPU-idle share). The heap is frozen first (``gc.freeze()``,
    as engines do after warm-up; without it the collector's full passes add hundreds of us per new
    length on the CPU: docs/performance.md)."""
    from _streams import StreamInputs, engine_calls, prefill_shapes, stream

    ops = {"prefill": linattn.gdn_prefill, "decode": linattn.gdn_decode}
    inputs = StreamInputs("gdn", dev)
    out = []

    def timed(seq, validate):
        per = {"prefill": [0.0, 0], "decode": [0.0, 0]}
        sync()
        t_all = time.perf_counter()
        for phase, x in seq:
            t0 = time.perf_counter()
            ops[phase](**x, validate=validate)
            per[phase][0] += time.perf_counter() - t0
            per[phase][1] += 1
        sync()
        total = (time.perf_counter() - t_all) / len(seq) * 1e6
        return total, {p: round(a[0] / a[1] * 1e6, 2) for p, a in per.items() if a[1]}

    gc.collect()
    gc.freeze()  # as an engine does after warm-up (vLLM): the collector skips the startup heap
    with torch.inference_mode():
        for validate, how in variants(dev):
            with value_rules_as(how):
                for kind in ("same_t", "new_t", "same_n", "new_n"):
                    seq = stream(kind, inputs, calls)
                    timed(seq, validate)  # compiles every kernel the lengths need (decode's tile follows N)
                    linattn.dispatch.clear_cache()  # ... and forgets every plan and decision: all new again
                    us, _ = timed(seq, validate)
                    out.append(dict(kind="stream", stream=kind, op="gdn_prefill" if kind.endswith("_t") else "gdn_decode",
                                    validate=validate, value_checks=how if validate else None, calls=calls,
                                    host_us=round(us, 2)))
                trace = engine_calls(inputs, steps, seed=0)
                timed(trace, validate)  # compiles
                linattn.dispatch.clear_cache()
                us, per = timed(trace, validate)
                row = dict(kind="stream", stream="engine", op="gdn_prefill+gdn_decode", validate=validate,
                           value_checks=how if validate else None, calls=len(trace), steps=steps,
                           host_us=round(us, 2), per_phase_us=per,
                           phase_calls={p: sum(1 for c in trace if c[0] == p) for p in ("prefill", "decode")},
                           **prefill_shapes(trace))
                if dev.startswith("cuda"):
                    row["gpu_busy_us"] = round(_gpu_busy_us(lambda: timed(trace, validate)) / len(trace), 2)
                    row["gpu_idle_share"] = round(1 - row["gpu_busy_us"] / row["host_us"], 3)
                out.append(row)
    gc.unfreeze()
    for r in out:
        if r["stream"].startswith("new"):
            same = next(x for x in out if x["stream"] == "same" + r["stream"][3:] and x["validate"] == r["validate"]
                        and x["value_checks"] == r["value_checks"])
            r["vs_same"] = round(r["host_us"] / same["host_us"], 2)
    return out


def _gpu_busy_us(fn) -> float:
    """The summed device time (us) of the kernels and copies ``fn`` runs (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
        return sum(getattr(e, "device_time", 0.0) for e in prof.events() if e.device_type.name == "CUDA")
    except Exception as e:  # noqa: BLE001 - a profiler problem must not lose the run's other rows
        print(f"gpu_busy_us not measured: {type(e).__name__}: {e}")
        return float("nan")


def _captured_call_args(call) -> tuple:
    """What a public op hands to the dispatcher (``linattn.ops._call``): op, args, backend, validate, check_finite."""
    import linattn.ops as ops

    seen, real = [], ops._call

    def spy(op, args, *rest):
        seen.append((op, args, *rest))
        return real(op, args, *rest)
    ops._call = spy
    try:
        call()
    finally:
        ops._call = real
    return seen[-1]


def dispatch_rows(dev: str, calls: int, repeats: int, sync) -> list[dict]:
    """The dispatcher's share alone: a cached call plan's key, lookup and checks (no backend run;
    ``validate=True``: the value checks and their sync included)."""
    from linattn.dispatch.runtime import fast_path

    rows = []
    with torch.inference_mode():
        for phase, make in (("decode", decode_inputs), ("prefill", prefill_inputs)):
            for family in ("gdn", "kda"):
                name, x = f"{family}_{phase}", make(family, dev)
                for validate, how in variants(dev):
                    with value_rules_as(how):
                        call = _captured_call_args(lambda: _op(family, phase)(**x, validate=validate))

                        def hit(call=call):
                            plan = fast_path.lookup(fast_path.call_key(*call))
                            return fast_path.prepare_hit(plan, call[1])
                        rows.append(dict(kind="dispatch", op=name, validate=validate,
                                         value_checks=how if validate else None,
                                         host_us=round(host_us(hit, calls, repeats, sync), 2)))
                        if not validate:
                            rows += _prepared_rows(name, call, calls, repeats, sync)
    return rows


def _prepared_rows(name: str, call: tuple, calls: int, repeats: int, sync) -> list[dict]:
    """The backend's prepared launch of the cached plan of ``call``, called directly."""
    from linattn.dispatch.runtime import fast_path

    plan = fast_path.lookup(fast_path.call_key(*call))
    if plan is None or plan.prepared is None:
        return []
    nargs = fast_path.prepare_hit(plan, call[1])
    us = host_us(lambda: plan.prepared(nargs), calls, repeats, sync)
    return [dict(kind="prepared_launch", op=name, host_us=round(us, 2),
                 what="the backend's prepared launch called directly (no dispatcher)")]


def device_work_rows(dev: str, sync) -> list[dict]:
    """What one eager decode call puts on the device (kernels and copies, ``torch.profiler``), after
    warm-up: the decode kernel, and with ``validate=True`` the value checks and their copy."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    rows = []
    with torch.inference_mode():
        for family in ("gdn", "kda"):
            x, op = decode_inputs(family, dev), _op(family, "decode")
            for validate, how in variants(dev):
                row = dict(kind="device_work", op=f"{family}_decode", validate=validate,
                           value_checks=how if validate else None)
                with value_rules_as(how):
                    for _ in range(3):
                        op(**x, validate=validate)
                    sync()
                    try:
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            op(**x, validate=validate)
                            sync()
                        names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
                    except Exception as e:  # noqa: BLE001 - the other rows still get written
                        rows.append(dict(row, launches=None, why=f"torch.profiler failed: {type(e).__name__}: {e}"))
                        continue
                rows.append(dict(row, launches=len(names), names=names))
    return rows


def floor_rows(dev: str, calls: int, repeats: int, sync) -> list[dict]:
    """Bare launches: replay the compiled-kernel launches one call made, arguments prebuilt."""
    rows = []
    with torch.inference_mode():
        for phase, make in (("decode", decode_inputs), ("prefill", prefill_inputs)):
            for family in ("gdn", "kda"):
                x, op = make(family, dev), _op(family, phase)
                for _ in range(3):
                    op(**x, validate=False)  # known keys: the next call launches directly
                launch_mod.direct_launch_log = log = []
                op(**x, validate=False)
                launch_mod.direct_launch_log = None
                if not log:
                    rows.append(dict(kind="floor", op=f"{family}_{phase}", host_us=None,
                                     why="no direct launches recorded (fast path off?)"))
                    continue

                def replay(log=log):
                    for ck, (g0, g1, g2), device, full in log:
                        ck.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), ck.function,
                               ck.packed_metadata, None, None, None, *full)
                us = host_us(replay, calls, repeats, sync)
                rows.append(dict(kind="floor", op=f"{family}_{phase}", launches=len(log), host_us=round(us, 2),
                                 kernels=[ck.name for ck, *_ in log]))
    return rows


def fla_rows(dev: str, calls: int, repeats: int, sync) -> list[dict]:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
    except ImportError as e:
        return [dict(kind="fla", op=None, host_us=None, why=f"fla not importable: {e}")]
    rows = []
    with torch.inference_mode():
        for family, rec, chunk in (("gdn", fused_recurrent_gated_delta_rule, chunk_gated_delta_rule),
                                   ("kda", fused_recurrent_kda, chunk_kda)):
            gk = (1, 1, HV, K) if family == "kda" else (1, 1, HV)
            for phase, t, fn in (("decode", 1, rec), ("prefill", 64, chunk)):
                q = torch.randn(1, t, H, K, device=dev, dtype=torch.bfloat16)
                k = torch.randn(1, t, H, K, device=dev, dtype=torch.bfloat16)
                v = torch.randn(1, t, HV, V, device=dev, dtype=torch.bfloat16)
                g = -torch.rand(gk[0], t, *gk[2:], device=dev) * 0.1
                beta = torch.rand(1, t, HV, device=dev)
                h0 = torch.zeros(1, HV, K, V, device=dev)
                kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
                us = host_us(lambda: fn(q, k, v, g, beta, **kw), calls, repeats, sync)
                rows.append(dict(kind="fla", op=f"{family}_{phase}", host_us=round(us, 2), function=fn.__name__))
    return rows


def _snapshot(out) -> list:
    return [t.clone() for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]


def bitwise_rows(dev: str) -> list[dict]:
    """Fast and ordinary launches (``LINATTN_FAST_LAUNCH=0``) on the same inputs: bitwise equal?"""
    rows = []
    with torch.inference_mode():
        for phase, make in (("decode", decode_inputs), ("prefill", prefill_inputs)):
            for family in ("gdn", "kda"):
                results = {}
                for mode in ("fast", "ordinary"):
                    os.environ["LINATTN_FAST_LAUNCH"] = "1" if mode == "fast" else "0"
                    launch_mod.reset_fast_launch()
                    x = make(family, dev)
                    x["state_pool"].normal_(generator=torch.Generator(device=dev).manual_seed(5))
                    op = _op(family, phase)
                    for _ in range(3):
                        pool = x["state_pool"]
                        x["state_pool"] = pool.clone()
                        out = op(**x, validate=False)  # the third call is a direct launch when fast
                    results[mode] = (_snapshot(out), x["state_pool"].clone())
                os.environ.pop("LINATTN_FAST_LAUNCH")
                launch_mod.reset_fast_launch()
                (fo, fp), (oo, op_) = results["fast"], results["ordinary"]
                rows.append(dict(kind="fast_vs_ordinary", op=f"{family}_{phase}",
                                 bitwise_equal=all(torch.equal(a, b) for a, b in zip(fo, oo)) and torch.equal(fp, op_)))
    return rows


def profile_op(name: str, dev: str, sync, calls: int = 5000) -> int:
    """Print a cProfile of ``calls`` eager calls of the public op ``name`` (validate off)."""
    import cProfile
    import pstats

    family, phase = name.split("_")
    x, op = (decode_inputs if phase == "decode" else prefill_inputs)(family, dev), _op(family, phase)
    with torch.inference_mode():
        host_us(lambda: op(**x, validate=False), 200, 1, sync)  # warm: compiled, plan cached
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            op(**x, validate=False)
        prof.disable()
        sync()
    pstats.Stats(prof).sort_stats("tottime").print_stats(35)
    return 0


def _merge_streams(into: str, rows: list[dict], out) -> int:
    """``into``'s rows without its stream rows (each kept row marked with ``into``'s commit), then
    this run's ``rows`` (the fast-launch row and the stream rows, marked with this run's commit),
    written with ``into``'s notes and one saying which rows came from which run."""
    from _results import current_commit, read_results

    old = read_results(into)
    kept = [dict(r, commit=r.get("commit", old.commit)) for r in old.rows
            if r.get("kind") not in ("stream", "fast_launch_streams")]
    here = current_commit()
    new = [dict(r, kind="fast_launch_streams" if r.get("kind") == "fast_launch" else r["kind"], commit=here)
           for r in rows]
    notes = [n for n in old.notes if not n.startswith("written ")] + [
        f"stream rows (kind stream) from `{invoked_command()}` at {here}; the other rows from `{old.command}` "
        f"at {old.commit} (each row's commit field says which)."]
    write_results(out or results_path("host_overhead"), kept + new, notes)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/host_overhead_<dev>.json)")
    ap.add_argument("--stream-calls", type=int, default=300, help="calls per same/new stream pass (issue 28)")
    ap.add_argument("--steps", type=int, default=300, help="steps of the engine trace (issue 28)")
    ap.add_argument("--streams-only", action="store_true", help="only the stream rows (issue 28)")
    ap.add_argument("--merge-into", default=None, metavar="JSON",
                    help="with --streams-only: write the rows of this results file (e.g. "
                         "benchmarks/results/host_overhead_h200.json) with its stream rows replaced by this run's, "
                         "to results_path('host_overhead') (LINATTN_RESULTS_DIR)")
    ap.add_argument("--profile", metavar="OP", help="instead: a cProfile of 5,000 eager calls of OP (e.g. gdn_decode, "
                                                    "validate off), the top functions by own time, to stdout")
    args = ap.parse_args(argv)
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    if args.profile:
        return profile_op(args.profile, dev, sync)
    rows = [dict(kind="fast_launch", enabled=launch_mod.fast_launch_status()[0], why=launch_mod.fast_launch_status()[1])]
    if args.streams_only:
        rows += stream_rows(dev, args.stream_calls, args.steps, sync)
        for r in rows:
            print(r)
        if args.merge_into:
            return _merge_streams(args.merge_into, rows, args.out)
        write_results(args.out or results_path("host_overhead_streams"), rows,
                      ["issue 28 stream rows (benchmarks/_streams.py): GDN, Qwen3-Next heads; host_us is wall clock "
                       "per call with a sync after each pass; vs_same = new_* / same_*; engine: gpu_busy_us from "
                       "torch.profiler over the same trace."])
        return 0
    rows += linattn_rows(dev, args.calls, args.repeats, sync)
    rows += dispatch_rows(dev, args.calls, args.repeats, sync)
    if dev.startswith("cuda"):
        rows += floor_rows(dev, args.calls, args.repeats, sync)
        rows += device_work_rows(dev, sync)
        rows += fla_rows(dev, args.calls, args.repeats, sync)
        rows += bitwise_rows(dev)
    for r in rows:
        print({k: v for k, v in r.items() if k not in ("kernels", "names")})
    notes = [f"Qwen3-Next heads H={H}, HV={HV}, K=V={K}; decode N=1 T=1, prefill one sequence T=64; bf16 q/k/v, "
             f"fp32 pool; host wall clock per eager call over {args.calls} calls, median of {args.repeats} loops, "
             "after a warm-up; " + ("GPU work per call is a few microseconds, so this is the host's cost." if
                                    dev.startswith("cuda") else "on the CPU the call's compute (torch-ref) is included."),
             "floor: the compiled-kernel launches of one linattn call replayed with prebuilt arguments.",
             "dispatch: a cached plan's key, lookup and checks alone (validate=True: the value checks and their sync); "
             "device_work: the kernels and copies one eager decode call puts on the device (torch.profiler).",
             "fla: fla-core's functions with a dense initial state [1, HV, K, V] and output_final_state=True."]
    write_results(args.out or results_path("host_overhead"), rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
