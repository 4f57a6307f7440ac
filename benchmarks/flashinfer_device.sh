#!/usr/bin/env bash
# FlashInfer's GDN prefill as a measured baseline on the H200 (issue 18), in one device call after
# the CuTe DSL bundle is in /tmp/site. Three calls back to back (the machine stays warm ~30 s):
#   1) carry [".cute_a"]                command: bash .cute_a/install.sh
#   2) carry [".cute_b"]                command: bash .cute_b/install.sh
#   3) carry [".flashinfer", ".whl"]    command: bash benchmarks/flashinfer_device.sh
# (.cute_a/.cute_b: bash ../shared/device/make-cutedsl-bundle; .flashinfer: bash
# tools/make-flashinfer-bundle; .whl: fla-core and pydantic wheels.)
#
# Steps (each says "step N FAILED: ..." when it fails; the script stays under ~5 minutes):
#   1. linattn, fla-core, pydantic into /tmp/site (from this tree and .whl)
#   2. CuTe DSL present in /tmp/site (else the machine went cold: calls 1 and 2 again; stops here)
#   3. .flashinfer/install.sh: FlashInfer's trimmed tree and apache-tvm-ffi into /tmp/site, and
#      `import flashinfer.gdn_prefill` with its SM90 kernels
#   4. tiny FlashInfer calls against FLA: the one-pass kernel (2 sequences, use_cp=False) and the
#      context-parallel one (1 x 8192, use_cp=True), TP8 heads, full tracebacks on failure
#   5. benchmarks/prefill_long.py --flashinfer on $FI_CASES (default qwen35-tp8,qwen3next-tp1, at most
#      65,536 tokens, --segments 0)     -> $OUT/prefill_long_<device>.json (rows written one by one)
#   6. a summary of the rows written                    (the whole output: $OUT/flashinfer_device.log)
# Environment: FI_CASES, FI_MODES (dense,pool), FI_BUDGET_S (290), LINATTN_COMMIT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/flashinfer_device.log") 2>&1  # the whole log comes back too
tee_pid=$!
trap 'exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null' EXIT  # the log complete before the call returns
BUDGET=${FI_BUDGET_S:-290}
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export LINATTN_RESULTS_DIR="$OUT" TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
left() { echo $((BUDGET - SECONDS)); }
fail() { echo "step $1 FAILED: $2"; }

# -- 1. linattn and the FLA baseline ---------------------------------------------------------------
echo "== step 1: install linattn (+ .whl) into /tmp/site"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/fi_install.log 2>&1 || { fail 1 "wheels from .whl (rc=$?)"; tail -5 /tmp/fi_install.log; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>/tmp/fi_install.log 2>&1 || { fail 1 "linattn (rc=$?)"; tail -10 /tmp/fi_install.log; }
python3 -c "
import torch, triton, linattn, fla
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(),
      '| torch DLPack exchange API:', hasattr(torch.Tensor, '__dlpack_c_exchange_api__'))
" || { fail 1 "linattn / fla / pydantic do not import (carry .whl)"; exit 1; }
# tvm_ffi JIT-builds a torch DLPack addon at import where torch lacks the exchange API: skip that
python3 -c "import torch, sys; sys.exit(0 if hasattr(torch.Tensor, '__dlpack_c_exchange_api__') else 1)" \
  || { export TVM_FFI_DISABLE_TORCH_C_DLPACK=1; echo "torch has no DLPack exchange API: TVM_FFI_DISABLE_TORCH_C_DLPACK=1"; }

# -- 2. CuTe DSL -----------------------------------------------------------------------------------------
echo "== step 2: CuTe DSL in /tmp/site"
python3 -c "import cutlass, cutlass.cute; print('CuTe DSL', cutlass.__version__)" \
  || { fail 2 "CuTe DSL does not import from /tmp/site: the machine went cold; call 1 (.cute_a/install.sh) and call 2 (.cute_b/install.sh) again, then this"; exit 2; }

# -- 3. FlashInfer ------------------------------------------------------------------------------------------
echo "== step 3: FlashInfer into /tmp/site"
if [ -f .flashinfer/install.sh ]; then
  timeout -k 5 90 bash .flashinfer/install.sh || { fail 3 ".flashinfer/install.sh rc=$?"; exit 3; }
elif python3 -c "import flashinfer.gdn_prefill" 2>/dev/null; then
  echo "no .flashinfer carried; FlashInfer already in /tmp/site"
else
  fail 3 "no .flashinfer carried and none in /tmp/site (bash tools/make-flashinfer-bundle; carry .flashinfer)"; exit 3
fi

# -- 4. tiny calls against FLA --------------------------------------------------------------------------------
echo "== step 4: tiny FlashInfer GDN prefill calls against FLA ($(left) s left)"
cat >/tmp/fi_tiny.py <<'PY'
"""FlashInfer chunk_gated_delta_rule against FLA chunk_gated_delta_rule on small TP8-head inputs."""
import os, sys, time, traceback, warnings
import torch
import flashinfer.gdn_prefill as gp
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_op

