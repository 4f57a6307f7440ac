"""CPU checks of the CuTe DSL fused GDN walk (kernels/cutedsl/fused_walk.py, issue 27).

Compiled for sm_90a without a GPU (the instruction mix read from the PTX); the refusals and the
wrapper's argument checks, which raise before anything is compiled or launched; the opt-in switch.
What it computes is checked on the H200 by tests/gpu/test_fused_walk_gpu.py.
"""

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
    for bad in ("mma.sync", "ldmatrix", "tcgen05", "cp.async.bulk"):
        assert bad not in ptx, bad


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


def test_switch_is_off_unless_set_to_one_or_wgmma(monkeypatch):
    monkeypatch.delenv(fw.ENV_SWITCH, raising=False)
    assert not fw.enabled() and fw.variant() == ""
    for off in ("0", "true", "WGMMA", "sync"):
        monkeypatch.setenv(fw.ENV_SWITCH, off)
        assert not fw.enabled() and fw.variant() == "", off
    monkeypatch.setenv(fw.ENV_SWITCH, "1")
    assert fw.enabled() and fw.variant() == "sync"
    monkeypatch.setenv(fw.ENV_SWITCH, "wgmma")
    assert fw.enabled() and fw.variant() == "wgmma"
