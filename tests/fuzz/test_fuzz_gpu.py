"""The fuzz properties compiled on a CUDA GPU, over a few fixed shape classes.

Same properties as the CPU suite (``fuzz_checks``: oracle, untouched rows, padding, views ==
contiguous, pool == dense; refusals before any write; non-finite containment), with the heads fixed
per class so that the JIT compiles a bounded number of kernel variants:

- ``qwen3next``: H = 16, HV = 32, K = V = 128 (Qwen3-Next's GDN layers; KDA runs the same heads);
- ``gva2-64``: H = 4, HV = 8, K = V = 64 (GVA group 2, the smallest prefill head dim).

Sizes (N, T, sequence lengths), dtypes (bf16, fp32), layouts, padding, speculative verify and the
view kinds are drawn as on the CPU. Backends: triton-split, triton-folded (forced), cutedsl
(prefill, bf16, when eligible), torch-ref on the GPU, and automatic selection. Skipped on machines
without CUDA (tests/conftest.py). ``benchmarks/fuzz_gpu.py`` runs this file and writes the
counts to ``benchmarks/results/fuzz_h200.json``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

import fuzz_oracle as oracle  # noqa: E402
from fuzz_checks import check_decode, check_prefill, check_refused  # noqa: E402
from fuzz_known_bugs import excluded, marks  # noqa: E402
from fuzz_strategies import build_decode, build_prefill, decode_specs, model_gate_specs, prefill_specs  # noqa: E402
from fuzz_support import current_id as _key, Tally, bits_equal, call_op, fuzz_settings, heal_plugin  # noqa: E402

DEV = "cuda"
CLASSES = {"qwen3next": (16, 32, 128, 128), "gva2-64": (4, 8, 64, 64)}


def _be_id(be):
    return be or "auto"


#: (backend, class, focus) -> examples (ci profile). The matrix is pruned so that the JIT builds a
#: bounded number of variants: triton-split gets every focus on both classes; the others (whose
#: kernels are the same, or which wrap the same kernels) the main foci on one class or two.
DECODE_PLAN = {
    **{("triton-split", c, f): n for c in CLASSES for f, n in (("plain", 6), ("mixed", 4), ("empty", 2),
                                                                 ("state_tiles", 2))},
    **{("triton-folded", c, f): n for c in CLASSES for f, n in (("plain", 3), ("mixed", 2))},
    ("torch-ref", "gva2-64", "plain"): 3, ("torch-ref", "qwen3next", "plain"): 2,
    (None, "qwen3next", "plain"): 3, (None, "gva2-64", "mixed"): 2,
}
PREFILL_PLAN = {
    **{("triton-split", c, f): n for c in CLASSES for f, n in (("plain", 3), ("dense", 2), ("mixed", 2),
                                                                 ("empty", 1))},
    ("triton-folded", "gva2-64", "plain"): 2, ("triton-folded", "qwen3next", "mixed"): 1,
    **{("cutedsl", c, f): n for c in CLASSES for f, n in (("plain", 2), ("mixed", 1))},
    ("torch-ref", "gva2-64", "plain"): 2, (None, "qwen3next", "plain"): 2,
}


def _params(ops, plan):
    out = []
    for op in ops:
        for (be, cls, focus) in plan:
            m = marks(op, f"{_be_id(be)}@gpu", focus)
            out.append(pytest.param(op, be, cls, focus, marks=m, id=f"{op}-{_be_id(be)}-{cls}-{focus}"))
    return out


@pytest.mark.parametrize("op,backend,cls,focus",
                         _params(("gdn_decode", "kda_decode"), DECODE_PLAN))
def test_gpu_decode_valid(op, backend, cls, focus):
    shape = CLASSES[cls]

    @fuzz_settings(DECODE_PLAN[(backend, cls, focus)], key=_key())
    @given(spec=decode_specs(op, None, focus, exclude=excluded(op, f"{_be_id(backend)}@gpu"), shapes=(shape,)))
    def prop(spec):
        with Tally("gpu-valid", op, f"{_be_id(backend)}@{cls}", spec) as tally:
            tally.outcome = check_decode(build_decode(spec, DEV), backend)

    prop()


@pytest.mark.parametrize("op,backend,cls,focus",
                         _params(("gdn_prefill", "kda_prefill"), PREFILL_PLAN))
def test_gpu_prefill_valid(op, backend, cls, focus):
    shape = CLASSES[cls]
    dtypes = ("bfloat16",) if backend == "cutedsl" else ("bfloat16", "float32")

    @fuzz_settings(PREFILL_PLAN[(backend, cls, focus)], key=_key())
    @given(spec=prefill_specs(op, None, focus, exclude=excluded(op, f"{_be_id(backend)}@gpu"), shapes=(shape,),
                              dtypes=dtypes, max_len=160))
    def prop(spec):
        with Tally("gpu-valid", op, f"{_be_id(backend)}@{cls}", spec) as tally:
            tally.outcome = check_prefill(build_prefill(spec, DEV), backend)

    prop()


# -- kind "model gates": real models' gate distributions (issue 32) -----------------------------------

#: (op, backend, class) -> examples: the gates of Qwen3-Next / Qwen3.5 / OLMo-hybrid (GDN) and
#: Kimi-Linear / GLM-5-Next (KDA) initialisations with strong-decay heads (linattn.testing.gates).
MODEL_GATE_PLAN = {
    **{(op, "triton-split", c): 3 for op in ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill")
       for c in CLASSES},
    ("gdn_prefill", "cutedsl", "qwen3next"): 2, ("kda_prefill", "cutedsl", "qwen3next"): 2,
    ("gdn_prefill", None, "qwen3next"): 2, ("kda_prefill", None, "qwen3next"): 2,
    ("kda_decode", None, "qwen3next"): 2,
}


@pytest.mark.parametrize("op,backend,cls", [
    pytest.param(op, be, cls, marks=marks(op, f"{_be_id(be)}@gpu", "mixed"), id=f"{op}-{_be_id(be)}-{cls}")
    for (op, be, cls) in MODEL_GATE_PLAN])
def test_gpu_model_gates(op, backend, cls):
    shape = CLASSES[cls]
    decode = op.endswith("_decode")
    dtypes = ("bfloat16",) if backend == "cutedsl" else ("bfloat16", "float32")
    ex = excluded(op, f"{_be_id(backend)}@gpu")
    base = (decode_specs(op, None, "mixed", exclude=ex, shapes=(shape,)) if decode
            else prefill_specs(op, None, "mixed", exclude=ex, shapes=(shape,), dtypes=dtypes, max_len=160))

    @fuzz_settings(MODEL_GATE_PLAN[(op, backend, cls)], key=_key())
    @given(spec=model_gate_specs(base))
    def prop(spec):
        with Tally("gpu-model-gates", op, f"{_be_id(backend)}@{cls}", spec) as tally:
            tally.outcome = (check_decode(build_decode(spec, DEV), backend) if decode
                             else check_prefill(build_prefill(spec, DEV), backend))

    prop()


# -- refusals on the GPU (device mismatch, aliasing, ranges) ----------------------------------------

def _mut_device(kw, spec, data):
    kw["state_indices"] = kw["state_indices"].cpu()


def _mut_oob(kw, spec, data):
    idx = kw["state_indices"].clone()
    idx.view(-1)[0] = kw["state_pool"].shape[0] + data.draw(st.integers(0, 3))
    kw["state_indices"] = idx


def _mut_overlap(kw, spec, data):
    pool = kw["state_pool"]
    stride = list(pool.contiguous().stride())
    stride[0] = max(1, stride[0] // 2)
    span = sum((s - 1) * t for s, t in zip(pool.shape, stride)) + 1
    kw["state_pool"] = torch.randn(span, device=DEV).to(pool.dtype).as_strided(pool.shape, stride)


def _mut_nan_g(kw, spec, data):
    g = kw["g"].clone()
    g.view(-1)[0] = float("nan")
    kw["g"] = g


GPU_MUTATIONS = {"device_mismatch": _mut_device, "idx_out_of_range": _mut_oob, "pool_overlapping_slots": _mut_overlap}


@pytest.mark.parametrize("backend", ("triton-split", None))
@pytest.mark.parametrize("mutation", sorted(GPU_MUTATIONS) + ["g_nan"])
@pytest.mark.parametrize("op", ("gdn_decode", "gdn_prefill"))
def test_gpu_invalid_refused(op, mutation, backend):
    if mutation == "g_nan" and op.endswith("decode"):
        pytest.skip("g is a prefill argument")
    shape = CLASSES["gva2-64"]

    @fuzz_settings(3, key=_key())
    @given(spec=(decode_specs(op, None, "plain", shapes=(shape,)) if op.endswith("decode")
                 else prefill_specs(op, None, "plain", shapes=(shape,))), data=st.data())
    def prop(spec, data):
        if op.endswith("decode"):
            spec = replace(spec, pad=(), disable=False, share=False, extra=max(spec.extra, 1))
            kw = dict(build_decode(spec, DEV).kwargs)
        else:
            spec = replace(spec, mode="pool", pad=(), extra=max(spec.extra, 1))
            kw = dict(build_prefill(spec, DEV).kwargs)
        (_mut_nan_g if mutation == "g_nan" else GPU_MUTATIONS[mutation])(kw, spec, data)
        with Tally("gpu-invalid", op, f"{_be_id(backend)}@gva2-64", (mutation, spec)) as tally:
            tally.outcome = check_refused(op, kw, backend, (ValueError, TypeError))

    prop()


# -- non-finite containment on the GPU ------------------------------------------------------------

@pytest.mark.parametrize("backend", ("triton-split", "triton-folded"))
@pytest.mark.parametrize("op", ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill"))
def test_gpu_nonfinite_stays_in_its_row(op, backend):
    shape = CLASSES["gva2-64"]
    decode = op.endswith("decode")

    @fuzz_settings(3, key=_key())
    @given(spec=(decode_specs(op, None, "plain", shapes=(shape,)) if decode
                 else prefill_specs(op, None, "plain", shapes=(shape,))), data=st.data())
    def prop(spec, data):
        build = build_decode if decode else build_prefill
        clean, dirty = build(spec, DEV), build(spec, DEV)
        if decode:
            n, t = data.draw(st.integers(0, spec.N - 1)), data.draw(st.integers(0, spec.T - 1))
            lead, own_rows = (n, t), {n}
            live, slots, _ = oracle.decode_row_writes(clean.kwargs, n)
            # the gate form has no a, b: its per-sequence gate inputs are g and beta (a NaN g is refused)
            per_row = ("q", "k", "v", "a", "b") if clean.kwargs.get("a") is not None else ("q", "k", "v", "beta")
            arg = data.draw(st.sampled_from(per_row))
        else:
            lens = list(spec.lens)
            seqs = [i for i, L in enumerate(lens) if L > 0]
            n = seqs[data.draw(st.integers(0, len(seqs) - 1))]
            lo = sum(lens[:n])
            lead = (lo + data.draw(st.integers(0, lens[n] - 1)),)
            own_rows = set(range(lo, lo + lens[n]))
            live = not (spec.mode == "pool" and n in spec.pad)
            slots = {int(clean.kwargs["state_indices"][n])} if spec.mode == "pool" and live else set()
            arg = data.draw(st.sampled_from(("q", "k", "v", "beta")))
        x = dirty.kwargs[arg]
        x[(*lead, *[0] * (x.dim() - len(lead)))] = float("nan")
        with Tally("gpu-nonfinite", op, f"{backend}@gva2-64", (spec, lead, arg)):
            try:
                r_c, r_d = call_op(op, clean.kwargs, backend), call_op(op, dirty.kwargs, backend)
            except Exception:
                heal_plugin(backend)
                raise
            assert r_c.ran and r_d.ran, (r_c.describe(), r_d.describe())
            o_c, o_d = (r_c.value, r_d.value) if decode or spec.mode == "pool" else (r_c.value[0], r_d.value[0])
            skip = own_rows if live else set()
            for r in range(o_c.shape[0]):
                if r not in skip:
                    assert bits_equal(o_c[r], o_d[r]), f"output row {r} changed: the NaN spread"
            if not (decode or spec.mode == "pool"):
                for m in range(r_c.value[1].shape[0]):
                    if m != n:
                        assert bits_equal(r_c.value[1][m], r_d.value[1][m]), f"final state {m} changed: spread"
            pc, pd = clean.kwargs.get("state_pool"), dirty.kwargs.get("state_pool")
            if pc is not None:
                for s in range(pc.shape[0]):
                    if s not in slots:
                        assert bits_equal(pc[s], pd[s]), f"state_pool[{s}] changed: the NaN spread"

    prop()


@pytest.mark.parametrize("backend", ("triton-split", "triton-folded", "torch-ref"))
def test_gpu_silu_and_mul_clamp(backend):
    @fuzz_settings(4, key=_key())
    @given(M=st.integers(0, 8), D=st.sampled_from((1, 7, 352, 2048)), dtype=st.sampled_from(("bfloat16", "float32")),
           limit=st.one_of(st.none(), st.just(10.0)), seed=st.integers(0, 2 ** 31 - 1))
    def prop(M, D, dtype, limit, seed):
        with Tally("gpu-valid", "silu_and_mul_clamp", f"{backend}@gpu", (M, D, dtype, limit)):
            gen = torch.Generator().manual_seed(seed)
            x = (torch.randn(M, 2 * D, generator=gen) * 20).to(getattr(torch, dtype)).to(DEV)
            out = call_op("silu_and_mul_clamp", dict(x=x, limit=limit), backend)
            assert out.ran, out.describe()
            from fuzz_support import rel

            r = rel(out.value, oracle.silu_and_mul_clamp(x, limit))
            assert r <= (1e-5 if dtype == "float32" else 2e-2), r

    prop()
