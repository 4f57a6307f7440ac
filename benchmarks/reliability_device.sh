#!/bin/bash
# One call on the H200 (device tool, carry [".whl"]): install linattn, then run compiled the contract
# tests (a strided view per argument included), the field cases F25-F32, the GPU tests (the issue-16
# features among them) and, with MODE=fuzz, the property-based suite's GPU variant.
# Usage:  bash benchmarks/reliability_device.sh [tests|fuzz]
# Writes junit XML per group and reliability_h200.json (per-group counts and wall time) under $OUT.
set -u
MODE=${1:-tests}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (not the installed package)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 4; }
export PYTHONPATH=/tmp/site
python3 -c "import linattn, torch, triton; print('linattn', linattn.__file__, 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
PT="python3 -m pytest -q -p no:cacheprovider -rfE -W ignore::DeprecationWarning"
run_group() {  # name, time budget (s), pytest args...
  local name=$1 budget=$2; shift 2
  local t0=$(date +%s)
  timeout "$budget" $PT "$@" --junitxml "$OUT/$name.xml" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/$name.log")"
}
if [ "$MODE" = tests ]; then
  run_group field 150 tests/field
  run_group contract 200 tests/contract
  run_group gpu 210 tests/gpu
elif [ "$MODE" = fuzz ]; then
  python3 benchmarks/fuzz_gpu.py --total-s 520 --out "$OUT/fuzz_h200.json" 2>&1 | tail -25
fi
python3 - "$OUT" "$MODE" <<'PY'
import glob, json, os, sys, xml.etree.ElementTree as ET
out, mode = sys.argv[1], sys.argv[2]
res = {"command": f"bash benchmarks/reliability_device.sh {mode}", "groups": {}}
for x in sorted(glob.glob(os.path.join(out, "*.xml"))):
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    for tc in ET.parse(x).getroot().iter("testcase"):
        st = next((t for t in ("failure", "error", "skipped") if tc.find(t) is not None), "passed")
        key = {"failure": "failed", "error": "failed"}.get(st, st)
        counts[key] += 1
        if key == "failed":
            failed.append(f"{tc.get('classname')}::{tc.get('name')}")
    res["groups"][os.path.basename(x)[:-4]] = {**counts, "failed_tests": failed[:40]}
json.dump(res, open(os.path.join(out, f"reliability_{mode}.json"), "w"), indent=1)
print(json.dumps({k: {kk: v[kk] for kk in ("passed", "failed", "skipped")} for k, v in res["groups"].items()}))
PY
