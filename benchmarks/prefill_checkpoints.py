"""The cost of state checkpoints (issue 32 item 1; docs/ops.md "State checkpoints") on the Triton
prefill, on the H200.

For each shape (bf16 q/k/v, l2norm in the kernel, fp32 "vk" pool, K = V = 128; GDN at Qwen3-Next's
head counts 16/32, KDA at Kimi-Linear's 32/32) and each path (``pipeline``: ``fused=False``;
``fused``: the fused walk forced, KDA's opt-in) it times with ``triton.testing.do_bench`` (medians,
ms) the same call three ways: with checkpoints every ``--every`` tokens (the ``HAS_CKPT`` builds, one
pass per sequence), without them in one pass per sequence (``segment_chunks=0``: the same
decomposition, so the difference is the stores), and without them as the planner plans it (the
segment-parallel pass where it chooses it: what a call gives up by asking for checkpoints). Each row
also checks that the checkpoints were written (the last one of sequence 0 bitwise equal to its final
state where the length is a multiple of ``--every``) and records the bytes the checkpoints write.

Writes the ``benchmarks/_results.py`` schema (default ``benchmarks/results/prefill_checkpoints_<device>.json``;
``$LINATTN_RESULTS_DIR`` moves it).

Usage:  python benchmarks/prefill_checkpoints.py [--out FILE] [--every 256] [--shapes 16x4096,2x16384]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from prefill import bench_ms  # noqa: E402

HEADS = {"gdn": (16, 32), "kda": (32, 32)}
K = V = 128


def _inputs(family: str, n: int, length: int, every: int, dev: str):
    H, HV = HEADS[family]
    T = n * length
    gen = torch.Generator(device="cpu").manual_seed(0)
    g = torch.nn.functional.logsigmoid(torch.randn((T, HV, K) if family == "kda" else (T, HV), generator=gen) + 3)
    d = dict(q=torch.randn(T, H, K, generator=gen), k=torch.randn(T, H, K, generator=gen),
             v=torch.randn(T, HV, V, generator=gen), g=g, beta=torch.rand(T, HV, generator=gen))
    d = {x: (y.to(torch.bfloat16) if x in ("q", "k", "v") else y).to(dev) for x, y in d.items()}
    d["cu_seqlens"] = torch.arange(0, T + 1, length, dtype=torch.int32, device=dev)
    per = length // every
    table = (n + torch.arange(n * per, device=dev)).view(n, per)  # slots n, n + 1, ...: none read
    pool = torch.zeros(n + n * per, HV, V, K, device=dev)
    return d, table, pool


def measure(family: str, n: int, length: int, every: int, fused: bool, dev: str = "cuda") -> dict:
    from linattn.kernels.triton.prefill import chunk_prefill

    d, table, pool = _inputs(family, n, length, every, dev)
    idx = torch.arange(n, dtype=torch.int32, device=dev)
    kw = dict(initial_state=None, scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk", state_pool=pool,
              state_indices=idx, fused=fused)

    def run(**extra):
        return lambda: chunk_prefill("kda" if family == "kda" else "gdn", **d, **kw, **extra)

    ckpt = run(checkpoint_every=every, checkpoint_indices=table)
    pool.zero_()
    ckpt()
    written = bool(torch.equal(pool[int(table[0, -1])], pool[0])) if length % every == 0 else None
    row = dict(family=family, N=n, L=length, H=HEADS[family][0], HV=HEADS[family][1], K=K, V=V,
               path="fused" if fused else "pipeline", every=every, checkpoints=table.numel(),
               checkpoint_bytes=table.numel() * HEADS[family][1] * K * V * 4, last_equals_final=written,
               ms_checkpoints=bench_ms(ckpt), ms_one_pass=bench_ms(run(segment_chunks=None if fused else 0)),
               ms_planner=bench_ms(run(segment_chunks=None)))
    row["overhead_vs_one_pass"] = row["ms_checkpoints"] / row["ms_one_pass"] - 1
    row["overhead_vs_planner"] = row["ms_checkpoints"] / row["ms_planner"] - 1
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--every", type=int, default=256)
    ap.add_argument("--shapes", default="16x4096,2x16384")
    ap.add_argument("--families", default="gdn,kda")
    a = ap.parse_args(argv)
    out = a.out or results_path("prefill_checkpoints")
    rows = []
    for family in a.families.split(","):
        for shape in a.shapes.split(","):
            n, length = (int(x) for x in shape.split("x"))
            for fused in (False, True):
                row = measure(family, n, length, a.every, fused)
                print(row, flush=True)
                rows.append(row)
                write_results(out, rows, [f"checkpoint_every={a.every}; bf16 q/k/v, fp32 vk pool, K = V = 128"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
