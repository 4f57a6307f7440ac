"""The ``flashinfer`` peer's separate read / write slots (``output_state_indices``) and state
checkpoints (``checkpoint_every`` / ``checkpoint_indices``; issue 32 items 1 and 2) on the CPU,
against the stand-in of FlashInfer 0.7.4's ``chunk_gated_delta_rule`` (``peer_fakes.py``, which
models its ``output_state_indices`` and its checkpoints into pool rows, ``checkpoint_state_indices``):
what the backend hands FlashInfer, and that the pool afterwards is torch-ref's (docs/ops.md
"Separate read and write slots", "State checkpoints"): every written slot, every checkpoint bitwise
the same backend's prefill stopped there, and every row not written bitwise unchanged.

The cases are the conformance suite's (``linattn.testing.cases``: ``_SEPARATE``, ``_CHECKPOINTS``)
and tests/ops/test_checkpoints.py's, so the translation meets what ``linattn check --backend
flashinfer --device cuda`` will ask on a GPU (pending there)."""

from __future__ import annotations

import types

import pytest
import torch

from linattn.backends import flashinfer as fi_backend
from linattn.backends.flashinfer import FlashInferBackend
from linattn.backends.torch_ref import gdn_prefill_ref
from linattn.dispatch.plugin.calls import make_call
from linattn.testing.cases import _CHECKPOINTS, _SEPARATE, PREFILL_LENS, checkpoints_written

from peer_fakes import Log, default_scale, flashinfer_prefill

K = V = 8
HV, H = 2, 1


@pytest.fixture
def fi_log(monkeypatch) -> Log:
    log = Log()
    fake = {"flashinfer.gdn_prefill": types.SimpleNamespace(chunk_gated_delta_rule=flashinfer_prefill(log))}
    monkeypatch.setattr(fi_backend, "import_library", lambda name: (fake[name], ""))
    return log


def _inputs(lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(T, H, K).bfloat16(), k=r(T, H, K).bfloat16(), v=r(T, HV, V).bfloat16(),
                g=-(torch.rand(T, HV, generator=gen) * 0.1 + 0.005), beta=torch.rand(T, HV, generator=gen),
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))


def _pool(P, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(P, HV, V, K, generator=gen)).to(dtype)


def _run(d, pool, read, **kw):
    """The backend's prefill (pool mode) on ``pool`` in place; ``kw``: the call's optional arguments."""
    args = dict(**d, state_pool=pool, state_indices=torch.tensor(read, dtype=torch.int32), scale=default_scale(K),
                use_qk_l2norm=True, state_layout="vk", **kw)
    o, final = FlashInferBackend().prefill(make_call("gdn_prefill", args))
    assert final is None
    return o


def _reference(d, pool, read, **kw):
    ref = pool.clone()
    o = gdn_prefill_ref(**d, state_pool=ref, state_indices=torch.tensor(read, dtype=torch.int32),
                        scale=default_scale(K), **kw)[0]
    return o, ref


def _bits(x):
    return x.contiguous().view({2: torch.int16, 4: torch.int32}[x.element_size()])


def _untouched(before, after, written):
    rest = [i for i in range(before.shape[0]) if i not in set(written)]
    assert rest and torch.equal(_bits(after[rest]), _bits(before[rest]))


# -- separate read and write slots -----------------------------------------------------------------

#: the conformance suite's 'separate-slots' prefill case: slot 3 read by two sequences (the first empty:
#: its initial state copied), one in place (7), another empty fork (1 -> 6), padding
SEP_LENS = list(PREFILL_LENS)
SEP_READ, SEP_WRITE = list(_SEPARATE["prefill"]["slots"]), list(_SEPARATE["prefill"]["out_slots"])


