"""Context-parallel prefill benchmark: one long prompt on 1, 2, 4 (8) GPUs over NCCL.

For each model preset (Qwen3-Next: GDN, H = 16, HV = 32, K = V = 128; Kimi-Linear: KDA, H = HV = 32,
K = V = 128) and prompt length (262,144 and 1,048,576 tokens: one sequence), it times
:func:`linattn.context_parallel.context_parallel_prefill` in pool mode (a fresh prompt:
``has_initial_state`` False, fp32 pool, bf16 q/k/v, fp32 gates) on groups of 1, 2, 4, ... ranks of
one spawned job (rank r on ``cuda:r``). The group of one rank is the ordinary single-GPU call (the
dispatcher's best path), so the speedups are against it, measured in the same run.

Measured as issue 20 asks: every rank's slice is generated on its own GPU before timing (chunk-seeded,
so every group size sees the same prompt); NCCL is warmed up by the untimed warm-up calls; a call's
time is the maximum over the group's ranks of its wall time from a common barrier (CUDA synchronised);
the row holds the median over ``--iters`` calls. ``NCCL_NVLS_ENABLE=0`` is set (NVLink multicast off,
as the H200 machines require). Agreement: the final state written by the group's last rank against
the one-rank run's (relative Frobenius error; bf16 inputs: docs/ops.md allows 1e-2 against float64).

Writes the ``benchmarks/_results.py`` schema, one row per (model, tokens, GPUs); default
``benchmarks/results/context_parallel_<device>.json``. ``--device cpu`` runs the same code on gloo
ranks (a smoke test at small ``--tokens`` / ``--shape``; never a result to keep).

Usage:  python benchmarks/context_parallel.py [--models qwen3-next,kimi-linear] [--tokens 262144,1048576]
        [--gpus 1,2,4] [--warmup 2] [--iters 5] [--out FILE]
        python benchmarks/context_parallel.py --device cpu --gpus 1,2 --tokens 512 --shape 2,4,16,16 --out /tmp/cp.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from linattn.testing.compare import rel_error  # noqa: E402

#: Tokens generated per seeded chunk: the prompt is the same whatever the ranks' slices.
GEN_CHUNK = 8192


def _parse(argv=None):
    ap = argparse.ArgumentParser(description="context-parallel prefill on 1, 2, 4 GPUs (NCCL), one long prompt")
    ap.add_argument("--models", default="qwen3-next,kimi-linear", help="model presets, comma-separated")
    ap.add_argument("--tokens", default="262144,1048576", help="prompt lengths, comma-separated")
    ap.add_argument("--gpus", default=None, help="group sizes, comma-separated (default 1, 2, 4, 8 up to the "
                                                 "devices torch sees; always includes 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls per configuration (compile, NCCL)")
    ap.add_argument("--iters", type=int, default=5, help="timed calls per configuration (the row: the median)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo ranks, a smoke test")
    ap.add_argument("--shape", default=None, help="H,HV,K,V overriding the presets' heads (smoke tests)")
    ap.add_argument("--backend", default=None, help="force a linattn backend for every call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/context_parallel_<dev>.json)")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    n_dev = torch.cuda.device_count() if args.device == "cuda" else (os.cpu_count() or 1)
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else [g for g in (1, 2, 4, 8) if g <= max(1, n_dev)]
    args.gpus = sorted({1, *gpus})
    if args.device == "cuda" and max(args.gpus) > n_dev:
        ap.error(f"--gpus {max(args.gpus)} but torch sees {n_dev} CUDA device(s)")
    args.shape = tuple(int(x) for x in args.shape.split(",")) if args.shape else None
    return args


def _heads(model: str, shape):
    import linattn

    p = linattn.preset(model)
    return p.family, (shape or (p.H, p.HV, p.K, p.V))


def _slice_inputs(family, heads, lo, hi, dev, seed):
    """Tokens ``lo .. hi - 1`` of the seeded prompt, generated on ``dev`` chunk by chunk."""
    H, HV, K, V = heads
    parts = []
    for c in range(lo // GEN_CHUNK, -(-hi // GEN_CHUNK)):
        gen = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + c)
        r = lambda *s: torch.randn(*s, device=dev, generator=gen)
        n = GEN_CHUNK
        gshape = (n, HV, K) if family == "kda" else (n, HV)
        chunk = (r(n, H, K).bfloat16(), r(n, H, K).bfloat16(), r(n, HV, V).bfloat16(),
                 torch.nn.functional.logsigmoid(r(*gshape) + 3.0), torch.sigmoid(r(n, HV)))
        a, b = max(lo, c * GEN_CHUNK) - c * GEN_CHUNK, min(hi, (c + 1) * GEN_CHUNK) - c * GEN_CHUNK
        parts.append([t[a:b] for t in chunk])
    return [torch.cat(ts) if len(ts) > 1 else ts[0].contiguous() for ts in zip(*parts)] if parts else None


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time_group(call, group, dev, warmup, iters):
    """Per-iteration max-over-ranks seconds and this rank's seconds (medians)."""
    import torch.distributed as dist

    for _ in range(warmup):
        call()
    _sync(dev)
    worst, mine = [], []
    for _ in range(iters):
        dist.barrier(group=group)
        _sync(dev)
        t0 = time.perf_counter()
        call()
        _sync(dev)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        mine.append(float(t))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        worst.append(float(t))
    return statistics.median(worst), statistics.median(mine)


