"""The one-kernel GDN prefill against the two kernels it fuses, on an SM90 GPU (issue 27).

kernels/cutedsl/fused_prefill.py (``LINATTN_CUTEDSL_WALK=fused``) against the CuTe DSL prep, then the
``wgmma`` walk (the planner's default).

Per shape (benchmarks/fused_walk.py's inputs: bf16 q/k/v, l2norm, fp32 "vk" pool, "mild" gates) the call
is planned once per switch and its tables made once; both run once on the same inputs and are compared
(outputs and pool rows: bitwise equal expected, rows not owned unchanged); then
``launch_fused_stages`` is timed (``triton.testing.do_bench`` medians, ms) for the two kernels and for
the one kernel at each register split of ``REGS_VARIANTS`` (prep, walk registers a thread).

Writes the ``benchmarks/_results.py`` schema (``$LINATTN_RESULTS_DIR/fused_prefill_<device>.json``;
default benchmarks/results/) after every shape; the canonical rows live in
``benchmarks/results/prefill_fused_h200.json`` (kind ``one_kernel``).

Usage:  python benchmarks/fused_prefill.py [--shapes 16x4096@16/32,4x8192@16/64,8x1024@16/32] [--regs 152/176,..]
        [--l2norm on|off|both]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path  # noqa: E402
from fused_walk import Call, make, run_shapes, switch  # noqa: E402

SHAPES = "16x4096@16/32,4x8192@16/64,8x1024@16/32"
REGS_VARIANTS = "152/176"


def measure(N, L, H, HV, regs_variants, l2norm=True) -> dict:
    from triton.testing import do_bench

    from linattn.kernels.cutedsl import fused_prefill as fpk

    d, pool0, idx = make(N, L, H, HV)
    if not l2norm:  # the rows unit length beforehand, as FlashInfer's comparison (issue 27's table) takes them
        d["q"] = torch.nn.functional.normalize(d["q"].float(), dim=-1).to(torch.bfloat16)
        d["k"] = torch.nn.functional.normalize(d["k"].float(), dim=-1).to(torch.bfloat16)
    row = dict(kind="one_kernel", N=N, L=L, H=H, HV=HV, K=128, V=128, tokens=N * L, pool="fp32 vk", l2norm=l2norm)
    own = torch.zeros(pool0.shape[0], dtype=torch.bool, device=pool0.device)
    own[idx.long()] = True
    calls, outs = {}, {}
    shipped = fpk.REGS
    try:
        for name in ("wgmma", "fused"):
            switch(name)
            calls[name] = call = Call(d, pool0.clone(), idx, l2norm=l2norm)
            assert call.plan.fused_walk.walk == name, call.plan.fused_walk
            call()
            torch.cuda.synchronize()
            outs[name] = (call.bufs.o[:N * L].clone(), call.pool.clone())
        o2, p2 = outs["wgmma"]
        o1, p1 = outs["fused"]
        row["o_bitwise"] = bool(torch.equal(o1, o2))
        row["pool_bitwise"] = bool(torch.equal(p1, p2))
        row["o_max_abs_diff"] = float((o1.float() - o2.float()).abs().max())
        row["rows_not_owned_unchanged"] = bool(torch.equal(p1[~own], pool0[~own]))
        print({k: row[k] for k in ("o_bitwise", "pool_bitwise", "o_max_abs_diff", "rows_not_owned_unchanged")},
              flush=True)

        def bench(call):
            return float(do_bench(call, warmup=25, rep=150, return_mode="median"))

        row["two_kernels_ms"] = bench(calls["wgmma"])
        for regs in regs_variants:  # "prep/walk" registers a thread (PrefillKey.regs)
            fpk.REGS = tuple(int(x) for x in regs.split("/"))
            tag = f"one_kernel_{regs.replace('/', '_')}"
            one = calls["fused"]
            one.pool.copy_(pool0)  # each build checked on the same entering states: bitwise the two kernels
            one()
            torch.cuda.synchronize()
            row[f"{tag}_bitwise"] = bool(torch.equal(one.bufs.o[:N * L], o2) and torch.equal(one.pool, p2))
            row[f"{tag}_ms"] = bench(one)
            print(regs, row[f"{tag}_ms"], "bitwise", row[f"{tag}_bitwise"], flush=True)
    finally:
        fpk.REGS = shipped
        switch("")
    row["one_kernel_ms"] = min(v for k, v in row.items() if k.startswith("one_kernel_") and k.endswith("_ms"))
    row["all_builds_bitwise"] = all(v for k, v in row.items() if k.endswith("_bitwise"))
    row["speedup_vs_two_kernels"] = row["two_kernels_ms"] / max(row["one_kernel_ms"], 1e-9)
    return row


def _builds(spec: str) -> str:
    """``--regs``' value checked: ``prep/walk`` items, each a register split the kernel takes
    (``fused_prefill.regs_refusal``)."""
    from linattn.kernels.cutedsl.fused_prefill import regs_refusal

    for item in spec.split(","):
        try:
            split = tuple(int(x) for x in item.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected prep/walk, e.g. 152/176") from None
        why = regs_refusal(split)
        if why:
            raise argparse.ArgumentTypeError(f"{item!r}: {why}")
    return spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help=f"NxL@H/HV,... (default {SHAPES})")
    ap.add_argument("--regs", default=REGS_VARIANTS, type=_builds,
                    help="builds 'prep/walk,...': the setmaxnreg split")
    ap.add_argument("--l2norm", default="on", choices=("on", "off", "both"),
                    help="the norms in the kernel, not (q, k normalised beforehand), or both")
    ap.add_argument("--out", default=None, help="result file (default: $LINATTN_RESULTS_DIR/fused_prefill_<device>.json)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU of compute capability 9.x (SM90) with nvidia-cutlass-dsl")
    out = a.out or results_path("fused_prefill")
    regs = a.regs.split(",")
    norms = {"on": (True,), "off": (False,), "both": (True, False)}[a.l2norm]
    notes = ["launch_fused_stages timed on one planned call per switch (tables made once); triton.testing.do_bench "
             "medians, ms; two_kernels: LINATTN_CUTEDSL_WALK=wgmma (CuTe DSL prep, then the wgmma walk); "
             "one_kernel_<prep>_<walk>: LINATTN_CUTEDSL_WALK=fused at that setmaxnreg split",
             "o_bitwise / pool_bitwise: the one kernel's (shipped build) outputs and pool against the two kernels' on the "
             "same inputs; one_kernel_<build>_bitwise: both, for that build"]
    if len(norms) == 1:
        return run_shapes(a.shapes, lambda N, L, H, HV: measure(N, L, H, HV, regs, norms[0]), out, notes)
    shapes = ",".join(a.shapes.split(",") * 2)  # each shape with the norms in the kernel, then without
    order = iter([n for n in norms for _ in a.shapes.split(",")])
    return run_shapes(shapes, lambda N, L, H, HV: measure(N, L, H, HV, regs, next(order)), out, notes)


if __name__ == "__main__":
    sys.exit(main())
