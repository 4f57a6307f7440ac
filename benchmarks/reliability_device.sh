#!/bin/bash
# One call on the H200 (device tool, carry [".whl"]): install linattn, then run compiled the contract
# tests (a strided view per argument included), the field cases F25-F32, the GPU tests (the issue-16
# features among them) and, with MODE=fuzz, the property-based suite's GPU variant.
# Usage:  bash benchmarks/reliability_device.sh [tests|fuzz]
# Writes under $OUT: junit XML and a log per group, and in the benchmarks/_results.py schema
# reliability_<device>.json (tests: one row per group) or fuzz_<device>.json (fuzz); copy those to
# benchmarks/results/. Pass LINATTN_COMMIT=$(git rev-parse --short HEAD) to record the commit.
set -u
MODE=${1:-tests}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (not the installed package)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 4; }
export PYTHONPATH=/tmp/site LINATTN_RESULTS_DIR="$OUT"
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
  python3 benchmarks/fuzz_gpu.py --total-s 520 2>&1 | tail -25   # -> $OUT/fuzz_<device>.json
fi
if [ "$MODE" = tests ]; then  # one row per group, benchmarks/_results.py schema -> $OUT/reliability_<device>.json
  python3 benchmarks/_results.py junit "$OUT" --name reliability --command "bash benchmarks/reliability_device.sh tests"
fi
