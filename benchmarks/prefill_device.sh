#!/usr/bin/env bash
# Chunked prefill on the H200 (device tool): the GPU tests (prefill, decode) and the benchmark
# against flash-linear-attention, with launch-configuration sweeps on the 16x4096 shape.
#   carry [".whl"] (fla-core, pydantic wheels; see benchmarks/device_e2e.sh);
#   command: bash benchmarks/prefill_device.sh
# Writes $OUT/prefill_tests.xml and, in the benchmarks/_results.py schema, $OUT/prefill_<device>.json
# (with the sweeps; copy it to benchmarks/results/ when it is the run the docs cite).
# Pass LINATTN_COMMIT=$(git rev-parse --short HEAD) to record the commit.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site .
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONSAFEPATH=1 LINATTN_RESULTS_DIR="$OUT"
T_TESTS=${T_TESTS:-230}
timeout -k 5 "$T_TESTS" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfE ${TESTS:-tests/gpu/test_prefill_gpu.py tests/gpu/test_decode_gpu.py} \
  --junitxml="$OUT/prefill_tests.xml" 2>&1 | tail -25
timeout -k 5 "${T_BENCH:-330}" python3 benchmarks/prefill.py --families "${FAMILIES:-gdn,kda}" --sweep --intra-sweep \
  --sweep-shapes "${SWEEP_SHAPES:-16x4096}" 2>&1 | grep -v Warning | tail -30
