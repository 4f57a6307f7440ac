"""Named device profiles: what the dispatcher would see on hardware we may not have.

Numbers and their sources:
- NVIDIA (sm90 = H200, sm100 = B200, sm103 = B300, sm120 = RTX PRO 6000 Blackwell): grid x up to
  2**31-1, y and z up to 65,535 programs, 1,024 threads per block (CUDA C++ Programming Guide,
  "Compute Capabilities" table); opt-in shared memory 227 KiB on sm_90/sm_100 and 99 KiB on
  sm_120 (same table); SM counts from the product data sheets (H200 132, B200 148, B300 148,
  RTX PRO 6000 188).
- AMD MI300X (gfx942): 304 CUs, wavefront 64, 64 KiB LDS per workgroup, 1,024 threads per
  workgroup; HIP grid dimensions up to 2**31-1 per axis with at most 2**32-1 work-items in all
  (hipDeviceProp_t.maxGridSize; AMD HIP programming guide). That is why the legacy folded
  (NK, NV, N*HV) grid works there and not on CUDA.
- AMD MI355X (gfx950, CDNA4): 256 CUs, wavefront 64, 160 KiB LDS per workgroup, 288 GB HBM3E (AMD
  Instinct MI355X data sheet); grid limits as MI300X. Built for on the CPU only (issue 31).
- Intel Data Center GPU Max 1550 (pvc): 128 Xe cores, sub-group 16/32 (we model 32), 128 KiB SLM,
  1,024 work-items per group; group counts up to 2**31-1 per dimension (Level Zero
  maxGroupCount as SYCL exposes it).
- cpu: the PyTorch reference and the Triton interpreter, no launch limits of their own.
"""

from __future__ import annotations

from .models import DeviceCapabilities, GridLimits, Toolchain

_CUDA_GRID = GridLimits(x=2**31 - 1, y=65535, z=65535, source="CUDA C++ Programming Guide, compute capabilities table")

_TC_CUDA = Toolchain(torch="2.11.0", triton="3.6.0", cutlass_dsl="4.8.1", cuda="13.0")

PROFILES: dict[str, DeviceCapabilities] = {
    "sm90": DeviceCapabilities(
        vendor="nvidia", device_type="cuda", name="NVIDIA H200 (profile)", arch="sm_90",
        compute_capability=(9, 0), sm_count=132, grid=_CUDA_GRID, max_threads_per_block=1024,
        shared_memory_per_block=232448, warp_size=32, total_memory=141 * 2**30,
        toolchain=_TC_CUDA, profile="sm90",
    ),
    "sm100": DeviceCapabilities(
        vendor="nvidia", device_type="cuda", name="NVIDIA B200 (profile)", arch="sm_100",
        compute_capability=(10, 0), sm_count=148, grid=_CUDA_GRID, max_threads_per_block=1024,
        shared_memory_per_block=232448, warp_size=32, total_memory=180 * 2**30,
        toolchain=_TC_CUDA, profile="sm100",
    ),
    "sm103": DeviceCapabilities(
        vendor="nvidia", device_type="cuda", name="NVIDIA B300 (profile)", arch="sm_103",
        compute_capability=(10, 3), sm_count=148, grid=_CUDA_GRID, max_threads_per_block=1024,
        shared_memory_per_block=232448, warp_size=32, total_memory=288 * 2**30,
        toolchain=_TC_CUDA, profile="sm103",
    ),
    "sm120": DeviceCapabilities(
        vendor="nvidia", device_type="cuda", name="NVIDIA RTX PRO 6000 Blackwell (profile)",
        arch="sm_120", compute_capability=(12, 0), sm_count=188, grid=_CUDA_GRID,
        max_threads_per_block=1024, shared_memory_per_block=101376, warp_size=32,
        total_memory=96 * 2**30, toolchain=_TC_CUDA, profile="sm120",
    ),
    "mi300x": DeviceCapabilities(
        vendor="amd", device_type="cuda", name="AMD Instinct MI300X (profile)", arch="gfx942",
        compute_capability=(9, 4), sm_count=304,
        grid=GridLimits(x=2**31 - 1, y=2**31 - 1, z=2**31 - 1, total=(2**32 - 1) // 256,
                        source="HIP hipDeviceProp_t.maxGridSize (2**31-1 per axis); grid x block "
                               "work-items <= 2**32-1, i.e. 2**24 programs of 256 work-items"),
        max_threads_per_block=1024, shared_memory_per_block=65536, warp_size=64,
        total_memory=192 * 2**30, toolchain=Toolchain(torch="2.11.0", triton="3.6.0", hip="6.4"),
        profile="mi300x",
    ),
    "mi355x": DeviceCapabilities(
        vendor="amd", device_type="cuda", name="AMD Instinct MI355X (profile)", arch="gfx950",
        compute_capability=(9, 5), sm_count=256,
        grid=GridLimits(x=2**31 - 1, y=2**31 - 1, z=2**31 - 1, total=(2**32 - 1) // 256,
                        source="HIP hipDeviceProp_t.maxGridSize (2**31-1 per axis); grid x block "
                               "work-items <= 2**32-1, i.e. 2**24 programs of 256 work-items"),
        max_threads_per_block=1024, shared_memory_per_block=163840, warp_size=64,
        total_memory=288 * 2**30, toolchain=Toolchain(torch="2.11.0", triton="3.6.0", hip="7.0"),
        profile="mi355x",
    ),
    "xpu-pvc": DeviceCapabilities(
        vendor="intel", device_type="xpu", name="Intel Data Center GPU Max 1550 (profile)",
        arch="pvc", sm_count=128,
        grid=GridLimits(x=2**31 - 1, y=2**31 - 1, z=2**31 - 1,
                        source="Level Zero zeDeviceGetComputeProperties maxGroupCount (2**31-1 per axis in SYCL)"),
        max_threads_per_block=1024, shared_memory_per_block=131072, warp_size=32,
        total_memory=128 * 2**30, toolchain=Toolchain(torch="2.11.0", triton="3.6.0"),
        profile="xpu-pvc",
    ),
    "cpu": DeviceCapabilities(
        vendor="cpu", device_type="cpu", name="CPU (profile)", arch="x86_64", sm_count=2,
        grid=GridLimits(x=2**31 - 1, y=2**31 - 1, z=2**31 - 1, source="no launch grid on the CPU"),
        max_threads_per_block=1, shared_memory_per_block=0, warp_size=1,
        toolchain=Toolchain(torch="2.13.0", triton=None), profile="cpu",
    ),
}


def profile(name: str) -> DeviceCapabilities:
    """The named profile (``sm100``, ``sm90``, ``sm103``, ``sm120``, ``mi300x``, ``mi355x``, ``xpu-pvc``, ``cpu``).

    Raises:
        KeyError: an unknown name; the message lists the known ones.
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown device profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}") from None
