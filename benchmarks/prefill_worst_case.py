"""The chunked prefill on the worst-conditioned solve (tests/prefill/prefill_cases.worst_conditioned:
one repeated key, beta = 1, no decay) and on ordinary inputs, against the float64 reference, under
each solve precision and (GDN) each session-7 stage option.

Writes the ``benchmarks/_results.py`` schema, one row per (family, lengths, worst, config), and (GDN) one
per (lengths, worst, config) of the fused prefill forced, under the shipped and the all-TF32 solve (``fused``: True; None: the
planner's choice, the pipeline at these three-sequence shapes), default
``benchmarks/results/prefill_worst_case_<device>.json``; ``config`` is the ``PrefillConfig`` override
(``{}``: the shipped configuration), ``o_rel`` / ``state_rel`` the relative errors of the output and
the final pool rows.

Usage (GPU): python benchmarks/prefill_worst_case.py [--families gdn,kda] [--fused-only] [--out FILE]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "prefill"))
from prefill_cases import make_inputs, reference, rel, run, worst_conditioned  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from prefill import config_override  # noqa: E402

from linattn.kernels.triton.prefill import LaunchOptions, SolveConfig  # noqa: E402

#: The triangular solve's precisions (chunk_intra._solve): all 3xTF32, all TF32 (the diagonal blocks on
#: single TF32 dots: 253 instead of 944 sm_90 instructions per warp in the fused prep, docs/performance.md
#: "Where the prep's instructions go"), and fp32 forward substitution.
SOLVES = [
    {"intra.solve": SolveConfig(neumann=True, diag_precision="tf32x3", below_precision="tf32x3")},
    {"intra.solve": SolveConfig(neumann=True, diag_precision="tf32", below_precision="tf32")},
    {"intra.solve": SolveConfig(neumann=False, diag_precision="ieee", below_precision="ieee")},
]
#: GDN's bf16 stage options (prefill.stage_options), each turned off on its own and all together.
GDN_OPTIONS = [
    {"gdn.every_second_state": False},
    {"gdn.u_in_state": False},
    {"gdn.gates_kernel": False},
    {"gdn.gates_kernel": False, "gdn.every_second_state": False, "gdn.u_in_state": False,
     "intra.launch": LaunchOptions(num_warps=4, num_stages=1, maxnreg=128), "intra.ctas_per_sm": 8},
]
LENS = ([64, 130, 1000], [64, 130])


def configs(family: str) -> list[dict]:
    return [{}, *SOLVES, *(GDN_OPTIONS if family == "gdn" else [])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="gdn,kda")
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/prefill_worst_case_<device>.json)")
    ap.add_argument("--fused-only", action="store_true", help="GDN: only the fused prefill's rows")
    args = ap.parse_args()
    out = args.out or results_path("prefill_worst_case")
    notes = ["Inputs: tests/prefill/prefill_cases.make_inputs(family, lens, H=16, HV=32, K=128, V=128, bf16, "
             "seed=43), worst = worst_conditioned(...) (every key the first one, beta 1, g 0); reference: "
             "prefill_cases.reference (float64).",
             "config: PrefillConfig fields (kernels/triton/prefill.prefill_config) overridden by their paths "
             "through benchmarks/prefill.py's config_override ({} = shipped; before issue 27's host split the "
             "same overrides were named by pinned_config's keys: intra_solve = intra.solve, gdn_hoist = "
             "gdn.gates_kernel, gdn_half_hbuf = gdn.every_second_state, gdn_state_u = gdn.u_in_state)."]
    rows = []
    for family in ["gdn"] if args.fused_only else args.families.split(","):
        for lens in LENS:
            for worst in (True, False):
                inp = make_inputs(family, lens, H=16, HV=32, K=128, V=128, dtype=torch.bfloat16, seed=43,
                                  device="cuda")
                if worst:
                    inp = worst_conditioned(inp)
                ro, rht = reference(family, inp)
                for over in [] if args.fused_only else configs(family):
                    with config_override(over):
                        o, ht = run(family, inp)
                    row = dict(family=family, lens=lens, worst=worst, seed=43, config=repr(over), fused=None,
                               shipped=not over, o_rel=rel(o, ro), state_rel=rel(ht, rht))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                for over in ({}, SOLVES[1]) if family == "gdn" else ():  # the fused prefill, forced
                    with config_override(over):
                        o, ht = run(family, inp, fused=True)
                    row = dict(family=family, lens=lens, worst=worst, seed=43, config=repr(over), fused=True,
                               shipped=False, o_rel=rel(o, ro), state_rel=rel(ht, rht))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                write_results(out, rows, notes)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
