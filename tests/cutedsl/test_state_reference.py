"""The float64 state-stage reference (the oracle of the CuTe DSL state kernel's GPU checks) agrees
with the token-serial reference when fed the WY quantities of ops.md's chunked form."""

import pytest
import torch

from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref
from linattn.kernels.cutedsl.reference import state_stage_ref

C = 64


def _wy(kda, k, v, g, beta, cu, HV):
    """W, U and the inverse key norms of every chunk, in float64, from ops.md's formulas."""
    f = torch.float64
    T, H, K = k.shape
    kk = k.to(f).repeat_interleave(HV // H, 1)
    rk = 1.0 / torch.sqrt((kk * kk).sum(-1) + 1e-6)
    kn = kk * rk[..., None]
    w = torch.zeros(T, HV, K, dtype=f)
    u = torch.zeros(T, HV, v.shape[-1], dtype=f)
    cu = cu.tolist()
    for n in range(len(cu) - 1):
        for r0 in range(cu[n], cu[n + 1], C):
            r1 = min(r0 + C, cu[n + 1])
            for hv in range(HV):
                G = g[r0:r1, hv].to(f).cumsum(0)
                Kc, b = kn[r0:r1, hv], beta[r0:r1, hv].to(f)
                if kda:
                    lower = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool).tril(-1)
                    E = torch.exp((G[:, None, :] - G[None, :, :]).masked_fill(~lower[..., None], float("-inf")))
                    A = torch.einsum("rd,sd,rsd->rs", Kc, Kc, E)
                    Ke = Kc * torch.exp(G)
                else:
                    A = (Kc @ Kc.T) * torch.exp((G[:, None] - G[None, :]).tril(-1)).tril(-1)
                    Ke = Kc * torch.exp(G)[:, None]
                A = torch.tril(A * b[:, None], -1)
                Tm = torch.linalg.inv(torch.eye(r1 - r0, dtype=f) + A)
                w[r0:r1, hv] = Tm @ (b[:, None] * Ke)
                u[r0:r1, hv] = Tm @ (b[:, None] * v[r0:r1, hv].to(f))
    return w, u, rk


@pytest.mark.parametrize("kda", [False, True])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_state_stage_reference_final_states_match_token_serial_reference(kda, layout):
    torch.manual_seed(0)
    lens = [1, 70, 0, 130]
    T, H, HV, K, V = sum(lens), 1, 2, 16, 8
    cu = torch.tensor([0, 1, 71, 71, 201])
    q, k, v = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, HV, V)
    g = -torch.rand((T, HV, K) if kda else (T, HV)) * 0.2
    beta = torch.rand(T, HV)
    shape = (6, HV, V, K) if layout == "vk" else (6, HV, K, V)
    pool = torch.randn(shape, dtype=torch.float64)
    slots = torch.tensor([4, 0, 2, -1])
    w, u, rk = _wy(kda, k, v, g, beta, cu, HV)
    _, _, final = state_stage_ref(kda=kda, k=k.double(), g=g, w=w, u=u, rk=rk, cu_seqlens=cu, h0=pool,
                                  slots=slots, state_layout=layout)
    ref = gdn_prefill_ref if not kda else kda_prefill_ref
    rp = pool.clone()
    ref(q.double(), k.double(), v.double(), g, beta, cu, state_pool=rp, state_indices=slots,
        state_layout=layout, compute_dtype=torch.float64)
    for n in range(3):
        got = final[n] if layout == "kv" else final[n].transpose(-1, -2)
        assert torch.allclose(got, rp[int(slots[n])], atol=1e-10, rtol=1e-10), n
