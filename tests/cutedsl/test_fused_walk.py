"""CPU checks of the CuTe DSL fused GDN walk (kernels/cutedsl/fused_walk.py, issue 27).

Compiled for sm_90a without a GPU (the instruction mix read from the PTX); the refusals and the
wrapper's argument checks, which raise before anything is compiled or launched; the opt-in switch.
What it computes is checked on the H200 by tests/gpu/test_fused_walk_gpu.py.
"""

import itertools
import re

import pytest
import torch

from linattn.kernels.cutedsl import fused_walk as fw

MMA = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32"
# a warpgroup MMA with A from registers (four 32-bit registers: eight bf16) and B by descriptor;
# groups: N, B transposed (MN-major)
WGMMA_RS = (r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16 \{[^}]*\}, "
            r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p, 1,\s*1, (\d);")


def _compile(tmp_path, **kw):
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")
    key = fw.WalkKey(**{**dict(K=128, V=128, BV=128, pool=True, has_h0=True, state_dtype="float32",
                               h0_dtype="float32", index_dtype="int32", cu_dtype="int32", arch="sm_90a",
                               has_init=True), **kw})
    return fw.compile_walk(key, dump_dir=str(tmp_path)).artifacts.PTX


def test_pool_walk_compiles_for_sm90a_with_warp_mma_and_cp_async(tmp_path):
    ptx = _compile(tmp_path)
    assert ".target sm_90a" in ptx
    # per warp and chunk (m16n8k16 each): P1, P2 (16 x 64 x 128: 64 each), Vn^T and O^T's Aqk term
    # (16 x 64 x 64: 32 each), the state update (16 x 128 x 64: 64)
    assert len(re.findall(MMA, ptx)) == 256
    assert ".reqntid 256, 1, 1" in ptx  # 8 warps: BV = 128
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx  # k as the update's B operand
    # two load_chunk bodies (prologue, loop) of k, q (4 row passes each), v (4), Tb, Aqk (2 each)
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 32
    assert re.search(r"ld\.global(\.\w+)*\.[bus]8\b", ptx), "the has_initial_state byte is read"
    # the gate factors by warp shuffle scans (prefix up, suffix down over two halves; min of sq)
    assert len(re.findall(r"shfl\.sync\.up", ptx)) == 10 and len(re.findall(r"shfl\.sync\.bfly", ptx)) == 5
    assert len(re.findall(r"\bbar\.sync\b", ptx)) == 3  # per chunk: loads landed, O^T staged, stage free
    for bad in ("wgmma", "tcgen05", "cp.async.bulk"):
        assert bad not in ptx, bad


def test_dense_walk_with_bf16_state_half_value_block_and_serial_factors_compiles(tmp_path):
    ptx = _compile(tmp_path, BV=64, pool=False, has_h0=False, state_dtype="bfloat16", h0_dtype="bfloat16",
                   index_dtype="int64", cu_dtype="int64", has_init=False, warp_factors=False)
    assert ".reqntid 128, 1, 1" in ptx
    assert len(re.findall(MMA, ptx)) == 256
    assert "shfl.sync.up" not in ptx and len(re.findall(r"\bbar\.sync\b", ptx)) == 4
    assert not re.search(r"ld\.global(\.\w+)*\.[bus]8\b", ptx)


def test_wgmma_pool_walk_compiles_for_sm90a_with_register_a_warpgroup_mmas(tmp_path):
    ptx = _compile(tmp_path, mma="wgmma")
    assert ".target sm_90a" in ptx
    assert ".reqntid 256, 1, 1" in ptx  # two warpgroups at BV = 128
    # per warpgroup and chunk, all with the A operand from registers: P1, P2 (m64n64, 8 k blocks each),
    # Vn^T and O^T's Aqk term (m64n64, 4 each), B K-major; the update (m64n128, 4), B = k MN-major
    assert sorted(re.findall(WGMMA_RS, ptx)) == [("128", "1")] * 4 + [("64", "0")] * 24
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 28  # no other form (no A from shared memory)
    # three groups per chunk (P1 and P2; Vn^T; O^T, then the update committed apart and awaited last)
    assert len(re.findall(r"wgmma\.fence", ptx)) == 3 and len(re.findall(r"wgmma\.commit_group", ptx)) == 4
    assert re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d)", ptx) == ["0", "0", "1", "0"]
    assert "fence.proxy.async.shared::cta" in ptx  # cp.async writes made visible to wgmma's reads
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 32  # 16-byte copies into swizzled tiles
    assert len(re.findall(r"\bbar\.sync\b", ptx)) == 3
    # v^T into X's accumulator layout and O^T back over it: 8 x 8 transposing loads and stores, four a thread
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)) == 4
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)) == 4
    for bad in ("mma.sync", "tcgen05", "cp.async.bulk"):
        assert bad not in ptx, bad
    # the order within a chunk: the async-proxy fence before the barrier that publishes the tiles; each
    # group fenced before its MMAs and awaited before its registers are read; the update (m64n128)
    # committed apart, O^T staged to shared memory while it runs (wait 1), then awaited (wait 0)
    assert _wgmma_order(ptx) == [
        "proxy fence", "bar", "fence", "mma n64 x16", "commit", "wait 0", "fence", "mma n64 x4", "commit", "wait 0",
        "fence", "mma n64 x4", "commit", "mma n128 x4", "commit", "wait 1", "st.shared", "wait 0", "bar x2"]


