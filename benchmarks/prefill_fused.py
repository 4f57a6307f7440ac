"""The fused GDN prefill (kernels/triton/chunk_fused.py) against the pipeline and FLA, on the H200.

For each shape of issue 27's table (bf16 q/k/v, l2norm in the kernel, fp32 "vk" pool, K = V = 128)
it checks the fused prefill against the pipeline (``fused=False``) on the same data (relative
difference of the outputs and of the pool rows written; rows not owned bitwise unchanged) and
against FLA 0.6 ``chunk_gated_delta_rule`` (dense states), then times with
``triton.testing.do_bench`` (medians, ms): the pipeline, FLA, and the fused prefill under each
launch configuration of ``VARIANTS`` (the first is the pinned :func:`fused_config`), plus the
profiler's split of the pinned fused call into its kernels.

Gates (``--gates``, default ``mild,realistic``): the row is measured on the first kind (``mild``:
``logsigmoid(N(3, 1))``); each further kind (``realistic``: Qwen3-Next's initialisation from
:mod:`linattn.testing.gates`, one strong-decay head in 8; or a GDN model's name) adds a sub-dict
with the same checks and the pipeline, pinned fused and FLA medians on its own data.

Writes the ``benchmarks/_results.py`` schema after every shape (default
``benchmarks/results/prefill_fused_<device>.json``).

Usage:  python benchmarks/prefill_fused.py [--out FILE] [--shapes 16x4096@16/32,...] [--quick]
        [--gates mild,realistic]

On a GPU machine without a development install (as in benchmarks/decode_device.sh: the dependency
wheels in ``.whl``, linattn installed into a target folder, ``PYTHONSAFEPATH=1`` so that the repo
root's ``linattn/`` folder, not the package, is never imported)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site .
    PYTHONPATH=/tmp/site PYTHONSAFEPATH=1 python3 benchmarks/prefill_fused.py --out $OUT/prefill_fused_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from prefill import bench_ms, rel, stage_times  # noqa: E402

#: (N, L, H, HV): issue 27's shapes
SHAPES = [(16, 4096, 16, 32), (64, 1024, 16, 32), (8, 1024, 16, 32), (4, 8192, 16, 64), (1, 65536, 2, 8),
          (8, 1024, 2, 8)]
K = V = 128
#: (block_v, num_warps, num_stages, prep_ctas_per_sm, prep_block_k, prep_maxnreg); the first: the pinned one
VARIANTS = [(64, 4, 2, 4, 64, None), (64, 4, 3, 4, 64, None), (32, 4, 2, 4, 64, None), (128, 8, 2, 4, 64, None),
            (64, 4, 2, 4, 32, None), (64, 4, 2, 4, 32, 128), (64, 4, 2, 3, 32, 168), (64, 4, 2, 4, 64, 128)]


def make(N, L, H, HV, seed=0, gates="mild"):
    """Inputs of one shape; ``gates`` other than "mild" replaces g and beta (linattn.testing.gates)."""
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)
    T = N * L
    d = dict(q=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             k=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             v=torch.randn(T, HV, V, device=dev, generator=gen).to(bf),
             g=torch.nn.functional.logsigmoid(torch.randn(T, HV, device=dev, generator=gen) + 3.0),
             beta=torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen)),
             cu_seqlens=torch.arange(0, T + 1, L, device=dev, dtype=torch.int32))
    P = 2 * N
    idx = torch.randperm(P, device=dev, generator=gen)[:N].to(torch.int32)
    pool = torch.randn(P, HV, V, K, device=dev, generator=gen) * 0.1
    if gates != "mild":
        from linattn.testing.gates import gate_tensors

        d["g"], d["beta"] = gate_tensors(gates, "gdn", T, HV, K, seed=seed, device=dev)
    return d, pool, idx


def linattn(d, pool, idx, fused, cfg=None):
    from linattn.kernels.triton import prefill as pm

    plan = pm.plan_prefill("gdn", q=d["q"], v=d["v"], cu_seqlens=d["cu_seqlens"], state_pool=pool,
                           state_indices=idx, fused=fused, fused_cfg=cfg)
    return plan, lambda: pm.run_prefill(plan, **d, scale=K ** -0.5, state_pool=pool, state_indices=idx)


def fla_fn(d, pool, idx):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op

    cu64 = d["cu_seqlens"].long()
    cu_cpu = cu64.cpu()
    q, k, v, g, beta = (d[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta"))
    h0 = pool.index_select(0, idx.long()).transpose(-1, -2).contiguous()  # FLA: [N, HV, K, V]
    return lambda: op(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, cu_seqlens_cpu=cu_cpu)


def check(d, pool, idx):
    """The fused prefill against the pipeline and FLA on one set of data (relative differences)."""
    pools = {}
    outs = {}
    for name, fused in (("pipeline", False), ("fused", True)):
        p = pool.clone()
        outs[name] = linattn(d, p, idx, fused)[1]()[0]
        pools[name] = p
    own = torch.zeros(pool.shape[0], dtype=torch.bool, device=pool.device)
    own[idx.long()] = True
    row = dict(o_rel_fused_vs_pipeline=rel(outs["fused"], outs["pipeline"]),
               ht_rel_fused_vs_pipeline=rel(pools["fused"][own], pools["pipeline"][own]),
               rows_not_owned_unchanged=bool(torch.equal(pools["fused"][~own], pool[~own])))
    try:
        o_f, ht_f = fla_fn(d, pool, idx)()
        row["o_rel_fused_vs_fla"] = rel(outs["fused"], o_f[0])
        row["ht_rel_fused_vs_fla"] = rel(pools["fused"][idx.long()], ht_f.transpose(-1, -2))
        row["o_rel_pipeline_vs_fla"] = rel(outs["pipeline"], o_f[0])
    except Exception as e:  # noqa: BLE001 - FLA missing or failing: recorded, not fatal
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def gates_row(N, L, H, HV, kind):
    """The checks and the pipeline / pinned fused / FLA medians on one further gate kind's data."""
    from linattn.kernels.triton.chunk_fused import fused_config
    from linattn.testing.gates import decay_summary, resolve

    d, pool, idx = make(N, L, H, HV, gates=kind)
    row = dict(model=resolve(kind, "gdn").name, decay=decay_summary(d["g"], d["cu_seqlens"]))
    row.update(check(d, pool, idx))
    row["pipeline_ms"] = bench_ms(linattn(d, pool, idx, False)[1])
    row["fused_ms"] = bench_ms(linattn(d, pool, idx, True, fused_config(K, V, torch.bfloat16))[1])
    row["speedup_vs_pipeline"] = row["pipeline_ms"] / row["fused_ms"]
    try:
        row["fla_ms"] = bench_ms(fla_fn(d, pool, idx))
        row["speedup_vs_fla"] = row["fla_ms"] / row["fused_ms"]
    except Exception as e:  # noqa: BLE001 - FLA missing or failing: recorded, not fatal
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def run_shape(N, L, H, HV, quick, kinds=("mild",)):
    from linattn.kernels.triton.chunk_fused import FusedConfig, fused_config

    d, pool, idx = make(N, L, H, HV, gates=kinds[0])
    row = dict(shape=f"{N}x{L}", heads=f"({H}, {HV})", tokens=N * L, gates=kinds[0])
    row.update(check(d, pool, idx))
    plan, fn = linattn(d, pool, idx, False)
    row["pipeline_ms"] = bench_ms(fn)
    row["pipeline_segments"] = plan.segment_chunks
    auto, _ = linattn(d, pool, idx, None)
    row["planner_fused"] = auto.fused is not None
    row["planner_reason"] = auto.fused_reason
    try:
        row["fla_ms"] = bench_ms(fla_fn(d, pool, idx))
    except Exception as e:  # noqa: BLE001
        row["fla_ms"] = None
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    pinned = fused_config(K, V, torch.bfloat16)
    variants = {}
    for bv, nw, ns, ctas, pbk, preg in (VARIANTS[:1] if quick else VARIANTS):
        cfg = FusedConfig(block_v=bv, num_warps=nw, num_stages=ns, prep_warps=4, prep_ctas_per_sm=ctas,
                          prep_block_k=pbk, prep_maxnreg=preg)
        key = f"bv{bv}_w{nw}_s{ns}_p{ctas}_bk{pbk}_r{preg}"
        try:
            variants[key] = bench_ms(linattn(d, pool, idx, True, cfg)[1])
        except Exception as e:  # noqa: BLE001 - a variant that fails to build is recorded
            variants[key] = f"{type(e).__name__}: {e}"[:200]
    row["fused_variants_ms"] = variants
    row["fused_pinned"] = dataclasses.asdict(pinned)
    row["fused_ms"] = bench_ms(linattn(d, pool, idx, True, pinned)[1])
    row["fused_stages_ms"] = stage_times(linattn(d, pool, idx, True, pinned)[1])
    row["speedup_vs_pipeline"] = row["pipeline_ms"] / row["fused_ms"]
    if row.get("fla_ms"):
        row["speedup_vs_fla"] = row["fla_ms"] / row["fused_ms"]
    del d, pool
    for kind in kinds[1:]:
        torch.cuda.empty_cache()
        row[kind] = gates_row(N, L, H, HV, kind)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=None, help="e.g. 16x4096@16/32,1x65536@2/8")
    ap.add_argument("--quick", action="store_true", help="the pinned configuration only")
    ap.add_argument("--gates", default="mild,realistic",
                    help="gate kinds: mild, realistic, or a GDN model of linattn.testing.gates (the first fills the row)")
    a = ap.parse_args()
    from linattn.testing.gates import MODELS

    kinds = tuple(k for k in a.gates.split(",") if k)
    for k in kinds:
        if k not in ("mild", "realistic") and MODELS.get(k, MODELS["kimi-linear"]).family != "gdn":
            ap.error(f"unknown or non-GDN gate kind {k!r}; kinds: mild, realistic, "
                     f"{', '.join(n for n, m in MODELS.items() if m.family == 'gdn')}")
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # FLA's own Triton kernels, not a plugin backend
    shapes = SHAPES
    if a.shapes:
        shapes = []
        for s in a.shapes.split(","):
            nl, hh = s.split("@")
            n, ln = nl.split("x")
            h, hv = hh.split("/")
            shapes.append((int(n), int(ln), int(h), int(hv)))
    out = a.out or results_path("prefill_fused")
    rows = []
    for shp in shapes:
        rows.append(run_shape(*shp, a.quick, kinds))
        print(rows[-1], flush=True)
        write_results(out, rows, notes=["bf16 q/k/v, l2norm in kernel, fp32 'vk' pool (FLA: dense [N,HV,K,V] h0), "
                      "K = V = 128; triton do_bench medians (ms); FLA 0.6 with FLA_DISABLE_BACKEND_DISPATCH=1",
                      f"Gates {list(kinds)}: mild = logsigmoid(N(3,1)); realistic = Qwen3-Next's initialisation "
                      "(linattn.testing.gates, 1 head in 8 a strong-decay head). The row's columns are the first "
                      "kind's; each further kind is a sub-dict (checks, pipeline_ms, fused_ms, fla_ms, decay)."])
    return rows


if __name__ == "__main__":
    main()
