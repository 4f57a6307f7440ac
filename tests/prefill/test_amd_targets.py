"""Issue 31: the dot precisions chosen per compile target, and the MI300X prefill plan (no GPU, no build).

The builds themselves (gfx942, gfx950) are checked by tests/contract/test_compile_amd.py.
"""

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import profile  # noqa: E402
from linattn.kernels.triton.limits import prefill_supported  # noqa: E402
from linattn.kernels.triton.prefill import config_on_target, dot_precision, plan_prefill, prefill_config  # noqa: E402


@pytest.mark.parametrize("prof, want", [
    ("sm90", ("ieee", "tf32", "tf32x3")), ("sm120", ("ieee", "tf32", "tf32x3")),
    ("mi300x", ("ieee", "tf32", "ieee")), ("mi355x", ("ieee", "bf16x3", "ieee")),
])
def test_dot_precision_is_chosen_per_target_and_cuda_keeps_its_own(prof, want):
    assert tuple(dot_precision(p, profile(prof)) for p in ("ieee", "tf32", "tf32x3")) == want
    # the interpreter takes CUDA's set whatever the profile
    assert [dot_precision(p, profile(prof), interpreted=True) for p in ("ieee", "tf32", "tf32x3")] == [
        "ieee", "tf32", "tf32x3"]


def test_dot_precision_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="tf32x9"):
        dot_precision("tf32x9", profile("mi300x"))


def test_config_on_target_translates_the_solve_only_on_amd():
    cfg = prefill_config("gdn", 128, 128, torch.bfloat16, 65536)
    assert config_on_target(cfg, profile("sm90")) is cfg
    amd = config_on_target(cfg, profile("mi355x"))
    assert (amd.intra.solve.diag_precision, amd.intra.solve.below_precision) == ("ieee", "bf16x3")
    assert dataclasses.replace(amd, intra=cfg.intra) == cfg  # nothing else moves


def test_mi300x_runs_the_chunked_prefill_unpipelined_and_a_smaller_lds_is_refused():
    mi = profile("mi300x")
    for family in ("gdn", "kda"):
        for K in (64, 128, 256):
            assert prefill_supported(family, K, K, torch.bfloat16, mi) is None
    small = mi.model_copy(update=dict(shared_memory_per_block=48 * 1024))
    assert "need 64 KiB" in prefill_supported("gdn", 128, 128, torch.bfloat16, small)
    plan = plan_prefill("gdn", q=torch.zeros(200, 16, 128, dtype=torch.bfloat16),
                        v=torch.zeros(200, 32, 128, dtype=torch.bfloat16), cu_seqlens=torch.tensor([0, 200]),
                        state_pool=torch.zeros(1, 32, 128, 128), state_indices=torch.zeros(1, dtype=torch.int32),
                        caps=mi, layout="folded")
    assert plan.config.state.launch.num_stages == 1  # the 64 KiB builds (test_compile_amd.py)
    assert plan.fused is None and "amd gfx942" in plan.fused_reason  # the fused prefill: NVIDIA-measured only


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_the_dispatcher_plans_triton_prefill_on_the_mi300x_profile(op):
    import linattn
    from linattn.apps.report import representative_problem

    d = linattn.explain(representative_problem(op), profile("mi300x"))
    assert d.chosen == "triton-folded", [(v.backend, v.message) for v in d.verdicts]
