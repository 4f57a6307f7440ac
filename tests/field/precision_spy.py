"""Shared by the F36 field tests and the fuzz suite's precision-flags kind: the caller's global
matmul precision settings, a spy on the flags in force at every matmul-like torch call, and a
context manager that sets one setting as a caller would and gives every flag back exactly."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from linattn.precision import precision_flags

NEW_API = hasattr(torch.backends, "fp32_precision")  # torch >= 2.9's per-backend flags
MATMULS = {torch.matmul, torch.bmm, torch.baddbmm, torch.mm, torch.Tensor.__matmul__, torch.Tensor.matmul,
           torch.Tensor.bmm, torch.Tensor.baddbmm, torch.Tensor.baddbmm_, torch.Tensor.mm}
#: the user's global setting, as a caller would write it; "new api bf16": the per-backend flag
SETTINGS = {"medium": lambda: torch.set_float32_matmul_precision("medium"),
            "high": lambda: torch.set_float32_matmul_precision("high"),
            **({"new api bf16": lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16")}
               if NEW_API else {})}
#: every per-backend flag, to give back exactly (no mixed-API state)
FLAG_FIELDS = [(torch.backends, "fp32_precision")] + [(m, "fp32_precision") for m in (
    torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv, torch.backends.mkldnn.rnn, torch.backends.cuda.matmul,
    torch.backends.cudnn.conv, torch.backends.cudnn.rnn)] if NEW_API else []


class MatmulSpy(TorchFunctionMode):
    """Records the precision flags in force at every matmul-like torch call (``seen``)."""

    def __init__(self):
        super().__init__()
        self.seen: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.seen.append(precision_flags())
        return func(*args, **(kwargs or {}))


class UserFlags:
    """On entry saves every flag and returns a setter of :data:`SETTINGS` (by name); on exit gives
    every flag back exactly."""

    def __enter__(self):
        self.legacy = torch.get_float32_matmul_precision()
        self.saved = [getattr(o, a) for o, a in FLAG_FIELDS]
        return lambda name: SETTINGS[name]()

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self.legacy)
        for (o, a), v in zip(FLAG_FIELDS, self.saved):
            setattr(o, a, v)
