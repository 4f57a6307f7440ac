"""The chunked prefill's recorded launches (``prefill.PrefillLaunch``, ``launch.LaunchSequence``):
a call of a recorded signature replays the stages' launches on its own tensors, with the bits
the stages run one by one give, and takes Triton's ordinary launch where the direct one is off.

Outputs run in the interpreter (small shapes, bf16: GDN's grouped path with the gates kernel, and
KDA's state kernel that writes the output); the direct launch, which needs a GPU, is checked with
stub kernels for the arguments it passes.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

triton = pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled  # noqa: E402
from linattn.kernels.triton import chunk_fused, chunk_intra, chunk_output, chunk_state  # noqa: E402
from linattn.kernels.triton import chunk_tables as tables_mod  # noqa: E402
from linattn.kernels.triton import launch as launch_mod  # noqa: E402
from linattn.kernels.triton import prefill as pm  # noqa: E402

from prefill_cases import make_inputs, random_states  # noqa: E402

LENS, H, HV, K, V, P = [70, 0, 5, 9], 1, 2, 64, 64, 6
#: a padding row (-1) and slots the call does not own (1, 3, 5)
SLOTS = torch.tensor([4, 2, -1, 0], dtype=torch.int32)
RUNS_KERNELS = pytest.mark.skipif(not interpreter_enabled(), reason="runs kernels in the interpreter (TRITON_INTERPRET=1)")
MODES = ["pool", "pool+has_init", "dense+h0"]


def _call(family: str, mode: str, seed: int, **over) -> dict:
    """run_prefill's keyword arguments for one call (bf16 q/k/v, fp32 states)."""
    kw = make_inputs(family, LENS, H=H, HV=HV, K=K, V=V, dtype=torch.bfloat16, seed=seed)
    if mode.startswith("pool"):
        kw.update(state_pool=random_states(P, HV, K, V, seed=seed), state_indices=SLOTS)
        if mode == "pool+has_init":
            kw["has_initial_state"] = torch.tensor([True, False, True, False])
    else:
        kw["initial_state"] = random_states(len(LENS), HV, K, V, seed=seed)
    kw["scale"] = 0.125
    kw.update(over)
    return kw


def _plan(family: str, kw: dict) -> pm.PrefillPlan:
    keys = ("q", "v", "cu_seqlens", "state_pool", "state_indices", "initial_state", "has_initial_state")
    return pm.plan_prefill(family, **{n: kw[n] for n in keys if n in kw})


def _clone(kw: dict) -> dict:
    """``kw`` with a copy of the pool (written in place); the read-only inputs as given (their strides kept)."""
    return dict(kw, state_pool=kw["state_pool"].clone()) if "state_pool" in kw else dict(kw)


def _one_by_one(monkeypatch, plan: pm.PrefillPlan, kw: dict):
    """run_prefill with the stages run one by one (no recorded launches), on a copy of the pool."""
    kw = _clone(kw)
    with monkeypatch.context() as m:
        m.setattr(pm.PrefillPlan, "replayable", property(lambda self: False))
        o, final = pm.run_prefill(plan, **kw)
    return o, final, kw.get("state_pool")


def _assert_same(got, want, kw_before: dict) -> None:
    (o, final, pool), (o_ref, final_ref, pool_ref) = got, want
    assert torch.equal(o, o_ref)
    assert (final is None) == (final_ref is None) and (final is None or torch.equal(final, final_ref))
    if pool is not None:
        assert torch.equal(pool, pool_ref)
        owned = set(SLOTS[SLOTS >= 0].tolist())
        for slot in set(range(P)) - owned:  # rows the call does not own: bitwise as given
            assert torch.equal(pool[slot], kw_before["state_pool"][slot])
        cu = kw_before["cu_seqlens"]
        for n in (SLOTS < 0).nonzero().flatten().tolist():  # padding: zero output rows
            assert not o[cu[n]:cu[n + 1]].any()


