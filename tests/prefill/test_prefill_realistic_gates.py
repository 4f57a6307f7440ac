"""The Triton chunked prefill under a real model's gates (linattn.testing.gates, issue 32 item 3), on
the CPU through the Triton interpreter (on the GPU when there is one): Kimi-Linear's KDA gates with a
strong-decay head, whose 32-channel blocks leave stage 1's fast path in its full chunk. fp32 inputs,
ops.md's 1e-5 against the float64 token-serial reference, rows not owned unchanged. One case, to keep
the interpreter's cost in ``make test`` to seconds; the other models run in the fuzz suite's kind
"model gates" and, at Qwen3-Next shapes, in tests/gpu/test_realistic_gates_gpu.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from linattn.testing.gates import kda_fast_path_misses, model_gates  # noqa: E402

from prefill_cases import cu_of, random_states, reference, rel, run  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def realistic_inputs(model: str, lens, *, H=1, HV=2, K=64, V=64, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    g, beta = model_gates(model, T, hv=HV, k=K, seed=seed, strong_every=2).log_decay()
    r = lambda *s: torch.randn(*s, generator=gen).to(DEV)  # noqa: E731
    return dict(q=r(T, H, K), k=r(T, H, K), v=r(T, HV, V), g=g.to(DEV), beta=beta.to(DEV),
                cu_seqlens=cu_of(lens, device=DEV))


def test_kimi_linear_gates_with_a_strong_head_match_the_reference():
    family = "kda"
    inp = realistic_inputs("kimi-linear", [70, 5], seed=1)
    miss = kda_fast_path_misses(inp["g"], inp["cu_seqlens"])
    assert bool(miss[0, 1].all()), "the strong head's first (full) chunk must leave the fast path"
    assert not bool(miss[:, 0].any()), "the ordinary head stays on it"
    P, slots = 5, torch.tensor([3, 0], dtype=torch.int32, device=DEV)
    pool = random_states(P, 2, 64, 64, seed=2, device=DEV)
    before = pool.clone()
    o, _ = run(family, inp, state_pool=pool, state_indices=slots)
    ht = pool[slots.long()]
    others = torch.ones(P, dtype=torch.bool, device=DEV)
    others[slots.long()] = False
    assert torch.equal(pool[others], before[others])
    ro, rht = reference(family, inp, initial_state=before[slots.long()].double())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel(o, ro) < 1e-5 and rel(ht, rht) < 1e-5, (rel(o, ro), rel(ht, rht))
