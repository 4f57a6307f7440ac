"""Field case F32: a backend picked on an architecture its kernels never ran on.

cutedsl's prefill ran (and matches float64) on an H200 (sm_90) only; on sm_100 / sm_103 it is
compile-checked. It stays first there, but its verdict is marked unverified, its first eager call
of each shape class self-checks against torch-ref before any user data, a failed check disables
it there with reason ``self_check_failed`` (the call falls back), and during CUDA-graph capture an
unchecked backend is not chosen (reason ``unverified``). On the CPU the failing case is simulated
with a cutedsl-like backend whose kernels (the reference's, on the CPU) are wrong; the GPU tests
pretend the H200 is an unverified arch, so the real kernels go through the real check.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from typer.testing import CliRunner

import linattn
import linattn.apps.cli as cli
from linattn.backends.cutedsl import RANK_FIRST, CuteDSLBackend
from linattn.backends.torch_ref import TorchRefBackend, gdn_prefill_ref
from linattn.capabilities import DeviceCapabilities, profile
from linattn.dispatch import Problem, Reason, explain, reset_registry
from linattn.dispatch.runtime import selection
from linattn.dispatch.runtime import self_check as sc
from linattn.dispatch.plugin.hookspecs import BackendPlugin
from linattn.dispatch.runtime.registry import Registry

QWEN = dict(op="gdn_prefill", n=4, t=8192, h=16, hv=32, k=128, v=128, dtype="bfloat16")
KIMI = dict(QWEN, op="kda_prefill", h=32)
runner = CliRunner()


@pytest.fixture
def builtins():
    """The built-in backends only (no entry-point plugins), restored afterwards."""
    reg = reset_registry(Registry().load(entry_points=False))
    yield reg
    reset_registry()


# -- explain and the CLI mark the verdict ---------------------------------------------------------------

@pytest.mark.parametrize("shape", [QWEN, KIMI], ids=["gdn", "kda"])
@pytest.mark.parametrize("prof,arch", [("sm100", "sm_100"), ("sm103", "sm_103")])
def test_explain_keeps_cutedsl_first_on_sm100_but_marks_it_unverified(builtins, shape, prof, arch):
    d = explain(Problem(**shape), prof)
    v = d.verdict("cutedsl")
    assert d.chosen == "cutedsl" and v.ok and v.rank == RANK_FIRST
    assert v.verified is False
    assert v.message.startswith(f"unverified on {arch}: self-checks against torch-ref on its first eager call")
    assert "verified on {sm_90}" in v.message
    assert not sc.results()  # explain never runs a check


@pytest.mark.parametrize("shape", [QWEN, KIMI], ids=["gdn", "kda"])
def test_on_sm90_where_it_was_verified_there_is_no_mark(builtins, shape):
    v = explain(Problem(**shape), "sm90").verdict("cutedsl")
    assert v.ok and v.verified is True and v.message == ""


def test_in_capture_on_sm100_unchecked_backends_are_not_chosen(builtins):
    d = explain(Problem(**QWEN), "sm100", capturing=True)
    for name in ("cutedsl", "triton-split"):
        v = d.verdict(name)
        assert not v.ok and v.reason == Reason.UNVERIFIED
        assert "not yet self-checked on sm_100" in v.message and "before capture" in v.hint
    assert d.chosen == "torch-ref" and d.capturing


def test_cli_explain_json_and_text_mark_cutedsl_unverified_on_sm100(builtins):
    res = runner.invoke(cli.app, ["explain", "gdn_prefill", "--profile", "sm100", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    v = {x["backend"]: x for x in doc["verdicts"]}
    assert doc["chosen"] == "cutedsl" and doc["capturing"] is False
    assert v["cutedsl"]["verified"] is False and "unverified on sm_100" in v["cutedsl"]["message"]
    assert v["torch-ref"]["verified"] is True
    res = runner.invoke(cli.app, ["explain", "gdn_prefill", "--profile", "sm100"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    assert "accepted, unverified (chosen)" in res.stdout and "note: unverified on sm_100" in res.stdout
    res = runner.invoke(cli.app, ["explain", "gdn_prefill", "--profile", "sm90"], env={"COLUMNS": "250"})
    assert "unverified" not in res.stdout.split("Decision trace")[1].split("cutedsl")[1].split("\n")[0]


def test_cli_report_json_and_text_mark_cutedsl_unverified_on_sm100(builtins):
    res = runner.invoke(cli.app, ["report", "--profile", "sm100", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for op in ("gdn_prefill", "kda_prefill"):
        assert {v["backend"]: v for v in doc["ops"][op]["verdicts"]}["cutedsl"]["verified"] is False
        row = next(u for u in doc["unverified"] if u["op"] == op and u["backend"] == "cutedsl")
        assert row["arch"] == "sm_100" and row["chosen"] is True and "first eager call" in row["message"]
    prefill = [r for r in doc["sweep"] if r["op"].endswith("_prefill")]
    assert prefill and all(r["chosen"] == "cutedsl" and r["verified"] is False for r in prefill)
    assert doc["self_checks"] == []
    text = runner.invoke(cli.app, ["report", "--profile", "sm100"], env={"COLUMNS": "250"})
    assert text.exit_code == 0
    assert "* rank 5 unverified" in text.stdout and "cutedsl (unverified)" in text.stdout
    assert "cutedsl for gdn_prefill: unverified on sm_100" in text.stdout
    on90 = json.loads(runner.invoke(cli.app, ["report", "--profile", "sm90", "--json"]).stdout)
    assert on90["unverified"] == [] and all(r["verified"] for r in on90["sweep"])


# -- the simulated field case: a cutedsl-like backend whose self-check fails on the CPU ---------------------

SM100_SIM = profile("sm100").with_toolchain(triton=None, cutlass_dsl=None)  # the real GPU backends are out


class SimCuteDSL(CuteDSLBackend):
    """cutedsl's declarations and rank (first on sm_100, verified on sm_90 only), with kernels
    computed on the CPU by the reference; ``fault`` makes them wrong the way a miscompile would."""

    name = "cutedsl-sim"
    fault = "final-state"
    runs: list = []

    def supports_toolchain(self, p, caps):  # the simulated machine has the DSL
        from linattn.dispatch import Check

        return Check.passed()

    def _run_ref(self, op, **kw):
        type(self).runs.append(op)
        out = getattr(TorchRefBackend(), op)(**kw)
        if self.fault == "final-state" and kw.get("state_pool") is not None:
            kw["state_pool"].mul_(1.5)  # every state the call owns... and the others
        return out

    def gdn_prefill(self, **kw):
        return self._run_ref("gdn_prefill", **kw)

    def kda_prefill(self, **kw):
        return self._run_ref("kda_prefill", **kw)


@pytest.fixture
def sim(monkeypatch):
    SimCuteDSL.runs = []
    reg = Registry().load(entry_points=False)
    reg.add_plugin(BackendPlugin(SimCuteDSL), name="cutedsl-sim", distribution="linattn-tests")
    reset_registry(reg)
    monkeypatch.setattr(selection, "resolve_device",
                        lambda d: d if isinstance(d, DeviceCapabilities) else SM100_SIM)
    yield reg
    monkeypatch.undo()
    SimCuteDSL.fault = "final-state"
    reset_registry()


def _prefill_inputs(seed=0, lens=(5, 70, 0, 3), family="gdn"):
    gen = torch.Generator().manual_seed(seed)
    Tt, Hh, HVv, Kk = sum(lens), 2, 4, 64
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    gs = (Tt, HVv, Kk) if family == "kda" else (Tt, HVv)
    return dict(q=r(Tt, Hh, Kk).bfloat16(), k=r(Tt, Hh, Kk).bfloat16(), v=r(Tt, HVv, Kk).bfloat16(),
                g=-(torch.rand(gs, generator=gen) * 0.3 + 0.01), beta=torch.rand(Tt, HVv, generator=gen),
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]),
                state_pool=r(6, HVv, Kk, Kk) * 0.5, state_indices=torch.tensor([3, 0, 5, -1]))


def test_f32_a_failing_self_check_disables_it_and_prefill_falls_back_to_a_correct_result(sim, caplog):
    x = _prefill_inputs()
    ref_x = {k: v.clone() for k, v in x.items()}
    assert explain(Problem(**dict(QWEN, k=64, v=64, h=2, hv=4)), SM100_SIM).chosen == "cutedsl-sim"
    with caplog.at_level(logging.WARNING, logger="linattn"):
        o = linattn.gdn_prefill(**x)
    d = linattn.last_decision("gdn_prefill")
    v = d.verdict("cutedsl-sim")
    assert not v.ok and v.reason == Reason.SELF_CHECK_FAILED and "failed on sm_100" in v.message
    assert "state: relative error" in v.message and "pool rows" in v.message  # what the check saw
    assert d.chosen == "torch-chunked"  # the fallback where no GPU kernel runs
    assert SimCuteDSL.runs == ["gdn_prefill"]  # once, inside its check: never on the user's pool
    assert any("cutedsl-sim failed its self-check" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)
    # the fallback's result: bitwise what torch-chunked gives, and within fp32-state tolerance of float64
    o_ref = linattn.gdn_prefill(**ref_x, backend="torch-chunked")
    assert torch.equal(o, o_ref) and torch.equal(x["state_pool"], ref_x["state_pool"])
    pool64 = _prefill_inputs()["state_pool"].double()
    o64, _ = gdn_prefill_ref(*(_prefill_inputs()[k].double() for k in ("q", "k", "v", "g", "beta")),
                             x["cu_seqlens"], state_pool=pool64, state_indices=x["state_indices"],
                             compute_dtype=torch.float64)
    assert (o.double() - o64).norm() / o64.norm() < 2e-2
    assert (x["state_pool"].double() - pool64).norm() / pool64.norm() < 1e-2
    # the next decision, and explain, say why
    linattn.gdn_prefill(**_prefill_inputs(1, lens=(100, 1)) | {"state_indices": torch.tensor([1, 2])})
    assert linattn.last_decision("gdn_prefill").verdict("cutedsl-sim").reason == Reason.SELF_CHECK_FAILED
    assert explain(Problem(**dict(QWEN, k=64, v=64, h=2, hv=4)), SM100_SIM).verdict("cutedsl-sim").reason \
        == Reason.SELF_CHECK_FAILED
    assert SimCuteDSL.runs == ["gdn_prefill"]


def test_f32_the_other_family_is_a_shape_class_of_its_own(sim):
    linattn.gdn_prefill(**_prefill_inputs())
    SimCuteDSL.fault = ""  # KDA's kernels are right
    linattn.kda_prefill(**_prefill_inputs(family="kda"))
    d = linattn.last_decision("kda_prefill")
    assert d.chosen == "cutedsl-sim" and d.verdict("cutedsl-sim").verified
    assert [(r.op, r.ok) for r in sc.results()] == [("gdn_prefill", False), ("kda_prefill", True)]
    assert SimCuteDSL.runs == ["gdn_prefill", "kda_prefill", "kda_prefill"]  # the check, then the call


# -- on a real GPU: the H200 played as an unverified arch ----------------------------------------------------

def _cuda_prefill(family, mode, state_dtype, layout, H=16, HV=32, Kd=128, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = (300, 1, 64, 700)
    Tt = sum(lens)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    gs = (Tt, HV, Kd) if family == "kda" else (Tt, HV)
    shape = (HV, Kd, Kd)
    x = dict(q=r(Tt, H, Kd).bfloat16(), k=r(Tt, H, Kd).bfloat16(), v=r(Tt, HV, Kd).bfloat16(),
             g=-(torch.rand(gs, device="cuda", generator=gen) * 0.3 + 0.01),
             beta=torch.rand(Tt, HV, device="cuda", generator=gen),
             cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32),
             state_layout=layout)
    if mode == "pool":
        x.update(state_pool=(r(8, *shape) * 0.5).to(getattr(torch, state_dtype)),
                 state_indices=torch.tensor([5, 0, 7, 2], device="cuda", dtype=torch.int32))
    else:
        x["initial_state"] = (r(len(lens), *shape) * 0.5).to(getattr(torch, state_dtype))
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("family,mode,state_dtype,layout", [
    ("gdn", "pool", "float32", "vk"), ("gdn", "pool", "bfloat16", "kv"), ("gdn", "dense", "float32", "vk"),
    ("kda", "pool", "float32", "vk"), ("kda", "pool", "bfloat16", "kv"), ("kda", "dense", "float32", "kv")])
def test_gpu_real_cutedsl_and_triton_kernels_pass_their_self_check(builtins, monkeypatch, family, mode,
                                                                   state_dtype, layout):
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    from linattn.backends.triton import TritonBackend

    caps = linattn.dispatch.resolve_device(torch.device("cuda"))
    if caps.arch not in ("sm_90", "sm_100", "sm_103"):
        pytest.skip(f"cutedsl runs on sm_90 / sm_100 / sm_103, this GPU is {caps.arch}")
    monkeypatch.setattr(CuteDSLBackend, "verified_archs", frozenset())  # pretend this GPU was never verified
    monkeypatch.setattr(TritonBackend, "verified_archs", frozenset())
    H, HV = (32, 32) if family == "kda" else (16, 32)
    op = f"{family}_prefill"
    with linattn.policy(prefill="cutedsl"):
        x = _cuda_prefill(family, mode, state_dtype, layout, H=H, HV=HV)
        getattr(linattn, op)(**x)
    with linattn.policy(prefill="triton-split"):
        getattr(linattn, op)(**_cuda_prefill(family, mode, state_dtype, layout, H=H, HV=HV))
    got = {r.backend: r for r in sc.results()}
    assert set(got) == {"cutedsl", "triton-split"}
    for r in got.values():
        assert r.ok and r.arch == caps.arch and r.op == op, r
        print(f"{r.backend} {op} {r.shape_class}: {r.message} ({r.seconds:.1f} s)")


@pytest.mark.gpu
def test_gpu_decode_is_checked_eagerly_then_chosen_inside_a_real_cuda_graph(builtins, monkeypatch):
    from linattn.backends.triton import TritonBackend

    monkeypatch.setattr(TritonBackend, "verified_archs", frozenset())
    dev = torch.device("cuda")
    caps = linattn.dispatch.resolve_device(dev)
    Nn, Hh, HVv, Kk, P = 8, 16, 32, 128, 12
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x = dict(q=r(Nn, 1, Hh, Kk).bfloat16(), k=r(Nn, 1, Hh, Kk).bfloat16(), v=r(Nn, 1, HVv, Kk).bfloat16(),
             a=r(Nn, 1, HVv).bfloat16(), b=r(Nn, 1, HVv).bfloat16(), A_log=r(HVv) * 0.5, dt_bias=r(HVv) * 0.5)
    idx = torch.tensor([3, -1, 0, 7, 1, 9, -1, 4], device="cuda", dtype=torch.int32)
    p = Problem(op="gdn_decode", n=Nn, t=1, h=Hh, hv=HVv, k=Kk, v=Kk)
    before = explain(p, caps, capturing=True).verdict("triton-split")
    assert before.reason == Reason.UNVERIFIED  # in capture, before any eager call
    pool_e = r(P, HVv, Kk, Kk) * 0.5
    pool_g = pool_e.clone()
    o_e = linattn.gdn_decode(**x, state_pool=pool_e, state_indices=idx)  # eager: checks, then runs
    assert linattn.last_decision("gdn_decode").chosen == "triton-split"
    assert [(r.backend, r.ok) for r in sc.results()] == [("triton-split", True)]
    static = {k: v.clone() for k, v in x.items()}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # a warm-up on the capture stream, as engines do
        linattn.gdn_decode(**static, state_pool=pool_g.clone(), state_indices=idx)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = linattn.gdn_decode(**static, state_pool=pool_g, state_indices=idx)
    d = linattn.last_decision("gdn_decode")
    assert d.capturing and d.chosen == "triton-split" and d.verdict("triton-split").verified
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_e) and torch.equal(pool_g, pool_e)
    assert len(sc.results()) == 1  # checked once