def _wgmma_order(ptx: str) -> list:
    """The walk's synchronisation and MMA issue order from the last async-proxy fence on (one PTX
    instruction per line), runs of one kind counted (``x n``); shared-memory stores shown, uncounted,
    only after the first MMA group's fence."""
    kinds = {"proxy fence": r"fence\.proxy\.async\.shared::cta", "bar": r"\bbar\.sync\b", "fence": r"wgmma\.fence",
             "mma n": r"wgmma\.mma_async\S*m64n(\d+)", "commit": r"wgmma\.commit_group",
             "wait ": r"wgmma\.wait_group\.sync\.aligned\s+(\d)", "st.shared": r"\bst\.shared|\bstmatrix"}
    events = []
    for line in ptx.splitlines():
        for name, rx in kinds.items():
            m = re.search(rx, line)
            if m:
                events.append(name + "".join(m.groups()))
                break
    events = events[len(events) - 1 - events[::-1].index("proxy fence"):]
    first = events.index("fence")
    events = [e for i, e in enumerate(events) if e != "st.shared" or i > first]
    runs = [(e, len(list(g))) for e, g in itertools.groupby(events)]
    return [e if n == 1 or e == "st.shared" else f"{e} x{n}" for e, n in runs]


def test_wgmma_dense_walk_with_bf16_state_and_one_warpgroup_compiles(tmp_path):
    ptx = _compile(tmp_path, mma="wgmma", BV=64, pool=False, has_h0=False, state_dtype="bfloat16",
                   h0_dtype="bfloat16", index_dtype="int64", cu_dtype="int64", has_init=False)
    assert ".reqntid 128, 1, 1" in ptx
    assert len(re.findall(WGMMA_RS, ptx)) == 28
    assert not re.search(r"ld\.global(\.\w+)*\.[bus]8\b", ptx)


@pytest.mark.parametrize("kw,needle", [
    (dict(family="kda"), "GDN's"),
    (dict(K=64), "K = V = 128"),
    (dict(V=256), "K = V = 128"),
    (dict(dtype=torch.float16), "bf16 q/k/v"),
    (dict(buf_dtype=torch.float32), "bf16 prep buffers"),
    (dict(g_dtype=torch.bfloat16), "fp32 gates"),
    (dict(chunk=32), "chunks of 64"),
    (dict(checkpoints=True), "checkpoints"),
    (dict(device=torch.device("cpu")), "CUDA GPUs"),
])
def test_refusals_name_the_reason(kw, needle):
    args = {**dict(family="gdn", K=128, V=128, dtype=torch.bfloat16), **kw}
    why = fw.walk_refusal(**args)
    assert needle in why


def test_accepts_its_scope_where_the_dsl_imports():
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    assert fw.walk_refusal(family="gdn", K=128, V=128, dtype=torch.bfloat16, buf_dtype=torch.bfloat16) == ""


