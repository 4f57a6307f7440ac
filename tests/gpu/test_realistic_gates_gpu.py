"""Realistic gates on the GPU (issue 32 item 3): the prefill and decode kernels under the gate
distributions of real models' initialisations (linattn.testing.gates: Qwen3-Next, Qwen3.5 and
OLMo-hybrid GDN; Kimi-Linear and GLM-5-Next KDA), strong-decay heads included (KDA blocks off stage
1's fast path), where the benchmarks' mild gates (about -0.05 per token) never go.

Pinned: at Qwen3-Next shapes (bf16) pool == dense bitwise, rows not owned unchanged, ops.md's bf16
tolerances against the float64 token-serial reference; fp32 within 1e-5 at small heads for every
model; the fused GDN prefill no worse than the pipeline; decode's raw gates (the model's A_log,
dt_bias, a, b) against the float64 reference; compat.fla's ``use_gate_in_kernel`` bitwise equal to
the precomputed decay on CUDA.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

import linattn  # noqa: E402
import linattn.compat.fla as fla  # noqa: E402
from linattn.backends.torch_ref import gdn_decode_ref, kda_decode_ref  # noqa: E402
from linattn.testing.gates import MODELS, decay_summary, kda_fast_path_misses, model_gates  # noqa: E402

from prefill_cases import cu_of, random_states, reference, rel, run  # noqa: E402

DEV = "cuda"
BF = torch.bfloat16
GDN_MODELS = [n for n, m in MODELS.items() if m.family == "gdn"]
KDA_MODELS = [n for n, m in MODELS.items() if m.family == "kda"]
FAMILY_MODELS = [("gdn", n) for n in GDN_MODELS] + [("kda", n) for n in KDA_MODELS]


def realistic_inputs(model, lens, *, H, HV, K, V, dtype, seed, strong_every=8):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    g, beta = model_gates(model, T, hv=HV, k=K, seed=seed, strong_every=strong_every, device=DEV).log_decay()
    r = lambda *s: torch.randn(*s, generator=gen).to(DEV, dtype)  # noqa: E731
    return dict(q=r(T, H, K), k=r(T, H, K), v=r(T, HV, V), g=g, beta=beta, cu_seqlens=cu_of(lens, device=DEV))


class TestRealisticGates:
    @pytest.mark.parametrize("family,model", [("gdn", "qwen3-next"), ("kda", "kimi-linear"), ("kda", "glm5-next")])
    def test_bf16_pool_equals_dense_and_reference_at_qwen3_next_shapes(self, family, model):
        lens = [1500, 64, 1, 900, 333]
        inp = realistic_inputs(model, lens, H=16, HV=32, K=128, V=128, dtype=BF, seed=21)
        if family == "kda":
            assert decay_summary(inp["g"], inp["cu_seqlens"])["kda_level_path_fraction"] > 0.1
        P = 16
        slots = torch.tensor([9, 2, 14, 0, 5], dtype=torch.int32, device=DEV)
        pool = random_states(P, 32, 128, 128, seed=22, device=DEV)
        before = pool.clone()
        o, _ = run(family, inp, state_pool=pool, state_indices=slots)
        o_dense, ht = run(family, inp, initial_state=before[slots.long()].clone())
        torch.cuda.synchronize()
        assert torch.equal(o, o_dense) and torch.equal(pool[slots.long()], ht)
        others = torch.ones(P, dtype=torch.bool, device=DEV)
        others[slots.long()] = False
        assert torch.equal(pool[others], before[others])
        assert torch.isfinite(o).all() and torch.isfinite(ht).all()
        ro, rht = reference(family, inp, initial_state=before[slots.long()].double())
        assert rel(o, ro) < 2e-2 and rel(ht, rht) < 1e-2, (rel(o, ro), rel(ht, rht))

    @pytest.mark.parametrize("family,model", FAMILY_MODELS)
    def test_fp32_every_model_within_1e_5(self, family, model):
        lens = [1, 0, 700, 1300, 63]
        inp = realistic_inputs(model, lens, H=1, HV=2, K=128, V=128, dtype=torch.float32, seed=23, strong_every=2)
        if family == "kda":
            assert bool(kda_fast_path_misses(inp["g"], inp["cu_seqlens"])[:, 1].any())
        h0 = random_states(len(lens), 2, 128, 128, seed=24, device=DEV)
        o, ht = run(family, inp, initial_state=h0)
        ro, rht = reference(family, inp, initial_state=h0.double())
        assert rel(o, ro) < 1e-5 and rel(ht, rht) < 1e-5, (rel(o, ro), rel(ht, rht))
        assert torch.equal(ht[1], h0[1])  # the empty sequence keeps its state

    @pytest.mark.parametrize("dtype", [BF, torch.float32])
    @pytest.mark.parametrize("model", GDN_MODELS)
    def test_fused_gdn_prefill_no_worse_than_the_pipeline(self, model, dtype):
        lens = [300, 0, 1, 64, 200]
        inp = realistic_inputs(model, lens, H=4, HV=8, K=128, V=128, dtype=dtype, seed=25, strong_every=4)
        h0 = random_states(len(lens), 8, 128, 128, device=DEV) * 0.1
        ro, rht = reference("gdn", inp, initial_state=h0)
        o_f, ht_f = run("gdn", inp, initial_state=h0, fused=True)
        o_p, ht_p = run("gdn", inp, initial_state=h0, fused=False)
        if dtype == torch.float32:
            assert rel(o_f, ro) < 1e-5 and rel(ht_f, rht) < 1e-5
        else:
            assert rel(o_f, ro) <= 1.5 * rel(o_p, ro) + 2e-3, (rel(o_f, ro), rel(o_p, ro))
            assert rel(ht_f, rht) <= 1.5 * rel(ht_p, rht) + 2e-3, (rel(ht_f, rht), rel(ht_p, rht))

    @pytest.mark.parametrize("T", [1, 3])
    @pytest.mark.parametrize("family,model", FAMILY_MODELS)
    def test_decode_raw_gates_against_the_float64_reference(self, family, model, T):
        N, H, HV, K, V = 256, 16, 32, 128, 128
        gen = torch.Generator().manual_seed(26)
        mg = model_gates(model, N * T, hv=HV, k=K, seed=27, device=DEV)
        chan = (HV, K) if family == "kda" else (HV,)
        r = lambda *s: torch.randn(*s, generator=gen).to(DEV)  # noqa: E731
        d = dict(q=r(N, T, H, K).to(BF), k=r(N, T, H, K).to(BF), v=r(N, T, HV, V).to(BF),
                 a=mg.a.view(N, T, *chan).to(BF), b=mg.b.view(N, T, HV).to(BF), A_log=mg.A_log, dt_bias=mg.dt_bias)
        P = 2 * N
        pool = r(P, HV, V, K) * 0.1
        idx = torch.randperm(P, generator=gen)[:N].to(torch.int32).to(DEV)
        idx[::17] = -1
        before = pool.clone()
        extra = {"lower_bound": mg.model.lower_bound} if family == "kda" else {}
        op = linattn.kda_decode if family == "kda" else linattn.gdn_decode
        o = op(*(d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")), pool, idx, **extra)
        torch.cuda.synchronize()
        owned = torch.zeros(P, dtype=torch.bool, device=DEV)
        owned[idx[idx >= 0].long()] = True
        assert torch.equal(pool[~owned], before[~owned]) and bool((o[idx < 0] == 0).all())
        ref_pool = before.double()
        fn = kda_decode_ref if family == "kda" else gdn_decode_ref
        ro = fn(*(d[n].double() for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")), ref_pool, idx,
                compute_dtype=torch.float64, **extra)
        live = idx >= 0
        assert torch.isfinite(o).all()
        assert rel(o[live], ro[live]) <= 2e-2 and rel(pool[owned], ref_pool[owned]) <= 1e-2

    @pytest.mark.parametrize("lower_bound", [None, -5.0])
    def test_compat_fla_gate_in_kernel_on_cuda_equals_the_precomputed_decay(self, lower_bound):
        model = "glm5-next" if lower_bound is not None else "kimi-linear"
        B, T, H, HV, K, V = 2, 300, 4, 8, 128, 128
        mg = model_gates(model, B * T, hv=HV, k=K, seed=28, device=DEV)
        gen = torch.Generator().manual_seed(29)
        r = lambda *s: torch.randn(*s, generator=gen).to(DEV)  # noqa: E731
        q, k, v = r(B, T, H, K).to(BF), r(B, T, H, K).to(BF), r(B, T, HV, V).to(BF)
        beta, h0 = torch.rand(B, T, HV, generator=gen).to(DEV), r(B, HV, K, V) * 0.1
        graw = mg.a.view(B, T, HV, K).to(BF)
        kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        o1, h1 = fla.chunk_kda(q, k, v, graw, beta, use_gate_in_kernel=True, A_log=mg.A_log,
                               dt_bias=mg.dt_bias.reshape(-1), lower_bound=lower_bound, **kw)
        g, _ = linattn.kda_gating(mg.A_log, graw, beta, mg.dt_bias, lower_bound=lower_bound)
        o2, h2 = fla.chunk_kda(q, k, v, g, beta, **kw)
        assert torch.equal(o1, o2) and torch.equal(h1, h2)
        assert torch.isfinite(o1).all() and torch.isfinite(h1).all()
