"""A prefill class's calls with a new T each (``prefill.PrefillReplay``, issue 28): a call runs the
launches of a plan made for its T bucket (``replay_tokens``) and its N (run one by one on the
bucket's first call, recorded and replayed from its second), and gets bitwise
the output, final state and pool rows of a plan made for its own T, run stage by stage; pool rows
the call does not own stay bitwise as given.

Interpreter, small shapes (bf16 q/k/v: GDN's grouped path with the gates kernel, KDA's state kernel
that writes the output; the fused GDN prefill forced).
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled, probe  # noqa: E402
from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states  # noqa: E402

H, HV, K, V, P = 1, 2, 64, 64, 6
SLOTS = torch.tensor([4, 2, -1, 0], dtype=torch.int32)  # a padding row; slots 1, 3, 5 not owned
RUNS_KERNELS = pytest.mark.skipif(not interpreter_enabled(), reason="runs kernels in the interpreter (TRITON_INTERPRET=1)")
NAMES = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")


def _call(family: str, lens: list, seed: int, dense: bool = False) -> dict:
    kw = make_inputs(family, lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=seed)
    if dense:
        kw["initial_state"] = random_states(len(lens), HV, K, V, seed=seed)
    else:
        kw.update(state_pool=random_states(P, HV, K, V, seed=seed), state_indices=SLOTS[:len(lens)].clone())
    return kw


def _plan(family: str, kw: dict, **over) -> pm.PrefillPlan:
    keys = ("q", "v", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")
    return pm.plan_prefill(family, **{n: kw[n] for n in keys if n in kw}, **over)


def _fresh(monkeypatch, family: str, kw: dict, **over):
    """A plan made for the call's own T, run stage by stage, on a copy of the pool."""
    kw = dict(kw, **({"state_pool": kw["state_pool"].clone()} if "state_pool" in kw else {}))
    plan = _plan(family, kw, **over)
    with monkeypatch.context() as m:
        m.setattr(pm.PrefillPlan, "replayable", property(lambda self: False))
        o, final = pm.run_prefill(plan, **kw, scale=0.125)
    return o, final, kw.get("state_pool")


def _assert_same(got, want, before: dict) -> None:
    (o, final, pool), (o_ref, final_ref, pool_ref) = got, want
    assert o.shape == o_ref.shape and torch.equal(o, o_ref)
    assert (final is None) == (final_ref is None) and (final is None or torch.equal(final, final_ref))
    if pool is None:
        return
    assert torch.equal(pool, pool_ref)
    idx = before["state_indices"]
    for slot in set(range(P)) - set(idx[idx >= 0].tolist()):  # rows the call does not own
        assert torch.equal(pool[slot], before["state_pool"][slot])
    assert not torch.equal(pool[int(idx[0])], before["state_pool"][int(idx[0])])  # an owned row moved


def _replayed(replay: pm.PrefillReplay, kw: dict):
    kw = dict(kw, **({"state_pool": kw["state_pool"].clone()} if "state_pool" in kw else {}))
    o, final = replay(kw)
    return o, final, kw.get("state_pool")


def test_replay_tokens_buckets_t_by_a_quarter_octave_and_a_chunk():
    assert [pm.replay_tokens(t) for t in (1, 64, 65, 200, 256, 257, 1000, 1025, 8192)] == \
        [64, 64, 128, 256, 256, 320, 1024, 1280, 8192]
    for t in range(1, 5000, 7):
        b = pm.replay_tokens(t)
        assert t <= b < 1.25 * t + pm.CHUNK and b % pm.CHUNK == 0


@RUNS_KERNELS
@pytest.mark.parametrize("family,dense", [("gdn", False), ("kda", False), ("gdn", True)])
def test_a_new_t_of_a_known_bucket_replays_with_the_bits_of_its_own_plan(monkeypatch, family, dense):
    first = _call(family, [70, 0, 5, 9], seed=1, dense=dense)  # T = 84: bucket 128
    replay = pm.PrefillReplay(family, dict(first, scale=0.125, use_qk_l2norm=True, state_layout="vk"),
                              probe(first["q"].device), "split")
    _assert_same(_replayed(replay, first), _fresh(monkeypatch, family, first), first)  # the bucket's stages
    assert len(replay.entries) == 1 and not len(replay.exact)
    (plan, launch, _), = replay.entries.values()
    assert launch is None and plan.T == 128  # a bucket's first call records nothing
    second = _call(family, [50, 3, 0, 20], seed=2, dense=dense)  # T = 73, N = 4: the same bucket, recorded
    _assert_same(_replayed(replay, second), _fresh(monkeypatch, family, second), second)
    assert len(replay.entries) == 1 and not len(replay.exact)
    assert isinstance(next(iter(replay.entries.values()))[1], pm.PrefillLaunch)
    if family == "gdn" and not dense:  # (kept to one case: the interpreter's time)
        third = _call(family, [40, 2, 9], seed=3, dense=dense)  # N = 3: a bucket of its own
        _assert_same(_replayed(replay, third), _fresh(monkeypatch, family, third), third)
        assert len(replay.entries) == 2


@RUNS_KERNELS
def test_the_fused_prefill_planned_for_a_bucket_gives_the_bits_of_its_own_plan(monkeypatch):
    """The fused GDN prefill (forced: the planner keeps it for CUDA) recorded on a bucket's plan."""
    kw = _call("gdn", [50, 3, 0, 20], seed=4)
    bucket = _plan("gdn", dict(kw, q=kw["q"].new_empty(()).expand(128, H, K)), fused=True)
    assert bucket.fused is not None and bucket.T == 128 and bucket.replayable
    launch = pm.PrefillLaunch(bucket, tuple(kw.get(n) for n in NAMES), 0.125)
    pool = kw["state_pool"].clone()
    o, final = launch(*(pool if n == "state_pool" else kw.get(n) for n in NAMES))
    _assert_same((o, final, pool), _fresh(monkeypatch, "gdn", kw, fused=True), kw)


def test_a_t_the_planner_cuts_into_segments_is_planned_for_itself(monkeypatch):
    """Where the planner would cut the call's own T into segments, the bucket's launch is not used."""
    kw = _call("gdn", [70, 0, 5, 9], seed=5)
    replay = pm.PrefillReplay("gdn", dict(kw, scale=0.125, use_qk_l2norm=True, state_layout="vk"),
                              probe(kw["q"].device), "split")
    ran = []
    monkeypatch.setattr(pm.replay, "_segments_vary", lambda plan, caps: True)
    monkeypatch.setattr(pm.replay, "_segmented", lambda plan, T, caps: True)
    monkeypatch.setattr(pm.replay, "run_prefill", lambda plan, **a: ran.append(plan) or (None, None))
    replay(kw)
    assert len(ran) == 1 and ran[0].T == 84 and len(replay.exact) == 1
