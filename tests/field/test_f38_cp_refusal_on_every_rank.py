"""Field case F38: a rank-local refusal in context-parallel prefill (a bad ``family`` on one rank).

The family was resolved before the agreement all_gather, so the rank with the typo raised alone and
the others waited in the collective until the process group's timeout (30 minutes by default).
Every rank-local check now runs inside ``_meta``, which never raises: the refusal travels in the
agreement and ``_agree`` raises it on every rank, naming the failing rank and quoting its message.
The spawned two-rank version (with a short process-group timeout) is
``tests/distributed/test_cp_agreement.py``.
"""

from __future__ import annotations

import pytest
import torch

import linattn.context_parallel as cp
from linattn.context_parallel import _agree, _meta

T0, T1, H, HV, K, V = 6, 5, 1, 2, 8, 8
CU = torch.tensor([0, 4, T0 + T1])


def rank_meta(family: str, offset: int, T: int, g_sign: float = -1.0) -> dict:
    gen = torch.Generator().manual_seed(offset)
    x = (torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen), torch.randn(T, HV, V, generator=gen),
         g_sign * torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen))
    args = dict(state_pool=None, state_indices=None, initial_state=None, has_initial_state=None, scale=None,
                use_qk_l2norm=True, state_layout="vk", backend="torch-ref")
    return _meta(family, x, CU, None, offset, args, True, False)[0]


@pytest.mark.parametrize("family", ["GDN", "mamba", ""])
def test_f38_a_bad_family_is_an_entry_of_the_agreement_not_a_local_raise(family):
    meta = rank_meta(family, T0, T1)  # must not raise
    assert meta["error"][0] == "ValueError" and "family" in meta["error"][1]
    metas = [rank_meta("gdn", 0, T0), meta]
    with pytest.raises(ValueError, match=r"refused on rank 1: family must be one of gdn, kda"):
        _agree(metas, 0)
    with pytest.raises(ValueError, match=r"refused on rank 1 \(this rank\): family"):
        _agree(metas, 1)


def test_f38_every_rank_names_the_failing_ranks_and_quotes_the_first():
    metas = [rank_meta("gdn", 0, T0, g_sign=1.0), rank_meta("gdn", T0, T1, g_sign=1.0)]
    with pytest.raises(ValueError, match=r"refused on rank 0 \(this rank\) \(also refused on ranks \[1\]\): g\["):
        _agree(metas, 0)
    with pytest.raises(ValueError, match=r"refused on rank 1 \(this rank\) \(also refused on ranks \[0\]\): g\["):
        _agree(metas, 1)


def test_f38_nothing_before_the_agreement_raises_for_a_bad_family(monkeypatch):
    """context_parallel_prefill reaches the all_gather with a bad family (here: a group of two faked)."""
    reached = []
    monkeypatch.setattr(cp, "_world", lambda group: (2, 1))
    monkeypatch.setattr(cp.dist, "all_gather_object", lambda metas, meta, group=None: reached.append(meta)
                        or metas.__setitem__(slice(None), [rank_meta("gdn", 0, T0), meta]))
    x = (torch.randn(T1, H, K), torch.randn(T1, H, K), torch.randn(T1, HV, V), -torch.rand(T1, HV), torch.rand(T1, HV))
    with pytest.raises(ValueError, match="refused on rank 1 \\(this rank\\): family"):
        cp.context_parallel_prefill("GDN", *x, cu_seqlens=CU, token_offset=T0)
    assert reached and reached[0]["error"] is not None
