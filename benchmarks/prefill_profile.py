"""One chunked prefill per family at one shape, for a profiler (``ncu``) to attach to.

Usage:  ncu --clock-control none -k regex:chunk_ ... python benchmarks/prefill_profile.py [--shape 16x4096]
        [--families gdn,kda]
Runs each family twice (the first run compiles), then synchronises. Inputs as benchmarks/prefill.py.
Writes no results file: ncu's text reports go to benchmarks/results/ncu/ (its README says what each
file shows and which code it profiled), per-line stalls through benchmarks/ncu_source_lines.py.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill import config_override, linattn_fn, make  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="16x4096")
    ap.add_argument("--families", default="gdn,kda")
    ap.add_argument("--cfg", default=None, help='JSON: PrefillConfig fields to override by their paths, e.g. '
                    '\'{"state.block_v": 32, "intra.solve": {"neumann": false}}\' (prefill.override_config)')
    args = ap.parse_args()
    over = json.loads(args.cfg) if args.cfg else None
    N, L = map(int, args.shape.split("x"))
    for family in args.families.split(","):
        d, pool, idx = make(family, N, L)
        fn = linattn_fn(family, d, pool, idx)
        with config_override(over):
            fn()
            fn()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
