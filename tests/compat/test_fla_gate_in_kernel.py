"""linattn.compat.fla with ``use_gate_in_kernel=True`` (issue 32 item 4): ``g`` is the raw gate input
and the log decay is FLA 0.6's ``-exp(A_log) * softplus(g + dt_bias)`` (KDA with ``lower_bound``:
``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, ``A_log`` optional there), in all four
functions; against a float64 evaluation of that maths (written here) fed to the float64 oracle of
test_fla_compat, and against the same call with the log decay precomputed. Bad gate arguments are
refused before anything runs (the gating op is never reached)."""

from __future__ import annotations

import pytest
import torch

import linattn
import linattn.compat.fla as fla
from linattn.testing.gates import model_gates

from test_fla_compat import call, oracle, rel

D64 = torch.float64
FUNCS = {("gdn", "chunk"): fla.chunk_gated_delta_rule, ("gdn", "recurrent"): fla.fused_recurrent_gated_delta_rule,
         ("kda", "chunk"): fla.chunk_kda, ("kda", "recurrent"): fla.fused_recurrent_kda}


def gate_f64(family, graw, A_log, dt_bias, lower_bound=None):
    """FLA 0.6's gate maths in float64: raw g [B, T, HV(, K)], A_log with HV values (or None),
    dt_bias with HV (KDA HV * K) values (or None); softplus switches to x above 20 as FLA's."""
    HV = graw.shape[2]
    x = graw.to(D64)
    if dt_bias is not None:
        x = x + dt_bias.to(D64).reshape(graw.shape[2:])
    A = torch.ones(HV, dtype=D64) if A_log is None else A_log.to(D64).reshape(HV).exp()
    A = A[:, None] if family == "kda" else A
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    return -A * torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp(max=20))))


def raw_inputs(family, B=2, T=70, H=1, HV=2, K=16, V=8, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    graw = r(B, T, HV, *((K,) if family == "kda" else ())) * 2
    return [x.to(dtype) for x in (r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V))] + [
        graw.to(dtype), torch.rand(B, T, HV, generator=gen).to(dtype), r(B, HV, K, V).to(dtype) * 0.1]


@pytest.mark.parametrize("kind", ["chunk", "recurrent"])
@pytest.mark.parametrize("family,params", [
    ("gdn", "A_log+dt_bias"), ("gdn", "A_log"), ("kda", "A_log+dt_bias"), ("kda", "A_log [1, 1, HV, 1]"),
    ("kda", "lower_bound+A_log+dt_bias"), ("kda", "lower_bound+dt_bias"),
])
def test_gate_in_kernel_against_the_float64_gate_maths_and_oracle(family, params, kind):
    """float64 inputs on torch-ref (the oracle mode): agreement to float64 rounding."""
    q, k, v, graw, beta, h0 = raw_inputs(family, seed=1, dtype=D64)
    HV, K = v.shape[2], q.shape[3]
    gen = torch.Generator().manual_seed(2)
    A_log = torch.randn(HV, generator=gen, dtype=D64) if "A_log" in params else None
    if A_log is not None and "[1, 1, HV, 1]" in params:
        A_log = A_log.view(1, 1, HV, 1)  # Kimi-Linear's parameter shape, read flat as FLA's kernels read it
    dt_bias = torch.randn(HV * K if family == "kda" else HV, generator=gen, dtype=D64) if "dt_bias" in params else None
    lb = -5.0 if "lower_bound" in params else None
    kw = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    if lb is not None:
        kw["lower_bound"] = lb
    with fla.options(backend="torch-ref"):
        o, ht = call(FUNCS[(family, kind)], q, k, v, graw, beta, initial_state=h0, output_final_state=True,
                     use_qk_l2norm_in_kernel=True, **kw)
    g = gate_f64(family, graw, A_log, dt_bias, lb)
    assert float(g.min()) < -2 and float(g.max()) <= 0
    ro, rht = oracle(q, k, v, g, beta, h0=h0, l2norm=True)
    assert o.dtype == D64 and rel(o, ro) < 1e-10 and rel(ht, rht) < 1e-10


