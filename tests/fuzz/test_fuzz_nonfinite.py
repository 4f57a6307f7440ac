"""Non-finite values stay where they are (ops.md, second release: "never spread beyond their own
sequence's output rows and slot").

1. A NaN or inf in one row's (sequence's) q, k, v, a, b (decode) or q, k, v, beta (prefill): every
   other row's outputs, every other slot and every other intermediate entry have the same bits as in
   the same call without it; a padding row's NaN changes nothing at all (its outputs stay zero).
2. NaN in the pool slots a call does not read (foreign slots, padding rows' slots, the slot of a
   row that starts from a zero state with ``num_accepted_tokens = 0``) and in the write-only
   intermediate buffer: the outputs and the written rows have the same bits as with finite
   contents there, and the NaN slots the call does not write keep their bits.

Both are differential: the same backend, the same call, with and without the non-finite values.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fuzz_oracle as oracle
from fuzz_checks import _declared_features
from fuzz_known_bugs import marks
from fuzz_strategies import INTERP_BACKENDS, build_decode, build_prefill, decode_specs, prefill_specs
from fuzz_support import current_id as _key, Tally, bits, bits_equal, call_op, fuzz_settings, heal_plugin

NONFINITE = (float("nan"), float("inf"), float("-inf"))


def _params(ops, backends, prop):
    out = []
    for op in ops:
        for be in backends:
            m = marks(op, be, prop) + ([pytest.mark.interpreter] if be in INTERP_BACKENDS else [])
            out.append(pytest.param(op, be, marks=m, id=f"{op}-{be}"))
    return out


def _budget(backend, phase="decode"):
    if backend in INTERP_BACKENDS:
        return 3 if phase == "decode" else 1
    return 8 if backend == "cpu-chunked" else 20


def _supported(spec, backend):
    """The spec without second-release keywords the backend does not declare (it would decline)."""
    feats = _declared_features(backend, spec.op)
    if getattr(spec, "his", False) and "has_initial_state" not in feats:
        spec = replace(spec, his=False)
    if getattr(spec, "gate_form", "raw") == "pre" and "precomputed_gates" not in feats:
        spec = replace(spec, gate_form="raw")
    return replace(spec, views=())


def _run(op, kw, backend):
    try:
        out = call_op(op, kw, backend)
    except Exception:
        heal_plugin(backend)
        raise
    assert out.ran, f"{backend} refused a valid call: {out.describe()}"
    return out.value


def _poke(x: torch.Tensor, lead: tuple, data, value: float) -> None:
    """Set one element of ``x[lead]`` (the rest of the index drawn) to ``value``, in place."""
    rest = [data.draw(st.integers(0, s - 1)) for s in x.shape[len(lead):]]
    x[(*lead, *rest)] = value


def _rows_equal(name, a: torch.Tensor, b: torch.Tensor, skip: set) -> None:
    for r in range(a.shape[0]):
        if r not in skip:
            assert bits_equal(a[r].contiguous(), b[r].contiguous()), f"{name}[{r}] differs (spread)"


DECODE_BACKENDS = ("torch-ref", "triton-split", "triton-folded")
PREFILL_BACKENDS = ("torch-ref", "cpu-chunked", "triton-split")


@pytest.mark.parametrize("op,backend", _params(("gdn_decode", "kda_decode"), DECODE_BACKENDS, "nonfinite_input"))
def test_decode_nonfinite_input_stays_in_its_row(op, backend):
    @fuzz_settings(_budget(backend), key=_key())
    @given(spec=decode_specs(op, backend, "plain"), data=st.data())
    def prop(spec, data):
        spec = _supported(spec, backend)
        clean, dirty = build_decode(spec), build_decode(spec)
        N, T = spec.N, spec.T
        n, t = data.draw(st.integers(0, N - 1)), data.draw(st.integers(0, T - 1))
        gates = ("a", "b") if spec.gate_form == "raw" else ("beta",)
        arg = data.draw(st.sampled_from(("q", "k", "v") + gates))
        _poke(dirty.kwargs[arg], (n, t), data, data.draw(st.sampled_from(NONFINITE)))
        with Tally("nonfinite", op, backend, (spec, n, t, arg)):
            o_c = _run(op, clean.kwargs, backend)
            o_d = _run(op, dirty.kwargs, backend)
            live, slots, inter = oracle.decode_row_writes(clean.kwargs, n)
            if not live:
                assert bool((o_d[n] == 0).all()), "a padding row's non-finite input reached its output"
                slots, inter = set(), set()
            _rows_equal("o", o_d, o_c, {n} if live else set())
            _rows_equal("state_pool", dirty.kwargs["state_pool"], clean.kwargs["state_pool"], slots)
            if clean.kwargs["intermediate_states"] is not None:
                a, b = dirty.kwargs["intermediate_states"], clean.kwargs["intermediate_states"]
                for r in range(a.shape[0]):
                    for s in range(a.shape[1]):
                        if (r, s) not in inter:
                            assert bits_equal(a[r, s].contiguous(), b[r, s].contiguous()), \
                                f"intermediate_states[{r}, {s}] differs (spread)"

    prop()


@pytest.mark.parametrize("op,backend", _params(("gdn_prefill", "kda_prefill"), PREFILL_BACKENDS, "nonfinite_input"))
def test_prefill_nonfinite_input_stays_in_its_sequence(op, backend):
    @fuzz_settings(_budget(backend, "prefill"), key=_key())
    @given(spec=prefill_specs(op, backend, "plain", long_seqs=backend not in INTERP_BACKENDS), data=st.data())
    def prop(spec, data):
        spec = _supported(spec, backend)
        clean, dirty = build_prefill(spec), build_prefill(spec)
        lens = list(spec.lens)
        seqs = [i for i, L in enumerate(lens) if L > 0]
        n = seqs[data.draw(st.integers(0, len(seqs) - 1))]
        lo = sum(lens[:n])
        t = lo + data.draw(st.integers(0, lens[n] - 1))
        arg = data.draw(st.sampled_from(("q", "k", "v", "beta")))
        _poke(dirty.kwargs[arg], (t,), data, data.draw(st.sampled_from(NONFINITE)))
        with Tally("nonfinite", op, backend, (spec, n, t, arg)):
            r_c = _run(op, clean.kwargs, backend)
            r_d = _run(op, dirty.kwargs, backend)
            pool_mode = spec.mode == "pool"
            o_c, o_d = (r_c, r_d) if pool_mode else (r_c[0], r_d[0])
            padding = pool_mode and n in spec.pad
            own = set() if padding else set(range(lo, lo + lens[n]))
            if padding:
                assert bool((o_d[lo:lo + lens[n]] == 0).all()), "a padding sequence's NaN reached its output"
            _rows_equal("o", o_d, o_c, own)
            if pool_mode:
                slot = int(clean.kwargs["state_indices"][n])
                _rows_equal("state_pool", dirty.kwargs["state_pool"], clean.kwargs["state_pool"],
                            set() if padding else {slot})
            else:
                _rows_equal("final_state", r_d[1], r_c[1], {n})

    prop()


@pytest.mark.parametrize("op,backend", _params(("gdn_decode", "kda_decode"), DECODE_BACKENDS, "stale_slots"))
def test_decode_nan_in_unread_slots_is_never_read(op, backend):
    @fuzz_settings(_budget(backend), key=_key())
    @given(spec=decode_specs(op, backend, "plain"))
    def prop(spec):
        spec = _supported(spec, backend)
        clean, dirty = build_decode(spec), build_decode(spec)
        exp = oracle.decode(op, **clean.kwargs)
        P = clean.kwargs["state_pool"].shape[0]
        fill = [s for s in range(P) if s not in exp.read_slots]
        pool_d = dirty.kwargs["state_pool"]
        pool_d[fill] = float("nan")
        if dirty.kwargs["intermediate_states"] is not None:
            dirty.kwargs["intermediate_states"].fill_(float("nan"))
        before = pool_d.clone()
        with Tally("stale", op, backend, spec):
            o_c = _run(op, clean.kwargs, backend)
            o_d = _run(op, dirty.kwargs, backend)
            assert bits_equal(o_d, o_c), "NaN in slots the call does not read changed its outputs"
            for s in range(P):
                want = clean.kwargs["state_pool"][s] if s in exp.pool_rows else before[s]
                assert bits_equal(pool_d[s], want), f"state_pool[{s}]: {'written' if s in exp.pool_rows else 'unwritten'} " \
                                                    f"slot differs"
            if clean.kwargs["intermediate_states"] is not None:
                a, b = dirty.kwargs["intermediate_states"], clean.kwargs["intermediate_states"]
                for (r, s) in exp.inter_rows:
                    assert bits_equal(a[r, s], b[r, s]), f"intermediate_states[{r}, {s}] differs"

    prop()


@pytest.mark.parametrize("op,backend", _params(("gdn_prefill", "kda_prefill"), PREFILL_BACKENDS, "stale_slots"))
def test_prefill_nan_in_unread_slots_is_never_read(op, backend):
    @fuzz_settings(_budget(backend, "prefill"), key=_key())
    @given(spec=prefill_specs(op, backend, "state_indices", long_seqs=backend not in INTERP_BACKENDS))
    def prop(spec):
        spec = _supported(spec, backend)
        clean, dirty = build_prefill(spec), build_prefill(spec)
        exp = oracle.prefill(op, **clean.kwargs)
        slots = [int(s) for s in clean.kwargs["state_indices"].tolist()]
        P = clean.kwargs["state_pool"].shape[0]
        named = {s for s in slots if s >= 0}
        fill = [s for s in range(P) if s not in named]  # foreign slots (padding names none)
        pool_d = dirty.kwargs["state_pool"]
        pool_d[fill] = float("nan")
        before = bits(pool_d).clone()
        with Tally("stale", op, backend, spec):
            o_c = _run(op, clean.kwargs, backend)
            o_d = _run(op, dirty.kwargs, backend)
            assert bits_equal(o_d, o_c), "NaN in slots the call does not read changed its outputs"
            for s in range(P):
                if s in exp.pool_rows:
                    assert bits_equal(pool_d[s], clean.kwargs["state_pool"][s]), f"state_pool[{s}] differs"
                else:
                    assert torch.equal(bits(pool_d[s]), before[s]), f"state_pool[{s}] (not written) changed"

    prop()
