"""Field case F43 (issue 26): a plugin whose result shares memory with the call's arguments, or
that modifies a read-only argument, breaks the op contract.

docs/ops.md: inputs are never modified and every output is a new tensor. A plugin that wrote its
output into the caller's ``v`` and returned it was accepted. The rule (``dispatch/runtime/results.py``,
``check_untouched``): a returned tensor sharing storage with any argument (the pool included), or
a read-only argument whose version counter moved during the run, is a wrong result:
``BackendRunError``, the plugin is rejected with ``backend_error`` from then on and the next call
falls back. A plugin that computes into new tensors is accepted unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import linattn
from linattn.backends.torch_ref import gdn_decode_ref, gdn_prefill_ref
from linattn.dispatch import Reason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
from plugin_fakes import Mangles, Plugin, mangling  # noqa: E402

T, H, HV, K, V, P = 7, 1, 2, 8, 4, 5


def _prefill_args(pool: bool = False) -> dict:
    g = torch.Generator().manual_seed(43)
    args = dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), g=-torch.rand(T, HV, generator=g),
                beta=torch.rand(T, HV, generator=g), cu_seqlens=torch.tensor([0, 3, T]))
    if pool:
        args.update(state_pool=torch.randn(P, HV, V, K, generator=g), state_indices=torch.tensor([4, 1]))
    return args


def _decode_args() -> dict:
    g = torch.Generator().manual_seed(44)
    N = 3
    return dict(q=torch.randn(N, 1, H, K, generator=g), k=torch.randn(N, 1, H, K, generator=g),
                v=torch.randn(N, 1, HV, V, generator=g), a=torch.randn(N, 1, HV, generator=g),
                b=torch.randn(N, 1, HV, generator=g), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV),
                state_pool=torch.randn(P, HV, V, K, generator=g), state_indices=torch.tensor([0, 3, -1]))


class WritesIntoV(Mangles):
    """Computes the reference into the caller's ``v`` ("saves an allocation") and returns it."""

    name = "writes-into-v"
    ops = frozenset({"gdn_prefill"})

    def run(self, op: str, **kw):
        o, final = super().run(op, **kw)
        kw["v"].copy_(o)
        return kw["v"], final


class OutputInPool(Mangles):
    """Puts ``o`` into the pool's memory (past the rows the call owns) and returns that view."""

    name = "output-in-pool"
    ops = frozenset({"gdn_prefill"})

    def run(self, op: str, **kw):
        o, final = super().run(op, **kw)
        view = kw["state_pool"].view(-1)[:o.numel()].view(o.shape)
        view.copy_(o)
        return view, final


class ReturnsV(Mangles):
    """Decode ``o [N, T, HV, V]`` has ``v``'s shape: returns the caller's ``v`` itself, untouched."""

    name = "returns-v"
    ops = frozenset({"gdn_decode"})

    def run(self, op: str, **kw):
        super().run(op, **kw)
        return kw["v"]


def _refused_then_fallback(registry, backend: str, args: dict, says: str) -> None:
    with pytest.raises(linattn.BackendRunError, match=f"'{backend}' .*wrong result in gdn_prefill: gdn_prefill {says}"):
        linattn.gdn_prefill(**args)
    assert backend in registry.broken
    fresh = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in args.items()}
    linattn.gdn_prefill(**fresh)
    d = linattn.last_decision("gdn_prefill")
    assert d.chosen == "torch-ref" and d.verdict(backend).reason == Reason.BACKEND_ERROR


def test_f43_plugin_writing_its_output_into_v_is_a_contract_violation(registry):
    registry.add_plugin(Plugin(WritesIntoV), name="vendor-inplace")
    _refused_then_fallback(registry, "writes-into-v", _prefill_args(), "modified its read-only input v in place")


def test_f43_plugin_returning_the_callers_v_unmodified_is_refused_as_aliasing(registry):
    """The version counter has not moved, but o would be the caller's v: refused on storage."""
    registry.add_plugin(Plugin(ReturnsV), name="vendor-returns-v")
    args = _decode_args()
    v_before = args["v"].clone()
    with pytest.raises(linattn.BackendRunError, match="returned o sharing memory with its argument v"):
        linattn.gdn_decode(**args, backend="returns-v")
    assert torch.equal(args["v"], v_before) and "returns-v" in registry.broken


def test_f43_plugin_returning_a_view_of_the_pool_is_refused(registry):
    registry.add_plugin(Plugin(OutputInPool), name="vendor-pool-out")
    _refused_then_fallback(registry, "output-in-pool", _prefill_args(pool=True),
                           "returned o sharing memory with its argument state_pool")


@pytest.mark.parametrize("pool", (False, True), ids=("dense", "pool"))
def test_f43_a_plugin_computing_into_new_tensors_is_accepted_bitwise(registry, pool):
    registry.add_plugin(Plugin(mangling("correct", {"gdn_prefill", "gdn_decode"})), name="vendor-correct")
    args = _prefill_args(pool=pool)
    ref_args = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in args.items()}
    out = linattn.gdn_prefill(**args)
    assert linattn.last_decision("gdn_prefill").chosen == "correct" and not registry.broken
    ref = gdn_prefill_ref(**ref_args)
    if pool:  # pool mode returns o alone
        assert torch.equal(out, ref[0])
    else:
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    if pool:
        assert torch.equal(args["state_pool"], ref_args["state_pool"])  # owned rows updated, the rest kept
    dec = _decode_args()
    ref_dec = {n: x.clone() for n, x in dec.items()}
    assert torch.equal(linattn.gdn_decode(**dec), gdn_decode_ref(**ref_dec))
    assert linattn.last_decision("gdn_decode").chosen == "correct"
    assert torch.equal(dec["state_pool"], ref_dec["state_pool"])
