"""Start ranks for a test: ``fn(rank, world_size, *args)`` in new processes joined in one
torch.distributed process group (gloo on the CPU, nccl with one GPU per rank).

The context-parallel tests (``tests/distributed``), ``linattn demo --context-parallel N`` and
``benchmarks/context_parallel.py`` use it; the library itself creates no process group
(:mod:`linattn.context_parallel` runs in the caller's). Not imported by ``import linattn`` or
``import linattn.testing``.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import shutil
import tempfile
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from linattn._namespace import public_dir

__all__ = ["spawn_ranks"]
__dir__ = public_dir(__name__, __all__)


def _rank_main(rank: int, fn, args: tuple, world_size: int, backend: str, store: str, timeout_s: float,
               results) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        results.put((rank, pickle.dumps(fn(rank, world_size, *args))))
    finally:
        dist.destroy_process_group()


def spawn_ranks(fn: Callable, world_size: int, *args, backend: Optional[str] = None,
                timeout_s: float = 300.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined in a default process group.

    Args:
        fn: a module-level function (it is pickled by name); its return value must pickle. The
            ranks are started with the ``spawn`` method, which re-imports the caller's main module:
            a script that calls this needs the usual ``if __name__ == "__main__":`` guard.
        world_size: processes to start (>= 1).
        args: passed to ``fn`` after ``rank, world_size``.
        backend: ``"gloo"`` (CPU), ``"nccl"`` (rank r on ``cuda:r``), or None: nccl when torch sees at
            least ``world_size`` CUDA devices, else gloo.
        timeout_s: the collectives' timeout and the limit on the whole run.
    Returns:
        ``[fn's return value of rank 0, rank 1, ...]``.
    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (its traceback in the message);
            the other ranks are terminated. TimeoutError: the ranks ran past ``timeout_s``.
    """
    import torch.multiprocessing as mp

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    folder = tempfile.mkdtemp(prefix="linattn-cp-")
    results = mp.get_context("spawn").Queue()
    ctx = mp.start_processes(_rank_main, args=(fn, args, world_size, backend, os.path.join(folder, "store"),
                                               timeout_s, results), nprocs=world_size, join=False, start_method="spawn")
    got, deadline = {}, time.monotonic() + timeout_s
    try:
        while True:  # read results while waiting, so that no rank blocks on a full pipe at exit
            _drain(results, got, 0.05)
            if ctx.join(timeout=0.05):  # raises when a rank raised
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"spawn_ranks: {world_size} ranks ran past {timeout_s} s "
                                   f"(results from ranks {sorted(got)})")
        while len(got) < world_size and time.monotonic() < deadline:
            _drain(results, got, 0.5)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        shutil.rmtree(folder, ignore_errors=True)  # the rendezvous file's folder
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        raise RuntimeError(f"spawn_ranks: ranks {missing} exited without a result")
    return [got[r] for r in range(world_size)]


def _drain(results, got: dict, timeout: float) -> None:
    try:
        while True:
            rank, blob = results.get(timeout=timeout)
            got[rank] = pickle.loads(blob)
    except queue.Empty:
        pass
