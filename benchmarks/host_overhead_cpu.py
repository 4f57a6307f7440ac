"""The host path of a decode call on the CPU, with the kernel launches stubbed: a micro-benchmark.

What ``benchmarks/host_overhead.py`` measures on the GPU, minus the GPU: a public decode call
(``linattn.gdn_decode`` / ``linattn.kda_decode``) with ``backend="triton-split"`` forced goes through
the dispatcher's fast path, the prepared ``DecodeLaunch`` and the ``PreparedLaunch`` direct launch
as on the H200, except that the compiled kernels' ``run`` does nothing (CPU tensors; the Triton
interpreter is set only to make the backend eligible on the CPU). With ``validate=True`` the
decode value checks take the path they take on CUDA, one stubbed kernel launch and one read of its
flags (``HOST_BENCH_FUSED=0``: the torch rules instead, CPU torch ops). So a row's time is the
Python host cost of linattn's own code plus the torch ops the call runs. Each row also lists the
Triton launches of one call and its top-level ``aten::`` ops (``torch.profiler``): on a GPU every
one of those is a launch or a copy, except ``aten::empty`` (an allocation).

Not a timed test: absolute numbers depend on the machine and its load (the fastest of several
loops is reported); compare rows of one run.

    .venv/bin/python benchmarks/host_overhead_cpu.py                 # writes results/host_dispatch_cpu.json
    .venv/bin/python benchmarks/host_overhead_cpu.py --profile gdn   # a cProfile of 20,000 calls instead
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton backends are eligible on the CPU only so

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import results_path, write_results  # noqa: E402

import linattn  # noqa: E402
from linattn.kernels.triton import decode as decode_mod  # noqa: E402
from linattn.kernels.triton import launch as launch_mod  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
BACKEND = "triton-split"
#: the decode value checks as one kernel (as on CUDA); False: the torch rules (as before the fused kernel)
FUSED = os.environ.get("HOST_BENCH_FUSED", "1") != "0"


class _StubCompiled:
    """Stands in for a ``triton.compiler.CompiledKernel``: ``run`` counts and returns (the value-check
    kernel's stand-in writes "every check passed" into its flags, without a torch op)."""

    function, packed_metadata = 0, None

    def __init__(self, name: str, flags_at: Optional[int] = None):
        self.name, self.flags_at, self.runs = name, flags_at, 0

    def run(self, *args):
        self.runs += 1
        if self.flags_at is not None:
            ctypes.memset(args[9 + self.flags_at].data_ptr(), 0, 4)


class _StubKernel:
    """Stands in for a ``@triton.jit`` kernel: its parameters, no launch."""

    pre_run_hooks: list = []

    def __init__(self, real, flags_at: Optional[int] = None):
        from triton.runtime.jit import JITFunction

        fn = getattr(real, "fn", real)
        self.params = JITFunction(fn).params
        self.compiled = _StubCompiled(fn.__name__, flags_at)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.compiled


@contextlib.contextmanager
def stubbed_launch():
    """The fast launch path taken as on CUDA, with kernels whose launch does nothing; the decode
    value checks as one kernel launch (as on CUDA). Yields the two stub kernels."""
    from linattn.dispatch import value_rules
    from linattn.kernels.triton import value_checks

    saved = (decode_mod._recurrent_decode_kernel, value_checks.decode_value_flags_kernel, launch_mod.fast_launch_status,
             launch_mod._current_device, value_rules.FUSED_VALUE_CHECKS, getattr(torch._C, "_cuda_getCurrentRawStream", None))
    stubs = (_StubKernel(decode_mod._recurrent_decode_kernel), _StubKernel(value_checks.decode_value_flags_kernel, 6))
    decode_mod._recurrent_decode_kernel, value_checks.decode_value_flags_kernel = stubs
    launch_mod.fast_launch_status = lambda: (True, "stubbed (benchmarks/host_overhead_cpu.py)")
    launch_mod._current_device = lambda: 0
    value_rules.FUSED_VALUE_CHECKS = FUSED
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    linattn.dispatch.clear_cache()
    try:
        yield stubs
    finally:
        (decode_mod._recurrent_decode_kernel, value_checks.decode_value_flags_kernel, launch_mod.fast_launch_status,
         launch_mod._current_device, value_rules.FUSED_VALUE_CHECKS) = saved[:5]
        if saved[5] is None:
            del torch._C._cuda_getCurrentRawStream
        else:
            torch._C._cuda_getCurrentRawStream = saved[5]
        linattn.dispatch.clear_cache()


def decode_inputs(family: str, n: int = 1) -> dict:
    g = torch.Generator().manual_seed(0)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dtype)

    kda = family == "kda"
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V),
                a=r(n, 1, HV, K) if kda else r(n, 1, HV), b=r(n, 1, HV),
                A_log=r(HV, dtype=torch.float32), dt_bias=r(HV, K, dtype=torch.float32) if kda else r(HV, dtype=torch.float32),
                state_pool=torch.zeros(8, HV, V, K), state_indices=torch.arange(n, dtype=torch.int32))