def _replay(plan: pm.PrefillPlan, kw: dict):
    """run_prefill on ``kw`` (a copy of its pool): ``(o, final state, pool)``."""
    kw = _clone(kw)
    o, final = pm.run_prefill(plan, **kw)
    return o, final, kw.get("state_pool")


def _first_then_replayed(plan: pm.PrefillPlan, kw: dict):
    """A new signature's first call (stage by stage) and its second (recorded, replayed), on ``kw``."""
    first = _replay(plan, kw)
    assert plan.launches[pm.run._call_signature(_tensors(kw), kw["scale"])] is pm.run._SEEN_ONCE
    return _replay(plan, kw), first


def _tensors(kw: dict) -> tuple:
    names = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state",
             "has_initial_state")
    return tuple(kw.get(n) for n in names)


@RUNS_KERNELS
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("mode", MODES)
def test_a_recorded_signature_replays_with_the_bits_of_the_stages_run_one_by_one(monkeypatch, family, mode):
    first = _call(family, mode, seed=1)
    plan = _plan(family, first)
    assert plan.replayable
    _assert_same(*_first_then_replayed(plan, first), first)
    (recorded,) = plan.launches.values()
    assert isinstance(recorded, pm.PrefillLaunch)
    second = _call(family, mode, seed=2)  # new tensors and values, the same signature: a hit
    _assert_same(_replay(plan, second), _one_by_one(monkeypatch, plan, second), second)
    assert list(plan.launches.values()) == [recorded]


@RUNS_KERNELS
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_another_signature_is_recorded_anew_and_strided_inputs_are_copied_as_before(family):
    base = _call(family, "pool", seed=3)
    plan = _plan(family, base)
    _first_then_replayed(plan, base)
    wide = make_inputs(family, LENS, H=2 * H, HV=2 * HV, K=K, V=V, dtype=torch.bfloat16, seed=4)
    # other strides: q, k and v views of wider tensors; g (KDA) with a channel stride of 2
    g = torch.stack([base["g"], base["g"]], dim=-1)[..., 0] if family == "kda" else base["g"]
    other = dict(base, q=wide["q"][:, :H], k=wide["k"][:, :H], v=wide["v"][:, ::2], g=g)
    assert other["q"].stride() != base["q"].stride() and other["v"].stride(-1) == 1
    assert family == "gdn" or other["g"].stride(-1) == 2
    _assert_same(*_first_then_replayed(plan, other), other)
    rescaled = dict(base, scale=0.25)
    _assert_same(*_first_then_replayed(plan, rescaled), rescaled)
    assert len(plan.launches) == 3 and all(isinstance(r, pm.PrefillLaunch) for r in plan.launches.values())
    run = list(plan.launches.values())[1]
    assert run.copies == ((False,) * 5 if family == "gdn" else (False,) * 3 + (True, False))


@RUNS_KERNELS
def test_one_tensor_passed_as_two_arguments_runs_the_stages_one_by_one(monkeypatch):
    kw = _call("gdn", "pool", seed=5)
    kw["k"] = kw["q"]
    plan = _plan("gdn", kw)
    _assert_same(*_first_then_replayed(plan, kw), kw)
    assert list(plan.launches.values()) == [None]
    later = dict(kw, q=kw["q"].clone())  # the same signature, two tensors: still one by one, still exact
    _assert_same(_replay(plan, later), _one_by_one(monkeypatch, plan, later), later)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_recorded_launch_keeps_none_of_the_recording_calls_tensors(family):
    """A replay holds the launches' kernels, grids and constants, not the recording call's inputs or
    pool: a plan cached per call key must not keep an earlier call's device memory alive."""
    import gc
    import weakref

    kw = _call(family, "pool+has_init", seed=6, state_indices=SLOTS.clone())  # SLOTS itself is module-held
    plan = _plan(family, kw)
    run = pm.PrefillLaunch(plan, _tensors(kw), kw["scale"])  # records; launches nothing
    refs = {n: weakref.ref(t) for n, t in kw.items() if isinstance(t, torch.Tensor)}
    del kw
    gc.collect()
    assert [n for n, r in refs.items() if r() is not None] == []
    assert len(run.sequence.launches) >= 3


