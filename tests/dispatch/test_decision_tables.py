"""What each profile gets, op by op (the built-in backends only), and what changes when a
toolchain is missing. Field case F21 (profiles sm90/sm100/sm103/sm120, ROCm wave64, XPU, CPU)."""

import pytest

from linattn.capabilities import profile
from linattn.dispatch import Problem, Reason, explain

QWEN = dict(h=16, hv=32, k=128, v=128)

DECODE_TABLE = {
    # profile: (chosen at N=1, chosen at N=4096)
    "sm90": ("triton-split", "triton-split"),
    "sm100": ("triton-split", "triton-split"),
    "sm103": ("triton-split", "triton-split"),
    "sm120": ("triton-split", "triton-split"),
    "mi300x": ("triton-folded", "triton-folded"),
    "xpu-pvc": ("triton-folded", "triton-folded"),
    "cpu": ("torch-chunked", "torch-chunked"),  # torch-chunked's step: the CPU decode default (issue 31)
}


@pytest.mark.parametrize("prof", sorted(DECODE_TABLE))
@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_decode_decision_table(fresh_registry, prof, op):
    small, large = DECODE_TABLE[prof]
    assert explain(Problem(op=op, n=1, **QWEN), prof).chosen == small
    d = explain(Problem(op=op, n=4096, **QWEN), prof)
    assert d.chosen == large
    for v in d.verdicts:  # every rejection has a reason and a message
        assert v.ok or (v.reason and v.message)


def test_sm90_large_batch_folded_is_rejected_for_the_grid_limit(fresh_registry):
    d = explain(Problem(op="gdn_decode", n=4096, **QWEN), "sm90")
    v = d.verdict("triton-folded")
    assert v.reason == Reason.GRID_LIMIT and "65" in v.message


def test_mi300x_split_is_rejected_for_the_vendor(fresh_registry):
    v = explain(Problem(op="gdn_decode", n=4096, **QWEN), "mi300x").verdict("triton-split")
    assert v.reason == Reason.DEVICE and "amd" in v.message


@pytest.mark.parametrize("prof", ["sm90", "mi300x", "xpu-pvc"])
def test_missing_triton_falls_to_the_reference_with_a_toolchain_reason(fresh_registry, prof):
    caps = profile(prof).with_toolchain(triton=None)
    d = explain(Problem(op="gdn_decode", n=64, **QWEN), caps)
    assert d.chosen == "torch-ref"
    for name in ("triton-split", "triton-folded"):
        assert d.verdict(name).reason in (Reason.TOOLCHAIN, Reason.DEVICE)
    assert d.verdict("triton-split" if prof == "sm90" else "triton-folded").reason == Reason.TOOLCHAIN


def test_clamp_goes_to_triton_on_gpus_and_the_reference_on_cpu(fresh_registry):
    p = Problem(op="silu_and_mul_clamp", n=8192, d=18432, clamp_limit=True)
    assert explain(p, "sm90").chosen == "triton-split"
    assert explain(p, "mi300x").chosen == "triton-folded"
    assert explain(p, "cpu").chosen == "torch-ref"


def test_cpu_with_the_interpreter_runs_triton_only_when_forced(fresh_registry):
    caps = profile("cpu").with_toolchain(triton="3.6.0", triton_interpreter=True)
    p = Problem(op="gdn_decode", n=3, h=2, hv=4, k=16, v=16)
    d = explain(p, caps)
    assert d.chosen == "torch-chunked"  # F24: the dispatcher routes to the PyTorch paths and says why
    assert d.verdict("triton-split").reason == Reason.NOT_FORCED
    assert explain(p, caps, backend="triton-split").chosen == "triton-split"
    assert explain(p, caps, backend="triton-folded").chosen == "triton-folded"


def test_unsupported_head_dim_is_a_shape_rejection_naming_the_limit(fresh_registry):
    d = explain(Problem(op="gdn_decode", n=4, h=4, hv=4, k=512, v=128), "sm90")
    v = d.verdict("triton-split")
    assert v.reason == Reason.SHAPE and "512" in v.message
    assert d.chosen == "torch-ref"


def test_profiles_are_explained_without_triton_importable(fresh_registry, monkeypatch):
    """`linattn explain --profile sm90` on a machine without Triton: the profile's toolchain decides,
    and no predicate needs to import a kernel module."""
    import sys

    for mod in [m for m in sys.modules if m.startswith(("triton", "linattn.kernels.triton.prefill")) or m in (
            "linattn.kernels.triton.decode", "linattn.kernels.triton.silu_clamp")]:  # prefill: the package and its modules
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "triton", None)  # any `import triton` now raises ImportError
    for op, extra in (("gdn_decode", {}), ("gdn_prefill", {"t": 8192}), ("silu_and_mul_clamp", {})):
        shape = dict(n=8192, d=18432) if op == "silu_and_mul_clamp" else dict(n=4096, **QWEN, **extra)
        p = Problem(op=op, **shape)
        assert explain(p, "sm90").chosen == "triton-split", explain(p, "sm90").summary()
        assert explain(p, "mi300x").verdict("triton-split").reason == Reason.DEVICE
