"""State checkpoints from prefill (issue 32 item 1; docs/ops.md "State checkpoints") on the Triton
chunked prefill in the interpreter (tiny shapes): the pipeline's state kernel and the fused walk
(GDN; KDA's opt-in), both state layouts, fp32 and bf16 pools (``HAS_CKPT`` builds).

Each checkpoint is held bitwise to the same prefill stopped after that many tokens (the same kernels:
the pipeline or the fused prefill forced on both) and to the float64 token-serial reference within
the bf16 state tolerance; outputs and final states bitwise to the call without checkpoints; every
row not owned bitwise unchanged (tests/ops/checkpoint_cases.py). Then the public op on the Triton
backend (has_initial_state, output_state_indices, an int32 table) and what explain says."""

from __future__ import annotations

import pytest
import torch
from checkpoint_cases import check_triton_checkpoints, written_checkpoints
from separate_slots_cases import assert_untouched, prefill_fn

import linattn
from linattn.capabilities import interpreter_enabled
from linattn.dispatch.plugin.verdict import Reason
from linattn.testing.execute import rel_error, tolerances

pytestmark = pytest.mark.skipif(not interpreter_enabled() or torch.cuda.is_available(),
                                reason="the Triton kernels in the interpreter (TRITON_INTERPRET=1, no GPU)")

H, HV, K, V = 1, 2, 64, 64
E = 64
#: checkpoints inside a sequence (130: 64 and 128; 200: 64, 128), one at exactly the length (64),
#: an empty sequence, one shorter than a checkpoint (10), padding (slot -1)
LENS = [130, 64, 0, 200, 10, 70]
READ = [0, 1, 2, 3, 4, -1]
#: slots 12 (past sequence 0's length), 9 (the empty sequence's), 13 (the 10-token one's) and 17
#: (padding's) are named and never written
MARKS = [[5, 6, 12], [7, -1, -1], [9, -1, -1], [10, 11, -1], [13, -1, -1], [17, -1, -1]]
P = 20


def _inputs(family, lens=LENS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    g = -(torch.rand((T, HV, K) if family == "kda" else (T, HV), generator=gen) * 0.1 + 0.005)
    bf = torch.bfloat16
    return dict(q=torch.randn(T, H, K, generator=gen).to(bf), k=torch.randn(T, H, K, generator=gen).to(bf),
                v=torch.randn(T, HV, V, generator=gen).to(bf), g=g,
                beta=torch.rand(T, HV, generator=gen) * 0.9 + 0.05,
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))


def _pool(dtype=torch.float32, seed=1):
    return (torch.randn(P, HV, V, K, generator=torch.Generator().manual_seed(seed)) * 0.5).to(dtype)


@pytest.mark.parametrize("family, fused, state_layout, pool_dtype", [
    ("gdn", False, "vk", torch.float32), ("gdn", True, "kv", torch.bfloat16),
    ("kda", False, "kv", torch.bfloat16), ("kda", True, "vk", torch.float32)])
def test_each_checkpoint_is_the_state_of_a_prefill_stopped_there(family, fused, state_layout, pool_dtype):
    n = check_triton_checkpoints(family, _inputs(family), _pool(pool_dtype), READ, MARKS, E, fused=fused,
                                 tol=tolerances("bfloat16", "bfloat16" if pool_dtype == torch.bfloat16 else
                                                "float32")[1], state_layout=state_layout)
    assert n == 5


def test_the_public_op_on_triton_with_fresh_sequences_separate_slots_and_an_int32_table():
    """backend='triton-split' (forced: the interpreter), has_initial_state (sequence 3 fresh: its NaN
    read slot is not read), output_state_indices and checkpoint_every=128 from an int32 table; each
    checkpoint against the float64 reference of the same call run token by token."""
    lens, read, write = [200, 130, 64], [0, 1, 2], [3, 4, 5]
    marks = [[6, 12], [7, -1], [8, -1]]  # 128 tokens: 200 -> 6 (12: past 256), 130 -> 7; 64 < 128: 8 unwritten
    d = _inputs("gdn", lens, seed=3)
    pool = _pool()
    pool[1] = float("nan")
    p = pool.clone()
    fresh = torch.tensor([True, False, True])
    kw = dict(state_indices=torch.tensor(read), output_state_indices=torch.tensor(write), has_initial_state=fresh,
              checkpoint_every=128)
    prefill_fn("gdn")(**d, state_pool=p, **kw, checkpoint_indices=torch.tensor(marks, dtype=torch.int32),
                      backend="triton-split")
    assert linattn.last_decision().chosen == "triton-split"
    oracle = torch.nan_to_num(pool.double())
    prefill_fn("gdn")(**{x: (y.double() if y.is_floating_point() else y) for x, y in d.items()}, state_pool=oracle,
                      **kw, checkpoint_indices=torch.tensor(marks), backend="torch-ref")
    done = written_checkpoints(lens, read, marks, 128)
    assert sorted(done.values()) == [6, 7]
    for slot in [*write, *done.values()]:
        assert rel_error(p[slot], oracle[slot]) <= tolerances("bfloat16")[1], slot
    assert_untouched(pool, p, [*write, *done.values()])


def test_explain_accepts_checkpoints_on_triton_and_says_how():
    kw = dict(n=4, t=4096, h=16, hv=32, k=128, v=128, dtype="bfloat16", mode="pool")
    verdicts = {v.backend: v for v in linattn.explain("gdn_prefill", "sm90", checkpoints=True, **kw).verdicts}
    for name in ("triton-split", "triton-folded"):
        assert verdicts[name].ok or verdicts[name].reason != Reason.FEATURE, verdicts[name]
    assert getattr(verdicts["cutedsl"], "reason", None) != Reason.FEATURE  # its state kernel writes them too
    from linattn.backends.triton_split import TritonSplitBackend
    from linattn.capabilities import profile
    from linattn.dispatch.plugin.problem import Problem

    p = Problem(op="gdn_prefill", n=1, t=65536, h=16, hv=32, k=128, v=128, dtype="bfloat16", mode="pool")
    note = TritonSplitBackend().plan_note(p.model_copy(update={"checkpoints": True}), profile("sm90"))
    assert "checkpoints" in note and "segments of" not in note, note
    assert "segments of" in TritonSplitBackend().plan_note(p, profile("sm90"))  # the pass the checkpoints turn off


@pytest.mark.parametrize("every", [None, 0, 96, 64.0, True])
def test_the_kernel_entry_refuses_a_bad_checkpoint_every_before_any_pool_write(every):
    """chunk_prefill called directly (below the op layer's host rules): checkpoint_every must be a
    positive multiple of 64 with checkpoint_indices, else the kernels would divide by 0 chunks or
    store off the chunk grid; refused before forked() copies read rows into the write rows."""
    from linattn.kernels.triton.prefill import chunk_prefill

    pool = _pool()
    before = pool.clone()
    with pytest.raises(ValueError, match="checkpoint_every must be a positive multiple of 64"):
        chunk_prefill("gdn", **_inputs("gdn"), state_pool=pool, state_indices=torch.tensor(READ), initial_state=None,
                      scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk",
                      output_state_indices=torch.tensor([14, 15, 16, 18, 19, -1]), checkpoint_every=every,
                      checkpoint_indices=torch.tensor(MARKS))
    assert torch.equal(pool, before)
