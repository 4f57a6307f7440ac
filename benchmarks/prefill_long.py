"""Long single prompts on few heads (GPU): linattn's Triton prefill, with and without the
segment-parallel state pass, against flash-linear-attention.

The low-parallelism shapes of issue 18: one sequence (or a few) of 8,192 to 131,072 tokens at the
per-rank heads of tensor-parallel serving (Qwen3.5-397B at TP8 / TP4 / TP2, Qwen3-Next at TP1 /
TP2, Kimi-Linear at TP1 / TP4), and issue 27's batched rows (16 x 4,096, 64 x 1,024, 8 x 1,024 at
Qwen3-Next TP1 heads, 4 x 8,192 at Qwen3.5 TP1 heads); K = V = 128, bf16 q/k/v, fp32 state pool ``[P, HV, V, K]``. For
each case, ``triton.testing.do_bench`` medians of:

- ``linattn``: :func:`linattn.kernels.triton.prefill.chunk_prefill` in pool mode, the planner's
  choice of segments (``plan_segments``; ``linattn_segment_chunks`` and ``..._reason`` record it) and
  of the fused prefill (``linattn_fused``; its prep and walk: ``linattn_fused_prep``, ``..._walk``); it plans
  every call, so a short call is host-bound there: ``linattn_public_ms`` times the public op
  (``validate=False``, ``backend="triton-split"``, the dispatcher's cached plan: what an engine pays) on
  the same data;
- ``segments_ms``: the same with the segment length forced (``0``: one pass per sequence, the
  path before issue 18; ``L``: segments of ``L`` chunks);
- ``fla``: FLA 0.6 ``chunk_gated_delta_rule`` / ``chunk_kda`` with dense states, l2norm in kernel,
  ``cu_seqlens_cpu`` given;
- ``flashinfer`` (GDN only, where ``flashinfer.gdn_prefill`` imports; ``--no-flashinfer`` skips it):
  FlashInfer's ``chunk_gated_delta_rule`` (on SM90 its CuTe DSL kernels, the context-parallel one
  where its ``use_cp="auto"`` rule picks it: ``flashinfer_cp``) with dense states like FLA
  (``flashinfer_ms``; ``x_flashinfer`` = ``flashinfer_ms / linattn_ms``) and, with ``--flashinfer-modes
  dense,pool``, on the pool in place with ``state_indices`` like linattn (``flashinfer_pool_ms``,
  ``x_flashinfer_pool``). Its conventions: gate ``g`` as linear alpha = exp(FLA's log gate), fp32,
  ``[T, HV]``; beta fp32 ``[T, HV]``; states fp32 ``[N, HV, V, K]``; GVA with ``H < HV``; int32
  ``cu_seqlens``. A failure is recorded as ``flashinfer_error`` / ``flashinfer_pool_error``.

Also recorded: the planner's output against the one-pass output and against FLA's, FlashInfer's
against FLA's and linattn's (relative norm of the difference, ``relmax_*``: largest absolute
difference over the largest magnitude; cross-checks, not tests).

Usage:  python benchmarks/prefill_long.py [--out FILE] [--cases NAME,...] [--segments 0,16,32,64,128]
                                          [--flashinfer | --no-flashinfer] [--flashinfer-modes dense,pool]
Writes ``benchmarks/results/prefill_long_<device>.json`` (``benchmarks/_results.py`` schema) after
every row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from linattn.testing.compare import rel_error as rel  # noqa: E402

K = V = 128
#: (name, family, H, HV, sequence lengths)
CASES = [
    ("qwen35-tp8", "gdn", 2, 8, [65536]), ("qwen35-tp8", "gdn", 2, 8, [8192]),
    ("qwen35-tp8", "gdn", 2, 8, [1024] * 8),
    ("qwen3next-tp1", "gdn", 16, 32, [65536]), ("qwen3next-tp1", "gdn", 16, 32, [8192]),
    # issue 27's batched rows: many prompts per call, as an engine's prefill batch
    ("qwen3next-tp1", "gdn", 16, 32, [4096] * 16), ("qwen3next-tp1", "gdn", 16, 32, [1024] * 64),
    ("qwen3next-tp1", "gdn", 16, 32, [1024] * 8), ("qwen35-tp1", "gdn", 16, 64, [8192] * 4),
    ("kimi-tp1", "kda", 32, 32, [32768]),
] + [(name, fam, h, hv, [t]) for name, fam, h, hv in (("qwen35-tp2", "gdn", 8, 32), ("qwen35-tp4", "gdn", 4, 16),
                                                       ("qwen3next-tp2", "gdn", 8, 16), ("kimi-tp4", "kda", 8, 8))
     for t in (32768, 65536, 131072)]


def shape_name(lens) -> str:
    """A case's shape as the rows and ``--shapes`` name it: ``NxL`` (sequences x the first one's tokens)."""
    return f"{len(lens)}x{lens[0]}"


def make(family, H, HV, lens, seed=0):
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    T, N = sum(lens), len(lens)
    bf = torch.bfloat16
    gshape = (T, HV, K) if family == "kda" else (T, HV)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=dev, dtype=torch.int32)
    d = dict(q=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             k=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             v=torch.randn(T, HV, V, device=dev, generator=gen).to(bf),
             g=torch.nn.functional.logsigmoid(torch.randn(*gshape, device=dev, generator=gen) + 3.0),
             beta=torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen)), cu_seqlens=cu)
    idx = torch.randperm(2 * N, device=dev, generator=gen)[:N].to(torch.int32)
    pool = torch.randn(2 * N, HV, V, K, device=dev, generator=gen) * 0.1
    return d, pool, idx


def relmax(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def untouched_rows_equal(after, before, rows):
    """Whether the pool rows not in ``rows`` (int64 slots) are bitwise as they were."""
    others = torch.ones(before.shape[0], dtype=torch.bool, device=before.device).index_fill_(0, rows, False)
    return bool(torch.equal(after[others], before[others]))


def bench_ms(fn):
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def linattn_call(family, d, pool, idx, segment_chunks=None):
    from linattn.kernels.triton.prefill import chunk_prefill

    return lambda: chunk_prefill(family, **d, state_pool=pool, state_indices=idx, initial_state=None,
                                 scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk",
                                 segment_chunks=segment_chunks)


def public_columns(family, d, pool, idx) -> dict:
    """The public op (``linattn.gdn_prefill`` / ``kda_prefill``, ``validate=False``, ``backend="triton-split"``:
    linattn's own kernels, never a peer library the dispatcher may have registered) on the same call, as an
    engine makes it: the dispatcher's cached plan, not a plan per call as :func:`linattn_call`'s
    ``chunk_prefill``, so where the GPU work is short this is the time an engine pays (``linattn_public_ms``)."""
    import linattn

    op = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill

    def call():
        return op(**d, state_pool=pool, state_indices=idx, scale=K ** -0.5, validate=False, backend="triton-split")

    return {"linattn_public_ms": bench_ms(call)}


def fla_call(family, d, h0_kv):
    if family == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op
    else:
        from fla.ops.kda import chunk_kda as op
    cu = d["cu_seqlens"].long()
    cu_cpu = cu.cpu()
    args = [d[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta")]
    return lambda: op(*args, scale=K ** -0.5, initial_state=h0_kv, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)


def flashinfer_gdn():
    """``(version, None)`` when FlashInfer's GDN prefill imports, else ``(None, reason)``.

    ``import flashinfer.gdn_prefill`` runs ``flashinfer/__init__.py`` (seconds), whose kernel
    imports swallow an ImportError and leave the kernel None: the reason is then dug out here.
    """
    try:
        import flashinfer
        import flashinfer.gdn_kernels as gk
        import flashinfer.gdn_prefill  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- any failure is a reason in the results, never a crash
        return None, f"import flashinfer.gdn_prefill: {type(e).__name__}: {e}"[:500]
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and gk.chunk_gated_delta_rule_sm90 is None:
        try:
            import flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90  # noqa: F401
            why = "flashinfer.gdn_kernels.chunk_gated_delta_rule_sm90 is None"
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
        return None, f"FlashInfer {flashinfer.__version__} imports, but not its SM90 GDN prefill kernel: {why}"[:500]
    return flashinfer.__version__, None


def flashinfer_call(d, alpha, lens, h0=None, pool=None, idx=None):
    """FlashInfer's ``chunk_gated_delta_rule`` on ``d``: dense (``h0`` [N, HV, V, K] in, the final
    states into one ``output_state`` allocated here, as its docstring asks) or, with ``pool``/``idx``,
    on the pool in place (``output_state is initial_state``)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as op

    cu = d["cu_seqlens"]
    kw = dict(scale=K ** -0.5, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
              max_seqlen=max(lens), cu_seqlens_cpu=cu.cpu())
    if pool is None:
        kw.update(initial_state=h0, output_state=torch.empty_like(h0))
    else:
        kw.update(initial_state=pool, output_state=pool, state_indices=idx)
    return lambda: op(d["q"], d["k"], d["v"], alpha, d["beta"], **kw)


