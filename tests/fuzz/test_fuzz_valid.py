"""Valid random problems on every CPU backend against the float64 token-serial oracle.

One hypothesis property per (op, forced backend, focus); the focus names the argument that is
passed as a strided view (``plain``: none; ``mixed``: any; ``empty``: N = 0, T = 0, all padding,
zero-length sequences). What is checked is listed in ``fuzz_checks``. Triton runs in the
interpreter at tiny shapes (decode K, V in {8, 16}; prefill K = V = 64, the smallest head dim its
chunked kernels take), ``cpu-chunked`` (the example plugin, prefill only) at any head dims.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fuzz_oracle as oracle
from fuzz_checks import check_decode, check_prefill
from fuzz_known_bugs import excluded, marks
from fuzz_strategies import (DECODE_FOCI, INTERP_BACKENDS, PREFILL_FOCI, build_decode, build_prefill, decode_specs,
                             make_view, model_gate_specs, prefill_specs, _float_junk)
from fuzz_support import current_id as _key, Tally, bits_equal, call_op, fuzz_settings, profile_name, rel



DECODE_OPS = ("gdn_decode", "kda_decode")
PREFILL_OPS = ("gdn_prefill", "kda_prefill")
DECODE_BACKENDS = ("torch-ref", "triton-split", "triton-folded")
PREFILL_BACKENDS = ("torch-ref", "cpu-chunked", "triton-split", "triton-folded")


def _have(backend: str) -> bool:
    from linattn.dispatch.runtime.registry import get_registry

    return backend in get_registry().backends


#: In the ci profile triton-folded (the same kernels as triton-split on another launch grid; the
#: contract test proves the two bitwise equal) runs these foci only; the long profile runs all.
FOLDED_CI_FOCI = ("mixed", "empty", "state_tiles")


def _params(ops, backends, foci):
    out = []
    for op in ops:
        for be in backends:
            for focus in foci:
                m = marks(op, be, focus)
                if be in INTERP_BACKENDS:
                    m = m + [pytest.mark.interpreter]
                if not _have(be):
                    m = m + [pytest.mark.skip(reason=f"backend {be} not installed")]
                elif be == "triton-folded" and focus not in FOLDED_CI_FOCI and profile_name() == "ci":
                    m = m + [pytest.mark.skip(reason="ci profile: triton-folded runs the mixed, empty and "
                                                     "state_tiles foci (LINATTN_FUZZ_PROFILE=long: all)")]
                out.append(pytest.param(op, be, focus, marks=m, id=f"{op}-{be}-{focus}"))
    return out


MAIN_FOCI = ("plain", "mixed", "dense")


def decode_budget(backend: str, focus: str) -> int:
    if backend in INTERP_BACKENDS:
        return 6 if focus in MAIN_FOCI else 2 if focus == "empty" else 4
    return 40 if focus in MAIN_FOCI else 12


def prefill_budget(backend: str, focus: str) -> int:
    """Examples per focus in the ci profile (each interpreted prefill launch costs ~0.4 s)."""
    if backend == "triton-split":
        return 2 if focus in MAIN_FOCI else 1
    if backend == "triton-folded":
        return 2 if focus == "mixed" else 1
    if backend == "cpu-chunked":
        return 12 if focus in MAIN_FOCI else 5
    return 30 if focus in MAIN_FOCI else 10


@pytest.mark.parametrize("op,backend,focus", _params(DECODE_OPS, DECODE_BACKENDS, DECODE_FOCI))
def test_decode_valid(op, backend, focus):
    @fuzz_settings(decode_budget(backend, focus), key=_key())
    @given(spec=decode_specs(op, backend, focus, exclude=excluded(op, backend)))
    def prop(spec):
        with Tally("valid", op, backend, spec) as tally:
            tally.outcome = check_decode(build_decode(spec), backend)

    prop()


@pytest.mark.parametrize("op,backend,focus", _params(PREFILL_OPS, PREFILL_BACKENDS, PREFILL_FOCI))
def test_prefill_valid(op, backend, focus):
    interp = backend in INTERP_BACKENDS

    @fuzz_settings(prefill_budget(backend, focus), key=_key())
    @given(spec=prefill_specs(op, backend, focus, exclude=excluded(op, backend), long_seqs=focus == "plain" or not interp))
    def prop(spec):
        with Tally("valid", op, backend, spec) as tally:
            # the interpreter pays for every launch: the pool == dense twin in the plain and mixed foci only
            tally.outcome = check_prefill(build_prefill(spec), backend,
                                          dense_twin=not interp or focus in ("plain", "mixed"))

    prop()


# -- kind "model gates": real models' gate distributions (issue 32) -----------------------------------

#: (op, backend) -> examples (ci profile). The gates of Qwen3-Next, Qwen3.5, OLMo-hybrid (GDN),
#: Kimi-Linear and GLM-5-Next (KDA) as their initialisations draw them, every second head a
#: strong-decay head (linattn.testing.gates): per-token decays down to about -100, KDA blocks off
#: stage 1's fast path. Focus "mixed" (any argument viewed).
MODEL_GATE_PLAN = {
    ("gdn_decode", "torch-ref"): 10, ("kda_decode", "torch-ref"): 10,
    ("gdn_decode", "triton-split"): 3, ("kda_decode", "triton-split"): 3,
    ("gdn_prefill", "torch-ref"): 8, ("kda_prefill", "torch-ref"): 8,
    ("gdn_prefill", "cpu-chunked"): 4, ("kda_prefill", "cpu-chunked"): 4,
    ("gdn_prefill", "triton-split"): 1, ("kda_prefill", "triton-split"): 1,
}


def _model_gate_params():
    out = []
    for (op, be), n in MODEL_GATE_PLAN.items():
        m = marks(op, be, "mixed") + ([pytest.mark.interpreter] if be in INTERP_BACKENDS else [])
        if not _have(be):
            m = m + [pytest.mark.skip(reason=f"backend {be} not installed")]
        out.append(pytest.param(op, be, n, marks=m, id=f"{op}-{be}"))
    return out


@pytest.mark.parametrize("op,backend,examples", _model_gate_params())
def test_model_gates_valid(op, backend, examples):
    decode = op.endswith("_decode")
    interp = backend in INTERP_BACKENDS
    base = (decode_specs(op, backend, "mixed", exclude=excluded(op, backend)) if decode
            else prefill_specs(op, backend, "mixed", exclude=excluded(op, backend), long_seqs=True))

    @fuzz_settings(examples, key=_key())
    @given(spec=model_gate_specs(base))
    def prop(spec):
        assert spec.gate_model is not None
        with Tally("valid-model-gates", op, backend, spec) as tally:
            tally.outcome = (check_decode(build_decode(spec), backend) if decode
                             else check_prefill(build_prefill(spec), backend, dense_twin=not interp))

    prop()


# -- gating and the SwiGLU clamp (cheap) ----------------------------------------------------------

GATE_VIEWS = ("contig", "offset", "column", "every_other:0", "broadcast:0")


@st.composite
def gating_cases(draw, op):
    lead = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)))
    HV = draw(st.integers(1, 4))
    K = draw(st.integers(1, 8))
    kda = op == "kda_gating"
    return dict(lead=lead, HV=HV, K=K, dtype=draw(st.sampled_from(("float32", "bfloat16"))),
                a_view=draw(st.sampled_from(GATE_VIEWS + ("transposed",) if len(lead) + (2 if kda else 1) >= 2
                                            else GATE_VIEWS)),
                b_view=draw(st.sampled_from(GATE_VIEWS)), p_view=draw(st.sampled_from(GATE_VIEWS)),
                lower_bound=draw(st.sampled_from((None, -5.0))) if kda else None,
                softplus=draw(st.sampled_from(((1.0, 20.0), (2.0, 5.0), (0.5, 1.0)))),
                seed=draw(st.integers(0, 2 ** 31 - 1)))


@pytest.mark.parametrize("op", ("gdn_gating", "kda_gating"))
def test_gating_valid(op):
    kda = op == "kda_gating"

    @fuzz_settings(30, key=_key())
    @given(case=gating_cases(op))
    def prop(case):
        with Tally("valid", op, "torch-ref", case):
            gen = torch.Generator().manual_seed(case["seed"])
            dt = getattr(torch, case["dtype"])
            HV, K, lead = case["HV"], case["K"], case["lead"]
            a = (torch.randn(*lead, HV, *((K,) if kda else ()), generator=gen) * 8 + 4).to(dt)
            b = (torch.randn(*lead, HV, generator=gen) * 4).to(dt)
            A_log = torch.randn(HV, generator=gen)
            dt_bias = torch.randn(HV, *((K,) if kda else ()), generator=gen)
            fj = lambda x: _float_junk(x.dtype, "cpu")  # noqa: E731
            va, vb = make_view(a, case["a_view"], fj(a)), make_view(b, case["b_view"], fj(b))
            vA, vd = make_view(A_log, case["p_view"], fj(A_log)), make_view(dt_bias, case["p_view"], fj(dt_bias))
            extra = dict(softplus_beta=case["softplus"][0], softplus_threshold=case["softplus"][1])
            if kda:
                extra["lower_bound"] = case["lower_bound"]
            out = call_op(op, dict(A_log=vA, a=va, b=vb, dt_bias=vd, **extra), None)
            assert out.ran, out.describe()
            g, beta = out.value
            assert g.dtype == torch.float32 and beta.dtype == torch.float32
            assert tuple(g.shape) == tuple(va.shape) and tuple(beta.shape) == tuple(vb.shape)
            fn = oracle.kda_gates if kda else oracle.gdn_gates
            rg, rb = fn(vA, va, vb, vd, *([case["lower_bound"]] if kda else []), *case["softplus"])
            assert bool((g <= 0).all()) and bool(torch.isfinite(g).all()), "g must be finite and <= 0"
            assert rel(g, rg) <= 1e-5 and rel(beta, rb) <= 1e-5, (rel(g, rg), rel(beta, rb))
            dense = call_op(op, dict(A_log=vA.contiguous(), a=va.contiguous(), b=vb.contiguous(),
                                     dt_bias=vd.contiguous(), **extra), None)
            assert bits_equal(dense.value[0], g) and bits_equal(dense.value[1], beta), "views != contiguous"

    prop()


SILU_BACKENDS = ("torch-ref", "triton-split", "triton-folded")


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.interpreter] if b in INTERP_BACKENDS else [])
                                     for b in SILU_BACKENDS])
def test_silu_and_mul_clamp_valid(backend):
    @fuzz_settings(6 if backend in INTERP_BACKENDS else 30, key=_key())
    @given(M=st.integers(0, 4), D=st.integers(1, 40), dtype=st.sampled_from(("float32", "bfloat16")),
           limit=st.one_of(st.none(), st.floats(0.5, 20.0)), scale=st.sampled_from((1.0, 30.0)),
           view=st.sampled_from(("contig", "offset", "every_other:0", "narrow:1", "transposed", "every_other:1")),
           seed=st.integers(0, 2 ** 31 - 1))
    def prop(M, D, dtype, limit, scale, view, seed):
        with Tally("valid", "silu_and_mul_clamp", backend, (M, D, dtype, limit, scale, view, seed)):
            gen = torch.Generator().manual_seed(seed)
            x = (torch.randn(M, 2 * D, generator=gen) * scale).to(getattr(torch, dtype))
            xv = make_view(x, view, _float_junk(x.dtype, "cpu"))
            out = call_op("silu_and_mul_clamp", dict(x=xv, limit=limit), backend)
            assert out.ran, out.describe()
            y = out.value
            assert tuple(y.shape) == (M, D) and y.dtype == x.dtype
            tol = 1e-5 if dtype == "float32" else 2e-2
            r = rel(y, oracle.silu_and_mul_clamp(xv, limit))
            assert r <= tol, f"clamp differs from the float64 oracle by {r:.3g}"
            y2 = call_op("silu_and_mul_clamp", dict(x=xv.contiguous(), limit=limit), backend)
            assert bits_equal(y2.value, y), "views != contiguous"

    prop()


