"""Decode from precomputed gates (issue 16, item 2; docs/ops-decisions.md "Decode from precomputed
gates"): ``gdn_decode`` / ``kda_decode`` with ``a, b, A_log, dt_bias = None`` and ``g=``, ``beta=``.

The gate form must equal the raw-gate decode fed ``gdn_gating`` / ``kda_gating``'s outputs:

- **torch-ref: bitwise.** Its fused gating is ``gdn_gating_ref`` / ``kda_gating_ref`` itself (the
  same fp32 expression), and the gate form only floors ``g`` at ``G_MIN`` again (a no-op on the
  gating op's output), so the recurrence sees the same bits.
- **Triton (interpreter): within fp32 rounding.** The kernel's fused gating is its own expression
  (softplus via ``log(1 + exp(-|x|))``, ``beta = 1 / (1 + exp(-b))``), not torch's, so the raw and
  gate forms differ by a few ulps (bound: 2e-6 relative, 1e-6 absolute). The gate form through
  Triton agrees with the gate form through torch-ref to the same bound.

Every case runs padding, both layouts, and (``spec``) a per-token slot table with
``num_accepted_tokens`` and intermediate states; every one asserts that unowned pool rows (and
unnamed intermediate rows) are bitwise unchanged. Refusals leave the pool bitwise unchanged.
"""

from __future__ import annotations

import pytest
import torch

import linattn

N, T, H, HV, K, V, P, S = 4, 3, 1, 2, 8, 8, 9, 6
BACKENDS = ["torch-ref", "triton-split", "triton-folded"]
ATOL, RTOL = 1e-6, 2e-6  # fp32 rounding of two different gating expressions (Triton)


def _inputs(family: str, layout: str, mode: str, seed: int = 0, lower_bound=None):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    kda = family == "kda"
    d = dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V),
             a=r(*((N, T, HV, K) if kda else (N, T, HV))), b=r(N, T, HV),
             A_log=r(HV) * 0.5, dt_bias=r(*((HV, K) if kda else (HV,))) * 0.5)
    tile = (V, K) if layout == "vk" else (K, V)
    d["state_pool"] = r(P, HV, *tile)
    opts = dict(state_layout=layout)
    if kda and lower_bound is not None:
        opts["lower_bound"] = lower_bound
    if mode == "flat":
        d["state_indices"] = torch.tensor([3, -1, 7, 0], dtype=torch.int32)
    else:  # speculative verify: per-token table, accepted counts, intermediate states
        d["state_indices"] = torch.tensor([[1, 2, 4], [-1, -1, -1], [5, 6, 8], [0, -1, 3]], dtype=torch.int64)
        d["num_accepted_tokens"] = torch.tensor([2, 1, 0, 3], dtype=torch.int32)
        d["intermediate_states"] = r(S, T, HV, *tile)
        d["intermediate_state_indices"] = torch.tensor([4, 0, -1, 2], dtype=torch.int32)
    return d, opts


def _owned(d: dict) -> set:
    idx = d["state_indices"]
    if idx.dim() == 1:
        return {int(s) for s in idx if s >= 0}
    nat = d["num_accepted_tokens"].tolist()
    rows = idx.tolist()
    out = set()
    for row, na in zip(rows, nat):
        load = row[max(na - 1, 0)] if na > 0 else row[0]
        if load >= 0:
            out |= {s for s in row if s >= 0}
    return out


def _gates(family: str, d: dict, opts: dict):
    gate = linattn.kda_gating if family == "kda" else linattn.gdn_gating
    extra = {"lower_bound": opts["lower_bound"]} if "lower_bound" in opts else {}
    g, beta = gate(d["A_log"], d["a"].reshape(N * T, *d["a"].shape[2:]), d["b"].reshape(N * T, HV),
                   d["dt_bias"], **extra)
    return g.reshape(d["a"].shape), beta.reshape(N, T, HV)  # [N, T, HV(, K)], as FLA passes them


def _run(family: str, d: dict, opts: dict, backend: str, gates=None):
    """Run on clones of the written buffers; returns (o, pool, intermediate_states), after checking
    that unowned pool rows and unnamed intermediate rows are bitwise unchanged."""
    o, pool, inter = _run_only(family, d, opts, backend, gates)
    _assert_unowned_unchanged(d, pool, inter)
    return o, pool, inter


