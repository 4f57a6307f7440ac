#!/usr/bin/env bash
# The tuned table shipped for sm_90 (issue 29 item 4): `linattn tune` on the H200, in one device call.
#   device tool: carry [".whl"] (the peers' wheels and bundles as for benchmarks/peers_device.sh when
#   FLA / FlashInfer are to be timed too), command: bash benchmarks/tune_device.sh
# Writes $OUT/sm_90.json (copy it to linattn/tuned/sm_90.json and commit it: the shipped table) and
# $OUT/tune.log (one line per bucket: every eligible backend's median ms, the failed ones).
# The table is keyed by the device, driver and the versions installed here (torch, triton, linattn,
# nvidia-cutlass-dsl, fla-core, flashinfer-python): a user whose versions differ gets static ranks.
# Environment: TUNE_ARGS (extra `linattn tune` options, e.g. "--quick" or "--buckets gdn_decode:1,gdn_prefill:16x4096"),
# TUNE_MAX_S (no bucket starts after it; 480), LINATTN_PEERS (default all: the peers installed here are timed).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (not the installed package)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/install.log" 2>&1 || { echo "install of .whl failed"; tail -5 "$OUT/install.log"; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>"$OUT/install.log" 2>&1 || { echo "install of linattn failed"; tail -10 "$OUT/install.log"; exit 4; }
[ -f .flashinfer/install.sh ] && timeout -k 5 120 bash .flashinfer/install.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
export LINATTN_PEERS=${LINATTN_PEERS:-all} LINATTN_TUNE_DIR="$OUT/user"
python3 -c "import torch, sys; sys.exit(0 if hasattr(torch.Tensor, '__dlpack_c_exchange_api__') else 1)" \
  || export TVM_FFI_DISABLE_TORCH_C_DLPACK=1
# shellcheck disable=SC2086
python3 -m linattn tune --device cuda --out "$OUT/sm_90.json" --max-seconds "${TUNE_MAX_S:-480}" ${TUNE_ARGS:-} 2>&1 \
  | tee "$OUT/tune.log"
exit "${PIPESTATUS[0]}"