def _args(T=70, N=2, H=2, HV=4, pool=True):
    bf, f32 = torch.bfloat16, torch.float32
    a = dict(q=torch.zeros(T, H, 128, dtype=bf), k=torch.zeros(T, H, 128, dtype=bf),
             v=torch.zeros(T, HV, 128, dtype=bf), g=torch.zeros(T, HV, dtype=f32),
             tmb=torch.zeros(T, HV, 64, dtype=bf), aqk=torch.zeros(T, HV, 64, dtype=bf),
             rk=torch.zeros(T, HV, dtype=f32), qs=torch.zeros(T, HV, 2, dtype=f32),
             o=torch.zeros(T, HV, 128, dtype=bf), cu_seqlens=torch.tensor([0, 30, T], dtype=torch.int32))
    pool_t = torch.zeros(3, HV, 128, 128)
    a.update(state_indices=torch.tensor([2, -1], dtype=torch.int32) if pool else None, has_initial_state=None,
             h0=pool_t if pool else None, ht=pool_t, s0=(0, 0, 0, 0), st=(0, 0, 0, 0))
    st = pool_t.stride()
    a["st"] = (st[0], st[1], st[3], st[2])
    if pool:
        a["s0"] = a["st"]
    return a


@pytest.mark.parametrize("change,needle", [
    (dict(q=torch.zeros(70, 2, 64, dtype=torch.bfloat16)), "K = V = 128"),
    (dict(q=torch.zeros(70, 2, 128, dtype=torch.float16)), "bf16 q/k/v"),
    (dict(tmb=torch.zeros(70, 4, 64, dtype=torch.float32)), "bf16 prep buffers"),
    (dict(aqk=torch.zeros(70, 4, 32, dtype=torch.bfloat16)), "aqk has shape"),
    (dict(qs=torch.zeros(70, 4, dtype=torch.float32)), "qs has shape"),
    (dict(g=torch.zeros(70, 4, dtype=torch.bfloat16)), "g must be"),
    (dict(o=torch.zeros(70, 4, 128, dtype=torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)),
     "o must be contiguous"),
    (dict(ht=torch.zeros(3, 4, 128, 128, dtype=torch.float16)), "state dtype"),
    (dict(h0=torch.zeros(3, 4, 128, 128)), "same pool"),
    (dict(bv=32), "bv 32"),
    (dict(mma="wmma"), "mma 'wmma'"),
])
def test_wrapper_refuses_bad_buffers_before_any_launch(change, needle):
    a = {**_args(), **change}
    with pytest.raises(ValueError, match=needle):
        fw.cutedsl_fused_walk(**a)


def test_wrapper_refuses_has_initial_state_in_dense_mode():
    a = _args(pool=False)
    a["has_initial_state"] = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="for pool mode"):
        fw.cutedsl_fused_walk(**a)


def test_the_switch_names_a_walk_or_the_planners_choice(monkeypatch):
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    assert fw.switch_value() == "" and not fw.enabled() and fw.variant() == ""
    for raw, walk in (("", ""), ("0", "triton"), ("triton", "triton"), ("1", "sync"), ("sync", "sync"), ("wgmma", "wgmma")):
        monkeypatch.setenv(fw.ENV_SWITCH, raw)
        assert fw.switch_value() == walk, raw
        assert fw.variant() == (walk if walk in ("sync", "wgmma") else ""), raw
    for bad in ("true", "WGMMA", "mma"):
        with pytest.raises(ValueError, match="allowed"):
            fw.switch_value(bad)


# -- the planner's walk (prefill.plan_walk, fused_walk.choose_walk) ------------------------------------

def _planned(monkeypatch, family="gdn", dtype=torch.bfloat16, caps="sm90", N=16, HV=32, K=128, **kw):
    """The fused plan of a call (fused=True) on a capabilities profile, compiled (not interpreted) buffers."""
    from linattn.capabilities import profile
    from linattn.kernels.triton.prefill import plan as plan_mod

    monkeypatch.setattr(plan_mod, "interpreter_enabled", lambda: False)  # bf16 prep buffers, as compiled
    T = N * 64
    q = torch.empty(T, HV // 2, K, dtype=dtype)
    v = torch.empty(T, HV, 128, dtype=dtype)
    cu = torch.arange(0, T + 1, 64, dtype=torch.int32)
    return plan_mod.plan_prefill(family, q=q, v=v, cu_seqlens=cu, caps=profile(caps), fused=True, **kw)


@pytest.fixture
def dsl(monkeypatch):
    """CuTe DSL importable (or not: ``dsl("ImportError: ...")``), whatever this machine has; the switch unset."""
    import linattn.kernels.cutedsl as cutedsl_pkg

    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)

    def set_error(err=None):
        monkeypatch.setattr(cutedsl_pkg, "importable", lambda: err)
    set_error()
    return set_error


def test_the_planner_picks_the_wgmma_walk_on_sm90_where_cutedsl_imports(monkeypatch, dsl):
    plan = _planned(monkeypatch)
    assert plan.fused is not None and plan.fused_walk[:2] == ("wgmma", 128)
    assert "warpgroup" in plan.fused_walk.reason and "LINATTN_CUTEDSL_WALK=0" in plan.fused_walk.reason


