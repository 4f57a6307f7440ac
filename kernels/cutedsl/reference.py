"""Float64 reference of the chunked-prefill state stage alone (the contract of the state kernels).

Given the intra stage's outputs (``w``, ``u``, key norms ``rk``) and the raw keys and gates, it
walks every sequence's chunks exactly as docs/ops.md "Chunked form" says (maths layout ``S [K, V]``)::

    hbuf[c] = S;  Vn = U - W S;  S = exp(G_C) S + (K * rk * exp(G_C - G))^T Vn   (KDA: per channel)

Used by the GPU tests to check the CuTe DSL state kernel (and the Triton one) stage by stage,
independently of the intra and output stages. Pure torch, any device.
"""

from __future__ import annotations

from typing import Optional

import torch

C = 64


def state_stage_ref(*, kda: bool, k: torch.Tensor, g: torch.Tensor, w: torch.Tensor, u: torch.Tensor,
                    rk: torch.Tensor, cu_seqlens: torch.Tensor, h0: Optional[torch.Tensor],
                    slots: Optional[torch.Tensor], state_layout: str = "vk"):
    """The state stage in float64.

    Args:
        kda: per-channel gates.
        k: ``[T, H, K]``; g: ``[T, HV]`` or ``[T, HV, K]``; w: ``[T, HV, K]``; u: ``[T, HV, V]``;
        rk: ``[T, HV]``.
        cu_seqlens: ``[N+1]``.
        h0: initial states: a pool (with ``slots``) or ``[N, HV, ., .]`` (``slots`` None), or None.
        slots: ``[N]`` pool rows (negative: zero initial state) or None.
        state_layout: ``"vk"`` or ``"kv"`` (layout of ``h0``).
    Returns:
        ``(hbuf [NT, HV, K, V], vn [T, HV, V], final [N, HV, K, V])`` float64, maths layout
        ``[K, V]`` for the states; ``NT`` counts the real chunks (sequence order). Rows of
        ``final`` for negative slots are the zero initial state advanced (the kernels store
        nothing for them).
    Source: docs/ops.md "Chunked form" (Yang et al. 2024; Yang, Kautz, Hatamizadeh 2025; Kimi Linear 2025).
    """
    f = torch.float64
    T, H, K = k.shape
    HV, V = u.shape[1], u.shape[2]
    grp = HV // H
    kk = k.to(f).repeat_interleave(grp, dim=1) * rk.to(f)[..., None]  # normalised keys per value head
    wf, uf, gf = w.to(f), u.to(f), g.to(f)
    cu = [int(x) for x in cu_seqlens.tolist()]
    N = len(cu) - 1
    hb, finals = [], []
    vn = torch.zeros(T, HV, V, dtype=f, device=k.device)
    for n in range(N):
        S = torch.zeros(HV, K, V, dtype=f, device=k.device)
        if h0 is not None:
            row = None
            if slots is None:
                row = h0[n]
            elif int(slots[n]) >= 0:
                row = h0[int(slots[n])]
            if row is not None:
                row = row.to(f)
                S = row.transpose(-1, -2).clone() if state_layout == "vk" else row.clone()
        for r0 in range(cu[n], cu[n + 1], C):
            r1 = min(r0 + C, cu[n + 1])
            hb.append(S.clone())
            Wc, Uc, Kc = wf[r0:r1].transpose(0, 1), uf[r0:r1].transpose(0, 1), kk[r0:r1].transpose(0, 1)
            Vc = Uc - Wc @ S  # [HV, L, V]
            vn[r0:r1] = Vc.transpose(0, 1)
            if kda:
                G = gf[r0:r1].transpose(0, 1).cumsum(1)  # [HV, L, K]
                gl = G[:, -1:, :]
                S = torch.exp(gl).transpose(1, 2) * S + (Kc * torch.exp(gl - G)).transpose(1, 2) @ Vc
            else:
                G = gf[r0:r1].transpose(0, 1).cumsum(1)  # [HV, L]
                gl = G[:, -1:]
                S = torch.exp(gl)[..., None] * S + Kc.transpose(1, 2) @ (Vc * torch.exp(gl - G)[..., None])
        finals.append(S)
    hbuf = torch.stack(hb) if hb else torch.zeros(0, HV, K, V, dtype=f, device=k.device)
    return hbuf, vn, torch.stack(finals) if finals else torch.zeros(0, HV, K, V, dtype=f, device=k.device)
