"""Separate read and write slots (``output_state_indices``, issue 32 item 2; docs/ops.md "Separate
read and write slots") on the CPU: torch-ref, torch-chunked and the Triton kernels in the
interpreter (tiny shapes), each held bitwise to itself run in place on a forked pool
(``separate_slots_cases.py``), unwritten rows (the read slots included) bitwise unchanged; and the
validation layer's refusals, each before anything is written."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linattn
from separate_slots_cases import (DECODE_READ, DECODE_WRITE, P, PREFILL_LENS, bits, check_decode_fork, check_prefill_fork,
                                  decode_inputs, fork_pattern, forked_pool, prefill_inputs, run_decode, run_prefill)

from linattn.capabilities import interpreter_enabled

H, HV, K, V = 1, 2, 16, 32
N = len(DECODE_READ)
CPU_BACKENDS = ["torch-ref", "torch-chunked"]
TRITON = pytest.mark.skipif(not interpreter_enabled() or torch.cuda.is_available(),
                            reason="the Triton kernels in the interpreter (TRITON_INTERPRET=1, no GPU)")


def _pool(layout="vk", dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    shape = (P, HV, V, K) if layout == "vk" else (P, HV, K, V)
    return (torch.randn(*shape, generator=gen) * 0.5).to(dtype)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("T", [1, 3])
def test_decode_writes_the_output_slots_and_keeps_the_read_slots(family, backend, T):
    d = decode_inputs(family, N, T, H, HV, K, V, torch.float32, "cpu", seed=T)
    check_decode_fork(family, backend, _pool(), d)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_decode_fresh_row_reads_nothing_and_writes_its_output_slot(backend):
    d = decode_inputs("gdn", N, 1, H, HV, K, V, torch.float32, "cpu")
    pool = _pool()
    pool[0] = float("nan")  # row 4's read slot: fresh, never read
    check_decode_fork("gdn", backend, pool, d, fresh=[False, False, False, False, True])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_prefill_writes_the_output_slots_and_keeps_the_read_slots(family, backend, layout):
    d = prefill_inputs(family, PREFILL_LENS, H, HV, K, V, torch.float32, "cpu")
    check_prefill_fork(family, backend, _pool(layout), d, state_layout=layout)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_prefill_fresh_sequence_reads_nothing(backend):
    d = prefill_inputs("kda", PREFILL_LENS, H, HV, K, V, torch.float32, "cpu")
    pool = _pool()
    pool[7] = float("nan")  # sequence 4's read slot: fresh, never read
    check_prefill_fork("kda", backend, pool, d, fresh=[False, False, False, False, True])


def test_reference_output_slots_equal_a_copy_then_in_place_call_in_float64():
    """The reference's own maths: the forked row's state is the in-place state of a copy (fp64 oracle)."""
    d = decode_inputs("gdn", N, 2, H, HV, K, V, torch.float64, "cpu")
    pool = _pool(dtype=torch.float64)
    check_decode_fork("gdn", "torch-ref", pool, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_fork_patterns_are_valid_and_match_the_in_place_call(seed):
    """The GPU tests' fork patterns (tests/gpu/test_separate_slots_gpu.py) pass validation here."""
    n = 12
    read, write = fork_pattern(n, 2 * n + 3, seed)
    d = decode_inputs("gdn", n, 1, H, HV, K, V, torch.float32, "cpu", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(2 * n + 3, HV, V, K, generator=gen)
    check_decode_fork("gdn", "torch-ref", pool, d, read=read, write=write)


def test_none_is_the_in_place_call_bitwise():
    d = decode_inputs("kda", N, 1, H, HV, K, V, torch.float32, "cpu")
    read = [1, 4, 3, -1, 0]
    p1, p2 = _pool(), _pool()
    o1 = run_decode("kda", d, p1, read, backend="torch-ref")
    o2 = run_decode("kda", d, p2, read, read, backend="torch-ref")
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    assert not torch.equal(p1, _pool())


@TRITON
@pytest.mark.parametrize("backend", ["triton-split", "triton-folded"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_triton_decode_interpreter(family, backend):
    d = decode_inputs(family, N, 2, H, HV, K, V, torch.bfloat16, "cpu")
    check_decode_fork(family, backend, _pool(), d)


@TRITON
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_triton_prefill_interpreter(family):
    d = prefill_inputs(family, PREFILL_LENS, H, HV, 64, 64, torch.bfloat16, "cpu")
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(P, HV, 64, 64, generator=gen) * 0.5
    check_prefill_fork(family, "triton-split", pool, d, fresh=[False, False, True, False, False])


# -- validation: each refusal before anything is written ---------------------------------------------

def _refused(fn, match):
    with pytest.raises(ValueError, match=match):
        fn()


def _decode_call(read, write, pool=None, **kw):
    d = decode_inputs("gdn", len(read), 1, H, HV, K, V, torch.float32, "cpu")
    pool = _pool() if pool is None else pool
    return lambda: run_decode("gdn", d, pool, read, write, backend="torch-ref", **kw)


def _prefill_call(read, write, pool=None, **kw):
    d = prefill_inputs("gdn", [3] * len(read), H, HV, K, V, torch.float32, "cpu")
    pool = _pool() if pool is None else pool
    return lambda: run_prefill("gdn", d, pool, read, write, backend="torch-ref", **kw)


@pytest.mark.parametrize("call", [_decode_call, _prefill_call])
def test_a_slot_read_by_one_sequence_and_written_by_another_is_refused(call):
    pool = _pool()
    _refused(call([1, 2, 3], [5, 1, 3], pool), r"slot 1 is read by sequence 0 .* written by sequence 1")
    assert torch.equal(pool, _pool())


@pytest.mark.parametrize("call", [_decode_call, _prefill_call])
def test_two_sequences_writing_one_slot_is_refused_but_sharing_a_read_slot_is_not(call):
    pool = _pool()
    _refused(call([1, 2, 3], [5, 5, 3], pool), r"output_state_indices: slot 5 is named by sequence 0 and sequence 1")
    assert torch.equal(pool, _pool())
    call([1, 1, 1], [4, 5, 6], pool)()  # three forks of one read slot: legal
    assert torch.equal(pool[1], _pool()[1])


@pytest.mark.parametrize("call", [_decode_call, _prefill_call])
def test_written_slot_out_of_range_is_refused(call):
    _refused(call([1, 2, 3], [4, P, 3]), rf"output_state_indices\[1\] = {P} is out of range")


@pytest.mark.parametrize("call", [_decode_call, _prefill_call])
def test_padding_on_other_rows_than_state_indices_is_refused(call):
    _refused(call([1, -1, 3], [4, 5, 3]), r"sequence 1: state_indices\[1\] = -1 and output_state_indices\[1\] = 5")
    _refused(call([1, 2, 3], [4, -1, 3]), r"sequence 1: .* padding \(a negative index\) must be on the same rows")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_without_validation_a_negative_write_slot_stores_nothing(op, backend):
    """validate=False (or CUDA-graph capture) skips the padding-rows rule; a row with a real read slot
    and a negative write slot then stores nothing on every backend (torch-chunked once wrote it to
    the pool's last row, Python's index -1), and its output is the one the read state gives."""
    d = (decode_inputs("gdn", 3, 1, H, HV, K, V, torch.float32, "cpu") if op == "decode"
         else prefill_inputs("gdn", [3, 0, 3], H, HV, K, V, torch.float32, "cpu"))
    run = run_decode if op == "decode" else run_prefill
    outs = []
    for write in ([4, -1, 3], [4, 5, 3]):
        pool = _pool()
        outs.append(run("gdn", d, pool, [1, 2, 3], write, backend=backend, validate=False))
        kept = [r for r in range(P) if r not in write]
        assert torch.equal(pool[kept], _pool()[kept])  # with -1: slot 5 and the last row keep their bits
    assert torch.equal(outs[0], outs[1])


def test_a_fresh_sequence_does_not_read_its_slot_so_another_may_write_it():
    pool = _pool()
    his = torch.tensor([False, True, True])
    _decode_call([1, 2, 3], [5, 1, 3], pool, has_initial_state=his)()  # row 0 reads nothing; row 1 writes slot 1
    assert torch.equal(pool[[0, 2, 4, 6, 7, 8]], _pool()[[0, 2, 4, 6, 7, 8]])
    _refused(_decode_call([1, 2, 3], [5, 1, 3], has_initial_state=~his), r"slot 1 is read by sequence 0")


def test_decode_table_form_refuses_output_state_indices():
    d = decode_inputs("gdn", 2, 2, H, HV, K, V, torch.float32, "cpu")
    table = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"output_state_indices applies to state_indices \[N\]"):
        linattn.gdn_decode(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], _pool(), table,
                           output_state_indices=torch.tensor([5, 6]))


def test_refused_with_disable_state_update_in_dense_mode_and_with_a_wrong_shape_or_dtype():
    _refused(_decode_call([1, 2], [4, 5], disable_state_update=True), "disable_state_update=True")
    d = prefill_inputs("gdn", [3, 3], H, HV, K, V, torch.float32, "cpu")
    with pytest.raises(ValueError, match="output_state_indices is for pool mode"):
        linattn.gdn_prefill(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                            output_state_indices=torch.tensor([4, 5]))
    d = decode_inputs("gdn", 2, 1, H, HV, K, V, torch.float32, "cpu")
    args = (d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], _pool(), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"output_state_indices must have shape \[N\]"):
        linattn.gdn_decode(*args, output_state_indices=torch.tensor([4, 5, 6]))
    with pytest.raises(TypeError, match="output_state_indices"):
        linattn.gdn_decode(*args, output_state_indices=torch.tensor([4.0, 5.0]))


