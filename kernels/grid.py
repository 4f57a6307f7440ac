"""Launch-grid planner: from (work items, device limits, layout) to a grid and a layout tag.

A decode-style kernel has three work dimensions: value blocks (``blk``), sequences (``seq``) and
heads (``head``). The planner places them on the launch grid's axes (x, y, z) according to a
*layout*:

- ``split`` (CUDA): each dimension on its own axis. The preferred placement is value blocks on
  x, heads on y, sequences on z: the hardware dispatches x fastest, so programs running at the
  same time then walk one state slot contiguously (docs/performance.md#decode-grid-placement).
  When a count does not fit there (CUDA's y and z take 65,535
  programs), the planner moves sequences to x (2**31-1 programs) and then tries every other
  placement, so the sequence count is not capped at 65,535 on CUDA.
- ``folded`` (ROCm, XPU): the legacy ``(NK, NV, N*HV)`` mapping, with sequences and heads folded
  onto axis z and value blocks on axis y (NK is 1: the whole key dim is one block). It fits where
  every axis takes 2**31-1 programs (HIP, Level Zero) and fails on CUDA past 65,535 on axis z,
  which is exactly the fault of the seed: the planner now says so before launch.

Every plan also respects the device's total program count (``GridLimits.total``) where one is set.
The kernels decode program ids with one helper (:func:`linattn.kernels.triton._pid.decode_pid`)
that reads the plan's ``constexprs``; :func:`decode_pid_py` is its pure-Python model, used by the
property tests to prove that a plan visits every work item exactly once.

Example:
    >>> from linattn.capabilities import profile
    >>> plan_grid(8192, 32, 4, profile("sm90"), "split").grid
    (4, 32, 8192)
    >>> plan_grid(70000, 32, 4, profile("sm90"), "split").grid
    (70000, 32, 4)
    >>> plan_grid(8192, 32, 4, profile("mi300x"), "folded").grid
    (1, 4, 262144)
"""

from __future__ import annotations

import functools
import itertools
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from linattn.capabilities import DeviceCapabilities

Layout = Literal["split", "folded"]
LAYOUTS: tuple[str, ...] = ("split", "folded")
_DIMS = ("seq", "head", "blk")
# Placements tried for ``split``, in order; perm[d] = axis of dimension d (seq, head, blk).
# First blk on x / head on y / seq on z (locality), then seq on x (2**31-1 on CUDA), then the rest.
_SPLIT_ORDER = ((2, 1, 0), (0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1))


class GridLimitError(ValueError):
    """No launch grid of the requested layout fits the device's limits (raised before launch)."""


