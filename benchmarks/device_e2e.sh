#!/usr/bin/env bash
# End-to-end on the H200 through the dispatcher: the demo (pool-mode prefill + padded decode,
# float64 spot checks) for GDN and KDA, and the decisions made. Run with the device tool:
#   carry [".whl"], command: bash benchmarks/device_e2e.sh
# (.whl holds fla-core and pydantic wheels; see /work/notes/device-recipe.md in the session notes)
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site .
export PYTHONPATH=/tmp/site PYTHONSAFEPATH=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m linattn demo --model qwen3-next --device cuda --json > "$OUT/demo_qwen3-next_cuda.json" || echo "demo qwen3-next rc=$?"
python3 -m linattn demo --model kimi-linear --device cuda --json > "$OUT/demo_kimi-linear_cuda.json" || echo "demo kimi-linear rc=$?"
python3 -m linattn demo --model qwen3-next --device cuda --requests 64 --decode-batch 32 --steps 48 --json > "$OUT/demo_qwen3-next_cuda_b32.json" || echo "demo b32 rc=$?"
python3 -m linattn explain gdn_prefill --model qwen3-next --tokens 8192 --seqs 8 --json > "$OUT/explain_gdn_prefill_cuda.json"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("demo_*.json")):
    d = json.loads(f.read_text())
    print(f.name, {k: d[k] for k in d if k in ("passed", "ok", "status")}, str(d)[:600])
PY
