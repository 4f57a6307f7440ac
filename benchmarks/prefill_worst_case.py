"""The chunked prefill on the worst-conditioned solve (tests/prefill/prefill_cases.worst_conditioned:
one repeated key, beta = 1, no decay) under each solve precision, against the float64 reference.

Usage (GPU): python benchmarks/prefill_worst_case.py [--out worst_case.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "prefill"))
from prefill_cases import make_inputs, reference, rel, run, worst_conditioned  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill import pinned_override  # noqa: E402

SOLVES = {
    "shipped": None,
    "neumann_3xtf32_all": dict(NEUMANN=True, DPREC="tf32x3", IPREC="tf32x3"),
    "forward_substitution_ieee": dict(NEUMANN=False, DPREC="ieee", IPREC="ieee"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="worst_case.json")
    args = ap.parse_args()
    res = []
    for family in ("gdn", "kda"):
        for lens in ([64, 130, 1000], [64, 130]):
            for worst in (True, False):
                inp = make_inputs(family, lens, H=16, HV=32, K=128, V=128, dtype=torch.bfloat16, seed=43,
                                  device="cuda")
                if worst:
                    inp = worst_conditioned(inp)
                ro, rht = reference(family, inp)
                for name, solve in SOLVES.items():
                    with pinned_override(solve and {"intra_solve": solve}):
                        o, ht = run(family, inp)
                    row = dict(family=family, lens=lens, worst=worst, solve=name, o_rel=rel(o, ro), state_rel=rel(ht, rht))
                    print(json.dumps(row), flush=True)
                    res.append(row)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), results=res), f, indent=1)


if __name__ == "__main__":
    main()
