#!/usr/bin/env bash
# The cutedsl backend on the H200 (device tool), after the CuTe DSL bundle is in /tmp/site
# (/work/shared/ENVIRONMENT.md: call 1 `bash .cute_a/install.sh` with carry [".cute_a"]; call 2, at
# once, carry [".cute_b", ".whl"] and `bash .cute_b/install.sh && bash benchmarks/cutedsl_device.sh`).
#
# Steps (none aborts the others; each has a time cap, the whole run stays under ~7 minutes):
#   a. pytest tests/gpu/test_cutedsl_gpu.py tests/cutedsl            -> $OUT/cutedsl_tests.xml
#   b. linattn check --backend cutedsl --device cuda --json          -> $OUT/cutedsl_check.json
#   c. linattn explain gdn_prefill / kda_prefill on the probed GPU   -> $OUT/cutedsl_explain_{gdn,kda}_prefill.json
#   d. compute-sanitizer memcheck of a small pool/dense cutedsl prefill program (GDN and KDA, fp32
#      and bf16 pools, vk and kv, padding slot, empty sequence, the pool's last row live)
#                                                                    -> $OUT/cutedsl_memcheck.log
#   then, in the benchmarks/_results.py schema, one row per step     -> $OUT/cutedsl_device_<device>.json
#   and one row per conformance case                                 -> $OUT/cutedsl_check_<device>.json
# Eight files in $OUT, flat; the two schema files are the ones benchmarks/results/ keeps (the device
# tag comes from the GPU's name: h200 on an H200). Pass LINATTN_COMMIT=<commit> to record the commit.
# The memcheck summary separates device-memory errors (Invalid
# __global__/__shared__ accesses, misaligned or out-of-range addresses...) from host API errors
# ("Program hit ... on CUDA API call to ...", e.g. cuda-bindings probing cuGetProcAddress_v2 while
# CuTe DSL starts up, which alone make compute-sanitizer exit 99).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${CUTEDSL_DEVICE_BUDGET_S:-420}  # seconds for the whole script (the device allows 600 per call)
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (it is not the installed package)
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export LINATTN_RESULTS_DIR="$OUT"  # benchmarks/_results.py writes the schema files here

