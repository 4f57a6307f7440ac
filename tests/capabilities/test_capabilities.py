"""Capability models, profiles and probes."""

import pydantic
import pytest

from linattn.capabilities import PROFILES, DeviceCapabilities, clear_cache, probe, profile


def test_profiles_cover_the_named_targets():
    for name in ("sm100", "sm90", "mi300x", "xpu-pvc", "cpu"):
        caps = profile(name)
        assert caps.profile == name
        assert caps.grid.source  # every limit names its source


def test_cuda_profiles_carry_the_65535_limit_on_y_and_z_and_wide_x():
    for name in ("sm90", "sm100", "sm103", "sm120"):
        g = profile(name).grid
        assert (g.y, g.z) == (65535, 65535) and g.x == 2**31 - 1


def test_amd_and_intel_profiles_allow_wide_folded_axes():
    assert profile("mi300x").warp_size == 64 and profile("mi300x").grid.z == 2**31 - 1
    assert profile("mi300x").grid.total is not None
    assert profile("xpu-pvc").vendor == "intel"


def test_capabilities_are_frozen_and_reject_unknown_fields():
    caps = profile("sm90")
    with pytest.raises(pydantic.ValidationError):
        caps.sm_count = 1
    with pytest.raises(pydantic.ValidationError):
        DeviceCapabilities(**caps.model_dump(), bogus=1)


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(KeyError, match="sm90"):
        profile("sm91")


def test_cpu_probe_is_cached_and_reports_the_interpreter_flag(monkeypatch):
    clear_cache()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    a = probe("cpu")
    assert a is probe("cpu") and a.vendor == "cpu" and not a.toolchain.triton_interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert probe("cpu").toolchain.triton_interpreter
    assert a.toolchain.torch is not None
    clear_cache()


def test_with_toolchain_models_a_missing_compiler():
    caps = profile("sm100").with_toolchain(cutlass_dsl=None)
    assert caps.toolchain.cutlass_dsl is None and caps.toolchain.triton == PROFILES["sm100"].toolchain.triton


def test_importing_linattn_probes_no_device():
    import subprocess
    import sys

    code = (
        "import torch\n"
        "def boom(*a, **k): raise SystemExit('probed at import')\n"
        "torch.cuda.get_device_properties = boom\n"
        "torch.cuda.is_available = boom\n"
        "import linattn, linattn.dispatch, linattn.capabilities\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