class GridPlan(BaseModel):
    """A launch grid and how the kernel must decode its program ids.

    Fields:
        grid: programs on axes (x, y, z).
        layout: ``"split"`` or ``"folded"``.
        axes: what sits on x, y, z: dimension names ``seq``, ``head``, ``blk``, ``seq*head``
            (folded) or ``1`` (an axis of one program).
        n_seq, n_heads, n_blocks: the work counts the plan covers.
        constexprs: the ``tl.constexpr`` values to pass to the kernel (``LAYOUT``, ``AX_SEQ``,
            ``AX_HEAD``, ``AX_BLK``: the axis index of each dimension; in ``folded`` both
            ``AX_SEQ`` and ``AX_HEAD`` are 2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid: tuple[int, int, int]
    layout: str
    axes: tuple[str, str, str]
    n_seq: int
    n_heads: int
    n_blocks: int
    constexprs: dict[str, Union[int, str]]

    @property
    def programs(self) -> int:
        """Programs in the grid (0 when there is no work: launch nothing)."""
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def empty(self) -> bool:
        return self.programs == 0


def default_layout(caps: DeviceCapabilities) -> str:
    """The layout a device runs by default: ``"split"`` on NVIDIA (and the CPU interpreter),
    ``"folded"`` on AMD and Intel (the legacy mapping those stacks were validated with)."""
    return "folded" if caps.vendor in ("amd", "intel") else "split"


def _limits_text(x: int, y: int, z: int, total: Optional[int], source: str) -> str:
    t = f", total<={total:,}" if total is not None else ""
    return f"x<={x:,}, y<={y:,}, z<={z:,}{t} ({source})"


def _split_placement(counts: tuple, limits: tuple) -> Optional[tuple]:
    """The first of :data:`_SPLIT_ORDER`'s placements (``perm[d]``: the axis of dimension ``d``) under
    which every count fits its axis's limit, or None: the split layout's search, for :func:`plan_grid`
    and :func:`grid_fits` alike."""
    return next((perm for perm in _SPLIT_ORDER if all(counts[d] <= limits[perm[d]] for d in range(3))), None)


@functools.lru_cache(maxsize=4096)
def _plan(n_seq: int, n_heads: int, n_blocks: int, lx: int, ly: int, lz: int,
          total: Optional[int], source: str, layout: str) -> GridPlan:
    counts = (n_seq, n_heads, n_blocks)
    limits = (lx, ly, lz)
    work = n_seq * n_heads * n_blocks
    what = f"{n_seq:,} sequences x {n_heads:,} heads x {n_blocks:,} value blocks"
    lim = _limits_text(lx, ly, lz, total, source)
    if work == 0:  # nothing to do: a plan that launches nothing
        return GridPlan(grid=(0, 0, 0), layout=layout, axes=("seq", "head", "blk"), n_seq=n_seq,
                        n_heads=n_heads, n_blocks=n_blocks,
                        constexprs={"LAYOUT": layout, "AX_SEQ": 0, "AX_HEAD": 1, "AX_BLK": 2})
    if total is not None and work > total:
        raise GridLimitError(
            f"{what} = {work:,} programs exceed the device's total of {total:,} programs ({lim}); "
            "launch the batch in smaller pieces or use wider value blocks")
    if layout == "folded":
        grid = (1, n_blocks, n_seq * n_heads)
        if n_blocks > ly or n_seq * n_heads > lz:
            raise GridLimitError(
                f"folded layout needs grid {grid} for {what}, past the device's limits ({lim}); "
                "use the 'split' layout (backend triton-split) on this device, or split the batch")
        return GridPlan(grid=grid, layout=layout, axes=("1", "blk", "seq*head"), n_seq=n_seq,
                        n_heads=n_heads, n_blocks=n_blocks,
                        constexprs={"LAYOUT": "folded", "AX_SEQ": 2, "AX_HEAD": 2, "AX_BLK": 1})
    if layout != "split":
        raise ValueError(f"layout={layout!r}; known layouts: {', '.join(LAYOUTS)}")
    perm = _split_placement(counts, limits)  # perm[d] = axis of dimension d
    if perm is not None:
        grid = [1, 1, 1]
        axes = ["", "", ""]
        for d in range(3):
            grid[perm[d]] = counts[d]
            axes[perm[d]] = _DIMS[d]
        return GridPlan(grid=tuple(grid), layout="split", axes=tuple(axes), n_seq=n_seq,
                        n_heads=n_heads, n_blocks=n_blocks,
                        constexprs={"LAYOUT": "split", "AX_SEQ": perm[0], "AX_HEAD": perm[1],
                                    "AX_BLK": perm[2]})
    raise GridLimitError(
        f"split layout: no placement of {what} on the grid axes fits the device's limits ({lim}); "
        "split the batch into several launches")


def plan_grid(n_seq: int, n_heads: int, n_blocks: int, caps: DeviceCapabilities,
              layout: Layout) -> GridPlan:
    """Plan the launch grid for ``n_seq x n_heads x n_blocks`` work items on a device.

    Args:
        n_seq: sequences (decode batch rows; rows ``M`` for the SwiGLU clamp), >= 0.
        n_heads: heads per sequence (``HV`` for decode; 1 for the clamp), >= 0.
        n_blocks: blocks per (sequence, head): value blocks ``cdiv(V, BV)`` for decode, column
            blocks for the clamp, >= 0.
        caps: the device (its ``grid`` limits are read: per axis and ``total``).
        layout: ``"split"`` or ``"folded"`` (see the module docstring).
    Returns:
        A frozen :class:`GridPlan`; ``plan.empty`` when there is no work (launch nothing).
    Raises:
        GridLimitError: no grid of this layout fits the device (message: the counts, the
            device's limits and what to do). Raised before any launch.
        ValueError: an unknown layout or a negative count.
    """
    if min(n_seq, n_heads, n_blocks) < 0:
        raise ValueError(f"work counts must be >= 0, got n_seq={n_seq}, n_heads={n_heads}, n_blocks={n_blocks}")
    g = caps.grid
    return _plan(int(n_seq), int(n_heads), int(n_blocks), g.x, g.y, g.z, g.total, g.source, layout)


def grid_fits(n_seq: int, n_heads: int, n_blocks: int, caps: DeviceCapabilities, layout: Layout) -> bool:
    """Whether :func:`plan_grid` plans these counts without a ``GridLimitError``, by arithmetic on
    the device's limits alone: no plan or message is built (the Triton backends' ``size_class``
    asks this for every new decode batch, issue 28). The same conditions as :func:`plan_grid`, in
    the same order (``tests/kernels/test_grid.py`` holds the two to agreement).

    Raises:
        ValueError: an unknown layout or a negative count (as :func:`plan_grid`).
    """
    if min(n_seq, n_heads, n_blocks) < 0:
        raise ValueError(f"work counts must be >= 0, got n_seq={n_seq}, n_heads={n_heads}, n_blocks={n_blocks}")
    g = caps.grid
    counts = (int(n_seq), int(n_heads), int(n_blocks))
    work = counts[0] * counts[1] * counts[2]
    if work == 0:
        return True
    if g.total is not None and work > g.total:
        return False
    if layout == "folded":
        return counts[2] <= g.y and counts[0] * counts[1] <= g.z
    if layout != "split":
        raise ValueError(f"layout={layout!r}; known layouts: {', '.join(LAYOUTS)}")
    return _split_placement(counts, (g.x, g.y, g.z)) is not None


def decode_pid_py(plan: GridPlan, pid: tuple[int, int, int]) -> tuple[int, int, int]:
    """Pure-Python model of ``decode_pid``: program coordinates -> ``(i_blk, i_seq, i_head)``."""
    c = plan.constexprs
    if c["LAYOUT"] == "split":
        return pid[c["AX_BLK"]], pid[c["AX_SEQ"]], pid[c["AX_HEAD"]]
    return pid[1], pid[2] // plan.n_heads, pid[2] % plan.n_heads


def encode_work_item(plan: GridPlan, i_blk: int, i_seq: int, i_head: int) -> tuple[int, int, int]:
    """Inverse of :func:`decode_pid_py`: the program that handles one work item."""
    c = plan.constexprs
    if c["LAYOUT"] == "split":
        pid = [0, 0, 0]
        pid[c["AX_BLK"]], pid[c["AX_SEQ"]], pid[c["AX_HEAD"]] = i_blk, i_seq, i_head
        return tuple(pid)
    return 0, i_blk, i_seq * plan.n_heads + i_head


def all_programs(plan: GridPlan):
    """Every program coordinate of a plan (small plans only: tests enumerate it)."""
    return itertools.product(range(plan.grid[0]), range(plan.grid[1]), range(plan.grid[2]))
