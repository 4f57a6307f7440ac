"""Property tests of the launch-grid planner (pure Python; no Triton).

For any work counts up to 2**31-1 and every device profile, a plan either fits the device's
per-axis and total limits and covers every work item exactly once (through the Python model of
``decode_pid``), or the planner raises GridLimitError before launch, and then no grid of that
layout could fit.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.capabilities import PROFILES, GridLimits, profile
from linattn.kernels.grid import (GridLimitError, all_programs, decode_pid_py, default_layout,
                                  encode_work_item, grid_fits, plan_grid)

INT31 = 2**31 - 1
profiles = st.sampled_from(sorted(PROFILES))
layouts = st.sampled_from(["split", "folded"])
# counts from 1 to 2**31-1, biased to the interesting edges (65,535 and friends)
counts = st.one_of(st.integers(1, INT31), st.integers(1, 70_000),
                   st.sampled_from([1, 2, 65_535, 65_536, 2_050, 8_192, 10_923, 2**24, INT31]))


def _fits(plan, caps) -> bool:
    lim = caps.grid
    ok = all(plan.grid[i] <= lim.axis(i) for i in range(3))
    return ok and (lim.total is None or plan.programs <= lim.total)


def _any_fit(n_seq, n_heads, n_blocks, caps, layout) -> bool:
    """Brute force: could any grid of this layout fit?"""
    lim = caps.grid
    work = n_seq * n_heads * n_blocks
    if lim.total is not None and work > lim.total:
        return False
    if layout == "folded":
        return n_blocks <= lim.y and n_seq * n_heads <= lim.z
    return any(all(c <= lim.axis(a) for c, a in zip((n_seq, n_heads, n_blocks), perm))
               for perm in itertools.permutations(range(3)))


@settings(max_examples=600, deadline=None)
@given(n_seq=counts, n_heads=st.integers(1, 256), n_blocks=st.integers(1, 64), prof=profiles, layout=layouts)
def test_plan_fits_limits_and_is_a_bijection_or_raises_before_launch(n_seq, n_heads, n_blocks, prof, layout):
    caps = profile(prof)
    try:
        plan = plan_grid(n_seq, n_heads, n_blocks, caps, layout)
    except GridLimitError as e:
        assert not _any_fit(n_seq, n_heads, n_blocks, caps, layout)
        msg = str(e)
        assert f"{n_seq:,} sequences" in msg and ("limits" in msg or "total" in msg)
        return
    assert _fits(plan, caps)
    assert plan.programs == n_seq * n_heads * n_blocks  # as many programs as work items
    # decode(encode(w)) == w on the corners and a spread of items: with equal counts, decode is
    # onto, hence a bijection (every work item exactly once).
    picks = {0, n_seq - 1, n_seq // 2, (n_seq * 7919) % n_seq}
    for i_n in picks:
        for i_h in {0, n_heads - 1, n_heads // 3}:
            for i_b in {0, n_blocks - 1}:
                pid = encode_work_item(plan, i_b, i_n, i_h)
                assert all(0 <= pid[i] < plan.grid[i] for i in range(3))
                assert decode_pid_py(plan, pid) == (i_b, i_n, i_h)
    # and every program decodes to an in-range work item (the grid's far corner included)
    for pid in [(0, 0, 0), tuple(g - 1 for g in plan.grid), tuple(g // 2 for g in plan.grid)]:
        b, n, h = decode_pid_py(plan, pid)
        assert 0 <= b < n_blocks and 0 <= n < n_seq and 0 <= h < n_heads
        assert encode_work_item(plan, b, n, h) == pid


@settings(max_examples=200, deadline=None)
@given(n_seq=st.integers(1, 40), n_heads=st.integers(1, 9), n_blocks=st.integers(1, 5), prof=profiles,
       layout=layouts)
def test_small_plans_visit_every_work_item_exactly_once(n_seq, n_heads, n_blocks, prof, layout):
    plan = plan_grid(n_seq, n_heads, n_blocks, profile(prof), layout)
    seen = {}
    for pid in all_programs(plan):
        item = decode_pid_py(plan, pid)
        seen[item] = seen.get(item, 0) + 1
    expected = set(itertools.product(range(n_blocks), range(n_seq), range(n_heads)))
    assert set(seen) == expected and set(seen.values()) == {1}


@settings(max_examples=300, deadline=None)
@given(lx=st.integers(1, 50), ly=st.integers(1, 50), lz=st.integers(1, 50), total=st.one_of(st.none(), st.integers(1, 3000)),
       n_seq=st.integers(1, 60), n_heads=st.integers(1, 60), n_blocks=st.integers(1, 60), layout=layouts)
def test_any_limits_give_a_fitting_exact_plan_or_an_error(lx, ly, lz, total, n_seq, n_heads, n_blocks, layout):
    caps = profile("sm90").model_copy(update={"grid": GridLimits(x=lx, y=ly, z=lz, total=total, source="test")})
    fits = _any_fit(n_seq, n_heads, n_blocks, caps, layout)
    if not fits:
        with pytest.raises(GridLimitError):
            plan_grid(n_seq, n_heads, n_blocks, caps, layout)
        return
    plan = plan_grid(n_seq, n_heads, n_blocks, caps, layout)
    assert _fits(plan, caps)
    items = [decode_pid_py(plan, pid) for pid in all_programs(plan)]
    assert len(items) == len(set(items)) == n_seq * n_heads * n_blocks


def test_split_walks_value_blocks_on_x_and_moves_sequences_to_x_past_65535():
    plan = plan_grid(8192, 32, 4, profile("sm90"), "split")
    assert plan.grid == (4, 32, 8192) and plan.axes == ("blk", "head", "seq")
    past = plan_grid(65_536, 32, 4, profile("sm90"), "split")  # z takes 65,535 on CUDA
    assert past.grid == (65_536, 32, 4) and past.axes == ("seq", "head", "blk")
    big = plan_grid(INT31, 32, 4, profile("sm90"), "split")
    assert big.grid[0] == INT31


def test_folded_is_the_legacy_grid_and_fails_on_cuda_past_65535_before_launch():
    assert plan_grid(10_923, 6, 1, profile("mi300x"), "folded").grid == (1, 1, 65_538)
    assert plan_grid(2_047, 32, 4, profile("sm90"), "folded").grid == (1, 4, 65_504)
    with pytest.raises(GridLimitError, match=r"2,050 sequences x 32 heads.*z<=65,535.*split"):
        plan_grid(2_050, 32, 4, profile("sm90"), "folded")


def test_total_limit_of_mi300x_is_respected():
    total = profile("mi300x").grid.total
    n = total // 32 + 1
    with pytest.raises(GridLimitError, match="total"):
        plan_grid(n, 32, 1, profile("mi300x"), "folded")
    assert plan_grid(total // 32, 32, 1, profile("mi300x"), "folded").programs <= total


def test_split_falls_back_to_another_axis_order_when_heads_exceed_y():
    caps = profile("sm90")
    plan = plan_grid(3, 70_000, 2, caps, "split")  # 70,000 heads cannot sit on y (65,535)
    assert plan.axes[0] == "head" and _fits(plan, caps)


def test_no_work_launches_nothing():
    for n in [(0, 32, 4), (5, 0, 1), (5, 3, 0)]:
        plan = plan_grid(*n, profile("sm90"), "split")
        assert plan.empty and plan.programs == 0


@settings(max_examples=300, deadline=None)
@given(lx=st.integers(1, 50), ly=st.integers(1, 50), lz=st.integers(1, 50), total=st.one_of(st.none(), st.integers(1, 3000)),
       n_seq=st.integers(0, 60), n_heads=st.integers(0, 60), n_blocks=st.integers(0, 60), layout=layouts)
def test_grid_fits_is_whether_plan_grid_plans(lx, ly, lz, total, n_seq, n_heads, n_blocks, layout):
    """grid_fits (the Triton backends' size class, by arithmetic) is True exactly when plan_grid
    returns a plan, False exactly when it raises GridLimitError."""
    caps = profile("sm90").model_copy(update={"grid": GridLimits(x=lx, y=ly, z=lz, total=total, source="test")})
    try:
        plan_grid(n_seq, n_heads, n_blocks, caps, layout)
        planned = True
    except GridLimitError:
        planned = False
    assert grid_fits(n_seq, n_heads, n_blocks, caps, layout) is planned


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="layout"):
        plan_grid(1, 1, 1, profile("sm90"), "diagonal")
    with pytest.raises(ValueError, match=">= 0"):
        plan_grid(-1, 1, 1, profile("sm90"), "split")
    with pytest.raises(ValueError, match="layout"):
        grid_fits(1, 1, 1, profile("sm90"), "diagonal")
    with pytest.raises(ValueError, match=">= 0"):
        grid_fits(-1, 1, 1, profile("sm90"), "split")
    assert issubclass(GridLimitError, ValueError)


def test_default_layout_is_split_on_nvidia_and_folded_on_amd_and_intel():
    assert default_layout(profile("sm90")) == "split"
    assert default_layout(profile("sm100")) == "split"
    assert default_layout(profile("mi300x")) == "folded"
    assert default_layout(profile("xpu-pvc")) == "folded"


def test_planner_never_imports_triton():
    import subprocess
    import sys

    code = ("import sys, linattn.kernels.grid as g; from linattn.capabilities import profile; "
            "g.plan_grid(4, 2, 1, profile('sm90'), 'split'); print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