cap() {  # cap SECONDS: the time a step may take, never past the script's budget
  local left=$((BUDGET - SECONDS - 10))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
skip_if_late() {  # skip_if_late STEP: true (and says so) when the budget is spent
  if [ "$(cap 1)" -lt 1 ]; then echo "step $1 skipped: time budget (${BUDGET}s) spent"; return 0; fi
  return 1
}

# -- install (wheels from .whl when carried; linattn itself from this tree) ---------------------------
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/cutedsl_install.log 2>&1 || { echo "wheel install rc=$?"; tail -5 /tmp/cutedsl_install.log; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . \
  >>/tmp/cutedsl_install.log 2>&1 || { echo "linattn install rc=$?"; tail -20 /tmp/cutedsl_install.log; }
python3 -c "import linattn, pydantic, torch, triton; print('linattn', linattn.__file__, 'pydantic', pydantic.VERSION, 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  || echo "install: linattn or pydantic does not import (carry .whl: see /work/notes/device-recipe.md)"
python3 -c "import cutlass, cutlass.cute; print('CuTe DSL', cutlass.__version__)" \
  || echo "WARNING: CuTe DSL does not import from /tmp/site: run .cute_a/install.sh then .cute_b/install.sh first (the cutedsl steps below will skip or report 'toolchain')"

# -- a. tests --------------------------------------------------------------------------------------
# The conformance GPU test is deselected here: step b runs the same suite and keeps its JSON.
rc_a=skipped
if ! skip_if_late a; then
  timeout -k 10 "$(cap 200)" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs \
    tests/gpu/test_cutedsl_gpu.py tests/cutedsl \
    --deselect tests/gpu/test_cutedsl_gpu.py::test_conformance_suite_runs_every_case_and_passes_on_this_gpu \
    --junitxml="$OUT/cutedsl_tests.xml" 2>&1 | tail -30
  rc_a=${PIPESTATUS[0]}; [ "$rc_a" = 0 ] || echo "step a (pytest) rc=$rc_a"
fi

# -- b. conformance suite on the GPU ---------------------------------------------------------------------
rc_b=skipped
if ! skip_if_late b; then
  timeout -k 10 "$(cap 150)" python3 -m linattn check --backend cutedsl --device cuda --json >"$OUT/cutedsl_check.json" \
    2>/tmp/cutedsl_check.err
  rc_b=$?; [ "$rc_b" = 0 ] || { echo "step b (linattn check) rc=$rc_b"; tail -5 /tmp/cutedsl_check.err; }
  python3 - "$OUT/cutedsl_check.json" <<'PY' || echo "step b summary rc=$?"
import collections, json, sys
d = json.load(open(sys.argv[1]))
if "error" in d:
    sys.exit(print("check error:", d["error"]))
print("check:", d["status"], "ok" if d["ok"] else "NOT ok", d["notes"] or "")
for b in d["backends"]:
    print(f"  {b['backend']} on {b['device']}: {b['status']} {b['counts']}")
    for op, why in b["availability"].items():
        print(f"    {op}: {'available' if why is None else why}")
    for r in b["results"]:
        if r["status"] == "failed":
            print(f"    FAILED {r['id']}: {r['message'][:300]}")
    skipped = collections.Counter(r["message"][:200] for r in b["results"] if r["status"] == "skipped")
    for msg, n in skipped.items():
        print(f"    skipped {n}: {msg}")
PY
fi

# -- c. decisions on the real device ----------------------------------------------------------------------
rc_c=""
for spec in "gdn_prefill qwen3-next" "kda_prefill kimi-linear"; do
  set -- $spec
  skip_if_late "c-$1" && { rc_c="$rc_c $1=skipped"; continue; }
  timeout -k 5 "$(cap 40)" python3 -m linattn explain "$1" --model "$2" --total-tokens 65536 --seqs 16 --json \
    >"$OUT/cutedsl_explain_${1}.json" 2>/tmp/cutedsl_explain.err
  rc=$?; rc_c="$rc_c $1=$rc"; [ "$rc" = 0 ] || { echo "step c (explain $1) rc=$rc"; tail -3 /tmp/cutedsl_explain.err; }
  python3 - "$OUT/cutedsl_explain_${1}.json" <<'PY' || echo "step c summary rc=$?"
import json, sys
d = json.load(open(sys.argv[1]))
v = {x["backend"]: x for x in d.get("verdicts", [])}
c = v.get("cutedsl", {})
print(f"explain {d.get('op')} on {d.get('device')}: chosen {d.get('chosen')}; cutedsl {c.get('status')} "
      f"{c.get('rank', '')}{c.get('reason', '')} {c.get('message', '')}; triton-split rank {v.get('triton-split', {}).get('rank')}")
PY
done

# -- d. compute-sanitizer memcheck -------------------------------------------------------------------------
PROG=/tmp/cutedsl_memcheck_prog.py
cat >"$PROG" <<'PY'
"""Small cutedsl prefills through the public API (backend forced) for compute-sanitizer memcheck.
GDN and KDA; pool mode with fp32/vk/int32 and bf16/kv/int64; a padding slot (-1), an empty
sequence, the pool's last row live; dense mode. --ref also checks against the float64 reference.
(MEMCHECK_DEVICE=cpu MEMCHECK_BACKEND=torch-ref dry-runs the program itself on a CPU.)"""
import itertools, os, sys
import torch
import linattn
from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref

dev, backend = os.environ.get("MEMCHECK_DEVICE", "cuda"), os.environ.get("MEMCHECK_BACKEND", "cutedsl")
ref = "--ref" in sys.argv
sync = torch.cuda.synchronize if dev != "cpu" else (lambda: None)
H, HV, K, V, P = 2, 4, 128, 128, 8
lens, slots = [1, 63, 0, 130, 65], [P - 1, 3, 0, -1, 5]
torch.manual_seed(0)
bad = calls = 0
for family, kda in (("gdn", False), ("kda", True)):
    fn, rfn = (linattn.kda_prefill, kda_prefill_ref) if kda else (linattn.gdn_prefill, gdn_prefill_ref)
    T = sum(lens)
    q, k = (torch.randn(T, H, K, device=dev).bfloat16() for _ in range(2))
    v = torch.randn(T, HV, V, device=dev).bfloat16()
    g = -(0.02 + 0.2 * torch.rand((T, HV, K) if kda else (T, HV), device=dev))
    beta = torch.rand(T, HV, device=dev) * 0.9 + 0.05
    for sdt, layout, idt in ((torch.float32, "vk", torch.int32), (torch.bfloat16, "kv", torch.int64)):
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=idt, device=dev)
        shape = (P, HV, V, K) if layout == "vk" else (P, HV, K, V)
        pool = (0.3 * torch.randn(shape, device=dev)).to(sdt)
        before = pool.clone()
        o = fn(q, k, v, g, beta, cu, state_pool=pool, state_indices=torch.tensor(slots, dtype=idt, device=dev),
               state_layout=layout, backend=backend)
        sync()
        calls += 1
        live = [s for s in slots if s >= 0]
        others = [p for p in range(P) if p not in live]
        pad = slice(int(cu[3]), int(cu[4]))
        ok = torch.equal(pool[others], before[others]) and bool((o[pad] == 0).all()) and bool(torch.isfinite(o.float()).all())
        msg = ""
        if ref:
            rp = before.double().cpu()
            ro, _ = rfn(*(x.cpu().double() if x.is_floating_point() else x.cpu() for x in (q, k, v, g, beta, cu)),
                        state_pool=rp, state_indices=torch.tensor(slots, dtype=idt), state_layout=layout,
                        compute_dtype=torch.float64)
            eo = float((o.cpu().double() - ro).norm() / ro.norm())
            es = float((pool.cpu().double()[live] - rp[live]).norm() / rp[live].norm())
            ok = ok and eo < 2e-2 and es < 1e-2
            msg = f" o_rel={eo:.2e} state_rel={es:.2e}"
        bad += not ok
        print(f"memcheck-prog: {family} pool {str(sdt)[6:]} {layout} {str(idt)[6:]} {'ok' if ok else 'BAD'}{msg}")
    h0 = 0.3 * torch.randn(len(lens), HV, V, K, device=dev)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
    o, ht = fn(q, k, v, g, beta, cu, initial_state=h0, backend=backend)
    sync()
    calls += 1
    ok = bool(torch.isfinite(o.float()).all() and torch.isfinite(ht).all()) and ht.shape == h0.shape
    bad += not ok
    print(f"memcheck-prog: {family} dense float32 vk int32 {'ok' if ok else 'BAD'}")
print(f"memcheck-prog: done, {calls} calls, {bad} bad")
sys.exit(1 if bad else 0)
PY
rc_d=skipped; rc_d_warm=skipped
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -z "$SAN" ]; then
  echo "step d: compute-sanitizer not found" | tee "$OUT/cutedsl_memcheck.log"
