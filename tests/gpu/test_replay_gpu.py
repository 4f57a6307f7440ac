"""Issue 28 on the device: a prefill call with a new T of a known (T bucket, N) replays the recorded
launches of the bucket's plan (``prefill.PrefillReplay``) and a decode call with a new N reuses its
class's launch on a new grid (``decode.DecodeReplay``), with bitwise the results of a plan made for
the call itself; pool rows a call does not own stay bitwise unchanged. Qwen3-Next heads, bf16,
through the public ops (the dispatcher's class plans share the replays) and directly.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))

import linattn  # noqa: E402
from linattn.capabilities import probe  # noqa: E402
from linattn.kernels.triton import decode as decode_mod  # noqa: E402
from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states  # noqa: E402

DEV = "cuda"
H, HV, K, V, P = 16, 32, 128, 128, 12
NAMES = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")


def _prefill(family: str, lens: list, seed: int) -> dict:
    kw = make_inputs(family, lens, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=seed, device=DEV)
    idx = torch.arange(len(lens), dtype=torch.int32, device=DEV) * 2  # odd slots are not owned
    idx[1] = -1  # a padding row
    kw.update(state_pool=random_states(P, HV, K, V, seed=seed).to(DEV), state_indices=idx)
    return kw


def _fresh(family: str, kw: dict):
    kw = dict(kw, state_pool=kw["state_pool"].clone())
    plan = pm.plan_prefill(family, q=kw["q"], v=kw["v"], cu_seqlens=kw["cu_seqlens"], state_pool=kw["state_pool"],
                           state_indices=kw["state_indices"])
    o, _ = pm.run_prefill(plan, **kw, scale=K ** -0.5)  # a plan's first call runs stage by stage
    return o, kw["state_pool"]


def _assert_pool(pool: torch.Tensor, before: torch.Tensor, idx: torch.Tensor) -> None:
    owned = set(idx[idx >= 0].tolist())
    for slot in set(range(P)) - owned:
        assert torch.equal(pool[slot], before[slot]), f"slot {slot} is not owned by the call and was written"


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_new_t_replayed_from_its_bucket_gives_the_bits_of_its_own_plan(family):
    lens_seq = [[300, 1, 0, 211], [257, 64, 3, 190], [512, 0, 7, 1], [129, 129, 2, 200]]  # T 512, 514, 520, 460
    first = _prefill(family, lens_seq[0], seed=0)
    replay = pm.PrefillReplay(family, dict(first, scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk"),
                              probe(torch.device(DEV)), "split")
    for i, lens in enumerate(lens_seq):
        kw = _prefill(family, lens, seed=i)
        want_o, want_pool = _fresh(family, kw)
        got = dict(kw, state_pool=kw["state_pool"].clone())
        o, _ = replay(got)
        assert o.shape == want_o.shape and torch.equal(o, want_o), f"T = {sum(lens)}"
        assert torch.equal(got["state_pool"], want_pool)
        _assert_pool(got["state_pool"], kw["state_pool"], kw["state_indices"])
    assert len(replay.entries) == 2 and not len(replay.exact)  # buckets 512 (T 512, 460) and 640 (T 514, 520)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_stream_of_new_lengths_through_the_public_ops_matches_fresh_plans(family):
    """Prefill and decode calls with a new T / N every call, through the dispatcher (class plans sharing
    the replays), against each call run after ``clear_cache`` (a fresh plan); pools bitwise."""
    op_p, op_d = getattr(linattn, f"{family}_prefill"), getattr(linattn, f"{family}_decode")
    gen = torch.Generator().manual_seed(3)
    for i, lens in enumerate([[90, 40, 20], [91, 40, 20], [200, 3, 50], [201, 3, 50]]):
        kw = _prefill(family, lens, seed=10 + i)
        runs = []
        for fresh in (False, True):
            if fresh:
                linattn.dispatch.clear_cache()
            x = dict(kw, state_pool=kw["state_pool"].clone())
            runs.append((op_p(**x), x["state_pool"]))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
        _assert_pool(runs[0][1], kw["state_pool"], kw["state_indices"])
    for n in (5, 6, 9, 17, 40, 41):
        def r(*s):
            return torch.randn(*s, generator=gen).to(DEV, torch.bfloat16)
        x = dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V), a=r(n, 1, HV, K) if family == "kda" else r(n, 1, HV),
                 b=r(n, 1, HV), A_log=torch.randn(HV, generator=gen).to(DEV),
                 dt_bias=torch.randn(*((HV, K) if family == "kda" else (HV,)), generator=gen).to(DEV),
                 state_pool=torch.randn(2 * n + 2, HV, V, K, generator=gen).to(DEV),
                 state_indices=torch.arange(n, dtype=torch.int32, device=DEV) * 2)
        runs = []
        for fresh in (False, True):
            if fresh:
                linattn.dispatch.clear_cache()
            y = dict(x, state_pool=x["state_pool"].clone())
            runs.append((op_d(**y), y["state_pool"]))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), f"N = {n}"
        _assert_pool(runs[0][1], x["state_pool"], x["state_indices"])


def test_a_decode_launch_for_another_n_shares_its_compiled_kernel():
    """``DecodeLaunch.with_rows``: the copy for another N of one tile class launches the same compiled kernel."""
    def call(n):
        g = torch.Generator().manual_seed(n)
        return dict(q=torch.randn(n, 1, H, K, generator=g).to(DEV, torch.bfloat16),
                    k=torch.randn(n, 1, H, K, generator=g).to(DEV, torch.bfloat16),
                    v=torch.randn(n, 1, HV, V, generator=g).to(DEV, torch.bfloat16),
                    a=torch.randn(n, 1, HV, generator=g).to(DEV, torch.bfloat16),
                    b=torch.randn(n, 1, HV, generator=g).to(DEV, torch.bfloat16),
                    A_log=torch.randn(HV, generator=g).to(DEV), dt_bias=torch.randn(HV, generator=g).to(DEV),
                    state_pool=torch.randn(n, HV, V, K, generator=g).to(DEV),
                    state_indices=torch.arange(n, dtype=torch.int32, device=DEV))
    caps = probe(torch.device(DEV))
    replay = decode_mod.DecodeReplay(gate="gdn", caps=caps, layout="split", **call(20))
    replay(call(20))
    x = call(33)
    got = replay(dict(x, state_pool=x["state_pool"].clone()))
    want = decode_mod.DecodeLaunch(gate="gdn", caps=caps, layout="split", **x)(x)
    assert torch.equal(got, want)
    derived = replay.launches.get(33)
    assert derived is not None and derived.launch._compiled is replay.first.launch._compiled
