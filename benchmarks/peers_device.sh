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
#   3. per peer and per op of $PEERS_OPS: `python3 -m linattn check --backend NAME --op OP --device cuda --json`
#      -> $OUT/check_NAME_OP.json, the exit code (0 passed, 1 a case failed, 3 the peer runs no case of that
#      op here: an undeclared op's negative cases only, 124 the time cap) and every failed or skipped case.
#      One op per run, so a call that runs out of time keeps the ops it finished. FLA's Triton kernels
#      compile (and its chunk kernels autotune) once per distinct shape: the fla suite has 17-19 cases per op
#      over 7 (decode) and 10 (prefill) distinct dtype/heads/head-dims/layout/state-dtype/mode keys, 4 ops.
#      Compiled kernels and FLA's autotune results are cached under ~/.triton (kept while the machine is
#      warm), so a second call with the same PEERS_OPS mostly runs what the first one compiled.
#   4. only with PEERS_PYTEST=1: pytest tests/gpu/test_peers_gpu.py but its conformance test (step 3 ran it:
#      the peers' decode replayed in a CUDA graph, FlashInfer through linattn against FlashInfer called
#      directly, FLA refused in capture), the CPU tests that need the real fla-core (FLA's own unwrapped
#      functions, the stand-ins' parameter lists, FLA's decode in the Triton interpreter)
# Environment: PEERS (default "fla,flashinfer"; one peer per call fits the 10-minute cap better),
# PEERS_OPS (default every op, decode before prefill; e.g. "gdn_decode,kda_decode" for one call and
# "gdn_prefill,kda_prefill" for the next), PEERS_PYTEST (0; 1 runs step 4 after step 3, 2 runs step 4 only),
# PEERS_BUDGET_S (560), PEERS_CHECK_S (the cap of one op's check; default everything left but 20 s).
# fla alone, the whole check:  PEERS=fla bash benchmarks/peers_device.sh
# when that runs out of time, in two calls:
#   PEERS=fla PEERS_OPS=gdn_decode,kda_decode,gdn_gating,kda_gating,silu_and_mul_clamp bash benchmarks/peers_device.sh
#   PEERS=fla PEERS_OPS=gdn_prefill,kda_prefill bash benchmarks/peers_device.sh
# the GPU tests alone:         PEERS=fla PEERS_PYTEST=2 bash benchmarks/peers_device.sh
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

OPS=${PEERS_OPS:-gdn_decode,kda_decode,gdn_prefill,kda_prefill,gdn_gating,kda_gating,silu_and_mul_clamp}
[ "${PEERS_PYTEST:-0}" = 2 ] || for name in ${PEERS//,/ }; do
  for op in ${OPS//,/ }; do
    echo "== step 3: linattn check --backend $name --op $op --device cuda ($(left) s left)"
    cap=$(( $(left) - 20 )); [ -n "${PEERS_CHECK_S:-}" ] && [ "$cap" -gt "$PEERS_CHECK_S" ] && cap=$PEERS_CHECK_S
    [ "$cap" -gt 10 ] || { echo "check $name $op: not run (no time left)"; continue; }
    start=$SECONDS
    timeout -k 5 "$cap" python3 -m linattn check --backend "$name" --op "$op" --device cuda --json \
      >"$OUT/check_${name}_$op.json" 2>"$OUT/check_${name}_$op.err"
    echo "check $name $op: exit $? in $((SECONDS - start)) s"
    python3 - "$OUT/check_${name}_$op.json" <<'PY' || tail -20 "$OUT/check_${name}_$op.err"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    print("no JSON document (cut off by the time cap?); the end of its stderr:")
    sys.exit(1)
if "error" in d:
    print("error:", d["error"])
for b in d.get("backends", []):
    print(b["backend"], b["status"], b["counts"])
    for r in b["results"]:
        if r["status"] in ("failed", "skipped"):
            print(f"  {r['status']:8} {r['id']}: {r['message'][:300]}")
PY
  done
done

if [ "${PEERS_PYTEST:-0}" != 0 ]; then
  echo "== step 4: tests/gpu/test_peers_gpu.py ($(left) s left)"
  # the conformance test repeats step 3: deselected here (run it with -k conformance when step 3 timed out)
  ks="($(echo "$PEERS" | sed 's/,/ or /g') or stand_ins or interpreter) and not conformance"
  timeout -k 5 "$(( $(left) - 10 ))" python3 -m pytest -q -p no:cacheprovider -rfEs -W ignore::DeprecationWarning \
    tests/gpu/test_peers_gpu.py "tests/peers/test_peer_dispatch.py::test_fla_functions_are_flas_own_implementations_not_its_dispatch_wrappers" \
    tests/peers/test_fla_translation.py::test_the_stand_ins_take_flas_own_parameter_lists \
    tests/peers/test_fla_interpreter.py -k "$ks" 2>&1 | tail -40
  echo "pytest rc=${PIPESTATUS[0]} ($SECONDS s in all)"
else
  echo "== step 4 not run (PEERS_PYTEST=1 or 2 runs tests/gpu/test_peers_gpu.py)"
fi
ls -la "$OUT"
