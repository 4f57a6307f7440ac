#!/usr/bin/env bash
# benchmarks/dispatch_choice.py on the H200 (issue 29's target: the dispatcher's choice against the
# fastest eligible backend per benchmark shape), with the peers installed as benchmarks/peers_device.sh
# installs them. Device calls:
#   fla only:        carry [".whl"]                  command: bash benchmarks/dispatch_choice_device.sh
#   fla + FlashInfer: first the CuTe DSL calls of peers_device.sh's header (carry [".cute_a"], then
#                    [".cute_b"]), then carry [".flashinfer", ".whl"], the same command.
# Arguments go to dispatch_choice.py (e.g. --quick, --shapes kda_prefill:1x65536, --validate). Writes
# $OUT/dispatch_choice_h200.json (rows after every shape; the summary row names what was not measured).
# DC_BUDGET_S (default 570): the whole call's cap; dispatch_choice.py starts no shape after DC_BUDGET_S - 90 s.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${DC_BUDGET_S:-570}
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export LINATTN_RESULTS_DIR="$OUT" TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
export LINATTN_PEERS=all FLA_DISABLE_BACKEND_DISPATCH=1  # peers opt-in; FLA runs its own Triton kernels
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site"
if ls .whl/*.whl >/dev/null 2>&1; then $PIP .whl/*.whl >/tmp/dc_install.log 2>&1 || echo "wheels from .whl FAILED"; fi
$PIP --no-build-isolation . >>/tmp/dc_install.log 2>&1 || { echo "linattn install FAILED"; tail -10 /tmp/dc_install.log; exit 1; }
python3 -c "import torch, sys; sys.exit(0 if hasattr(torch.Tensor, '__dlpack_c_exchange_api__') else 1)" \
  || export TVM_FFI_DISABLE_TORCH_C_DLPACK=1
if [ -f .flashinfer/install.sh ]; then
  python3 -c "import cutlass.cute" 2>/dev/null || echo "CuTe DSL does not import: run peers_device.sh's calls 1 and 2 first"
  timeout -k 5 120 bash .flashinfer/install.sh || echo ".flashinfer/install.sh rc=$?"
fi
python3 -m linattn backends 2>&1 | head -20
timeout -k 5 $((BUDGET - SECONDS)) python3 benchmarks/dispatch_choice.py --device cuda \
  --max-seconds $((BUDGET - SECONDS - 90)) --out "$OUT/dispatch_choice_h200.json" "$@"
echo "dispatch_choice.py exit $?"
