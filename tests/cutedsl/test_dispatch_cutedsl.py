"""The cutedsl backend under the dispatcher: profiles sm100 / sm90 / sm103 / sm120 / mi300x / cpu,
the DSL missing or too old for the arch (field case F21), declared shapes and dtypes."""

import subprocess
import sys

import pytest

from linattn.backends.cutedsl import RANK_BEHIND, RANK_FIRST, SM90_FASTER, CuteDSLBackend, shape_class
from linattn.capabilities import profile
from linattn.dispatch import Problem, Reason, explain

QWEN = dict(op="gdn_prefill", n=16, t=16 * 4096, h=16, hv=32, k=128, v=128, dtype="bfloat16")


@pytest.fixture
def registry_with_cutedsl(fresh_registry):
    """The built-ins, plus cutedsl through the plugin hook if the lead has not registered it yet."""
    from linattn.dispatch.hookspecs import hookimpl

    if "cutedsl" not in fresh_registry.backends:
        class _Plugin:
            LINATTN_API_VERSION = "1"

            @hookimpl
            def linattn_register_backends(self):
                return [CuteDSLBackend]

        fresh_registry.add_plugin(_Plugin(), name="cutedsl-test", distribution="tests")
    return fresh_registry


def _verdict(p, caps):
    return explain(p, caps).verdict("cutedsl")


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_sm100_picks_cutedsl_for_prefill(registry_with_cutedsl, op):
    d = explain(Problem(**dict(QWEN, op=op)), "sm100")
    assert d.chosen == "cutedsl"
    assert d.verdict("cutedsl").rank == RANK_FIRST


def test_sm90_gdn_stays_behind_triton_split_and_kda_goes_first_as_measured():
    assert SM90_FASTER["gdn"] == frozenset()  # measured 0.97x / 1.00x / 0.97x
    assert SM90_FASTER["kda"] == frozenset({"long", "medium", "short"})  # measured 1.11x / 1.11x / 1.13x


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
