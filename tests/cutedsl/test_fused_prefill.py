"""CPU checks of the one-kernel GDN prefill (kernels/cutedsl/fused_prefill.py, issue 27).

Compiled for sm_90a without a GPU (the warp specialization read from the PTX: three warpgroups, the
register split, the stage barriers, the prep's mma.sync and the walk's wgmma; ptxas's spill at the
shipped register split); the refusals and the
wrapper's argument checks, which raise before anything is compiled or launched; the switch
(``LINATTN_CUTEDSL_WALK=fused``) and the planner's reason. What it computes is checked on the H200 by
tests/gpu/test_fused_prefill_gpu.py (bitwise the two kernels it fuses).
"""

import os
import re
import subprocess

import pytest
import torch

from linattn.kernels.cutedsl import fused_prefill as fpk
from linattn.kernels.cutedsl import fused_walk as fw


def _key(**kw):
    base = dict(pool=True, has_h0=True, state_dtype="float32", h0_dtype="float32", index_dtype="int32",
                cu_dtype="int32", beta_dtype="float32", l2norm=True, arch="sm_90a", has_init=True)
    return fpk.PrefillKey(**{**base, **kw})


@pytest.fixture(scope="module")
def shipped_build(tmp_path_factory):
    """The shipped build compiled once for sm_90a: ``(its PTX text, the dump folder holding the .ptx file)``."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")
    out = tmp_path_factory.mktemp("one_kernel")
    return fpk.compile_fused_prefill(_key(), dump_dir=str(out)).artifacts.PTX, out


def test_one_kernel_compiles_for_sm90a_as_three_warpgroups(shipped_build):
    ptx, _ = shipped_build
    assert ".target sm_90a" in ptx and ".reqntid 384, 1, 1" in ptx
    prep, walk = fpk.REGS
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{prep};" in ptx and f"setmaxnreg.inc.sync.aligned.u32 \t{walk};" in ptx
    # the stages: full (prep arrives, walk waits: with the next chunk's tiles and without, on the last chunk) and
    # empty (the other way round), all 384 threads; a chunk's norms ready (prep arrives, walk waits; chunk 0 and
    # in the loop) and its tiles ready (the other way round)
    assert len(re.findall(r"bar\.arrive %r\d+, 384;", ptx)) == 2 and len(re.findall(r"bar\.sync \t%r\d+, 384;", ptx)) == 3
    assert len(re.findall(r"bar\.arrive 7, 384;", ptx)) == 2 and len(re.findall(r"bar\.sync \t7, 384;", ptx)) == 2
    assert len(re.findall(r"bar\.arrive 8, 384;", ptx)) == 2 and len(re.findall(r"bar\.sync \t8, 384;", ptx)) == 1
    assert re.search(r"bar\.sync \t5, 128;", ptx) and re.search(r"bar\.sync \t6, 256;", ptx)  # each warpgroup's own
    assert ".local" not in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    # the walk: P1, P2 (8 k blocks each), Vn^T, O^T's Aqk term (4 each), the update (4): 28 wgmma; its tiles
    # (K K^T on the first walk warpgroup, Q K^T on the second: 8 k blocks each, m64n64k16, both operands in
    # shared memory) for chunk 0 and in the loop: 32
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 28 + 32
    # the prep's solve: the doubling on four warps (3 products a tile, bf16 hi / lo): S2 16 x 8 x 16 twice,
    # S3 16 x 16 x 32 twice
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16", ptx)) == 3 * (1 + 1 + 4 + 4)
    # k, q, v (8 row passes each) by cp.async, issued in three places: chunks 0 and 1 before the loop (two
    # unrolled sites), chunk u + 2 in it
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 3 * 24
    for bad in ("tcgen05", "cp.async.bulk", "mbarrier"):
        assert bad not in ptx, bad


def test_the_tma_build_loads_k_and_q_by_tma(tmp_path):
    """``PrefillKey.tma`` (off by default: no faster on the H200): k and q by TMA, v still by cp.async; ptxas
    at the shipped register split: no spill, no C7512."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")
    ptx = fpk.compile_fused_prefill(_key(tma=True), dump_dir=str(tmp_path)).artifacts.PTX
    # issued in the same three places: v by cp.async (8 row passes), k and q two 128-byte-wide boxes a tile (the
    # 128-byte swizzle) from the prep's warp 0; one mbarrier a stage (an expect-tx at each site; waited for by
    # the norms of chunk 0 and in the loop)
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 3 * 8
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)) == 3 * 4
    assert len(re.findall(r"mbarrier\.init\.shared\.b64", ptx)) == 3
    assert len(re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64", ptx)) == 3
    assert len(re.findall(r"mbarrier\.try_wait\.parity\.shared\.b64", ptx)) == 2
    assert ".local" not in ptx and "tcgen05" not in ptx
    _assert_ptxas_clean(next(p for p in tmp_path.iterdir() if p.suffix == ".ptx"), tmp_path, 0)


def _ptxas():
    """The ptxas that Triton ships (the main venv's), or None."""
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.parametrize("l2norm,spill_bytes", [(True, 0), (False, 8)])
def test_the_shipped_register_split_does_not_serialize_the_wgmma(shipped_build, tmp_path, l2norm, spill_bytes):
    """ptxas on the PTX of the shipped register split (``fused_prefill.REGS``, 112 / 192): no "wgmma serialized"
    warning (C7512), and no spill with the l2norm in the kernel (the build the H200 measured), 8 bytes of spill
    stores without it (docs/performance.md, 'The one-kernel prefill, session 17')."""
    folder = shipped_build[1] if l2norm else tmp_path / "build"
    if not l2norm:
        fpk.compile_fused_prefill(_key(l2norm=False), dump_dir=str(folder))
    _assert_ptxas_clean(next(p for p in folder.iterdir() if p.suffix == ".ptx"), tmp_path, spill_bytes)


def _assert_ptxas_clean(ptx, tmp_path, spill_bytes: int) -> None:
    """ptxas (Triton's) on ``ptx``: at most ``spill_bytes`` of spill stores and no "wgmma serialized" (C7512);
    skipped where there is no ptxas or it cannot build the PTX."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas (Triton's NVIDIA backend) in this environment")
    run = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "x.cubin")],
                         capture_output=True, text=True)
    if run.returncode:
        pytest.skip(f"this ptxas cannot build the PTX: {run.stderr.strip().splitlines()[:1]}")
    out = run.stderr
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", out)]
    assert spills and max(spills) <= spill_bytes, out[-2000:]
    assert "C7512" not in out, out[-2000:]


@pytest.mark.parametrize("kw,needle", [
    (dict(family="kda"), "GDN"),
    (dict(K=64), "K = V = 128"),
    (dict(dtype=torch.float16), "bf16"),
    (dict(g_dtype=torch.bfloat16), "fp32"),
    (dict(beta_dtype=torch.float16), "fp32 or bf16 beta"),
    (dict(checkpoints=True), "checkpoint"),
    (dict(device=torch.device("cpu")), "CUDA GPUs"),
])
def test_refusals_name_the_reason(kw, needle):
    why = fpk.fused_refusal(**{**dict(family="gdn", K=128, V=128, dtype=torch.bfloat16), **kw})
    assert needle in why, why


def _args(T=70, H=2, HV=4):
    bf, f32 = torch.bfloat16, torch.float32
    return dict(q=torch.zeros(T, H, 128, dtype=bf), k=torch.zeros(T, H, 128, dtype=bf),
                v=torch.zeros(T, HV, 128, dtype=bf), g=torch.zeros(T, HV, dtype=f32),
                beta=torch.zeros(T, HV, dtype=f32), o=torch.zeros(T, HV, 128, dtype=bf),
                cu_seqlens=torch.tensor([0, 30, T], dtype=torch.int32), state_indices=None,
                has_initial_state=None, h0=None, ht=torch.zeros(2, HV, 128, 128, dtype=f32),
                s0=(0, 0, 0, 0), st=(HV * 128 * 128, 128 * 128, 1, 128), scale=0.1, use_qk_l2norm=True,
                arch="sm_90a")


@pytest.mark.parametrize("change,needle", [
    (dict(q=torch.zeros(70, 2, 64, dtype=torch.bfloat16)), "K = V = 128"),
    (dict(v=torch.zeros(70, 4, 128, dtype=torch.float16)), "v must be torch.bfloat16"),
    (dict(beta=torch.zeros(70, 4, dtype=torch.float16)), "fp32 or bf16 beta"),
    (dict(g=torch.zeros(69, 4, dtype=torch.float32)), "g has shape"),
    (dict(o=torch.zeros(70, 4, 64, dtype=torch.bfloat16)), "o has shape"),
    (dict(o=torch.zeros(128, 70, 4, dtype=torch.bfloat16).permute(1, 2, 0)), "o must be contiguous"),
    (dict(v=torch.zeros(70, 3, 128, dtype=torch.bfloat16), g=torch.zeros(70, 3), beta=torch.zeros(70, 3),
          o=torch.zeros(70, 3, 128, dtype=torch.bfloat16)), "GVA"),
    (dict(state_indices=torch.zeros(2, dtype=torch.int32)), "same pool"),
    (dict(has_initial_state=torch.ones(2, dtype=torch.bool)), "pool mode"),
    (dict(ht=torch.zeros(2, 4, 128, 128, dtype=torch.int32)), "state dtype torch.int32"),
    (dict(ht=torch.zeros(2, 4, 128, 128, dtype=torch.float16)), "state dtype torch.float16"),
    (dict(state_indices=torch.zeros(2, dtype=torch.int32), h0="ht",
          has_initial_state=torch.ones(2, dtype=torch.int32)), "bool or uint8"),
    (dict(cu_seqlens=torch.tensor([0, 30, 70], dtype=torch.int16)), "cu_seqlens must be int32 or int64"),
    (dict(), None),  # meta stand-ins (a recording; every tensor, below) are not placed: not refused for their device
    (dict(regs=(150, 176)), "multiples of 8"),
    (dict(regs=(160, 176)), "<= 504"),
    (dict(regs=(16, 16)), "at least 24"),
    (dict(regs=5), "ints"),
    (dict(regs=("a", "b")), "ints"),
    (dict(), "runs on CUDA tensors; got cpu"),
    (dict(q=torch.zeros(70, 256, dtype=torch.bfloat16)), r"q must be \[T, heads, head dim\]"),
    (dict(v=torch.zeros(70, 512, dtype=torch.bfloat16)), r"v must be \[T, heads, head dim\]"),
    (dict(ht=torch.zeros(2, 4, 64, 64)), "ht must be"),
    (dict(ht=torch.zeros(2, 3, 128, 128)), "ht must be"),
    (dict(ht=torch.zeros(1, 4, 128, 128)), "ht has 1 rows for N = 2"),
    (dict(h0=torch.zeros(2, 4, 128, 64)), "h0 must be"),
    (dict(state_indices=torch.zeros(3, dtype=torch.int32), h0="ht"), r"state_indices must be \[N\] = \[2\]"),
    (dict(state_indices=torch.zeros(2, dtype=torch.int32), h0="ht", has_initial_state=torch.ones(3, dtype=torch.bool)),
     r"has_initial_state must be \[N\]"),
    (dict(cu_seqlens=torch.tensor([[0, 30, 70]], dtype=torch.int32)), r"cu_seqlens must be \[N \+ 1\]"),
])
def test_wrapper_refuses_bad_buffers_before_any_launch(monkeypatch, change, needle):
    compiled = []
    monkeypatch.setattr(fpk, "compile_fused_prefill", lambda key: compiled.append(key) or (lambda *a: None))
    args = {**_args(), **change}
    if args["h0"] == "ht":
        args["h0"] = args["ht"]
    if needle is None:  # accepted: the wrapper goes on to compile (a stub here)
        args.update({n: x.to("meta") for n, x in args.items() if isinstance(x, torch.Tensor)})
        try:
            fpk.cutedsl_fused_prefill(**args)
        except Exception:  # noqa: BLE001 - past the checks (meta tensors have no addresses to launch on)
            pass
        assert compiled, "refused a call whose tensors are all meta stand-ins"
        return
    if "regs" in change:  # the tensors right (meta stand-ins): only the split is wrong
        args.update({n: x.to("meta") for n, x in args.items() if isinstance(x, torch.Tensor)})
    with pytest.raises(ValueError, match=needle):
        fpk.cutedsl_fused_prefill(**args)
    assert not compiled
    if "regs" not in change:  # what run_for_plan reads to fall back to the two kernels
        args.pop("scale"), args.pop("use_qk_l2norm"), args.pop("arch")
        assert re.search(needle, fpk.tensor_refusal(**args))


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("mode", ["pool", "pool_flags", "dense", "dense_h0"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_tensor_refusal_passes_the_planners_calls(layout, mode, state_dtype):
    """What run_for_plan passes (meta stand-ins, as a recording's): pool mode ``h0 is ht`` the pool
    ``[P, HV, V, K]`` / ``[P, HV, K, V]`` with ``state_indices [N]`` (and ``has_initial_state [N]``), dense mode
    ``ht [N, HV, ., .]`` with ``h0`` None or ``[N, HV, ., .]``: nothing refused, so nothing falls back."""
    from linattn.kernels.triton.chunk_state import state_strides

    T, H, HV, N, P, m, bf = 300, 2, 4, 3, 7, "meta", torch.bfloat16
    q = torch.zeros(T, H, 128, dtype=bf, device=m)
    a = dict(q=q, k=q, v=torch.zeros(T, HV, 128, dtype=bf, device=m), g=torch.zeros(T, HV, device=m),
             beta=torch.zeros(T, HV, device=m), o=torch.zeros(T, HV, 128, dtype=bf, device=m),
             cu_seqlens=torch.tensor([0, 100, 250, 300], dtype=torch.int32).to(m))
    if mode.startswith("pool"):
        pool = torch.zeros(P, HV, 128, 128, dtype=state_dtype, device=m)
        flags = torch.ones(N, dtype=torch.uint8, device=m) if mode == "pool_flags" else None
        a.update(state_indices=torch.zeros(N, dtype=torch.int32, device=m), has_initial_state=flags, h0=pool,
                 ht=pool, s0=state_strides(pool, layout), st=state_strides(pool, layout))
    else:
        ht = torch.zeros(N, HV, 128, 128, dtype=state_dtype, device=m)
        h0 = torch.zeros(N, HV, 128, 128, dtype=bf, device=m) if mode == "dense_h0" else None
        a.update(state_indices=None, has_initial_state=None, h0=h0, ht=ht,
                 s0=state_strides(h0, layout) if h0 is not None else (0, 0, 0, 0), st=state_strides(ht, layout))
    assert fpk.tensor_refusal(**a) == ""
    a["ht"] = torch.zeros(N - 1, HV, 128, 128, dtype=state_dtype, device=m)  # and it can refuse: too few rows
    if mode.startswith("pool"):
        a["h0"] = a["ht"]
        a["state_indices"] = torch.zeros(N + 1, dtype=torch.int32, device=m)
    assert fpk.tensor_refusal(**a) != ""


def _planned(monkeypatch, caps="sm90", N=16, HV=32):
    from linattn.capabilities import profile
    from linattn.kernels.triton.prefill import plan as plan_mod

    monkeypatch.setattr(plan_mod, "interpreter_enabled", lambda: False)
    T = N * 64
    q = torch.empty(T, HV // 2, 128, dtype=torch.bfloat16)
    v = torch.empty(T, HV, 128, dtype=torch.bfloat16)
    cu = torch.arange(0, T + 1, 64, dtype=torch.int32)
    return plan_mod.plan_prefill("gdn", q=q, v=v, cu_seqlens=cu, caps=profile(caps), fused=True)


def test_the_switch_asks_for_the_one_kernel_where_the_walk_could_run(monkeypatch):
    import linattn.kernels.cutedsl as cutedsl_pkg

    monkeypatch.setattr(cutedsl_pkg, "importable", lambda: None)
    monkeypatch.setenv(fw.ENV_SWITCH, "fused")
    choice = _planned(monkeypatch).fused_walk
    assert choice.walk == "fused" and "one-kernel" in choice.reason and f"{fw.ENV_SWITCH} forces it" in choice.reason
    choice = _planned(monkeypatch, caps="sm100").fused_walk  # refused there: the Triton walk, with the reason
    assert choice.walk == "triton" and "asks for the CuTe DSL walk, but" in choice.reason
    monkeypatch.delenv(fw.ENV_SWITCH)
    assert _planned(monkeypatch).fused_walk.walk == "wgmma"  # opt-in: the planner's default stays the two kernels


def test_a_refused_call_falls_back_to_the_prep_and_the_wgmma_walk(monkeypatch):
    """``run_for_plan`` returns False where the call's tensors are refused (here: on the CPU), and the
    walk's ``run_for_plan`` then runs the ``wgmma`` build for a plan whose choice is ``fused``."""
    from types import SimpleNamespace as NS

    plan = NS(family="gdn", K=128, V=128, dtype=torch.bfloat16, use_qk_l2norm=True, state_layout="vk",
              has_init_flags=False, fused_walk=fw.WalkChoice("fused", 128, ""), fused_prep=True)
    x = NS(q=torch.zeros(1, 1, 128, dtype=torch.bfloat16), g=torch.zeros(1, 1), beta=torch.zeros(1, 1))
    assert fpk.run_for_plan(plan, x, None, NS(checkpoints=None), 0.1) is False
    seen = []
    monkeypatch.setattr(fw, "walk_refusal", lambda **kw: "")
    monkeypatch.setattr(fw, "cutedsl_fused_walk", lambda **kw: seen.append(kw["mma"]))
    st = NS(h0=None, ht=torch.zeros(1, 1, 128, 128), state_indices=None, has_initial_state=None, checkpoints=None)
    b = NS(fused_tmb=torch.zeros(1, dtype=torch.bfloat16), fused_aqk=None, rk=None, fused_qs=None, o=None)
    x = NS(q=x.q, k=None, v=None, g=x.g, cu_seqlens=None)
    assert fw.run_for_plan(plan, x, b, st) and seen == ["wgmma"]


def test_launch_fused_stages_runs_the_prep_and_the_walk_where_the_one_kernel_refuses(monkeypatch):
    """The fused prefill's launcher with a plan whose walk is ``fused``: the one kernel first; where it
    declines (``run_for_plan`` False: refused tensors, or the Triton prep asked for), the CuTe DSL prep
    and the walk run, in that order, and nothing else."""
    import linattn.kernels.cutedsl as cutedsl_pkg
    from linattn.kernels.cutedsl import fused_prep as fp
    from linattn.kernels.triton import chunk_fused

    monkeypatch.setattr(cutedsl_pkg, "importable", lambda: None)
    monkeypatch.setenv(fw.ENV_SWITCH, "fused")
    plan = _planned(monkeypatch)
    assert plan.fused_walk.walk == "fused" and plan.fused_prep
    for declines in (False, True):
        ran = []
        monkeypatch.setattr(fpk, "run_for_plan", lambda *a: ran.append("one kernel") or not declines)
        monkeypatch.setattr(fp, "run_for_plan", lambda *a: ran.append("prep") or True)
        monkeypatch.setattr(fw, "run_for_plan", lambda *a: ran.append("walk") or True)
        chunk_fused.launch_fused_stages(plan, None, None, None, None, 0.1)
        assert ran == (["one kernel", "prep", "walk"] if declines else ["one kernel"]), ran


def test_the_triton_prep_switch_turns_a_fused_walk_into_the_wgmma_walk(monkeypatch):
    """``LINATTN_CUTEDSL_PREP=0`` keeps the Triton prep; the one kernel holds the CuTe DSL prep, so the plan
    runs the Triton prep and the wgmma walk, and its reason says why (what ``explain`` shows)."""
    import linattn.kernels.cutedsl as cutedsl_pkg

    monkeypatch.setattr(cutedsl_pkg, "importable", lambda: None)
    monkeypatch.setenv(fw.ENV_SWITCH, "fused")
    monkeypatch.setenv("LINATTN_CUTEDSL_PREP", "0")
    plan = _planned(monkeypatch)
    assert not plan.fused_prep and plan.fused_walk.walk == "wgmma"
    assert "keeps the Triton prep, so the two kernels run" in plan.fused_walk.reason, plan.fused_walk.reason
    import linattn

    d = linattn.explain("gdn_prefill", device="sm90", n=16, t=65536, h=16, hv=32, k=128, v=128, dtype="bfloat16")
    (note,) = [v.message for v in d.verdicts if v.backend == "triton-split"]
    assert plan.fused_walk.reason in note and "one-kernel prefill: prep and wgmma walk" not in note, note
    monkeypatch.delenv("LINATTN_CUTEDSL_PREP")
    d = linattn.explain("gdn_prefill", device="sm90", n=16, t=65536, h=16, hv=32, k=128, v=128, dtype="bfloat16")
    (note,) = [v.message for v in d.verdicts if v.backend == "triton-split"]
    assert "one-kernel prefill: prep and wgmma walk in one kernel" in note, note
