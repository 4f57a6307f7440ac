"""The fused GDN prefill's prep: Triton (``chunk_gdn_fused_prep_kernel``) against CuTe DSL
(kernels/cutedsl/fused_prep.py, ``LINATTN_CUTEDSL_PREP`` 1; Triton: 0), and the whole prefill with each prep
and the warpgroup walk (``LINATTN_CUTEDSL_WALK=wgmma``) (issue 27).

Per shape (benchmarks/fused_walk.py's inputs: bf16 q/k/v, l2norm, fp32 "vk" pool, "mild" gates):
the call is planned once, its tables made once; before timing, both preps run once on the same
call and their outputs are compared (``tmb``, ``aqk``, ``rk``, ``qs``: relative difference, largest
absolute difference of ``tmb`` and ``aqk``), and the whole prefill with the CuTe prep is compared
with the Triton prep's (outputs, pool rows written, rows not owned bitwise unchanged). Then
``launch_fused_stages`` is timed (``triton.testing.do_bench`` medians, ms): each prep alone (the walk
replaced by nothing) and each prep followed by the wgmma walk.

Writes the ``benchmarks/_results.py`` schema (``$LINATTN_RESULTS_DIR/fused_prep_<device>.json``;
default benchmarks/results/) after every shape. The canonical rows live in
``benchmarks/results/prefill_fused_h200.json`` (kind ``cutedsl_prep``, moved there with a ``measured_by``
note as the walk benchmark's rows are): the results folder holds at most 15 files.

Usage:  python benchmarks/fused_prep.py [--shapes 16x4096@16/32,4x8192@16/64,8x1024@16/32] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path  # noqa: E402
from fused_walk import Call, make, run_shapes, setenv  # noqa: E402
from linattn.testing.compare import rel_error as rel  # noqa: E402

SHAPES = "16x4096@16/32,4x8192@16/64,8x1024@16/32"
PREP_SWITCH = "LINATTN_CUTEDSL_PREP"
WALK_SWITCH = "LINATTN_CUTEDSL_WALK"
#: the CuTe DSL prep's builds timed (fused_prep.SOLVE, MIN_CTAS): one of them is the shipped one
CUTE_VARIANTS = {"column": ("column", 3), "blocks": ("blocks", 3)}


def measure(N, L, H, HV) -> dict:
    from triton.testing import do_bench

    from linattn.kernels.cutedsl import fused_prep as fp
    from linattn.kernels.cutedsl import fused_walk as fw

    d, pool0, idx = make(N, L, H, HV)
    row = dict(N=N, L=L, H=H, HV=HV, K=128, V=128, tokens=N * L, pool="fp32 vk")
    own = torch.zeros(pool0.shape[0], dtype=torch.bool, device=pool0.device)
    own[idx.long()] = True
    bufs, outs = {}, {}
    for name, value in (("triton", "0"), ("cutedsl", "1")):
        pool = pool0.clone()
        setenv(PREP_SWITCH, value)  # both switches read when the call is planned
        setenv(WALK_SWITCH, "wgmma")
        call = Call(d, pool, idx)
        assert call.plan.fused_prep == (value == "1"), call.plan.fused_prep
        call()
        torch.cuda.synchronize()
        b = call.bufs
        bufs[name] = [x.clone() for x in (b.fused_tmb, b.fused_aqk, b.rk, b.fused_qs)]
        outs[name] = (b.o.clone(), pool[idx.long()].clone(), torch.equal(pool[~own], pool0[~own]))
    for i, nm in enumerate(("tmb", "aqk", "rk", "qs")):
        row[f"{nm}_rel"] = rel(bufs["cutedsl"][i], bufs["triton"][i])
        if nm in ("tmb", "aqk"):
            row[f"{nm}_max_abs"] = float((bufs["cutedsl"][i].float() - bufs["triton"][i].float()).abs().max())
    row["o_rel_vs_triton_prep"] = rel(outs["cutedsl"][0], outs["triton"][0])
    row["pool_rel_vs_triton_prep"] = rel(outs["cutedsl"][1], outs["triton"][1])
    row["o_finite"] = bool(torch.isfinite(outs["cutedsl"][0].float()).all())
    row["rows_not_owned_unchanged"] = all(x[2] for x in outs.values())
    print({k: v for k, v in row.items() if "rel" in k or "abs" in k}, flush=True)

    setenv(WALK_SWITCH, "wgmma")
    call = Call(d, pool0.clone(), idx)
    planned = call.plan

    def bench():
        return float(do_bench(call, warmup=25, rep=150, return_mode="median"))

    real, shipped = fw.run_for_plan, (fp.SOLVE, fp.MIN_CTAS)
    ship = next((v for v, cfg in CUTE_VARIANTS.items() if cfg == shipped), None)
    if ship is None:
        raise SystemExit(f"the shipped prep build {shipped} (fused_prep.SOLVE, MIN_CTAS) is not in CUTE_VARIANTS")
    try:
        for name, value in (("triton", "0"), ("cutedsl", "1")):
            call.plan = dataclasses.replace(planned, fused_prep=value == "1")  # the planner's choice under the switch
            for variant in (CUTE_VARIANTS if value == "1" else ("",)):
                if variant:  # the prep's solve and CTAs per SM (PrepKey)
                    fp.SOLVE, fp.MIN_CTAS = CUTE_VARIANTS[variant]
                tag = f"{name}_{variant}" if variant else name
                fw.run_for_plan = real
                row[f"{tag}_prep_wgmma_walk_ms"] = bench()
                fw.run_for_plan = lambda *a: True  # the prep alone
                row[f"{tag}_prep_ms"] = bench()
            fw.run_for_plan = real
    finally:
        fw.run_for_plan = real
        fp.SOLVE, fp.MIN_CTAS = shipped
        setenv(PREP_SWITCH, "")
        setenv(WALK_SWITCH, "")
    row["cutedsl_prep_ms"] = row[f"cutedsl_{ship}_prep_ms"]
    row["cutedsl_prep_wgmma_walk_ms"] = row[f"cutedsl_{ship}_prep_wgmma_walk_ms"]
    row["prep_speedup"] = row["triton_prep_ms"] / max(row["cutedsl_prep_ms"], 1e-9)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    out = a.out or results_path("fused_prep")
    notes = ["prep alone and prep + wgmma walk timed through prefill.launch_fused_stages on one planned call "
             "(tables made once; prep alone: the walk replaced by nothing); triton.testing.do_bench medians, ms",
             "cutedsl prep: kernels/cutedsl/fused_prep.py (LINATTN_CUTEDSL_PREP=0: the Triton prep); *_rel: relative "
             "difference to the Triton prep's buffers / the whole prefill with it (the shipped solve, fused_prep.SOLVE)",
             "cutedsl_<variant>_*: the CuTe prep built as CUTE_VARIANTS[variant] (PrepKey solve, min_ctas); "
             "cutedsl_prep_*: the shipped build's"]
    return run_shapes(a.shapes, measure, out, notes)


if __name__ == "__main__":
    sys.exit(main())
