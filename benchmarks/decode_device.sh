#!/bin/bash
# One call on the H200 (device tool): install, then contract tests compiled, GPU field cases,
# compute-sanitizer memcheck (F22), tile sweep and the decode benchmark; JSON under $OUT.
# Usage (device tool, carry [".whl"]):  bash benchmarks/decode_device.sh [all|final|bench|tests|tune]
# final = contract + GPU tests + placement experiment + benchmark (no sanitizer, no tuning sweep)
# The recipe is written up in /work/notes/device-recipe.md.
set -u
MODE=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never import the repo root's linattn/ (it is not the installed package)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 4; }
export PYTHONPATH=/tmp/site
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
  python3 benchmarks/decode.py --tune --out "$OUT/tune.json" 2>&1 | grep -v "^  (graph"
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ] || [ "$MODE" = final ]; then
  python3 benchmarks/decode.py --explore --out "$OUT/bench.json" 2>&1 | grep -v "^  (graph"
fi
python3 - "$OUT" "$MODE" <<'PY'
import json, os, sys, glob, xml.etree.ElementTree as ET
out, mode = sys.argv[1], sys.argv[2]
res = {"command": f"bash benchmarks/decode_device.sh {mode}", "tests": {}}
for x in glob.glob(os.path.join(out, "*.xml")):
    cases = []
    for tc in ET.parse(x).getroot().iter("testcase"):
        st = "passed"
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                st = tag if tag != "failure" else "failed"
                msg = (el.get("message") or "")[:300]
                break
        cases.append(dict(test=tc.get("name"), file=tc.get("classname"), time_s=float(tc.get("time", 0)), outcome=st,
                          **({"message": msg} if st != "passed" else {})))
    res["tests"][os.path.basename(x)] = dict(passed=sum(c["outcome"] == "passed" for c in cases),
                                             total=len(cases), cases=cases)
m = os.path.join(out, "memcheck.log")
if os.path.exists(m):
    lines = open(m).read().splitlines()
    res["memcheck_F22"] = [l for l in lines if "ERROR SUMMARY" in l or "sanitize:" in l or "Invalid" in l][:20]
for j in ("tune.json", "bench.json"):
    p = os.path.join(out, j)
    if os.path.exists(p):
        res[j[:-5]] = json.load(open(p))
json.dump(res, open(os.path.join(out, f"h200_{mode}.json"), "w"), indent=1)
print("summary:", {k: (v["passed"], v["total"]) for k, v in res["tests"].items()})
PY