elif ! skip_if_late d; then
  # once without the sanitizer (fills Triton's kernel cache; checks against the reference)
  timeout -k 5 "$(cap 60)" python3 "$PROG" --ref 2>&1 | grep -E "^memcheck-prog|Error|error" | tail -12
  rc_d_warm=${PIPESTATUS[0]}; [ "$rc_d_warm" = 0 ] || echo "step d (warm run) rc=$rc_d_warm"
  if ! skip_if_late d-memcheck; then
    # no caching allocator: each tensor is its own allocation, so an access past a tensor is out of bounds
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$(cap 180)" "$SAN" --tool memcheck --error-exitcode 99 \
      python3 "$PROG" >"$OUT/cutedsl_memcheck.log" 2>&1
    rc_d=$?; [ "$rc_d" = 0 ] || echo "step d (memcheck) rc=$rc_d"
    echo "memcheck: device-memory lines (Invalid __global__/__shared__/__local__): $(grep -cE '^=========[[:space:]]+Invalid __(global|shared|local)__' "$OUT/cutedsl_memcheck.log")," \
         "'Address ... out of bounds' lines: $(grep -cE 'Address 0x[0-9a-f]+ is (out of bounds|misaligned)' "$OUT/cutedsl_memcheck.log")," \
         "host API errors ('Program hit'): $(grep -c 'Program hit' "$OUT/cutedsl_memcheck.log")"
    grep -E "ERROR SUMMARY|^memcheck-prog: done" "$OUT/cutedsl_memcheck.log"
  fi
fi

# -- summary ----------------------------------------------------------------------------------------------
# Two files in the benchmarks/_results.py schema: cutedsl_device_<device>.json (one row per step) and
# cutedsl_check_<device>.json (one row per conformance case), both under $LINATTN_RESULTS_DIR (= $OUT).
python3 - "$OUT" "$rc_a" "$rc_b" "$rc_c" "$rc_d_warm" "$rc_d" "$SECONDS" <<'PY'
import collections, json, os, re, sys, xml.etree.ElementTree as ET
sys.path.insert(0, "benchmarks")
from _results import results_path, write_results
out, rc_a, rc_b, rc_c, rc_warm, rc_d, secs = sys.argv[1:]
rows = []
row = {"step": "a_pytest", "what": "pytest tests/gpu/test_cutedsl_gpu.py tests/cutedsl", "exit_code": rc_a}
p = os.path.join(out, "cutedsl_tests.xml")
if os.path.exists(p):
    counts, bad = collections.Counter(), []
    for tc in ET.parse(p).getroot().iter("testcase"):
        st = next((t for t in ("failure", "error", "skipped") if tc.find(t) is not None), "passed")
        counts[st] += 1
        if st in ("failure", "error"):
            el = tc.find(st)
            bad.append({"test": f"{tc.get('classname')}::{tc.get('name')}", "message": (el.get("message") or "")[:400]})
    row.update(counts=dict(counts), failed=bad)
