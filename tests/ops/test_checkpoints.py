"""State checkpoints from prefill (``checkpoint_every`` / ``checkpoint_indices``, issue 32 item 1;
docs/ops.md "State checkpoints") on the CPU: torch-ref and torch-chunked.

Each checkpoint is held to the float64 token-serial reference state after that many tokens and,
bitwise, to a prefill of the same backend stopped there; the outputs and final states bitwise to
the same call without checkpoints; every pool row the call does not write (checkpoint slots past a
sequence's length, a padding sequence's, the read slots with ``output_state_indices``) keeps its
bits. Then the refusals (each before anything is written), and the backends that do not declare
the feature (fla, refused with reason ``feature``; flashinfer: tests/peers/test_flashinfer_slots.py). The Triton prefill:
tests/ops/test_checkpoints_triton.py."""

from __future__ import annotations

import pytest
import torch
from separate_slots_cases import assert_untouched, bits, prefill_fn

import linattn
from linattn.backends.torch_chunked import TorchChunkedBackend
from linattn.dispatch.plugin.verdict import Reason

H, HV, K, V = 1, 2, 16, 16
E = 64  # checkpoint_every
#: sequence lengths: checkpoints inside (130: after 64 and 128; 200: 64, 128), one at exactly the
#: length (64), an empty sequence, one shorter than a checkpoint (10), padding (slot -1)
LENS = [130, 64, 0, 200, 10, 70]
READ = [0, 1, 2, 3, 4, -1]
#: -1: no checkpoint there; slot 12 (sequence 0's third checkpoint, past its length), 9 (the empty
#: sequence's), 13 (the 10-token one's) and 17 (padding's) are named but never written
MARKS = [[5, 6, 12], [7, -1, -1], [9, -1, -1], [10, 11, -1], [13, -1, -1], [17, -1, -1]]
WRITTEN = {(0, 0): 5, (0, 1): 6, (1, 0): 7, (3, 0): 10, (3, 1): 11}
P = 20


def _inputs(family, seed=0, lens=LENS):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    g = -(torch.rand((T, HV, K) if family == "kda" else (T, HV), generator=gen) * 0.1 + 0.005)
    return dict(q=torch.randn(T, H, K, generator=gen), k=torch.randn(T, H, K, generator=gen),
                v=torch.randn(T, HV, V, generator=gen), g=g, beta=torch.rand(T, HV, generator=gen) * 0.9 + 0.05,
                cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))


def _pool(layout="vk", seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*((P, HV, V, K) if layout == "vk" else (P, HV, K, V)), generator=gen) * 0.5


def _cut(d, n, t):
    """Sequence ``n``'s first ``t`` tokens as a call of its own."""
    s = int(d["cu_seqlens"][n])
    out = {name: d[name][s:s + t] for name in ("q", "k", "v", "g", "beta")}
    return dict(out, cu_seqlens=torch.tensor([0, t], dtype=torch.int32))