def flashinfer_uses_cp(N, HV):
    """Whether FlashInfer's ``use_cp="auto"`` rule takes its context-parallel kernels here."""
    from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host

    props = torch.cuda.get_device_properties(0)
    return bool(should_use_cp_host(N * HV, props.multi_processor_count, props.name,
                                   device_capability=torch.cuda.get_device_capability()))


def first_call(fn):
    """Runs ``fn`` once (FlashInfer compiles its CuTe DSL kernels here); returns its result, the
    seconds it took and the warnings it raised."""
    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
        torch.cuda.synchronize()
    return out, round(time.time() - t0, 1), [f"{w.category.__name__}: {w.message}"[:300] for w in caught]


def flashinfer_columns(d, pool, idx, lens, linattn_ms, o_plan, p_plan, fla_out, modes):
    """The FlashInfer columns of one GDN row; an exception becomes ``flashinfer_error`` (dense) or
    ``flashinfer_pool_error`` (pool), the other mode still runs."""
    T, N, rows = sum(lens), len(lens), idx.long()
    alpha = d["g"].exp().contiguous()  # FlashInfer's gate is linear alpha; FLA's and linattn's its log
    row = {}
    try:
        row["flashinfer_cp"] = flashinfer_uses_cp(N, pool.shape[1])
    except Exception as e:  # noqa: BLE001
        row["flashinfer_cp"] = f"unknown: {type(e).__name__}: {e}"[:200]
    if "dense" in modes:
        try:
            fn = flashinfer_call(d, alpha, lens, h0=pool[rows].contiguous())
            (o_fi, ht_fi), row["flashinfer_first_call_s"], row["flashinfer_warnings"] = first_call(fn)
            if fla_out is not None:
                o_f, ht_f = fla_out[0][0], fla_out[1].transpose(-1, -2)
                row["rel_o_flashinfer_vs_fla"] = rel(o_fi, o_f)
                row["rel_state_flashinfer_vs_fla"] = rel(ht_fi, ht_f)
                row["relmax_o_flashinfer_vs_fla"] = relmax(o_fi, o_f)
                row["relmax_state_flashinfer_vs_fla"] = relmax(ht_fi, ht_f)
            row["rel_o_flashinfer_vs_linattn"] = rel(o_fi, o_plan)
            row["rel_state_flashinfer_vs_linattn"] = rel(ht_fi, p_plan[rows])
            row["flashinfer_ms"] = bench_ms(fn)
            row["flashinfer_mtok_s"] = T / row["flashinfer_ms"] / 1e3
            row["x_flashinfer"] = row["flashinfer_ms"] / linattn_ms
        except Exception as e:  # noqa: BLE001 -- recorded, the benchmark goes on
            row["flashinfer_error"] = f"{type(e).__name__}: {e}"[:1000]
    if "pool" in modes:
        try:
            p_fi = pool.clone()
            o_fi, _ = flashinfer_call(d, alpha, lens, pool=p_fi, idx=idx)()
            torch.cuda.synchronize()
            row["rel_o_flashinfer_pool_vs_linattn"] = rel(o_fi, o_plan)
            row["rel_state_flashinfer_pool_vs_linattn"] = rel(p_fi[rows], p_plan[rows])
            row["flashinfer_pool_untouched_rows_equal"] = untouched_rows_equal(p_fi, pool, rows)
            row["flashinfer_pool_ms"] = bench_ms(flashinfer_call(d, alpha, lens, pool=p_fi, idx=idx))
            row["x_flashinfer_pool"] = row["flashinfer_pool_ms"] / linattn_ms
        except Exception as e:  # noqa: BLE001
            row["flashinfer_pool_error"] = f"{type(e).__name__}: {e}"[:1000]
    return row