K = 128
def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))

def check(tag, H, HV, lens, use_cp):
    g_ = torch.Generator(device="cuda").manual_seed(0)
    T, N = sum(lens), len(lens)
    bf = torch.bfloat16
    q = torch.randn(T, H, K, device="cuda", generator=g_).to(bf)
    k = torch.randn(T, H, K, device="cuda", generator=g_).to(bf)
    v = torch.randn(T, HV, K, device="cuda", generator=g_).to(bf)
    g = torch.nn.functional.logsigmoid(torch.randn(T, HV, device="cuda", generator=g_) + 3.0)
    beta = torch.sigmoid(torch.randn(T, HV, device="cuda", generator=g_))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    h0 = 0.1 * torch.randn(N, HV, K, K, device="cuda", generator=g_)  # [N, HV, V, K]
    t0 = time.time()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            o, ht = gp.chunk_gated_delta_rule(q, k, v, g.exp(), beta, scale=K ** -0.5, initial_state=h0,
                                              output_state=torch.empty_like(h0),
                                              output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                              use_cp=use_cp, max_seqlen=max(lens))
            torch.cuda.synchronize()
    except Exception:
        traceback.print_exc()
        print(f"tiny {tag}: FlashInfer FAILED after {time.time() - t0:.1f} s")
        return False
    first = time.time() - t0
    of, htf = fla_op(q[None], k[None], v[None], g[None], beta[None], scale=K ** -0.5,
                     initial_state=h0.transpose(-1, -2).contiguous(), output_final_state=True,
                     use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())
    eo, es = rel(o, of[0]), rel(ht, htf.transpose(-1, -2))
    ok = bool(torch.isfinite(o.float()).all()) and eo < 2e-2 and es < 2e-2
    print(f"tiny {tag}: {'ok' if ok else 'MISMATCH'}  o rel {eo:.2e}  state rel {es:.2e}  first call {first:.1f} s"
          f"  shapes o {tuple(o.shape)} ht {tuple(ht.shape)}" + "".join(f"\n  warning: {w.message}" for w in caught))
    return ok

ok = check("one-pass 2 seqs [300, 1000] H=2 HV=8", 2, 8, [300, 1000], False)
ok = check("context-parallel 1 x 8192 H=2 HV=8", 2, 8, [8192], True) and ok
sys.exit(0 if ok else 1)
PY
timeout -k 5 "$(( $(left) < 110 ? $(left) : 110 ))" python3 /tmp/fi_tiny.py 2>&1 | grep -v "^WARNING" | tail -40
rc4=${PIPESTATUS[0]}
[ "$rc4" = 0 ] || fail 4 "tiny FlashInfer calls rc=$rc4 (124: time cap); the benchmark below records its own reasons"

# -- 5. the benchmark -----------------------------------------------------------------------------------------
cases=${FI_CASES:-qwen35-tp8,qwen3next-tp1}
echo "== step 5: prefill_long.py --flashinfer --cases $cases ($(left) s left)"
if [ "$(left)" -lt 60 ]; then
  fail 5 "under 60 s left of FI_BUDGET_S=$BUDGET; not started"
else
  timeout -k 10 "$(( $(left) - 15 ))" python3 benchmarks/prefill_long.py --flashinfer --flashinfer-modes "${FI_MODES:-dense,pool}" \
    --cases "$cases" --max-tokens 65536 --segments 0 2>&1 | tail -40
  rc5=${PIPESTATUS[0]}
  [ "$rc5" = 0 ] || fail 5 "prefill_long.py rc=$rc5 (124: the time cap; the rows done are written)"
fi

# -- 6. summary -------------------------------------------------------------------------------------------------
echo "== step 6: summary ($SECONDS s in all)"
python3 - "$OUT" <<'PY' || fail 6 "no results file"
import glob, json, sys
paths = sorted(glob.glob(f"{sys.argv[1]}/prefill_long_*.json"))
d = json.load(open(paths[0]))
print(paths[0], "|", *[n[:400] for n in d["notes"] if "FlashInfer" in n])
keys = ("linattn_ms", "fla_ms", "flashinfer_ms", "flashinfer_pool_ms", "x_flashinfer", "x_flashinfer_pool", "flashinfer_cp",
        "flashinfer_first_call_s", "rel_o_flashinfer_vs_fla", "rel_state_flashinfer_vs_fla", "relmax_o_flashinfer_vs_fla",
        "rel_state_flashinfer_pool_vs_linattn", "flashinfer_pool_untouched_rows_equal", "flashinfer_error",
        "flashinfer_pool_error", "flashinfer_warnings")
for r in d["rows"]:
    print(r["case"], r["shape"], {k: round(r[k], 4) if isinstance(r.get(k), float) else r[k] for k in keys if k in r})
PY
ls -la "$OUT"
