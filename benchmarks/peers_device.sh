#!/usr/bin/env bash
# The peer backends (issue 29) on the H200: `linattn check --backend fla|flashinfer --device cuda`
# and tests/gpu/test_peers_gpu.py. Device calls, back to back (the machine stays warm between them):
#   1) carry [".cute_a"]                command: bash .cute_a/install.sh
#   2) carry [".cute_b"]                command: bash .cute_b/install.sh
#   3) carry [".flashinfer", ".whl"]    command: bash benchmarks/peers_device.sh
# (.cute_a/.cute_b: bash ../shared/device/make-cutedsl-bundle; .flashinfer: bash
# tools/make-flashinfer-bundle; .whl: the fla-core 0.6.0 and pydantic wheels.) fla alone needs only
# call 3 with carry [".whl"] (PEERS=fla); FlashInfer needs the CuTe DSL of calls 1 and 2.
#
# Steps (each says "step N FAILED: ..." when it fails):
#   1. linattn and the .whl wheels (fla-core, pydantic) into /tmp/site
#   2. FlashInfer into /tmp/site (.flashinfer/install.sh), when "flashinfer" is in $PEERS
#   3. per peer: `python3 -m linattn check --backend NAME --device cuda --json` -> $OUT/check_NAME.json
#      (the exit code is printed: 0 passed, 1 a case failed, 3 not available here, 124 the time cap
#      PEERS_CHECK_S, default 300 s: FLA's Triton kernels compile and autotune per shape at first use)
#   4. pytest tests/gpu/test_peers_gpu.py but its conformance test (step 3 ran it: FlashInfer decode in a CUDA
#      graph, FlashInfer through linattn against FlashInfer called directly, FLA refused in capture)
#      and the CPU test that needs the real fla-core (the functions called are FLA's own, unwrapped)
# Environment: PEERS (default "fla,flashinfer"; one peer per call fits the 10-minute cap better),
# PEERS_BUDGET_S (560), PEERS_CHECK_S (300).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/peers_device.log") 2>&1
tee_pid=$!
trap 'exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null' EXIT
BUDGET=${PEERS_BUDGET_S:-560}
PEERS=${PEERS:-fla,flashinfer}
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export LINATTN_RESULTS_DIR="$OUT" TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
export LINATTN_PEERS=all  # opt-in until verified (backends/builtin.py PEERS_VERIFIED)
left() { echo $((BUDGET - SECONDS)); }
fail() { echo "step $1 FAILED: $2"; }

echo "== step 1: linattn (+ .whl) into /tmp/site"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/peers_install.log 2>&1 || { fail 1 "wheels from .whl"; tail -5 /tmp/peers_install.log; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>/tmp/peers_install.log 2>&1 || { fail 1 "linattn"; tail -10 /tmp/peers_install.log; exit 1; }
python3 -c "import torch, triton, linattn; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  || { fail 1 "linattn does not import"; exit 1; }
python3 -c "import torch, sys; sys.exit(0 if hasattr(torch.Tensor, '__dlpack_c_exchange_api__') else 1)" \
  || export TVM_FFI_DISABLE_TORCH_C_DLPACK=1

if [[ ",$PEERS," == *",flashinfer,"* ]]; then
  echo "== step 2: FlashInfer into /tmp/site"
  python3 -c "import cutlass.cute" 2>/dev/null \
    || fail 2 "CuTe DSL does not import from /tmp/site: run calls 1 and 2 first (FlashInfer's kernels need it)"
  if [ -f .flashinfer/install.sh ]; then
    timeout -k 5 120 bash .flashinfer/install.sh || fail 2 ".flashinfer/install.sh rc=$?"
  else
    python3 -c "import flashinfer.gdn_prefill" 2>/dev/null || fail 2 "no .flashinfer carried and none in /tmp/site"
  fi
fi

for name in ${PEERS//,/ }; do
  echo "== step 3: linattn check --backend $name --device cuda ($(left) s left)"
  cap=$(( $(left) - 90 )); [ "$cap" -gt "${PEERS_CHECK_S:-300}" ] && cap=${PEERS_CHECK_S:-300}
  timeout -k 5 "$cap" python3 -m linattn check --backend "$name" --device cuda --json \
    >"$OUT/check_$name.json" 2>"$OUT/check_$name.err"
  echo "check $name: exit $?"
  python3 - "$OUT/check_$name.json" <<'PY' || tail -20 "$OUT/check_$name.err"
import json, sys
d = json.load(open(sys.argv[1]))
for b in d.get("backends", []):
    print(b["backend"], b["status"], b["counts"])
    for r in b["results"]:
        if r["status"] in ("failed", "skipped"):
            print(f"  {r['status']:8} {r['id']}: {r['message'][:300]}")
PY
done

echo "== step 4: tests/gpu/test_peers_gpu.py ($(left) s left)"
# the conformance test repeats step 3: deselected here (run it with -k conformance when step 3 timed out)
ks="($(echo "$PEERS" | sed 's/,/ or /g')) and not conformance"
timeout -k 5 "$(( $(left) - 10 ))" python3 -m pytest -q -p no:cacheprovider -rfEs -W ignore::DeprecationWarning \
  tests/gpu/test_peers_gpu.py "tests/peers/test_peer_dispatch.py::test_fla_functions_are_flas_own_implementations_not_its_dispatch_wrappers" \
  -k "$ks" 2>&1 | tail -40
echo "pytest rc=${PIPESTATUS[0]} ($SECONDS s in all)"
ls -la "$OUT"
