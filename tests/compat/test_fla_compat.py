"""linattn.compat.fla against a float64 oracle written in FLA's conventions ([B, T, H, K] inputs,
[N, HV, K, V] states, GVA head hv -> hv // (HV // H)), for GDN and KDA, both state layouts, varlen,
initial / final states, recurrent == chunk; and the refusals of arguments linattn does not implement."""

from __future__ import annotations

import warnings

import pytest
import torch

import linattn
import linattn.compat.fla as fla

D64 = torch.float64


# -- the oracle ----------------------------------------------------------------------------------------

def oracle(q, k, v, g, beta, *, scale=None, h0=None, l2norm=False, cu_seqlens=None):
    """Token-serial float64 recurrence. q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV] or
    [B, T, HV, K]; beta [B, T, HV]; h0 [N, HV, K, V]. Returns (o [B, T, HV, V], ht [N, HV, K, V])."""
    q, k, v, g, beta = (x.to(D64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(B, T, HV, V, dtype=D64)
    hts = []
    for n, (b, s, e) in enumerate(seqs):
        S = torch.zeros(HV, K, V, dtype=D64) if h0 is None else h0[n].to(D64).clone()
        for t in range(s, e):
            for hv in range(HV):
                h = hv // (HV // H)
                qt, kt = q[b, t, h], k[b, t, h]
                if l2norm:
                    qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                    kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                gt = g[b, t, hv]
                S[hv] = S[hv] * (torch.exp(gt) if gt.dim() == 0 else torch.exp(gt)[:, None])
                u = beta[b, t, hv] * (v[b, t, hv] - kt @ S[hv])
                S[hv] = S[hv] + torch.outer(kt, u)
                o[b, t, hv] = (qt * scale) @ S[hv]
        hts.append(S)
    return o, torch.stack(hts)


def inputs(family, B, T, H, HV, K, V, *, seed=0, dtype=torch.float32, N=None):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    gshape = (B, T, HV) if family == "gdn" else (B, T, HV, K)
    g = -torch.rand(*gshape, generator=gen) * 0.3
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = r(N or B, HV, K, V) * 0.1
    return [x.to(dtype) for x in (q, k, v)] + [g, beta, h0]


CHUNK = {"gdn": fla.chunk_gated_delta_rule, "kda": fla.chunk_kda}
RECUR = {"gdn": fla.fused_recurrent_gated_delta_rule, "kda": fla.fused_recurrent_kda}


def rel(a, b):
    return float((a.to(D64) - b.to(D64)).abs().max() / b.to(D64).abs().max().clamp_min(1e-30))


def call(fn, q, k, v, g, beta, **kw):
    if fn is fla.fused_recurrent_gated_delta_rule:  # FLA's positional order is q, k, v, g, gk, gv, beta
        return fn(q, k, v, g, beta=beta, **kw)
    return fn(q, k, v, g, beta, **kw)


# -- accuracy ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("kind", ["chunk", "recurrent"])
def test_batched_against_float64_oracle(family, v_first, kind):
    """B = 2 equal-length sequences longer than one chunk, GVA (GDN), initial and final state."""
    H, HV = (2, 4) if family == "gdn" else (2, 2)
    q, k, v, g, beta, h0 = inputs(family, 2, 70, H, HV, 32, 16, seed=1)
    fn = (CHUNK if kind == "chunk" else RECUR)[family]
    init = h0.transpose(-1, -2).contiguous() if v_first else h0
    init_copy = init.clone()
    o, ht = call(fn, q, k, v, g, beta, initial_state=init, output_final_state=True,
                 use_qk_l2norm_in_kernel=True, state_v_first=v_first)
    ro, rht = oracle(q, k, v, g, beta, h0=h0, l2norm=True)
    assert o.shape == (2, 70, HV, 16) and o.dtype == torch.float32
    assert ht.dtype == torch.float32 and ht.shape == init.shape
    ht_kv = ht.transpose(-1, -2) if v_first else ht
    assert rel(o, ro) < 2e-5 and rel(ht_kv, rht) < 2e-5
    assert torch.equal(init, init_copy), "the caller's initial_state must not be modified"
    expected_op = f"{family}_{'prefill' if kind == 'chunk' else fla.recurrent_route(family)}"
    assert linattn.last_decision().op == expected_op


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("kind", ["chunk", "recurrent"])
def test_varlen_against_float64_oracle(family, v_first, kind):
    """B = 1 with cu_seqlens (one empty-free mix of short and multi-chunk sequences), float64
    inputs: the reference mode, agreement to float64 rounding."""
    cu = torch.tensor([0, 5, 75, 140])
    H, HV = (1, 2) if family == "gdn" else (2, 2)
    q, k, v, g, beta, h0 = inputs(family, 1, 140, H, HV, 16, 16, seed=2, dtype=D64, N=3)
    g, beta, h0 = g.to(D64), beta.to(D64), h0.to(D64)
    fn = (CHUNK if kind == "chunk" else RECUR)[family]
    init = h0.transpose(-1, -2).contiguous() if v_first else h0
    with fla.options(backend="torch-ref"):
        o, ht = call(fn, q, k, v, g, beta, initial_state=init, output_final_state=True, cu_seqlens=cu,
                     state_v_first=v_first)
    ro, rht = oracle(q, k, v, g, beta, h0=h0, cu_seqlens=cu)
    assert o.dtype == D64 and ht.dtype == D64
    ht_kv = ht.transpose(-1, -2) if v_first else ht
    assert rel(o, ro) < 1e-10 and rel(ht_kv, rht) < 1e-10
    assert linattn.last_decision().chosen == "torch-ref"


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_recurrent_equals_chunk(family):
    q, k, v, g, beta, h0 = inputs(family, 3, 4, 1, 2, 16, 8, seed=3)
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o1, h1 = call(CHUNK[family], q, k, v, g, beta, **kw)
    o2, h2 = call(RECUR[family], q, k, v, g, beta, **kw)
    torch.testing.assert_close(o2, o1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h2, h1, rtol=1e-5, atol=1e-6)


def test_defaults_no_l2norm_no_state_scale():
    """FLA's defaults: no L2 norm (linattn's own default is the opposite), zero initial state, no
    final state; an explicit scale is honoured."""
    q, k, v, g, beta, _ = inputs("gdn", 1, 9, 1, 1, 8, 8, seed=4)
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta)
    assert ht is None
    assert rel(o, oracle(q, k, v, g, beta)[0]) < 2e-5
    o, _ = fla.chunk_gated_delta_rule(q, k, v, g, beta, scale=0.5)
    assert rel(o, oracle(q, k, v, g, beta, scale=0.5)[0]) < 2e-5


def test_negative_eigenvalue_beta_is_accepted():
    q, k, v, g, beta, h0 = inputs("gdn", 2, 8, 2, 2, 8, 8, seed=5)
    beta = 2.0 * beta  # (0, 2): OLMo-hybrid's allow_neg_eigval form
    o, ht = fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    ro, rht = oracle(q, k, v, g, beta, h0=h0, l2norm=True)
    assert rel(o, ro) < 2e-5 and rel(ht, rht) < 2e-5


def test_recurrent_gdn_none_gate_and_beta():
    q, k, v, *_ = inputs("gdn", 1, 6, 1, 1, 8, 8, seed=6)
    o, _ = fla.fused_recurrent_gated_delta_rule(q, k, v)
    ro, _ = oracle(q, k, v, torch.zeros(1, 6, 1), torch.ones(1, 6, 1))
    assert rel(o, ro) < 2e-5


def test_dtypes_16_bit():
    """o in q's dtype (chunk) / v's dtype (recurrent), final state float32; gates in 16 bits and a
    16-bit GDN initial state are read as float32."""
    q, k, v, g, beta, h0 = inputs("gdn", 1, 5, 1, 1, 8, 8, seed=7, dtype=torch.bfloat16)
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g.bfloat16(), beta.bfloat16(), initial_state=h0.bfloat16(),
                                       output_final_state=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    o, ht = fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, output_final_state=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32


@pytest.mark.parametrize("fn", [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule, fla.chunk_kda,
                                fla.fused_recurrent_kda], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_a_non_float_initial_state_is_refused_by_every_function(fn, dtype):
    """One rule across the four: no integer, bool or complex initial_state is silently converted."""
    family = "kda" if "kda" in fn.__name__ else "gdn"
    q, k, v, g, beta, h0 = inputs(family, 1, 3, 1, 1, 8, 8, seed=9)
    with pytest.raises(TypeError, match=rf"{fn.__name__}: initial_state must be a floating-point tensor.*"
                                        rf"{str(dtype).removeprefix('torch.')}"):
        call(fn, q, k, v, g, beta, initial_state=h0.to(dtype), output_final_state=True)


@pytest.mark.parametrize("fn", [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule,
                                fla.fused_recurrent_kda], ids=lambda f: f.__name__)
def test_a_16_bit_initial_state_is_still_read_as_float32(fn):
    family = "kda" if "kda" in fn.__name__ else "gdn"
    q, k, v, g, beta, h0 = inputs(family, 1, 3, 1, 1, 8, 8, seed=9)
    _, ref = call(fn, q, k, v, g, beta, initial_state=h0.bfloat16().float(), output_final_state=True)
    _, ht = call(fn, q, k, v, g, beta, initial_state=h0.bfloat16(), output_final_state=True)
    assert ht.dtype == torch.float32 and torch.equal(ht, ref)


def test_transpose_state_layout_alias():
    q, k, v, g, beta, h0 = inputs("kda", 1, 5, 1, 1, 8, 8, seed=8)
    with pytest.warns(DeprecationWarning):
        _, a = fla.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, transpose_state_layout=True)
    _, b = fla.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, state_v_first=True)
    assert torch.equal(a, b)


