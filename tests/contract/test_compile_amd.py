"""Every launch the AMD backend makes builds for AMD GPUs (gfx942 = MI300X, gfx950 = MI355X) without one.

Issue 31. ``triton-folded`` is the AMD / XPU backend: on an AMD GPU its launchers plan the folded grid
from the device's capabilities. So a subprocess without ``TRITON_INTERPRET`` runs the launcher of every
registry kernel that has the folded layout on every contract case, under the target's profile
(``mi300x``, ``mi355x``: its LDS, CU count and the precisions :func:`~linattn.kernels.triton.prefill.
dot_precision` chooses for it), plus the production shapes (Qwen3-Next GDN, Kimi-Linear KDA: bf16,
K = V = 128; and K = 256, the largest state build), captures each launch
(``registry.capture_launches``; the kernels the launchers start themselves, such as the chunked
prefill's unplanned stages, come with them) and builds it with ``triton.compile`` for
``GPUTarget("hip", arch, 64)`` through to the hsaco. Each build is then held against the target:

- its LDS per workgroup (``metadata.shared``) within the target's (64 KiB on gfx942, 160 KiB on gfx950);
- its scratch per work-item (``.private_segment_fixed_size`` in the AMDGPU metadata of the code object,
  where the register allocator's spills go) zero, except the builds of :data:`SCRATCH_EXCEPTIONS`, each
  with the bytes measured when it was entered and why (more fails, and so does an entry that no longer
  spills).

Compile-only: nothing here has run on an AMD GPU. One test per target; cold (empty Triton cache) each
takes about 30-40 s on one CPU core, seconds on a warm cache. The tables are Triton 3.6.0's (make test runs this file
in its second venv, the H200's Triton 3.6, only; other versions:
only the builds and the LDS are checked).
"""

import json
import os
import sys
import textwrap

import pytest
import subprocess_jobs

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.amd.compiler")

SCRIPT = textwrap.dedent(r'''
    import json, re, sys, torch, triton
    sys.path.insert(0, {here!r})
    from contract_cases import CASES, run_launcher
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from linattn.capabilities import profile
    from linattn.kernels.grid import plan_grid
    from linattn.kernels.triton import registry
    from linattn.kernels.triton.decode import recurrent_decode
    from linattn.kernels.triton.prefill import chunk_prefill
    from linattn.kernels.triton.probe import probe_visits
    arch, caps = {arch!r}, profile({profile!r})
    SUBSET_KEYS = {subset!r}
    bf = torch.bfloat16
    with registry.capture_launches() as launches:
        for entry in registry.KERNELS:
            if "folded" not in entry.layouts:
                continue
            if entry.op == "probe":
                probe_visits(plan_grid(3, 4, 2, caps, "folded"))
                continue
            for case in CASES.get(entry.op, []):
                run_launcher(case, "folded", caps, "cpu")
        # production shapes: Qwen3-Next GDN (H = 16, GVA 2), Kimi-Linear KDA (H = HV = 32), K = V = 128;
        # and K = V = 256 (the largest state build); a few tokens suffice
        for family, H, HV, K in (("gdn", 16, 32, 128), ("kda", 32, 32, 128), ("gdn", 1, 2, 256), ("kda", 2, 2, 256)):
            T = 70
            chunk_prefill(family, q=torch.zeros(T, H, K, dtype=bf), k=torch.zeros(T, H, K, dtype=bf),
                          v=torch.zeros(T, HV, K, dtype=bf),
                          g=torch.zeros(T, HV, *((K,) if family == "kda" else ())), beta=torch.zeros(T, HV),
                          cu_seqlens=torch.tensor([0, 5, T], dtype=torch.int32), state_pool=torch.zeros(2, HV, K, K),
                          state_indices=torch.tensor([1, 0], dtype=torch.int32), initial_state=None, scale=0.1,
                          use_qk_l2norm=True, state_layout="vk", caps=caps, layout="folded")
        for gate, H in (("gdn", 16), ("kda", 32)):
            N, HV, K = 4, 32, 128
            recurrent_decode(gate=gate, q=torch.zeros(N, 1, H, K, dtype=bf), k=torch.zeros(N, 1, H, K, dtype=bf),
                             v=torch.zeros(N, 1, HV, K, dtype=bf),
                             a=torch.zeros(N, 1, HV, *((K,) if gate == "kda" else ()), dtype=bf),
                             b=torch.zeros(N, 1, HV, dtype=bf), A_log=torch.zeros(HV),
                             dt_bias=torch.zeros(HV, *((K,) if gate == "kda" else ())),
                             state_pool=torch.zeros(2, HV, K, K), state_indices=torch.zeros(N, dtype=torch.int32),
                             scale=None, caps=caps, layout="folded")
    seen, out = set(), []
    for l in launches:
        if {full!r}:  # every distinct build
            cx = sorted((k, str(v)) for k, v in l.arguments.items() if not hasattr(v, "data_ptr"))
        else:  # one build per kernel, tile shape, dtype, precision and launch options (SUBSET)
            cx = [(k, str(l.arguments[k])) for k in SUBSET_KEYS if k in l.arguments]
        key = (l.name, repr(cx), repr(sorted(l.options.items())))
        if key in seen:
            continue
        seen.add(key)
        cx = {{k: str(l.arguments[k]) for k in ("KDA", "DT", "K") if k in l.arguments}}
        row = dict(kernel=l.name, **cx, options=l.options,
                   precisions=sorted({{str(l.arguments[k]) for k in ("PREC", "DPREC", "IPREC") if k in l.arguments}}))
        try:
            ck = triton.compile(ASTSource(l.fn, *registry.compile_inputs(l)), target=GPUTarget("hip", arch, 64),
                                options=dict(l.options))
        except Exception as e:  # every failure is reported, not only the first
            out.append(dict(row, error=f"{{type(e).__name__}}: {{e}}"[-600:]))
            continue
        scratch = [int(x) for x in re.findall(r"\.private_segment_fixed_size:\s+(\d+)", ck.asm["amdgcn"])]
        out.append(dict(row, shared=ck.metadata.shared, scratch=max(scratch), hsaco=len(ck.asm["hsaco"])))
    print(json.dumps(dict(limit=caps.shared_memory_per_block, builds=out)))
''')

