"""The host path of a decode or prefill call on the CPU, with the kernel launches stubbed: a micro-benchmark.

What ``benchmarks/host_overhead.py`` measures on the GPU, minus the GPU: a public call
(``linattn.gdn_decode`` / ``kda_decode`` / ``gdn_prefill`` / ``kda_prefill``) with
``backend="triton-split"`` forced goes through the dispatcher's fast path, the backend's prepared
launch (decode's ``DecodeLaunch``; the prefill's planned ``run_prefill``) and the direct launches of
``kernels/triton/launch.py`` as on the H200, except that the compiled kernels' ``run`` does nothing
(CPU tensors; the Triton interpreter is set only to make the backend eligible on the CPU, which
also makes the prefill's intermediate buffers fp32 instead of bf16: same count, same launches).
With ``validate=True`` the value checks take the path they take on CUDA: one stubbed kernel
launch and one read of its flags where ``kernels/triton/value_checks.py`` has the op's kernel
(decode; prefill where ``prefill_value_flags_kernel`` exists), else the torch rules as CPU torch ops
(``HOST_BENCH_FUSED=0``: the torch rules everywhere). So a row's time is the
Python host cost of linattn's own code plus the torch ops the call runs. Each row also lists the
Triton launches of one call and its top-level ``aten::`` ops (``torch.profiler``): on a GPU every
one of those is a launch or a copy, except ``aten::empty`` and ``aten::new_empty`` (allocations). ``prepared_stubbed``
rows time the prefill's prepared launch alone (``CallPlan.prepared``, no dispatcher), the share
``host_overhead.py``'s ``prepared_launch`` rows measure on the GPU.

Prefill: one sequence of 64 tokens, pool mode (as ``host_overhead.py``). ``stream_stubbed`` rows
(issue 28): GDN call streams as an engine makes them (``_streams.py``): the same T / N every call,
a new T / N every call, and a served trace of mixed prefill and decode; ``vs_same`` is a new-length
stream's cost over the same-length one's; their times are the process's CPU time (one torch thread).

Not a timed test: absolute numbers depend on the machine and its load (the fastest of several
loops is reported); compare rows of one run.

    .venv/bin/python benchmarks/host_overhead_cpu.py                 # writes results/host_dispatch_cpu.json
    .venv/bin/python benchmarks/host_overhead_cpu.py --streams-only  # issue 28's stream rows only, printed
    .venv/bin/python benchmarks/host_overhead_cpu.py --streams-only --out /tmp/run1.json   # ... to a file
    .venv/bin/python benchmarks/host_overhead_cpu.py --merge-into results/host_dispatch_cpu.json \
        --from-runs /tmp/run*.json [--as-kind stream_stubbed_before]  # the fastest of those runs, merged in
    .venv/bin/python benchmarks/host_overhead_cpu.py --profile gdn   # a cProfile of 20,000 decode calls instead
    .venv/bin/python benchmarks/host_overhead_cpu.py --profile gdn_prefill   # ... of prefill calls
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import sys
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton backends are eligible on the CPU only so

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import results_path, write_results  # noqa: E402

import linattn  # noqa: E402
from linattn.kernels.triton import chunk_intra, chunk_output, chunk_state  # noqa: E402
from linattn.kernels.triton import chunk_tables as tables_mod  # noqa: E402
from linattn.kernels.triton import decode as decode_mod  # noqa: E402
from linattn.kernels.triton import launch as launch_mod  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
BACKEND = "triton-split"
#: the decode value checks as one kernel (as on CUDA); False: the torch rules (as before the fused kernel)
FUSED = os.environ.get("HOST_BENCH_FUSED", "1") != "0"
PREFILL_T = 64
#: the prefill's kernels, by the module whose globals its launchers read them from
PREFILL_KERNELS = ((chunk_intra, ("chunk_intra_kernel", "chunk_kda_system_kernel")),
                   (chunk_state, ("chunk_gdn_gates_kernel", "chunk_state_kernel", "chunk_segment_combine_kernel")),
                   (chunk_output, ("chunk_output_kernel", "chunk_output_grouped_kernel")),
                   (tables_mod, ("chunk_tables_kernel", "segment_tables_kernel")))


class _StubCompiled:
    """Stands in for a ``triton.compiler.CompiledKernel``: ``run`` counts and returns (the value-check
    kernel's stand-in writes "every check passed" into its flags, without a torch op)."""

    function, packed_metadata = 0, None

    def __init__(self, name: str, flags_at: Optional[int] = None):
        self.name, self.flags_at, self.runs = name, flags_at, 0

    def run(self, *args):
        self.runs += 1
        if self.flags_at is not None:
            flags = args[9 + self.flags_at]
            ctypes.memset(flags.data_ptr(), 0, flags.numel() * flags.element_size())


class _StubKernel:
    """Stands in for a ``@triton.jit`` kernel: its parameters, no launch."""

    pre_run_hooks: list = []

    def __init__(self, real, flags_at: Optional[int] = None):
        from triton.runtime.jit import JITFunction

        fn = getattr(real, "fn", real)
        self.params = JITFunction(fn).params
        self.compiled = _StubCompiled(fn.__name__, flags_at)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.compiled


@contextlib.contextmanager
def stubbed_launch():
    """The fast launch path taken as on CUDA, with kernels whose launch does nothing; the decode
    value checks as one kernel launch (as on CUDA). Yields the stub kernels: decode's first, the
    value checks' second, then the prefill's (:data:`PREFILL_KERNELS`)."""
    from linattn.dispatch.rules import value_rules
    from linattn.kernels.triton import value_checks

    targets = [(decode_mod, "_recurrent_decode_kernel", None), (value_checks, "decode_value_flags_kernel", 6)]
    if hasattr(value_checks, "prefill_value_flags_kernel"):  # the prefill value checks as one kernel
        targets.append((value_checks, "prefill_value_flags_kernel", 3))
    targets += [(mod, name, None) for mod, names in PREFILL_KERNELS for name in names]
    kernels = [(mod, name, getattr(mod, name)) for mod, name, _ in targets]
    saved = (launch_mod.fast_launch_status, launch_mod._current_device, value_rules.FUSED_VALUE_CHECKS,
             getattr(torch._C, "_cuda_getCurrentRawStream", None))
    stubs = [_StubKernel(real, flags_at) for (_, _, real), (_, _, flags_at) in zip(kernels, targets)]
    for (mod, name, _), stub in zip(kernels, stubs):
        setattr(mod, name, stub)
    launch_mod.fast_launch_status = lambda: (True, "stubbed (benchmarks/host_overhead_cpu.py)")
    launch_mod._current_device = lambda: 0
    value_rules.FUSED_VALUE_CHECKS = FUSED
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    linattn.dispatch.clear_cache()
    try:
        yield stubs
    finally:
        for mod, name, real in kernels:
            setattr(mod, name, real)
        launch_mod.fast_launch_status, launch_mod._current_device, value_rules.FUSED_VALUE_CHECKS = saved[:3]
        if saved[3] is None:
            del torch._C._cuda_getCurrentRawStream
        else:
            torch._C._cuda_getCurrentRawStream = saved[3]
        linattn.dispatch.clear_cache()


def decode_inputs(family: str, n: int = 1) -> dict:
    g = torch.Generator().manual_seed(0)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dtype)

    kda = family == "kda"
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V),
                a=r(n, 1, HV, K) if kda else r(n, 1, HV), b=r(n, 1, HV),
                A_log=r(HV, dtype=torch.float32), dt_bias=r(HV, K, dtype=torch.float32) if kda else r(HV, dtype=torch.float32),
                state_pool=torch.zeros(8, HV, V, K), state_indices=torch.arange(n, dtype=torch.int32))