def test_the_wgmma_walk_takes_bv_64_where_its_bv_128_grid_leaves_sms_idle(monkeypatch, dsl):
    """132 SMs (the sm90 profile): 1 x 8 x 1 CTAs at BV 128 -> 64; 16 x 32 -> 128; the rule at its edge."""
    assert _planned(monkeypatch, N=1, HV=8).fused_walk[:2] == ("wgmma", 64)
    assert _planned(monkeypatch, N=16, HV=32).fused_walk[:2] == ("wgmma", 128)
    assert fw.walk_block_v("wgmma", 131, 1, 128, 132) == 64 and fw.walk_block_v("wgmma", 132, 1, 128, 132) == 128
    assert fw.walk_block_v("sync", 1, 8, 128, 132) == 128  # the mma.sync build stays at BV 128 (measured)


@pytest.mark.parametrize("case,needle", [
    (dict(caps="sm100"), "sm_100"),
    (dict(caps="mi300x"), "NVIDIA CUDA"),
    (dict(family="kda"), "GDN's"),
    (dict(dtype=torch.float32), "bf16 q/k/v"),
    (dict(dtype=torch.float16), "bf16 q/k/v"),
    (dict(K=64), "K = V = 128"),
])
def test_the_planner_keeps_the_triton_walk_outside_the_walks_scope(monkeypatch, dsl, case, needle):
    plan = _planned(monkeypatch, **case)
    assert plan.fused is not None and plan.fused_walk.walk == "triton" and plan.fused_walk.block_v == 0
    assert needle in plan.fused_walk.reason, plan.fused_walk.reason


def test_the_planner_keeps_the_triton_walk_where_cutedsl_does_not_import(monkeypatch, dsl):
    dsl("ImportError: no module named cutlass")
    plan = _planned(monkeypatch)
    assert plan.fused_walk.walk == "triton" and "does not import: ImportError" in plan.fused_walk.reason


def test_the_planner_keeps_the_triton_walk_with_state_checkpoints(monkeypatch, dsl):
    assert fw.choose_walk(family="gdn", K=128, V=128, dtype=torch.bfloat16, caps=_sm90(), N=16, HV=32,
                          checkpoints=True).walk == "triton"
    assert fw.choose_walk(family="gdn", K=128, V=128, dtype=torch.bfloat16, caps=_sm90(), N=16, HV=32,
                          buf_dtype=torch.float32).walk == "triton"  # the interpreter's fp32 prep buffers


def _sm90():
    from linattn.capabilities import profile

    return profile("sm90")


@pytest.mark.parametrize("value,walk", [("0", "triton"), ("triton", "triton"), ("1", "sync"), ("wgmma", "wgmma")])
def test_the_switch_forces_a_walk(monkeypatch, dsl, value, walk):
    monkeypatch.setenv(fw.ENV_SWITCH, value)
    choice = _planned(monkeypatch, N=1, HV=8).fused_walk
    assert choice.walk == walk and f"{fw.ENV_SWITCH} forces it" in choice.reason, choice.reason
    assert ("the planner never picks" in choice.reason) == (walk == "sync")
    assert choice.block_v == {"triton": 0, "sync": 128, "wgmma": 64}[walk]


def test_the_switch_asks_and_does_not_force_where_the_walk_cannot_run(monkeypatch, dsl):
    monkeypatch.setenv(fw.ENV_SWITCH, "wgmma")
    choice = _planned(monkeypatch, caps="sm100").fused_walk
    assert choice.walk == "triton" and "asks for the CuTe DSL walk, but" in choice.reason


def test_a_switch_value_not_allowed_is_refused_when_planning(monkeypatch, dsl):
    monkeypatch.setenv(fw.ENV_SWITCH, "WGMMA")
    with pytest.raises(ValueError, match=r"LINATTN_CUTEDSL_WALK='WGMMA'; allowed: unset .*'wgmma'"):
        _planned(monkeypatch)
    monkeypatch.setenv(fw.ENV_SWITCH, "0")  # set right, a call plans again: no plan kept the bad value
    assert _planned(monkeypatch).fused_walk.walk == "triton"


