"""The value rules' host path on the CPU (issue 31): per-call time with it and without it.

``dispatch/rules/value_rules.py`` evaluates the rules in plain Python from one ``.tolist()`` per tensor
when the tensors are on the CPU and at most ``HOST_MAX_ELEMENTS`` elements; else (and with
``HOST_VALUE_RULES = False``) as torch probes. Rows, each the median of interleaved A/B rounds
(host path on / off, alternating, so the machine's load drifts over both alike):

* ``rules``: ``_run_value_rules`` alone on a ``gdn_decode`` call's validated arguments, batch 1
  and 4 (Qwen3-Next's heads: H=16, HV=32, K=V=128, bf16; A_log and dt_bias ``[HV]`` fp32);
* ``decode``: a whole ``gdn_decode`` call through the dispatcher with kernel launches stubbed
  (``host_overhead_cpu.stubbed_launch``, ``HOST_BENCH_FUSED=0``: the value rules run as on a CPU);
* ``bound``: the state-slot rule alone at n slots (n = 4 .. 1024, ``HOST_MAX_ELEMENTS`` raised so
  the host path runs at every n): where the host form stops being cheaper than the torch probes.

    .venv/bin/python benchmarks/value_rules_host.py --out /tmp/vr_host.json

The canonical rows live in ``benchmarks/results/host_dispatch_cpu.json`` as ``kind:
value_rules_host_<kind>`` (``benchmarks/results/`` holds at most 15 files: merge, do not add one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HOST_BENCH_FUSED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import linattn  # noqa: E402
from linattn.dispatch.rules import value_rules as vr  # noqa: E402
from linattn.dispatch.rules.validate import validate_call, value_rules_of  # noqa: E402


def _loop_us(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def ab(fn, calls: int, rounds: int, bound: int | None = None) -> dict:
    """Median per-call us of ``fn`` with the host path on and off, interleaved rounds."""
    saved = vr.HOST_VALUE_RULES, vr.HOST_MAX_ELEMENTS
    t = {True: [], False: []}
    try:
        if bound is not None:
            vr.HOST_MAX_ELEMENTS = bound
        for host in (True, False):
            vr.HOST_VALUE_RULES = host
            for _ in range(20):
                fn()
        for r in range(rounds):
            for host in ((True, False) if r % 2 == 0 else (False, True)):
                vr.HOST_VALUE_RULES = host
                t[host].append(_loop_us(fn, calls))
    finally:
        vr.HOST_VALUE_RULES, vr.HOST_MAX_ELEMENTS = saved
    on, off = statistics.median(t[True]), statistics.median(t[False])
    return dict(host_us=round(on, 2), torch_us=round(off, 2), saved_us=round(off - on, 2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    import host_overhead_cpu as hoc

    rows = []
    rules = value_rules_of("gdn_decode", check_values=True, check_finite=False)
    for n in (1, 4):
        x = hoc.decode_inputs("gdn", n)
        nargs, _, dims = validate_call("gdn_decode", x, check_values=False)
        rows.append(dict(kind="rules", batch=n, **ab(lambda: vr._run_value_rules(rules, nargs, dims), a.calls, a.rounds)))
        print(rows[-1], flush=True)
    with hoc.stubbed_launch():
        for n in (1, 4):
            x = hoc.decode_inputs("gdn", n)

            def call():
                return linattn.gdn_decode(**x, backend=hoc.BACKEND)
            rows.append(dict(kind="decode", batch=n, fused_checks=hoc.FUSED, **ab(call, a.calls, a.rounds)))
            print(rows[-1], flush=True)
    one = (vr._v_state_indices,)
    for n in (4, 16, 64, 128, 256, 1024):
        args = dict(state_indices=torch.arange(n, dtype=torch.int32), output_state_indices=None)
        dims = dict(p=n, writes_pool=True, device=torch.device("cpu"))
        rows.append(dict(kind="bound", n=n, **ab(lambda: vr._run_value_rules(one, args, dims), a.calls, a.rounds,
                                                  bound=1 << 20)))
        print(rows[-1], flush=True)
    for n, t in ((16, 4), (64, 4)):  # per-token slot tables [N, T]
        args = dict(state_indices=torch.arange(n * t, dtype=torch.int32).reshape(n, t), output_state_indices=None)
        dims = dict(p=n * t, writes_pool=True, device=torch.device("cpu"))
        rows.append(dict(kind="bound", n=n * t, table=[n, t], **ab(lambda: vr._run_value_rules(one, args, dims),
                                                                    a.calls, a.rounds, bound=1 << 20)))
        print(rows[-1], flush=True)
    result = dict(note="median of interleaved A/B rounds on a shared, loaded 2-core machine", cpu_threads=torch.get_num_threads(),
                  HOST_MAX_ELEMENTS=vr.HOST_MAX_ELEMENTS, rows=rows)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