def test_accepted_performance_hints():
    q, k, v, g, beta, _ = inputs("kda", 1, 10, 1, 1, 8, 8, seed=9)
    cu = torch.tensor([0, 4, 10])
    ref, _ = fla.chunk_kda(q, k, v, g, beta, cu_seqlens=cu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, _ = fla.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu, safe_gate=True,
                             disable_recompute=True, chunk_size=32)
    assert torch.equal(o, ref)
    qg, kg, vg, gg, bg, _ = inputs("gdn", 1, 10, 1, 1, 8, 8, seed=9)
    ref, _ = fla.chunk_gated_delta_rule(qg, kg, vg, gg, bg, cu_seqlens=cu)
    o, _ = fla.chunk_gated_delta_rule(qg, kg, vg, gg, bg, cu_seqlens=cu, cu_seqlens_cpu=cu, chunk_size=16)
    assert torch.equal(o, ref)


def test_grad_mode_error():
    q, k, v, g, beta, _ = inputs("gdn", 1, 4, 1, 1, 8, 8, seed=10)
    q.requires_grad_(True)
    with pytest.raises(linattn.GradModeError):
        fla.chunk_gated_delta_rule(q, k, v, g, beta)
    with torch.no_grad():
        fla.chunk_gated_delta_rule(q, k, v, g, beta)


