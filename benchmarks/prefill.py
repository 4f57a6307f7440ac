"""Chunked prefill benchmark (GPU): linattn's Triton pool mode against flash-linear-attention.

For each family (GDN, KDA) and shape (sequences x tokens, Qwen3-Next heads: H = 16, HV = 32,
K = V = 128, bf16 inputs, fp32 state pool) it times, with CUDA events (``triton.testing.do_bench``,
median):

- ``linattn_pool``: :func:`linattn.kernels.triton.prefill.chunk_prefill` in pool mode (h0 read
  from ``state_pool[state_indices]``, final state written back in place by the state kernel);
- ``fla``: flash-linear-attention 0.6 ``chunk_gated_delta_rule`` / ``chunk_kda`` with dense
  states (``initial_state [N, HV, K, V]`` fp32, ``output_final_state=True``), l2norm in kernel;
- ``fla_gather_scatter``: the same with the gather (``pool[idx]``) and scatter
  (``pool[idx] = ht``) an engine needs around it.

Throughput is tokens / median time (Mtok/s). Also recorded: the relative difference between
linattn's and FLA's outputs and final states on the same data (a cross-check, not a test), the
time of each linattn stage and of FLA's kernels (torch profiler), with ``--sweep`` the pipeline
time under other launch configurations (timing only, on a scratch copy of the pool; the shipped
config is pinned), and with ``--intra-sweep`` stage 1 alone under other configurations (it writes
no state).

Gates (``--gates``, a comma list, default ``mild,realistic``): ``mild`` is ``logsigmoid(N(3, 1))``
(about -0.05 per token, what every run before issue 32 measured); ``realistic`` is the family's model
in :mod:`linattn.testing.gates` (GDN: Qwen3-Next's initialisation; KDA: Kimi-Linear's), with one
strong-decay head in 8 (KDA: those leave stage 1's fast path, the row records the fraction); a model
name (``glm5-next``, ``olmo-hybrid``, ...) picks another. The first kind fills the row's columns; each
further kind adds a sub-dict under its name with the same measurements (``linattn_pool_ms``,
``fla_ms``, ``speedup_vs_fla``, the cross-check, the stage times) and the gates' ``decay`` summary.
The sweeps run on the first kind's data.

Writes the ``benchmarks/_results.py`` schema, one row per (family, shape), after every row (a
timeout keeps what was measured); default ``benchmarks/results/prefill_<device>.json``.

Usage:  python benchmarks/prefill.py [--out FILE] [--families gdn,kda] [--gates mild,realistic]
        [--sweep] [--intra-sweep] [--sweep-shapes 16x4096]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402

from linattn.kernels.triton.prefill import LaunchOptions, SolveConfig, override_config  # noqa: E402
from linattn.testing.compare import rel_error as rel  # noqa: E402

SHAPES = [(16, 4096), (64, 1024), (256, 256)]
H, HV, K, V = 16, 32, 128, 128


def make(family, N, L, seed=0, gates="mild"):
    """Inputs of one shape; ``gates`` other than "mild" replaces g and beta (linattn.testing.gates)."""
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    T = N * L
    bf = torch.bfloat16
    gshape = (T, HV, K) if family == "kda" else (T, HV)
    d = dict(
        q=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
        k=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
        v=torch.randn(T, HV, V, device=dev, generator=gen).to(bf),
        g=torch.nn.functional.logsigmoid(torch.randn(*gshape, device=dev, generator=gen) + 3.0),
        beta=torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen)),
        cu_seqlens=torch.arange(0, T + 1, L, device=dev, dtype=torch.int32),
    )
    P = 2 * N
    idx = torch.randperm(P, device=dev, generator=gen)[:N].to(torch.int32)
    pool = torch.randn(P, HV, V, K, device=dev, generator=gen) * 0.1  # "vk", fp32
    if gates != "mild":
        from linattn.testing.gates import gate_tensors

        d["g"], d["beta"] = gate_tensors(gates, family, T, HV, K, seed=seed, device=dev)
    return d, pool, idx


def linattn_fn(family, d, pool, idx):
    from linattn.kernels.triton.prefill import chunk_prefill

    def fn():
        return chunk_prefill(family, **d, state_pool=pool, state_indices=idx, initial_state=None,
                             scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk")
    return fn


def fla_fns(family, d, pool_kv, idx):
    if family == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op
    else:
        from fla.ops.kda import chunk_kda as op
    cu64 = d["cu_seqlens"].long()
    cu_cpu = cu64.cpu()
    q, k, v, g, beta = (d[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta"))
    idx64 = idx.long()
    h0 = pool_kv.index_select(0, idx64)

    def alone():
        return op(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, cu_seqlens_cpu=cu_cpu)

    def gather_scatter():
        h = pool_kv.index_select(0, idx64)
        o, ht = op(q, k, v, g, beta, scale=K ** -0.5, initial_state=h, output_final_state=True,
                   use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, cu_seqlens_cpu=cu_cpu)
        pool_kv.index_copy_(0, idx64, ht)
        return o, ht
    return alone, gather_scatter


def bench_ms(fn, warmup=25, rep=150):
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def stage_times(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            out[e.key[:60]] = round(t / 5 / 1e3, 4)  # ms per call
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


#: Pipeline configurations (``PrefillConfig`` field paths, :func:`~linattn.kernels.triton.prefill.override_config`).
SWEEP = [
    {},
    # KDA: the state and output kernels apart (per-chunk states and Vn through memory)
    {"state.writes_output": False},
    # KDA's fused state kernel: pipelined; 8 warps
    {"state.fused_launch": LaunchOptions(num_warps=4, num_stages=2)},
    {"state.fused_launch": LaunchOptions(num_warps=8, num_stages=1)},
    # GDN: the state kernel's pipelining
    {"state.launch": LaunchOptions(num_warps=4, num_stages=1)},
    # GDN bf16 (session 7): U formed in stage 1; every chunk's state stored; the gate factors
    # scanned in the state loop; stage 1 at the 128-register cap and 8 programs per SM
    {"gdn.u_in_state": False},
    {"gdn.every_second_state": False},
    {"gdn.gates_kernel": False},
    {"intra.launch": LaunchOptions(num_warps=4, num_stages=1, maxnreg=128), "intra.ctas_per_sm": 8},
]


@contextlib.contextmanager
def config_override(over: dict | None):
    """Within the block, ``prefill_config`` (the configuration the planner pins) returns its
    configuration with the fields of ``over`` replaced (``PrefillConfig`` field paths, e.g.
    ``{"intra.solve": SolveConfig(...)}``, ``{"state.block_v": 32}``: :func:`override_config`; None or
    {}: unchanged). Used by the sweeps here, prefill_profile.py, prefill_worst_case.py, prefill_fused.py
    and prefill_long.py."""
    from linattn.kernels.triton import prefill as pm

    pinned = pm.config.prefill_config  # where the planner looks it up (prefill/plan.py)
    if over:
        pm.config.prefill_config = lambda *a, **k: override_config(pinned(*a, **k), over)
    try:
        yield
    finally:
        pm.config.prefill_config = pinned


def run_sweep(family, d, pool, idx):
    res, ref = [], None
    for alt in SWEEP:
        with config_override(alt):
            try:
                o, _ = linattn_fn(family, d, pool.clone(), idx)()  # once from the same pool: output to compare
                ref = o if ref is None else ref
                fn = linattn_fn(family, d, pool.clone(), idx)
                ms = bench_ms(fn, warmup=5, rep=40)
                res.append(dict(config=repr(alt), ms=round(ms, 4), mtok_s=round(d["v"].shape[0] / ms / 1e3, 2),
                                rel_diff_o_vs_first=rel(o, ref)))
            except Exception as e:  # a config that does not build is reported, not fatal
                res.append(dict(config=repr(alt), error=f"{type(e).__name__}: {str(e)[:200]}"))
    return res


#: Stage 1 alone (it touches no state, so it may be timed repeatedly): launch configurations.
INTRA_SWEEP = [
    {},
    {"kda_system.bf16_operands": True},
    # KDA's system kernel: the level path everywhere (no fast path); a register cap (3 CTAs per
    # SM); channel blocks of 64 and 16
    {"kda_system.fast_path": False},
    {"kda_system.launch": LaunchOptions(num_warps=4, num_stages=1, maxnreg=168)},
    {"kda_system.block_k": 64},
    {"kda_system.block_k": 16},
    # the solve: all dots 3xTF32; the fp32 inputs' solve (forward substitution, ieee)
    {"intra.solve": SolveConfig(neumann=True, diag_precision="tf32x3", below_precision="tf32x3")},
    {"intra.solve": SolveConfig(neumann=False, diag_precision="ieee", below_precision="ieee")},
    # register cap and programs per SM (resident CTAs per SM: 65536 / (128 threads x cap))
    {"intra.launch": LaunchOptions(num_warps=4, num_stages=1, maxnreg=96), "intra.ctas_per_sm": 10},
]


def run_intra_sweep(family, d):
    """Median time of stage 1 alone per configuration of :data:`INTRA_SWEEP`, and the relative
    difference of its ``w``/``u`` from the first configuration's."""
    from linattn.capabilities import probe
    from linattn.kernels.triton import prefill as pm

    q, k, v, g, beta, cu = (d[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens"))
    kda = family == "kda"
    caps = probe(q.device)
    res, ref = [], None
    for alt in INTRA_SWEEP:
        if not kda and alt and all(key.startswith("kda_system.") for key in alt):
            continue  # a KDA-only knob: GDN would time its pinned config again
        cfg = override_config(pm.prefill_config(family, K, V, torch.bfloat16), alt)
        # stage 1 as the pipeline runs it (GDN: Tm diag(beta) in place of U where the state stage forms U)
        plan = pm.plan_prefill(family, q=q, v=v, cu_seqlens=cu, caps=caps, config=cfg)
        bufs = pm.allocate_buffers(plan)
        x = pm.conform_inputs(plan, q, k, v, g, beta, cu)
        tables = pm.launch_tables(plan, cu)

        def fn():
            pm.launch_intra(plan, x, tables, bufs, K ** -0.5)
        try:
            ms = bench_ms(fn, warmup=10, rep=60)
            fn()
            second = bufs.u if bufs.u is not None else bufs.tm_beta
            out = torch.cat([bufs.w.float().flatten(), second.float().flatten()])
            if ref is None:
                ref = out.clone()
            res.append(dict(config=repr(alt), ms=round(ms, 4),  # None: u holds another matrix (tmout)
                            rel_diff_vs_first=rel(out, ref) if out.numel() == ref.numel() else None))
        except Exception as e:  # a config that does not build is reported, not fatal
            res.append(dict(config=repr(alt), error=f"{type(e).__name__}: {str(e)[:300]}"))
    return res


def measure(family, T, d, pool, idx, have_fla):
    """Timings (medians, ms and Mtok/s), stage times and the cross-check against FLA on one input set."""
    row = {}
    lin = linattn_fn(family, d, pool, idx)
    row["linattn_pool_ms"] = bench_ms(lin)
    row["linattn_pool_mtok_s"] = T / row["linattn_pool_ms"] / 1e3
    row["linattn_stages_ms"] = stage_times(lin)
    if not have_fla:
        return row
    pool_kv = pool.transpose(-1, -2).contiguous()
    alone, gs = fla_fns(family, d, pool_kv, idx)
    row["fla_ms"] = bench_ms(alone)
    row["fla_mtok_s"] = T / row["fla_ms"] / 1e3
    row["fla_gather_scatter_ms"] = bench_ms(gs)
    row["fla_gather_scatter_mtok_s"] = T / row["fla_gather_scatter_ms"] / 1e3
    row["fla_stages_ms"] = stage_times(alone)
    row["speedup_vs_fla"] = row["fla_ms"] / row["linattn_pool_ms"]
    row["speedup_vs_fla_gather_scatter"] = row["fla_gather_scatter_ms"] / row["linattn_pool_ms"]
    # cross-check on identical data: the same initial rows through both
    p1 = pool.clone()
    h0_kv = p1[idx.long()].transpose(-1, -2).contiguous()
    o1, _ = linattn_fn(family, d, p1, idx)()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda
    op = chunk_gated_delta_rule if family == "gdn" else chunk_kda
    o2, ht2 = op(*(d[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta")), scale=K ** -0.5,
                 initial_state=h0_kv, output_final_state=True, use_qk_l2norm_in_kernel=True,
                 cu_seqlens=d["cu_seqlens"].long())
    row["rel_diff_o_vs_fla"] = rel(o1, o2[0])
    row["rel_diff_state_vs_fla"] = rel(p1[idx.long()], ht2.transpose(-1, -2))
    row["nonfinite_o"] = int((~torch.isfinite(o1)).sum())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/prefill_<device>.json)")
    ap.add_argument("--families", default="gdn,kda")
    ap.add_argument("--gates", default="mild,realistic",
                    help="gate kinds: mild, realistic, or a model of linattn.testing.gates (the first fills the row)")
    ap.add_argument("--shapes", default=",".join(f"{n}x{l}" for n, l in SHAPES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--intra-sweep", action="store_true", help="time stage 1 alone under other configs")
    ap.add_argument("--sweep-shapes", default=None, help="shapes (e.g. 16x4096) to sweep; default: all")
    args = ap.parse_args()
    out = args.out or results_path("prefill")
    kinds = [k for k in args.gates.split(",") if k]
    from linattn.testing.gates import MODELS

    for k in kinds:
        if k not in ("mild", "realistic", *MODELS):
            ap.error(f"unknown gate kind {k!r}; kinds: mild, realistic, {', '.join(MODELS)}")
    try:
        import fla  # noqa: F401
        have_fla = not args.no_fla
    except ImportError:
        have_fla = False
    notes = [
        "Triton chunked prefill in pool mode (h0 read from state_pool[state_indices], the final state written back by "
        "the state kernel) against flash-linear-attention chunk_gated_delta_rule / chunk_kda with dense states (fla_*) "
        "and with the gather/scatter an engine needs around it (fla_gather_scatter_*).",
        f"Heads H={H}, HV={HV}, K={K}, V={V} for both families; bf16 q/k/v; fp32 pool [P, HV, V, K] ('vk'), P = 2N, "
        "random slots; triton do_bench medians; *_stages_ms from the torch profiler "
        "(ms per call); sweep / intra_sweep: other launch configurations (timing only).",
        f"Gates {kinds}: mild = logsigmoid(N(3, 1)); realistic = the family's model of linattn.testing.gates "
        "(GDN Qwen3-Next, KDA Kimi-Linear initialisations, 1 head in 8 a strong-decay head); the row's columns "
        "are the first kind's, each further kind a sub-dict of the same measurements with its decay summary "
        "(decay.kda_level_path_fraction: share of (chunk, head, 32-channel block) off KDA's stage-1 fast path).",
    ] + ([] if have_fla else ["flash-linear-attention not installed (or --no-fla): no FLA columns."])
    results = []
    for family in args.families.split(","):
        for shp in args.shapes.split(","):
            N, L = map(int, shp.split("x"))
            T = N * L
            fam_kinds = [k for k in kinds if k in ("mild", "realistic") or MODELS[k].family == family]
            if not fam_kinds:
                continue
            row = dict(family=family, shape=f"{N}x{L}", tokens=T, gates=fam_kinds[0])
            t0 = time.time()
            for n, kind in enumerate(fam_kinds):
                d, pool, idx = make(family, N, L, gates=kind)
                m = measure(family, T, d, pool, idx, have_fla)
                if kind != "mild":
                    from linattn.testing.gates import decay_summary, resolve

                    m["model"] = resolve(kind, family).name
                    m["decay"] = decay_summary(d["g"], d["cu_seqlens"])
                if n == 0:
                    row.update(m)
                    first = (d, pool, idx)
                else:
                    row[kind] = m
                    del d, pool
                    torch.cuda.empty_cache()
            d, pool, idx = first
            swept = args.sweep_shapes is None or shp in args.sweep_shapes.split(",")
            if args.sweep and swept:
                row["sweep"] = run_sweep(family, d, pool, idx)
            if args.intra_sweep and swept:
                row["intra_sweep"] = run_intra_sweep(family, d)
            row["wall_s"] = round(time.time() - t0, 1)
            results.append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            write_results(out, results, notes)  # after every row: a timeout keeps what was measured
            del d, pool
            torch.cuda.empty_cache()
    print(f"\nwrote {out}\n{'family':6} {'shape':9} {'linattn':>9} {'fla':>9} {'fla+g/s':>9} {'x fla':>6} {'x fla+g/s':>9}  (Mtok/s)")
    for r in results:
        print(f"{r['family']:6} {r['shape']:9} {r['linattn_pool_mtok_s']:9.2f} {r.get('fla_mtok_s', float('nan')):9.2f} "
              f"{r.get('fla_gather_scatter_mtok_s', float('nan')):9.2f} {r.get('speedup_vs_fla', float('nan')):6.2f} "
              f"{r.get('speedup_vs_fla_gather_scatter', float('nan')):9.2f}  gates {r['gates']}")
        for kind in kinds:
            m = r.get(kind)
            if isinstance(m, dict):
                print(f"{'':6} {'':9} {m['linattn_pool_mtok_s']:9.2f} {m.get('fla_mtok_s', float('nan')):9.2f} "
                      f"{m.get('fla_gather_scatter_mtok_s', float('nan')):9.2f} {m.get('speedup_vs_fla', float('nan')):6.2f} "
                      f"{m.get('speedup_vs_fla_gather_scatter', float('nan')):9.2f}  gates {kind} ({m['model']}), "
                      f"decay {m['decay']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