def _run_only(family: str, d: dict, opts: dict, backend: str, gates=None):
    fn = linattn.kda_decode if family == "kda" else linattn.gdn_decode
    d = dict(d)
    d["state_pool"] = d["state_pool"].clone()
    if "intermediate_states" in d:
        d["intermediate_states"] = d["intermediate_states"].clone()
    if gates is None:
        o = fn(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], d["state_pool"],
               d["state_indices"], backend=backend, **_rest(d), **opts)
    else:
        opts = {k: v for k, v in opts.items() if k != "lower_bound"}  # applied by the gating
        o = fn(d["q"], d["k"], d["v"], None, None, None, None, d["state_pool"], d["state_indices"],
               g=gates[0], beta=gates[1], backend=backend, **_rest(d), **opts)
    return o, d["state_pool"], d.get("intermediate_states")


def _rest(d: dict) -> dict:
    return {k: d[k] for k in ("num_accepted_tokens", "intermediate_states", "intermediate_state_indices") if k in d}


def _assert_unowned_unchanged(d: dict, pool: torch.Tensor, inter):
    owned = _owned(d)
    for s in range(P):
        if s not in owned:
            assert torch.equal(pool[s], d["state_pool"][s]), f"unowned slot {s} changed"
    if inter is not None:  # rows named by a non-padding row are written; every other one is not
        written = {int(d["intermediate_state_indices"][n]) for n in range(N)
                   if _load_slot(d, n) >= 0 and d["intermediate_state_indices"][n] >= 0}
        for s in range(S):
            if s not in written:
                assert torch.equal(inter[s], d["intermediate_states"][s]), f"unnamed intermediate row {s} changed"


def _load_slot(d: dict, n: int) -> int:
    idx = d["state_indices"]
    if idx.dim() == 1:
        return int(idx[n])
    na = int(d["num_accepted_tokens"][n])
    return int(idx[n, max(na - 1, 0)])


