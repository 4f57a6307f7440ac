"""Every contract-case launch of every registry kernel compiles for the H200 (sm_90) without a GPU.

The interpreter does not compile anything, so this test builds the real GPU binaries on the CPU:
a subprocess without ``TRITON_INTERPRET`` runs each launcher up to its launch (captured by
``registry.capture_launches``) and compiles it with ``triton.compile`` for ``cuda:90``. It also
reports spills: a decode kernel that spills its state tile to local memory is a defect.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r'''
    import json, os, re, subprocess, sys, tempfile, torch, triton
    sys.path.insert(0, {here!r})
    from contract_cases import CASES, run_launcher
    from linattn.capabilities import profile
    from linattn.kernels.triton import registry
    from linattn.kernels.grid import plan_grid
    from linattn.kernels.triton.probe import probe_visits
    seen, out = set(), []
    with registry.capture_launches() as launches:
        for entry in registry.KERNELS:
            for layout in entry.layouts:
                caps = profile("sm90" if layout == "split" else "mi300x")
                if entry.op == "probe":
                    probe_visits(plan_grid(3, 4, 2, caps, layout))
                    continue
                for case in CASES.get(entry.op, []):
                    run_launcher(case, layout, caps, "cpu")
        # the production shapes (Qwen3-Next GDN, Kimi-Linear KDA) with their pinned tile configs
        from linattn.kernels.triton.decode import recurrent_decode
        for gate, H in (("gdn", 16), ("kda", 32)):
            N, HV, K = 4, 32, 128
            bf = torch.bfloat16
            for N in (1, 4096):
                recurrent_decode(gate=gate, q=torch.zeros(N, 1, H, K, dtype=bf), k=torch.zeros(N, 1, H, K, dtype=bf),
                                 v=torch.zeros(N, 1, HV, K, dtype=bf),
                                 a=torch.zeros(N, 1, HV, *((K,) if gate == "kda" else ()), dtype=bf),
                                 b=torch.zeros(N, 1, HV, dtype=bf), A_log=torch.zeros(HV),
                                 dt_bias=torch.zeros(HV, *((K,) if gate == "kda" else ())),
                                 state_pool=torch.zeros(2, HV, K, K), state_indices=torch.zeros(N, dtype=torch.int32),
                                 scale=None, caps=profile("sm90"), layout="split")
    for l in launches:
        key = (l.name, repr(sorted((k, str(v)) for k, v in l.arguments.items() if not hasattr(v, "data_ptr"))))
        if key in seen:
            continue
        seen.add(key)
        ck = registry.compile_launch(l, arch=90)
        cuobj = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = {{}}
        if os.path.exists(cuobj):
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ck.asm["cubin"]); f.flush()
                res = subprocess.run([cuobj, "-res-usage", f.name], capture_output=True, text=True).stdout
            usage = {{k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", res)}}
        out.append(dict(kernel=l.name, **usage))
    print(json.dumps(out))
''')


def test_every_contract_launch_compiles_for_sm90_without_spilling():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(here=here)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    kernels = {b["kernel"] for b in built}
    assert {"_recurrent_decode_kernel", "_silu_and_mul_clamp_kernel", "_probe_kernel"} <= kernels
    spilled = [b for b in built if b.get("LOCAL") or b.get("STACK")]
    assert not spilled, f"kernels using local memory (spills): {spilled}"
    assert max(b.get("REG", 0) for b in built) <= 255