@pytest.mark.parametrize("op", ["gdn_decode", "kda_prefill"])
def test_peers_refuse_with_reason_feature_naming_it(op):
    """fla does not honour separate write slots, and flashinfer not in decode: refused (reason
    ``feature``), so the dispatcher falls back, never a silent in-place write. flashinfer's prefill
    takes them (FlashInfer's own ``output_state_indices``: tests/peers/test_flashinfer_slots.py)."""
    from linattn.backends.fla import FLABackend
    from linattn.backends.flashinfer import FlashInferBackend
    from linattn.dispatch.plugin.problem import Problem
    from linattn.dispatch.plugin.verdict import Reason

    p = Problem(op=op, n=4, t=1, h=1, hv=2, k=64, v=64, output_state_indices=True)
    check = FLABackend().supports_features(p, None)
    assert not check.ok and check.reason == Reason.FEATURE and "output_state_indices" in check.message
    assert FLABackend().supports_features(p.model_copy(update={"output_state_indices": False}), None).ok
    fi = FlashInferBackend()
    assert fi.supports_features(p, None).ok  # declared (prefill); decode refuses it in its own predicate
    if op == "gdn_decode":
        check = fi.supports_decode(p, None)
        assert not check.ok and check.reason == Reason.FEATURE and "output_state_indices" in check.message
        assert fi.supports_decode(p.model_copy(update={"output_state_indices": False}), None).ok


