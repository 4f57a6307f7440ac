"""The device capabilities each launch layout of the contract test is planned with.

The contract says the layouts agree bitwise: the same kernels, the same arithmetic, on the same
device; only the program-id mapping differs. So both layouts are planned with the running
device's capabilities, and only the grid limits come from a profile per layout (the limits the
layout was made for: split with CUDA's, folded with the MI300X's; the contract cases' small grids
fit the H200 under both).

Taking a whole other profile for one layout changes the arithmetic, not only the mapping: the
MI300X profile has the prefill planner translate the dot precisions for gfx942 (``tf32x3`` ->
``ieee`` in the solve's diagonal blocks and the segment combine, ``prefill.dot_precision``) and
run the state kernel unpipelined (64 KiB of LDS). Compiled on the H200 that made the two layouts
run different instructions: the segmented bf16 cases' fp32 pool rows, written by the combine,
differed by an ulp (Triton 3.6, sm_90). The interpreter ignores the translation, so the CPU run
could not see it.
"""

from __future__ import annotations

import torch

from linattn.capabilities import DeviceCapabilities, probe, profile

#: The profile whose grid limits each layout is planned with (its limits only: :func:`layout_caps`).
LAYOUT_GRID_PROFILE = {"split": "sm90", "folded": "mi300x"}
#: The device the interpreter stands for (its capabilities, bar the grid limits)
INTERPRETED_PROFILE = "sm90"


def device_caps(device: torch.device) -> DeviceCapabilities:
    """The capabilities of the device the contract runs on: the GPU's as probed, or in the
    interpreter (a CPU device) the :data:`INTERPRETED_PROFILE` profile's."""
    return profile(INTERPRETED_PROFILE) if device.type == "cpu" else probe(device)


def layout_caps(layout: str, caps: DeviceCapabilities) -> DeviceCapabilities:
    """``caps`` (the running device's: :func:`device_caps`) with the grid limits of
    ``layout``'s profile (:data:`LAYOUT_GRID_PROFILE`), and nothing else changed.

    Raises:
        KeyError: an unknown layout (the known ones are :data:`LAYOUT_GRID_PROFILE`'s keys).
    Example:
        >>> layout_caps("folded", profile("sm90")).grid.z, layout_caps("folded", profile("sm90")).arch
        (2147483647, 'sm_90')
    """
    return caps.model_copy(update={"grid": profile(LAYOUT_GRID_PROFILE[layout]).grid})
