"""Kind "global precision flags" (F36): valid random problems on the CPU backends with the caller's
float32 matmul precision lowered (``"medium"``: bf16 on oneDNN, ``"high"``: TF32, or torch >= 2.9's
per-backend ``mkldnn.matmul.fp32_precision = "bf16"``; the settings and the spy:
``tests/field/precision_spy.py``, shared with the F36 field tests).

Every property of ``fuzz_checks`` holds as with the default flags (the float64 oracle's tolerance,
untouched rows, views equal to contiguous), every matmul the backend issues runs under IEEE fp32
(a ``TorchFunctionMode`` spy), and the caller's flags are the same after the call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_checks import check_decode, check_prefill
from fuzz_known_bugs import excluded
from fuzz_strategies import build_decode, build_prefill, decode_specs, prefill_specs
from fuzz_support import Tally, current_id as _key, fuzz_settings

from linattn.precision import precision_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "field"))
from precision_spy import SETTINGS as _SETTERS, MatmulSpy, UserFlags  # noqa: E402

SETTINGS = tuple(_SETTERS)


def _pinned(flags: dict) -> bool:
    return all(v in ("ieee", False, "highest") for v in flags.values())


def _run(check, built, backend, setting):
    spy = MatmulSpy()
    with UserFlags() as set_flags:
        set_flags(setting)
        before = precision_flags()
        with spy:
            outcome = check(built, backend)
        assert precision_flags() == before, f"the caller's flags changed: {before} -> {precision_flags()}"
    assert all(_pinned(f) for f in spy.seen), f"a matmul ran under {next(f for f in spy.seen if not _pinned(f))}"
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
    from linattn.dispatch.runtime.registry import get_registry

    if backend not in get_registry().backends:
        pytest.skip(f"backend {backend} not installed")

    @fuzz_settings(8, key=_key())
    @given(spec=prefill_specs(op, backend, "plain", exclude=excluded(op, backend)), setting=st.sampled_from(SETTINGS))
    def prop(spec, setting):
        with Tally("precision flags", op, backend, spec) as tally:
            tally.outcome = _run(check_prefill, build_prefill(spec), backend, setting)

    prop()
