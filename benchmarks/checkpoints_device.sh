#!/usr/bin/env bash
# State checkpoints from prefill (issue 32 item 1) on the H200 (device tool), one call:
#   a. pytest tests/gpu/test_checkpoints_gpu.py (Triton pipeline / fused walk, CuTe DSL, the torch
#      fallbacks; bitwise vs a prefill stopped there, float64 tolerance, rows not owned unchanged)
#      and tests/cutedsl/test_compile_cutedsl.py -k checkpoints                -> $OUT/checkpoints_gpu.xml
#   b. python benchmarks/prefill_checkpoints.py (with / without checkpoints)   -> $OUT/prefill_checkpoints_<device>.json
# As benchmarks/fused_walk_device.sh: the dependency wheels in .whl (carry [".whl"]), linattn installed
# into /tmp/site, PYTHONSAFEPATH=1; the CuTe DSL bundle where its tests should run (else they skip).
# STEPS picks the steps (default ab); T_TESTS / T_BENCH cap each (seconds; 600 per call in all).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/checkpoints_install.log 2>&1 || { echo "wheel install rc=$?"; tail -5 /tmp/checkpoints_install.log; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>/tmp/checkpoints_install.log 2>&1 || { echo "linattn install rc=$?"; tail -20 /tmp/checkpoints_install.log; }
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONSAFEPATH=1 LINATTN_RESULTS_DIR="$OUT"
STEPS=${STEPS:-ab}
if [[ $STEPS == *a* ]]; then
timeout -k 5 "${T_TESTS:-360}" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs \
  tests/gpu/test_checkpoints_gpu.py tests/cutedsl/test_compile_cutedsl.py -k "checkpoint" \
  --junitxml="$OUT/checkpoints_gpu.xml" 2>&1 | tail -40
echo "step a rc=${PIPESTATUS[0]}"
fi
if [[ $STEPS == *b* ]]; then
timeout -k 5 "${T_BENCH:-200}" python3 benchmarks/prefill_checkpoints.py 2>&1 | grep -v Warning | tail -20
echo "step b rc=${PIPESTATUS[0]}"
fi
