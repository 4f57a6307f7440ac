"""CPU prefill benchmark: the example plugin ``cpu-chunked`` against ``torch-ref``.

Both run through the public ops (``linattn.gdn_prefill`` / ``linattn.kda_prefill``) with the
backend forced, so validation and dispatch are included, on the same inputs: 4 sequences x 2,048
tokens in one varlen call, bf16 q/k/v, fp32 gates and an fp32 state pool in pool mode (what an
engine's prefill passes). Shapes: GDN at Qwen3-Next (H=16, HV=32, K=V=128), KDA at Kimi-Linear
(H=HV=32, K=V=128). Each repeat runs both backends back to back (alternating which goes first, on
fresh pool copies), so load from other processes hits both alike; the JSON keeps every time, the
medians and their ratio. It also records the dispatcher's own choice for the problem and the
relative difference between the two outputs and final states (a sanity check; the conformance
suite is the accuracy test).

Writes the ``benchmarks/_results.py`` schema, one row per (op, tokens per sequence), to
``benchmarks/results/cpu_chunked.json`` (``--out``; ``-`` prints it instead). Several lengths
(``--tokens 64,128,256,512,2048``) show where the plugin starts to pay (docs/performance.md).

Usage:
    python benchmarks/cpu_chunked.py [--repeats 5] [--threads N] [--ops gdn,kda] [--tokens 2048]
           [--label "which machine"]

Needs the example installed: ``pip install -e examples/linattn-cpu-chunked``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import linattn
from linattn.dispatch import find_op

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import RESULTS, make_results, write_results  # noqa: E402

SHAPES = {"gdn": dict(model="qwen3-next", H=16, HV=32, K=128, V=128),
          "kda": dict(model="kimi-linear", H=32, HV=32, K=128, V=128)}
BACKENDS = ("cpu-chunked", "torch-ref")


def make_inputs(family: str, n_seq: int, seq_len: int, seed: int = 0) -> dict:
    s = SHAPES[family]
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, K, V = n_seq * seq_len, s["H"], s["HV"], s["K"], s["V"]
    q = torch.randn(T, H, K, generator=gen).to(torch.bfloat16)
    k = torch.randn(T, H, K, generator=gen).to(torch.bfloat16)
    v = torch.randn(T, HV, V, generator=gen).to(torch.bfloat16)
    # gates from the gating op, with Qwen3-Next / Kimi-like parameter scales
    A_log = torch.rand(HV, generator=gen) * 2.0 - 1.0
    if family == "gdn":
        g, beta = linattn.gdn_gating(A_log, torch.randn(T, HV, generator=gen).to(torch.bfloat16),
                                     torch.randn(T, HV, generator=gen).to(torch.bfloat16), torch.zeros(HV))
    else:
        g, beta = linattn.kda_gating(A_log, torch.randn(T, HV, K, generator=gen).to(torch.bfloat16),
                                     torch.randn(T, HV, generator=gen).to(torch.bfloat16), torch.zeros(HV, K),
                                     lower_bound=-5.0)
    cu = torch.arange(n_seq + 1, dtype=torch.int32) * seq_len
    pool = torch.randn(2 * n_seq, HV, V, K, generator=gen) * 0.1
    slots = torch.randperm(2 * n_seq, generator=gen)[:n_seq].to(torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, pool=pool, slots=slots)


def run_once(family: str, backend: str, x: dict):
    fn = linattn.gdn_prefill if family == "gdn" else linattn.kda_prefill
    pool = x["pool"].clone()
    t0 = time.perf_counter()
    o = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], state_pool=pool, state_indices=x["slots"],
           backend=backend)
    return time.perf_counter() - t0, o, pool


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def bench(family: str, n_seq: int, seq_len: int, repeats: int) -> dict:
    x = make_inputs(family, n_seq, seq_len)
    times = {b: [] for b in BACKENDS}
    outs = {}
    for b in BACKENDS:  # warm-up (first-call costs: imports, allocator), also the outputs compared
        _, o, pool = run_once(family, b, x)
        outs[b] = (o, pool[x["slots"].long()])
    for r in range(repeats):
        order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
        for b in order:
            times[b].append(run_once(family, b, x)[0])
        print(f"  {family} repeat {r + 1}/{repeats}: " + ", ".join(f"{b} {times[b][-1]:.3f}s" for b in BACKENDS),
              file=sys.stderr, flush=True)
    med = {b: statistics.median(t) for b, t in times.items()}
    s = SHAPES[family]
    op = find_op(family, "prefill")
    problem = linattn.Problem(op=op, n=n_seq, t=n_seq * seq_len, h=s["H"], hv=s["HV"], k=s["K"],
                              v=s["V"], dtype="bfloat16", state_dtype="float32", mode="pool")
    return {
        "op": op, "model": s["model"], "sequences": n_seq, "tokens_per_sequence": seq_len,
        "shape": {k: s[k] for k in ("H", "HV", "K", "V")}, "dtype": "bfloat16", "state": "float32 pool",
        "seconds": {b: [round(t, 4) for t in ts] for b, ts in times.items()},
        "median_seconds": {b: round(m, 4) for b, m in med.items()},
        "tokens_per_second": {b: round(n_seq * seq_len / m, 1) for b, m in med.items()},
        "speedup_vs_torch_ref": round(med["torch-ref"] / med["cpu-chunked"], 3),
        "dispatcher_choice": linattn.explain(problem, torch.device("cpu")).chosen,
        "rel_diff_output": _rel(outs["cpu-chunked"][0], outs["torch-ref"][0]),
        "rel_diff_state": _rel(outs["cpu-chunked"][1], outs["torch-ref"][1]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--ops", default="gdn,kda")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--tokens", default="2048", help="tokens per sequence (a comma list: one row each)")
    ap.add_argument("--out", default=str(RESULTS / "cpu_chunked.json"), help="results file ('-': print it)")
    ap.add_argument("--label", default="", help="a note stored with the run (e.g. which machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if "cpu-chunked" not in linattn.list_backends():
        sys.exit("cpu-chunked is not installed: pip install -e examples/linattn-cpu-chunked")
    lengths = [int(t) for t in args.tokens.split(",")]
    results = [bench(f, args.sequences, t, args.repeats) for f in args.ops.split(",") for t in lengths]
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    notes = ["The example plugin cpu-chunked against torch-ref through the public ops (validation and dispatch "
             f"included), {args.sequences} sequences of {args.tokens} tokens (one row per length) in one varlen "
             "call, bf16 q/k/v, fp32 pool; each repeat runs both back to back, alternating which goes first; "
             "seconds = every repeat.",
             f"machine: {args.label or '(no --label)'}; load average at the end {load}."]
    if args.out == "-":
        print(json.dumps(make_results(results, notes).model_dump(), indent=1))
    else:
        write_results(args.out, results, notes)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