def prefill_inputs(family: str, t: int = PREFILL_T) -> dict:
    """One sequence of ``t`` tokens in pool mode (slot 1 of 4), as ``host_overhead.py``'s."""
    g = torch.Generator().manual_seed(1)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dtype)

    gate = -torch.rand(t, HV, K, generator=g) * 0.1 if family == "kda" else -torch.rand(t, HV, generator=g) * 0.1
    return dict(q=r(t, H, K), k=r(t, H, K), v=r(t, HV, V), g=gate, beta=torch.rand(t, HV, generator=g),
                cu_seqlens=torch.tensor([0, t], dtype=torch.int32),
                state_pool=torch.zeros(4, HV, V, K), state_indices=torch.tensor([1], dtype=torch.int32))


#: per op: its inputs, and the kernels one call must launch directly
OPS = {
    "gdn_decode": (decode_inputs, {"_recurrent_decode_kernel": 1}),
    "kda_decode": (decode_inputs, {"_recurrent_decode_kernel": 1}),
    "gdn_prefill": (prefill_inputs, {"chunk_tables_kernel": 1, "chunk_intra_kernel": 1, "chunk_gdn_gates_kernel": 1,
                                     "chunk_state_kernel": 1, "chunk_output_grouped_kernel": 1}),
    "kda_prefill": (prefill_inputs, {"chunk_tables_kernel": 1, "chunk_kda_system_kernel": 1, "chunk_intra_kernel": 1,
                                     "chunk_state_kernel": 1}),
}


