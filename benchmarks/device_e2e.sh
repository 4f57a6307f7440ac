#!/usr/bin/env bash
# End to end on the H200 through the dispatcher: the demo (pool-mode prefill + padded decode,
# float64 spot checks) for GDN and KDA, and the decisions made. Run with the device tool:
#   carry [".whl"], command: LINATTN_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device_e2e.sh
# (.whl holds fla-core and pydantic wheels; see /work/notes/device-recipe.md in the session notes)
# Writes each command's --json output to $OUT/e2e_raw/ and all of them, one row per command, in the
# benchmarks/_results.py schema to $OUT/e2e_<device>.json (the file benchmarks/results/ keeps).
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site .
export PYTHONPATH=/tmp/site PYTHONSAFEPATH=1
OUT=${OUT:-out}; mkdir -p "$OUT/e2e_raw"
export LINATTN_RESULTS_DIR="$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
RUNS=(
  "demo_qwen3-next|demo --model qwen3-next --device cuda --json"
  "demo_kimi-linear|demo --model kimi-linear --device cuda --json"
  "demo_qwen3-next_b32|demo --model qwen3-next --device cuda --requests 64 --decode-batch 32 --steps 48 --json"
  "explain_gdn_prefill|explain gdn_prefill --model qwen3-next --total-tokens 8192 --seqs 8 --json"
)
for run in "${RUNS[@]}"; do
  name=${run%%|*}; args=${run#*|}
  python3 -m linattn $args > "$OUT/e2e_raw/$name.json" || echo "$name rc=$?"
done
python3 - "$OUT" "${RUNS[@]}" <<'PY'
import json, pathlib, sys
sys.path.insert(0, "benchmarks")
from _results import results_path, write_results
out, runs = pathlib.Path(sys.argv[1]), sys.argv[2:]
rows = []
for run in runs:
    name, args = run.split("|", 1)
    row = {"kind": name.split("_")[0], "args": f"linattn {args}"}
    try:
        row.update(json.loads((out / "e2e_raw" / f"{name}.json").read_text()))
    except (OSError, ValueError) as e:
        row["error"] = f"{type(e).__name__}: {e}"
    rows.append(row)
    print(name, {k: row[k] for k in row if k in ("passed", "ok", "status", "chosen", "error")})
write_results(results_path("e2e"), rows,
              ["End to end through the dispatcher: linattn demo (pool-mode prefill, padded decode, float64 spot checks "
               "of every op) for Qwen3-Next (GDN) and Kimi-Linear (KDA), and one explain; one row per command (args), "
               "each the command's --json output.",
               "The demo's tokens_per_s include first-call compiles at these small sizes: not a throughput figure."],
              command="bash benchmarks/device_e2e.sh")
PY