def per_call_us(fn, calls: int, repeats: int) -> float:
    """The fastest of ``repeats`` loops: wall clock per call (after a warm-up)."""
    for _ in range(50):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return min(samples)  # the least disturbed loop: the machine's other load only adds


def torch_ops(fn) -> list[str]:
    """The top-level ``aten::`` ops one call runs (each is a kernel launch on a GPU, a copy to the
    host included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if not any(p.name.startswith("aten::") for p in _parents(e))]
    return [e.name for e in top]


def _parents(e):
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


def rows(calls: int, repeats: int) -> list[dict]:
    out = []
    with torch.inference_mode(), stubbed_launch() as stubs:
        for family in ("gdn", "kda"):
            op, x = getattr(linattn, f"{family}_decode"), decode_inputs(family)
            for validate in (False, True):
                def call(op=op, x=x, validate=validate):
                    return op(**x, validate=validate, backend=BACKEND)
                call()
                call()
                before = [s.compiled.runs for s in stubs]
                ops = torch_ops(call)
                launches = {s.compiled.name: s.compiled.runs - b for s, b in zip(stubs, before) if s.compiled.runs > b}
                assert launches.get("_recurrent_decode_kernel") == 1, "the call did not take the direct launch"
                us = per_call_us(call, calls, repeats)
                out.append(dict(kind="linattn_stubbed", op=f"{family}_decode", validate=validate, fused_checks=FUSED,
                                host_us=round(us, 2), triton_launches=launches, torch_ops=len(ops), ops=ops,
                                backend=linattn.last_decision(f"{family}_decode").chosen))
        stub_call = stubs[0].compiled.run
        out.append(dict(kind="floor_stubbed", op="decode", what="the stubbed CompiledKernel.run alone",
                        host_us=round(per_call_us(lambda: stub_call(1, 1, 1, 0, 0, None, None, None, None), calls,
                                                  repeats), 3)))
    return out


def profile_calls(family: str, validate: bool, calls: int) -> None:
    import cProfile
    import pstats

    with torch.inference_mode(), stubbed_launch():
        op, x = getattr(linattn, f"{family}_decode"), decode_inputs(family)
        for _ in range(10):
            op(**x, validate=validate, backend=BACKEND)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(calls):
            op(**x, validate=validate, backend=BACKEND)
        pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", choices=("gdn", "kda"), default=None, help="print a cProfile instead")
    ap.add_argument("--validate", action="store_true", help="with --profile: validate=True")
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/host_dispatch_cpu.json)")
    args = ap.parse_args(argv)
    if args.profile:
        profile_calls(args.profile, args.validate, 20000)
        return 0
    got = rows(args.calls, args.repeats)
    for r in got:
        print({k: v for k, v in r.items() if k != "ops"})
    notes = [f"Qwen3-Next heads H={H}, HV={HV}, K=V={K}; decode N=1 T=1; bf16 q/k/v, fp32 pool; CPU tensors; "
             f"backend={BACKEND} forced; the compiled kernels' run stubbed to a no-op; wall clock per call over "
             f"{args.calls} calls, fastest of {args.repeats} loops, after a warm-up.",
             "triton_launches: the stubbed Triton launches of one call; torch_ops / ops: its top-level aten ops "
             "(torch.profiler); on a GPU each is a launch or a device-to-host copy, except aten::empty.",
             f"fused_checks={FUSED}: the decode value checks as one kernel (HOST_BENCH_FUSED=0: the torch rules)."]
    write_results(args.out or results_path("host_dispatch", tag="cpu"), got, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
