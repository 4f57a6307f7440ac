"""The CUDA kernels one call launches, for the GPU tests that hold a feature to "no extra launch"
(tests/gpu/test_features_gpu.py, tests/gpu/test_separate_slots_gpu.py)."""

from __future__ import annotations

import torch


def cuda_kernels(fn) -> list[str]:
    """The sorted names of the CUDA kernels one call of ``fn`` launches (torch.profiler), after a
    first call that compiles and warms up; memcpy and memset entries are left out."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # compile / warm up first
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
