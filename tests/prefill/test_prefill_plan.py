"""The chunked prefill's host stages: a frozen configuration, a plan from metadata alone, a plan
run again on new tensors, and unused kernel operands passed as None.

The plan is what a fast path caches per call signature, so it must not read a tensor's values
(built here from ``meta`` tensors, which have none) and a second run of the same plan must give
the bits :func:`chunk_prefill` gives.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled, profile  # noqa: E402
from linattn.kernels.triton import chunk_intra, chunk_output, chunk_state, prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(f, dt, K, V) for f in ("gdn", "kda") for dt in pm.DTYPES for K in pm.HEAD_DIMS for V in pm.HEAD_DIMS]


def test_prefill_config_is_frozen_and_overridden_by_field_paths():
    for family, dtype, K, V in SHAPES:
        cfg = pm.prefill_config(family, K, V, dtype)
        assert pm.override_config(cfg, {}) == cfg
        new = pm.override_config(cfg, {"state.block_v": 16, "intra.solve": {"neumann": False},
                                       "output.grouped_launch": pm.LaunchOptions(8, 2), "output.grouped_at": [2, 4]})
        assert new == dataclasses.replace(cfg, state=dataclasses.replace(cfg.state, block_v=16),
                                          intra=dataclasses.replace(cfg.intra, solve=dataclasses.replace(
                                              cfg.intra.solve, neumann=False)),
                                          output=dataclasses.replace(cfg.output, grouped_launch=pm.LaunchOptions(8, 2),
                                                                     grouped_at=(2, 4)))
    with pytest.raises(ValueError, match="no field 'bv'"):
        pm.override_config(cfg, {"state.bv": 16})
    with pytest.raises(ValueError, match="no field"):
        pm.override_config(cfg, {"state.block_v.x": 16})
    with pytest.raises(TypeError):
        pm.override_config(cfg, {"intra.solve": {"NEUMANN": True}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.state.block_v = 16
    with pytest.raises(ValueError, match="num_warps"):
        pm.LaunchOptions(num_warps=3, num_stages=1)
    with pytest.raises(ValueError, match="precision"):
        pm.SolveConfig(True, "tf64", "tf32")


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("mode", ["pool", "pool+has_init", "dense", "dense+h0"])
def test_a_plan_is_made_from_metadata_alone(family, mode):
    """Meta tensors carry shapes and dtypes but no values: planning must not need any."""
    meta = dict(device="meta")
    T, H, HV, K, V, N = 200, 2, 4, 128, 128, 3
    kw = dict(q=torch.empty(T, H, K, dtype=torch.bfloat16, **meta), v=torch.empty(T, HV, V, dtype=torch.bfloat16, **meta),
              cu_seqlens=torch.empty(N + 1, dtype=torch.int32, **meta), caps=profile("sm90"))
    if mode.startswith("pool"):
        kw.update(state_pool=torch.empty(5, HV, V, K, **meta), state_indices=torch.empty(N, dtype=torch.int32, **meta))
        if mode == "pool+has_init":
            kw["has_initial_state"] = torch.empty(N, dtype=torch.bool, **meta)
    elif mode == "dense+h0":
        kw["initial_state"] = torch.empty(N, HV, V, K, dtype=torch.bfloat16, **meta)
    plan = pm.plan_prefill(family, **kw)
    assert plan.nt_max == T // 64 + N and not plan.empty
    names = [b.name for b in plan.buffers]
    assert ("final" in names) == (not mode.startswith("pool"))
    assert ("kda_a" in names) == (family == "kda")
    assert plan.final_dtype == (None if mode.startswith("pool") else
                                torch.bfloat16 if mode == "dense+h0" else torch.float32)
    assert plan.grids.state.grid[0] * plan.grids.state.grid[1] * plan.grids.state.grid[2] == N * HV * (V // plan.config.state.block_v)


RUNS_KERNELS = pytest.mark.skipif(not interpreter_enabled() and DEV == "cpu",
                                  reason="runs kernels: TRITON_INTERPRET=1 or a GPU")


@RUNS_KERNELS
def test_a_plan_runs_again_on_new_tensors_with_the_bits_of_chunk_prefill():
    lens, H, HV, K, V = [70, 0, 5], 1, 2, 64, 64
    slots = torch.tensor([2, 0, -1], dtype=torch.int32, device=DEV)
    first = make_inputs("gdn", lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=5, device=DEV)
    plan = pm.plan_prefill("gdn", q=first["q"], v=first["v"], cu_seqlens=first["cu_seqlens"],
                           state_pool=random_states(3, HV, K, V, device=DEV), state_indices=slots)
    for seed in (6, 7):  # new tensors of the same signature, the plan reused
        inp = make_inputs("gdn", lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=seed, device=DEV)
        pool_a, pool_b = random_states(3, HV, K, V, seed=seed, device=DEV), random_states(3, HV, K, V, seed=seed, device=DEV)
        o_plan, _ = pm.run_prefill(plan, **inp, scale=0.125, state_pool=pool_a, state_indices=slots)
        o_call, _ = run("gdn", inp, scale=0.125, state_pool=pool_b, state_indices=slots)
        assert torch.equal(o_plan, o_call) and torch.equal(pool_a, pool_b)


def test_run_prefill_refuses_tensors_of_another_signature():
    inp = make_inputs("gdn", [10], device=DEV)
    plan = pm.plan_prefill("gdn", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"])
    other = make_inputs("gdn", [10], K=128, device=DEV)
    with pytest.raises(ValueError, match="do not match the plan"):
        pm.run_prefill(plan, **other, scale=0.1)


def test_a_replaced_prefill_config_steers_the_plan(monkeypatch):
    """Overrides (benchmark sweeps, GPU tests) replace ``prefill_config``; ``config=`` passes one to the planner."""
    inp = make_inputs("kda", [10], K=128, V=128, dtype=torch.bfloat16, device=DEV)
    kw = dict(q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"], caps=profile("sm90"))
    assert pm.prefill_config("kda", 128, 128, torch.bfloat16).state.writes_output
    assert pm.plan_prefill("kda", **kw).state_writes_output
    off = {"state.writes_output": False}
    plan = pm.plan_prefill("kda", **kw, config=pm.override_config(pm.prefill_config("kda", 128, 128, torch.bfloat16), off))
    assert not plan.state_writes_output and plan.grids.output is not None
    pinned = pm.prefill_config
    monkeypatch.setattr(pm.config, "prefill_config", lambda *a, **k: pm.override_config(pinned(*a, **k), off))
    assert pm.plan_prefill("kda", **kw) == plan


def _operands(monkeypatch) -> list:
    """(kernel name, {parameter: argument}) of every prefill launch."""
    seen = []
    for kernel in (chunk_intra.chunk_kda_system_kernel, chunk_intra.chunk_intra_kernel, chunk_state.chunk_gdn_gates_kernel,
                   chunk_state.chunk_state_kernel, chunk_output.chunk_output_kernel, chunk_output.chunk_output_grouped_kernel):
        params = list(inspect.signature(kernel.fn).parameters)

        def spy(*a, _run=kernel.run, _name=kernel.fn.__name__, _params=params, **kw):
            seen.append((_name, dict(zip(_params, a))))
            return _run(*a, **kw)
        monkeypatch.setattr(kernel, "run", spy)
    return seen


@RUNS_KERNELS
def test_unused_kernel_operands_are_none_and_used_ones_are_what_their_names_say(monkeypatch):
    seen = _operands(monkeypatch)
    inp = make_inputs("gdn", [70, 5], H=1, HV=2, K=64, V=64, device=DEV)
    run("gdn", inp)  # dense mode, fp32: no gates kernel, per-head output
    ops = dict(seen)
    assert ops["chunk_intra_kernel"]["abuf"] is None and ops["chunk_intra_kernel"]["tm_beta"] is None
    state = ops["chunk_state_kernel"]
    assert all(state[n] is None for n in ("state_indices", "has_init", "h0", "q", "aqk", "o", "v", "tm_beta"))
    assert state["k"] is inp["k"] and state["g"] is inp["g"]
    out = ops["chunk_output_kernel"]
    assert out["aqk"] is None and out["state_indices"] is None and out["q"] is inp["q"]
    seen.clear()
    inp = make_inputs("kda", [70, 5], H=1, HV=2, K=64, V=64, device=DEV)
    pool = random_states(3, 2, 64, 64, device=DEV)
    run("kda", inp, state_pool=pool, state_indices=torch.tensor([2, 0], device=DEV))
    ops = dict(seen)
    assert ops["chunk_intra_kernel"]["g"] is None and ops["chunk_intra_kernel"]["abuf"] is not None
    state = ops["chunk_state_kernel"]
    assert state["rk"] is None and state["has_init"] is None and state["h0"] is pool and state["ht"] is pool
    assert ops["chunk_output_kernel"]["rk"] is None
