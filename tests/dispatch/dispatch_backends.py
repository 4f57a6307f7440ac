"""Test backends shared by the dispatch tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from linattn.backends.base import Backend


class FastCpuDecode(Backend):
    """CPU, fp32 and K = V = 16 only, ranked before torch-ref: two of its predicates fail for a bf16
    K = 32 call."""

    name = "test-fast"
    ops = frozenset({"gdn_decode"})
    vendors = frozenset({"cpu"})
    dtypes = frozenset({"float32"})
    head_dims_k = frozenset({16})
    head_dims_v = frozenset({16})

    def rank(self, p, caps):
        return 1

    def gdn_decode(self, **kw):
        from linattn.backends.torch_ref import TorchRefBackend

        return TorchRefBackend().gdn_decode(**kw)
