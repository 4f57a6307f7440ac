"""Replay steps (``launch.ReplayStep``, ``launch_step``, ``SteppedSequence``): a launch that is not a
``@triton.jit`` kernel's is recorded beside the Triton launches of a call and replayed, in order, on a
later call's tensors, with the rules a recorded Triton launch's arguments follow (a tensor must be
one of the call's sources or hold no element; everything else is kept as recorded).

CPU only: stub kernels (Triton's ordinary launch path, the direct launch off) and a fake step.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from linattn.kernels.triton import launch as launch_mod  # noqa: E402


class _Kernel:
    """A ``@triton.jit`` kernel's face for the ordinary launch: ``kernel[grid](*args)`` logs."""

    pre_run_hooks: list = []

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *a, **k: self.log.append((self.name, a))


class _FakeStep:
    """A :class:`launch.ReplayStep` that logs the arguments it is launched with."""

    def __init__(self, log: list):
        self.log = log

    def __call__(self, args: tuple) -> None:
        self.log.append(("step", args))


@pytest.fixture
def log(monkeypatch):
    """The launch log; the direct launch off (every Triton launch is the ordinary ``kernel[grid](...)``)."""
    monkeypatch.setattr(launch_mod, "_decide_status", lambda: (False, "test: ordinary launches"))
    launch_mod.reset_fast_launch()
    yield []
    monkeypatch.undo()
    launch_mod.reset_fast_launch()


def _record(log: list, a: torch.Tensor, b: torch.Tensor, empty: torch.Tensor):
    """A call's launches: a Triton launch on ``a``, the step on ``(b, 7, None, empty, a)``, a Triton launch on ``b``."""
    with launch_mod.recording() as records:
        launch_mod.launch(_Kernel("first", log), (1,), (a, 3), {}, num_warps=4)
        launch_mod.launch_step(_FakeStep(log), (b, 7, None, empty, a))
        launch_mod.launch(_Kernel("last", log), (1,), (b,), {}, num_warps=4)
    return records


def test_a_step_outside_a_recording_runs_at_once(log):
    a = torch.ones(3)
    launch_mod.launch_step(_FakeStep(log), (a, 1))
    assert len(log) == 1 and log[0][0] == "step" and log[0][1][0] is a and log[0][1][1] == 1


def test_a_recorded_step_replays_in_order_on_the_later_calls_tensors(log):
    a, b, empty = torch.ones(4), torch.zeros(2), torch.empty(0)
    records = _record(log, a, b, empty)
    assert not log and [r.__class__ for r in records] == [launch_mod.LaunchRecord, launch_mod.StepRecord,
                                                          launch_mod.LaunchRecord]
    seq = launch_mod.replay_sequence(records, (a, b))
    assert isinstance(seq, launch_mod.SteppedSequence) and len(seq.launches) == 2 and len(seq.steps) == 1
    a2, b2 = torch.full((4,), 2.0), torch.full((2,), 5.0)  # a later call: new tensors, the same signature
    seq((), (a2, b2))
    assert [name for name, _ in log] == ["first", "step", "last"]
    (_, first), (_, step), (_, last) = log
    assert first[0] is a2 and first[1] == 3 and last[0] is b2
    assert step[0] is b2 and step[1:3] == (7, None) and step[3] is empty and step[4] is a2  # constants as recorded


def test_a_step_gets_a_workspace_address_where_the_caller_passes_one(log):
    """A direct replay passes a buffer the caller carved from its workspace as its address (an int)."""
    a, b, empty = torch.ones(4), torch.zeros(2), torch.empty(0)
    seq = launch_mod.replay_sequence(_record(log, a, b, empty), (a, b))
    a2 = torch.ones(4)
    seq((), (a2, 0x7F0000001000), views=lambda: (a2, torch.zeros(2)))
    step = next(args for name, args in log if name == "step")
    assert step[0] == 0x7F0000001000 and step[4] is a2


@pytest.mark.parametrize("stray", ["with elements", "meta"])
def test_a_step_on_a_tensor_that_is_none_of_the_sources_is_not_replayable(log, stray):
    a, b = torch.ones(4), torch.zeros(2)
    other = torch.ones(3) if stray == "with elements" else torch.empty(3, device="meta")
    with launch_mod.recording() as records:
        launch_mod.launch(_Kernel("first", log), (1,), (a,), {}, num_warps=4)
        launch_mod.launch_step(_FakeStep(log), (b, other))
    with pytest.raises(launch_mod.NotReplayable, match=r"shape \(3,\) is none of the call's tensors"):
        launch_mod.replay_sequence(records, (a, b))


def test_one_tensor_at_two_source_positions_is_not_replayable_with_a_step(log):
    a = torch.ones(4)
    with launch_mod.recording() as records:
        launch_mod.launch_step(_FakeStep(log), (a,))
    with pytest.raises(launch_mod.NotReplayable, match="two source positions"):
        launch_mod.replay_sequence(records, (a, a))


def test_a_call_of_triton_launches_only_replays_through_the_plain_launch_sequence(log):
    a = torch.ones(4)
    with launch_mod.recording() as records:
        launch_mod.launch(_Kernel("only", log), (1,), (a,), {}, num_warps=4)
    seq = launch_mod.replay_sequence(records, (a,))
    assert type(seq) is launch_mod.LaunchSequence


def test_a_step_first_or_last_and_two_steps_in_a_row_keep_their_order(log):
    a, b = torch.ones(4), torch.zeros(2)
    with launch_mod.recording() as records:
        launch_mod.launch_step(_FakeStep(log), (a,))
        launch_mod.launch_step(_FakeStep(log), (b,))
        launch_mod.launch(_Kernel("mid", log), (1,), (a, b), {}, num_warps=4)
        launch_mod.launch_step(_FakeStep(log), (b, a))
    a2, b2 = torch.ones(4), torch.zeros(2)
    launch_mod.replay_sequence(records, (a, b))((), (a2, b2))
    assert [(n, tuple(id(x) for x in args)) for n, args in log] == [
        ("step", (id(a2),)), ("step", (id(b2),)), ("mid", (id(a2), id(b2))), ("step", (id(b2), id(a2)))]