def per_call_us(fn, calls: int, repeats: int) -> float:
    """The fastest of ``repeats`` loops: wall clock per call (after a warm-up)."""
    for _ in range(50):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return min(samples)  # the least disturbed loop: the machine's other load only adds


def torch_ops(fn) -> list[str]:
    """The top-level ``aten::`` ops one call runs (each is a kernel launch on a GPU, a copy to the
    host included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if not any(p.name.startswith("aten::") for p in _parents(e))]
    return [e.name for e in top]


def _parents(e):
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


def _op_row(op_name: str, validate: bool, stubs, calls: int, repeats: int) -> dict:
    """One public call's row: time per call, its direct launches and its top-level torch ops."""
    make, want = OPS[op_name]
    op, x = getattr(linattn, op_name), make(op_name.split("_")[0])

    def call():
        return op(**x, validate=validate, backend=BACKEND)
    call()
    call()
    before = [s.compiled.runs for s in stubs]
    ops = torch_ops(call)
    launches = {s.compiled.name: s.compiled.runs - b for s, b in zip(stubs, before) if s.compiled.runs > b}
    checks = {n for n in launches if n.endswith("_value_flags_kernel")}
    assert {n: c for n, c in launches.items() if n not in checks} == want, f"{op_name}: not every launch was direct: {launches}"
    us = per_call_us(call, calls, repeats)
    return dict(kind="linattn_stubbed", op=op_name, validate=validate, fused_checks=FUSED, host_us=round(us, 2),
                triton_launches=launches, torch_ops=len(ops), ops=ops, backend=linattn.last_decision(op_name).chosen)


def _prepared_row(op_name: str, calls: int, repeats: int) -> dict:
    """The backend's prepared launch of a cached call alone (no dispatcher): ``host_overhead.py``'s
    ``prepared_launch`` rows on the GPU."""
    from linattn.dispatch.runtime import fast_path

    make, _ = OPS[op_name]
    x = make(op_name.split("_")[0])
    args = dict(x, backend=BACKEND, validate=False)
    getattr(linattn, op_name)(**args)
    plan = [p for k, p in fast_path._plans.items() if k[0] == op_name][-1]
    nargs = fast_path.prepare_hit(plan, x)
    assert plan.prepared is not None, f"{op_name}: the backend prepared no launch"
    us = per_call_us(lambda: plan.prepared(nargs), calls, repeats)
    ops = torch_ops(lambda: plan.prepared(nargs))
    return dict(kind="prepared_stubbed", op=op_name, host_us=round(us, 2), torch_ops=len(ops), ops=ops,
                what="the backend's prepared launch called directly (no dispatcher)")


