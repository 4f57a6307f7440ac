"""CuTe DSL kernels (``nvidia-cutlass-dsl``, optional: ``pip install 'linattn[cutedsl]'``).

Nothing here imports ``cutlass`` at import time: the toolchain is looked up from package metadata
(:func:`dsl_version`) and the kernels are imported when first compiled. Kernels are built only
from instructions that exist on SM80 and later (warp-level ``mma.sync``, ``ldmatrix``,
``cp.async``), so what runs on an H200 (SM90) is what an SM100 part runs; CI compiles them on the
CPU for ``sm_90a`` and ``sm_100a``.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Optional

import torch

# The version these kernels are written for and compile-checked with.
MIN_DSL_VERSION = (4, 8)
# Minimum nvidia-cutlass-dsl per supported arch (the kernels' own floor: every arch listed here
# is compile-checked with 4.8; none is known to work with an older DSL).
MIN_DSL_FOR_ARCH = {"sm_90": (4, 8), "sm_100": (4, 8), "sm_103": (4, 8)}
SUPPORTED_ARCHS = tuple(MIN_DSL_FOR_ARCH)
SUPPORTED_K = (64, 128)
SUPPORTED_V = (64, 128)


def dsl_version() -> Optional[str]:
    """The installed nvidia-cutlass-dsl version (package metadata; no import), or None."""
    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return None


def parse_version(v: str) -> tuple[int, ...]:
    """``"4.8.1"`` -> ``(4, 8, 1)``; stops at the first non-numeric part (``"4.9.0rc1"`` -> ``(4, 9)``)."""
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits or digits != part:
            if digits and part.startswith(digits):
                out.append(int(digits))
            break
        out.append(int(digits))
    return tuple(out)


def dsl_arch(arch: str) -> str:
    """CuTe DSL target for a device arch: ``sm_90`` -> ``sm_90a``, ``sm_100`` -> ``sm_100a``."""
    return arch if arch.endswith("a") else arch + "a"


@functools.lru_cache(maxsize=None)
def device_arch(device: torch.device) -> str:
    """The CuTe DSL target of a CUDA device (``sm_90a`` on an H200)."""
    major, minor = torch.cuda.get_device_capability(device)
    return dsl_arch(f"sm_{major}{minor}")


@functools.lru_cache(maxsize=None)
def importable() -> Optional[str]:
    """None when ``cutlass.cute`` imports, else the error (as text)."""
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401,F811
    except Exception as e:  # noqa: BLE001 - any import failure means: not usable
        return f"{type(e).__name__}: {e}"
    return None


def sm90_refusal(device: Optional[torch.device], what: str, caps=None) -> str:
    """Why ``what`` (an sm_90a-only CuTe DSL kernel, e.g. "the CuTe DSL fused walk") cannot run on
    ``device`` ('' where it can: an NVIDIA CUDA GPU of compute capability 9.x with ``cutlass.cute``
    importing; ``device`` None: only the import is asked). ``caps``: the device as a
    :class:`linattn.capabilities.DeviceCapabilities` profile, asked first (the planner's and
    ``linattn.explain``'s view, which has no device: NVIDIA CUDA of compute capability 9.x with
    nvidia-cutlass-dsl in its toolchain); None: not asked."""
    if caps is not None:
        cc = caps.compute_capability
        if caps.device_type != "cuda" or caps.vendor != "nvidia" or cc is None:
            return f"{what} runs on NVIDIA CUDA GPUs; this is {caps.vendor} {caps.arch}"
        if cc[0] != 9:
            return f"{what} is built for sm_90a (H100 / H200); this GPU is {caps.arch}"
        if caps.toolchain.cutlass_dsl is None:
            return "nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')"
    if device is not None:
        if device.type != "cuda":
            return f"{what} runs on CUDA GPUs; got device {device}"
        if torch.version.hip is not None:
            return f"{what} is NVIDIA's (sm_90a); this is a ROCm build"
        major = torch.cuda.get_device_capability(device)[0]
        if major != 9:
            return f"{what} is built for sm_90a (H100 / H200); this GPU is sm_{major}x"
    err = importable()
    if err is not None:
        return f"nvidia-cutlass-dsl does not import: {err}"
    return ""
