"""F25: 1-D tensor arguments as strided views are read through their values on every backend.

The field input: ``state_indices = slot_table[:, 0]`` in a pool-mode prefill (the Triton prefill
wrote row 5 instead of row 2 on the H200), and ``A_log`` as a column of a ``[HV, 2]`` per-head
parameter pack in a decode (outputs 0.6 off, a corrupted state). Each backend's result must equal
its own result on contiguous copies bitwise, and pool rows the call does not own stay unchanged.
Every other argument as a strided view: ``tests/contract/test_strided_args.py``.
"""

from __future__ import annotations

import pytest
import torch

import linattn

from field_cases import DEVICE, backends_for, decode_inputs, prefill_inputs, assert_rows_unchanged


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_state_indices_column_of_a_slot_table(op):
    for backend in backends_for(op):
        args, pool0 = prefill_inputs(kda=op == "kda_prefill")
        table = torch.tensor([[1, 5], [2, 5], [-1, 5], [7, 5]], device=DEVICE)
        view = table[:, 0]
        assert view.stride() == (2,)
        results = []
        for idx in (view, view.contiguous()):
            pool = pool0.clone()
            o = getattr(linattn, op)(**args, state_pool=pool, state_indices=idx, backend=backend)
            assert_rows_unchanged(pool, pool0, [1, 2, 7])
            results.append((o, pool))
        assert torch.equal(results[0][0], results[1][0]), backend
        assert torch.equal(results[0][1], results[1][1]), backend
        # the rows named are the ones written: row 5 (the column's neighbour) keeps its bits
        assert torch.equal(results[0][1][5], pool0[5])
        assert not torch.equal(results[0][1][2], pool0[2])


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_A_log_column_of_a_parameter_pack(op):
    kda = op == "kda_decode"
    for backend in backends_for(op):
        args, pool0 = decode_inputs(kda=kda)
        pack = torch.stack([args["A_log"], torch.full_like(args["A_log"], 7.0)], dim=1)  # [HV, 2]
        idx = torch.tensor([3, -1, 0, 8], device=DEVICE)
        results = []
        for A_log in (pack[:, 0], pack[:, 0].contiguous()):
            assert torch.equal(A_log, args["A_log"])
            pool = pool0.clone()
            o = getattr(linattn, op)(**{**args, "A_log": A_log}, state_pool=pool, state_indices=idx,
                                     backend=backend)
            assert_rows_unchanged(pool, pool0, idx.tolist())
            results.append((o, pool))
        assert torch.equal(results[0][0], results[1][0]), backend
        assert torch.equal(results[0][1], results[1][1]), backend
        ref_pool = pool0.clone()
        with torch.no_grad():
            ref = getattr(linattn, op)(**args, state_pool=ref_pool, state_indices=idx, backend="torch-ref")
        torch.testing.assert_close(results[0][0], ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(results[0][1], ref_pool, atol=1e-4, rtol=1e-4)