def _timed_pass(calls: list, validate: bool) -> tuple[float, dict]:
    """One pass over ``calls`` ((phase, args) pairs, ``_streams``): us per call, overall and per phase,
    of this process's CPU time (``time.process_time``: on a shared machine the wall clock of a pass
    of misses varies by 2x with the other load; nothing here waits on a device)."""
    ops = {"prefill": linattn.gdn_prefill, "decode": linattn.gdn_decode}
    per = {"prefill": [0, 0], "decode": [0, 0]}
    clock = time.process_time_ns
    t_all = clock()
    for phase, x in calls:
        t0 = clock()
        ops[phase](**x, validate=validate, backend=BACKEND)
        acc = per[phase]
        acc[0] += clock() - t0
        acc[1] += 1
    total = (clock() - t_all) / len(calls) / 1e3
    return total, {p: round(a[0] / a[1] / 1e3, 2) for p, a in per.items() if a[1]}


def _new_t_unfrozen(inputs, calls: int, repeats: int) -> dict:
    """The new-T stream (validate off) without ``gc.freeze()``: every miss keeps new container objects
    (its call plan, the prefill plan, the decision's copy), so the cyclic collector's full passes
    come often and walk the whole heap (torch, triton, the benchmark's inputs)."""
    from _streams import stream

    best = None
    for _ in range(repeats):
        passes = stream("new_t", inputs, calls)
        _timed_pass(passes, False)
        linattn.dispatch.clear_cache()
        us, _ = _timed_pass(passes, False)
        best = us if best is None else min(best, us)
    return dict(kind="stream_stubbed", stream="new_t_heap_not_frozen", op="gdn_prefill", validate=False, calls=calls,
                host_us=round(best, 2), gc_frozen=False)


def stream_rows(calls: int, repeats: int, steps: int) -> list[dict]:
    """Issue 28's rows: GDN prefill with the same T every call against a new T every call, decode
    with the same N against a new N, and a served engine trace (``_streams.py``), validate off and
    on. Each pass runs once to warm up, then ``linattn.dispatch.clear_cache()`` forgets every call
    plan and decision and the pass is timed (as ``host_overhead.py``, where the warm pass compiles
    the kernels). The fastest of the repeats is reported. The heap is frozen (``gc.freeze()``)
    first, as engines do after warm-up; ``new_t_heap_not_frozen`` is the new-T stream without."""
    from _streams import StreamInputs, engine_calls, prefill_shapes, stream

    out = []
    inputs = StreamInputs("gdn", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # process time of one thread: the host path is single-threaded
    with torch.inference_mode(), stubbed_launch():
        unfrozen = _new_t_unfrozen(inputs, calls, repeats)
        gc.collect()
        gc.freeze()  # as an engine does after warm-up (vLLM): the collector skips the startup heap
        for validate in (False, True):
            for kind in ("same_t", "new_t", "same_n", "new_n"):
                linattn.dispatch.clear_cache()
                best = None
                for _ in range(repeats):
                    passes = stream(kind, inputs, calls)
                    _timed_pass(passes, validate)  # warm, as host_overhead.py's (which compiles there) ...
                    linattn.dispatch.clear_cache()  # ... then every plan and decision forgotten
                    us, _ = _timed_pass(passes, validate)
                    best = us if best is None else min(best, us)
                out.append(dict(kind="stream_stubbed", stream=kind, op="gdn_prefill" if kind.endswith("_t")
                                else "gdn_decode", validate=validate, calls=calls, host_us=round(best, 2),
                                gc_frozen=True))
            trace = engine_calls(inputs, steps, seed=0)
            _timed_pass(trace, validate)
            linattn.dispatch.clear_cache()
            us, per = _timed_pass(trace, validate)
            out.append(dict(kind="stream_stubbed", stream="engine", op="gdn_prefill+gdn_decode", validate=validate,
                            calls=len(trace), steps=steps, host_us=round(us, 2), per_phase_us=per,
                            phase_calls={p: sum(1 for c in trace if c[0] == p) for p in ("prefill", "decode")},
                            **prefill_shapes(trace), gc_frozen=True))
    gc.unfreeze()
    torch.set_num_threads(threads)
    out.append(unfrozen)
    _vs_same(out)
    return out


def rows(calls: int, repeats: int) -> list[dict]:
    out = []
    with torch.inference_mode(), stubbed_launch() as stubs:
        for op_name in OPS:
            for validate in (False, True):
                out.append(_op_row(op_name, validate, stubs, calls, repeats))
        for op_name in ("gdn_prefill", "kda_prefill"):
            out.append(_prepared_row(op_name, calls, repeats))
        stub_call = stubs[0].compiled.run
        out.append(dict(kind="floor_stubbed", op="decode", what="the stubbed CompiledKernel.run alone",
                        host_us=round(per_call_us(lambda: stub_call(1, 1, 1, 0, 0, None, None, None, None), calls,
                                                  repeats), 3)))
    return out


def profile_calls(op_name: str, validate: bool, calls: int) -> None:
    import cProfile
    import pstats

    with torch.inference_mode(), stubbed_launch():
        make, _ = OPS[op_name]
        op, x = getattr(linattn, op_name), make(op_name.split("_")[0])
        for _ in range(10):
            op(**x, validate=validate, backend=BACKEND)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(calls):
            op(**x, validate=validate, backend=BACKEND)
        pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)