def test_a_plan_of_segments_or_of_no_token_is_not_replayed():
    kw = _call("gdn", "pool", seed=6)
    keys = dict(q=kw["q"], v=kw["v"], cu_seqlens=kw["cu_seqlens"], state_pool=kw["state_pool"],
                state_indices=SLOTS)
    assert not pm.plan_prefill("gdn", **keys, segment_chunks=2).replayable
    empty = make_inputs("gdn", [0, 0], H=H, HV=HV, K=K, V=V)
    assert not pm.plan_prefill("gdn", q=empty["q"], v=empty["v"], cu_seqlens=empty["cu_seqlens"]).replayable


# -- the direct launch, with stub kernels ------------------------------------------------------------

class _StubCompiled:
    function, packed_metadata = 0, None

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def run(self, *args):
        self.log.append(("direct", self.name, args[9:]))


class _StubKernel:
    """A ``@triton.jit`` kernel's parameters; ``kernel[grid](...)`` records and returns a stub compiled kernel."""

    pre_run_hooks: list = []

    def __init__(self, real, log: list):
        from triton.runtime.jit import JITFunction

        fn = getattr(real, "fn", real)
        self.params, self.log = JITFunction(fn).params, log
        self.compiled = _StubCompiled(log, fn.__name__)

    def __getitem__(self, grid):
        def ordinary(*args, **kw):
            self.log.append(("ordinary", self.compiled.name, self._full(args, kw)))
            return self.compiled
        return ordinary

    def _full(self, args: tuple, kw: dict) -> tuple:
        """Every parameter's value in order, as the compiled kernel's launcher takes them."""
        it = iter(args)
        return tuple(kw[p.name] if p.name in kw else next(it) if not p.is_constexpr else p.default
                     for p in self.params)


