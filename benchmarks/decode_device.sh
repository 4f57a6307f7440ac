#!/bin/bash
# One call on the H200 (device tool): install, then contract tests compiled, GPU field cases,
# compute-sanitizer memcheck (F22), tile sweep and the decode benchmark; JSON under $OUT in the
# benchmarks/_results.py schema: decode_<device>.json (the benchmark: copy it to benchmarks/results/),
# decode_tune.json (the sweep, an experiment) and decode_tests_<device>.json (the tests, a run log).
# Usage (device tool, carry [".whl"]):  LINATTN_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/decode_device.sh [all|final|bench|tests|tune|sweep]
# final = contract + GPU tests + placement experiment + benchmark (no sanitizer, no tuning sweep)
# sweep = only the bf16-pool launch config sweep (benchmarks/decode_sweep.py -> $OUT/decode_sweep_<device>.json; issue 32 item 5;
#   into benchmarks/results/decode_<device>.json as bf16_sweep rows: python benchmarks/decode_sweep.py --merge <that file> --note "...")
# The recipe is written up in /work/notes/device-recipe.md.
set -u
MODE=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (it is not the installed package)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 4; }
export PYTHONPATH=/tmp/site LINATTN_RESULTS_DIR="$OUT"
python3 -c "import linattn, fla, torch, triton; print('linattn', linattn.__file__, 'fla', fla.__version__, 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
PT="python3 -m pytest -q -p no:cacheprovider -rfE"
if [ "$MODE" = all ] || [ "$MODE" = tests ] || [ "$MODE" = final ]; then
  $PT tests/contract --junitxml "$OUT/contract.xml" 2>&1 | tail -4
  $PT tests/gpu --junitxml "$OUT/gpu.xml" 2>&1 | tail -4
fi
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  python3 benchmarks/decode.py --sanitize >/dev/null 2>&1   # compile outside the sanitizer
  compute-sanitizer --tool memcheck --error-exitcode 99 python3 benchmarks/decode.py --sanitize >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|sanitize:' "$OUT/memcheck.log" | tr '\n' ' ')"
fi
if [ "$MODE" = all ] || [ "$MODE" = tune ]; then
  python3 benchmarks/decode.py --tune --out "$OUT/decode_tune.json" 2>&1 | grep -v "^  (graph"
fi
if [ "$MODE" = sweep ]; then
  python3 benchmarks/decode_sweep.py 2>&1   # -> $OUT/decode_sweep_<device>.json
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ] || [ "$MODE" = final ]; then
  python3 benchmarks/decode.py --explore 2>&1 | grep -v "^  (graph"   # -> $OUT/decode_<device>.json
fi
# the tests (junit XML) in the benchmarks/_results.py schema, one row per group -> $OUT/decode_tests_<device>.json
NOTES=()
[ -f "$OUT/memcheck.log" ] && NOTES=(--note "compute-sanitizer memcheck (F22) of benchmarks/decode.py --sanitize: $(grep -E 'ERROR SUMMARY|sanitize:' "$OUT/memcheck.log" | tr '\n' ' ')")
ls "$OUT"/*.xml >/dev/null 2>&1 && python3 benchmarks/_results.py junit "$OUT" --name decode_tests \
  --command "bash benchmarks/decode_device.sh $MODE" ${NOTES[@]+"${NOTES[@]}"}
