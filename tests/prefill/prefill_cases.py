"""Input builders shared by the CPU (interpreter) and GPU prefill tests."""

from __future__ import annotations

import torch

from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref
from linattn.testing.compare import rel_error_exact_zero as rel


def cu_of(lens, device="cpu", dtype=torch.int32) -> torch.Tensor:
    c = [0]
    for n in lens:
        c.append(c[-1] + int(n))
    return torch.tensor(c, dtype=dtype, device=device)


def make_inputs(family: str, lens, *, H=1, HV=2, K=64, V=64, dtype=torch.float32, seed=0,
                device="cpu", gate: float | None = None) -> dict:
    """Random prefill inputs (no zeros): q, k, v in ``dtype``, fp32 gates in the range a gating op
    produces (or the constant log decay ``gate`` per token and channel)."""
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where they are used
    cu = cu_of(lens, device=device)
    T = sum(int(n) for n in lens)

    def r(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    gshape = (T, HV, K) if family == "kda" else (T, HV)
    if gate is None:
        g = -torch.nn.functional.softplus(r(*gshape) - 1.0)  # in (-inf, 0), mostly -0.3
    else:
        g = torch.full(gshape, float(gate), device=device)
    return dict(q=r(T, H, K).to(dtype), k=r(T, H, K).to(dtype), v=r(T, HV, V).to(dtype), g=g,
                beta=torch.rand(T, HV, generator=gen, device=device), cu_seqlens=cu)


def worst_conditioned(inp: dict) -> dict:
    """The same inputs with every key equal to the first one, ``beta = 1`` and no decay, so that
    each chunk's ``A`` is the strictly lower matrix of ones: the terms ``N^k`` of the Neumann
    product that inverts its diagonal blocks reach C(15, 7) = 6435 and cancel to entries of 0 and
    +-1, the hardest case for the solve's precision."""
    out = dict(inp)
    out["k"] = inp["k"][:1].expand_as(inp["k"]).contiguous()
    out["beta"] = torch.ones_like(inp["beta"])
    out["g"] = torch.zeros_like(inp["g"])
    return out


def run(family: str, inp: dict, **kw):
    """``chunk_prefill`` on ``make_inputs``' dict, with the op's defaults (dense mode, l2norm, "vk")."""
    from linattn.kernels.triton.prefill import chunk_prefill

    kw.setdefault("state_pool", None)
    kw.setdefault("state_indices", None)
    kw.setdefault("initial_state", None)
    kw.setdefault("use_qk_l2norm", True)
    kw.setdefault("state_layout", "vk")
    kw.setdefault("scale", inp["q"].shape[-1] ** -0.5)
    return chunk_prefill(family, **inp, **kw)


def random_states(n, HV, K, V, layout="vk", dtype=torch.float32, seed=1, device="cpu") -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (n, HV, V, K) if layout == "vk" else (n, HV, K, V)
    return torch.randn(*shape, generator=gen, device=device).to(dtype)


def reference(family: str, inp: dict, *, state_pool=None, state_indices=None, initial_state=None,
              scale=None, use_qk_l2norm=True, state_layout="vk"):
    """The float64 token-serial oracle (backends/torch_ref.py), on the inputs' device."""
    fn = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    return fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["cu_seqlens"],
              state_pool, state_indices, initial_state, scale, use_qk_l2norm, state_layout,
              compute_dtype=torch.float64)


def nan_run(monkeypatch, family: str, inp: dict, **kw):
    """:func:`run` with every floating-point buffer the call allocates starting as NaN, so that an
    entry read before it is written shows in the results."""
    empty = torch.empty

    def nan_empty(*a, **k):
        x = empty(*a, **k)
        return x.fill_(float("nan")) if x.is_floating_point() else x
    monkeypatch.setattr(torch, "empty", nan_empty)
    try:
        return run(family, inp, **kw)
    finally:
        monkeypatch.setattr(torch, "empty", empty)


def check_two_bf16_pool_runs(family: str, inp: dict, idx: torch.Tensor, before: torch.Tensor,
                             outs: list, pools: list, pool_close: float | None = None) -> list:
    """Two pool-mode runs of the same call under two launch configurations (``outs``, ``pools``,
    each pool cloned from ``before``): outputs finite, padding sequences' output rows zeros, pool
    rows no live sequence owns (padding, empty sequences, foreign rows) bitwise unchanged, the
    final pools the same bits (``pool_close`` None) or their live rows within ``pool_close``
    relative, and both runs match the float64 reference within bf16's 2e-2 / 1e-2. How close the
    two outputs must be is the caller's to assert. Returns the live slots."""
    cu = inp["cu_seqlens"].tolist()
    slots = idx.tolist()
    lens = [b - a for a, b in zip(cu, cu[1:])]
    live = [s for s, n in zip(slots, lens) if s >= 0 and n > 0]
    untouched = [p for p in range(before.shape[0]) if p not in live]
    for o, pool in zip(outs, pools):
        assert torch.isfinite(o).all()
        for i, s in enumerate(slots):
            if s < 0:
                assert torch.equal(o[cu[i]:cu[i + 1]], torch.zeros_like(o[cu[i]:cu[i + 1]]))
        assert torch.equal(pool[untouched], before[untouched])
    if pool_close is None:
        assert torch.equal(pools[0], pools[1])
    else:
        assert rel(pools[0][live], pools[1][live]) < pool_close
    rp = before.clone()
    ro, _ = reference(family, inp, state_pool=rp, state_indices=idx)
    for o, pool in zip(outs, pools):
        assert rel(o, ro) < 2e-2 and rel(pool[live], rp[live]) < 1e-2
    return live


def warm_one(cfg: tuple) -> str:
    """Compile one kernel variant by running a tiny call on the GPU (a process-pool worker: the
    GPU tests build their variants in parallel, then hit Triton's on-disk cache)."""
    from linattn.kernels.triton.prefill import chunk_prefill

    family, dtype_name, H, HV, K, V, mode, pool_dtype_name, layout = cfg
    dtype = getattr(torch, dtype_name)
    inp = make_inputs(family, [70, 5, 3], H=H, HV=HV, K=K, V=V, dtype=dtype, device="cuda")
    kw = dict(state_pool=None, state_indices=None, initial_state=None)
    if mode == "pool":
        kw["state_pool"] = random_states(4, HV, K, V, dtype=getattr(torch, pool_dtype_name), device="cuda")
        kw["state_indices"] = torch.tensor([3, 0, 1], dtype=torch.int32, device="cuda")
    elif mode == "h0":
        kw["initial_state"] = random_states(3, HV, K, V, dtype=getattr(torch, pool_dtype_name), device="cuda")
    chunk_prefill(family, **inp, **kw, scale=K ** -0.5, use_qk_l2norm=True, state_layout=layout)
    torch.cuda.synchronize()
    return str(cfg)