def test_explain_names_the_walk_of_the_fused_prefill(dsl):
    import linattn

    d = linattn.explain("gdn_prefill", device="sm90", n=16, t=65536, h=16, hv=32, k=128, v=128, dtype="bfloat16")
    (note,) = [v.message for v in d.verdicts if v.backend == "triton-split"]
    assert "walk: the CuTe DSL walk on warpgroup MMAs (wgmma), BV 128" in note, note


def test_a_bad_switch_value_is_a_config_error_that_explain_raises(monkeypatch, dsl):
    """As every malformed LINATTN_* setting (F48): planning the call raises ConfigError naming the
    variable (not a silent default), and explain refuses it before planning (the CLI: exit 2)."""
    import linattn
    from linattn.dispatch.env import ConfigError

    monkeypatch.setenv(fw.ENV_SWITCH, "on")
    with pytest.raises(ConfigError, match="LINATTN_CUTEDSL_WALK='on'"):
        _planned(monkeypatch)
    with pytest.raises(ConfigError, match="LINATTN_CUTEDSL_WALK='on'"):
        linattn.explain("gdn_prefill", device="sm90", n=16, t=65536, h=16, hv=32, k=128, v=128, dtype="bfloat16")
    monkeypatch.setenv(fw.ENV_SWITCH, "  ")  # blank: unset
    assert fw.switch_value() == ""


# -- the walk as a replay step (WalkStep) --------------------------------------------------------------

def test_a_walk_step_passes_each_calls_addresses_and_strides_whatever_an_earlier_call_passed(monkeypatch):
    """A compiled function that is not CuTe DSL's executor (a stub here, no GPU) is called with each
    call's CuTe pointers and stride integers in the compiled walk's argument order, whatever an
    earlier call passed; a q whose base is not 16-byte aligned is copied first."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    seen = []

    def fn(*a):
        seen.append(([p._pointer for p in a[:14]], [int(x) for x in a[14:22]], len(a)))  # the address it holds
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 0, raising=False)
    key = fw.WalkKey(128, 128, 128, True, True, "float32", "float32", "int32", "int32", "sm_90a", True, mma="wgmma")
    step = fw.WalkStep(fn, key, torch.device("cpu", 0), (1, 2, 3, 4), (1, 2, 3, 4), 2, 4, 2)
    bf = torch.bfloat16

    def call_args(wide: bool):
        q = torch.zeros(70, 4 if wide else 2, 128, dtype=bf)[:, :2]
        v, g = torch.zeros(70, 4, 128, dtype=bf), torch.zeros(70, 4)
        small = [torch.zeros(3, dtype=torch.int32) for _ in range(3)]
        return (q, q, v, g, 4096, 8192, 12288, 16384, torch.zeros(70, 4, 128, dtype=bf), *small, torch.zeros(2), 2**20)
    a, b = call_args(False), call_args(True)
    for args in (a, a, b, a):
        step(args)
    for (addrs, strides, n), args in zip(seen, (a, a, b, a)):
        want = [x if isinstance(x, int) else x.data_ptr() for x in args]
        assert addrs == want and n == 14 + 8 + 11 + 1
        q, v, g = args[0], args[2], args[3]
        assert strides == [*q.stride()[:2], *q.stride()[:2], *v.stride()[:2], *g.stride()[:2]]
    misaligned = torch.zeros(70 * 2 * 128 + 1, dtype=bf)[1:].view(70, 2, 128)
    step((misaligned, *a[1:]))
    assert seen[-1][0][0] % 16 == 0 and seen[-1][0][0] != misaligned.data_ptr()


def _tiny_executor():
    """A CuTe DSL executor (compiled for sm_90a without a GPU, in a tenth of a second) taking the kinds of
    arguments the steps pass: pointers of two alignments, Int64 strides, an Int64 / Int32 / Float32 tail
    and a stream."""
    cutlass = pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_ptr

    class Tiny:
        @cute.jit
        def __call__(self, a: cute.Pointer, b: cute.Pointer, s0: Int64, s1: Int64, t0: Int64, t1: Int32,
                     t2: Float32, stream):
            self.kernel(a, b, s0, s1, t0, t1, t2).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, a: cute.Pointer, b: cute.Pointer, s0: Int64, s1: Int64, t0: Int64, t1: Int32, t2: Float32):
            m = cute.make_tensor(b, cute.make_layout(1))
            m[0] = Float32(s0 + s1 + t0 + Int64(t1)) * t2

    gmem = cute.AddressSpace.gmem
    types = ((cutlass.BFloat16, 16), (cutlass.Float32, 4))
    return cute.compile(Tiny(), *(make_ptr(t, 64, gmem, assumed_align=al) for t, al in types), Int64(1), Int64(2),
                        Int64(3), Int32(4), Float32(0.5), cuda.CUstream(0), options="--gpu-arch sm_90a"), types


class _Spy:
    """A compiled executor whose program is not run: ``run_compiled_program`` reads what the program
    would read behind each C argument (8 bytes; the int32 and float32 of the tail as such);
    ``__call__`` (the executor's own call) is recorded as ``"call"``. ``layout``: a change to the
    executor's conversion."""

    def __init__(self, real, layout=lambda exe: exe):
        self.real, self.layout, self.seen = real, layout, []

    def generate_execution_args(self, *args):
        exe, adapted = self.real.generate_execution_args(*args)
        return self.layout(exe), adapted

    def run_compiled_program(self, exe_args):
        import ctypes

        a = [int(e.value if isinstance(e, ctypes.c_void_p) else e) for e in exe_args]
        self.seen.append([ctypes.c_int64.from_address(x).value for x in a[:5]]
                         + [ctypes.c_int32.from_address(a[5]).value, ctypes.c_float.from_address(a[6]).value,
                            ctypes.c_int64.from_address(a[7]).value])

    def __call__(self, *args):
        self.seen.append("call")


def _stream_per_call(monkeypatch):
    stream = iter(range(0x5000, 0x6000, 0x100))  # a new current stream per call
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: next(stream), raising=False)


