"""Frozen value objects describing a device and its toolchain.

Everything the dispatcher and the launch-grid planner need to know about a device is here, as
data: backends' predicates read these fields, never the device itself. Probes
(:mod:`linattn.capabilities.probe`) fill them in from the driver; named profiles
(:mod:`linattn.capabilities.profiles`) let tests and the CLI ask "what would be chosen there".
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Vendor = Literal["nvidia", "amd", "intel", "cpu", "other"]


class Toolchain(BaseModel):
    """Versions of the software stack that decide which kernels can be built (None = absent)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    torch: Optional[str] = None
    triton: Optional[str] = None
    cutlass_dsl: Optional[str] = Field(None, description="nvidia-cutlass-dsl (CuTe DSL) version")
    cuda: Optional[str] = None
    hip: Optional[str] = None
    triton_interpreter: bool = Field(False, description="TRITON_INTERPRET=1 was set")


class GridLimits(BaseModel):
    """Launch-grid limits: programs per axis (x, y, z) and, where a vendor has one, in total."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    x: int
    y: int
    z: int
    total: Optional[int] = None
    source: str = Field(description="where the numbers come from (driver API or a vendor document)")

    def axis(self, i: int) -> int:
        return (self.x, self.y, self.z)[i]


class DeviceCapabilities(BaseModel):
    """What one device can do. Units: bytes for memory, programs for grid limits.

    Example:
        >>> from linattn.capabilities import profile
        >>> profile("sm90").grid.y
        65535
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vendor: Vendor
    device_type: Literal["cuda", "cpu", "xpu", "other"] = Field(
        description="torch device type (ROCm devices are 'cuda' in torch)"
    )
    device_index: Optional[int] = None
    name: str
    arch: str = Field(description="sm_90, sm_100, gfx942, pvc, x86_64, ...")
    compute_capability: Optional[tuple[int, int]] = None
    sm_count: int = Field(description="SMs (NVIDIA), CUs (AMD), Xe cores (Intel), cores (CPU)")
    grid: GridLimits
    max_threads_per_block: int
    shared_memory_per_block: int = Field(description="bytes, opt-in maximum where one exists")
    warp_size: int
    total_memory: Optional[int] = Field(None, description="bytes")
    toolchain: Toolchain = Toolchain()
    profile: Optional[str] = Field(None, description="the named profile this came from, if any")

    @property
    def is_cuda(self) -> bool:
        """An NVIDIA GPU driven by CUDA (not ROCm behind torch's 'cuda' device type)."""
        return self.vendor == "nvidia"

    def with_toolchain(self, **changes) -> "DeviceCapabilities":
        """A copy with some toolchain versions changed (e.g. ``triton=None`` = not installed)."""
        return self.model_copy(update={"toolchain": self.toolchain.model_copy(update=changes)})
