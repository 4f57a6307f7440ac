"""Per-call CPU time of one decode step, linattn's layers against transformers' recurrent functions (issue 31).

Thread CPU time (``time.thread_time_ns``, so other jobs on a shared machine cost little), one torch
thread, ``--inner`` back-to-back calls per timing, ``--repeats`` timings per function interleaved
with alternating order; the median per call is printed. Functions, each timed on the same inputs:

* ``ex``: the Qwen3-Next example's shape (``examples/hf_generate.py``'s tiny model: B = 2, H = 1,
  HV = 2, K = V = 64, fp32, gate form; q / k / v strided views of one projection as the layer passes
  them): transformers' ``torch_recurrent_gated_delta_rule`` (``hf``), ``linattn.compat.fla.
  fused_recurrent_gated_delta_rule`` as the transformers integration calls it (``compat``: a copy of
  ``initial_state`` as the pool, final state returned), ``linattn.gdn_decode`` on a pool in place
  (``op``) and the same with ``validate=False`` (``op nv``);
* ``gdn`` / ``kda``: batch 1, GDN H = 4, HV = 8 and KDA H = HV = 8, K = V = 128 (issue 31's decode
  targets): transformers' ``torch_recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention``
  against ``linattn.gdn_decode`` / ``kda_decode`` (validated, and ``validate=False``).

Run from the repository root (needs transformers)::

    PYTHONSAFEPATH=1 taskset -c 0 python benchmarks/cpu_decode_host.py --repeats 21 --inner 100

The script uses public functions only, so the same file times another checkout (run it with that
checkout's interpreter). Prints one line per function; ``ratio`` is transformers' median over the
function's (above 1: faster than transformers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import linattn
import linattn.compat.fla as fla

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_chunked import hf_function  # noqa: E402  transformers' own function (the wrapper's __wrapped__)
from _results import write_results  # noqa: E402


def _example(gen) -> dict:
    B, H, HV, K = 2, 1, 2, 64
    mixed = torch.randn(B, 2 * H * K + HV * K, 1, generator=gen).transpose(1, 2)  # the layer's conv output
    q, k, v = torch.split(mixed, [H * K, H * K, HV * K], dim=-1)
    q, k, v = q.reshape(B, 1, H, K), k.reshape(B, 1, H, K), v.reshape(B, 1, HV, K)
    g, beta = -torch.rand(B, 1, HV, generator=gen) * 0.5, torch.rand(B, 1, HV, generator=gen)
    state = torch.randn(B, HV, K, K, generator=gen) * 0.1
    pool, slots = state.transpose(-1, -2).contiguous(), torch.arange(B)
    hf = hf_function("gdn", "decode")
    return {"ex hf": lambda: hf(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                                use_qk_l2norm_in_kernel=True),
            "ex compat": lambda: fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                                      output_final_state=True,
                                                                      use_qk_l2norm_in_kernel=True),
            "ex op": lambda: linattn.gdn_decode(q, k, v, None, None, None, None, pool, slots, g=g, beta=beta),
            "ex op nv": lambda: linattn.gdn_decode(q, k, v, None, None, None, None, pool, slots, g=g, beta=beta,
                                                   validate=False)}


def _target(family: str, gen) -> dict:
    H, HV, K = (4, 8, 128) if family == "gdn" else (8, 8, 128)
    q, k, v = (torch.randn(1, 1, h, K, generator=gen) for h in (H, H, HV))
    g = -torch.rand(1, 1, HV, *((K,) if family == "kda" else ()), generator=gen) * 0.5
    beta = torch.rand(1, 1, HV, generator=gen)
    state = torch.randn(1, HV, K, K, generator=gen) * 0.1
    pool, slots = state.transpose(-1, -2).contiguous(), torch.arange(1, dtype=torch.int32)
    hf, op = hf_function(family, "decode"), getattr(linattn, f"{family}_decode")
    return {f"{family} hf": lambda: hf(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True),
            f"{family} op": lambda: op(q, k, v, None, None, None, None, pool, slots, g=g, beta=beta),
            f"{family} op nv": lambda: op(q, k, v, None, None, None, None, pool, slots, g=g, beta=beta,
                                          validate=False)}


def interleaved(fns: dict, repeats: int, inner: int) -> dict:
    """Per function, ``repeats`` thread-CPU times per call (us) of ``inner`` calls, alternating order."""
    times = {name: [] for name in fns}
    names = list(fns)
    with torch.no_grad():
        for f in fns.values():  # warm-up: call plans, kept constants
            for _ in range(20):
                f()
        for r in range(repeats):
            for name in (names if r % 2 == 0 else names[::-1]):
                f = fns[name]
                t0 = time.thread_time_ns()
                for _ in range(inner):
                    f()
                times[name].append((time.thread_time_ns() - t0) / inner / 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--inner", type=int, default=100)
    ap.add_argument("--shapes", default="ex,gdn,kda", help="a comma list of ex, gdn, kda")
    ap.add_argument("--out", default=None, help="also write the medians as rows in the results schema to this file "
                    "(benchmarks/_results.py; not a committed results file: the figures are in docs/performance.md)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    fns: dict = {}
    for shape in args.shapes.split(","):
        fns.update(_example(gen) if shape == "ex" else _target(shape, gen))
    med = {n: statistics.median(t) for n, t in interleaved(fns, args.repeats, args.inner).items()}
    rows = []
    for name, us in med.items():
        hf = med[name.split()[0] + " hf"]
        print(f"{name:10s} {us:8.1f} us   ratio {hf / us:5.3f}")
        rows.append(dict(function=name, us_per_call=us, ratio_vs_transformers=hf / us))
    if args.out:
        import subprocess

        src = os.path.dirname(os.path.abspath(linattn.__file__))  # the timed code's checkout, not this file's
        head = subprocess.run(["git", "-C", src, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
        write_results(args.out, rows, [f"linattn from {src}", f"thread CPU time per call, 1 thread, medians of {args.repeats} interleaved "
                                       f"timings of {args.inner} calls; ratio_vs_transformers: transformers' median "
                                       "over the function's (above 1: faster)"],
                      commit=os.environ.get("LINATTN_COMMIT") or head.stdout.strip() or "unknown")


if __name__ == "__main__":
    main()