@pytest.mark.parametrize("fresh", [None, [True, True, False, True, False, True]], ids=["h0", "fresh"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
def test_separate_slots_read_one_slot_write_another_as_flashinfers_index_pair(fi_log, fresh, state_dtype):
    d, pool = _inputs(SEP_LENS), _pool(9, state_dtype)
    kw = dict(output_state_indices=torch.tensor(SEP_WRITE, dtype=torch.int64))
    if fresh is not None:
        kw["has_initial_state"] = ~torch.tensor(fresh)
        pool[1] = float("nan")  # only a fresh sequence names slot 1: never read
    mine = pool.clone()
    o = _run(d, mine, SEP_READ, **kw)
    o_ref, ref = _reference(d, pool, SEP_READ, **kw)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    written = [s for s in SEP_WRITE if s >= 0]
    torch.testing.assert_close(mine[written].float(), ref[written].float(), rtol=0, atol=1e-6)
    _untouched(pool, mine, written)  # the read slots 3, 1, 5 included
    for n in (n for n, t in enumerate(SEP_LENS) if t == 0 and SEP_WRITE[n] >= 0):  # empty forks: the row read
        want = torch.zeros_like(pool[0]) if fresh is not None and fresh[n] else pool[SEP_READ[n]]
        assert torch.equal(_bits(mine[SEP_WRITE[n]]), _bits(want)), n
    assert bool(o[sum(SEP_LENS[:5]):].eq(0).all())  # padding's tokens
    call = fi_log[0]
    loads = SEP_READ if fresh is None else [-1 if f else r for r, f in zip(SEP_READ, fresh)]
    assert call["state_indices"].tolist() == [r if r >= 0 else -1 for r in loads]
    assert call["output_state_indices"].tolist() == SEP_WRITE and call["use_cp"] is False
    assert call["initial_state"] is mine and call["output_state"] is mine


def test_separate_slots_through_a_dense_copy_when_the_pool_rows_are_not_dense(fi_log):
    d, pool = _inputs(SEP_LENS), _pool(9)
    big = torch.zeros(9, HV, V + 1, K)  # head pitch (V + 1) K: rows are not dense blocks
    big[:, :, :V] = pool
    view = big[:, :, :V]
    kw = dict(output_state_indices=torch.tensor(SEP_WRITE))
    _run(d, view, SEP_READ, **kw)
    _, ref = _reference(d, pool, SEP_READ, **kw)
    torch.testing.assert_close(view, ref, rtol=0, atol=1e-6)
    _untouched(pool, view, [s for s in SEP_WRITE if s >= 0])
    assert bool(big[:, :, V].eq(0).all()) and fi_log[0]["initial_state"] is not view


def test_separate_slots_with_no_tokens_copy_each_read_row_to_its_write_slot(fi_log):
    d, pool = _inputs([0, 0, 0]), _pool(6)
    mine = pool.clone()
    _run(d, mine, [1, 1, 4], output_state_indices=torch.tensor([2, 3, 4]),
         has_initial_state=torch.tensor([True, False, True]))
    assert torch.equal(mine[2], pool[1]) and bool(mine[3].eq(0).all()) and len(fi_log) == 0  # T = 0: no call
    _untouched(pool, mine, [2, 3])


# -- checkpoints ---------------------------------------------------------------------------------------

E = 64
#: tests/ops/test_checkpoints.py's case: checkpoints inside (130: 64, 128; 200: 64, 128 and a third, 192,
#: past its two-column row), one at exactly the length (64), an empty sequence, one shorter than E (10),
#: padding (slot -1); slots 12, 9, 13 and 17 are named but never written
CK_LENS = [130, 64, 0, 200, 10, 70]
CK_READ = [0, 1, 2, 3, 4, -1]
CK_MARKS = [[5, 6, 12], [7, -1, -1], [9, -1, -1], [10, 11, -1], [13, -1, -1], [17, -1, -1]]
CK_WRITTEN = {(0, 0): 5, (0, 1): 6, (1, 0): 7, (3, 0): 10, (3, 1): 11}
P = 20


def _stopped(d, pool, n, t, slot):
    """Slot ``slot`` after the backend's prefill of sequence ``n``'s first ``t`` tokens alone."""
    s = int(d["cu_seqlens"][n])
    cut = {x: d[x][s:s + t] for x in ("q", "k", "v", "g", "beta")}
    p = pool.clone()
    _run(dict(cut, cu_seqlens=torch.tensor([0, t], dtype=torch.int32)), p, [slot])
    return p[slot]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
def test_checkpoints_go_to_their_slots_as_flashinfers_checkpoint_rows(fi_log, state_dtype):
    d, pool = _inputs(CK_LENS), _pool(P, state_dtype)
    kw = dict(checkpoint_every=E, checkpoint_indices=torch.tensor(CK_MARKS, dtype=torch.int32))
    mine = pool.clone()
    o = _run(d, mine, CK_READ, **kw)
    o_ref, ref = _reference(d, pool, CK_READ, **kw)
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=0, atol=1e-6)
    written = [s for s in CK_READ if s >= 0] + list(CK_WRITTEN.values())
    torch.testing.assert_close(mine[written].float(), ref[written].float(), rtol=0, atol=1e-6)
    _untouched(pool, mine, written)  # 12, 9, 13, 17 and the unnamed rows
    for (n, j), slot in CK_WRITTEN.items():
        assert torch.equal(_bits(mine[slot]), _bits(_stopped(d, pool, n, (j + 1) * E, CK_READ[n])))
    call = fi_log[0]
    # FlashInfer's count per sequence: len // E = 2, 1, 0, 3, 0, 1; entries start at their cumulative sum
    assert call["checkpoint_every_n_tokens"] == E and call["checkpoint_cu_starts"].tolist() == [0, 2, 3, 3, 6, 6]
    rows = call["checkpoint_state_indices"].tolist()
    assert rows[:7] == [5, 6, 7, 10, 11, -1, -1]  # 200's third (named -1) and padding's: skipped
    assert len(rows) == sum(CK_LENS) // E + 1 and all(r == -1 for r in rows[7:])
    assert call["state_checkpoints"] is mine and call["use_cp"] is False
    assert call["output_state_indices"].tolist() == [0, 1, 2, 3, 4, -1]


def test_the_conformance_checkpoints_case_through_the_stand_in(fi_log):
    """linattn.testing.cases' 'pool/checkpoints' case, as linattn check runs it on a GPU: each checkpoint
    the reference's and bitwise the backend stopped there; slots past a length, the empty sequence's and
    padding's untouched."""
    c = _CHECKPOINTS
    d, pool = _inputs(list(c["lens"]), seed=5), _pool(c["p"])
    kw = dict(checkpoint_every=c["checkpoint_every"], checkpoint_indices=torch.tensor(c["marks"]))
    mine = pool.clone()
    _run(d, mine, list(c["slots"]), **kw)
    _, ref = _reference(d, pool, list(c["slots"]), **kw)
    marks = checkpoints_written(c)
    written = [s for s in c["slots"] if s >= 0] + [slot for _, _, slot in marks]
    assert sorted(slot for _, _, slot in marks) == [4, 5, 7, 10]
    torch.testing.assert_close(mine[written], ref[written], rtol=0, atol=1e-6)
    _untouched(pool, mine, written)
    for n, t, slot in marks:
        assert torch.equal(_bits(mine[slot]), _bits(_stopped(d, pool, n, t, c["slots"][n])))


def test_checkpoints_with_fresh_sequences_and_separate_slots_start_from_what_is_read(fi_log):
    d, pool = _inputs(CK_LENS), _pool(P)
    fresh = [False, True, False, True, False, False]
    kw = dict(checkpoint_every=E, checkpoint_indices=torch.tensor(CK_MARKS),
              output_state_indices=torch.tensor([14, 15, 16, 18, 19, -1]), has_initial_state=~torch.tensor(fresh))
    pool[1] = pool[3] = float("nan")  # fresh sequences' read slots: never read
    mine = pool.clone()
    _run(d, mine, CK_READ, **kw)
    _, ref = _reference(d, pool, CK_READ, **kw)
    written = [14, 15, 16, 18, 19] + list(CK_WRITTEN.values())
    torch.testing.assert_close(mine[written], ref[written], rtol=0, atol=1e-6)
    _untouched(pool, mine, written)
    assert torch.equal(mine[16], pool[2])  # the empty sequence: its initial state, copied
    assert fi_log[0]["state_indices"].tolist() == [0, -1, 2, -1, 4, -1]


def test_checkpoints_through_a_dense_copy_when_the_pool_rows_are_not_dense(fi_log):
    d, pool = _inputs(CK_LENS), _pool(P, torch.bfloat16)
    big = torch.zeros(P, HV, V + 1, K, dtype=torch.bfloat16)
    big[:, :, :V] = pool
    view = big[:, :, :V]
    kw = dict(checkpoint_every=E, checkpoint_indices=torch.tensor(CK_MARKS))
    _run(d, view, CK_READ, **kw)
    _, ref = _reference(d, pool, CK_READ, **kw)
    written = [s for s in CK_READ if s >= 0] + list(CK_WRITTEN.values())
    torch.testing.assert_close(view[written].float(), ref[written].float(), rtol=0, atol=1e-2)
    _untouched(pool, view, written)
    call = fi_log[0]
    buffer = call["state_checkpoints"]
    assert buffer is not view and buffer.dtype == torch.float32 and buffer.shape[0] == len(CK_MARKS) * 3
    # entries name rows n * M + j of the dense buffer, written back to the slots afterwards
    assert call["checkpoint_state_indices"].tolist()[:5] == [0, 1, 3, 9, 10]
    for (n, j), slot in CK_WRITTEN.items():
        assert torch.equal(view[slot], buffer[n * 3 + j].to(torch.bfloat16))


def test_checkpoints_past_the_tables_width_are_skipped_not_read_from_the_next_row(fi_log):
    """A sequence with more checkpoints due than the table has columns: the ones past ``M`` are not
    written (docs/ops.md: no slot named), and FlashInfer never reads the next sequence's entries."""
    d, pool = _inputs([200, 70]), _pool(P)
    mine = pool.clone()
    kw = dict(checkpoint_every=E, checkpoint_indices=torch.tensor([[5], [6]]))
    _run(d, mine, [0, 1], **kw)
    _, ref = _reference(d, pool, [0, 1], **kw)
    call = fi_log[0]
    assert call["checkpoint_cu_starts"].tolist() == [0, 3]
    assert call["checkpoint_state_indices"].tolist()[:4] == [5, -1, -1, 6]
    torch.testing.assert_close(mine[[0, 1, 5, 6]], ref[[0, 1, 5, 6]], rtol=0, atol=1e-6)
    _untouched(pool, mine, [0, 1, 5, 6])


def test_a_call_shorter_than_checkpoint_every_hands_flashinfer_no_checkpoints(fi_log):
    d, mine = _inputs([10, 20]), _pool(P)
    before = mine.clone()
    _run(d, mine, [0, 1], checkpoint_every=E, checkpoint_indices=torch.tensor([[5], [6]]))
    assert fi_log[0]["checkpoint_every_n_tokens"] == 0 and fi_log[0]["checkpoint_state_indices"] is None
    _untouched(before, mine, [0, 1])


# -- FlashInfer's context-parallel kernels --------------------------------------------------------------

def test_plain_calls_take_flashinfers_cp_rule_only_from_cp_min_tokens(fi_log, monkeypatch):
    """A call in the plain form (no padding, fresh rows, separate slots, checkpoints) below
    CP_MIN_TOKENS runs the non-CP kernel, like every call with checkpoints: a short prefill stopped
    at a checkpoint runs the kernel that wrote it. From CP_MIN_TOKENS on, FlashInfer's own rule."""
    d, pool = _inputs([40, 30]), _pool(P)
    _run(d, pool.clone(), [0, 1])
    monkeypatch.setattr(fi_backend, "CP_MIN_TOKENS", 70)
    _run(d, pool.clone(), [0, 1])
    _run(d, pool.clone(), [0, 1], checkpoint_every=E, checkpoint_indices=torch.tensor([[5], [-1]]))
    assert [c["use_cp"] for c in fi_log] == [False, "auto", False]
    assert fi_log[1]["output_state_indices"] is None and fi_log[2]["output_state_indices"] is not None
