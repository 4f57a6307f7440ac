"""Lazy, cached probes that turn a torch device into :class:`DeviceCapabilities`.

Nothing is probed at import time. ``probe(device)`` asks the driver (through torch) once per
device and caches the answer; limits that no driver API exposes through torch come from the
vendor tables in :mod:`linattn.capabilities.profiles`, which name their sources.
"""

from __future__ import annotations

import functools
import os
import platform
from importlib import metadata
from typing import Optional, Union

import torch

from .models import DeviceCapabilities, Toolchain
from .profiles import PROFILES


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def toolchain() -> Toolchain:
    """Installed versions, read from package metadata (no heavy imports)."""
    return Toolchain(
        torch=torch.__version__,
        triton=_version("triton") or _version("pytorch-triton-rocm") or _version("pytorch-triton-xpu"),
        cutlass_dsl=_version("nvidia-cutlass-dsl"),
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        triton_interpreter=interpreter_enabled(),
    )


def _probe_cuda(index: int) -> DeviceCapabilities:
    p = torch.cuda.get_device_properties(index)
    tc = toolchain()
    is_rocm = tc.hip is not None
    if is_rocm:
        arch = getattr(p, "gcnArchName", "gfx").split(":")[0]
        base = PROFILES["mi300x"]
        vendor = "amd"
    else:
        arch = f"sm_{p.major}{p.minor}"
        base = PROFILES["sm90"]
        vendor = "nvidia"
    shared = getattr(p, "shared_memory_per_block_optin", None) or getattr(p, "shared_memory_per_block", None)
    return DeviceCapabilities(
        vendor=vendor,
        device_type="cuda",
        device_index=index,
        name=p.name,
        arch=arch,
        compute_capability=(p.major, p.minor),
        sm_count=p.multi_processor_count,
        grid=base.grid,  # no torch API for grid limits: the vendor table (source named there)
        max_threads_per_block=getattr(p, "max_threads_per_block", None) or base.max_threads_per_block,
        shared_memory_per_block=shared or base.shared_memory_per_block,
        warp_size=getattr(p, "warp_size", None) or base.warp_size,
        total_memory=p.total_memory,
        toolchain=tc,
    )


def _probe_xpu(index: int) -> DeviceCapabilities:
    p = torch.xpu.get_device_properties(index)
    base = PROFILES["xpu-pvc"]
    return base.model_copy(
        update=dict(
            device_index=index,
            name=p.name,
            sm_count=getattr(p, "gpu_subslice_count", None) or getattr(p, "max_compute_units", base.sm_count),
            total_memory=getattr(p, "total_memory", None),
            toolchain=toolchain(),
            profile=None,
        )
    )


def _probe_cpu() -> DeviceCapabilities:
    base = PROFILES["cpu"]
    return base.model_copy(
        update=dict(
            name=platform.processor() or platform.machine() or "CPU",
            arch=platform.machine() or "cpu",
            sm_count=os.cpu_count() or 1,
            toolchain=toolchain(),
            profile=None,
        )
    )


@functools.lru_cache(maxsize=None)
def _probe(device_type: str, index: Optional[int], interp: bool) -> DeviceCapabilities:
    if device_type == "cuda":
        return _probe_cuda(index if index is not None else torch.cuda.current_device())
    if device_type == "xpu":
        return _probe_xpu(index if index is not None else torch.xpu.current_device())
    if device_type == "cpu":
        return _probe_cpu()
    return PROFILES["cpu"].model_copy(
        update=dict(vendor="other", device_type="other", name=device_type, arch=device_type,
                    toolchain=toolchain(), profile=None)
    )


def probe(device: Union[torch.device, str, None] = None) -> DeviceCapabilities:
    """Capabilities of ``device`` (default: the CPU), probed once and cached.

    Args:
        device: a ``torch.device``, a string such as ``"cuda:0"``, or None for the CPU.
    Returns:
        DeviceCapabilities (frozen).
    Example:
        >>> from linattn.capabilities import probe
        >>> probe("cpu").vendor
        'cpu'
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    idx = dev.index
    if dev.type == "cuda" and idx is None:
        idx = torch.cuda.current_device()
    return _probe(dev.type, idx, interpreter_enabled())


def clear_cache() -> None:
    """Forget probed devices (tests that change the environment use this)."""
    _probe.cache_clear()
