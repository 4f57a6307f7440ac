"""On one device, the prefill planner's plans for the two launch layouts differ in their grids only.

The contract test (test_contract.py) holds the layouts to bitwise agreement; that claim is about
the program-id mapping, so everything else the planner decides (configuration, launch options,
dot precisions, segments, the fused path, buffers) must not depend on the layout. Planned as for a
compiled run (the interpreter off: the compile-target translations of ``prefill.dot_precision``
apply), with the capabilities the contract test gives each layout (:func:`layout_caps.layout_caps`),
on NVIDIA and AMD devices. Planning reads shapes only: no kernel runs (CPU, well under a second).
"""

from __future__ import annotations

import dataclasses

import pytest

from linattn.capabilities import profile

from contract_cases import CASES, PREFILL_OPS
from layout_caps import LAYOUT_GRID_PROFILE, layout_caps

prefill = pytest.importorskip("linattn.kernels.triton.prefill")

_CASES = [pytest.param(c, id=c.id) for op in PREFILL_OPS for c in CASES[op]]
_GRID_FIELDS = ("grids", "segment_grids", "fused_grid")


def _plan(case, layout: str, device: str):
    a = case.args
    return prefill.plan_prefill(case.op.split("_")[0], q=a["q"], v=a["v"], cu_seqlens=a["cu_seqlens"],
                                state_pool=a["state_pool"], state_indices=a["state_indices"],
                                use_qk_l2norm=a["use_qk_l2norm"], state_layout=a["state_layout"], layout=layout,
                                caps=layout_caps(layout, profile(device)), **case.launch)


def _work(grid_plan) -> tuple:
    return None if grid_plan is None else (grid_plan.n_seq, grid_plan.n_heads, grid_plan.n_blocks)


@pytest.mark.parametrize("device", ["sm90", "sm120", "mi300x"])
@pytest.mark.parametrize("case", _CASES)
def test_layouts_of_one_device_plan_the_same_arithmetic(case, device, monkeypatch):
    monkeypatch.setattr(prefill.plan, "interpreter_enabled", lambda: False)  # the compiled run's plan
    plans = {layout: _plan(case, layout, device) for layout in LAYOUT_GRID_PROFILE}
    first, *others = LAYOUT_GRID_PROFILE
    a = plans[first]
    assert not a.empty and a.config is not None
    for layout in others:
        b = plans[layout]
        for f in dataclasses.fields(a):
            if f.compare and f.name not in _GRID_FIELDS:
                assert getattr(a, f.name) == getattr(b, f.name), f"{f.name}: {first} and {layout} plans differ"
        if a.grids is not None:  # the stages outside the planner: the same grids; the state kernel: the same work
            assert a.grids._replace(state=None) == b.grids._replace(state=None)
            assert _work(a.grids.state) == _work(b.grids.state)
            assert (a.grids.state.constexprs["LAYOUT"], b.grids.state.constexprs["LAYOUT"]) == (first, layout)
        assert _work(a.fused_grid) == _work(b.fused_grid)
        assert (a.segment_grids is None) == (b.segment_grids is None)
        if a.segment_grids is not None:
            assert [_work(g) for g in a.segment_grids] == [_work(g) for g in b.segment_grids]