def test_explain_and_the_call_signature_carry_the_flag():
    d = decode_inputs("gdn", N, 1, H, HV, K, V, torch.float32, "cpu")
    run_decode("gdn", d, _pool(), DECODE_READ, DECODE_WRITE, backend="torch-ref")
    assert linattn.last_decision().problem.output_state_indices
    with pytest.raises(ValueError, match="state_indices: slot 1 is named by sequence 0 and sequence 1"):
        run_decode("gdn", d, _pool(), DECODE_READ)  # a shared read slot is a write race when written in place
    run_decode("gdn", d, _pool(), DECODE_WRITE)
    assert not linattn.last_decision().problem.output_state_indices


# -- property: the refusals are exactly the rules, and a valid call is the in-place call on a copy ----

def _rule_verdict(read: list, write: list, P: int, his: list | None) -> str | None:
    """docs/ops.md's rules, written out plainly: the first refusal's key phrase, or None."""
    if any(s >= P for s in read):
        return "state_indices"
    if any(s >= P for s in write):
        return "out of range"
    if any((r < 0) != (w < 0) for r, w in zip(read, write)):
        return "same rows"
    live = [w for w in write if w >= 0]
    if len(live) != len(set(live)):
        return "write race"
    for i, r in enumerate(read):
        if r >= 0 and (his is None or his[i]) and any(w == r and j != i for j, w in enumerate(write)):
            return "read by sequence"
    return None


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_validation_refuses_exactly_what_the_rules_say(data):
    n = data.draw(st.integers(1, 5), label="N")
    p = data.draw(st.integers(1, 7), label="P")
    slot = st.integers(-1, p)
    read = data.draw(st.lists(slot, min_size=n, max_size=n), label="read")
    write = data.draw(st.lists(slot, min_size=n, max_size=n), label="write")
    his = data.draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n), label="has_initial_state")
    d = decode_inputs("gdn", n, 1, 1, 2, 4, 4, torch.float32, "cpu", seed=n)
    gen = torch.Generator().manual_seed(p)
    pool = torch.randn(p, 2, 4, 4, generator=gen)
    kw = {} if his is None else {"has_initial_state": torch.tensor(his)}
    got = pool.clone()
    want = _rule_verdict(read, write, p, his)
    if want is not None:
        with pytest.raises(ValueError, match=want):
            run_decode("gdn", d, got, read, write, backend="torch-ref", **kw)
        assert torch.equal(got, pool)  # refused before anything was written
        return
    o = run_decode("gdn", d, got, read, write, backend="torch-ref", **kw)
    fresh = None if his is None else [not h for h in his]
    oracle = forked_pool(pool, read, write, fresh)
    o_want = run_decode("gdn", d, oracle, write, backend="torch-ref", **kw)
    assert torch.equal(o, o_want) and torch.equal(got, oracle)


