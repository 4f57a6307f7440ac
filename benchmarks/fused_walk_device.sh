#!/usr/bin/env bash
# The CuTe DSL walk of the fused GDN prefill (kernels/cutedsl/fused_walk.py) on the H200 (device tool),
# after the CuTe DSL bundle is in /tmp/site (../shared/ENVIRONMENT.md: call 1 carry [".cute_a"],
# `bash .cute_a/install.sh`; call 2 carry [".cute_b", ".whl"],
# `bash .cute_b/install.sh && bash benchmarks/fused_walk_device.sh`; on a machine still warm from those,
# carry [".whl"] and run this script alone).
#   a. pytest tests/cutedsl/test_fused_walk.py tests/gpu/test_fused_walk_gpu.py  -> $OUT/fused_walk_tests.xml
#   b. python benchmarks/fused_walk.py (prep + Triton walk vs prep + each CuTe walk, mma.sync and
#      wgmma; 16 x 4,096 and 8 x 1,024 at (16, 32))                            -> $OUT/fused_walk_<device>.json
#   c. ncu of one CuTe DSL walk (WALK=wgmma, the default; 1: mma.sync) and of the prep that precedes it (the
#      planner's: the CuTe DSL prep unless LINATTN_CUTEDSL_PREP=0) at 16 x 4,096 (16, 32); NCU_KERNELS: the
#      kernel-name regex (CuTe DSL names them ..._fused_walk_wgmma..., ..._fused_prep_kernel...) -> $OUT/fused_walk_ncu.txt
#   g. pytest tests/gpu (the whole GPU suite takes longer than one call allows: select files with
#      GPU_TESTS="tests/gpu/test_x.py ...", a few per call)
#                                                                                  -> $OUT/gpu_tests.xml
#   o. the one-kernel prefill (kernels/cutedsl/fused_prefill.py): pytest tests/cutedsl/test_fused_prefill.py
#      tests/gpu/test_fused_prefill_gpu.py (cap T_ONE_TESTS, 200 s), then python benchmarks/fused_prefill.py at REGS
#      (register splits, default the shipped one; e.g. REGS=112/192,120/192) on 16 x 4,096, 8 x 1,024 (16, 32) and
#      4 x 8,192 (16, 64) (cap T_ONE_BENCH, 200 s), and, with ABLATE (e.g. ABLATE=x,x:idle,x:solve,x:norms), its
#      ablation at 16 x 4,096 at the first REGS split (cap T_ONE_ABLATE, 150 s): within one 600 s call. The same
#      commands ran on the H200 on 2026-12-04 from scratch files; this step as written has not run there yet
#                    -> $OUT/one_kernel_tests.xml, $OUT/fused_prefill_<device>.json, $OUT/one_kernel_ablation.json
#   p. python benchmarks/prefill_fused.py --quick --keep (the planner's fused GDN prefill: pipeline, FLA, fused,
#      the same with the Triton walk and with the Triton prep), starting from a copy of the committed file:
#      --keep keeps its KDA rows only, so merge the new GDN rows into the committed file by hand
#                                                                                  -> $OUT/prefill_fused_<device>.json
# STEPS picks the steps (default ab; c alone in a call of its own: STEPS=c; e.g. STEPS=gp, STEPS=o). Pass LINATTN_COMMIT=<commit>
# to record the commit; T_TESTS / T_BENCH / T_NCU / T_GPU / T_FUSED cap each step (seconds; the device allows 600
# per call).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/fused_walk_install.log 2>&1 || { echo "wheel install rc=$?"; tail -5 /tmp/fused_walk_install.log; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>/tmp/fused_walk_install.log 2>&1 || { echo "linattn install rc=$?"; tail -20 /tmp/fused_walk_install.log; }
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONSAFEPATH=1 LINATTN_RESULTS_DIR="$OUT"
python3 -c "import cutlass, cutlass.cute; print('CuTe DSL', cutlass.__version__)" \
  || echo "WARNING: CuTe DSL does not import from /tmp/site (install the bundle first: see above)"
STEPS=${STEPS:-ab}
if [[ $STEPS == *a* ]]; then
timeout -k 5 "${T_TESTS:-380}" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs \
  tests/cutedsl/test_fused_walk.py tests/gpu/test_fused_walk_gpu.py --junitxml="$OUT/fused_walk_tests.xml" 2>&1 | tail -40
echo "step a rc=${PIPESTATUS[0]}"
fi
if [[ $STEPS == *b* ]]; then
timeout -k 5 "${T_BENCH:-180}" python3 benchmarks/fused_walk.py 2>&1 | grep -v Warning | tail -30
echo "step b rc=${PIPESTATUS[0]}"
fi
if [[ $STEPS == *c* ]]; then
  timeout -k 5 "${T_NCU:-150}" ncu --clock-control none -k "regex:${NCU_KERNELS:-fused_walk|FusedWalk|fused_prep|FusedPrep}" \
    -c 2 --set full python3 benchmarks/fused_walk.py --once --walk "${WALK:-wgmma}" --shapes 16x4096@16/32 \
    >"$OUT/fused_walk_ncu.txt" 2>&1
  echo "step c rc=$?"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Dynamic Shared|Stall|Tensor" \
    "$OUT/fused_walk_ncu.txt" | head -30
fi
if [[ $STEPS == *g* ]]; then
  timeout -k 5 "${T_GPU:-400}" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs ${GPU_TESTS:-tests/gpu} \
    --junitxml="$OUT/gpu_tests.xml" 2>&1 | tail -40
  echo "step g rc=${PIPESTATUS[0]}"
fi
if [[ $STEPS == *o* ]]; then
  timeout -k 5 "${T_ONE_TESTS:-200}" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs \
    tests/cutedsl/test_fused_prefill.py tests/gpu/test_fused_prefill_gpu.py --junitxml="$OUT/one_kernel_tests.xml" 2>&1 | tail -20
  echo "step o (tests) rc=${PIPESTATUS[0]}"
  timeout -k 5 "${T_ONE_BENCH:-200}" python3 benchmarks/fused_prefill.py ${REGS:+--regs "$REGS"} 2>&1 | grep -v Warning | tail -12
  echo "step o (benchmark) rc=${PIPESTATUS[0]}"
  if [ -n "${ABLATE:-}" ]; then
    timeout -k 5 "${T_ONE_ABLATE:-150}" python3 benchmarks/fused_prefill.py --shapes 16x4096@16/32 ${REGS:+--regs "$REGS"} \
      --ablate "$ABLATE" --out "$OUT/one_kernel_ablation.json" 2>&1 | grep -v Warning | tail -12
    echo "step o (ablation) rc=${PIPESTATUS[0]}"
  fi
fi
if [[ $STEPS == *p* ]]; then
  cp benchmarks/results/prefill_fused_*.json "$OUT/" 2>/dev/null
  timeout -k 5 "${T_FUSED:-200}" python3 benchmarks/prefill_fused.py --quick --keep 2>&1 | grep -v Warning | tail -30
  echo "step p rc=${PIPESTATUS[0]}"
fi
