"""F41: 10,000 calls with distinct signatures keep every per-process structure of the call path
bounded: the call plans, the decisions, the first-choice log keys and the input-copy plans are
least-recently-used caches of documented sizes (``dispatch/lru.py``), and the first choice is
logged once per (device, op, backend, reason), not once per signature.
"""

from __future__ import annotations

import logging

import pytest
import torch

import linattn
from linattn.dispatch import Problem, dispatcher
from linattn.dispatch.runtime import fast_path
from linattn.dispatch.rules import layouts
from linattn.dispatch.lru import CALL_PLANS_MAX, DECISIONS_MAX, FIRST_CHOICE_LOG_MAX, LAYOUT_PLANS_MAX, LRUCache


def _empty_prefill(i: int):
    """Sequences that are all empty (T = 0; nothing to compute), a distinct call key per ``i``: N
    cycles through 1..20 and q's leading stride is ``i`` (a torch-ref call costs O(N), so N itself
    stays small)."""
    e = torch.empty(0, 1, 2).as_strided((0, 1, 2), (2 + i, 2, 1))
    return linattn.gdn_prefill(e, e, torch.empty(0, 1, 2), torch.empty(0, 1), torch.empty(0, 1),
                               torch.zeros(2 + i % 20, dtype=torch.int64), validate=False)


def _sizes() -> dict:
    d = dispatcher()
    return dict(plans=len(fast_path._plans), decisions=len(d._cache), logged=len(d._logged),
                layouts=len(layouts._PLANS))


def test_ten_thousand_signatures_keep_every_structure_bounded(caplog):
    """3,000 public calls with distinct call keys (three times the plan cache), then 10,000
    decisions for distinct signatures of one shape class (every size new)."""
    linattn.dispatch.clear_cache()
    hot = dict(x=torch.randn(2, 8))
    with caplog.at_level(logging.INFO, logger="linattn"):
        for i in range(1, 3_001):
            _empty_prefill(i)
            if i % 100 == 0:  # a hot call between the cold ones stays cached (LRU, not cleared at a cap)
                linattn.silu_and_mul_clamp(**hot)
        d = dispatcher()
        for n in range(1, 10_001):
            p = Problem(op="gdn_prefill", n=n, t=3 * n, h=1, hv=1, k=2, v=2, max_seqlen=3)
            d.select("gdn_prefill", tuple(p.model_dump().items()), torch.device("cpu"))
    sizes = _sizes()
    assert sizes["plans"] == CALL_PLANS_MAX and sizes["decisions"] <= DECISIONS_MAX
    assert sizes["logged"] <= FIRST_CHOICE_LOG_MAX and sizes["layouts"] <= LAYOUT_PLANS_MAX
    # a new size every call is one shape class: one decision per signature form (the public calls',
    # the Problem's fields) and op, one first-choice line per op
    assert sizes["decisions"] == 3 and sizes["logged"] == 2, sizes
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("linattn: gdn_prefill")]
    assert len(lines) == 1, lines[:3]
    assert any(k[0] == "silu_and_mul_clamp" for k in fast_path._plans), "the hot plan was dropped"


def test_distinct_shape_classes_evict_the_least_recently_used_entry(monkeypatch):
    linattn.dispatch.clear_cache()
    d = dispatcher()
    monkeypatch.setattr(d, "_cache", LRUCache(16))
    monkeypatch.setattr(fast_path, "_plans", LRUCache(16))
    hot = torch.randn(1, 6)
    for width in range(1, 200):  # the clamp's D is part of the class: a decision each
        linattn.silu_and_mul_clamp(torch.randn(1, 2 * width + 8), validate=False)
        linattn.silu_and_mul_clamp(hot, validate=False)
    assert len(d._cache) == 16 and len(fast_path._plans) == 16
    # a hit of the hot plan never reaches the decision cache; the plan itself is kept
    assert any(k[0] == "silu_and_mul_clamp" and (torch.Size([1, 6]) in k) for k in fast_path._plans)
    assert d.cached_decisions()[-1].decision.problem.d == 2 * 199 // 2 + 4  # the newest class kept


def test_lru_cache_refuses_a_size_below_one():
    with pytest.raises(ValueError, match="maxsize >= 1"):
        LRUCache(0)


def test_the_policy_caches_are_bounded_and_keep_the_hot_entry(monkeypatch):
    """dispatch/runtime/policy.py's parsed environment policies and merged scoped policies are LRU caches
    too: ever new LINATTN_BACKEND values keep the environment cache at its size, and ever new
    ``policy()`` scopes drop the least recently used merge, not the hot one with the rest."""
    import importlib

    from linattn.dispatch.lru import ENV_POLICIES_MAX, MERGED_POLICIES_MAX

    pol = importlib.import_module("linattn.dispatch.runtime.policy")  # the module (the package exports a function of its name)

    monkeypatch.setattr(pol, "_env_cache", LRUCache(ENV_POLICIES_MAX))
    monkeypatch.setattr(pol, "_merged", LRUCache(MERGED_POLICIES_MAX))
    for i in range(ENV_POLICIES_MAX + 40):
        monkeypatch.setenv("LINATTN_BACKEND", f"decode=backend-{i}")
        assert pol.current_policy().forced_for("gdn_decode") == f"backend-{i}"
    assert len(pol._env_cache) == ENV_POLICIES_MAX
    monkeypatch.delenv("LINATTN_BACKEND")
    with linattn.policy(decode="hot"):
        hot = pol.current_policy()
    for i in range(MERGED_POLICIES_MAX + 40):
        with linattn.policy(decode=f"cold-{i}"):
            pol.current_policy()
        with linattn.policy(decode="hot"):
            assert pol.current_policy() is hot  # kept: never re-merged
    assert len(pol._merged) == MERGED_POLICIES_MAX
