"""The chunked-prefill kernels build for the H200 (sm_90) without a GPU, and their shared memory
fits what :func:`prefill_supported` and :func:`prefill_config` promise.

The interpreter compiles nothing, so a subprocess without ``TRITON_INTERPRET`` runs the launcher
on CPU tensors up to each launch (captured by ``registry.capture_launches``) and builds it with
``triton.compile`` for ``cuda:90``. Checked: bf16 at K = V = 128 (the production shapes, state
kernel software-pipelined: at most 116 KiB), the same on a 99 KiB device (sm_120 profile: the
unpipelined config, at most 96 KiB), K = V = 256 (at most 96 KiB), and GDN at GVA group sizes 1
and 4 (its state kernel without the U split or every-second-chunk storage). fp32 builds (ieee dots, for
the 1e-5 tests) are exercised compiled by tests/gpu/test_prefill_gpu.py only.
"""

import json
import os
import sys
import textwrap

import pytest
import subprocess_jobs

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r'''
    import json, sys, torch
    sys.path.insert(0, {here!r})
    from prefill_cases import make_inputs, random_states
    from linattn.capabilities import profile
    from linattn.kernels.triton import registry
    from linattn.kernels.triton.prefill import chunk_prefill
    out, seen = [], {{}}
    for family in ("gdn", "kda"):
        shapes = [(128, "sm90", 4), (128, "sm120", 4), (256, "sm90", 4)]
        if family == "gdn":  # GVA group sizes 1 and 4: no grouped output, so GDN's other state build
            shapes += [(128, "sm90", 2), (128, "sm90", 8)]
        for K, caps, HV in shapes:
            inp = make_inputs(family, [70, 5], H=2, HV=HV, K=K, V=K, dtype=torch.bfloat16)
            pool = random_states(3, HV, K, K)
            with registry.capture_launches() as launches:
                chunk_prefill(family, **inp, state_pool=pool, state_indices=torch.tensor([2, 0]),
                              initial_state=None, scale=0.1, use_qk_l2norm=True, state_layout="vk",
                              caps=profile(caps))
            if K == 128 and caps == "sm90" and HV == 4:  # the segment-parallel state pass's builds
                with registry.capture_launches() as more:
                    chunk_prefill(family, **inp, state_pool=pool, state_indices=torch.tensor([2, 0]),
                                  initial_state=None, scale=0.1, use_qk_l2norm=True, state_layout="vk",
                                  caps=profile(caps), segment_chunks=1)
                launches = launches + more
            for l in launches:
                key = (l.name, repr(sorted((k, str(v)) for k, v in l.arguments.items()
                                           if not hasattr(v, "data_ptr"))), repr(l.options))
                if key not in seen:
                    seen[key] = registry.compile_launch(l, arch=90).metadata.shared
                out.append(dict(family=family, K=K, caps=caps, kernel=l.name, smem=seen[key],
                                stages=l.options.get("num_stages")))
    print(json.dumps(out))
''')


# the build subprocess, started ahead of the test on another core (tests/subprocess_jobs.py); every launch
# through Triton's own binding (LINATTN_FAST_LAUNCH=0), which the capture records
subprocess_jobs.register("compile-prefill-sm90",
                         [sys.executable, "-c", SCRIPT.format(here=os.path.dirname(os.path.abspath(__file__)))],
                         env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
                              "LINATTN_FAST_LAUNCH": "0"}, timeout=900)


@pytest.mark.subprocess_job("compile-prefill-sm90")
def test_prefill_kernels_build_for_sm90_within_the_promised_shared_memory():
    proc = subprocess_jobs.result("compile-prefill-sm90")
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {b["kernel"] for b in built} == {"chunk_intra_kernel", "chunk_state_kernel", "chunk_output_kernel",
                                          "chunk_output_grouped_kernel", "chunk_kda_system_kernel",
                                          "chunk_tables_kernel", "chunk_gdn_gates_kernel",
                                          "chunk_segment_combine_kernel", "segment_tables_kernel"}
    for b in built:
        limit = 116 if (b["K"] == 128 and b["caps"] == "sm90") else 96
        assert b["smem"] <= limit * 1024, b
    state = {(b["family"], b["K"], b["caps"]): b["stages"] for b in built if b["kernel"] == "chunk_state_kernel"}
    assert state[("gdn", 128, "sm90")] == 2 and state[("gdn", 128, "sm120")] == 1
    assert state[("kda", 256, "sm90")] == 1