def test_fla_shape_errors():
    q, k, v, g, beta, h0 = inputs("gdn", 2, 4, 1, 1, 8, 8, seed=11)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4, 8]))
    with pytest.raises(ValueError, match="number of initial states"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0[:1])
    with pytest.raises(ValueError, match="GVA"):
        fla.chunk_gated_delta_rule(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 3, 8),
                                   -torch.rand(1, 4, 3), torch.rand(1, 4, 3))
    # cu_seqlens short of the tokens: said in the caller's [B, T] terms, with the function's prefix on every route
    one = [x[:1] for x in (q, k, v, g, beta)]
    for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        with pytest.raises(ValueError, match=rf"^linattn\.compat\.fla\.{fn.__name__}: cu_seqlens\[-1\] = 3 .*"
                                             r"\(B \* T of q \[B, T, H, K\]\)"):
            fn(*one[:4], beta=one[4], cu_seqlens=torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"^linattn\.compat\.fla\.fused_recurrent_gated_delta_rule: g\[0, 0, 0\]"):
        fla.fused_recurrent_gated_delta_rule(q, k, v, -g, beta=beta)  # g > 0 on the equal-length (decode) route


@pytest.mark.parametrize("fn, family", [(fla.chunk_gated_delta_rule, "gdn"), (fla.chunk_kda, "kda"),
                                        (fla.fused_recurrent_kda, "kda")])
