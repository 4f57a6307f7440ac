"""F34: every empty-work path of every public entry point returns defined values.

The fault: ``compat.fla.fused_recurrent_*`` with ``T = 0``, no initial state and
``output_final_state=True`` returned ``torch.empty`` bytes as the final state (its pool was
allocated empty on the promise that decode writes every slot, but decode with ``T = 0`` stores
nothing). The rule (docs/ops-decisions.md, "F34"): a call with no token (``T = 0``), no sequence
(``N = 0``) or an empty sequence returns, for that sequence, the state it starts from: the caller's
initial state / pool slot when one is read, zeros for a fresh one; outputs are empty tensors of the
documented shape. An allocator cannot be poisoned reliably, so the tests fill freed memory with a
large value first and assert exact values (``== 0`` or equal to the initial state).
"""

from __future__ import annotations

import pytest
import torch

import linattn
import linattn.compat.fla as fla

from field_cases import DEVICE, H, HV, backends_for, assert_rows_unchanged


def _dirty_allocator() -> None:
    """Leave non-zero bytes in the allocator's free memory (the fault returned such bytes)."""
    junk = torch.full((1 << 16,), 3.0e29, device=DEVICE)
    del junk


def _gate_shape(family: str, *lead, K: int) -> tuple:
    return (*lead, HV, K) if family == "kda" else (*lead, HV)


def _prefill_args(family: str, lens: tuple, K: int) -> dict:
    T = sum(lens)
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()], dtype=torch.long)
    args = dict(q=torch.randn(T, H, K, generator=gen), k=torch.randn(T, H, K, generator=gen),
                v=torch.randn(T, HV, K, generator=gen), g=-torch.rand(_gate_shape(family, T, K=K), generator=gen),
                beta=torch.rand(T, HV, generator=gen), cu_seqlens=cu)
    return {n: x.to(DEVICE) for n, x in args.items()}


def _head(backend: str) -> int:
    return 64 if backend.startswith("triton") else 16  # the Triton prefill's smallest head dim


EMPTY_LENS = [(), (0, 0, 0)]  # N = 0; N = 3 with T = 0


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("lens", EMPTY_LENS, ids=["N0", "T0"])
def test_dense_prefill_without_tokens_returns_the_initial_state(family, lens):
    op = f"{family}_prefill"
    for backend in backends_for(op):
        K = _head(backend)
        a, N = _prefill_args(family, lens, K), len(lens)
        for h0 in (None, torch.randn(N, HV, K, K, device=DEVICE)):
            _dirty_allocator()
            o, final = getattr(linattn, op)(**a, initial_state=h0, backend=backend)
            want = torch.zeros(N, HV, K, K, device=DEVICE) if h0 is None else h0
            assert o.shape == (0, HV, K), backend
            assert final.shape == want.shape and torch.equal(final, want), (backend, h0 is None)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_pool_prefill_without_tokens_zeroes_fresh_slots_and_keeps_the_rest(family):
    op = f"{family}_prefill"
    for backend in backends_for(op):
        K = _head(backend)
        a = _prefill_args(family, (0, 0, 0), K)
        idx = torch.tensor([4, 1, -1], device=DEVICE)
        for fresh in (None, torch.tensor([False, True, True], device=DEVICE)):
            pool = torch.randn(6, HV, K, K, device=DEVICE)
            before = pool.clone()
            extra = {} if fresh is None else {"has_initial_state": fresh}
            try:
                o = getattr(linattn, op)(**a, state_pool=pool, state_indices=idx, backend=backend, **extra)
            except linattn.NoBackendError:
                assert fresh is not None, backend  # a backend without has_initial_state refuses it
                continue
            assert o.shape == (0, HV, K)
            if fresh is not None:
                assert torch.equal(pool[4], torch.zeros_like(pool[4])), backend  # fresh: zeros
            assert torch.equal(pool[1], before[1]), backend  # carried over: unchanged
            assert_rows_unchanged(pool, before, [4])


