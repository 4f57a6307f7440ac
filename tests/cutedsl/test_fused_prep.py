"""CPU checks of the CuTe DSL prep of the fused GDN prefill (kernels/cutedsl/fused_prep.py, issue 27).

Compiled for sm_90a without a GPU (the instruction mix read from the PTX); the refusals and the
wrapper's argument checks, which raise before anything is compiled or launched; the opt-in switch.
What it computes is checked on the H200 by tests/gpu/test_fused_prep_gpu.py.
"""

import re

import pytest
import torch

from linattn.kernels.cutedsl import fused_prep as fp

MMA = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32"


def test_prep_compiles_for_sm90a_with_warp_mma_and_a_register_solve(tmp_path):
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")
    ptx = fp.compile_prep(fp.PrepKey(128, True, "float32", "int32", "sm_90a", fp.MIN_CTAS), dump_dir=str(tmp_path)).artifacts.PTX
    assert ".target sm_90a" in ptx and ".reqntid 128, 1, 1" in ptx
    assert ".minnctapersm 3" in ptx  # the shipped build: 168 registers (ptxas -v: 44 bytes of spill)
    # per warp: K K^T and Q K^T, 16 x 64 x 128 each (m16n8k16: 64 each), A from ldmatrix
    assert len(re.findall(MMA, ptx)) == 128
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == 48
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 16  # k, q: 8 row passes each
    # the solve: rows of A^T as 16-byte broadcast reads (sum over j of ceil((63 - j) / 4) + ...)
    assert len(re.findall(r"ld\.shared\.v4\.b32", ptx)) >= 500
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) == 16  # aqk and tmb rows: 4 passes x 2 slots x 2
    assert len(re.findall(r"shfl\.sync\.up", ptx)) == 10  # the gates' scan
    for bad in ("wgmma", "tcgen05", "cp.async.bulk", "local"):
        assert bad not in ptx, bad


@pytest.mark.parametrize("kw,needle", [
    (dict(family="kda"), "GDN's"),
    (dict(K=64), "K = 128"),
    (dict(dtype=torch.float16), "bf16 q/k"),
    (dict(buf_dtype=torch.float32), "bf16 prep buffers"),
    (dict(g_dtype=torch.bfloat16), "fp32 gates"),
    (dict(beta_dtype=torch.float16), "fp32 or bf16 beta"),
    (dict(chunk=32), "chunks of 64"),
    (dict(shared_keys=False), "unshared"),
    (dict(device=torch.device("cpu")), "CUDA GPUs"),
])
def test_refusals_name_the_reason(kw, needle):
    assert needle in fp.prep_refusal(**{**dict(family="gdn", K=128, dtype=torch.bfloat16), **kw})


def _args(T=70, H=2, HV=4):
    bf, f32 = torch.bfloat16, torch.float32
    return dict(q=torch.zeros(T, H, 128, dtype=bf), k=torch.zeros(T, H, 128, dtype=bf),
                g=torch.zeros(T, HV, dtype=f32), beta=torch.zeros(T, HV, dtype=f32),
                cu_seqlens=torch.tensor([0, 30, T], dtype=torch.int32),
                chunk_seq=torch.zeros(3, dtype=torch.int32), chunk_start=torch.zeros(3, dtype=torch.int64),
                tmb=torch.zeros(T, HV, 64, dtype=bf), aqk=torch.zeros(T, HV, 64, dtype=bf),
                rk=torch.zeros(T, HV, dtype=f32), qs=torch.zeros(T, HV, 2, dtype=f32), scale=0.1,
                use_qk_l2norm=True)


@pytest.mark.parametrize("change,needle", [
    (dict(q=torch.zeros(70, 2, 64, dtype=torch.bfloat16)), "K = 128"),
    (dict(tmb=torch.zeros(70, 4, 64, dtype=torch.float32)), "bf16 prep buffers"),
    (dict(aqk=torch.zeros(70, 4, 32, dtype=torch.bfloat16)), "aqk has shape"),
    (dict(qs=torch.zeros(70, 4, dtype=torch.float32)), "qs has shape"),
    (dict(beta=torch.zeros(70, 4, dtype=torch.float16)), "fp32 or bf16 beta"),
    (dict(g=torch.zeros(69, 4, dtype=torch.float32)), "g has shape"),
    (dict(chunk_start=torch.zeros(3, dtype=torch.int32)), "chunk tables"),
    (dict(rk=torch.zeros(4, 70, dtype=torch.float32).t()), "rk must be contiguous"),
])
def test_wrapper_refuses_bad_buffers_before_any_launch(change, needle):
    with pytest.raises(ValueError, match=needle):
        fp.cutedsl_fused_prep(**{**_args(), **change})


def test_switch_is_a_switch_and_refuses_other_values(monkeypatch):
    """dispatch/env.py's switch rule: unset or blank off, 1/0 and their words, anything else a
    ConfigError naming the variable; explain reads it (and the walk's switch) before planning."""
    import linattn
    from linattn.dispatch.env import ConfigError

    monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
    assert not fp.enabled()
    for raw, on in (("", False), ("0", False), ("off", False), ("1", True), ("true", True), ("YES", True)):
        monkeypatch.setenv(fp.ENV_SWITCH, raw)
        assert fp.enabled() is on, raw
    problem = linattn.Problem(op="gdn_prefill", n=16, t=4096, h=16, hv=32, k=128, v=128)
    for var, bad in ((fp.ENV_SWITCH, "wgmma"), (fp.ENV_SWITCH, "maybe"), ("LINATTN_CUTEDSL_WALK", "yes")):
        monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
        monkeypatch.setenv(var, bad)
        with pytest.raises(ConfigError, match=var):
            linattn.explain(problem, "sm90")
        monkeypatch.delenv(var)
    assert linattn.explain(problem, "sm90").chosen