def _vs_same(rows: list[dict]) -> None:
    """Each new-length row's ``vs_same``: its time over the same-length row's of its validate setting."""
    for r in rows:
        if r["stream"].startswith("new"):
            same = next((x for x in rows if x["stream"] == "same" + r["stream"][3:5] and x["validate"] == r["validate"]),
                        None)
            if same is not None:
                r["vs_same"] = round(r["host_us"] / same["host_us"], 2)


def fastest_rows(paths: list[str]) -> tuple[list[dict], str]:
    """The fastest of each stream row (by stream and validate) over the results files ``paths``
    (``--streams-only --out`` runs of one tree, e.g. alternated with another tree's in one session),
    ``vs_same`` taken again from those, with ``runs`` (how many files) and ``median_us`` (the median
    of the runs' ``host_us``); and the files' commit."""
    from _results import read_results

    import statistics

    best: dict = {}
    every: dict = {}
    commits = set()
    for path in paths:
        doc = read_results(path)
        commits.add(doc.commit)
        for r in doc.rows:
            k = (r["stream"], r["validate"])
            every.setdefault(k, []).append(r["host_us"])
            if k not in best or r["host_us"] < best[k]["host_us"]:
                best[k] = dict(r)
    rows = list(best.values())
    _vs_same(rows)
    for r in rows:
        r["runs"] = len(paths)
        r["median_us"] = round(statistics.median(every[(r["stream"], r["validate"])]), 2)  # of the runs' rows
    return rows, "+".join(sorted(commits))


