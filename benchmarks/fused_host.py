"""Host cost of the fused GDN prefill per prep and walk (GPU): is a small prefill bound by its launches?

For each shape (default 8 x 1,024 and 16 x 4,096 at Qwen3-Next TP1 heads, (16, 32), K = V = 128, bf16
q/k/v, fp32 "vk" pool) and each (prep, walk) of ``LINATTN_CUTEDSL_PREP`` x ``LINATTN_CUTEDSL_WALK`` in
(unset: the planner's, ``0``: Triton's), three ways in:

- ``planned``: :func:`linattn.kernels.triton.prefill.run_prefill` on a plan made once;
- ``chunk_prefill``: the kernel-level entry, planned per call (as ``benchmarks/prefill_long.py`` times it);
- ``public``: :func:`linattn.gdn_prefill` (``validate=False``, ``backend="triton-split"``; the dispatcher's
  cached plans).

Per way: ``device_ms`` (``triton.testing.do_bench`` median: the GPU-bound time where the host keeps up)
and ``host_us`` (wall clock per call of 100 eager calls without a sync, the median of 5 loops, each
behind a sleep kernel that holds the GPU: what the host spends to enqueue one call, never waiting for
the GPU). Where ``host_us`` / 1e3 is near ``device_ms`` the call is host-bound. ``--profile`` adds the
top of a cProfile of 200 ``chunk_prefill`` calls of the first shape at the planner's choice. Writes ``$LINATTN_RESULTS_DIR/fused_host_<device>.json``, else
``/tmp/fused_host_<device>.json`` (an experiment: its numbers go to docs/performance.md, the file is not
committed; ``benchmarks/results/`` holds at most 15 files).

    python benchmarks/fused_host.py [--shapes 8x1024@16/32,16x4096@16/32] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import device_tag, results_path, write_results  # noqa: E402
from fused_walk import make, parse  # noqa: E402  (the same inputs as the walk's benchmark)
from host_overhead import host_us as _host_us  # noqa: E402

K = V = 128
SWITCHES = ("LINATTN_CUTEDSL_PREP", "LINATTN_CUTEDSL_WALK")


def host_us(fn) -> float:
    """Microseconds of host wall clock per eager call of ``fn``: 100 calls without a sync, the median of 5
    such loops (``benchmarks/host_overhead.py``'s timer), each loop started behind a 0.2 s
    ``torch.cuda._sleep`` on the stream, so that no call waits for the GPU (100 calls of a few launches
    stay within the launch queue): the host's cost even where the call is device-bound."""
    return _host_us(fn, 100, 5, torch.cuda.synchronize, hold=lambda: torch.cuda._sleep(HOLD_CYCLES),
                    held=lambda: not torch.cuda.current_stream().query())


HOLD_CYCLES = 400_000_000  # about 0.2 s at the H200's ~1.98 GHz SM clock: longer than 100 calls of host time


@contextlib.contextmanager
def switches(prep: str, walk: str):
    """The two switches set inside the block ("": the planner's choice, as unset); the dispatcher's plans
    dropped on entry, so that the public op plans again under them."""
    from linattn.dispatch.runtime.selection import dispatcher

    with mock.patch.dict(os.environ, dict(zip(SWITCHES, (prep, walk)))):
        dispatcher().clear()
        yield


def ways(d, pool, idx):
    """``(plan, {way: call})``: the planned call, ``chunk_prefill`` and the public op on the same data."""
    import linattn
    from linattn.kernels.triton import prefill as pm

    kw = dict(state_pool=pool, state_indices=idx)
    plan = pm.plan_prefill("gdn", q=d["q"], v=d["v"], cu_seqlens=d["cu_seqlens"], **kw)
    return plan, {
        "planned": lambda: pm.run_prefill(plan, **d, scale=K ** -0.5, **kw),
        "chunk_prefill": lambda: pm.chunk_prefill("gdn", **d, **kw, initial_state=None, scale=K ** -0.5,
                                                  use_qk_l2norm=True, state_layout="vk"),
        "public": lambda: linattn.gdn_prefill(**d, **kw, validate=False, backend="triton-split"),
    }


def run_shape(N, L, H, HV) -> list[dict]:
    """One row per (prep, walk) switch pair at one shape: device ms and host us of each way."""
    from triton.testing import do_bench

    d, pool, idx = make(N, L, H, HV)
    rows = []
    for prep in ("", "0"):
        for walk in ("", "0"):
            with switches(prep, walk):
                plan, fns = ways(d, pool, idx)
                row = dict(shape=f"{N}x{L}", heads=f"({H}, {HV})", prep_switch=prep or "unset",
                           walk_switch=walk or "unset", fused=plan.fused is not None,
                           prep="cutedsl" if plan.fused_prep else "triton",
                           walk=None if plan.fused_walk is None else plan.fused_walk.walk)
                for name, fn in fns.items():
                    row[f"{name}_device_ms"] = float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
                    row[f"{name}_host_us"] = host_us(fn)
                print(row, flush=True)
                rows.append(row)
    return rows


def profile_top(N, L, H, HV, lines=25) -> str:
    """The top ``lines`` (cumulative) of a cProfile of 200 ``chunk_prefill`` calls at the planner's choice."""
    d, pool, idx = make(N, L, H, HV)
    with switches("", ""):
        fn = ways(d, pool, idx)[1]["chunk_prefill"]
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(lines)
    return s.getvalue()


def main():
    """Parse the arguments, measure every shape, write the results file after each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8x1024@16/32,16x4096@16/32")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    rows, notes = [], ["host_us: wall clock per eager call (100 calls behind a sleep kernel, no sync; median of 5); "
                       "device_ms: do_bench median"]
    shapes = parse(a.shapes)
    out = results_path("fused_host") if os.environ.get("LINATTN_RESULTS_DIR") else f"/tmp/fused_host_{device_tag()}.json"
    for shp in shapes:
        rows += run_shape(*shp)
        write_results(out, rows, notes=notes)
    if a.profile:
        text = profile_top(*shapes[0])
        print(text)
        notes.append("cProfile (cumulative) of 200 chunk_prefill calls at the first shape:\n" + text)
        write_results(out, rows, notes=notes)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