def test_self_check_runs_separate_slots_and_catches_a_backend_that_writes_in_place():
    """The first-call self-check (unverified archs) builds its case with output_state_indices, so a
    backend that declares the feature but writes where it read fails it (the read slot changed)."""
    from linattn.backends.torch_ref import TorchRefBackend
    from linattn.dispatch.plugin.problem import Problem
    from linattn.dispatch.runtime.self_check import check_against_reference, kernel_class

    class WritesInPlace(TorchRefBackend):
        name = "writes-in-place"
        features = frozenset({"output_state_indices"})

        def gdn_decode(self, *, output_state_indices=None, **kw):
            return super().gdn_decode(**kw)

    p = Problem(op="gdn_decode", h=1, hv=2, k=16, v=32, dtype="float32", output_state_indices=True)
    assert "output_state_indices" in kernel_class(p)
    assert check_against_reference(TorchRefBackend(), p, "cpu").ok
    bad = check_against_reference(WritesInPlace(), p, "cpu")
    assert not bad.ok


def test_output_state_indices_trace_with_torch_compile_fullgraph():
    """The custom op takes the new argument (the pool declared mutated, the fake unchanged): a
    compiled decode gives the eager bits."""
    d = decode_inputs("gdn", N, 1, H, HV, K, V, torch.float32, "cpu")
    read = torch.tensor(DECODE_READ, dtype=torch.int32)
    write = torch.tensor(DECODE_WRITE, dtype=torch.int32)

    def f(q, k, v, a, b, pool, idx, out):
        return linattn.gdn_decode(q, k, v, a, b, d["A_log"], d["dt_bias"], pool, idx, output_state_indices=out)

    p1, p2 = _pool(), _pool()
    args = (d["q"], d["k"], d["v"], d["a"], d["b"])
    o1 = torch.compile(f, fullgraph=True)(*args, p1, read, write)
    o2 = f(*args, p2, read, write)
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    rest = [i for i in range(P) if i not in DECODE_WRITE]
    assert torch.equal(p1[rest], _pool()[rest])


