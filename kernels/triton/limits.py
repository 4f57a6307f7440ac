"""What the Triton kernels accept, importable without Triton.

The backends' predicates read these (a profile can be asked about on a machine without Triton);
the kernels and launchers in this package import them from here, so there is one copy.
"""

from __future__ import annotations

from typing import Optional

import torch

from linattn.capabilities import DeviceCapabilities
#: Floor of the log-space decay ``g`` in every backend (docs/ops-decisions.md), defined with the
#: reference maths that states it: ``exp(G_MIN)`` is 0 in float32 and float64.
from linattn.reference import G_MIN  # noqa: F401

#: Decode: largest head dims (the whole key dim is one block of the state tile).
MAX_HEAD_DIM = 256

#: Chunked prefill: head dims and q/k/v dtypes.
HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Shared memory per block of the sm_90 builds (tests/prefill/test_prefill_compile.py pins them):
# the state kernel is the largest. Software-pipelined (2 stages, K <= 128) it needs up to 113 KiB
# (bf16: GDN's, which also loads Tm diag(beta) and V to form U; KDA's bf16 state kernel writes the
# output and runs unpipelined at 64 KiB) or 145 KiB (KDA, fp32); unpipelined (K = 256, or a device
# with less shared memory) at most 80 KiB. Devices below _MIN_SMEM are rejected up front.
_PIPELINED_SMEM = {torch.bfloat16: 116 * 1024}
_PIPELINED_SMEM_OTHER = 148 * 1024
_MIN_SMEM = 96 * 1024
#: The same floor where a vendor's builds differ (issue 31): on AMD the configuration of a device below
#: the pipelining thresholds (every stage unpipelined) builds within 64 KiB of LDS per workgroup for
#: gfx942 (the largest: the state kernel at K = 256, 64 KiB; tests/contract/test_compile_amd.py holds
#: every build against its target's LDS), so MI300X (64 KiB) runs the chunked prefill.
_MIN_SMEM_BY_VENDOR = {"amd": 64 * 1024}


def min_shared_memory(caps: DeviceCapabilities) -> int:
    """Bytes of shared memory (LDS) per block the chunked prefill needs on ``caps``'s vendor."""
    return _MIN_SMEM_BY_VENDOR.get(caps.vendor, _MIN_SMEM)


def prefill_supported(family: str, K: int, V: int, dtype: torch.dtype,
                      caps: Optional[DeviceCapabilities] = None) -> Optional[str]:
    """Can the Triton chunked prefill run this problem? ``None`` if yes, else the reason.

    Args:
        family: ``"gdn"`` or ``"kda"``.
        K, V: key and value head dims.
        dtype: dtype of q, k, v.
        caps: the device (None: not checked against a device).
    Returns:
        None, or a message naming the field, the value and the supported set, e.g.
        ``"unsupported head_dim K=96; supported: 64, 128, 256"``.
    Example:
        >>> prefill_supported("gdn", 96, 128, torch.bfloat16)
        'unsupported head_dim K=96; supported: 64, 128, 256'
    """
    if family not in ("gdn", "kda"):
        return f"unsupported family {family!r}; supported: gdn, kda"
    sup = ", ".join(str(d) for d in HEAD_DIMS)
    if K not in HEAD_DIMS:
        return f"unsupported head_dim K={K}; supported: {sup}"
    if V not in HEAD_DIMS:
        return f"unsupported head_dim V={V}; supported: {sup}"
    if dtype not in DTYPES:
        return f"unsupported dtype {dtype}; supported: float32, bfloat16, float16"
    if caps is not None and caps.device_type != "cpu" and not caps.toolchain.triton_interpreter:
        need = min_shared_memory(caps)
        if caps.shared_memory_per_block < need:
            return (f"the chunked prefill kernels need {need // 1024} KiB of shared memory per "
                    f"block; {caps.name} has {caps.shared_memory_per_block // 1024} KiB")
    return None