def _equal(x, y, exact: bool):
    if exact:
        assert torch.equal(x, y)
    else:
        torch.testing.assert_close(x, y, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mode", ["flat", "spec"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gate_form_equals_raw_decode_fed_the_gating_outputs(backend, family, layout, mode):
    d, opts = _inputs(family, layout, mode, seed=len(family) * 7 + len(layout + mode) * 3 + (mode == "spec"))
    o_raw, pool_raw, inter_raw = _run(family, d, opts, backend)
    o_g, pool_g, inter_g = _run(family, d, opts, backend, gates=_gates(family, d, opts))
    assert linattn.last_decision().chosen == backend
    assert dict(linattn.last_decision().problem)["precomputed_gates"] is True
    exact = backend == "torch-ref"  # the same fp32 expression; Triton's fused gating is its own
    _equal(o_g, o_raw, exact)
    _equal(pool_g, pool_raw, exact)
    if inter_raw is not None:
        _equal(inter_g, inter_raw, exact)
    pad = [n for n in range(N) if _load_slot(d, n) < 0]
    assert pad and o_g[pad].eq(0).all()
    if backend != "torch-ref":  # and the gate form agrees across backends
        o_ref, pool_ref, _ = _run(family, d, opts, "torch-ref", gates=_gates(family, d, opts))
        _equal(o_g, o_ref, False)
        _equal(pool_g, pool_ref, False)


@pytest.mark.parametrize("backend", ["torch-ref", "triton-split"])
def test_kda_bounded_gate_applied_by_the_gating_matches_the_raw_bounded_decode(backend):
    d, opts = _inputs("kda", "vk", "flat", seed=5, lower_bound=-5.0)
    o_raw, pool_raw, _ = _run("kda", d, opts, backend)
    o_g, pool_g, _ = _run("kda", d, opts, backend, gates=_gates("kda", d, opts))
    _equal(o_g, o_raw, backend == "torch-ref")
    _equal(pool_g, pool_raw, backend == "torch-ref")


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_strided_gate_views_give_the_bits_of_contiguous_ones_on_triton(family):
    d, opts = _inputs(family, "vk", "flat", seed=11)
    g, beta = _gates(family, d, opts)
    if family == "kda":
        big = torch.full((N, T, 2 * HV, K), float("nan"))
        big[:, :, ::2] = g
        gv = big[:, :, ::2]  # heads strided, key channels contiguous ("inner")
    else:
        gv = torch.full((N, T, HV, 3), float("nan"))
        gv[..., 1] = g
        gv = gv[..., 1]
    bv = torch.stack([beta, beta + 1], -1)[..., 0]
    assert not gv.is_contiguous() and not bv.is_contiguous()
    o1, p1, _ = _run(family, d, opts, "triton-split", gates=(gv, bv))
    o2, p2, _ = _run(family, d, opts, "triton-split", gates=(g, beta))
    assert torch.equal(o1, o2) and torch.equal(p1, p2)


def test_beta_above_one_is_accepted_as_olmo_passes_it():
    """OLMo's negative-eigenvalue configuration passes beta in (0, 2): not range-checked."""
    d, opts = _inputs("gdn", "vk", "flat", seed=3)
    g, beta = _gates("gdn", d, opts)
    beta2 = beta * 2
    o1, p1, _ = _run("gdn", d, opts, "torch-ref", gates=(g, beta2))
    o2, p2, _ = _run("gdn", d, opts, "triton-split", gates=(g, beta2))
    _equal(o2, o1, False)
    _equal(p2, p1, False)


def test_gates_below_the_floor_are_floored_like_the_gating():
    d, opts = _inputs("gdn", "vk", "flat", seed=4)
    g, beta = _gates("gdn", d, opts)
    low = g.clone()
    low[0] = -1e30
    low[2, 1] = -float("inf")
    floored = low.clamp_min(-1000.0)
    for backend in ("torch-ref", "triton-split"):
        o1, p1, _ = _run("gdn", d, opts, backend, gates=(low, beta))
        o2, p2, _ = _run("gdn", d, opts, backend, gates=(floored, beta))
        assert torch.isfinite(o1).all() and torch.equal(o1, o2) and torch.equal(p1, p2)


# -- refusals -------------------------------------------------------------------------------------

def _refusal_cases():
    d, opts = _inputs("gdn", "vk", "flat", seed=9)
    g, beta = _gates("gdn", d, opts)
    raw = (d["a"], d["b"], d["A_log"], d["dt_bias"])
    none = (None, None, None, None)
    return d, [
        ("both forms", raw, dict(g=g, beta=beta), ValueError, "both gate forms"),
        ("neither form", none, {}, TypeError, "missing the gate arguments"),
        ("raw form incomplete", (d["a"], None, d["A_log"], d["dt_bias"]), {}, TypeError, "'b'"),
        ("g without beta", none, dict(g=g), TypeError, "not beta"),
        ("beta without g", none, dict(beta=beta), TypeError, "not g"),
        ("g bf16", none, dict(g=g.bfloat16(), beta=beta), TypeError, "g has dtype"),
        ("beta shape", none, dict(g=g, beta=beta[:, :1]), ValueError, "beta must have shape"),
        ("g shape", none, dict(g=g[..., None], beta=beta), ValueError, "g must have shape"),
        ("g positive", none, dict(g=g.abs() + 0.1, beta=beta), ValueError, "log-space decay"),
        ("g NaN", none, dict(g=torch.where(g < -0.5, float("nan"), g), beta=beta), ValueError, "log-space decay"),
        ("softplus_beta", none, dict(g=g, beta=beta, softplus_beta=2.0), ValueError, "softplus_beta"),
    ]


@pytest.mark.parametrize("backend", ["torch-ref", "triton-split"])
def test_refusals_name_the_arguments_and_leave_the_pool_unchanged(backend):
    d, cases = _refusal_cases()
    for what, gates4, kw, exc, says in cases:
        pool = d["state_pool"].clone()
        with pytest.raises(exc, match=says):
            linattn.gdn_decode(d["q"], d["k"], d["v"], *gates4, pool, d["state_indices"], backend=backend, **kw)
        assert torch.equal(pool, d["state_pool"]), what


def test_lower_bound_with_precomputed_gates_is_refused():
    d, opts = _inputs("kda", "vk", "flat", seed=2)
    g, beta = _gates("kda", d, opts)
    pool = d["state_pool"].clone()
    with pytest.raises(ValueError, match="lower_bound"):
        linattn.kda_decode(d["q"], d["k"], d["v"], None, None, None, None, pool, d["state_indices"],
                           g=g, beta=beta, lower_bound=-5.0)
    assert torch.equal(pool, d["state_pool"])


def test_shared_gate_parameter_rule_skips_the_gate_form_and_check_finite_covers_g():
    d, opts = _inputs("gdn", "vk", "flat", seed=6)
    g, beta = _gates("gdn", d, opts)
    pool = d["state_pool"].clone()
    linattn.gdn_decode(d["q"], d["k"], d["v"], None, None, None, None, pool, d["state_indices"], g=g, beta=beta)
    bad = beta.clone()
    bad[0, 0, 0] = float("inf")
    pool = d["state_pool"].clone()
    with pytest.raises(ValueError, match="beta"):
        linattn.gdn_decode(d["q"], d["k"], d["v"], None, None, None, None, pool, d["state_indices"], g=g,
                           beta=bad, check_finite=True)
    assert torch.equal(pool, d["state_pool"])


def test_problem_field_is_in_the_signature_and_the_decision_cache_key():
    from linattn.dispatch.rules.validate import validate

    d, opts = _inputs("gdn", "vk", "flat")
    g, beta = _gates("gdn", d, opts)
    base = dict(q=d["q"], k=d["k"], v=d["v"], state_pool=d["state_pool"], state_indices=d["state_indices"])
    kw_raw, sig_raw = validate("gdn_decode", dict(base, a=d["a"], b=d["b"], A_log=d["A_log"], dt_bias=d["dt_bias"]))
    kw_g, sig_g = validate("gdn_decode", dict(base, g=g, beta=beta))
    assert dict(sig_raw)["precomputed_gates"] is False and dict(sig_g)["precomputed_gates"] is True
    assert sig_raw != sig_g
    assert "g" not in kw_raw and "beta" not in kw_raw and "has_initial_state" not in kw_raw  # v1 keywords only
    assert kw_g["g"] is g and kw_g["a"] is None and kw_g["A_log"] is None


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_self_check_class_and_case_cover_the_new_features(op):
    """A backend self-checked on an unverified arch is checked on the feature's own kernel variant."""
    from linattn.backends.triton_split import TritonSplitBackend
    from linattn.dispatch.plugin.problem import Problem
    from linattn.dispatch.runtime.self_check import check_against_reference, kernel_class

    p = Problem(op=op, n=1, t=2, h=1, hv=2, k=8, v=8, dtype="float32", precomputed_gates=True,
                has_initial_state=True, num_accepted_tokens=True, lower_bound=op == "kda_decode")
    assert kernel_class(p).endswith("precomputed_gates has_initial_state")
    assert kernel_class(p) != kernel_class(p.model_copy(update=dict(precomputed_gates=False)))
    check = check_against_reference(TritonSplitBackend(), p, "cpu")
    assert check.ok, check.message


def test_gate_form_and_has_initial_state_trace_with_torch_compile_fullgraph():
    d, opts = _inputs("gdn", "vk", "flat", seed=12)
    g, beta = _gates("gdn", d, opts)
    his = torch.tensor([False, True, True, False])

    def f(q, k, v, g, beta, pool, idx, his):
        return linattn.gdn_decode(q, k, v, None, None, None, None, pool, idx, g=g, beta=beta, has_initial_state=his)

    p1, p2 = d["state_pool"].clone(), d["state_pool"].clone()
    args = (d["q"], d["k"], d["v"], g, beta)
    o1 = torch.compile(f, fullgraph=True)(*args, p1, d["state_indices"], his)
    o2 = f(*args, p2, d["state_indices"], his)
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    _assert_unowned_unchanged(d, p1, None)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_gate_form_leaves_the_raw_gate_arguments_out_as_keywords(family):
    """a, b, A_log, dt_bias default to None: the gate form is ``fn(q, k, v, g=, beta=, state_pool=,
    state_indices=)``, the bits of passing the four as None; the pool and slots are still required,
    and leaving out both gate forms is still the gate rule's TypeError."""
    fn = linattn.kda_decode if family == "kda" else linattn.gdn_decode
    d, opts = _inputs(family, "vk", "flat", seed=13)
    g, beta = _gates(family, d, opts)
    o_none, p_none, _ = _run_only(family, d, opts, "torch-ref", gates=(g, beta))
    pool = d["state_pool"].clone()
    o_kw = fn(d["q"], d["k"], d["v"], g=g, beta=beta, state_pool=pool, state_indices=d["state_indices"],
              backend="torch-ref")
    assert torch.equal(o_kw, o_none) and torch.equal(pool, p_none)
    pool = d["state_pool"].clone()
    with pytest.raises(TypeError, match="'state_pool', 'state_indices'"):
        fn(d["q"], d["k"], d["v"], g=g, beta=beta)
    with pytest.raises(TypeError, match="'state_indices'"):
        fn(d["q"], d["k"], d["v"], g=g, beta=beta, state_pool=pool)
    with pytest.raises(TypeError, match="missing the gate arguments"):
        fn(d["q"], d["k"], d["v"], state_pool=pool, state_indices=d["state_indices"])
    assert torch.equal(pool, d["state_pool"])
