"""GPU tests of separate read and write slots (``output_state_indices``, issue 32 item 2), compiled
Triton (``triton-split``, ``triton-folded``) and cutedsl on the H200.

Every case is held bitwise to the same backend run in place on a pool whose write slots first hold
a copy of the read slots (``tests/ops/separate_slots_cases.py``), and every row not written (the
read slots included: a shared prefix's slot stays intact) keeps its bits.

- Decode: the kernel's second row pointer (``HAS_OUT_SLOTS``), GDN and KDA, fp32 and bf16 pools,
  both state layouts, T = 1 and a 1-D verify (T = 3), N = 5 .. 256 with forks of shared slots,
  rows in place and padding; ``has_initial_state`` on NaN-filled read slots; a CUDA-graph capture.
- Prefill: the read rows copied into the write rows (``kernels/triton/fork_slots.py``) then the
  pipeline, the segment-parallel pass (two long sequences) and the fused kernels (many short
  ones) in place; cutedsl the same where it is available.
- FlashInfer (``backend="flashinfer"``, GDN prefill): its own ``output_state_indices``, the same
  oracle; skipped where flashinfer-python does not import.
- Launches (torch profiler): decode runs its one kernel either way; prefill adds exactly the row copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import linattn
from cuda_launches import cuda_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from separate_slots_cases import (assert_untouched, check_decode_fork, check_prefill_fork, decode_inputs,  # noqa: E402
                                  fork_pattern, prefill_inputs, run_decode, run_prefill)

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
BF = torch.bfloat16
SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}


def _pool(P, HV, K, V, layout="vk", dtype=torch.float32, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    shape = (P, HV, V, K) if layout == "vk" else (P, HV, K, V)
    return (torch.randn(*shape, generator=gen, device=DEV) * 0.5).to(dtype)


@pytest.mark.parametrize("backend", ["triton-split", "triton-folded"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("N,T,state_dtype,layout", [(5, 1, torch.float32, "vk"), (64, 1, torch.bfloat16, "vk"),
                                                      (256, 1, torch.float32, "kv"), (16, 3, torch.float32, "vk")])
def test_decode_separate_slots_compiled(family, backend, N, T, state_dtype, layout):
    s = SHAPES[family]
    P = 2 * N + 3
    read, write = fork_pattern(N, P, seed=N + T)
    d = decode_inputs(family, N, T, dtype=BF, device=DEV, seed=N, **s)
    pool = _pool(P, s["HV"], s["K"], s["V"], layout, state_dtype, seed=N)
    check_decode_fork(family, backend, pool, d, read=read, write=write, state_layout=layout)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_fresh_rows_never_read_their_nan_slots(family):
    s = SHAPES[family]
    N, P = 32, 67
    read, write = fork_pattern(N, P, seed=7)
    fresh = [n % 3 == 0 for n in range(N)]
    d = decode_inputs(family, N, 1, dtype=BF, device=DEV, seed=7, **s)
    pool = _pool(P, s["HV"], s["K"], s["V"], seed=7)
    for n in range(N):
        if fresh[n] and read[n] >= 0 and read[n] not in [r for m, r in enumerate(read) if not fresh[m]]:
            pool[read[n]] = float("nan")  # a slot only fresh rows name: never read
    check_decode_fork(family, "triton-split", pool, d, read=read, write=write, fresh=fresh)


def test_decode_separate_slots_in_a_cuda_graph():
    """Captured (no value checks inside capture) and replayed, the call gives the eager bits."""
    s = SHAPES["gdn"]
    N, P = 64, 131
    read, write = fork_pattern(N, P, seed=3)
    d = decode_inputs("gdn", N, 1, dtype=BF, device=DEV, seed=3, **s)
    pool0 = _pool(P, s["HV"], s["K"], s["V"], seed=3)
    eager_pool = pool0.clone()
    o_eager = run_decode("gdn", d, eager_pool, read, write)
    graph_pool = pool0.clone()
    idx = torch.tensor(read, dtype=torch.int32, device=DEV)
    out_idx = torch.tensor(write, dtype=torch.int32, device=DEV)
    args = (d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], graph_pool, idx)
    warm = graph_pool.clone()
    linattn.gdn_decode(*args[:7], warm, idx, output_state_indices=out_idx)  # eager first call of the class
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        o_graph = linattn.gdn_decode(*args, output_state_indices=out_idx)
    torch.cuda.current_stream().wait_stream(stream)
    graph_pool.copy_(pool0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_eager)
    assert torch.equal(graph_pool, eager_pool)
    assert_untouched(pool0, graph_pool, write)


#: lengths: many short sequences (the fused prefill where it applies), a mixed batch (the pipeline) and
#: two long sequences (the segment-parallel state pass)
PREFILL_CASES = {
    "short": [37, 0, 64, 5, 130, 1, 77, 200] * 4,
    "mixed": [700, 0, 1, 333, 64, 1500, 9, 0],
    "long": [12000, 0, 9000],
}
#: read and write slots: random forks of shared slots for the batches, and for the two long sequences a
#: fork of a long one, a fork of an empty one (its initial state copied) and one in place
PREFILL_FORKS = {"short": fork_pattern(32, 67, seed=32), "mixed": fork_pattern(8, 19, seed=8),
                 "long": ([2, 2, 5], [0, 1, 5])}


@pytest.mark.parametrize("case", list(PREFILL_CASES))
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("dtype,state_dtype,layout", [(BF, torch.float32, "vk"), (torch.float32, torch.float32, "kv"),
                                                      (BF, torch.bfloat16, "vk")])
def test_prefill_separate_slots_compiled(family, case, dtype, state_dtype, layout):
    lens = PREFILL_CASES[case]
    s = SHAPES[family]
    read, write = PREFILL_FORKS[case]
    P = max(read + write) + 2  # the last slot never named
    d = prefill_inputs(family, lens, dtype=dtype, device=DEV, seed=len(lens), **s)
    pool = _pool(P, s["HV"], s["K"], s["V"], layout, state_dtype, seed=len(lens))
    check_prefill_fork(family, "triton-split", pool, d, read=read, write=write, lens=lens, state_layout=layout)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_fresh_sequences_never_read_their_nan_slots(family):
    lens = PREFILL_CASES["mixed"]
    s = SHAPES[family]
    N = len(lens)
    read, write = PREFILL_FORKS["mixed"]
    P = max(read + write) + 2
    fresh = [n % 2 == 1 for n in range(N)]
    pool = _pool(P, s["HV"], s["K"], s["V"], seed=11)
    for n in range(N):
        if fresh[n] and read[n] >= 0 and read[n] not in [r for m, r in enumerate(read) if not fresh[m]]:
            pool[read[n]] = float("nan")
    d = prefill_inputs(family, lens, dtype=BF, device=DEV, seed=11, **s)
    check_prefill_fork(family, "triton-split", pool, d, read=read, write=write, lens=lens, fresh=fresh)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_prefill_separate_slots_cutedsl(family):
    """cutedsl runs the same copy then its own state kernel in place (its conformance run,
    tests/gpu/test_cutedsl_gpu.py, also holds the 'separate-slots' pool case to float64)."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    lens = PREFILL_CASES["mixed"]
    s = SHAPES[family]
    read, write = PREFILL_FORKS["mixed"]
    P = max(read + write) + 2
    d = prefill_inputs(family, lens, dtype=BF, device=DEV, seed=5, **s)
    pool = _pool(P, s["HV"], s["K"], s["V"], seed=5)
    check_prefill_fork(family, "cutedsl", pool, d, read=read, write=write, lens=lens)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_launches_decode_none_extra_prefill_one_copy(family):
    """Decode stores through its second row pointer: the same single kernel. Prefill adds exactly one
    launch, the row copy (fork_slots), and otherwise runs the kernels of the in-place call."""
    s = SHAPES[family]
    N, P = 64, 131
    read, write = fork_pattern(N, P, seed=21)
    d = decode_inputs(family, N, 1, dtype=BF, device=DEV, seed=21, **s)
    pool = _pool(P, s["HV"], s["K"], s["V"], seed=21)
    sep = cuda_kernels(lambda: run_decode(family, d, pool, read, write, backend="triton-split", validate=False))
    inplace = cuda_kernels(lambda: run_decode(family, d, pool, write, backend="triton-split", validate=False))
    assert len(sep) == len(inplace) == 1 and sep == inplace, (sep, inplace)
    lens = PREFILL_CASES["mixed"]
    read, write = PREFILL_FORKS["mixed"]
    dp = prefill_inputs(family, lens, dtype=BF, device=DEV, seed=21, **s)
    ppool = _pool(max(read + write) + 2, s["HV"], s["K"], s["V"], seed=21)
    sep = cuda_kernels(lambda: run_prefill(family, dp, ppool, read, write, backend="triton-split", validate=False))
    inplace = cuda_kernels(lambda: run_prefill(family, dp, ppool, write, backend="triton-split", validate=False))
    copies = [k for k in sep if "fork_slots" in k]
    assert len(copies) == 1 and [k for k in sep if "fork_slots" not in k] == inplace, (sep, inplace)


