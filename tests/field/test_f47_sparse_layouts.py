"""Field case F47, the sparse part (issue 26): a tensor argument in a non-strided layout.

A sparse COO ``q`` or ``state_indices`` failed with torch's "Cannot access data pointer of Tensor
that doesn't have storage" (a ``RuntimeError`` from deep in the address checks) and a sparse pool
with a misleading "stride 0" message. The rule (``dispatch/rules/host_rules.py``, ``_dense_tensors``,
the first host rule): every tensor argument must be ``torch.strided``; anything else (sparse COO,
CSR, CSC, BSR, BSC, mkldnn) is a ``TypeError`` naming the argument and its layout and saying to
pass ``.to_dense()``, before anything runs and on a cached call key as well.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import linattn

N, H, HV, K, V, P = 3, 1, 2, 8, 8, 6

LAYOUTS = {
    "sparse_coo": lambda x: x.to_sparse(),
    "sparse_csr": lambda x: x.to_sparse_csr(),
    "mkldnn": lambda x: x.to_mkldnn(),
}


def _decode_args() -> dict:
    g = torch.Generator().manual_seed(47)
    return dict(q=torch.randn(N, 1, H, K, generator=g), k=torch.randn(N, 1, H, K, generator=g),
                v=torch.randn(N, 1, HV, V, generator=g), a=None, b=None, A_log=None, dt_bias=None,
                g=-torch.rand(N, 1, HV, generator=g), beta=torch.rand(N, 1, HV, generator=g),
                state_pool=torch.randn(P, HV, V, K, generator=g), state_indices=torch.tensor([0, 3, 5]))


def _prefill_args() -> dict:
    g = torch.Generator().manual_seed(48)
    T = 10
    return dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), g=-torch.rand(T, HV, generator=g),
                beta=torch.rand(T, HV, generator=g), cu_seqlens=torch.tensor([0, 4, T]),
                state_pool=torch.randn(P, HV, V, K, generator=g), state_indices=torch.tensor([1, 4]))


def _convert(layout: str, x: torch.Tensor):
    if layout == "mkldnn" and (not torch.backends.mkldnn.is_available() or not x.is_floating_point()):
        pytest.skip("mkldnn tensors need an mkldnn build and a float tensor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        return LAYOUTS[layout](x)


#: (op, argument, layouts): CSR needs a tensor of at least 2 dims, mkldnn a float one
CASES = [("gdn_decode", "q", ("sparse_coo", "sparse_csr", "mkldnn")),
         ("gdn_decode", "state_indices", ("sparse_coo",)),
         ("gdn_decode", "state_pool", ("sparse_coo", "sparse_csr", "mkldnn")),
         ("gdn_prefill", "g", ("sparse_coo", "sparse_csr", "mkldnn")),
         ("gdn_prefill", "cu_seqlens", ("sparse_coo",)),
         ("gdn_prefill", "state_indices", ("sparse_coo",))]


@pytest.mark.parametrize("op, name, layout", [(op, n, lay) for op, n, lays in CASES for lay in lays],
                         ids=[f"{op}-{n}-{lay}" for op, n, lays in CASES for lay in lays])
def test_f47_non_strided_argument_is_a_type_error_naming_it_and_its_layout(op, name, layout):
    args = _decode_args() if op == "gdn_decode" else _prefill_args()
    pool_before = args["state_pool"].clone()
    dense = args[name]
    args[name] = _convert(layout, dense)
    fn = getattr(linattn, op)
    for _ in range(2):  # the second call would hit a cached plan if the first had made one
        with pytest.raises(TypeError, match=rf"^{name} has layout torch\.(_)?{layout}; allowed: torch\.strided "
                                            rf"\(dense\) .* Pass {name}\.to_dense\(\)"):
            fn(**args)
    if name != "state_pool":
        assert torch.equal(args["state_pool"], pool_before)
    args[name] = dense
    fn(**args)  # the dense call runs


def test_f47_a_sparse_argument_on_a_cached_call_key_is_refused():
    """A plan made by a dense call must not take a sparse tensor of the same shape through."""
    args = _decode_args()
    linattn.gdn_decode(**args)
    linattn.gdn_decode(**args)
    before = args["state_pool"].clone()
    args["q"] = args["q"].to_sparse()
    with pytest.raises(TypeError, match="q has layout torch.sparse_coo"):
        linattn.gdn_decode(**args)
    assert torch.equal(args["state_pool"], before)
