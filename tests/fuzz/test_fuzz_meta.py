"""Fakes against real outputs (F39) and pickling of every refusal (F40), on random problems.

- ``fake``: a random valid decode / prefill problem (float32, bfloat16 or float64; any view kind,
  pool or dense mode, tables, intermediate states, ...) runs for real on ``torch-ref`` and under
  ``FakeTensorMode``; the outputs' shape, dtype, device and strides must be equal
  (``tests/field/fake_grid.compare_fake``). Gating: random dtypes of each of its four inputs.
- ``pickle``: the refusal of a random problem (grad mode, no backend, an out-of-range slot) pickles
  and unpickles as itself: type, message, args and attributes.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import linattn
from fuzz_strategies import build_decode, build_prefill, decode_specs, prefill_specs
from fuzz_support import current_id as _key, Tally, fuzz_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "field"))
from fake_grid import assert_same_exception, compare_fake  # noqa: E402

DTYPES = ("float32", "bfloat16", "float64")


def _build(op: str, spec):
    return build_decode(spec) if op.endswith("_decode") else build_prefill(spec)


def _specs(op: str, focus: str):
    if op.endswith("_decode"):
        return decode_specs(op, "torch-ref", focus, dtypes=DTYPES)
    return prefill_specs(op, "torch-ref", focus, dtypes=DTYPES, long_seqs=False)


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill"])
def test_fake_equals_real_output(op):
    @fuzz_settings(8, key=_key())
    @given(spec=_specs(op, "mixed" if op.endswith("_decode") else "dense"))
    def prop(spec):
        with Tally("fake", op, "torch-ref", spec):
            assert compare_fake(op, _build(op, spec).kwargs) == []
    prop()


@pytest.mark.parametrize("op", ["gdn_gating", "kda_gating"])
def test_fake_equals_real_output_gating(op):
    kda = op == "kda_gating"

    @fuzz_settings(15, key=_key())
    @given(dts=st.tuples(*[st.sampled_from(DTYPES[::2])] * 2, *[st.sampled_from(DTYPES)] * 2),
           lead=st.lists(st.integers(0, 3), min_size=1, max_size=2), hv=st.integers(1, 3))
    def prop(dts, lead, hv):
        with Tally("fake", op, "torch-ref", (dts, lead, hv)):
            d = {k: getattr(torch, dt) for k, dt in zip(("A_log", "dt_bias", "a", "b"), dts)}
            args = dict(A_log=torch.randn(hv, dtype=d["A_log"]), dt_bias=torch.randn(hv, *((4,) if kda else ())).to(
                d["dt_bias"]), a=torch.randn(*lead, hv, *((4,) if kda else ())).to(d["a"]),
                b=torch.randn(*lead, hv).to(d["b"]))
            assert compare_fake(op, args) == []
    prop()


def _refusal(op: str, spec, kind: str) -> BaseException:
    kwargs = dict(_build(op, spec).kwargs)
    try:
        if kind == "grad":
            kwargs["v"] = kwargs["v"].detach().clone().requires_grad_(True)
            getattr(linattn, op)(**kwargs)
        elif kind == "nobackend":
            with linattn.policy(disable=tuple(linattn.list_backends())):
                getattr(linattn, op)(**kwargs)
        else:  # a slot past the pool's end (pool mode), or cu_seqlens past the tokens (dense)
            if "state_indices" in kwargs:
                idx = kwargs["state_indices"].clone()
                idx.view(-1)[0] = kwargs["state_pool"].shape[0]
                kwargs["state_indices"] = idx
            else:
                cu = kwargs["cu_seqlens"].clone()
                cu[-1] += 5
                kwargs["cu_seqlens"] = cu
            getattr(linattn, op)(**kwargs)
    except Exception as e:  # noqa: BLE001 - whatever linattn raises must pickle
        return e
    raise AssertionError(f"{op} {kind}: not refused")


@pytest.mark.parametrize("op", ["gdn_decode", "kda_prefill"])
def test_every_refusal_pickles_as_itself(op):
    @fuzz_settings(8, key=_key())
    @given(spec=_specs(op, "plain"), kind=st.sampled_from(("grad", "nobackend", "invalid")))
    def prop(spec, kind):
        with Tally("pickle", op, None, (spec, kind)) as tally:
            e = _refusal(op, spec, kind)
            assert_same_exception(pickle.loads(pickle.dumps(e)), e)
            tally.outcome = "refused"
    prop()
