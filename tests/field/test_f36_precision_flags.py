"""Field case F36: a caller's global matmul precision flags must not lower linattn's fp32 accuracy.

``torch.set_float32_matmul_precision("medium")`` lets fp32 matmuls run in bf16 on CPUs with AMX /
AVX512-BF16 (``"high"``: TF32 on CUDA); torch-ref and the cpu-chunked plugin were 3-4e-3 off float64
there. Every PyTorch compute path now runs inside ``linattn.precision.ieee_fp32_matmul`` (IEEE fp32,
the caller's flags restored afterwards). The tests spy on every matmul the backends issue (a
``TorchFunctionMode``), so they pin the rule on any CPU, with or without bf16 units.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

import linattn
from linattn.backends.torch_ref import gdn_decode_ref, gdn_prefill_ref, kda_prefill_ref
from linattn.precision import ieee_fp32_matmul, precision_flags
from linattn.testing.compare import rel_error_exact_zero as _rel

from field_cases import assert_rows_unchanged, decode_inputs, prefill_inputs
from precision_spy import SETTINGS, MatmulSpy, UserFlags

#: the flags inside a pin: torch >= 2.9's per-backend API, else the legacy switches
PINNED = ({"mkldnn.matmul.fp32_precision": "ieee", "cuda.matmul.fp32_precision": "ieee", "cudnn.conv.fp32_precision": "ieee"}
          if hasattr(torch.backends, "fp32_precision") else
          {"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False, "float32_matmul_precision": "highest"})


@pytest.fixture
def user_flags():
    """Yields a setter of the user's global; afterwards gives back every flag exactly (no mixed-API state)."""
    legacy = torch.get_float32_matmul_precision()
    with UserFlags() as setter:
        yield setter
    assert torch.get_float32_matmul_precision() == legacy


def _backends(op: str) -> list[str]:
    return [b for b in ("torch-ref", "torch-chunked", "cpu-chunked") if b in linattn.list_backends() and op in linattn.list_backends()[b].ops]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_f36_prefill_runs_ieee_fp32_under_the_users_global_and_gives_it_back(user_flags, setting, family):
    x, pool = prefill_inputs(lens=(70, 5), K=16, V=16, P=4, kda=family == "kda")
    x = {k: v.cpu() for k, v in x.items()}
    ref = (kda_prefill_ref if family == "kda" else gdn_prefill_ref)
    ro, rf = ref(**{k: v.double() if v.is_floating_point() else v for k, v in x.items()},
                 initial_state=pool[:2].double().cpu(), compute_dtype=torch.float64)
    user_flags(setting)
    before = precision_flags()
    fn = getattr(linattn, f"{family}_prefill")
    for backend in _backends(f"{family}_prefill"):
        spy = MatmulSpy()
        with spy:
            o, f = fn(**x, initial_state=pool[:2].cpu(), backend=backend)
        assert spy.seen, f"{backend}: no matmul seen (the spy is blind)"
        assert all(s == PINNED for s in spy.seen), f"{backend} ran a matmul under {spy.seen[0]}"
        assert max(_rel(o, ro), _rel(f, rf)) < 1e-5, backend
        assert precision_flags() == before, f"{backend} left the user's flags changed"


@pytest.mark.parametrize("setting", ["medium", "high"])
def test_f36_decode_runs_ieee_fp32_and_leaves_other_rows_alone(user_flags, setting):
    x, pool = decode_inputs(N=3, P=6)
    x, pool = {k: v.cpu() for k, v in x.items()}, pool.cpu()
    idx = torch.tensor([4, 0, 2])
    ref_pool = pool.double()
    ro = gdn_decode_ref(**{k: v.double() for k, v in x.items()}, state_pool=ref_pool, state_indices=idx,
                        compute_dtype=torch.float64)
    user_flags(setting)
    before, pool0 = precision_flags(), pool.clone()
    spy = MatmulSpy()
    with spy:
        o = linattn.gdn_decode(**x, state_pool=pool, state_indices=idx, backend="torch-ref")
    assert spy.seen and all(s == PINNED for s in spy.seen)
    assert _rel(o, ro) < 1e-5 and _rel(pool[idx], ref_pool[idx]) < 1e-5
    assert_rows_unchanged(pool, pool0, idx)
    assert precision_flags() == before


def test_f36_flags_come_back_when_the_call_raises(user_flags):
    user_flags("medium")
    before = precision_flags()
    with pytest.raises(RuntimeError, match="inside"):
        with ieee_fp32_matmul():
            assert precision_flags() == PINNED
            raise RuntimeError("raised inside")
    assert precision_flags() == before != PINNED


def test_f36_overlapping_calls_in_threads_restore_the_users_flags_once_the_last_leaves(user_flags):
    """Thread A enters, B enters, A leaves, B is still pinned, B leaves: the user's flags come back."""
    user_flags("medium")
    before = precision_flags()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with ieee_fp32_matmul():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with ieee_fp32_matmul():
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = precision_flags()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["b after a left"] == PINNED
    assert precision_flags() == before


def test_f36_nested_pins_are_reentrant(user_flags):
    user_flags("high")
    before = precision_flags()
    with ieee_fp32_matmul():
        with ieee_fp32_matmul():
            pass
        assert precision_flags() == PINNED
    assert precision_flags() == before


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_f36_a_change_while_a_call_is_in_flight_is_re_pinned_for_the_next_call(user_flags, setting):
    """Other code sets the user's global while a linattn call is in flight (the outer pin, as thread
    A's long call): a linattn call entering then (a nested pin, as thread C's) runs IEEE fp32 all
    the same, and once the last call leaves the user's latest setting is in force."""
    other = "high" if setting != "high" else "medium"
    user_flags(other)
    user_flags(setting)
    want_after = precision_flags()  # the user's two settings, made outside any pin
    user_flags(other)
    x, pool = prefill_inputs(lens=(20, 5), K=16, V=16, P=4)
    spy = MatmulSpy()
    with ieee_fp32_matmul():  # a call in flight
        user_flags(setting)  # user code elsewhere, meanwhile
        assert precision_flags() != PINNED
        with spy:
            linattn.gdn_prefill(**x, initial_state=pool[:2], backend="torch-ref")
        assert spy.seen and all(s == PINNED for s in spy.seen), f"a matmul ran under {spy.seen[0]}"
    assert precision_flags() == want_after


def test_f36_triton_kernels_never_read_the_global_flags():
    """Every ``tl.dot`` of the Triton kernels names its ``input_precision``, and no kernel source reads
    torch's precision flags: the Triton backends' accuracy does not move with the caller's global."""
    root = Path(__file__).resolve().parents[2] / "kernels" / "triton"
    for path in sorted(root.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"float32_matmul_precision|allow_tf32|fp32_precision", text), path.name
        for call in re.finditer(r"tl\.dot\(", text):
            depth, i = 1, call.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            assert "input_precision=" in text[call.end():i], f"{path.name}: {text[call.start():i][:80]}"
