"""Benchmark (and GPU self-check) of the CuTe DSL chunked prefill against the Triton prefill.

Prefill in pool mode at Qwen3-Next shapes (GDN: H=16, HV=32, K=V=128) and Kimi-Linear shapes
(KDA: H=32, HV=32, K=V=128), bf16 inputs, fp32 pool, 16x4096, 64x1024 and 256x256 tokens:

- whole prefill: ``cutedsl`` (Triton intra/output stages + the CuTe DSL state kernel) against
  ``triton-split`` (:func:`linattn.kernels.triton.prefill.chunk_prefill`), in Mtok/s;
- the state stage alone: the CuTe DSL kernel (value blocks of 32, 64, 128 columns) against the
  Triton state kernel, in microseconds.

Each timed call writes a scratch pool in place (never a caller's pool). Times are medians of CUDA
event timings after warm-up. ``--checks`` also runs :mod:`linattn.kernels.cutedsl.selfcheck` and
records the results. Writes the ``benchmarks/_results.py`` schema (rows of ``kind`` prefill, state,
check), default ``benchmarks/results/prefill_cutedsl_<device>.json`` (``--out``).

Usage (on the GPU machine)::

    python3 benchmarks/prefill_cutedsl.py --checks
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402

SHAPES = ((16, 4096), (64, 1024), (256, 256))
MODELS = {"gdn": dict(H=16, HV=32, K=128, V=128, model="Qwen3-Next-80B-A3B"),
          "kda": dict(H=32, HV=32, K=128, V=128, model="Kimi-Linear-48B-A3B")}
FLA_MTOKS = {"gdn": {"16x4096": 18.3, "64x1024": 17.6, "256x256": 15.5},
             "kda": {"16x4096": 9.2, "64x1024": 9.1, "256x256": 8.7}}  # issue 4, measured on this H200


def timeit(fn, warmup=3, iters=10) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def bench_prefill(family, n_seq, seqlen):
    from linattn.kernels.cutedsl import selfcheck as sc

    m = MODELS[family]
    lens = [seqlen] * n_seq
    inp = sc.prefill_inputs(family == "kda", lens, m["H"], m["HV"], m["K"], m["V"], seed=11)
    pool = torch.zeros(n_seq + 8, m["HV"], m["V"], m["K"], device="cuda")
    slots = torch.randperm(n_seq + 8, device="cuda")[:n_seq].to(torch.int32)
    T = n_seq * seqlen
    row = {"family": family, "model": m["model"], "shape": f"{n_seq}x{seqlen}", "tokens": T}
    for impl in ("cutedsl", "triton"):
        try:
            ms = timeit(lambda: sc.run_prefill(family, inp, pool=pool, slots=slots, impl=impl))
            row[f"{impl}_ms"] = round(ms, 4)
            row[f"{impl}_mtok_s"] = round(T / ms / 1e3, 2)
        except Exception as e:  # noqa: BLE001 - recorded
            row[f"{impl}_error"] = f"{type(e).__name__}: {e}"[:400]
    if "cutedsl_ms" in row and "triton_ms" in row:
        row["speedup_vs_triton"] = round(row["triton_ms"] / row["cutedsl_ms"], 3)
    row["fla_0.6_mtok_s_issue4"] = FLA_MTOKS[family][row["shape"]]
    return row


def bench_state(family, n_seq, seqlen):
    from linattn.kernels.cutedsl import selfcheck as sc
    from linattn.kernels.cutedsl.chunk_state import cutedsl_chunk_state
    from linattn.kernels.triton.prefill import chunk_tables

    m = MODELS[family]
    kda = family == "kda"
    lens = [seqlen] * n_seq
    inp = sc.state_inputs(kda, lens, m["H"], m["HV"], m["K"], m["V"], seed=12)
    cu = sc._cu(lens, "cuda")
    T = n_seq * seqlen
    pool = torch.zeros(n_seq + 8, m["HV"], m["V"], m["K"], device="cuda")
    slots = torch.randperm(n_seq + 8, device="cuda")[:n_seq].to(torch.int32)
    chunk_off, _, _, nt_max = chunk_tables(cu, T)
    hbuf = torch.empty(nt_max, m["HV"], m["K"], m["V"], dtype=torch.bfloat16, device="cuda")
    vn = torch.empty(T, m["HV"], m["V"], dtype=torch.bfloat16, device="cuda")
    row = {"family": family, "shape": f"{n_seq}x{seqlen}"}
    for bv in (32, 64, 128):
        try:
            ms = timeit(lambda: cutedsl_chunk_state(kda=kda, **inp, cu_seqlens=cu, chunk_off=chunk_off,
                                                    state_indices=slots, h0=pool, ht=pool, hbuf=hbuf, vn=vn,
                                                    state_layout="vk", bv=bv))
            row[f"cutedsl_bv{bv}_us"] = round(ms * 1e3, 1)
        except Exception as e:  # noqa: BLE001 - recorded
            row[f"cutedsl_bv{bv}_error"] = f"{type(e).__name__}: {e}"[:400]
    try:
        ms = timeit(lambda: sc.run_state(kda, inp, cu, pool=pool, slots=slots, impl="triton",
                                         bufs=(chunk_off, hbuf, vn)))
        row["triton_us"] = round(ms * 1e3, 1)
    except Exception as e:  # noqa: BLE001 - recorded
        row["triton_error"] = f"{type(e).__name__}: {e}"[:400]
    # approximate bytes the state stage moves: W, K, U in; hbuf, vn out (bf16); the pool rows in and out
    nbytes = 2 * T * m["HV"] * (2 * m["K"] + 2 * m["V"]) + 2 * (T // 64) * m["HV"] * m["K"] * m["V"] \
        + 2 * 4 * n_seq * m["HV"] * m["K"] * m["V"]
    row["approx_bytes"] = nbytes
    best = min((v for k, v in row.items() if k.startswith("cutedsl_bv") and k.endswith("_us")), default=None)
    if best:
        row["cutedsl_best_gb_s"] = round(nbytes / best / 1e3, 1)
    return row


NOTES = [
    "kind prefill: whole prefill (Triton intra + state + Triton output), pool mode, bf16 q/k/v, fp32 pool; cutedsl = "
    "the CuTe DSL state kernel (value block 64 for GDN, 128 for KDA: block_v), triton = "
    "kernels/triton/prefill.chunk_prefill (the triton-split prefill, its pinned config); fla_0.6_mtok_s_issue4 = FLA "
    "measured in issue 4 (another run).",
    "kind state: the state stage alone, microseconds; cutedsl_bv* are the CuTe kernel at value blocks of 32/64/128.",
    "kind check: linattn.kernels.cutedsl.selfcheck (ok, and what each case measured).",
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/prefill_cutedsl_<device>.json)")
    ap.add_argument("--checks", action="store_true", help="also run the GPU self-checks")
    ap.add_argument("--only", default="", help="comma-separated check names (default: all)")
    ap.add_argument("--impl", default="cutedsl", choices=["cutedsl", "triton"],
                    help="prefill the whole-prefill checks run (triton: to attribute a failure to a stage)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--families", default="gdn,kda")
    args = ap.parse_args(argv)
    import linattn.kernels.cutedsl as cd

    out = args.out or results_path("prefill_cutedsl")
    rows: list[dict] = []
    notes = list(NOTES)
    device = {"arch": cd.device_arch(torch.device("cuda"))}

    def dump():
        write_results(out, rows, notes, device=device)

    checks_ok = True
    if args.checks:
        from linattn.kernels.cutedsl import selfcheck
        from linattn.kernels.cutedsl.selfcheck import run_all

        selfcheck.PIPELINE_IMPL = args.impl
        t = time.time()
        checks = run_all([n for n in args.only.split(",") if n] or None)
        checks_ok = all(c.get("ok") for c in checks.values())
        rows += [dict(kind="check", name=n, impl=args.impl, **c) for n, c in checks.items()]
        notes.append(f"checks ({args.impl} whole prefill): {round(time.time() - t, 1)} s, all ok: {checks_ok}")
        print("checks:", {k: v.get("ok") for k, v in checks.items()}, flush=True)
        dump()
    if not args.no_bench:
        for fam in args.families.split(","):
            for n, L in SHAPES:
                r = bench_prefill(fam, n, L)
                print(r, flush=True)
                rows.append(dict(kind="prefill", **r))
                dump()
            for n, L in SHAPES:
                r = bench_state(fam, n, L)
                print(r, flush=True)
                rows.append(dict(kind="state", **r))
                dump()
    dump()
    return 0 if checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