#: Builds allowed scratch (register spills), per target: ``(kernel, KDA, DT, K)`` -> (the most scratch
#: bytes per work-item measured, Triton 3.6.0, over the launches of that key; why).
SCRATCH_EXCEPTIONS: dict[str, dict[tuple[str, str, str, str], tuple[int, str]]] = {
    "gfx942": {},  # no build spills (the default subset; every contract launch, too, when entered)
    "gfx950": {},
}
SCRATCH_BY_TRITON = {"3.6.0": SCRATCH_EXCEPTIONS}

TARGETS = {"gfx942": "mi300x", "gfx950": "mi355x"}
#: By default one launch is built per kernel and value of these constexprs (tile shape, dtypes, the
#: precisions) and launch options: the LDS and registers of a build follow from them, while the flags
#: left out (pool mode, initial state, l2norm, gate variants...) select code paths of the same tiles.
#: That halves the builds (each target about 30 s cold on one core instead of 35-40). Set
#: ``LINATTN_AMD_BUILDS=all`` to build every distinct launch.
SUBSET_KEYS = ("KDA", "DT", "OP", "K", "V", "BK", "BV", "BLOCK_V", "BLOCK_K", "PREC", "DPREC", "IPREC", "GATE",
               "GROUP", "HALF", "FUSE_O", "TMOUT", "SEGMENT")


def _key(b: dict) -> tuple[str, str, str, str]:
    return (b["kernel"], b.get("KDA", ""), b.get("DT", ""), b.get("K", ""))


# each target's build subprocess, started ahead of its test on another core (tests/subprocess_jobs.py)
for _arch in TARGETS:
    subprocess_jobs.register(
        f"compile-amd-{_arch}",
        [sys.executable, "-c", SCRIPT.format(here=os.path.dirname(os.path.abspath(__file__)), arch=_arch,
                                             profile=TARGETS[_arch], subset=SUBSET_KEYS,
                                             full=os.environ.get("LINATTN_AMD_BUILDS") == "all")],
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, timeout=600)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.subprocess_job(f"compile-amd-{a}"))
                                  for a in sorted(TARGETS)])
def test_every_folded_launch_builds_for_amd_within_lds_and_only_the_listed_builds_spill(arch):
    proc = subprocess_jobs.result(f"compile-amd-{arch}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    built = res["builds"]
    failed = [b for b in built if "error" in b]
    assert not failed, f"launches that do not build for {arch}: {failed}"
    kernels = {b["kernel"] for b in built}
    assert {"_recurrent_decode_kernel", "_silu_and_mul_clamp_kernel", "_probe_kernel", "chunk_intra_kernel",
            "chunk_kda_system_kernel", "chunk_state_kernel", "chunk_output_kernel", "chunk_output_grouped_kernel",
            "chunk_segment_combine_kernel", "chunk_gdn_fused_kernel", "chunk_kda_fused_kernel",
            "chunk_kda_fused_prep_kernel", "chunk_tables_kernel"} <= kernels
    # no CUDA-only precision reaches an AMD build (dot_precision); tf32 only where XF32 exists
    allowed = {"ieee", "bf16x3"} | ({"tf32"} if arch == "gfx942" else set())
    assert {p for b in built for p in b["precisions"]} <= allowed
    over = [b for b in built if b["shared"] > res["limit"]]
    assert not over, f"builds over {arch}'s {res['limit']} B of LDS per workgroup: {over}"
    exceptions = SCRATCH_BY_TRITON.get(triton.__version__, {}).get(arch)
    if exceptions is None:
        return
    spilled = [b for b in built if b["scratch"]]
    unexpected = [b for b in spilled if _key(b) not in exceptions]
    assert not unexpected, f"builds using scratch (spills) on {arch}, triton {triton.__version__}: {unexpected}"
    worse = [(b, exceptions[_key(b)][0]) for b in spilled if b["scratch"] > exceptions[_key(b)][0]]
    assert not worse, f"listed builds spilling more than recorded (build, recorded bytes): {worse}"
    stale = [k for k in exceptions if k not in {_key(b) for b in spilled}]
    assert not stale, f"scratch exceptions on {arch} that no longer spill (remove them): {stale}"