def state_block_v(bv):
    """A context in which the pinned configuration's state stage takes ``bv`` value columns per
    program (None: unchanged; benchmarks/prefill.py's ``config_override``). A sweep only: the shipped
    value is the planner's."""
    from prefill import config_override

    return config_override({"state.block_v": bv} if bv else None)


def run_case(case, segments, have_fla, block_vs=(), flashinfer=()):
    from linattn.kernels.triton.prefill import plan_prefill

    name, family, H, HV, lens = case
    d, pool, idx = make(family, H, HV, lens)
    T = sum(lens)
    plan = plan_prefill(family, q=d["q"], v=d["v"], cu_seqlens=d["cu_seqlens"], state_pool=pool, state_indices=idx)
    row = dict(case=name, family=family, H=H, HV=HV, shape=shape_name(lens), tokens=T,
               linattn_segment_chunks=plan.segment_chunks, linattn_segment_reason=plan.segment_reason,
               linattn_fused=plan.fused is not None, linattn_fused_prep="cutedsl" if plan.fused_prep else "triton",
               linattn_fused_walk=None if plan.fused_walk is None else plan.fused_walk.walk)
    work = pool.clone()
    row["linattn_ms"] = bench_ms(linattn_call(family, d, work, idx))
    row["linattn_mtok_s"] = T / row["linattn_ms"] / 1e3
    row.update(public_columns(family, d, work, idx))
    row["segments_ms"] = {str(L): bench_ms(linattn_call(family, d, work, idx, L)) for L in segments}
    for bv in block_vs:  # the same under another state-stage block width
        with state_block_v(bv):
            row[f"segments_ms_block_v{bv}"] = {str(L): bench_ms(linattn_call(family, d, work, idx, L))
                                               for L in segments}
    p_plan, p_one = pool.clone(), pool.clone()
    o_plan, _ = linattn_call(family, d, p_plan, idx)()
    o_one, _ = linattn_call(family, d, p_one, idx, 0)()
    rows = idx.long()
    row["rel_o_vs_one_pass"] = rel(o_plan, o_one)
    row["rel_state_vs_one_pass"] = rel(p_plan[rows], p_one[rows])
    row["untouched_rows_equal"] = untouched_rows_equal(p_plan, pool, rows)
    fla_out = None
    if have_fla:
        h0_kv = pool[rows].transpose(-1, -2).contiguous()
        fla = fla_call(family, d, h0_kv)
        row["fla_ms"] = bench_ms(fla)
        row["fla_mtok_s"] = T / row["fla_ms"] / 1e3
        row["speedup_vs_fla"] = row["fla_ms"] / row["linattn_ms"]
        row["one_pass_speedup_vs_fla"] = row["fla_ms"] / row["segments_ms"]["0"] if "0" in row["segments_ms"] else None
        o_f, ht_f = fla_out = fla()
        row["rel_o_vs_fla"] = rel(o_plan, o_f[0])
        row["rel_state_vs_fla"] = rel(p_plan[rows], ht_f.transpose(-1, -2))
    if flashinfer and family == "gdn":
        row.update(flashinfer_columns(d, pool, idx, lens, row["linattn_ms"], o_plan, p_plan, fla_out, flashinfer))
    elif flashinfer:
        row["flashinfer_error"] = ("not run: FlashInfer has no chunked KDA prefill on this path (its recurrent_kda "
                                   "prefill serves SM100/SM103/SM120; elsewhere it runs its recurrent decode kernel)")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="default: benchmarks/results/prefill_long_<device>.json")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--max-tokens", type=int, default=None, help="skip cases with more tokens")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated NxL shapes to run (e.g. 16x4096,64x1024; default: every shape of the cases)")
    ap.add_argument("--segments", default="0,16,32,64,128", help="forced segment lengths to time (chunks)")
    ap.add_argument("--block-v", default="", help="also time the state stage at these block widths (sweep)")
    ap.add_argument("--flashinfer", action=argparse.BooleanOptionalAction, default=None,
                    help="time FlashInfer's GDN prefill too (default: when flashinfer.gdn_prefill imports)")
    ap.add_argument("--flashinfer-modes", default="dense,pool",
                    help="FlashInfer modes: dense (states like FLA's), pool (in place, like linattn's)")
    args = ap.parse_args()
    out = args.out or results_path("prefill_long")
    try:
        import fla  # noqa: F401
        have_fla = True
    except ImportError:
        have_fla = False
    fi_modes, fi_note = (), "FlashInfer not run (--no-flashinfer)."
    if args.flashinfer is not False:
        fi_version, why = flashinfer_gdn()
        if fi_version:
            fi_modes = tuple(m for m in args.flashinfer_modes.split(",") if m in ("dense", "pool"))
            fi_note = (f"flashinfer_*: FlashInfer {fi_version} chunk_gated_delta_rule (GDN; backend auto, use_cp "
                       "auto: flashinfer_cp says whether its context-parallel kernels ran), l2norm in kernel, "
                       "max_seqlen and cu_seqlens_cpu given, gate as linear alpha = exp(g) (fp32, computed once "
                       "outside the timing), fp32 states [N, HV, V, K]; modes " + ",".join(fi_modes) + ": dense "
                       "(initial state given, final state returned, like FLA) and pool (initial_state = output_state = "
                       "the pool, state_indices, like linattn); x_flashinfer* = FlashInfer ms / linattn ms (above 1: "
                       "linattn faster); flashinfer_first_call_s includes its CuTe DSL compiles.")
        elif args.flashinfer:
            print(f"--flashinfer: {why}", file=sys.stderr)
            fi_note = f"FlashInfer asked for but not run: {why}"
        else:
            fi_note = f"FlashInfer not run: {why}"
    segments = [int(s) for s in args.segments.split(",") if s != ""]
    names = None if args.cases is None else set(args.cases.split(","))
    shapes = set(args.shapes.split(",")) if args.shapes else None
    known = {shape_name(c[4]) for c in CASES if names is None or c[0] in names}
    unknown = shapes - known if shapes else set()
    if unknown:
        raise SystemExit(f"--shapes {sorted(unknown)} match no case; the cases' shapes: {sorted(known)}")
    notes = [
        "Triton chunked prefill in pool mode on long prompts at per-rank heads (K = V = 128, bf16 q/k/v, fp32 pool "
        "'vk'): linattn_* the planner's choice of the segment-parallel state pass, segments_ms the same with the "
        "segment length forced (0: one pass per sequence, the path before the segment-parallel pass), fla_* FLA 0.6 "
        "with dense states and cu_seqlens_cpu; triton do_bench medians (warmup 25 ms, rep 100 ms).",
        "rel_*: relative norm of the difference of outputs / final states (cross-checks on the same data).",
    ] + ([] if have_fla else ["flash-linear-attention not installed: no FLA columns."]) + [fi_note]
    results = []
    for case in CASES:
        if (names and case[0] not in names) or (args.max_tokens and sum(case[4]) > args.max_tokens):
            continue
        if shapes and shape_name(case[4]) not in shapes:
            continue
        t0 = time.time()
        row = run_case(case, segments, have_fla, [int(b) for b in args.block_v.split(",") if b], fi_modes)
        row["wall_s"] = round(time.time() - t0, 1)
        results.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        write_results(out, results, notes)
        torch.cuda.empty_cache()
    print(f"\nwrote {out}")
    for r in results:
        print(f"{r['case']:14} {r['family']} {r['shape']:9} linattn {r['linattn_mtok_s']:6.2f} Mtok/s "
              f"(L={r['linattn_segment_chunks']}) x FLA {r.get('speedup_vs_fla', float('nan')):5.2f} "
              f"(one pass {r.get('one_pass_speedup_vs_fla') or float('nan'):5.2f})  "
              + " ".join(f"{k}:{v:.3f}" for k, v in r["segments_ms"].items())
              + (f"  x FlashInfer {r['x_flashinfer']:5.2f}" if "x_flashinfer" in r else "")
              + (f" (pool {r['x_flashinfer_pool']:5.2f})" if "x_flashinfer_pool" in r else "")
              + (f"  FlashInfer: {r['flashinfer_error'][:120]}" if "flashinfer_error" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
