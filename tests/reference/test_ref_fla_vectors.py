"""The reference reproduces independent vectors from a peer: flash-linear-attention 0.6.0 on an H200.

The vectors (and their README) are committed in ``tests/data/fla-0.6.0/`` (the ``.pt`` files copied
unchanged from the team's ``shared/vectors/fla-0.6.0/``), so every clone runs these tests.
Tolerances from that README: FLA's recurrent kernel to 1e-5 relative, its chunked kernels
(tf32 products) to 5e-3.
"""

from pathlib import Path

import pytest
import torch

from linattn.backends.torch_ref import (gdn_decode_ref, gdn_gating_ref, gdn_prefill_ref,
                                        kda_gating_ref, kda_prefill_ref)
from linattn.testing.compare import rel_error_exact_zero as rel

VECTORS = Path(__file__).resolve().parents[1] / "data" / "fla-0.6.0"
FILES = {"gdn_recurrent_varlen_kneqv.pt": 1e-5, "gdn_chunk_varlen.pt": 5e-3, "kda_chunk_varlen.pt": 5e-3}


def load(name):
    """One vector file; a missing file fails the test (the data ship with the repository)."""
    return torch.load(VECTORS / name)


@pytest.mark.parametrize("name", list(FILES))
def test_gating_reproduces_the_gates_fla_consumed(name):
    d = load(name)
    gate = kda_gating_ref if d["op"] == "kda" else gdn_gating_ref
    g, beta = gate(d["A_log"], d["a"], d["b"], d["dt_bias"])
    assert g.shape == d["g"].shape and beta.shape == d["beta"].shape
    assert rel(g, d["g"]) < 1e-6 and rel(beta, d["beta"]) < 1e-6


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("cd", [torch.float32, torch.float64])
def test_prefill_pool_mode_reproduces_fla(name, cd):
    d = load(name)
    tol = FILES[name]
    fn = kda_prefill_ref if d["op"] == "kda" else gdn_prefill_ref
    pool = d["state_pool"].clone()
    o, final = fn(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], state_pool=pool,
                  state_indices=d["state_indices"], scale=d["scale"], use_qk_l2norm=d["use_qk_l2norm"],
                  compute_dtype=cd)
    assert final is None and pool.dtype == torch.float32
    idx = d["state_indices"].tolist()
    assert rel(o, d["expected_o"]) < tol
    assert rel(pool[idx], d["expected_pool"][idx]) < tol
    for p in range(pool.shape[0]):
        if p not in idx:
            assert torch.equal(pool[p], d["state_pool"][p]) and torch.equal(pool[p], d["expected_pool"][p])


def test_decode_token_by_token_reproduces_fla_recurrent():
    d = load("gdn_recurrent_varlen_kneqv.pt")
    pool = d["state_pool"].clone()
    cu = d["cu_seqlens"].tolist()
    o = torch.zeros_like(d["expected_o"])
    for n, slot in enumerate(d["state_indices"].tolist()):
        for t in range(cu[n], cu[n + 1]):
            tok = lambda x: x[t:t + 1].unsqueeze(0)
            o[t] = gdn_decode_ref(tok(d["q"]), tok(d["k"]), tok(d["v"]), tok(d["a"]), tok(d["b"]), d["A_log"],
                                  d["dt_bias"], pool, torch.tensor([slot]), scale=d["scale"],
                                  use_qk_l2norm=d["use_qk_l2norm"])[0, 0]
    assert rel(o, d["expected_o"]) < 1e-5
    assert rel(pool, d["expected_pool"]) < 1e-5
