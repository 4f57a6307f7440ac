"""The cutedsl backend under the dispatcher: profiles sm100 / sm90 / sm103 / sm120 / mi300x / cpu,
the DSL missing or too old for the arch (field case F21), declared shapes and dtypes; the built-in
registration; what ``linattn backends`` / ``report`` / ``explain`` say about it."""

import importlib
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.backends.builtin import BUILTIN
from linattn.backends.cutedsl import RANK_BEHIND, RANK_FIRST, SM90_FASTER, CuteDSLBackend, shape_class
from linattn.capabilities import PROFILES, profile
from linattn.dispatch import Problem, Reason, explain
from linattn.dispatch.plugin.hookspecs import BackendPlugin

QWEN = dict(op="gdn_prefill", n=16, t=16 * 4096, h=16, hv=32, k=128, v=128, dtype="bfloat16")
KIMI = dict(QWEN, op="kda_prefill", h=32)
runner = CliRunner()


@pytest.fixture
def registry_with_cutedsl(fresh_registry):
    """The built-in registry (no entry points): cutedsl is one of the built-ins."""
    assert "cutedsl" in fresh_registry.backends
    return fresh_registry


def _verdict(p, caps):
    return explain(p, caps).verdict("cutedsl")


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_sm100_picks_cutedsl_for_prefill(registry_with_cutedsl, op):
    d = explain(Problem(**dict(QWEN, op=op)), "sm100")
    assert d.chosen == "cutedsl"
    assert d.verdict("cutedsl").rank == RANK_FIRST


def test_sm90_keeps_cutedsl_behind_triton_split_for_both_families_as_measured():
    assert SM90_FASTER["gdn"] == frozenset()  # whole prefill 0.97x / 1.00x / 0.97x
    assert SM90_FASTER["kda"] == frozenset()  # state stage: Triton 1.0-1.3 ms against cutedsl's 2.1


def test_sm103_ranks_cutedsl_first(registry_with_cutedsl):
    v = _verdict(Problem(**QWEN), profile("sm103"))
    assert v.ok and v.rank == RANK_FIRST


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
@pytest.mark.parametrize("n,t", [(16, 16 * 4096), (64, 64 * 1024), (256, 256 * 256)])
def test_sm90_rank_follows_the_committed_h200_benchmark(registry_with_cutedsl, op, n, t):
    p = Problem(**dict(QWEN, op=op, n=n, t=t))
    v = _verdict(p, profile("sm90"))
    assert v.ok
    faster = shape_class(p) in SM90_FASTER[op.split("_")[0]]
    assert v.rank == (RANK_FIRST if faster else RANK_BEHIND)
    split = explain(p, "sm90").verdict("triton-split")
    if split.ok and not faster:  # never ahead of triton-split where it was not measured faster
        assert v.rank > split.rank


@pytest.mark.parametrize("prof,reason", [("sm120", Reason.ARCH), ("mi300x", Reason.ARCH),
                                         ("cpu", Reason.DEVICE), ("xpu-pvc", Reason.DEVICE)])
def test_other_devices_are_rejected_with_a_reason(registry_with_cutedsl, prof, reason):
    v = _verdict(Problem(**QWEN), prof)
    assert not v.ok and v.reason == reason
    assert v.message


@pytest.mark.parametrize("prof", ["sm90", "sm100"])
def test_dsl_missing_is_a_toolchain_rejection(registry_with_cutedsl, prof):
    v = _verdict(Problem(**QWEN), profile(prof).with_toolchain(cutlass_dsl=None))
    assert not v.ok and v.reason == Reason.TOOLCHAIN
    assert "nvidia-cutlass-dsl" in v.message and "cutedsl" in v.hint


