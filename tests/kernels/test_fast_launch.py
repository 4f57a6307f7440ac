"""kernels/triton/launch.py: the fast launch is taken only where it is tested; elsewhere every
launch is Triton's ordinary one. (Fast and ordinary launches agree bitwise on the H200:
benchmarks/host_overhead.py, rows ``fast_vs_ordinary``.)"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from linattn.kernels.triton import launch as launch_mod  # noqa: E402


class _FakeKernel:
    """Records ordinary launches ``kernel[grid](*args, **kw)``."""

    pre_run_hooks: list = []

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.launches.append((grid, args, kw))
        return run


@pytest.fixture(autouse=True)
def _fresh_status():
    launch_mod.reset_fast_launch()
    yield
    launch_mod.reset_fast_launch()


def test_an_untested_triton_version_takes_the_ordinary_launch(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    enabled, why = launch_mod.fast_launch_status()
    assert not enabled and "3.9.0" in why and "3.6.0" in why
    k = _FakeKernel()
    launch_mod.launch(k, (2, 1, 1), (1, 2.0), {"BLOCK": 4}, num_warps=2)
    assert k.launches == [((2, 1, 1), (1, 2.0), {"BLOCK": 4, "num_warps": 2})]
    prepared = launch_mod.PreparedLaunch(k, (3,), {"BLOCK": 8}, (5,), num_warps=1, num_stages=2)
    prepared(("t",))
    assert k.launches[-1] == ((3,), ("t", 5), {"BLOCK": 8, "num_warps": 1, "num_stages": 2})


def test_the_environment_switch_and_the_interpreter_turn_it_off(monkeypatch):
    monkeypatch.setenv("LINATTN_FAST_LAUNCH", "0")
    assert launch_mod.fast_launch_status() == (False, "LINATTN_FAST_LAUNCH=0")
    monkeypatch.delenv("LINATTN_FAST_LAUNCH")
    launch_mod.reset_fast_launch()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    enabled, why = launch_mod.fast_launch_status()
    # under a Triton the fast path is not tested on (make test's second venv) that reason comes first
    untested = triton.__version__ not in launch_mod.FAST_LAUNCH_TRITON_VERSIONS
    assert not enabled and ("TRITON_INTERPRET" in why or "no CUDA" in why or (untested and triton.__version__ in why))


def test_the_argument_order_puts_runtime_arguments_then_constexprs_in_parameter_order():
    from triton.runtime.jit import JITFunction

    from linattn.kernels.triton.decode import _recurrent_decode_kernel

    # the compiled form's parameters (the suite runs kernels in the interpreter on the CPU)
    kernel = JITFunction(getattr(_recurrent_decode_kernel, "fn", _recurrent_decode_kernel))
    params = kernel.params
    runtime = [p for p in params if not p.is_constexpr]
    constexprs = {p.name: i for i, p in enumerate(params) if p.is_constexpr}
    order = launch_mod._argument_order(kernel, len(runtime), constexprs)
    assert order[:len(runtime)] == tuple(range(len(runtime)))
    assert [c[0] for c in order[len(runtime):]] == list(constexprs.values())
    assert launch_mod._argument_order(kernel, len(runtime) - 1, constexprs) is None  # a missing argument
