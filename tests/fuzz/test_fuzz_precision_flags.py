"""Kind "global precision flags" (F36): valid random problems on the CPU backends with the caller's
float32 matmul precision lowered (``"medium"``: bf16 on oneDNN, ``"high"``: TF32, or torch >= 2.9's
per-backend ``mkldnn.matmul.fp32_precision = "bf16"``).

Every property of ``fuzz_checks`` holds as with the default flags (the float64 oracle's tolerance,
untouched rows, views equal to contiguous), every matmul the backend issues runs under IEEE fp32
(a ``TorchFunctionMode`` spy), and the caller's flags are the same after the call.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from fuzz_checks import check_decode, check_prefill
from fuzz_known_bugs import excluded
from fuzz_strategies import build_decode, build_prefill, decode_specs, prefill_specs
from fuzz_support import Tally, current_id as _key, fuzz_settings

from linattn.precision import precision_flags

NEW_API = hasattr(torch.backends, "fp32_precision")
SETTINGS = ("medium", "high") + (("mkldnn bf16",) if NEW_API else ())
MATMULS = {torch.matmul, torch.bmm, torch.baddbmm, torch.mm, torch.Tensor.__matmul__, torch.Tensor.matmul,
           torch.Tensor.bmm, torch.Tensor.baddbmm, torch.Tensor.baddbmm_, torch.Tensor.mm}
_FIELDS = [(torch.backends, "fp32_precision")] + [(m, "fp32_precision") for m in (
    torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv, torch.backends.mkldnn.rnn, torch.backends.cuda.matmul,
    torch.backends.cudnn.conv, torch.backends.cudnn.rnn)] if NEW_API else []


class _Spy(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.flags: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.flags.append(precision_flags())
        return func(*args, **(kwargs or {}))


class _UserFlags:
    """Sets one of :data:`SETTINGS` as a caller would; gives every flag back exactly on exit."""

    def __init__(self, setting: str):
        self.setting = setting

    def __enter__(self):
        self.legacy = torch.get_float32_matmul_precision()
        self.saved = [getattr(o, a) for o, a in _FIELDS]
        if self.setting == "mkldnn bf16":
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        else:
            torch.set_float32_matmul_precision(self.setting)
        return precision_flags()

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self.legacy)
        for (o, a), v in zip(_FIELDS, self.saved):
            setattr(o, a, v)


def _pinned(flags: dict) -> bool:
    return all(v in ("ieee", False, "highest") for v in flags.values())


def _run(check, built, backend, setting):
    spy = _Spy()
    with _UserFlags(setting) as before:
        with spy:
            outcome = check(built, backend)
        assert precision_flags() == before, f"the caller's flags changed: {before} -> {precision_flags()}"
    assert all(_pinned(f) for f in spy.flags), f"a matmul ran under {next(f for f in spy.flags if not _pinned(f))}"
    return outcome


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_decode_under_lowered_global_precision(op):
    @fuzz_settings(10, key=_key())
    @given(spec=decode_specs(op, "torch-ref", "plain", exclude=excluded(op, "torch-ref")), setting=st.sampled_from(SETTINGS))
    def prop(spec, setting):
        with Tally("precision flags", op, "torch-ref", spec) as tally:
            tally.outcome = _run(check_decode, build_decode(spec), "torch-ref", setting)

    prop()


@pytest.mark.parametrize("backend", ["torch-ref", "cpu-chunked"])
@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_prefill_under_lowered_global_precision(op, backend):
    from linattn.dispatch.registry import get_registry

    if backend not in get_registry().backends:
        pytest.skip(f"backend {backend} not installed")

    @fuzz_settings(8, key=_key())
    @given(spec=prefill_specs(op, backend, "plain", exclude=excluded(op, backend)), setting=st.sampled_from(SETTINGS))
    def prop(spec, setting):
        with Tally("precision flags", op, backend, spec) as tally:
            tally.outcome = _run(check_prefill, build_prefill(spec), backend, setting)

    prop()
