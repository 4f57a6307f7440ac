"""Bad inputs: every one is refused (ValueError / TypeError, or NoBackendError for a forced backend
that does not fit) before anything is written: the pool, the intermediate buffer and every input
keep their bits (``fuzz_checks.check_refused``).

One hypothesis property per mutation: a random valid problem (any layout, dtype, view kind) is
drawn, adjusted so that the mutation applies (e.g. two live rows for a duplicate slot), mutated,
and called. Mutations are run on ``torch-ref`` and on automatic selection; the ones whose
acceptance could not make a kernel read or write out of bounds also on the forced Triton
backends (interpreter) and ``cpu-chunked``.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import linattn
from fuzz_checks import check_refused
from fuzz_known_bugs import marks
from fuzz_strategies import build_decode, build_prefill, decode_specs, legal_views, prefill_specs
from fuzz_support import current_id as _key, REFUSALS, Tally, fuzz_settings

V_, T_, VT = (ValueError,), (TypeError,), (ValueError, TypeError)
NAN, INF = float("nan"), float("inf")
HAS_CHECK_FINITE = "check_finite" in inspect.signature(linattn.gdn_decode).parameters


def _cat1(x, dim):
    return torch.cat([x, x.narrow(dim, 0, 1)], dim=dim)


def _pick(data, n):
    return data.draw(st.integers(0, max(n - 1, 0)))


def _overlapping(x: torch.Tensor, pitch_dim: int) -> torch.Tensor:
    """``x``'s values in a buffer whose ``pitch_dim`` pitch is half what it must be (elements shared)."""
    stride = list(x.stride()) if x.is_contiguous() else list(x.contiguous().stride())
    stride[pitch_dim] = max(1, stride[pitch_dim] // 2)
    span = sum((s - 1) * st_ for s, st_ in zip(x.shape, stride)) + 1
    buf = torch.randn(span, dtype=torch.float32).to(x.dtype)
    return buf.as_strided(x.shape, stride)


def _pool_and_inter_sharing(kw):
    pool, inter = kw["state_pool"], kw["intermediate_states"]
    big = torch.randn(pool.numel() + inter.numel()).to(pool.dtype)
    kw["state_pool"] = big[:pool.numel()].view(pool.shape)
    kw["intermediate_states"] = big[pool.numel() // 2: pool.numel() // 2 + inter.numel()].view(inter.shape)


def _q_in_pool(kw):
    pool, q = kw["state_pool"], kw["q"]
    flat = torch.randn(max(pool.numel(), q.numel())).to(q.dtype)
    kw["state_pool"] = flat[:pool.numel()].view(pool.shape)
    kw["q"] = flat[:q.numel()].view(q.shape)


def _inference(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` made under ``torch.inference_mode()`` (an inference tensor, as an engine that
    allocates its cache there gets), same strides where ``clone`` keeps them. The calls run outside
    inference mode, where torch refuses to write it: a host rule must refuse it first (F33)."""
    with torch.inference_mode():
        return x.clone()


def _decode_gva(kw):
    """HV = 3 value heads over H = 2 query heads (every per-head argument follows HV)."""
    for n in ("v", "a", "b"):
        kw[n] = _cat1(kw[n], 2)
    kw["A_log"], kw["dt_bias"] = _cat1(kw["A_log"], 0), _cat1(kw["dt_bias"], 0)


# -- decode mutations: name -> (spec overrides, mutate(kw, spec, data), allowed, memory-safe) ---------

def _dec_idx_oob(kw, s, data):
    live = [n for n in range(s.N) if n not in s.pad]
    n = live[_pick(data, len(live))]
    idx = kw["state_indices"].clone()
    P = kw["state_pool"].shape[0]
    if idx.dim() == 2:
        idx[n, 0] = P + data.draw(st.integers(0, 5))
    else:
        idx[n] = P + data.draw(st.integers(0, 5))
    kw["state_indices"] = idx


def _dec_dup(kw, s, data):
    idx = kw["state_indices"].clone()
    idx[1] = idx[0]
    kw["state_indices"] = idx


def _dec_table_dup(kw, s, data):
    idx = kw["state_indices"].clone()
    idx[1, _pick(data, s.T)] = idx[0, 0]
    kw["state_indices"] = idx


def _set(name, value):
    def f(kw, s, data):
        kw[name] = value(kw, s, data) if callable(value) else value
    return f


def _poke(name, where_value):
    def f(kw, s, data):
        x = kw[name].clone(memory_format=torch.contiguous_format)
        where, val = where_value(x, s, data)
        x[where] = val
        kw[name] = x
    return f


def _first(x, s, data):
    return tuple(0 for _ in range(x.dim()))


DECODE_MUTATIONS = {
    "q_rank": ({}, _set("q", lambda kw, s, d: kw["q"][..., 0]), V_, False),
    "k_shape": ({"K": 16}, _set("k", lambda kw, s, d: kw["k"][..., :-1]), V_, False),
    "v_lead": ({}, _set("v", lambda kw, s, d: _cat1(kw["v"], 1)), V_, False),
    "gva_ratio": ({"H": 2, "G": 1}, lambda kw, s, d: _decode_gva(kw), V_, False),
    "qk_dtype_mix": ({"dtype": "float32"}, _set("k", lambda kw, s, d: kw["k"].to(torch.float16)), T_, True),
    "q_int": ({}, lambda kw, s, d: [kw.__setitem__(n, kw[n].to(torch.int32)) for n in ("q", "k", "v")], T_, True),
    "a_shape": ({}, _set("a", lambda kw, s, d: _cat1(kw["a"], 2)), V_, False),
    "b_shape": ({}, _set("b", lambda kw, s, d: _cat1(kw["b"], 2)), V_, False),
    "A_log_shape": ({}, _set("A_log", lambda kw, s, d: _cat1(kw["A_log"], 0)), V_, False),
    "dt_bias_shape": ({}, _set("dt_bias", lambda kw, s, d: kw["dt_bias"][..., None] if kw["dt_bias"].dim() == 1
                                else kw["dt_bias"][:, 0]), V_, False),
    "A_log_nonfinite": ({}, _poke("A_log", lambda x, s, d: (_pick(d, x.shape[0]), d.draw(st.sampled_from((NAN, INF))))),
                        V_, True),
    "dt_bias_nonfinite": ({}, _poke("dt_bias", lambda x, s, d: (_first(x, s, d), d.draw(st.sampled_from((NAN, -INF))))),
                          V_, True),
    "pool_rank": ({}, _set("state_pool", lambda kw, s, d: kw["state_pool"][..., 0]), V_, False),
    "pool_heads": ({}, _set("state_pool", lambda kw, s, d: _cat1(kw["state_pool"], 1)), V_, False),
    "pool_layout_swapped": ({"K": 8, "V": 16}, _set("state_pool", lambda kw, s, d:
                                                     kw["state_pool"].transpose(-1, -2).contiguous()), V_, False),
    "pool_dtype": ({}, _set("state_pool", lambda kw, s, d: kw["state_pool"].to(torch.float16)), T_, True),
    "layout_name": ({}, _set("state_layout", lambda kw, s, d: d.draw(st.sampled_from(("VK", "xy", "")))), V_, True),
    "idx_float": ({}, _set("state_indices", lambda kw, s, d: kw["state_indices"].float()), T_, True),
    "idx_shape": ({}, _set("state_indices", lambda kw, s, d: _cat1(kw["state_indices"], 0)), V_, False),
    "idx_out_of_range": ({"pad": ()}, _dec_idx_oob, V_, False),
    "idx_duplicate": ({"N": 2, "pad": (), "disable": False, "share": False, "table": False, "nat": False},
                      _dec_dup, V_, False),
    "table_cross_duplicate": ({"N": 2, "T": 2, "pad": (), "disable": False, "share": False, "table": True,
                               "nat": False}, _dec_table_dup, V_, False),
    "nat_without_table": ({"table": False, "nat": False}, _set("num_accepted_tokens", lambda kw, s, d:
                                                               torch.zeros(s.N, dtype=torch.int32)), V_, False),
    "nat_out_of_range": ({"table": True, "nat": True, "T": 2},
                         _poke("num_accepted_tokens", lambda x, s, d: (_pick(d, s.N),
                                                                       d.draw(st.sampled_from((s.T + 1, -1))))),
                         V_, False),
    "nat_dtype": ({"table": True, "nat": True, "T": 2}, _set("num_accepted_tokens", lambda kw, s, d:
                                                             kw["num_accepted_tokens"].float()), T_, True),
    "inter_without_idx": ({"inter": True}, _set("intermediate_state_indices", None), V_, False),
    "inter_idx_without_buffer": ({"inter": True}, _set("intermediate_states", None), V_, False),
    "inter_steps_short": ({"inter": True, "T": 2}, _set("intermediate_states", lambda kw, s, d:
                                                         kw["intermediate_states"][:, :s.T - 1]), V_, False),
    "inter_idx_out_of_range": ({"inter": True}, _poke("intermediate_state_indices", lambda x, s, d: (
        _pick(d, s.N), s.N + s.extra + d.draw(st.integers(0, 3)))), V_, False),
    "inter_idx_duplicate": ({"inter": True, "N": 2}, _set("intermediate_state_indices", lambda kw, s, d:
                                                          torch.zeros(s.N, dtype=torch.int64)), V_, False),
    "pool_zero_stride": ({"disable": False, "extra": 2}, _set("state_pool", lambda kw, s, d:
                                                               kw["state_pool"][:1].expand(kw["state_pool"].shape)),
                         V_, True),
    "inter_zero_stride": ({"inter": True, "extra": 2}, _set("intermediate_states", lambda kw, s, d:
                                                            kw["intermediate_states"][:1].expand(
                                                                kw["intermediate_states"].shape)), V_, True),
    "pool_overlapping_slots": ({"disable": False, "extra": 1}, _set("state_pool", lambda kw, s, d:
                                                                    _overlapping(kw["state_pool"], 0)), V_, True),
    "pool_overlapping_heads": ({"disable": False, "G": 2}, _set("state_pool", lambda kw, s, d:
                                                                _overlapping(kw["state_pool"], 1)), V_, True),
    "inter_overlaps_pool": ({"inter": True}, lambda kw, s, d: _pool_and_inter_sharing(kw), V_, True),
    "input_overlaps_pool": ({"disable": False, "dtype": "float32", "pool_dtype": "float32"},
                            lambda kw, s, d: _q_in_pool(kw), V_, True),
    "scale_bad": ({}, _set("scale", lambda kw, s, d: d.draw(st.sampled_from((0.0, -1.0, NAN, INF)))), V_, True),
    "scale_tensor": ({}, _set("scale", torch.tensor(0.5)), T_, True),
    "l2norm_nonbool": ({}, _set("use_qk_l2norm", 1), T_, True),
    "disable_nonbool": ({}, _set("disable_state_update", 1), T_, True),
    "softplus_bad": ({}, lambda kw, s, d: kw.__setitem__(d.draw(st.sampled_from(("softplus_beta", "softplus_threshold"))),
                                                        d.draw(st.sampled_from((0.0, -1.0, NAN, INF)))), V_, True),
    "pool_requires_grad": ({}, _set("state_pool", lambda kw, s, d: kw["state_pool"].detach().clone()
                                    .to(torch.float32).requires_grad_(True)), REFUSALS, True),
    "pool_inference": ({"disable": False}, _set("state_pool", lambda kw, s, d: _inference(kw["state_pool"])), V_, True),
    "inter_inference": ({"inter": True, "extra": 1, "T": 1}, _set("intermediate_states", lambda kw, s, d:
                                              _inference(kw["intermediate_states"])), V_, True),
}
def _both_gate_forms(kw, s, d):
    N, T, HV = kw["q"].shape[0], kw["q"].shape[1], kw["v"].shape[2]
    kw["g"] = -torch.rand(N, T, HV, *((kw["q"].shape[3],) if kw["a"].dim() == 4 else ()))
    kw["beta"] = torch.rand(N, T, HV)


def _half_gate_form(kw, s, d):
    kw.pop(d.draw(st.sampled_from(("g", "beta"))))


def _no_gate_form(kw, s, d):
    kw.pop("g"), kw.pop("beta")


def _g_poke_decode(val):
    def f(kw, s, data):
        g = kw["g"].clone(memory_format=torch.contiguous_format)
        g.view(-1)[_pick(data, g.numel())] = val(data) if callable(val) else val
        kw["g"] = g
    return f


def _his(kind):
    def f(kw, s, d):
        n = kw["q"].shape[0] if kw["q"].dim() == 4 else kw["cu_seqlens"].shape[0] - 1
        if kind == "int":
            kw["has_initial_state"] = torch.ones(n, dtype=torch.int32)
        elif kind == "shape":
            kw["has_initial_state"] = torch.ones(n + 1, dtype=torch.bool)
        else:
            kw["has_initial_state"] = torch.ones(n, dtype=torch.bool)
    return f


DECODE_MUTATIONS.update({
    "both_gate_forms": ({}, _both_gate_forms, V_, True),
    "half_gate_form": ({"gate_form": "pre"}, _half_gate_form, T_, True),
    "no_gate_form": ({"gate_form": "pre"}, _no_gate_form, T_, True),
    "pre_gates_softplus": ({"gate_form": "pre"}, lambda kw, s, d: kw.__setitem__("softplus_beta", 2.0), V_, True),
    "pre_g_positive": ({"gate_form": "pre"}, _g_poke_decode(lambda d: d.draw(st.sampled_from((0.5, INF)))), V_, True),
    "pre_g_nan": ({"gate_form": "pre"}, _g_poke_decode(NAN), V_, True),
    "pre_g_dtype": ({"gate_form": "pre"}, _set("g", lambda kw, s, d: kw["g"].to(torch.bfloat16)), T_, True),
    "his_dtype": ({}, _his("int"), T_, True),
    "his_shape": ({}, _his("shape"), V_, False),
})
KDA_DECODE_MUTATIONS = {
    "pre_gates_lower_bound": ({"gate_form": "pre"}, _set("lower_bound", -5.0), V_, True),
    "lower_bound_bad": ({}, _set("lower_bound", lambda kw, s, d: d.draw(st.sampled_from((0.0, 1.0, -INF, NAN)))),
                        V_, True),
}
if HAS_CHECK_FINITE:
    DECODE_MUTATIONS["check_finite_nan"] = ({}, _poke("v", lambda x, s, d: (_first(x, s, d), NAN)), V_, True)


def _prefill_dup(kw, s, data):
    idx = kw["state_indices"].clone()
    idx[1] = idx[0]
    kw["state_indices"] = idx


def _cu_drop(kw, s, data):
    cu = kw["cu_seqlens"].clone()
    cu[1] = cu[2] + 1
    kw["cu_seqlens"] = cu


def _g_poke(val):
    def f(kw, s, data):
        g = kw["g"].clone(memory_format=torch.contiguous_format)
        g.view(-1)[_pick(data, g.numel())] = val(data) if callable(val) else val
        kw["g"] = g
    return f


PREFILL_MUTATIONS = {
    "cu_start": ({}, _set("cu_seqlens", lambda kw, s, d: kw["cu_seqlens"] + 1), V_, False),
    "cu_decreasing": ({"lens": (3, 2, 1)}, _cu_drop, V_, False),
    "cu_sum": ({}, _set("cu_seqlens", lambda kw, s, d: torch.cat([kw["cu_seqlens"][:-1], kw["cu_seqlens"][-1:]
                                                                   + d.draw(st.sampled_from((1, -1)))])), V_, False),
    "cu_dtype": ({}, _set("cu_seqlens", lambda kw, s, d: kw["cu_seqlens"].float()), T_, True),
    "cu_rank": ({}, _set("cu_seqlens", lambda kw, s, d: kw["cu_seqlens"][None]), V_, False),
    "cu_empty": ({}, _set("cu_seqlens", lambda kw, s, d: kw["cu_seqlens"][:0]), V_, False),
    "g_positive": ({}, _g_poke(lambda d: d.draw(st.sampled_from((0.5, 1e-3, INF)))), V_, True),
    "g_nan": ({}, _g_poke(NAN), V_, True),
    "g_dtype": ({}, _set("g", lambda kw, s, d: kw["g"].to(torch.bfloat16)), T_, True),
    "g_shape": ({}, _set("g", lambda kw, s, d: kw["g"][..., None] if kw["g"].dim() == 2 else kw["g"][..., 0]),
                V_, False),
    "beta_shape": ({}, _set("beta", lambda kw, s, d: _cat1(kw["beta"], 1)), V_, False),
    "beta_dtype": ({}, _set("beta", lambda kw, s, d: kw["beta"].to(torch.bfloat16)), T_, True),
    "q_rank": ({}, _set("q", lambda kw, s, d: kw["q"][None]), V_, False),
    "k_shape": ({"K": 16}, _set("k", lambda kw, s, d: kw["k"][..., :-1]), V_, False),
    "v_lead": ({}, _set("v", lambda kw, s, d: _cat1(kw["v"], 0)), V_, False),
    "gva_ratio": ({"H": 2, "G": 1}, lambda kw, s, d: [kw.__setitem__(n, _cat1(kw[n], 1)) for n in ("v", "g", "beta")],
                  V_, False),
    "qk_dtype_mix": ({"dtype": "float32"}, _set("k", lambda kw, s, d: kw["k"].to(torch.float16)), T_, True),
    "pool_and_initial": ({"mode": "pool"}, _set("initial_state", lambda kw, s, d:
                                                torch.zeros((len(s.lens), *kw["state_pool"].shape[1:]),
                                                            dtype=kw["state_pool"].dtype)), V_, False),
    "idx_without_pool": ({"mode": "dense"}, _set("state_indices", lambda kw, s, d:
                                                 torch.arange(len(s.lens), dtype=torch.int32)), V_, False),
    "pool_without_idx": ({"mode": "pool"}, _set("state_indices", None), V_, False),
    "idx_shape": ({"mode": "pool"}, _set("state_indices", lambda kw, s, d: _cat1(kw["state_indices"], 0)), V_, False),
    "idx_float": ({"mode": "pool"}, _set("state_indices", lambda kw, s, d: kw["state_indices"].float()), T_, True),
    "idx_out_of_range": ({"mode": "pool", "pad": ()}, _poke("state_indices", lambda x, s, d: (
        _pick(d, len(s.lens)), len(s.lens) + s.extra + d.draw(st.integers(0, 3)))), V_, False),
    "idx_duplicate": ({"mode": "pool", "pad": (), "lens": (2, 3)}, _prefill_dup, V_, False),
    "initial_shape": ({"mode": "dense_h0"}, _set("initial_state", lambda kw, s, d: _cat1(kw["initial_state"], 0)),
                      V_, False),
    "initial_dtype": ({"mode": "dense_h0"}, _set("initial_state", lambda kw, s, d:
                                                 kw["initial_state"].to(torch.float16)), T_, True),
    "pool_layout_swapped": ({"mode": "pool", "K": 8, "V": 16}, _set("state_pool", lambda kw, s, d:
                                                                     kw["state_pool"].transpose(-1, -2).contiguous()),
                            V_, False),
    "pool_zero_stride": ({"mode": "pool", "extra": 2}, _set("state_pool", lambda kw, s, d:
                                                            kw["state_pool"][:1].expand(kw["state_pool"].shape)),
                         V_, True),
    "pool_overlapping_slots": ({"mode": "pool", "extra": 1}, _set("state_pool", lambda kw, s, d:
                                                                  _overlapping(kw["state_pool"], 0)), V_, True),
    "pool_overlapping_heads": ({"mode": "pool", "G": 2}, _set("state_pool", lambda kw, s, d:
                                                              _overlapping(kw["state_pool"], 1)), V_, True),
    "input_overlaps_pool": ({"mode": "pool", "dtype": "float32", "state_dtype": "float32"},
                            lambda kw, s, d: _q_in_pool(kw), V_, True),
    "scale_bad": ({}, _set("scale", lambda kw, s, d: d.draw(st.sampled_from((0.0, -1.0, NAN, INF)))), V_, True),
    "l2norm_nonbool": ({}, _set("use_qk_l2norm", 1), T_, True),
    "layout_name": ({}, _set("state_layout", "VK"), V_, True),
    "pool_requires_grad": ({"mode": "pool"}, _set("state_pool", lambda kw, s, d: kw["state_pool"].detach().clone()
                                                  .to(torch.float32).requires_grad_(True)), REFUSALS, True),
    "pool_inference": ({"mode": "pool"}, _set("state_pool", lambda kw, s, d: _inference(kw["state_pool"])), V_, True),
}
PREFILL_MUTATIONS.update({
    "his_dense_mode": ({"mode": "dense"}, _his("ok"), V_, False),
    "his_dtype": ({"mode": "pool"}, _his("int"), T_, True),
    "his_shape": ({"mode": "pool"}, _his("shape"), V_, False),
})
if HAS_CHECK_FINITE:
    PREFILL_MUTATIONS["check_finite_nan"] = ({}, _poke("beta", lambda x, s, d: (_first(x, s, d), NAN)), V_, True)


def _fix_decode(spec, over: dict):
    s = replace(spec, **{"gate_form": "raw", "his": False, **over})
    if s.nat and not s.table:
        s = replace(s, table=True)
    if s.table and s.T == 0:
        s = replace(s, T=1)
    if "pad" not in over:
        s = replace(s, pad=tuple(p for p in s.pad if p < s.N))
    if s.share and (not s.disable or s.N < 2):
        s = replace(s, share=False)
    if s.gate_form == "pre":
        s = replace(s, lower_bound=None, softplus=(1.0, 20.0))
    if "lower_bound" not in over and s.op != "kda_decode":
        s = replace(s, lower_bound=None)
    return legal_views(s)


def _fix_prefill(spec, over: dict):
    s = replace(spec, **{"his": False, **over})
    if "lens" in over or "pad" in over:
        s = replace(s, pad=tuple(p for p in s.pad if p < len(s.lens)) if "pad" not in over else s.pad)
    if s.mode != "pool":
        s = replace(s, pad=(), his=False)
    if "lens" not in over and not s.lens:
        s = replace(s, lens=(2,))
    if "lens" not in over and sum(s.lens) == 0:
        s = replace(s, lens=s.lens[:-1] + (2,))
    return legal_views(s)


def _params(table: dict, op: str, backends):
    out = []
    for name, (_, _, _, safe) in table.items():
        for be in backends:
            if be not in (None, "torch-ref") and not safe:
                continue
            m = marks(op, be or "auto", name)
            if be in ("triton-split", "triton-folded"):
                m = m + [pytest.mark.interpreter]
            out.append(pytest.param(name, be, marks=m, id=f"{op}-{name}-{be or 'auto'}"))
    return out


def _budget(backend) -> int:
    return 6 if backend in (None, "torch-ref") else 2


DECODE_BACKENDS_INVALID = (None, "torch-ref", "triton-split")
PREFILL_BACKENDS_INVALID = (None, "torch-ref", "triton-split", "cpu-chunked")


@pytest.mark.parametrize("op", ("gdn_decode", "kda_decode"))
@pytest.mark.parametrize("mutation,backend", _params({**DECODE_MUTATIONS, **KDA_DECODE_MUTATIONS}, "decode",
                                                     DECODE_BACKENDS_INVALID))
def test_decode_invalid_refused_before_any_write(op, mutation, backend):
    table = {**DECODE_MUTATIONS, **(KDA_DECODE_MUTATIONS if op == "kda_decode" else {})}
    if mutation not in table:
        pytest.skip(f"{mutation} applies to kda_decode only")
    over, mutate, allowed, _ = table[mutation]
    extra = {"check_finite": True} if mutation == "check_finite_nan" else {}

    @fuzz_settings(_budget(backend), key=_key())
    @given(spec=decode_specs(op, "triton-split", "mixed"), data=st.data())
    def prop(spec, data):
        s = _fix_decode(spec, over)
        kw = dict(build_decode(s).kwargs)
        mutate(kw, s, data)
        with Tally("invalid", op, backend, (mutation, s)) as tally:
            tally.outcome = check_refused(op, kw, backend, allowed, **extra)

    prop()


@pytest.mark.parametrize("op", ("gdn_prefill", "kda_prefill"))
@pytest.mark.parametrize("mutation,backend", _params(PREFILL_MUTATIONS, "prefill", PREFILL_BACKENDS_INVALID))
def test_prefill_invalid_refused_before_any_write(op, mutation, backend):
    over, mutate, allowed, _ = PREFILL_MUTATIONS[mutation]
    extra = {"check_finite": True} if mutation == "check_finite_nan" else {}

    @fuzz_settings(_budget(backend), key=_key())
    @given(spec=prefill_specs(op, "torch-ref", "mixed"), data=st.data())
    def prop(spec, data):
        s = _fix_prefill(spec, over)
        if backend in ("triton-split", "triton-folded"):
            s = replace(s, K=64, V=64 if "V" not in over else s.V)
        kw = dict(build_prefill(s).kwargs)
        mutate(kw, s, data)
        with Tally("invalid", op, backend, (mutation, s)) as tally:
            tally.outcome = check_refused(op, kw, backend, allowed, **extra)

    prop()


# -- a forced backend that does not fit: NoBackendError, nothing written -----------------------------

@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ("triton-split", "triton-folded"))
@pytest.mark.parametrize("op", ("gdn_decode", "gdn_prefill"))
def test_forced_backend_that_does_not_fit_is_refused(op, backend):
    from linattn.dispatch.plugin.verdict import NoBackendError

    @fuzz_settings(2, key=_key())
    @given(spec=(decode_specs(op, "torch-ref", "mixed") if op.endswith("decode")
                 else prefill_specs(op, "torch-ref", "mixed")))
    def prop(spec):
        if op.endswith("decode"):
            s = _fix_decode(spec, {"dtype": "float64", "pool_dtype": "float64"})
            kw = dict(build_decode(s).kwargs)
        else:  # head dims the chunked kernels do not take (K, V in {4, ..., 32})
            s = _fix_prefill(spec, {})
            kw = dict(build_prefill(s).kwargs)
        with Tally("invalid", op, backend, s) as tally:
            tally.outcome = check_refused(op, kw, backend, (NoBackendError,))

    prop()


# -- gating and the clamp -------------------------------------------------------------------------

GATING_MUTATIONS = {
    "a_b_disagree": lambda kw, kda: kw.__setitem__("b", _cat1(kw["b"], -1)),
    "A_log_shape": lambda kw, kda: kw.__setitem__("A_log", _cat1(kw["A_log"], 0)),
    "dt_bias_shape": lambda kw, kda: kw.__setitem__("dt_bias", kw["dt_bias"][..., None]),
    "a_rank": lambda kw, kda: kw.__setitem__("a", kw["a"].reshape(-1) if kda else kw["a"].reshape(-1)[0]),
    "a_int": lambda kw, kda: kw.__setitem__("a", kw["a"].to(torch.int32)),
    "softplus_bad": lambda kw, kda: kw.__setitem__("softplus_beta", 0.0),
    "lower_bound_bad": lambda kw, kda: kw.__setitem__("lower_bound", 0.5) if kda else kw.__setitem__("softplus_threshold", NAN),
}


@pytest.mark.parametrize("op", ("gdn_gating", "kda_gating"))
@pytest.mark.parametrize("mutation", sorted(GATING_MUTATIONS))
def test_gating_invalid_refused(op, mutation):
    kda = op == "kda_gating"

    @fuzz_settings(3, key=_key())
    @given(n=st.integers(1, 3), HV=st.integers(1, 3), K=st.integers(1, 4))
    def prop(n, HV, K):
        kw = dict(A_log=torch.randn(HV), a=torch.randn(n, HV, *((K,) if kda else ())), b=torch.randn(n, HV),
                  dt_bias=torch.randn(HV, *((K,) if kda else ())))
        if kda:
            kw["lower_bound"] = None
        GATING_MUTATIONS[mutation](kw, kda)
        with Tally("invalid", op, None, (mutation, n, HV, K)) as tally:
            tally.outcome = check_refused(op, kw, None, VT)

    prop()


@pytest.mark.parametrize("backend", (None, pytest.param("triton-split", marks=pytest.mark.interpreter)))
def test_silu_and_mul_clamp_invalid_refused(backend):
    @fuzz_settings(8, key=_key())
    @given(M=st.integers(0, 3), D=st.integers(1, 8),
           bad=st.sampled_from(("odd", "rank1", "int", "limit0", "limit_neg", "limit_inf", "limit_nan")))
    def prop(M, D, bad):
        x, limit, allowed = torch.randn(M, 2 * D), None, V_
        if bad == "odd":
            x = torch.randn(M, 2 * D + 1)
        elif bad == "rank1":
            x = torch.randn(2 * D)
        elif bad == "int":
            x, allowed = x.to(torch.int32), T_
        else:
            limit = {"limit0": 0.0, "limit_neg": -1.0, "limit_inf": INF, "limit_nan": NAN}[bad]
        with Tally("invalid", "silu_and_mul_clamp", backend, (M, D, bad)) as tally:
            tally.outcome = check_refused("silu_and_mul_clamp", dict(x=x, limit=limit), backend, allowed)

    prop()