@pytest.mark.parametrize("case", ["short", "mixed"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
@pytest.mark.parametrize("fresh", [False, True], ids=["h0", "fresh"])
def test_prefill_separate_slots_flashinfer(flashinfer_peer, case, state_dtype, fresh):
    """backend='flashinfer' (GDN, K = V = 128): FlashInfer 0.7.4's own read / write index pair
    (output_state_indices, its non-CP kernel), held bitwise to the same backend in place on the
    forked pool; an empty fork gets its read row copied by the backend (FlashInfer writes nothing
    for it). Both calls are under CP_MIN_TOKENS tokens, so both run FlashInfer's non-CP kernel. GPU
    verification of the declaration."""
    lens = PREFILL_CASES[case]
    s = SHAPES["gdn"]
    N = len(lens)
    read, write = PREFILL_FORKS[case]
    P = max(read + write) + 2
    pool = _pool(P, s["HV"], s["K"], s["V"], dtype=state_dtype, seed=13)
    mask = None
    if fresh:
        mask = [n % 2 == 1 for n in range(N)]
        for n in range(N):
            if mask[n] and read[n] >= 0 and read[n] not in [r for m, r in enumerate(read) if not mask[m]]:
                pool[read[n]] = float("nan")
    d = prefill_inputs("gdn", lens, dtype=BF, device=DEV, seed=13, **s)
    check_prefill_fork("gdn", "flashinfer", pool, d, read=read, write=write, lens=lens, fresh=mask)