def test_an_empty_sequence_among_others_keeps_its_initial_state():
    for family in ("gdn", "kda"):
        a = _prefill_args(family, (0, 3, 0), 16)
        h0 = torch.randn(3, HV, 16, 16, device=DEVICE)
        for backend in [b for b in backends_for(f"{family}_prefill") if not b.startswith("triton")]:
            _dirty_allocator()
            _, final = getattr(linattn, f"{family}_prefill")(**a, backend=backend)
            assert torch.equal(final[[0, 2]], torch.zeros_like(final[[0, 2]])), backend
            _, final = getattr(linattn, f"{family}_prefill")(**a, initial_state=h0, backend=backend)
            assert torch.equal(final[[0, 2]], h0[[0, 2]]), backend


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("N,T", [(0, 1), (3, 0), (0, 0)])
def test_decode_without_work_returns_empty_output_and_leaves_the_pool(family, N, T):
    op, K = f"{family}_decode", 16
    q, v = torch.randn(N, T, H, K, device=DEVICE), torch.randn(N, T, HV, K, device=DEVICE)
    gate = dict(g=-torch.rand(_gate_shape(family, N, T, K=K), device=DEVICE),
                beta=torch.rand(N, T, HV, device=DEVICE))
    raw = (torch.randn(_gate_shape(family, N, T, K=K), device=DEVICE), torch.randn(N, T, HV, device=DEVICE),
           torch.randn(HV, device=DEVICE), torch.randn(_gate_shape(family, K=K), device=DEVICE))
    idx = torch.tensor([0, 2, 4][:N], dtype=torch.long, device=DEVICE)
    for backend in backends_for(op):
        pool = torch.randn(5, HV, K, K, device=DEVICE)
        before = pool.clone()
        o = getattr(linattn, op)(q, q, v, None, None, None, None, pool, idx, backend=backend, **gate)
        assert o.shape == (N, T, HV, K)
        o = getattr(linattn, op)(q, q, v, *raw, pool, idx, backend=backend,
                                 has_initial_state=torch.zeros(N, dtype=torch.bool, device=DEVICE))
        assert o.shape == (N, T, HV, K)
        assert torch.equal(pool, before), backend  # T = 0 stores nothing (docs/ops.md)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_gating_of_zero_tokens_gives_empty_gates(family):
    K = 16
    a = torch.randn(_gate_shape(family, 0, K=K), device=DEVICE)
    g, beta = getattr(linattn, f"{family}_gating")(torch.randn(HV, device=DEVICE), a,
                                                   torch.randn(0, HV, device=DEVICE),
                                                   torch.randn(_gate_shape(family, K=K), device=DEVICE))
    assert g.shape == a.shape and beta.shape == (0, HV) and g.dtype == beta.dtype == torch.float32


def test_silu_and_mul_clamp_of_zero_rows_is_empty():
    for backend in backends_for("silu_and_mul_clamp"):
        y = linattn.silu_and_mul_clamp(torch.randn(0, 8, device=DEVICE), limit=7.0, backend=backend)
        assert y.shape == (0, 4), backend


FLA_FUNCS = [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule, fla.chunk_kda,
             fla.fused_recurrent_kda]


@pytest.mark.parametrize("fn", FLA_FUNCS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("B,T", [(2, 0), (0, 3), (0, 0)])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_compat_fla_without_tokens_returns_a_defined_final_state(fn, B, T, state_v_first):
    K = 16
    kda = "kda" in fn.__name__
    q, v = torch.randn(B, T, H, K, device=DEVICE), torch.randn(B, T, HV, K, device=DEVICE)
    g = -torch.rand(_gate_shape("kda" if kda else "gdn", B, T, K=K), device=DEVICE)
    beta = torch.rand(B, T, HV, device=DEVICE)
    for h0 in (None, torch.randn(B, HV, K, K, device=DEVICE)):
        _dirty_allocator()
        o, ht = fn(q, q, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                   state_v_first=state_v_first)
        want = torch.zeros(B, HV, K, K, device=DEVICE) if h0 is None else h0
        assert o.shape == (B, T, HV, K)
        assert ht.shape == want.shape and torch.equal(ht, want), h0 is None


@pytest.mark.parametrize("fn", FLA_FUNCS, ids=lambda f: f.__name__)
def test_compat_fla_varlen_of_empty_sequences_returns_zero_states(fn):
    K = 16
    g = -torch.rand(_gate_shape("kda" if "kda" in fn.__name__ else "gdn", 1, 0, K=K), device=DEVICE)
    q, v = torch.randn(1, 0, H, K, device=DEVICE), torch.randn(1, 0, HV, K, device=DEVICE)
    _dirty_allocator()
    _, ht = fn(q, q, v, g=g, beta=torch.rand(1, 0, HV, device=DEVICE), output_final_state=True,
               cu_seqlens=torch.tensor([0, 0, 0], device=DEVICE))
    assert torch.equal(ht, torch.zeros(2, HV, K, K, device=DEVICE))


@pytest.mark.parametrize("mode", ["dense", "pool"])
def test_context_parallel_on_one_rank_without_tokens_is_defined(mode):
    dist = pytest.importorskip("torch.distributed")
    if DEVICE != "cpu" or dist.is_initialized():
        pytest.skip("one gloo rank on the CPU")
    a = _prefill_args("gdn", (0, 0), 16)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = [a[n] for n in ("q", "k", "v", "g", "beta")]
        if mode == "dense":
            _dirty_allocator()
            _, final = linattn.context_parallel_prefill("gdn", *x, cu_seqlens=a["cu_seqlens"], token_offset=0)
            assert torch.equal(final, torch.zeros(2, HV, 16, 16))
        else:
            pool = torch.randn(3, HV, 16, 16)
            before = pool.clone()
            linattn.context_parallel_prefill("gdn", *x, cu_seqlens=a["cu_seqlens"], token_offset=0, state_pool=pool,
                                             state_indices=torch.tensor([2, 0]),
                                             has_initial_state=torch.tensor([False, True]))
            assert torch.equal(pool[2], torch.zeros_like(pool[2])) and torch.equal(pool[0], before[0])
            assert_rows_unchanged(pool, before, [2])
    finally:
        dist.destroy_process_group()