def merge_stream_rows(into: str, rows: list[dict], kind: str, commit: str, note: str) -> None:
    """Rewrite the results file ``into`` with its rows of kind ``kind`` replaced by ``rows`` (given
    that kind and ``commit``), its other rows and notes kept (each row keeps its commit), plus ``note``
    (replacing a note about the same rows: the same text up to ' (' or ':')."""
    from _results import read_results

    old = read_results(into)
    kept = [dict(r, commit=r.get("commit", old.commit)) for r in old.rows if r.get("kind") != kind]
    new = [dict(r, kind=kind, commit=commit) for r in rows]
    def head(n: str) -> str:  # what a note is about: its text up to ' (' or ':'
        return n.split(":")[0].split(" (")[0]
    notes = [n for n in old.notes if not n.startswith("written ") and not (note and head(n) == head(note))]
    notes += [note] if note else []
    write_results(into, kept + new, notes, command=old.command)  # the notes say how each kind of row was made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", choices=("gdn", "kda", *OPS), default=None,
                    help="print a cProfile instead (gdn, kda: the decode ops)")
    ap.add_argument("--validate", action="store_true", help="with --profile: validate=True")
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/host_dispatch_cpu.json)")
    ap.add_argument("--stream-calls", type=int, default=300, help="calls per same/new stream pass (issue 28)")
    ap.add_argument("--steps", type=int, default=300, help="steps of the engine trace")
    ap.add_argument("--streams-only", action="store_true", help="only the stream rows (printed; no results file "
                    "unless --out)")
    ap.add_argument("--merge-into", default=None, metavar="JSON",
                    help="with --streams-only: replace JSON's rows of kind --as-kind by the stream rows (this run's, "
                         "or with --from-runs the fastest of those files'), in place; its other rows kept")
    ap.add_argument("--as-kind", default="stream_stubbed", help="with --merge-into: the rows' kind "
                    "(e.g. stream_stubbed_before for another tree's runs)")
    ap.add_argument("--from-runs", nargs="+", default=None, metavar="JSON",
                    help="with --merge-into: run nothing; the fastest of each row over these --streams-only --out files")
    ap.add_argument("--note", default="", help="with --merge-into: a note added to the file (how the rows were made)")
    args = ap.parse_args(argv)
    if args.merge_into and args.from_runs:
        got, commit = fastest_rows(args.from_runs)
        merge_stream_rows(args.merge_into, got, args.as_kind, commit, args.note)
        return 0
    if args.streams_only:
        got = stream_rows(args.stream_calls, 3, args.steps)
        for r in got:
            print(r)
        if args.out:
            write_results(args.out, got, ["stream rows only (--streams-only)"])
        if args.merge_into:
            from _results import current_commit

            merge_stream_rows(args.merge_into, got, args.as_kind, current_commit(), args.note)
        return 0
    if args.profile:
        op_name = args.profile if "_" in args.profile else f"{args.profile}_decode"
        profile_calls(op_name, args.validate, 20000 if op_name.endswith("decode") else 5000)
        return 0
    got = rows(args.calls, args.repeats) + stream_rows(args.stream_calls, 3, args.steps)
    for r in got:
        print({k: v for k, v in r.items() if k != "ops"})
    notes = [f"Qwen3-Next heads H={H}, HV={HV}, K=V={K}; decode N=1 T=1; prefill one sequence of T={PREFILL_T} tokens "
             f"in pool mode; bf16 q/k/v, fp32 pool; CPU tensors; "
             f"backend={BACKEND} forced; the compiled kernels' run stubbed to a no-op; wall clock per call over "
             f"{args.calls} calls, fastest of {args.repeats} loops, after a warm-up.",
             "triton_launches: the stubbed Triton launches of one call; torch_ops / ops: its top-level aten ops "
             "(torch.profiler); on a GPU each is a launch or a device-to-host copy, except aten::empty and aten::new_empty.",
             f"fused_checks={FUSED}: the value checks as one kernel where value_checks.py has the op's kernel "
             "(triton_launches names it; HOST_BENCH_FUSED=0: the torch rules).",
             "ops of a prefill call in pool mode include the public op's zero-size placeholder for the final state "
             "(aten::new_empty, linattn/ops.py).",
             "prepared_stubbed: the prefill's prepared launch (the backend's plan of the cached call) called directly, "
             "without the dispatcher; under the interpreter setting its intermediate buffers are fp32 (bf16 on the GPU)."]
    write_results(args.out or results_path("host_dispatch", tag="cpu"), got, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