@pytest.mark.parametrize("prof,arch", [("sm90", "sm_90"), ("sm100", "sm_100"), ("sm103", "sm_103")])
def test_dsl_too_old_for_the_arch_names_version_and_arch(registry_with_cutedsl, prof, arch):
    v = _verdict(Problem(**QWEN), profile(prof).with_toolchain(cutlass_dsl="4.3.0"))
    assert not v.ok and v.reason == Reason.TOOLCHAIN
    assert "4.3.0" in v.message and arch in v.message


def test_triton_missing_is_a_toolchain_rejection(registry_with_cutedsl):
    v = _verdict(Problem(**QWEN), profile("sm100").with_toolchain(triton=None))
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "triton" in v.message


@pytest.mark.parametrize("field,value,reason", [("k", 256, Reason.SHAPE), ("v", 96, Reason.SHAPE),
                                                ("dtype", "float16", Reason.DTYPE),
                                                ("dtype", "float32", Reason.DTYPE),
                                                ("state_dtype", "float16", Reason.DTYPE)])
def test_undeclared_shapes_and_dtypes_are_rejected(registry_with_cutedsl, field, value, reason):
    v = _verdict(Problem(**dict(QWEN, **{field: value})), "sm100")
    assert not v.ok and v.reason == reason and str(value) in v.message


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("mode", ["pool", "dense"])
def test_both_layouts_and_modes_are_accepted(registry_with_cutedsl, layout, mode):
    assert _verdict(Problem(**QWEN, state_layout=layout, mode=mode), "sm100").ok


def test_decode_is_not_claimed(registry_with_cutedsl):
    v = _verdict(Problem(op="gdn_decode", n=4, t=1, h=16, hv=32, k=128, v=128), "sm100")
    assert not v.ok and v.reason == Reason.OP