def test_a_cute_step_writes_each_calls_arguments_where_the_compiled_program_reads_them(monkeypatch):
    """On a real CuTe DSL executor (its program not run), a step converts its first call's arguments with
    the executor, checks that layout, and from then on writes each call's addresses, strides and stream
    into the cells the program reads: what the program would read, call by call, is that call's
    pointers, strides and stream, never an earlier call's, with the signature's int64 / int32 / float32
    tail after them; the executor's own (slow) call is not used. Steps of one signature are one step
    (``cached_step``), another signature another."""
    real, types = _tiny_executor()
    _stream_per_call(monkeypatch)
    spy = _Spy(real)
    import cutlass

    def make(fn, key, device, t1, t2):
        return fw.CuteStep(fn, key, device, types, ((cutlass.Int64, -7), (cutlass.Int32, t1), (cutlass.Float32, t2)))

    dev = torch.device("cpu", 0)
    step = fw.cached_step(make, lambda key: spy, "tiny", dev, -3, 0.1)
    assert fw.cached_step(make, lambda key: spy, "tiny", dev, -3, 0.1) is step
    assert fw.cached_step(make, lambda key: spy, "tiny", dev, 5, 0.1) is not step
    calls = [((4096, 8192), (100, 101)), ((65536, 4100), (207, 206)), ((4096, 8192), (100, 101))]
    for addrs, strides in calls:
        step.launch(addrs, strides)
    assert "call" not in spy.seen
    assert spy.seen == [[*a, *s, -7, -3, pytest.approx(0.1, rel=1e-7), st]
                        for (a, s), st in zip(calls, (0x5000, 0x5100, 0x5200))]


@pytest.mark.parametrize("layout", ["one dropped", "two strides swapped"])
def test_a_cute_step_keeps_the_executors_own_call_where_its_conversion_is_another_layout(monkeypatch, layout):
    """Where the executor's C arguments are not one cell per argument in order (one dropped; or as
    many, two strides swapped: caught by the values, made distinct for the check, even though this
    call's two strides are equal), the step warns once and calls the executor with CuTe objects on
    every call; a misaligned address is refused before anything runs."""
    real, types = _tiny_executor()
    _stream_per_call(monkeypatch)
    import cutlass

    change = (lambda exe: exe[1:]) if layout == "one dropped" else (lambda exe: [*exe[:2], exe[3], exe[2], *exe[4:]])
    spy = _Spy(real, layout=change)
    step = fw.CuteStep(spy, "tiny", torch.device("cpu", 0), types,
                       ((cutlass.Int64, 1), (cutlass.Int32, 2), (cutlass.Float32, 0.5)))
    with pytest.warns(RuntimeWarning, match="executor's own call"):
        step.launch((4096, 8192), (7, 7))
    step.launch((4096, 8192), (7, 7))
    assert spy.seen == ["call", "call"]
    with pytest.raises(ValueError, match="aligned"):
        step.launch((4096 + 2, 8192), (1, 2))
    assert spy.seen == ["call", "call"]