@pytest.mark.parametrize("missing", ["g", "beta"])
def test_a_missing_g_or_beta_is_a_type_error_naming_it(fn, family, missing):
    """FLA's signatures require g and beta here (fused_recurrent_gated_delta_rule defaults them: tested above)."""
    q, k, v, g, beta, _ = inputs(family, 1, 4, 1, 1, 8, 8, seed=3)
    args = {"g": g, "beta": beta, missing: None}
    with pytest.raises(TypeError, match=rf"^linattn\.compat\.fla\.{fn.__name__}: {missing} must be a torch\.Tensor, "
                                        r"got NoneType; it is required"):
        fn(q, k, v, args["g"], args["beta"])


def test_a_q_that_is_no_tensor_is_named_so_not_as_a_shape():
    q, k, v, g, beta, _ = inputs("gdn", 1, 4, 1, 1, 8, 8, seed=3)
    for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule, fla.chunk_kda, fla.fused_recurrent_kda):
        with pytest.raises(TypeError, match=rf"^linattn\.compat\.fla\.{fn.__name__}: v must be a torch\.Tensor"):
            fn(q, k, None, g, beta)
    with pytest.raises(TypeError, match=r"q must be a torch\.Tensor, got ndarray\.$"):
        fla.chunk_gated_delta_rule(q.numpy(), k, v, g, beta)
    with pytest.raises(ValueError, match=r"q must be a \[B, T, H, D\] tensor, got \[4, 1, 8\]"):
        fla.chunk_gated_delta_rule(q[0], k, v, g, beta)


@pytest.mark.parametrize("value", ["no", None, 0])
def test_options_validate_is_a_bool(value):
    with pytest.raises(TypeError, match="validate must be a bool"):
        with fla.options(validate=value):
            pass
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        with fla.options(check_finite=value):
            pass


# -- refusals ------------------------------------------------------------------------------------------------

