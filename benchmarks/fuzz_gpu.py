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
    python benchmarks/fuzz_gpu.py                      # all groups in one call (540 s in all)
    LINATTN_FUZZ_PROFILE=long python benchmarks/fuzz_gpu.py --out /tmp/fuzz_long.json

On the device machine linattn is installed into a target folder first (as in
benchmarks/decode_device.sh: pydantic's wheels carried in ``.whl``, ``pip install --target /tmp/site .``,
``PYTHONPATH=/tmp/site``); the child pytest processes get ``PYTHONSAFEPATH=1`` so that the repo root's
``linattn/`` folder (not the package) is never imported.

Writes ``benchmarks/results/fuzz_h200.json`` (``--out``): command, commit, device, toolchain,
per-group pytest outcome and wall time, rows (cases per property / op / backend@class with
passed / declined / refused / failed and the first failures), notes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/fuzz/test_fuzz_gpu.py"
GROUPS = {
    "decode": "test_gpu_decode_valid",
    "prefill": "test_gpu_prefill_valid",
    "invalid": "test_gpu_invalid_refused",
    "nonfinite": "test_gpu_nonfinite_stays_in_its_row",
    "clamp": "test_gpu_silu_and_mul_clamp",
}


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - the device copy may have no .git
        return ""


def device_info() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["device"] = torch.cuda.get_device_name(0)
            info["capability"] = f"sm_{p.major}{p.minor}"
            info["memory_gib"] = round(p.total_memory / 2 ** 30, 1)
            info["device_count"] = torch.cuda.device_count()
        else:
            info["device"] = None
    except Exception as e:  # noqa: BLE001
        info["torch_error"] = repr(e)
    for mod in ("triton", "hypothesis", "cutlass"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001
            info[mod] = None
    try:
        from importlib import metadata

        info["nvidia-cutlass-dsl"] = metadata.version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001
        info["nvidia-cutlass-dsl"] = None
    return info


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
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_h200.json"))
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments (one string)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the groups of an existing --out file that this call does not run")
    args = ap.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    for g in groups:
        if g not in GROUPS:
            ap.error(f"unknown group {g!r}; groups: {', '.join(GROUPS)}")
    weights = {"decode": 3, "prefill": 4, "invalid": 1, "nonfinite": 2, "clamp": 1}
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
    out = Path(args.out)
    commands = []
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        ran = {res["group"] for res in results}
        kept = [g for g in old.get("groups", []) if g["group"] not in ran]
        kept_rows = {g["group"]: [r for r in old.get("rows", []) if r.get("group") == g["group"]] for g in kept}
        results = [dict(g, rows=kept_rows[g["group"]]) for g in kept] + results
        commands = old.get("commands", [old.get("command")])
    rows = [dict(r, group=res["group"]) for res in results for r in res["rows"]]
    totals = {k: sum(r.get(k, 0) for r in rows) for k in ("cases", "passed", "declined", "refused", "failed")}
    command = "python " + " ".join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])])
    doc = {
        "what": "issue 15 item 9: property-based (hypothesis) fuzz suite, GPU variant (tests/fuzz/test_fuzz_gpu.py)",
        "command": command,
        "commands": [c for c in commands if c] + [command],
        "commit": _git("rev-parse", "HEAD") or os.environ.get("LINATTN_COMMIT", "unknown (no .git on this machine)"),
        "dirty": bool(_git("status", "--porcelain")) if _git("rev-parse", "HEAD") else None,
        "profile": os.environ.get("LINATTN_FUZZ_PROFILE", "ci"),
        "device": device_info(),
        "wall_s": round(time.time() - t0, 1),
        "totals": totals,
        "groups": [{k: v for k, v in res.items() if k != "rows"} for res in results],
        "rows": rows,
        "notes": [
            "Shape classes: qwen3next (H=16, HV=32, K=V=128) and gva2-64 (H=4, HV=8, K=V=64); bf16 and fp32 "
            "q/k/v, fp32 and bf16 pools, 'vk' and 'kv', padding, speculative verify, strided views.",
            "Backends: triton-split, triton-folded (forced), cutedsl (prefill, bf16), torch-ref on the GPU, and "
            "'auto' (the dispatcher's choice). 'declined' = a forced backend refused a valid problem in its "
            "layout predicate (non-dense state tiles), which the contract allows; anything else refused is a failure.",
            "Counts include every example hypothesis ran (ci profile: fixed seed, no shrinking).",
            "A group with timed_out=true ran out of its wall-clock budget (JIT compiles); its counts stop there.",
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"[fuzz_gpu] wrote {out} totals={totals} wall={doc['wall_s']} s", flush=True)
    failed = any(res["rc"] not in (0, 5) for res in results)  # 5: nothing collected (no GPU here)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
