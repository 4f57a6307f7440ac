"""The host path's shortcuts (issue 28): each gives what the longer way gives.

- ``LRUCache(distinct_values=True)`` (the call-plan and class-plan caches) skips the reordering when
  the entry read is the one used last: the same contents, order and evictions as the plain LRU;
- ``launch._same_specialization`` (a new length's value check sharing its class's compiled kernel)
  answers as comparing the two scalar tuples' launch keys does;
- a plan derived for a new length keeps its class's decision and its own problem, and the decision
  read back (``linattn.last_decision``) is the class's with that problem.
"""

from __future__ import annotations

import random

import pytest
import torch

import linattn
from linattn.dispatch.runtime import fast_path
from linattn.dispatch.lru import LRUCache
from linattn.kernels.triton import launch


@pytest.mark.parametrize("seed", range(5))
def test_distinct_values_lru_matches_the_plain_lru(seed):
    rng = random.Random(seed)
    plain, fast = LRUCache(5), LRUCache(5, distinct_values=True)
    values = {}
    for step in range(400):
        key = rng.randrange(9)
        if rng.random() < 0.4:
            value = values[key] = object()  # a value of its own (a new plan for the key)
            plain.put(key, value)
            fast.put(key, value)
        else:
            assert fast.get(key, "miss") is plain.get(key, "miss"), step
        assert list(fast.items()) == list(plain.items()), step  # same order: same evictions later
        if rng.random() < 0.02:
            plain.clear()
            fast.clear()


def test_distinct_values_lru_keeps_the_hot_entry():
    c = LRUCache(3, distinct_values=True)
    hot = object()
    c.put("hot", hot)
    for i in range(50):
        c.put(i, object())
        assert c.get("hot") is hot  # read after every insert: never the least recently used
    assert len(c) == 3 and list(c)[-1] == "hot"


_SCALARS = (0, 1, 2, 15, 16, 17, 32, 48, 2**31 - 1, 2**31, 2**31 + 16, 2**63 - 16, 2**63, -1, -16, True, False, None,
            0.5, 1.0, "x")


@pytest.mark.parametrize("seed", range(10))
def test_same_specialization_is_the_launch_key_comparison(seed):
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randrange(1, 6)
        old = tuple(rng.choice(_SCALARS) for _ in range(n))
        new = tuple(x if rng.random() < 0.6 else rng.choice(_SCALARS) for x in old)
        want = launch._launch_key(None, new, {}, (), 0) == launch._launch_key(None, old, {}, (), 0)
        assert launch._same_specialization(new, old) == want, (new, old)


def _decode(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(n, 1, 1, 8), k=r(n, 1, 1, 8), v=r(n, 1, 2, 8), a=r(n, 1, 2), b=r(n, 1, 2), A_log=r(2),
                dt_bias=r(2), state_pool=r(8, 2, 8, 8), state_indices=torch.arange(n, dtype=torch.int32))


def test_a_derived_plan_makes_its_decision_when_read():
    fast_path.clear()
    linattn.gdn_decode(**_decode(3))
    first = linattn.last_decision("gdn_decode")
    linattn.gdn_decode(**_decode(6, seed=1))  # a new N of the class: a derived plan
    (plan,) = [p for p in fast_path._plans.values() if p.dims["n"] == 6]
    assert plan._problem is not None and plan._problem.n == 6  # not copied yet
    got = linattn.last_decision("gdn_decode")
    assert plan._problem is None and got is plan.decision  # copied once, on the read
    assert got.problem.n == 6 and got.chosen == first.chosen
    assert got == first.model_copy(update={"problem": got.problem})  # the class's verdicts, its own problem
    assert linattn.last_decision() is got  # this thread's last decision too
