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
    # under a Triton the fast path is not tested on (e.g. 3.9, the main venv's) that reason comes first
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


# -- issue 28: a new int argument of the same specialization reuses the compiled kernel -------------

class _Param:
    def __init__(self, name: str, constexpr: bool = False):
        self.name, self.is_constexpr, self.has_default, self.default = name, constexpr, False, None


class _Compiled:
    function, packed_metadata = 0, object()

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args[9:])  # the kernel's own arguments (after grid, stream, function, metadata, hooks)


class _CompilingKernel:
    """Ordinary launches return one compiled stand-in per launch (as Triton returns its kernel)."""

    pre_run_hooks: list = []

    def __init__(self):
        self.params = [_Param("x"), _Param("n"), _Param("BLOCK", constexpr=True)]
        self.ordinary = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.ordinary.append(args)
            return _Compiled()
        return run


@pytest.fixture
def fast(monkeypatch):
    """The fast path as on CUDA (status, device and stream stubbed) with an empty compiled cache."""
    import torch

    monkeypatch.setattr(launch_mod, "fast_launch_status", lambda: (True, "test"))
    monkeypatch.setattr(launch_mod, "_current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    monkeypatch.setattr(launch_mod, "_compiled", {})


def test_int_classes_split_exactly_where_triton_specializes():
    import random

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    def triton_key(v):
        return native_specialize_impl(BaseBackend, v, False, True, True)

    rng = random.Random(0)
    values = [0, 1, 2, 15, 16, 17, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**32, 2**63 - 16, 2**63, 2**64 - 16]
    values += [rng.randrange(-2**40, 2**40) for _ in range(300)] + [16 * rng.randrange(1, 10**6) for _ in range(100)]
    by_class: dict = {}
    for v in values:
        by_class.setdefault(launch_mod._int_class(v), set()).add(triton_key(v))
    assert all(len(keys) == 1 for keys in by_class.values()), by_class


def test_a_new_int_of_the_same_class_launches_directly(fast):
    import torch

    k, x = _CompilingKernel(), torch.zeros(4)
    for n in (100, 132, 164):  # one class: i32, not a multiple of 16, not 1
        launch_mod.launch(k, (n,), (x, n), {"BLOCK": 8}, num_warps=4)
    assert len(k.ordinary) == 1  # the first compiled; the others ran its launcher
    (compiled, _), = launch_mod._compiled.values()
    assert [r[1] for r in compiled.runs] == [132, 164]  # with their own value
    launch_mod.launch(k, (1,), (x, 160), {"BLOCK": 8}, num_warps=4)  # a multiple of 16: another class
    assert len(k.ordinary) == 2


def test_a_prepared_launch_reuses_a_kernel_compiled_for_other_scalars(fast):
    import torch

    k, x = _CompilingKernel(), torch.zeros(4)
    launch_mod.PreparedLaunch(k, (2,), {"BLOCK": 8}, (7,), num_warps=4)((x,))
    assert len(k.ordinary) == 1
    other = launch_mod.PreparedLaunch(k, (3,), {"BLOCK": 8}, (9,), num_warps=4)  # e.g. a new decode batch
    other((x,))
    other((x,))
    assert len(k.ordinary) == 1  # both calls direct, on the first plan's compiled kernel
    (compiled, _), = launch_mod._compiled.values()
    assert [r[1] for r in compiled.runs] == [9, 9]


def test_a_launch_with_other_scalars_of_the_same_class_shares_the_compiled_kernel(fast):
    """with_scalars (a value check of a new T or N): derived before the first launch, it runs the
    kernel that launch compiled directly, with its own scalars and grid, without the shared cache;
    a scalar of another specialization (a multiple of 16 here) takes the ordinary launch."""
    import torch

    k, x = _CompilingKernel(), torch.zeros(4)
    base = launch_mod.PreparedLaunch(k, (2,), {"BLOCK": 8}, (7,), num_warps=4)
    same, other = base.with_scalars((9,), (5,)), base.with_scalars((16,))
    assert same.grid == (5,) and same.scalars == (9,) and other.grid == (2,) and base.scalars == (7,)
    base((x,))
    assert len(k.ordinary) == 1
    launch_mod._compiled.clear()  # only the launch's own compiled kernels are left
    same((x,))
    assert len(k.ordinary) == 1
    (compiled,) = [c for key, c in base._compiled.items() if key is not launch_mod._REST]
    assert [r[1] for r in compiled.runs] == [9] and compiled.runs[0][2] == 8  # its scalar, then BLOCK
    other((x,))
    assert len(k.ordinary) == 2 and k.ordinary[-1][1] == 16
    assert launch_mod.PreparedLaunch(k, (2,), {"BLOCK": 8}, (True,), num_warps=4).with_scalars((False,))._compiled == {}


def test_rocm_takes_the_ordinary_launch(monkeypatch):
    """Triton's HIP backend also specializes a tensor on whether its storage is under 2 GiB, which the
    launch keys do not hold: on ROCm every launch is the ordinary one, and the status says why."""
    import torch

    monkeypatch.setattr(triton, "__version__", sorted(launch_mod.FAST_LAUNCH_TRITON_VERSIONS)[0])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("LINATTN_FAST_LAUNCH", raising=False)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a ROCm build with a GPU
    enabled, why = launch_mod.fast_launch_status()
    assert not enabled and "ROCm" in why and "2 GiB" in why
    k = _FakeKernel()
    launch_mod.launch(k, (2,), (1,), {"BLOCK": 4}, num_warps=2)
    assert k.launches == [((2,), (1,), {"BLOCK": 4, "num_warps": 2})]
    monkeypatch.setattr(torch.version, "hip", None)
    launch_mod.reset_fast_launch()
    assert launch_mod.fast_launch_status()[0]  # the same process on CUDA takes the fast path


def test_a_full_compiled_cache_drops_its_oldest_entry_not_all(fast, monkeypatch):
    import torch

    monkeypatch.setattr(launch_mod, "_COMPILED_MAX", 2)
    k, x = _CompilingKernel(), torch.zeros(4)
    for block in (8, 16, 32):  # three launch keys (the constexpr differs)
        launch_mod.launch(k, (1,), (x, 3), {"BLOCK": block}, num_warps=4)
    assert [key[-1] for key in launch_mod._compiled] == [("BLOCK", 16), ("BLOCK", 32)]
    launch_mod.launch(k, (1,), (x, 3), {"BLOCK": 16}, num_warps=4)
    assert len(k.ordinary) == 3  # the kept entry launched directly
