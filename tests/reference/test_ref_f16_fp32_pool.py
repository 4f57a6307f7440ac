"""F16: bf16 q/k/v with an fp32 pool over a few hundred decode steps, then a prefill.

The pool must stay fp32 and never be round-tripped through 16 bits: it matches the run on the
same values given as fp32 inputs bitwise, and the float64 oracle to fp32 accuracy (a bf16 round
trip per step would leave errors near 1e-3).
"""

import torch

from linattn.backends.torch_ref import gdn_decode_ref, gdn_gating_ref, gdn_prefill_ref
from linattn.testing.compare import rel_error_exact_zero as rel


def run(steps, pool, cd, inputs=None):
    """200 decode steps for 2 requests, then a prefill of 2 more sequences into their slots."""
    cast = (lambda x: x.to(inputs)) if inputs is not None else (lambda x: x)
    idx = torch.tensor([3, 0])
    outs = []
    for q, k, v, a, b, A_log, dt_bias in steps["decode"]:
        outs.append(gdn_decode_ref(cast(q), cast(k), cast(v), a, b, A_log, dt_bias, pool, idx, compute_dtype=cd))
    q, k, v, g, beta, cu = steps["prefill"]
    o, _ = gdn_prefill_ref(cast(q), cast(k), cast(v), g, beta, cu, state_pool=pool, state_indices=idx,
                           compute_dtype=cd)
    return torch.stack(outs), o


def test_f16_bf16_inputs_keep_the_fp32_pool_at_fp32_accuracy():
    torch.manual_seed(16)
    N, H, HV, K, V = 2, 1, 2, 16, 16
    A_log, dt_bias = torch.randn(HV) * 0.3 - 2.0, torch.randn(HV)
    bf = lambda *s: torch.randn(*s).to(torch.bfloat16)
    steps = {"decode": [(bf(N, 1, H, K), bf(N, 1, H, K), bf(N, 1, HV, V), torch.randn(N, 1, HV), torch.randn(N, 1, HV),
                         A_log, dt_bias) for _ in range(200)]}
    T = 48
    g, beta = gdn_gating_ref(A_log, torch.randn(T, HV), torch.randn(T, HV), dt_bias)
    steps["prefill"] = (bf(T, H, K), bf(T, H, K), bf(T, HV, V), g, beta, torch.tensor([0, 20, T]))

    pool0 = torch.randn(4, HV, V, K)
    pool_bf16_in, pool_fp32_in, pool_oracle = pool0.clone(), pool0.clone(), pool0.double()
    o_dec, o_pre = run(steps, pool_bf16_in, torch.float32)
    o_dec32, o_pre32 = run(steps, pool_fp32_in, torch.float32, inputs=torch.float32)
    o_dec64, o_pre64 = run(steps, pool_oracle, torch.float64, inputs=torch.float64)

    assert pool_bf16_in.dtype == torch.float32 and o_dec.dtype == torch.bfloat16
    assert torch.equal(pool_bf16_in, pool_fp32_in)  # 16-bit inputs change nothing but their own rounding
    assert torch.equal(o_dec, o_dec32.to(torch.bfloat16)) and torch.equal(o_pre, o_pre32.to(torch.bfloat16))
    assert rel(pool_bf16_in, pool_oracle) < 1e-5
    assert rel(o_dec32, o_dec64) < 1e-5 and rel(o_pre32, o_pre64) < 1e-5
    assert torch.equal(pool_bf16_in[[1, 2]], pool0[[1, 2]])  # rows no call owns