rows.append(row)
row = {"step": "b_check", "what": "linattn check --backend cutedsl --device cuda (cutedsl_check json)", "exit_code": rc_b}
try:
    d = json.load(open(os.path.join(out, "cutedsl_check.json")))
    b = d["backends"][0] if d.get("backends") else {}
    row.update(status=d.get("status"), ok=d.get("ok"), counts=b.get("counts"), availability=b.get("availability"),
               error=d.get("error"), failed=[{"id": r["id"], "message": r["message"][:300]}
                                             for r in b.get("results", []) if r["status"] == "failed"])
    write_results(results_path("cutedsl_check"), b.get("results", []),
                  [f"linattn check of backend {b.get('backend')} ({b.get('plugin')}, {b.get('distribution')} "
                   f"{b.get('version')}) on the GPU: status {d.get('status')}, counts {json.dumps(b.get('counts'))}, "
                   f"availability {json.dumps(b.get('availability'))}.",
                   "One row per conformance case (accuracy and pool cases against the float64 reference, negative "
                   "cases refused with a reason); errors = the relative errors measured.", *d.get("notes", [])],
                  command="python3 -m linattn check --backend cutedsl --device cuda --json "
                          "(step b of bash benchmarks/cutedsl_device.sh)")
except Exception as e:  # noqa: BLE001
    row["error"] = f"{type(e).__name__}: {e}"
rows.append(row)
rc_by_op = dict(x.split("=", 1) for x in rc_c.split())
for op in ("gdn_prefill", "kda_prefill"):
    row = {"step": "c_explain", "op": op, "exit_code": rc_by_op.get(op, "skipped")}
    try:
        d = json.load(open(os.path.join(out, f"cutedsl_explain_{op}.json")))
        row.update(device=d["device"], chosen=d["chosen"],
                   verdicts={v["backend"]: {k: v[k] for k in ("status", "rank", "reason", "message") if k in v}
                             for v in d["verdicts"]})
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"
    rows.append(row)
row = {"step": "d_memcheck", "warm_run_exit_code": rc_warm, "exit_code": rc_d}
p = os.path.join(out, "cutedsl_memcheck.log")
if os.path.exists(p):
    lines = open(p, errors="replace").read().splitlines()
    device_errs, other, host = [], [], collections.Counter()
    device_kind = re.compile(r"(Invalid |Misaligned|Out-of-range|Warp |Lane |Illegal|Hardware exception|"
                             r"Uninitialized|Device-side assert|Barrier error|Malloc/Free error|Leaked)")
    for i, line in enumerate(lines):
        m = re.match(r"^========= (\S.*)$", line)  # a record (continuation lines are indented further)
        if not m:
            continue
        rec = m.group(1)
        h = re.match(r"Program hit (\S+) \(error \d+\).*? on CUDA API call to (\S+?)\.?$", rec)
        if h:
            host[f"{h.group(1)} in {h.group(2)}"] += 1
        elif rec.startswith("Program hit"):
            host[rec[:120]] += 1
        elif device_kind.match(rec):
            ctx = [l.strip("= ").strip() for l in lines[i + 1:i + 6] if l.startswith("=========  ")]
            device_errs.append(" | ".join([rec, *ctx[:4]])[:400])
        elif not rec.startswith(("ERROR SUMMARY", "COMPUTE-SANITIZER")):
            other.append(rec[:200])
    summary = [l for l in lines if "ERROR SUMMARY" in l]
    row.update(
        command="PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 99 "
                "python3 /tmp/cutedsl_memcheck_prog.py (written by this script)",
        device_memory_errors=len(device_errs), device_memory_first=device_errs[:10],
        host_api_errors=sum(host.values()), host_api_error_kinds=dict(host), other_records=other[:10],
        error_summary=summary[-1] if summary else None,
        program=[l for l in lines if l.startswith("memcheck-prog:")],
        verdict=("not run" if rc_d == "skipped" else "clean" if rc_d == "0" else
                 "no device-memory error; exit 99 from host API errors only" if rc_d == "99" and not device_errs
                 and host else "device-memory errors" if device_errs else f"see log (exit {rc_d})"))
rows.append(row)
write_results(results_path("cutedsl_device"), rows,
              [f"The cutedsl backend on this GPU in one device call ({secs} s): a. its GPU tests, b. the conformance "
               "suite, c. the dispatcher's decisions, d. compute-sanitizer memcheck of a small pool/dense cutedsl "
               "prefill program. One row per step (exit_code: the step's; 'skipped' when the time budget ran out)."],
              command="bash benchmarks/cutedsl_device.sh")
print("summary:", json.dumps({r["step"] + (":" + r["op"] if "op" in r else ""):
                              {k: r.get(k) for k in ("exit_code", "counts", "status", "chosen", "verdict") if k in r}
                              for r in rows}))
PY
ls "$OUT"