@pytest.mark.parametrize("family,kind", list(FUNCS))
def test_gate_in_kernel_equals_the_precomputed_log_decay_in_fp32(family, kind):
    """fp32, the dispatcher's choice: the in-kernel gate gives the bits of the same call with g computed
    by linattn's gating op first (the drop-in runs exactly that)."""
    q, k, v, graw, beta, h0 = raw_inputs(family, seed=3)
    HV, K = v.shape[2], q.shape[3]
    A_log, dt_bias = torch.randn(HV), torch.randn(HV * K if family == "kda" else HV)
    fn = FUNCS[(family, kind)]
    o1, h1 = call(fn, q, k, v, graw, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    gating = linattn.kda_gating if family == "kda" else linattn.gdn_gating
    g, _ = gating(A_log, graw, beta, dt_bias.view(HV, K) if family == "kda" else dt_bias)
    o2, h2 = call(fn, q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    ro, rht = oracle(q, k, v, gate_f64(family, graw, A_log, dt_bias), beta, h0=h0, l2norm=True)
    assert rel(o1, ro) < 2e-5 and rel(h1, rht) < 2e-5


def test_kimi_linear_realistic_gates_with_strong_heads_through_chunk_kda():
    """Kimi-Linear's initialisation (linattn.testing.gates) with a strong-decay head, in FLA's layout."""
    T, HV, K = 140, 2, 16
    mg = model_gates("kimi-linear", T, hv=HV, k=K, seed=4, strong_every=2, dtype=D64)
    q, k, v, _, beta, h0 = raw_inputs("kda", B=1, T=T, HV=HV, K=K, seed=5, dtype=D64)
    graw = mg.a.unsqueeze(0)
    with fla.options(backend="torch-ref"):
        o, ht = fla.chunk_kda(q, k, v, graw, beta, initial_state=h0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=mg.A_log,
                              dt_bias=mg.dt_bias.reshape(-1))
    g = gate_f64("kda", graw, mg.A_log, mg.dt_bias)
    assert float(g[0, :, 1].sum(0).min()) < -1000, "the strong head wipes the state"
    ro, rht = oracle(q, k, v, g, beta, h0=h0, l2norm=True)
    assert rel(o, ro) < 1e-10 and rel(ht, rht) < 1e-10


class _NoGating(Exception):
    pass


BAD = [
    ("chunk_kda", dict(use_gate_in_kernel=True, A_log=torch.zeros(3)), ValueError, r"A_log must hold \[HV\] = 2"),
    ("chunk_kda", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2)), ValueError,
     r"dt_bias must hold \[HV \* K\] \(or \[HV, K\]\) = 16"),
    ("chunk_kda", dict(use_gate_in_kernel=True, A_log=torch.zeros(2, dtype=torch.int64)), TypeError, "floating-point"),
    ("chunk_kda", dict(use_gate_in_kernel=True, lower_bound=0.0), ValueError, "finite and < 0"),
    ("chunk_kda", dict(use_gate_in_kernel=True, lower_bound=float("nan")), ValueError, "finite and < 0"),
    ("chunk_kda", dict(use_gate_in_kernel=True, lower_bound="-5"), TypeError, "lower_bound must be a float"),
    ("chunk_kda", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), safe_gate=True), ValueError,
     "`lower_bound` must be specified when `safe_gate=True`"),
    ("chunk_kda", dict(use_gate_in_kernel=True, lower_bound=-6.0, safe_gate=True), ValueError, r"safe range \[-5, 0\)"),
    ("chunk_kda", dict(use_gate_in_kernel=True, dt_bias=torch.zeros(16)), ValueError, "`A_log` must be provided"),
    ("fused_recurrent_kda", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2, 4)),
     ValueError, "dt_bias must hold"),
    ("chunk_gated_delta_rule", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2, 8)),
     ValueError, r"dt_bias must hold \[HV\] = 2"),
    ("chunk_gated_delta_rule", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), lower_bound=-5.0), TypeError,
     "lower_bound"),
    ("fused_recurrent_gated_delta_rule", dict(use_gate_in_kernel=True, A_log=torch.zeros(2), g=None), ValueError,
     "`g` .* must be provided"),
    ("fused_recurrent_gated_delta_rule", dict(use_gate_in_kernel=True, A_log=torch.zeros(2, device="meta")),
     ValueError, "A_log is on meta but g is on cpu"),
]


@pytest.mark.parametrize("name,kwargs,exc,needle", BAD, ids=[f"{n}-{'+'.join(kw)}-{i}" for i, (n, kw, _, _) in
                                                              enumerate(BAD)])
def test_bad_gate_arguments_are_refused_before_the_gating_runs(name, kwargs, exc, needle, monkeypatch):
    for op in ("gdn_gating", "kda_gating", "gdn_prefill", "kda_prefill", "gdn_decode", "kda_decode"):
        monkeypatch.setattr(linattn, op, lambda *a, **k: (_ for _ in ()).throw(_NoGating(op)))
    family = "kda" if "kda" in name else "gdn"
    args = dict(q=torch.randn(1, 4, 1, 8), k=torch.randn(1, 4, 1, 8), v=torch.randn(1, 4, 2, 8),
                g=torch.randn(1, 4, 2, *((8,) if family == "kda" else ())), beta=torch.rand(1, 4, 2))
    args.update(kwargs)
    with pytest.raises(exc, match=needle):
        getattr(fla, name)(**args)


def test_a_layer_parameter_works_under_no_grad_and_is_refused_with_grad_mode_on():
    """A model's ``A_log`` is an ``nn.Parameter``: inference (no_grad) runs; with grad mode on the
    gating refuses it as every linattn op refuses an input that requires grad (GradModeError)."""
    q, k, v, graw, beta, _ = raw_inputs("kda", B=1, T=6)
    A_log = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(linattn.GradModeError, match="A_log requires grad"):
        fla.chunk_kda(q, k, v, graw, beta, use_gate_in_kernel=True, A_log=A_log)
    with torch.no_grad():
        o, _ = fla.chunk_kda(q, k, v, graw, beta, use_gate_in_kernel=True, A_log=A_log)
        o2, _ = fla.chunk_kda(q, k, v, gate_f64("kda", graw, A_log.detach(), None).float(), beta)
    torch.testing.assert_close(o, o2, rtol=1e-5, atol=1e-6)