@pytest.fixture
def stubbed(monkeypatch):
    """The prefill's kernels stubbed; the direct launch on unless LINATTN_FAST_LAUNCH=0. Yields the launch log."""
    log: list = []
    for mod, names in ((chunk_intra, ("chunk_intra_kernel", "chunk_kda_system_kernel")),
                       (chunk_state, ("chunk_gdn_gates_kernel", "chunk_state_kernel")),
                       (chunk_output, ("chunk_output_kernel", "chunk_output_grouped_kernel")),
                       (tables_mod, ("chunk_tables_kernel",)),
                       (chunk_fused, ("chunk_gdn_fused_prep_kernel", "chunk_gdn_fused_kernel"))):
        for name in names:
            monkeypatch.setattr(mod, name, _StubKernel(getattr(mod, name), log))
    real_status = launch_mod._decide_status
    monkeypatch.setattr(launch_mod, "_decide_status",
                        lambda: real_status() if real_status()[1] == "LINATTN_FAST_LAUNCH=0" else (True, "stubbed"))
    monkeypatch.setattr(launch_mod, "_current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    launch_mod.reset_fast_launch()
    yield log
    monkeypatch.undo()
    launch_mod.reset_fast_launch()


def _normalised(args: tuple, tensors: dict, base: Optional[int]) -> tuple:
    """A launch's arguments with the caller's tensors by name, the rest as given, except the
    buffers the call allocated: with ``base`` (a replay's workspace) by their offset in it, views
    and addresses alike; without, by dtype, shape, strides and 16-byte alignment."""
    names = {id(t): n for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    flags = tensors.get("has_initial_state")
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if id(a) in names:
                out.append(names[id(a)])
            elif flags is not None and a.dtype == torch.uint8 and a.untyped_storage().data_ptr() == flags.data_ptr():
                out.append("has_initial_state")  # the flags' byte view (ordinary launch)
            elif base is not None and a.untyped_storage().data_ptr() == base:  # empty ones too
                out.append(("workspace", a.data_ptr() - base))
            else:
                out.append(("buffer", a.dtype, tuple(a.shape), a.stride(), a.data_ptr() % 16 == 0))
        elif base is not None and isinstance(a, int) and not isinstance(a, bool) and base <= a < base + 2**40:
            out.append(("workspace", a - base))
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("mode", MODES)
def test_a_replay_passes_the_arguments_of_the_stages_run_one_by_one(stubbed, monkeypatch, family, mode):
    """Call 1 runs the stages one by one, call 2 records and replays them with Triton's ordinary
    launch (compiling: launch()'s cache is emptied first), calls 3 and 4 launch directly: the same
    kernels with the same arguments,
    the allocated buffers aside (same dtype, shape, strides and alignment; in a replay, the same
    offsets in its workspace, whether passed as views or as addresses)."""
    kw = _call(family, mode, seed=7)
    plan = _plan(family, kw)
    bases = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _note_workspace(real_empty(*a, **k), bases))
    calls = []  # per call: its launches, its tensors by name, its workspace's address (None: none)
    for i in range(4):
        del bases[:], stubbed[:]
        if i == 1:
            launch_mod._compiled.clear()  # as if call 1's kernels were not compiled: the replay compiles
        o, final = pm.run_prefill(plan, **kw)
        calls.append((list(stubbed), dict(kw, o=o, final=final), bases[-1] if bases else None))
    kernels = {"gdn": ["chunk_tables_kernel", "chunk_intra_kernel", "chunk_gdn_gates_kernel", "chunk_state_kernel",
                       "chunk_output_grouped_kernel"],
               "kda": ["chunk_tables_kernel", "chunk_kda_system_kernel", "chunk_intra_kernel", "chunk_state_kernel"]}
    for (launches, _, _), how in zip(calls, ("ordinary", "ordinary", "direct", "direct")):
        assert [(h, name) for h, name, _ in launches] == [(how, n) for n in kernels[family]]
    assert calls[0][2] is None and None not in [base for *_, base in calls[1:]]

    def normalised(call, by_offset: bool) -> list:
        launches, tensors, base = call
        return [(name, _normalised(args, tensors, base if by_offset else None)) for _, name, args in launches]
    assert normalised(calls[1], False) == normalised(calls[0], False)  # the replay's buffers as the stages make them
    assert normalised(calls[2], True) == normalised(calls[1], True) == normalised(calls[3], True)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_a_new_recording_launches_directly_the_kernels_compiled_before(stubbed, family):
    """A sequence recorded for a new plan (a new prefill bucket, issue 28) finds in launch()'s cache
    the kernels other calls compiled (``LaunchSequence._shared``): its first replay is direct."""
    kw = _call(family, "pool", seed=9)
    pm.run_prefill(_plan(family, kw), **kw)  # stage by stage: Triton's ordinary launch compiles
    del stubbed[:]
    other = _plan(family, kw)  # a plan of its own (what a new bucket makes), the same kernel classes
    for _ in range(2):
        pm.run_prefill(other, **kw)  # stage by stage through launch()'s cache, then recorded and replayed
    assert {how for how, *_ in stubbed} == {"direct"}
    assert isinstance(next(iter(other.launches.values())), pm.PrefillLaunch)


def _note_workspace(t: torch.Tensor, bases: list) -> torch.Tensor:
    if t.dtype == torch.uint8 and t.dim() == 1 and t.numel():
        bases.append(t.data_ptr())
    return t


def test_with_the_fast_launch_off_every_replay_is_an_ordinary_launch(stubbed, monkeypatch):
    monkeypatch.setenv("LINATTN_FAST_LAUNCH", "0")
    launch_mod.reset_fast_launch()
    assert launch_mod.fast_launch_status() == (False, "LINATTN_FAST_LAUNCH=0")
    kw = _call("gdn", "pool", seed=8)
    plan = _plan("gdn", kw)
    for _ in range(4):  # the stages one by one, then recorded, then replayed twice
        pm.run_prefill(plan, **kw)
    assert len(plan.launches) == 1 and {how for how, *_ in stubbed} == {"ordinary"} and len(stubbed) == 20
    (run,) = plan.launches.values()
    assert not run.sequence._compiled  # nothing kept for a direct launch


def test_launch_records_instead_of_launching_inside_recording_only():
    seen = []

    class _Kernel:
        pre_run_hooks: list = []

        def __getitem__(self, grid):
            return lambda *a, **k: seen.append((grid, a, k))

    with launch_mod.recording() as records:
        launch_mod.launch(_Kernel(), (2,), (1, None), {"B": 4}, num_warps=2)
    assert not seen and records == [launch_mod.LaunchRecord(records[0].kernel, (2,), (1, None), {"B": 4},
                                                            {"num_warps": 2})]
    launch_mod.launch(_Kernel(), (2,), (1, None), {"B": 4}, num_warps=2)
    assert len(seen) == 1 or launch_mod.fast_launch_status()[0]


class _FakeWalk:
    """A non-Triton walk step (``launch.ReplayStep``), logged as the stub kernels log their launches."""

    def __init__(self, log: list):
        self.log = log

    def __call__(self, args: tuple) -> None:
        self.log.append(("step", "walk", args))


@pytest.mark.parametrize("mode", MODES)
def test_a_fused_prefill_with_a_walk_step_replays_it_on_each_calls_buffers(stubbed, monkeypatch, mode):
    """The fused GDN prefill with its walk a :class:`launch.ReplayStep` (as the CuTe DSL walk is): call
    1 runs it stage by stage, call 2 records the prep and the step and replays them, calls 3 and 4 replay
    on new tensors of the signature; the step gets each call's own tensors and its workspace's buffers
    at the offsets of the recorded call, after the prep, in place of the Triton walk."""
    import dataclasses

    from linattn.kernels.cutedsl import fused_walk as fw

    plan = pm.plan_prefill("gdn", **{n: v for n, v in _call("gdn", mode, seed=10).items()
                                     if n in ("q", "v", "cu_seqlens", "state_pool", "state_indices",
                                              "initial_state", "has_initial_state")}, fused=True)
    plan = dataclasses.replace(plan, fused_walk=fw.WalkChoice("wgmma", 64, "test: a CuTe DSL walk"))
    assert plan.fused is not None and plan.replayable

    def fake_walk(plan_, x, b, st):
        from linattn.kernels.triton.launch import launch_step

        launch_step(_FakeWalk(stubbed), (x.q, x.v, b.fused_tmb, b.fused_qs, b.o, st.ht, st.state_indices, 5))
        return True
    monkeypatch.setattr(fw, "run_for_plan", fake_walk)
    bases = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _note_workspace(real_empty(*a, **k), bases))
    calls = []
    for seed in (11, 11, 12, 13):  # 12, 13: new tensors (and values) of the same signature
        kw = _call("gdn", mode, seed=seed)
        del bases[:], stubbed[:]
        o, final = pm.run_prefill(plan, **kw)
        calls.append((list(stubbed), dict(kw, o=o, final=final), bases[-1] if bases else None))
    for launches, _, _ in calls:
        assert [name for _, name, _ in launches] == ["chunk_tables_kernel", "chunk_gdn_fused_prep_kernel", "walk"]
    (run,) = plan.launches.values()
    assert isinstance(run, pm.PrefillLaunch) and isinstance(run.sequence, launch_mod.SteppedSequence)

    def step_args(call, by_offset: bool):
        launches, tensors, base = call
        return _normalised(launches[-1][2], tensors, base if by_offset else None)
    first = step_args(calls[0], False)
    assert first[:2] == ("q", "v") and first[4] == "o" and first[-1] == 5
    assert step_args(calls[1], True) == step_args(calls[2], True) == step_args(calls[3], True)
    assert [a for a in step_args(calls[2], True) if isinstance(a, tuple)] == [a for a in step_args(calls[1], True)
                                                                             if isinstance(a, tuple)]
    assert all(isinstance(a, tuple) and a[0] == "workspace" for a in step_args(calls[2], True)[2:4])