def test_backend_imports_and_rejects_without_the_dsl():
    code = (
        "import sys\n"
        "sys.modules['cutlass'] = None\n"  # makes `import cutlass` fail
        "import linattn.backends.cutedsl as m\n"
        "from linattn.kernels.cutedsl import importable\n"
        "from linattn.capabilities import profile\n"
        "from linattn.dispatch import Problem\n"
        "assert importable() is not None\n"
        "caps = profile('sm100').with_toolchain(cutlass_dsl=None)\n"
        "c = m.CuteDSLBackend().supports_toolchain(Problem(op='gdn_prefill', k=128, v=128), caps)\n"
        "assert not c.ok and c.reason.value == 'toolchain', c\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# -- the built-in registration ---------------------------------------------------------------------

def test_cutedsl_is_a_builtin_backend(fresh_registry):
    assert "linattn.backends.cutedsl:CuteDSLBackend" in BUILTIN
    b = fresh_registry.backends["cutedsl"]
    assert type(b) is CuteDSLBackend
    assert (b.plugin, b.distribution) == ("linattn-builtin", "linattn")
    rec = next(r for r in fresh_registry.plugins if r.name == "linattn-builtin")
    assert rec.status == "loaded" and "cutedsl" in rec.backends


def test_registering_cutedsl_again_through_a_plugin_fails_and_keeps_the_builtin(fresh_registry):
    rec = fresh_registry.add_plugin(BackendPlugin(CuteDSLBackend), name="cutedsl-again", distribution="tests")
    assert rec.status == "plugin_load_failed"
    assert "'cutedsl' is already registered by 'linattn-builtin'" in rec.error
    assert fresh_registry.backends["cutedsl"].plugin == "linattn-builtin"


# -- prefill decision table (built-ins only) ------------------------------------------------------------

PREFILL_TABLE = {
    # profile: (chosen for GDN, chosen for KDA, cutedsl's verdict: a rank or a rejection reason)
    "sm100": ("cutedsl", "cutedsl", RANK_FIRST),
    "sm103": ("cutedsl", "cutedsl", RANK_FIRST),
    "sm90": ("triton-split", "triton-split", RANK_BEHIND),  # SM90_FASTER (the H200 measurements)
    "sm120": ("triton-split", "triton-split", Reason.ARCH),
    "mi300x": ("triton-folded", "triton-folded", Reason.ARCH),  # the 64 KiB LDS configuration (issue 31)
    "xpu-pvc": ("triton-folded", "triton-folded", Reason.DEVICE),
    "cpu": ("torch-chunked", "torch-chunked", Reason.DEVICE),  # CPU prefill from 16 tokens a sequence (issue 31)
}


@pytest.mark.parametrize("prof", sorted(PREFILL_TABLE))
@pytest.mark.parametrize("n,t", [(16, 16 * 4096), (256, 256 * 256), (1, 4096)])
def test_prefill_decision_table(registry_with_cutedsl, prof, n, t):
    gdn, kda, want = PREFILL_TABLE[prof]
    for shape, chosen in ((QWEN, gdn), (KIMI, kda)):
        d = explain(Problem(**dict(shape, n=n, t=t)), prof)
        assert d.chosen == chosen, (prof, shape["op"])
        v = d.verdict("cutedsl")
        if isinstance(want, Reason):
            assert not v.ok and v.reason == want and v.message
        elif want is not None:
            assert v.ok and v.rank == want


# -- the CLI -------------------------------------------------------------------------------------------

def _explain(op, prof, *extra):
    res = runner.invoke(cli.app, ["explain", op, "--profile", prof, "--json", *extra])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    doc = json.loads(res.stdout)
    return res.exit_code, doc, {v["backend"]: v for v in doc["verdicts"]}


def _explain_text(op, prof):
    res = runner.invoke(cli.app, ["explain", op, "--profile", prof], env={"COLUMNS": "250"})
    return res.exit_code, res.stdout


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_cli_explain_sm100_picks_cutedsl(registry_with_cutedsl, op):
    code, doc, v = _explain(op, "sm100")
    assert code == 0 and doc["chosen"] == "cutedsl"
    assert v["cutedsl"]["status"] == "accepted" and v["cutedsl"]["rank"] < v["triton-split"]["rank"]
    code, text = _explain_text(op, "sm100")
    assert code == 0 and "chosen: cutedsl" in text and "-> cutedsl" in text


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_cli_explain_sm90_picks_triton_split_with_cutedsl_accepted_behind(registry_with_cutedsl, op):
    code, doc, v = _explain(op, "sm90")
    assert code == 0 and doc["chosen"] == "triton-split"
    assert v["cutedsl"]["status"] == "accepted" and v["cutedsl"]["rank"] == RANK_BEHIND
    assert v["cutedsl"]["rank"] > v["triton-split"]["rank"]


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_cli_explain_cpu_rejects_cutedsl_for_the_device_with_the_archs_it_needs(registry_with_cutedsl, op):
    code, doc, v = _explain(op, "cpu")
    assert code == 0 and doc["chosen"] == "torch-chunked"
    c = v["cutedsl"]
    assert c["status"] == "rejected" and c["reason"] == "device"
    assert "device_type='cpu'" in c["message"] and "sm_90" in c["message"] and "sm_100" in c["message"]
    assert "SM90, SM100 or SM103 GPU" in c["hint"]
    code, text = _explain_text(op, "cpu")
    assert code == 0 and "cutedsl" in text and "device_type='cpu'" in text


@pytest.mark.parametrize("prof,chosen", [("sm100", "triton-split"), ("sm90", "triton-split")])
def test_cli_explain_with_the_dsl_missing_rejects_cutedsl_for_the_toolchain(registry_with_cutedsl, monkeypatch,
                                                                             prof, chosen):
    monkeypatch.setitem(PROFILES, prof, PROFILES[prof].with_toolchain(cutlass_dsl=None))
    for op in ("gdn_prefill", "kda_prefill"):
        code, doc, v = _explain(op, prof)
        assert code == 0 and doc["chosen"] == chosen, op
        c = v["cutedsl"]
        assert c["status"] == "rejected" and c["reason"] == "toolchain"
        assert c["message"] == "nvidia-cutlass-dsl is not installed"
        assert c["hint"] == "pip install 'linattn[cutedsl]'"
    code, text = _explain_text("kda_prefill", prof)
    assert code == 0 and "nvidia-cutlass-dsl is not installed" in text and f"chosen: {chosen}" in text


def test_cli_report_sm100_routes_prefill_to_cutedsl_and_says_why_not_elsewhere(registry_with_cutedsl):
    res = runner.invoke(cli.app, ["report", "--profile", "sm100", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "cutedsl" in doc["backends"]
    for op, row in doc["ops"].items():
        v = {x["backend"]: x for x in row["verdicts"]}["cutedsl"]
        if op in ("gdn_prefill", "kda_prefill"):
            assert row["chosen"] == "cutedsl" and v["status"] == "accepted", op
        else:
            assert v["status"] == "rejected" and v["reason"] == "op" and op in v["message"]
    prefill = [r for r in doc["sweep"] if r["phase"] == "prefill" and r["op"].endswith("_prefill")]
    assert prefill and all(r["chosen"] == "cutedsl" for r in prefill)


def test_cli_report_cpu_shows_cutedsl_rejected_for_the_device(registry_with_cutedsl):
    res = runner.invoke(cli.app, ["report", "--profile", "cpu", "--json"])
    doc = json.loads(res.stdout)
    for op in ("gdn_prefill", "kda_prefill"):
        v = {x["backend"]: x for x in doc["ops"][op]["verdicts"]}["cutedsl"]
        assert v["status"] == "rejected" and v["reason"] == "device"
    text = runner.invoke(cli.app, ["report", "--profile", "cpu"], env={"COLUMNS": "250"})
    assert text.exit_code == 0 and "cutedsl" in text.stdout


def test_cli_backends_lists_cutedsl_as_a_builtin(registry_with_cutedsl):
    res = runner.invoke(cli.app, ["backends", "--json"])
    by = {r["name"]: r for r in json.loads(res.stdout)}
    c = by["cutedsl"]
    assert (c["plugin"], c["distribution"]) == ("linattn-builtin", "linattn")
    assert c["ops"] == ["gdn_prefill", "kda_prefill"] and c["vendors"] == ["nvidia"] and c["dtypes"] == ["bfloat16"]


# -- a probed (real) device without a usable DSL -------------------------------------------------------

def _probed(prof):
    """What the probe would report for a real GPU of this profile (no profile name)."""
    from linattn.capabilities.probe import toolchain

    return PROFILES[prof].model_copy(update={"profile": None, "toolchain": toolchain()})


def test_probed_gpu_without_the_dsl_package_is_a_toolchain_rejection(registry_with_cutedsl, monkeypatch):
    probe = importlib.import_module("linattn.capabilities.probe")  # the package exports a function named probe
    real = probe._version
    monkeypatch.setattr(probe, "_version", lambda dist: None if dist == "nvidia-cutlass-dsl" else real(dist))
    caps = _probed("sm90")
    assert caps.toolchain.cutlass_dsl is None
    d = explain(Problem(**KIMI), caps)
    v = d.verdict("cutedsl")
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "nvidia-cutlass-dsl is not installed" in v.message
    assert d.chosen == "triton-split"


def test_probed_gpu_whose_dsl_does_not_import_is_a_toolchain_rejection(registry_with_cutedsl, monkeypatch):
    import linattn.backends.cutedsl as mod

    monkeypatch.setattr(mod, "importable", lambda: "ImportError: libcuda.so.1: cannot open shared object file")
    caps = _probed("sm100").with_toolchain(cutlass_dsl="4.8.1")
    d = explain(Problem(**QWEN), caps)
    v = d.verdict("cutedsl")
    assert not v.ok and v.reason == Reason.TOOLCHAIN
    assert "4.8.1 is installed but does not import" in v.message and "libcuda.so.1" in v.message
    assert d.chosen == "triton-split"
    # a profile (no real device behind it) never tries the import
    assert explain(Problem(**QWEN), "sm100").verdict("cutedsl").ok
