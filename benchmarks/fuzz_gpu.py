"""Run the property-based suite's GPU variant (``tests/fuzz/test_fuzz_gpu.py``) and write its counts.

The GPU properties are the CPU suite's (oracle, untouched rows, padding, views == contiguous,
pool == dense, refusals before any write, non-finite containment) compiled on a CUDA GPU over two
fixed shape classes (Qwen3-Next heads H=16/HV=32/K=V=128, and H=4/HV=8/K=V=64), so that JIT
compiles stay bounded. Each group of tests runs in its own pytest process with a wall-clock budget,
so one slow group cannot take the whole device call; a group that runs out of time is recorded as
such (its counts up to then are kept).

Usage (on the H200, through the device tool, whose calls last at most 10 minutes; the JIT builds
dominate the first run, so split the groups over two calls that merge into one file)::

    python benchmarks/fuzz_gpu.py --groups decode,invalid,clamp --total-s 500
    python benchmarks/fuzz_gpu.py --groups prefill,nonfinite --total-s 500 --merge
    python benchmarks/fuzz_gpu.py --groups model_gates --total-s 400 --merge
    python benchmarks/fuzz_gpu.py                      # all groups in one call (540 s in all)
    LINATTN_FUZZ_PROFILE=long python benchmarks/fuzz_gpu.py --out /tmp/fuzz_long.json

On the device machine linattn is installed into a target folder first (as in
benchmarks/decode_device.sh: pydantic's wheels carried in ``.whl``, ``pip install --target /tmp/site .``,
``PYTHONPATH=/tmp/site``); the child pytest processes get ``PYTHONSAFEPATH=1`` so that the repo root's
``linattn/`` folder (not the package) is never imported.

Writes the ``benchmarks/_results.py`` schema to ``benchmarks/results/fuzz_<device>.json`` (``--out``):
rows of ``kind`` pytest_group (per group: pytest outcome, wall time, counts) and one row per property /
op / backend@class (cases passed / declined / refused / failed and the first failures), with its group.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import read_results, results_path, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/fuzz/test_fuzz_gpu.py"
GROUPS = {
    "decode": "test_gpu_decode_valid",
    "prefill": "test_gpu_prefill_valid",
    "invalid": "test_gpu_invalid_refused",
    "nonfinite": "test_gpu_nonfinite_stays_in_its_row",
    "clamp": "test_gpu_silu_and_mul_clamp",
    "model_gates": "test_gpu_model_gates",
}


def run_group(name: str, budget_s: float, extra: list[str]) -> dict:
    """One pytest process for one group; returns its outcome, wall time and counts."""
    fd, path = tempfile.mkstemp(suffix=f"_{name}.json")
    os.close(fd)
    os.unlink(path)
    env = dict(os.environ, LINATTN_FUZZ_JSON=path)
    env.setdefault("PYTHONSAFEPATH", "1")  # never import the repo root's linattn/ folder (not the package)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST, "-k", GROUPS[name], "-rfEX", *extra]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget_s)
        rc, out, timed_out = proc.returncode, proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = None, True
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    wall = round(time.time() - t0, 1)
    doc = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
        os.unlink(path)
    tail = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR", "XPASS"))
            or " passed" in ln or " failed" in ln]
    return dict(group=name, command=" ".join(cmd[1:]), rc=rc, timed_out=timed_out, wall_s=wall,
                tests=doc.get("tests", {}), rows=doc.get("rows", []), totals=doc.get("totals", {}),
                test_outcomes=doc.get("test_outcomes", {}), summary=tail[-40:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma list of {', '.join(GROUPS)}")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock seconds per group (default: --total-s split over the groups by weight)")
    ap.add_argument("--total-s", type=float, default=540.0, help="wall-clock budget of all groups together")
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/fuzz_<device>.json)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments (one string)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the groups of an existing --out file that this call does not run")
    args = ap.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    for g in groups:
        if g not in GROUPS:
            ap.error(f"unknown group {g!r}; groups: {', '.join(GROUPS)}")
    weights = {"decode": 3, "prefill": 4, "invalid": 1, "nonfinite": 2, "clamp": 1, "model_gates": 2}
    total_w = sum(weights[g] for g in groups)
    t0 = time.time()
    results = []
    for g in groups:
        budget = args.budget_s or max(45.0, args.total_s * weights[g] / total_w)
        print(f"[fuzz_gpu] {g}: budget {budget:.0f} s", flush=True)
        res = run_group(g, budget, args.pytest_args.split())
        print(f"[fuzz_gpu] {g}: rc={res['rc']} timed_out={res['timed_out']} {res['wall_s']} s {res['tests']}",
              flush=True)
        for line in res["summary"]:
            print("    " + line, flush=True)
        results.append(res)
    out = Path(args.out or results_path("fuzz"))
    command = "python " + " ".join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])])
    profile = os.environ.get("LINATTN_FUZZ_PROFILE", "ci")
    if profile != "ci":
        command = f"LINATTN_FUZZ_PROFILE={profile} {command}"
    if args.merge and out.exists():  # keep the groups (and their rows) this call did not run
        old = read_results(out)
        ran = {res["group"] for res in results}
        kept = [r for r in old.rows if r.get("group") not in ran]
        command = f"{old.command} && {command}"  # both calls made the file
    else:
        kept = []
    rows = kept + [row for res in results for row in
                   [dict(kind="pytest_group", **{k: v for k, v in res.items() if k != "rows"})]
                   + [dict(r, group=res["group"]) for r in res["rows"]]]
    props = [r for r in rows if r.get("kind") != "pytest_group"]
    totals = {k: sum(r.get(k, 0) for r in props) for k in ("cases", "passed", "declined", "refused", "failed")}
    notes = [
        f"Property-based (hypothesis) fuzz suite, GPU variant (tests/fuzz/test_fuzz_gpu.py); profile '{profile}'; "
        f"this call {round(time.time() - t0, 1)} s; totals {json.dumps(totals)}.",
        "kind pytest_group: one row per group of tests (its own pytest process and time budget); every other row: "
        "cases per property / op / backend@shape class, with the group it ran in.",
        "Shape classes: qwen3next (H=16, HV=32, K=V=128) and gva2-64 (H=4, HV=8, K=V=64); bf16 and fp32 "
        "q/k/v, fp32 and bf16 pools, 'vk' and 'kv', padding, speculative verify, strided views.",
        "Group model_gates (kind gpu-model-gates): the gates of Qwen3-Next, Qwen3.5, OLMo-hybrid, Kimi-Linear and "
        "GLM-5-Next as their initialisations draw them, every second head a strong-decay head "
        "(linattn.testing.gates; KDA blocks off stage 1's fast path), focus mixed.",
        "Backends: triton-split, triton-folded (forced), cutedsl (prefill, bf16), torch-ref on the GPU, and "
        "'auto' (the dispatcher's choice). 'declined' = a forced backend refused a valid problem in its "
        "layout predicate (non-dense state tiles), which the contract allows; anything else refused is a failure.",
        "Counts include every example hypothesis ran (ci profile: fixed seed, no shrinking).",
        "A group with timed_out=true ran out of its wall-clock budget (JIT compiles); its counts stop there.",
    ]
    write_results(out, rows, notes, command=command)
    print(f"[fuzz_gpu] wrote {out} totals={totals}", flush=True)
    failed = any(res["rc"] not in (0, 5) for res in results)  # 5: nothing collected (no GPU here)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
