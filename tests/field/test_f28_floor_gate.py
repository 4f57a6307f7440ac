"""Field case F28: fp32 chunked prefill with mild gates (-0.05 per token) and one token in 50 at
the gating floor (-1000), 300 tokens, against the float64 token-serial oracle at ops.md's fp32
tolerance (1e-5 on outputs and final states), in pool and dense mode.

After a floor gate the chunk-local cumulative gate sits near -1000, where fp32's spacing is 6e-5;
a plain fp32 prefix sum puts that rounding into every later decay ``exp(G_r - G_s)`` of the mild
gates. The example plugin ``cpu-chunked`` had it (outputs 2.2e-5, states 3.3e-5 off); the Triton
fp32 path and now the plugin carry the sum as two floats (``kernels/triton/_gates.py``,
``linattn_cpu_chunked.chunked.cumsum2``). The conformance suite has the same input as its
``gates-floor`` cases (``linattn.testing.cases.FLOOR_GATES``).
"""

from __future__ import annotations


import pytest
import torch

import linattn
from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref
from linattn.capabilities import interpreter_enabled
from linattn.dispatch import get_registry
from linattn.testing.compare import rel_error_exact_zero as _rel

from field_cases import assert_rows_unchanged

T, EVERY, MILD, FLOOR = 300, 50, -0.05, -1000.0
#: Head size K = V per backend: small, but one the backend takes (the Triton prefill: 64, 128, 256).
HEAD = {"torch-ref": 16, "torch-chunked": 16, "cpu-chunked": 16, "triton-split": 64}
P, SLOT = 4, 2  # pool rows; the one the call owns


def f28_inputs(family: str, first: int, K: int, seed: int = 0) -> dict:
    """F28's inputs, one sequence, one head: q, k ``[T, 1, K]``, v ``[T, 1, K]`` fp32, ``g``
    ``[T, 1]`` (GDN) or ``[T, 1, K]`` (KDA) fp32 at -0.05 with -1000 at tokens ``first``,
    ``first + 50``, ..., ``beta [T, 1]`` in [0.05, 0.95], ``cu_seqlens = [0, T]`` int32."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, 1, K, generator=gen) for _ in range(3))
    g = torch.full((T, 1, K) if family == "kda" else (T, 1), MILD)
    g[first::EVERY] = FLOOR
    beta = torch.rand(T, 1, generator=gen) * 0.9 + 0.05
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=torch.tensor([0, T], dtype=torch.int32))


def _device(backend: str) -> str:
    """Where the backend runs here; skips when it cannot (a plugin not installed, Triton absent)."""
    if backend not in get_registry().backends:
        pytest.skip(f"{backend} is not registered here (the example plugin: pip install -e "
                    "examples/linattn-cpu-chunked)")
    if backend.startswith("triton"):
        pytest.importorskip("triton")
        if torch.cuda.is_available() and not interpreter_enabled():
            return "cuda"
        if not interpreter_enabled():
            pytest.skip("needs a GPU or TRITON_INTERPRET=1 (tests/conftest.py sets it on a CPU)")
    return "cpu"


@pytest.mark.parametrize("mode", ["pool", "dense"])
@pytest.mark.parametrize("first", [0, 10], ids=["floor@0", "floor@10"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("backend", list(HEAD))
def test_f28_mild_gates_after_floor_gates_meet_the_fp32_tolerance(backend, family, first, mode):
    """``floor@0``: the floor in the first row, so every later cumulative gate of chunk 0 is near
    -1000 (the outputs' case); ``floor@10``: one in every chunk, the tail chunk (256..299) too, so
    the final state's update weights ``exp(G_C - G_r)`` see it (the states' case)."""
    dev = _device(backend)
    K = HEAD[backend]
    inp = f28_inputs(family, first, K)
    gen = torch.Generator().manual_seed(1)
    h0 = torch.randn(1, 1, K, K, generator=gen) * 0.5  # "vk": [N, HV, V, K]
    ref = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    ro, rht = ref(**inp, initial_state=h0.double(), compute_dtype=torch.float64)
    op = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    args = {n: x.to(dev) for n, x in inp.items()}
    if mode == "pool":
        pool = torch.randn(P, 1, K, K, generator=gen).to(dev)
        pool[SLOT] = h0[0].to(dev)
        before = pool.clone()
        o = op(**args, state_pool=pool, state_indices=torch.tensor([SLOT], dtype=torch.int32, device=dev),
               backend=backend)
        assert_rows_unchanged(pool, before, [SLOT])
        ht = pool[SLOT:SLOT + 1]
    else:
        o, ht = op(**args, initial_state=h0.to(dev), backend=backend)
    assert o.dtype == torch.float32 and ht.dtype == torch.float32
    err_o, err_s = _rel(o, ro), _rel(ht, rht)
    assert err_o < 1e-5 and err_s < 1e-5, f"{backend} {family} {mode}: output {err_o:.2e}, state {err_s:.2e}"


@pytest.mark.parametrize("first", [0, 10], ids=["floor@0", "floor@10"])
def test_f28_gates_defeat_a_plain_fp32_prefix_sum(first):
    """The input is the hard one: within a chunk of 64, the plain fp32 prefix sum of F28's gates
    gets the later differences ``G_r - G_s`` (r >= s) wrong by more than 1e-5 nats, i.e. more than
    the fp32 tolerance as a relative error of ``exp(G_r - G_s)``, where they matter (``exp`` not
    yet 0: ``G_r - G_s > -80``)."""
    g = f28_inputs("gdn", first, 16)["g"][:, 0]
    worst = 0.0
    for c0 in range(0, T, 64):
        chunk = g[c0:c0 + 64]
        G32, G64 = chunk.cumsum(0).double(), chunk.double().cumsum(0)
        d32, d64 = G32[:, None] - G32[None, :], G64[:, None] - G64[None, :]
        live = torch.ones_like(d64, dtype=torch.bool).tril() & (d64 > -80)
        worst = max(worst, float((d32 - d64)[live].abs().max()))
    assert worst > 1e-5, worst


def test_f28_conformance_cases_exist_for_every_fp32_prefill_backend():
    """``linattn check`` runs F28 (``gates-floor``, pool and dense) for each registered backend
    that declares a prefill op with fp32 inputs and fp32 state, the same gates as here."""
    from linattn.testing import generate_cases
    from linattn.testing.cases import FLOOR_EVERY, FLOOR_GATES, FLOOR_MILD

    assert (FLOOR_EVERY, FLOOR_MILD, FLOOR_GATES["lens"]) == (EVERY, MILD, (T,))
    checked = 0
    for name, b in get_registry().backends.items():
        for op in sorted(b.ops & {"gdn_prefill", "kda_prefill"}):
            floor = [c for c in generate_cases(b, ops=[op], kinds=["accuracy"]) if "/gates-floor[" in c.id]
            fp32 = "float32" in (b.dtypes or ()) and "float32" in (b.state_dtypes or ()) and bool(b.state_layouts)
            assert len(floor) == (2 if fp32 else 0), (name, op, [c.id for c in floor])
            assert {c.spec["mode"] for c in floor} == ({"pool", "dense"} if fp32 else set())
            checked += fp32
    assert checked >= 2  # torch-ref's two prefill ops at least
