"""Field case F37: dense context-parallel prefill with ``initial_state`` on one rank and None on another.

It was accepted, and the sequence starting on the rank without one started from zeros (error 0.38).
The agreement step now carries whether ``initial_state`` is given (and the state dtype) among the
agreed arguments, so every rank refuses the call before any write. These tests run the agreement of
two simulated ranks in one process (``_meta`` per rank, then ``_agree`` as each rank would); the
spawned two-rank version is ``tests/distributed/test_cp_agreement.py``.
"""

from __future__ import annotations

import pytest
import torch

from linattn.context_parallel import _agree, _meta

T0, T1, H, HV, K, V = 6, 5, 1, 2, 8, 8
CU = torch.tensor([0, 4, T0 + T1])


def rank_meta(offset: int, T: int, **state) -> dict:
    gen = torch.Generator().manual_seed(offset)
    x = (torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen), torch.randn(T, HV, V, generator=gen),
         -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen))
    args = dict(state_pool=None, state_indices=None, initial_state=None, has_initial_state=None, scale=None,
                use_qk_l2norm=True, state_layout="vk", backend="torch-ref") | state
    return _meta("gdn", x, CU, None, offset, args, True, False)[0]


def test_f37_initial_state_on_one_rank_only_is_refused_on_every_rank():
    init = torch.randn(2, HV, V, K)
    before = init.clone()
    metas = [rank_meta(0, T0, initial_state=init), rank_meta(T0, T1)]
    for rank in (0, 1):
        with pytest.raises(ValueError, match=r"disagree on initial_state given \(dense mode\) \(rank 0: True; rank 1: False\)"):
            _agree(metas, rank)
    assert torch.equal(init, before)


def test_f37_initial_state_dtype_must_agree_too():
    metas = [rank_meta(0, T0, initial_state=torch.randn(2, HV, V, K)),
             rank_meta(T0, T1, initial_state=torch.randn(2, HV, V, K).to(torch.bfloat16))]
    for rank in (0, 1):
        with pytest.raises(ValueError, match=r"state dtype .*rank 0: float32; rank 1: bfloat16"):
            _agree(metas, rank)


def test_f37_initial_state_on_every_rank_or_none_agrees():
    init = torch.randn(2, HV, V, K)
    _agree([rank_meta(0, T0, initial_state=init), rank_meta(T0, T1, initial_state=init)], 0)
    _agree([rank_meta(0, T0), rank_meta(T0, T1)], 1)
