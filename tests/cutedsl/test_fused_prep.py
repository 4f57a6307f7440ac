"""CPU checks of the CuTe DSL prep of the fused GDN prefill (kernels/cutedsl/fused_prep.py, issue 27).

Compiled for sm_90a without a GPU (the instruction mix read from the PTX); the refusals and the
wrapper's argument checks, which raise before anything is compiled or launched; the switch (on by
default, ``0`` keeps the Triton prep).
What it computes is checked on the H200 by tests/gpu/test_fused_prep_gpu.py.
"""

import re

import pytest
import torch

from linattn.kernels.cutedsl import fused_prep as fp

MMA = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32"


@pytest.mark.parametrize("solve", ["blocks", "column"])
def test_prep_compiles_for_sm90a_with_warp_mma_and_each_solve(tmp_path, solve):
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")
    key = fp.PrepKey(128, True, "float32", "int32", "sm_90a", fp.MIN_CTAS, solve)
    ptx = fp.compile_prep(key, dump_dir=str(tmp_path)).artifacts.PTX
    assert ".target sm_90a" in ptx and ".reqntid 128, 1, 1" in ptx
    assert ".minnctapersm 3" in ptx  # the shipped build's register cap (3 CTAs per SM)
    # per warp: K K^T and Q K^T, 16 x 64 x 128 each (m16n8k16: 64 each), A from ldmatrix
    n_mma = len(re.findall(MMA, ptx))
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == 48
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)) == 16  # k, q: 8 row passes each
    n_v4 = len(re.findall(r"ld\.shared\.v4\.b32", ptx))
    if solve == "column":  # the whole block by substitution: rows of A^T as 16-byte broadcast reads
        assert n_mma == 128 and n_v4 >= 500
    else:  # the diagonal blocks' substitution (36 reads of A^T) and the doubling's products on mma.sync
        # (bf16 hi / lo: 3 per tile; 16 -> 32: 2 x 2 tiles, 32 -> 64: 2 x 8 tiles: 60, of which the build keeps 59)
        assert 128 + 48 <= n_mma <= 128 + 60 and n_v4 < 100
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
    assert fp.enabled()  # unset: on, the planner's default
    for raw, on in (("", True), ("0", False), ("off", False), ("1", True), ("true", True), ("YES", True)):
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


# -- the prep as a replay step (PrepStep) --------------------------------------------------------------