def _run_config(rank, model, tokens, w, group, cfg, dev):
    """One (model, tokens, group size) on the ranks of ``group`` (rank < w); the row parts of this rank."""
    import linattn
    from linattn.context_parallel import context_parallel_prefill, summary_mode

    family, heads = _heads(model, cfg.shape)
    lo, hi = rank * tokens // w, (rank + 1) * tokens // w
    x = _slice_inputs(family, heads, lo, hi, dev, cfg.seed)
    pool = torch.zeros(2, heads[1], heads[3], heads[2], device=dev)
    kw = dict(cu_seqlens=torch.tensor([0, tokens], dtype=torch.int32, device=dev), cu_seqlens_cpu=[0, tokens],
              token_offset=lo, group=group, state_pool=pool, backend=cfg.backend,
              state_indices=torch.zeros(1, dtype=torch.int32, device=dev),
              has_initial_state=torch.zeros(1, dtype=torch.bool, device=dev))
    call = lambda: context_parallel_prefill(family, *x, **kw)
    worst, mine = _time_group(call, group, dev, cfg.warmup, cfg.iters)
    d = linattn.last_decision()
    mode = summary_mode(family, x[0], x[2], backend=cfg.backend)[0] if w >= 3 else "none (no middle piece)"
    return dict(seconds=worst, rank_seconds=mine, backend=d.chosen if d else None, summary=mode, state=pool[0],
                family=family, heads=heads)


def _bench_rank(rank, world, cfg):
    """Every configuration in one job: groups of the first w ranks; ranks outside a group wait."""
    import torch.distributed as dist

    dev = torch.device("cuda", rank) if cfg.device == "cuda" else torch.device("cpu")
    groups = {w: dist.new_group(list(range(w))) for w in cfg.gpus}  # every rank creates every group, in order
    rows = []
    for model in cfg.models:
        for tokens in cfg.tokens:
            ref = None
            for w in cfg.gpus:
                part = _run_config(rank, model, tokens, w, groups[w], cfg, dev) if rank < w else None
                _, (H, HV, K, V) = _heads(model, cfg.shape)
                buf = part["state"] if rank == w - 1 else torch.empty(HV, V, K, device=dev)
                dist.broadcast(buf, src=w - 1)  # the final state, from the group's last rank to everyone
                per_rank = _gather_rank_seconds(part, w, world, dev)
                ref = buf.clone() if w == 1 else ref
                if rank == 0:
                    rows.append(_row(model, tokens, w, part, per_rank, buf, ref, rows))
                    print(rows[-1], flush=True)
                del part
                dist.barrier()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _gather_rank_seconds(part, w, world, dev):
    import torch.distributed as dist

    t = torch.tensor([part["rank_seconds"] if part is not None else -1.0], dtype=torch.float64, device=dev)
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return [round(float(x), 6) for x in out[:w]]


def _row(model, tokens, w, part, per_rank, state, ref, rows):
    family, heads = part["family"], part["heads"]
    one = next((r["seconds"] for r in rows if r["model"] == model and r["tokens"] == tokens and r["gpus"] == 1),
               part["seconds"])
    rel = rel_error(state, ref)
    return dict(kind="context_parallel", model=model, family=family, tokens=tokens, gpus=w,
                heads=dict(zip(("H", "HV", "K", "V"), heads)), seconds=round(part["seconds"], 6),
                rank_seconds=per_rank, mtok_per_s=round(tokens / part["seconds"] / 1e6, 3),
                speedup_vs_1gpu=round(one / part["seconds"], 3), state_rel_err_vs_1gpu=rel,
                rank0_last_backend=part["backend"], summary=part["summary"])


def main(argv=None) -> int:
    cfg = _parse(argv)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (the H200 machines require it); inherited by the ranks
    from linattn.testing.spawn import spawn_ranks

    world = max(cfg.gpus)
    rows = spawn_ranks(_bench_rank, world, cfg, backend="nccl" if cfg.device == "cuda" else "gloo",
                       timeout_s=3600)[0]
    notes = [f"one prompt per row, pool mode, fresh (has_initial_state False), bf16 q/k/v, fp32 gates and pool; "
             f"seconds = median over {cfg.iters} calls of the max over the group's ranks (after {cfg.warmup} "
             f"warm-up calls); speedup against the 1-GPU row (the ordinary call) of the same run",
             "NCCL_NVLS_ENABLE=0; inputs generated on each rank's GPU before timing; rank0_last_backend: the "
             "dispatcher's choice for rank 0's last internal call; summary: how middle pieces got (M, B)"]
    path = cfg.out or results_path("context_parallel")
    write_results(path, rows, notes)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