@pytest.mark.parametrize("backend", ["torch-ref", "torch-chunked"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_checkpoints_are_the_states_after_that_many_tokens(family, backend, layout):
    d, pool, fn = _inputs(family), _pool(layout), prefill_fn(family)
    read, marks = torch.tensor(READ), torch.tensor(MARKS)
    plain = pool.clone()
    o_plain = fn(**d, state_pool=plain, state_indices=read, state_layout=layout, backend=backend)
    p = pool.clone()
    o = fn(**d, state_pool=p, state_indices=read, state_layout=layout, backend=backend, checkpoint_every=E,
           checkpoint_indices=marks)
    assert linattn.last_decision().chosen == backend
    finals = [s for s in READ if s >= 0]
    assert torch.equal(bits(o), bits(o_plain)) and torch.equal(bits(p[finals]), bits(plain[finals]))
    assert_untouched(pool, p, finals + list(WRITTEN.values()))
    ref = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    for (n, j), slot in WRITTEN.items():
        t = (j + 1) * E
        stopped = pool.clone()  # the same backend stopped after t tokens: bitwise the same state
        fn(**_cut(d, n, t), state_pool=stopped, state_indices=torch.tensor([READ[n]]), state_layout=layout,
           backend=backend)
        assert torch.equal(bits(p[slot]), bits(stopped[READ[n]])), (n, j)
        oracle = pool.double()  # the float64 token-serial reference after t tokens
        ref(**{x: y.double() if x != "cu_seqlens" else y for x, y in _cut(d, n, t).items()}, state_pool=oracle,
            state_indices=torch.tensor([READ[n]]), state_layout=layout, backend="torch-ref")
        torch.testing.assert_close(p[slot].double(), oracle[READ[n]], rtol=1e-4, atol=1e-4)
    assert torch.equal(bits(p[7]), bits(p[1]))  # a checkpoint at exactly the length is the final state


@pytest.mark.parametrize("backend", ["torch-ref", "torch-chunked"])
def test_checkpoints_with_fresh_sequences_and_separate_write_slots(backend):
    """has_initial_state False: the checkpoints start from zeros (the NaN read slot is not read);
    output_state_indices: the final states go to their own slots and the read slots keep their bits."""
    d, pool = _inputs("gdn", seed=2), _pool(seed=3)
    pool[3] = float("nan")
    read, out = torch.tensor(READ), torch.tensor([14, 15, 16, 18, 19, -1])
    fresh = torch.tensor([True, True, True, False, True, True])
    p = pool.clone()
    linattn.gdn_prefill(**d, state_pool=p, state_indices=read, output_state_indices=out, has_initial_state=fresh,
                        checkpoint_every=E, checkpoint_indices=torch.tensor(MARKS), backend=backend)
    assert_untouched(pool, p, [14, 15, 16, 18, 19, *WRITTEN.values()])
    for (n, j), slot in WRITTEN.items():
        stopped = pool.clone()
        linattn.gdn_prefill(**_cut(d, n, (j + 1) * E), state_pool=stopped, state_indices=torch.tensor([READ[n]]),
                            has_initial_state=fresh[n:n + 1], backend=backend)
        assert torch.equal(bits(p[slot]), bits(stopped[READ[n]])) and bool(torch.isfinite(p[slot]).all())


def test_checkpoint_every_128_and_int32_table():
    d, pool = _inputs("kda", seed=4, lens=[300, 128]), _pool(seed=5)
    p = pool.clone()
    linattn.kda_prefill(**d, state_pool=p, state_indices=torch.tensor([0, 1]), checkpoint_every=128,
                        checkpoint_indices=torch.tensor([[2, 3, 4], [5, 6, -1]], dtype=torch.int32),
                        backend="torch-chunked")
    assert_untouched(pool, p, [0, 1, 2, 3, 5])  # slot 4 (after 384 > 300 tokens) and 6 (256 > 128) not written
    assert torch.equal(bits(p[5]), bits(p[1]))
    for slot, t in ((2, 128), (3, 256)):
        stopped = pool.clone()
        linattn.kda_prefill(**_cut(d, 0, t), state_pool=stopped, state_indices=torch.tensor([0]),
                            backend="torch-chunked")
        assert torch.equal(bits(p[slot]), bits(stopped[0]))


def _refused(match, **kw):
    d, pool = _inputs("gdn", lens=[130, 64]), _pool()
    p = pool.clone()
    args = dict(state_pool=p, state_indices=torch.tensor([0, 1]), checkpoint_every=E,
                checkpoint_indices=torch.tensor([[2, 3], [4, -1]]), backend="torch-ref")
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=match):
        linattn.gdn_prefill(**d, **{k: v for k, v in args.items() if v is not ...})
    assert torch.equal(bits(p), bits(pool))  # nothing written


@pytest.mark.parametrize("kw, match", [
    (dict(checkpoint_indices=...), "without checkpoint_indices"),
    (dict(checkpoint_every=...), "without checkpoint_every"),
    (dict(checkpoint_every=32), "positive multiple of the chunk"),
    (dict(checkpoint_every=0), "positive multiple of the chunk"),
    (dict(checkpoint_every=64.0), "positive multiple of the chunk"),
    (dict(checkpoint_indices=torch.tensor([2, 4])), r"\[N, max_checkpoints\]"),
    (dict(checkpoint_indices=torch.tensor([[2, 3]])), r"\[N, max_checkpoints\]"),
    (dict(checkpoint_indices=torch.tensor([[2.0, 3.0], [4.0, -1.0]])), "dtype"),
    (dict(checkpoint_indices=torch.tensor([[2, 20], [4, -1]])), "out of range"),
    (dict(checkpoint_indices=torch.tensor([[2, 3], [3, -1]])), "slot 3 is written twice"),
    (dict(checkpoint_indices=torch.tensor([[2, 3], [1, -1]])), "slot 1 is written twice"),
    (dict(output_state_indices=torch.tensor([5, 4])), "slot 4 is written twice"),
    (dict(output_state_indices=torch.tensor([5, 6]), checkpoint_indices=torch.tensor([[2, 0], [4, -1]])),
     "slot 0 is read by sequence 0"),
])
def test_refusals_before_anything_is_written(kw, match):
    _refused(match, **kw)


def test_dense_mode_refuses_checkpoints():
    d = _inputs("gdn", lens=[130])
    with pytest.raises(ValueError, match="pool mode"):
        linattn.gdn_prefill(**d, checkpoint_every=E, checkpoint_indices=torch.tensor([[2, 3]]))


def test_a_cached_call_plan_still_checks_the_checkpoints():
    """The fast path's cached plan of a good call: a second call that differs only in its checkpoint
    slots or its checkpoint_every is still refused."""
    d, pool = _inputs("gdn", lens=[130, 64]), _pool()
    kw = dict(state_pool=pool.clone(), state_indices=torch.tensor([0, 1]), backend="torch-ref")
    for _ in range(2):
        linattn.gdn_prefill(**d, **kw, checkpoint_every=E, checkpoint_indices=torch.tensor([[2, 3], [4, -1]]))
    _refused("slot 2 is written twice", checkpoint_indices=torch.tensor([[2, 2], [4, -1]]))
    _refused("positive multiple", checkpoint_every=96)


@pytest.mark.parametrize("backend", ["triton-split", "triton-folded", "cutedsl"])
def test_kernel_backends_declare_checkpoints(backend):
    """The Triton and CuTe DSL prefills write checkpoints in their state loops
    (tests/ops/test_checkpoints_triton.py; the CuTe DSL kernel: tests/cutedsl, tests/gpu): never
    refused for them with reason ``feature``."""
    kw = dict(n=4, t=4096, h=16, hv=32, k=128, v=128, dtype="bfloat16", mode="pool")
    verdict = {v.backend: v for v in linattn.explain("gdn_prefill", "sm90", checkpoints=True, **kw).verdicts}[backend]
    assert getattr(verdict, "reason", None) != Reason.FEATURE, verdict


def test_fla_is_refused_with_reason_feature_and_flashinfer_declares_checkpoints():
    """fla does not write checkpoints (refused, reason ``feature``); flashinfer's prefill does, through
    FlashInfer's checkpoint_state_indices (tests/peers/test_flashinfer_slots.py; GPU:
    tests/gpu/test_checkpoints_gpu.py)."""
    from linattn.backends.fla import FLABackend
    from linattn.backends.flashinfer import FlashInferBackend
    from linattn.dispatch.plugin.problem import Problem

    p = Problem(op="kda_prefill", n=4, t=256, h=1, hv=2, k=64, v=64, mode="pool", checkpoints=True)
    check = FLABackend().supports_features(p, None)
    assert not check.ok and check.reason == Reason.FEATURE and "'checkpoints'" in check.message
    assert FLABackend().supports_features(p.model_copy(update={"checkpoints": False}), None).ok
    assert FlashInferBackend().supports_features(p.model_copy(update={"op": "gdn_prefill"}), None).ok


def test_fake_gives_the_output_shape_with_checkpoints():
    from torch._subclasses.fake_tensor import FakeTensorMode

    d = _inputs("gdn", lens=[130, 64])
    with FakeTensorMode() as mode:
        fd = {n: mode.from_tensor(x) for n, x in d.items()}
        pool = mode.from_tensor(_pool())
        o, final = torch.ops.linattn.gdn_prefill(fd["q"], fd["k"], fd["v"], fd["g"], fd["beta"], fd["cu_seqlens"],
                                                 pool, mode.from_tensor(torch.tensor([0, 1])), None, None, True, "vk",
                                                 "", True, False, None, None, E,
                                                 mode.from_tensor(torch.tensor([[2, 3], [4, -1]])))
    assert tuple(o.shape) == (194, HV, V) and tuple(final.shape) == (0,)


class _DropsCheckpoints(TorchChunkedBackend):
    """Declares checkpoints and writes none: the conformance case must fail."""

    name = "drops-checkpoints"
    features = TorchChunkedBackend.features

    def rank(self, p, caps) -> int:
        return 900

    def prefill(self, call):
        return super().prefill(call.replace(checkpoint_every=None, checkpoint_indices=None))


class _FinalStateCheckpoints(_DropsCheckpoints):
    """Declares checkpoints and writes each sequence's final state there: the case must fail."""

    name = "final-state-checkpoints"
    features = TorchChunkedBackend.features

    def prefill(self, call):
        out = super().prefill(call)
        for n, row in enumerate([] if call.checkpoint_indices is None else call.checkpoint_indices.tolist()):
            for slot in row:
                if slot >= 0 and int(call.state_indices[n]) >= 0:
                    call.state_pool[slot].copy_(call.state_pool[int(call.state_indices[n])])
        return out


@pytest.mark.parametrize("cls, message", [(_DropsCheckpoints, "state_pool[owned slots]"),
                                          (_FinalStateCheckpoints, "not bitwise equal")])
def test_conformance_case_catches_wrong_checkpoints(registry, cls, message):
    from linattn.dispatch import resolve_device
    from linattn.dispatch.plugin.hookspecs import BackendPlugin
    from linattn.testing import generate_cases
    from linattn.testing.runner import run_case

    registry.add_plugin(BackendPlugin(cls), name=cls.name, distribution="tests")
    good = [c for c in generate_cases(registry.backends["torch-chunked"], ops=["gdn_prefill"], kinds=["pool"],
                                      caps=resolve_device(torch.device("cpu"))) if "/checkpoints[" in c.id]
    assert len(good) == 1 and run_case(good[0], "cpu").status == "passed"
    case = [c for c in generate_cases(registry.backends[cls.name], ops=["gdn_prefill"], kinds=["pool"],
                                      caps=resolve_device(torch.device("cpu"))) if "/checkpoints[" in c.id]
    assert len(case) == 1
    result = run_case(case[0], "cpu")
    assert result.status == "failed" and message in result.message, result.message


@pytest.mark.parametrize("backend", ["torch-ref", "torch-chunked"])
def test_only_checkpoints_at_the_sequence_ends(backend):
    """Every sequence 64 tokens long, a checkpoint at each one's length: each equals its final state."""
    d, pool = _inputs("gdn", seed=6, lens=[64] * 5), _pool(seed=7)
    p = pool.clone()
    linattn.gdn_prefill(**d, state_pool=p, state_indices=torch.arange(5), checkpoint_every=E,
                        checkpoint_indices=torch.arange(10, 15).view(5, 1), backend=backend)
    assert_untouched(pool, p, list(range(5)) + list(range(10, 15)))
    assert torch.equal(bits(p[10:15]), bits(p[0:5]))


def test_a_new_length_of_a_cached_class_checks_the_checkpoint_rows():
    """The fast path's class plan (a new N of a known class) still checks ``checkpoint_indices.shape[0]
    == N``: the table's rows are a length argument of the class key."""
    kw = dict(state_pool=_pool(), checkpoint_every=E, backend="torch-chunked")
    for _ in range(2):
        linattn.gdn_prefill(**_inputs("gdn", lens=[64] * 5), state_indices=torch.arange(5),
                            checkpoint_indices=torch.arange(10, 15).view(5, 1), **kw)
    before = kw["state_pool"].clone()
    with pytest.raises(ValueError, match=r"N = 6 \(one row per sequence\), got \[5, 1\]"):
        linattn.gdn_prefill(**_inputs("gdn", lens=[64] * 6), state_indices=torch.arange(6),
                            checkpoint_indices=torch.arange(10, 15).view(5, 1), **kw)
    assert torch.equal(bits(kw["state_pool"]), bits(before))


@pytest.mark.parametrize("separate", [False, True])
def test_self_check_runs_checkpoints_and_catches_a_backend_that_drops_them(separate):
    """The first-call self-check (unverified archs) builds its prefill case with checkpoints (with and
    without output_state_indices), so a backend that declares the feature and drops them fails it."""
    from linattn.dispatch.plugin.problem import Problem
    from linattn.dispatch.runtime.self_check import check_against_reference, kernel_class

    p = Problem(op="kda_prefill", h=1, hv=2, k=16, v=16, dtype="float32", mode="pool", checkpoints=True,
                output_state_indices=separate)
    assert "checkpoints" in kernel_class(p)
    for good in ("torch-ref", "torch-chunked"):
        result = check_against_reference(linattn.dispatch.get_registry().backends[good], p, "cpu")
        assert result.ok, result.message
    assert not check_against_reference(_DropsCheckpoints(), p, "cpu").ok


def test_explain_names_the_checkpoints_in_torch_chunkeds_plan():
    kw = dict(n=4, t=4096, h=16, hv=32, k=128, v=128, dtype="bfloat16", mode="pool")
    note = {v.backend: v.message for v in linattn.explain("gdn_prefill", "cpu", checkpoints=True, **kw).verdicts}
    plain = {v.backend: v.message for v in linattn.explain("gdn_prefill", "cpu", **kw).verdicts}
    assert "checkpoint_every boundary" in note["torch-chunked"] and "checkpoint" not in plain["torch-chunked"]