_G = {"gdn": (1, 4, 1), "kda": (1, 4, 1, 8)}
REFUSALS = [
    ("chunk_gated_delta_rule", dict(use_beta_sigmoid_in_kernel=True), NotImplementedError, "use_beta_sigmoid_in_kernel"),
    ("chunk_gated_delta_rule", dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True), NotImplementedError,
     "allow_neg_eigval"),
    ("chunk_gated_delta_rule", dict(allow_neg_eigval=True), ValueError, "requires `use_beta_sigmoid_in_kernel"),
    ("chunk_gated_delta_rule", dict(use_gate_in_kernel=True), ValueError, "`A_log` must be provided"),
    ("chunk_gated_delta_rule", dict(A_log=torch.zeros(1)), ValueError, "A_log given with use_gate_in_kernel=False"),
    ("chunk_gated_delta_rule", dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_gated_delta_rule", dict(chunk_indices=torch.zeros(1, 2)), NotImplementedError, "chunk_indices"),
    ("chunk_gated_delta_rule", dict(cu_seqlens_cpu=torch.tensor([0, 4])), ValueError, "cu_seqlens_cpu"),
    ("chunk_gated_delta_rule", dict(chunk_size=128), ValueError, "chunk_size"),
    ("chunk_gated_delta_rule", dict(head_first=False), TypeError, "head_first"),
    ("chunk_gated_delta_rule", dict(bogus=1), TypeError, "bogus"),
    ("fused_recurrent_gated_delta_rule", dict(gk=torch.zeros(1, 4, 1, 8)), NotImplementedError, "gk"),
    ("fused_recurrent_gated_delta_rule", dict(gv=torch.zeros(1, 4, 1, 8)), NotImplementedError, "gv"),
    ("fused_recurrent_gated_delta_rule", dict(use_gate_in_kernel=True), ValueError, "`A_log` must be provided"),
    ("fused_recurrent_gated_delta_rule", dict(dt_bias=torch.zeros(1)), ValueError,
     "dt_bias given with use_gate_in_kernel=False"),
    ("fused_recurrent_gated_delta_rule", dict(use_beta_sigmoid_in_kernel=True), NotImplementedError, "sigmoid"),
    ("fused_recurrent_gated_delta_rule", dict(beta=torch.rand(1, 4, 1, 8)), NotImplementedError, "head-wise"),
    ("fused_recurrent_gated_delta_rule", dict(chunk_size=64), TypeError, "chunk_size"),
    ("fused_recurrent_gated_delta_rule", dict(ssm_state_indices=torch.zeros(1)), TypeError, "ssm_state_indices"),
    ("chunk_kda", dict(use_gate_in_kernel=True), ValueError, "`A_log` must be provided .* `lower_bound` is not set"),
    ("chunk_kda", dict(lower_bound=-5.0), ValueError, "lower_bound given with use_gate_in_kernel=False"),
    ("chunk_kda", dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True), NotImplementedError, "sigmoid"),
    ("chunk_kda", dict(return_intermediate_states=True), NotImplementedError, "return_intermediate_states"),
    ("chunk_kda", dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_kda", dict(use_graph=True), NotImplementedError, "use_graph"),
    ("chunk_kda", dict(max_num_seqs=4), NotImplementedError, "max_num_seqs"),
    ("chunk_kda", dict(A_log=torch.zeros(1)), ValueError, "A_log given with use_gate_in_kernel=False"),
    ("chunk_kda", dict(chunk_size=16), ValueError, "chunk_size"),
    ("chunk_kda", dict(initial_state=torch.zeros(1, 1, 8, 8, dtype=torch.bfloat16)), TypeError, "float32"),
    ("chunk_kda", dict(whatever=None), TypeError, "whatever"),
    ("fused_recurrent_kda", dict(A_log=torch.zeros(1)), ValueError, "A_log given with use_gate_in_kernel=False"),
    ("fused_recurrent_kda", dict(lower_bound=-5.0), ValueError, "lower_bound given with use_gate_in_kernel=False"),
    ("fused_recurrent_kda", dict(use_gate_in_kernel=True), ValueError, "`A_log` must be provided"),
    ("fused_recurrent_kda", dict(use_beta_sigmoid_in_kernel=True), NotImplementedError, "sigmoid"),
    ("fused_recurrent_kda", dict(allow_neg_eigval=True), ValueError, "allow_neg_eigval"),
    ("fused_recurrent_kda", dict(beta=torch.rand(1, 4, 1, 8)), NotImplementedError, "head-wise"),
    ("fused_recurrent_kda", dict(num_accepted_tokens=torch.ones(1)), TypeError, "num_accepted_tokens"),
]


@pytest.mark.parametrize("name,kwargs,exc,needle", REFUSALS,
                         ids=[f"{n}-{'+'.join(kw)}" for n, kw, _, _ in REFUSALS])
def test_unimplemented_arguments_are_refused(name, kwargs, exc, needle):
    family = "kda" if "kda" in name else "gdn"
    args = dict(q=torch.randn(1, 4, 1, 8), k=torch.randn(1, 4, 1, 8), v=torch.randn(1, 4, 1, 8),
                g=-torch.rand(*_G[family]), beta=torch.rand(1, 4, 1))
    args.update(kwargs)
    with pytest.raises(exc, match=needle):
        getattr(fla, name)(**args)