def test_a_prep_step_passes_each_calls_addresses_and_strides_whatever_an_earlier_call_passed(monkeypatch):
    """A compiled function that is not CuTe DSL's executor (a stub here) is called with each call's
    CuTe pointers and stride integers, whatever an earlier call passed, in the prep's argument order (11
    pointers of the compiled types and alignments, 8 strides, N, HV, group, items, scale, the
    stream); a q whose base is not 16-byte aligned is copied first. The compiled function is a stub
    (no GPU); q and k, N and the group differ, so a swap of either fails."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    import cutlass

    seen = []

    def fn(*a):
        seen.append(([p._pointer for p in a[:11]], [(p.dtype, p._assumed_align) for p in a[:11]],
                     [int(x) for x in a[11:19]], [x.value for x in a[19:23]], a[23].value, len(a)))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 0, raising=False)
    key = fp.PrepKey(128, True, "bfloat16", "int64", "sm_90a", fp.MIN_CTAS)
    step = fp.PrepStep(fn, key, torch.device("cpu", 0), 3, 4, 2, 6, 0.25)  # N 3, HV 4, H 2: group 2
    bf = torch.bfloat16
    bf16, f32, i32, i64 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32, cutlass.Int64
    want_types = [(bf16, 16), (bf16, 16), (f32, 4), (bf16, 2), (i64, 8), (i32, 4), (i64, 8), (bf16, 16), (bf16, 16),
                  (f32, 4), (f32, 4)]

    def call_args(wide: bool):
        q = torch.zeros(70, 4 if wide else 2, 128, dtype=bf)[:, :2]
        k = torch.zeros(70, 3, 128, dtype=bf)[:, 1:]  # its own strides (and a base 256 bytes in)
        g, beta = torch.zeros(70, 4), torch.zeros(70, 8, dtype=bf)[:, ::2]
        return (q, k, g, beta, torch.zeros(4, dtype=torch.int64), 4096, 8192, 12288, torch.zeros(80, 4, 64, dtype=bf),
                torch.zeros(80, 4), 2**20)
    a, b = call_args(False), call_args(True)
    for args in (a, a, b, a):
        step(args)
    for (addrs, types, strides, tail, scale, n), args in zip(seen, (a, a, b, a)):
        assert addrs == [x if isinstance(x, int) else x.data_ptr() for x in args] and n == 11 + 8 + 5 + 1
        assert types == want_types
        q, k, g, beta = args[:4]
        assert strides == [*q.stride()[:2], *k.stride()[:2], *g.stride()[:2], *beta.stride()[:2]]
        assert tail == [3, 4, 2, 6] and scale == 0.25
    misaligned = torch.zeros(70 * 2 * 128 + 1, dtype=bf)[1:].view(70, 2, 128)
    step((misaligned, *a[1:]))
    assert seen[-1][0][0] % 16 == 0 and seen[-1][0][0] != misaligned.data_ptr()
    assert seen[-1][2][:2] == [256, 128]  # the copy's strides


def test_the_wrapper_records_a_prep_step_and_takes_a_buckets_larger_buffers(monkeypatch):
    """Under launch recording the wrapper records one PrepStep on the call's tensors and runs nothing
    (a recorded prefill replays it with the walk); the prep buffers may hold more token rows than q
    (a prefill bucket's workspace), not fewer."""
    from linattn.kernels.triton.launch import StepRecord, recording

    ran = []
    monkeypatch.setattr(fp, "compile_prep", lambda key: lambda *a: ran.append(a))
    monkeypatch.setattr(fp, "PrepStep", lambda fn, key, device, *rest: ("step", key, rest))
    bigger = {n: torch.zeros(128, *x.shape[1:], dtype=x.dtype) for n, x in _args().items()
              if n in ("tmb", "aqk", "rk", "qs")}
    args = {**_args(), **bigger}
    with recording() as records:
        fp.cutedsl_fused_prep(**args, arch="sm_90a")
    (rec,) = records
    assert isinstance(rec, StepRecord) and not ran
    assert rec.step[1] == fp.PrepKey(128, True, "float32", "int32", "sm_90a", fp.MIN_CTAS)
    assert rec.step[2] == (2, 4, 2, 3 * 2, 0.1)  # N, HV, H, items = chunk slots x key heads, scale
    names = ("q", "k", "g", "beta", "cu_seqlens", "chunk_seq", "chunk_start", "tmb", "aqk", "rk", "qs")
    assert all(x is args[n] for x, n in zip(rec.args, names))
    with pytest.raises(ValueError, match=r"tmb has shape \(69, 4, 64\).*or more rows"):
        fp.cutedsl_fused_prep(**{**_args(), "tmb": torch.zeros(69, 4, 64, dtype=torch.bfloat16)}, arch="sm_90a")


def test_explain_names_the_prep_of_the_fused_prefill(monkeypatch):
    """explain's note on a fused GDN prefill says which prep runs: the CuTe DSL one where the call and
    device are in its scope (the reason otherwise) unless the switch keeps the Triton prep."""
    import linattn

    def note(dtype="bfloat16", device="sm90", k=128):
        d = linattn.explain("gdn_prefill", device=device, n=16, t=65536, h=16, hv=32, k=k, v=k, dtype=dtype)
        (msg,) = [v.message for v in d.verdicts if v.backend == "triton-split"]
        return msg

    monkeypatch.setenv(fp.ENV_SWITCH, "0")
    assert "prep: Triton (LINATTN_CUTEDSL_PREP=0 keeps it); walk:" in note()
    for switch in ("1", None):  # asked for, or the default
        if switch is None:
            monkeypatch.delenv(fp.ENV_SWITCH)
        else:
            monkeypatch.setenv(fp.ENV_SWITCH, switch)
        if fp.prep_refusal(family="gdn", K=128, dtype=torch.bfloat16) == "":  # nvidia-cutlass-dsl imports
            assert "prep: CuTe DSL (where the call's g is fp32 and beta fp32 or bf16;" in note()
        assert "prep: Triton (the CuTe DSL prep cannot run it: the CuTe DSL fused prep is built for K = 128; got K = 64" \
            in note(k=64)


def test_choose_prep_is_on_by_default_wherever_the_refusal_is_empty(monkeypatch):
    """choose_prep's rule alone, whether or not nvidia-cutlass-dsl imports here: with the refusal empty
    the CuTe DSL prep runs with the switch unset or 1 and not with 0; a refusal keeps the Triton prep
    and names its reason; KDA's prep is Triton's."""
    why = {"text": ""}
    monkeypatch.setattr(fp, "prep_refusal", lambda **kw: why["text"])

    def choice():
        return fp.choose_prep(family="gdn", K=128, dtype=torch.bfloat16, caps=None)

    for switch, on in ((None, True), ("1", True), ("0", False), ("off", False)):
        if switch is None:
            monkeypatch.delenv(fp.ENV_SWITCH, raising=False)
        else:
            monkeypatch.setenv(fp.ENV_SWITCH, switch)
        assert choice()[0] is on, switch
    monkeypatch.delenv(fp.ENV_SWITCH)
    why["text"] = "a reason of the refusal"
    assert choice() == (False, "Triton (the CuTe DSL prep cannot run it: a reason of the refusal)")
    assert fp.choose_prep(family="kda", K=128, dtype=torch.bfloat16, caps=None)[0] is False


def test_the_planner_chooses_the_prep_where_the_switch_asks_and_the_profile_allows(monkeypatch):
    """PrefillPlan.fused_prep (choose_prep), read when the call is planned, as the walk's switch: on by
    default and with the switch at 1 on an SM90 profile (nvidia-cutlass-dsl importing), off with the
    switch at 0, off on another profile; the launch follows the plan (chunk_fused.launch_fused_stages)."""
    from linattn.capabilities import profile
    from linattn.kernels.triton.prefill import plan as plan_mod

    monkeypatch.setattr(plan_mod, "interpreter_enabled", lambda: False)  # bf16 prep buffers, as compiled

    def planned(caps="sm90"):
        T = 16 * 64
        q, v = torch.empty(T, 16, 128, dtype=torch.bfloat16), torch.empty(T, 32, 128, dtype=torch.bfloat16)
        return plan_mod.plan_prefill("gdn", q=q, v=v, cu_seqlens=torch.arange(0, T + 1, 64, dtype=torch.int32),
                                     caps=profile(caps), fused=True)
    monkeypatch.setenv(fp.ENV_SWITCH, "0")
    assert planned().fused_prep is False
    dsl = fp.prep_refusal(family="gdn", K=128, dtype=torch.bfloat16) == ""
    monkeypatch.setenv(fp.ENV_SWITCH, "1")
    assert planned().fused_prep is dsl
    monkeypatch.delenv(fp.ENV_SWITCH)
    assert planned().fused_prep is dsl
    assert planned("sm100").fused_prep is False
    assert "built for sm_90a" in fp.choose_prep(family="gdn", K=128, dtype=torch.bfloat16, caps=profile("sm100"))[1]


def test_compile_prep_refuses_an_unknown_solve():
    with pytest.raises(ValueError, match="PrepKey.solve must be one of"):
        fp.compile_prep(fp.PrepKey(128, True, "float32", "int32", "sm_90a", fp.MIN_CTAS, "neumann"))
