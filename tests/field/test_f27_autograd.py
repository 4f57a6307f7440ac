"""F27: a module holding ``A_log`` and ``dt_bias`` as ``nn.Parameter`` calls decode and prefill with
grad mode on, twice with the same pool, then under ``torch.compile``.

The rule (docs/ops-decisions.md, "Autograd"): with grad mode on and any tensor argument requiring
grad, every op refuses before launch with :class:`linattn.GradModeError`, which says to call under
``torch.no_grad()`` / ``torch.inference_mode()``; identically on every backend and under
``torch.compile`` (the refusal is the dispatcher's: ``Problem.requires_grad`` rejects every
backend that does not declare autograd support). The pool never records autograd history, and the
same calls under ``torch.no_grad()`` run.
"""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.dispatch import Problem

from field_cases import DEVICE, HV, backends_for, decode_inputs

K = V = 16


class GatedDecode(torch.nn.Module):
    """What a Hugging Face GDN layer holds: per-head gate parameters."""

    def __init__(self):
        super().__init__()
        self.A_log = torch.nn.Parameter(torch.zeros(HV, device=DEVICE))
        self.dt_bias = torch.nn.Parameter(torch.ones(HV, device=DEVICE))

    def forward(self, q, k, v, a, b, pool, idx, backend=None):
        return linattn.gdn_decode(q, k, v, a, b, self.A_log, self.dt_bias, pool, idx, backend=backend)


def _inputs():
    args, pool = decode_inputs()
    return [args[n] for n in ("q", "k", "v", "a", "b")], pool, torch.tensor([3, -1, 0, 8], device=DEVICE)


@pytest.mark.parametrize("backend", [None, *backends_for("gdn_decode")])
def test_grad_mode_with_parameters_is_refused_twice_and_pool_untouched(backend):
    m = GatedDecode()
    xs, pool, idx = _inputs()
    before = pool.clone()
    for _ in range(2):  # the second call gets the same clear refusal, not a message blaming the pool
        with pytest.raises(linattn.GradModeError, match=r"A_log, dt_bias require grad.*torch\.no_grad\(\)"):
            m(*xs, pool, idx, backend=backend)
        assert torch.equal(pool, before) and pool.grad_fn is None and not pool.requires_grad
    with torch.no_grad():
        o = m(*xs, pool, idx, backend=backend)
    assert o.grad_fn is None and pool.grad_fn is None
    with torch.inference_mode():
        m(*xs, pool.clone(), idx, backend=backend)


def test_grad_mode_refuses_prefill_and_gating():
    m = GatedDecode()
    a = torch.randn(5, HV, device=DEVICE)
    with pytest.raises(linattn.GradModeError, match="gdn_gating"):
        linattn.gdn_gating(m.A_log, a, a, m.dt_bias)
    with torch.no_grad():
        g, beta = linattn.gdn_gating(m.A_log, a, a, m.dt_bias)
    q = torch.randn(5, 1, 64, device=DEVICE, requires_grad=True)
    v = torch.randn(5, HV, 64, device=DEVICE)
    pool = torch.zeros(3, HV, 64, 64, device=DEVICE)
    with pytest.raises(linattn.GradModeError, match="q requires grad"):
        linattn.gdn_prefill(q, q.detach(), v, g, beta, torch.tensor([0, 5], device=DEVICE), state_pool=pool,
                            state_indices=torch.tensor([1], device=DEVICE))
    assert torch.equal(pool, torch.zeros_like(pool))


def test_problem_records_grad_and_explain_shows_the_refusal():
    d = linattn.explain(Problem(op="gdn_decode", n=4, h=16, hv=32, k=128, v=128, requires_grad=True), "sm90")
    assert d.chosen is None
    assert all(v.reason.value == "feature" and "torch.no_grad()" in v.hint
               for v in d.verdicts if not v.ok and v.backend in ("torch-ref", "triton-split"))


def test_grad_mode_refused_under_torch_compile():
    m = GatedDecode()
    xs, pool, idx = _inputs()
    before = pool.clone()
    compiled = torch.compile(m.forward)
    with pytest.raises(linattn.GradModeError, match="A_log, dt_bias require grad"):
        compiled(*xs, pool, idx)
    assert torch.equal(pool, before) and pool.grad_fn is None
    full = torch.compile(m.forward, fullgraph=True)
    with pytest.raises(linattn.GradModeError, match="A_log, dt_bias require grad"):  # F40: as in eager
        full(*xs, pool, idx)
    assert torch.equal(pool, before)
    with torch.no_grad():
        o = torch.compile(m.forward, fullgraph=True)(*xs, pool, idx)
    assert torch.isfinite(o).all() and pool.grad_fn is None