def test_beta_given_in_gks_place_is_refused_with_the_order_named():
    """A transformers-style positional call (q, k, v, g, beta) puts beta where FLA's signature has gk: the
    refusal says so, and a real [B, T, HV, K] gk gets no such hint."""
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 2, 8)
    g, beta = -torch.rand(1, 4, 2), torch.rand(1, 4, 2)
    with pytest.raises(NotImplementedError, match=r"gk's place.*pass beta=beta"):
        fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta)
    with pytest.raises(NotImplementedError, match="gk") as e:
        fla.fused_recurrent_gated_delta_rule(q, k, v, g, torch.zeros(1, 4, 2, 8), beta=beta)
    assert "pass beta=beta" not in str(e.value)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_recurrent_decode_slots_are_one_kept_cpu_tensor_left_unchanged(family):
    """The decode route's slots 0..N-1 into its own pool: one kept int64 CPU tensor per N (a normal
    tensor, also when made under inference_mode), read only; results as a first call's, every call
    leaving initial_state as given; a bad g still refused in the caller's terms."""
    fla._CPU_SLOTS.clear()
    q, k, v, g, beta, h0 = inputs(family, 3, 1, 1, 2, 16, 8, seed=5)
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    given = h0.clone()
    with torch.inference_mode():
        o1, h1 = call(RECUR[family], q, k, v, g, beta, **kw)
    slots = fla._CPU_SLOTS[(3, 1)]
    assert not slots.is_inference() and slots.dtype == torch.int64
    with torch.no_grad():
        o2, h2 = call(RECUR[family], q, k, v, g, beta, **kw)
    assert fla._CPU_SLOTS[(3, 1)] is slots and torch.equal(slots, torch.arange(3))
    assert torch.equal(o1, o2) and torch.equal(h1, h2) and torch.equal(h0, given)
    bad = g.clone()
    bad[1, 0, 1] = 0.25
    with pytest.raises(ValueError, match=r"^linattn\.compat\.fla\.fused_recurrent_\w+: g\[1, 0, 1"):
        call(RECUR[family], q, k, v, bad, beta, **kw)
    assert torch.equal(h0, given)



def test_dense_chunk_cu_seqlens_are_one_kept_cpu_tensor_left_unchanged():
    """The dense prefill's cu_seqlens 0, T, .., B T: one kept int64 CPU tensor per (B + 1, T), read only;
    a second call's results are the first's."""
    fla._CPU_SLOTS.clear()
    q, k, v, g, beta, h0 = inputs("gdn", 2, 5, 1, 2, 16, 8, seed=6)
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o1, h1 = call(CHUNK["gdn"], q, k, v, g, beta, **kw)
    cu = fla._CPU_SLOTS[(3, 5)]
    o2, h2 = call(CHUNK["gdn"], q, k, v, g, beta, **kw)
    assert fla._CPU_SLOTS[(3, 5)] is cu and torch.equal(cu, torch.tensor([0, 5, 10]))
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


def test_a_fake_tensor_trace_keeps_no_slot_tensor_and_later_calls_run():
    """A call traced with fake tensors (FakeTensorMode) makes its own slots: the kept ones stay real, and
    the same call in eager mode afterwards runs and matches a fresh process's result."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fla._CPU_SLOTS.clear()
    r = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, 1, 8, generator=r) for _ in range(3))
    g, b = -torch.rand(2, 1, 1, generator=r), torch.rand(2, 1, 1, generator=r)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fla.fused_recurrent_gated_delta_rule(*(mode.from_tensor(x) for x in (q, k, v)), g=mode.from_tensor(g),
                                             beta=mode.from_tensor(b))
    assert all(type(t) is torch.Tensor for t in fla._CPU_SLOTS.values())
    o, _ = fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=b)
    fla._CPU_SLOTS.clear()
    o2, _ = fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=b)
    assert torch.equal(o, o2)


def test_a_kept_cu_seqlens_written_into_is_made_again():
    """A backend that writes into the cu_seqlens it was given (refused, F43) leaves the next call a fresh
    tensor, not the changed one: the later result equals the first."""
    r = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 1, 8, generator=r) for _ in range(3))
    g, b = -torch.rand(2, 5, 1, generator=r), torch.rand(2, 5, 1, generator=r)
    want, _ = fla.chunk_gated_delta_rule(q, k, v, g, b)
    kept = fla._CPU_SLOTS[(3, 5)]
    kept[1] = 2  # what such a backend does to the tensor it was handed
    got, _ = fla.chunk_gated_delta_rule(q, k, v, g, b)
    assert torch.equal(got, want) and fla._CPU_SLOTS[(3, 5)].tolist() == [0, 5, 10]