def test_prefill_output_state_indices_trace_with_torch_compile_fullgraph():
    d = prefill_inputs("kda", PREFILL_LENS, H, HV, K, V, torch.float32, "cpu")
    read = torch.tensor([2, 2, 3, -1, 7], dtype=torch.int32)
    write = torch.tensor([6, 5, 3, -1, 0], dtype=torch.int32)

    def f(q, k, v, g, beta, cu, pool, idx, out):
        return linattn.kda_prefill(q, k, v, g, beta, cu, state_pool=pool, state_indices=idx, output_state_indices=out)

    p1, p2 = _pool(), _pool()
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"])
    o1 = torch.compile(f, fullgraph=True)(*args, p1, read, write)
    o2 = f(*args, p2, read, write)
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
    rest = [i for i in range(P) if i not in write.tolist()]
    assert torch.equal(p1[rest], _pool()[rest])


def test_explain_names_the_row_copy_of_the_triton_prefill():
    kw = dict(n=4, t=4096, h=16, hv=32, k=128, v=128, dtype="bfloat16", device="sm90")
    note = {v.backend: v.message for v in linattn.explain("kda_prefill", output_state_indices=True, **kw).verdicts}
    assert "fork_slots" in note["triton-split"]
    plain = {v.backend: v.message for v in linattn.explain("kda_prefill", **kw).verdicts}
    assert "fork_slots" not in plain["triton-split"] and note["triton-split"].startswith(plain["triton-split"])


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fork_slots_copies_bits_only_where_a_state_is_carried(dtype):
    """The prefill's row copy: bitwise (NaN payloads included), through a strided pool view, only for
    rows that read a state and write another slot; every other row untouched."""
    from linattn.kernels.triton.fork_slots import fork_slots

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(2 * P, HV, V, K, generator=gen).to(dtype)
    base[2, 1, 3, 5] = float("nan")
    before = base.clone()
    pool = base[::2]  # slot pitch 2 slots
    read = torch.tensor([1, 1, 3, -1, 4], dtype=torch.int32)
    write = torch.tensor([5, 6, 3, -1, 2], dtype=torch.int64)
    his = torch.tensor([True, True, True, True, False])
    fork_slots(pool, read, write, his)
    want = before[::2].clone()
    want[5], want[6] = before[2], before[2]  # slot 1 of the view is base row 2
    assert torch.equal(bits(pool), bits(want))
    assert torch.equal(bits(base[1::2]), bits(before[1::2]))  # rows between the view's slots


@TRITON
def test_the_fused_value_check_kernel_steps_aside_for_separate_slots(monkeypatch):
    """Where the fused value-check kernel runs (forced here in the interpreter), a call with
    output_state_indices keeps the torch rules (the kernel has no read/write rule): its refusals are
    raised, and a call of the same shapes without it still gets the kernel."""
    from linattn.dispatch.runtime import fast_path
    from linattn.dispatch.rules import value_rules

    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", True)
    fast_path.clear()
    try:
        d = decode_inputs("gdn", 3, 1, H, HV, K, V, torch.float32, "cpu")
        args = dict(q=d["q"], k=d["k"], v=d["v"], a=d["a"], b=d["b"], A_log=d["A_log"], dt_bias=d["dt_bias"],
                    state_pool=_pool(), state_indices=torch.tensor([1, 2, 3], dtype=torch.int32))
        from linattn.dispatch.rules.validate import validate_call, value_rules_of

        nargs, _, dims = validate_call("gdn_decode", args)
        assert value_rules.fused_value_check(value_rules_of("gdn_decode", check_values=True, check_finite=False),
                                             nargs, dims) is not None
        out = torch.tensor([5, 1, 3], dtype=torch.int32)
        nargs, _, dims = validate_call("gdn_decode", dict(args, output_state_indices=torch.tensor([5, 6, 3])))
        assert value_rules.fused_value_check(value_rules_of("gdn_decode", check_values=True, check_finite=False),
                                             nargs, dims) is None
        for _ in range(2):  # the call plan's first and cached runs
            with pytest.raises(ValueError, match="slot 1 is read by sequence 0"):
                linattn.gdn_decode(*[args[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool",
                                                       "state_indices")], output_state_indices=out)
    finally:
        fast_path.clear()
