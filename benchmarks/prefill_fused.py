"""The fused prefill (GDN: kernels/triton/chunk_fused.py; KDA: chunk_fused_kda.py) against the pipeline and
FLA, on the H200.

For each shape of issue 27's table (bf16 q/k/v, l2norm in the kernel, fp32 "vk" pool, K = V = 128;
KDA at Kimi-Linear's head counts, :data:`KDA_SHAPES`) it checks the fused prefill against the
pipeline (``fused=False``) on the same data (relative difference of the outputs and of the pool rows
written; rows not owned bitwise unchanged) and against FLA 0.6 ``chunk_gated_delta_rule`` /
``chunk_kda`` (dense states), then times with
``triton.testing.do_bench`` (medians, ms): the pipeline, FLA, and the fused prefill under each
launch configuration of ``VARIANTS`` (the first is the pinned :func:`fused_config`; with the Triton prep,
whose knobs they set), plus the
profiler's split of the pinned fused call into its kernels. The fused prefill runs the walk its plan
chose (``fused_walk``: on SM90 the CuTe DSL ``wgmma`` walk for GDN, ``LINATTN_CUTEDSL_WALK``); where
that is not the Triton walk, ``fused_triton_walk_ms`` times the same call with the switch at ``0``; where
the plan runs the CuTe DSL prep (``fused_prep``, ``LINATTN_CUTEDSL_PREP``), ``fused_triton_prep_ms`` times it with the
Triton prep.

Gates (``--gates``, default ``mild,realistic``): the row is measured on the first kind (``mild``:
``logsigmoid(N(3, 1))``); each further kind (``realistic``: the family's model initialisation from
:mod:`linattn.testing.gates` (GDN: Qwen3-Next, one strong-decay head in 8; KDA: Kimi-Linear), or a
model's name) adds a sub-dict with the same checks and the pipeline, pinned fused and FLA medians on
its own data (KDA's with the share of channel blocks off the fast path, ``decay``).

Families (``--families``, default ``gdn``): each row names its ``family``. ``--keep`` keeps the rows
of the output file whose family this run does not measure (so a KDA run adds its rows beside the
committed GDN ones). KDA's fused prefill is not the planner's default (``prefill.plan.FUSED_KDA_DEFAULT``):
its rows' ``planner_fused`` says so until that is set.

Writes the ``benchmarks/_results.py`` schema after every shape (default
``benchmarks/results/prefill_fused_<device>.json``).

Usage:  python benchmarks/prefill_fused.py [--out FILE] [--families gdn,kda] [--keep]
        [--shapes 16x4096@16/32,...] [--quick] [--gates mild,realistic] [--prep-variants]

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
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from prefill import bench_ms, rel, stage_times  # noqa: E402

from linattn.kernels.triton.prefill import SolveConfig  # noqa: E402
from linattn.kernels.cutedsl.fused_prep import ENV_SWITCH as PREP_SWITCH  # noqa: E402
from linattn.kernels.cutedsl.fused_walk import ENV_SWITCH as WALK_SWITCH  # noqa: E402

#: (N, L, H, HV): issue 27's shapes (GDN)
SHAPES = [(16, 4096, 16, 32), (64, 1024, 16, 32), (8, 1024, 16, 32), (4, 8192, 16, 64), (1, 65536, 2, 8),
          (8, 1024, 2, 8)]
#: KDA's: Kimi-Linear at TP1 (H = HV = 32; 16 x 4,096 is issue 27's target row) and TP8 (H = HV = 4)
KDA_SHAPES = [(16, 4096, 32, 32), (64, 1024, 32, 32), (8, 1024, 32, 32), (1, 65536, 4, 4)]
K = V = 128
#: (block_v, num_warps, num_stages, prep_ctas_per_sm, prep_block_k, prep_maxnreg), GDN's prep keys shared; with
#: --quick only the pinned configuration with its prep keys unshared (GDN) or the first (KDA) is a variant
VARIANTS = [(64, 4, 2, 4, 64, None), (64, 4, 3, 4, 64, None), (32, 4, 2, 4, 64, None), (128, 8, 2, 4, 64, None),
            (64, 4, 2, 4, 32, None), (64, 4, 2, 4, 32, 128), (64, 4, 2, 3, 32, 168), (64, 4, 2, 4, 64, 128)]
#: KDA's variants, the same fields and late_keys last (its prep runs the KDA system kernel's channel blocks:
#: prep_block_k does not apply); the first: the pinned one
KDA_VARIANTS = [(64, 8, 1, 4, 32, None, True), (64, 8, 1, 4, 32, None, False), (64, 8, 2, 4, 32, None, True),
                (64, 4, 1, 4, 32, None, True), (64, 4, 2, 4, 32, None, False), (32, 4, 1, 4, 32, None, True),
                (128, 8, 1, 4, 32, None, True), (64, 8, 1, 8, 32, 128, True), (64, 8, 1, 3, 32, 168, True)]


def make(family, N, L, H, HV, seed=0, gates="mild"):
    """Inputs of one shape; ``gates`` other than "mild" replaces g and beta (linattn.testing.gates)."""
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)
    T = N * L
    gshape = (T, HV, K) if family == "kda" else (T, HV)
    d = dict(q=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             k=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             v=torch.randn(T, HV, V, device=dev, generator=gen).to(bf),
             g=torch.nn.functional.logsigmoid(torch.randn(*gshape, device=dev, generator=gen) + 3.0),
             beta=torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen)),
             cu_seqlens=torch.arange(0, T + 1, L, device=dev, dtype=torch.int32))
    P = 2 * N
    idx = torch.randperm(P, device=dev, generator=gen)[:N].to(torch.int32)
    pool = torch.randn(P, HV, V, K, device=dev, generator=gen) * 0.1
    if gates != "mild":
        from linattn.testing.gates import gate_tensors

        d["g"], d["beta"] = gate_tensors(gates, family, T, HV, K, seed=seed, device=dev)
    return d, pool, idx


def linattn(family, d, pool, idx, fused, cfg=None):
    from linattn.kernels.triton import prefill as pm

    plan = pm.plan_prefill(family, q=d["q"], v=d["v"], cu_seqlens=d["cu_seqlens"], state_pool=pool,
                           state_indices=idx, fused=fused, fused_cfg=cfg)
    return plan, lambda: pm.run_prefill(plan, **d, scale=K ** -0.5, state_pool=pool, state_indices=idx)


def fla_fn(family, d, pool, idx):
    if family == "kda":
        from fla.ops.kda import chunk_kda as op
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op

    cu64 = d["cu_seqlens"].long()
    cu_cpu = cu64.cpu()
    q, k, v, g, beta = (d[n].unsqueeze(0) for n in ("q", "k", "v", "g", "beta"))
    h0 = pool.index_select(0, idx.long()).transpose(-1, -2).contiguous()  # FLA: [N, HV, K, V]
    return lambda: op(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu64, cu_seqlens_cpu=cu_cpu)


def owned(pool, idx):
    """``[P]`` bool: the pool rows the call's ``idx`` names (the rows it may write)."""
    own = torch.zeros(pool.shape[0], dtype=torch.bool, device=pool.device)
    own[idx.long()] = True
    return own


def check(family, d, pool, idx):
    """The fused prefill against the pipeline and FLA on one set of data (relative differences)."""
    pools = {}
    outs = {}
    for name, fused in (("pipeline", False), ("fused", True)):
        p = pool.clone()
        outs[name] = linattn(family, d, p, idx, fused)[1]()[0]
        pools[name] = p
    own = owned(pool, idx)
    row = dict(o_rel_fused_vs_pipeline=rel(outs["fused"], outs["pipeline"]),
               ht_rel_fused_vs_pipeline=rel(pools["fused"][own], pools["pipeline"][own]),
               rows_not_owned_unchanged=bool(torch.equal(pools["fused"][~own], pool[~own])))
    try:
        o_f, ht_f = fla_fn(family, d, pool, idx)()
        row["o_rel_fused_vs_fla"] = rel(outs["fused"], o_f[0])
        row["ht_rel_fused_vs_fla"] = rel(pools["fused"][idx.long()], ht_f.transpose(-1, -2))
        row["o_rel_pipeline_vs_fla"] = rel(outs["pipeline"], o_f[0])
    except Exception as e:  # noqa: BLE001 - FLA missing or failing: recorded, not fatal
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def gates_row(family, N, L, H, HV, kind, with_variants=False):
    """The checks and the pipeline / pinned fused / FLA medians on one further gate kind's data (and
    the :data:`PREP_VARIANTS` where ``with_variants``, GDN)."""
    from linattn.kernels.triton.chunk_fused import fused_config
    from linattn.testing.gates import decay_summary, resolve

    d, pool, idx = make(family, N, L, H, HV, gates=kind)
    row = dict(model=resolve(kind, family).name, decay=decay_summary(d["g"], d["cu_seqlens"]))
    row.update(check(family, d, pool, idx))
    row["pipeline_ms"] = bench_ms(linattn(family, d, pool, idx, False)[1])
    row["fused_ms"] = bench_ms(linattn(family, d, pool, idx, True, fused_config(K, V, torch.bfloat16, family))[1])
    row["speedup_vs_pipeline"] = row["pipeline_ms"] / row["fused_ms"]
    try:
        row["fla_ms"] = bench_ms(fla_fn(family, d, pool, idx))
        row["speedup_vs_fla"] = row["fla_ms"] / row["fused_ms"]
    except Exception as e:  # noqa: BLE001 - FLA missing or failing: recorded, not fatal
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    if with_variants and family == "gdn":
        row["prep_variants"] = prep_variants(family, d, pool, idx)
    return row


def run_shape(family, N, L, H, HV, quick, kinds=("mild",), with_variants=False):
    from linattn.kernels.triton.chunk_fused import FusedConfig, fused_config

    d, pool, idx = make(family, N, L, H, HV, gates=kinds[0])
    row = dict(family=family, shape=f"{N}x{L}", heads=f"({H}, {HV})", tokens=N * L, gates=kinds[0])
    row.update(check(family, d, pool, idx))
    plan, fn = linattn(family, d, pool, idx, False)
    row["pipeline_ms"] = bench_ms(fn)
    row["pipeline_segments"] = plan.segment_chunks
    auto, _ = linattn(family, d, pool, idx, None)
    row["planner_fused"] = auto.fused is not None
    row["planner_reason"] = auto.fused_reason
    fused_plan = linattn(family, d, pool, idx, True)[0]
    walk = fused_plan.fused_walk  # the walk of the fused prefill (LINATTN_CUTEDSL_WALK)
    row["fused_walk"] = None if walk is None else walk._asdict()
    row["fused_prep"] = "cutedsl" if fused_plan.fused_prep else "triton"  # its prep (LINATTN_CUTEDSL_PREP)
    try:
        row["fla_ms"] = bench_ms(fla_fn(family, d, pool, idx))
    except Exception as e:  # noqa: BLE001
        row["fla_ms"] = None
        row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
    pinned = fused_config(K, V, torch.bfloat16, family)
    variants = {}
    table = KDA_VARIANTS if family == "kda" else VARIANTS
    configs = [FusedConfig(block_v=bv, num_warps=nw, num_stages=ns, prep_warps=4, prep_ctas_per_sm=ctas,
                           prep_block_k=pbk, prep_maxnreg=preg, late_keys=bool(late and late[0]))
               for bv, nw, ns, ctas, pbk, preg, *late in table]
    if family == "gdn":  # the pinned one with its prep's GVA key sharing flipped (prep_shared_keys)
        configs = [dataclasses.replace(pinned, prep_shared_keys=not pinned.prep_shared_keys)] + configs
    for cfg in (configs[:1] if quick else configs):
        key = (f"bv{cfg.block_v}_w{cfg.num_warps}_s{cfg.num_stages}_p{cfg.prep_ctas_per_sm}_bk{cfg.prep_block_k}"
               f"_r{cfg.prep_maxnreg}" + ("_late" if cfg.late_keys else "")
               + ("" if family == "kda" or cfg.prep_shared_keys else "_unshared"))
        try:  # with the Triton prep, whose knobs these are (the CuTe DSL prep has none of them)
            with mock.patch.dict(os.environ, {PREP_SWITCH: "0"}):
                variants[key] = bench_ms(linattn(family, d, pool, idx, True, cfg)[1])
        except Exception as e:  # noqa: BLE001 - a variant that fails to build is recorded
            variants[key] = f"{type(e).__name__}: {e}"[:200]
    row["fused_variants_ms"] = variants
    row["fused_pinned"] = dataclasses.asdict(pinned)
    row["fused_ms"] = bench_ms(linattn(family, d, pool, idx, True, pinned)[1])
    row["fused_stages_ms"] = stage_times(linattn(family, d, pool, idx, True, pinned)[1])
    if family == "kda":  # the pipeline's split too: issue 27's KDA profile names its stages
        row["pipeline_stages_ms"] = stage_times(fn)
    row["speedup_vs_pipeline"] = row["pipeline_ms"] / row["fused_ms"]
    if row.get("fla_ms"):
        row["speedup_vs_fla"] = row["fla_ms"] / row["fused_ms"]
    if walk is not None and walk.walk != "triton":  # the same fused prefill with the Triton walk (switch "0")
        with mock.patch.dict(os.environ, {WALK_SWITCH: "0"}):
            row["fused_triton_walk_ms"] = bench_ms(linattn(family, d, pool, idx, True, pinned)[1])
        row["fused_walk_speedup"] = row["fused_triton_walk_ms"] / row["fused_ms"]
    if fused_plan.fused_prep:  # the same fused prefill with the Triton prep (switch "0")
        with mock.patch.dict(os.environ, {PREP_SWITCH: "0"}):
            row["fused_triton_prep_ms"] = bench_ms(linattn(family, d, pool, idx, True, pinned)[1])
        row["fused_prep_speedup"] = row["fused_triton_prep_ms"] / row["fused_ms"]
    if with_variants and family == "gdn":
        row["prep_variants"] = prep_variants(family, d, pool, idx)
    del d, pool
    for kind in kinds[1:]:
        torch.cuda.empty_cache()
        row[kind] = gates_row(family, N, L, H, HV, kind, with_variants)
    return row


#: --prep-variants (GDN): the pinned fused prefill with its prep changed, each a ``PrefillConfig`` override
#: by field path (``FusedConfig`` sweeps are run_shape's VARIANTS). "diag_tf32": the solve's diagonal 16 x 16 blocks on single
#: TF32 dots instead of 3xTF32 (``intra.solve``, shared with the pipeline's stage 1; the prep's largest
#: instruction share: docs/performance.md, "Where the prep's instructions go"). Measured and not shipped
#: (same section): the all-TF32 solve (NaN on the worst-conditioned input) and 6dc8ded's rank-1 gate
#: factors (``prep_gate_factors``, slower)
PREP_VARIANTS = {"diag_tf32": {"intra.solve": SolveConfig(neumann=True, diag_precision="tf32", below_precision="tf32")}}


def prep_variants(family, d, pool, idx) -> dict:
    """Each :data:`PREP_VARIANTS` entry on the row's data: fused median and kernel times, and its output
    and written rows against the shipped Triton prep's (relative), rows not owned unchanged. All with the
    Triton prep (``LINATTN_CUTEDSL_PREP=0``), whose configuration the variants change."""
    with mock.patch.dict(os.environ, {PREP_SWITCH: "0"}):
        return _prep_variants(family, d, pool, idx)


def _prep_variants(family, d, pool, idx) -> dict:
    from linattn.kernels.triton.chunk_fused import fused_config
    from prefill import config_override

    pinned = fused_config(K, V, torch.bfloat16, family)
    base = pool.clone()
    o_ref = linattn(family, d, base, idx, True, pinned)[1]()[0]
    own = owned(pool, idx)
    out = {}
    for name, over in PREP_VARIANTS.items():
        with config_override(over):
            p = pool.clone()
            o = linattn(family, d, p, idx, True, pinned)[1]()[0]
            out[name] = dict(config=repr(over), o_rel_vs_shipped=rel(o, o_ref),
                             ht_rel_vs_shipped=rel(p[own], base[own]),
                             rows_not_owned_unchanged=bool(torch.equal(p[~own], pool[~own])),
                             fused_ms=bench_ms(linattn(family, d, pool.clone(), idx, True, pinned)[1]),
                             fused_stages_ms=stage_times(linattn(family, d, pool.clone(), idx, True, pinned)[1]))
    return out


def kept_rows(path, families) -> tuple[list, list]:
    """``--keep``: the rows of the results file at ``path`` (none if absent) whose family (``gdn`` where
    unnamed: rows from before KDA's) this run does not measure, each marked with the command and commit
    that measured it, and that file's notes."""
    from _results import read_results

    if not os.path.exists(path):
        return [], []
    old = read_results(path)
    rows = [dict(r, measured_by=r.get("measured_by", f"{old.command} @ {old.commit}"))
            for r in old.rows if r.get("family", "gdn") not in families]
    return rows, list(old.notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--families", default="gdn", help="gdn, kda or both (each with its own default shapes)")
    ap.add_argument("--keep", action="store_true", help="keep the output file's rows of the other families")
    ap.add_argument("--shapes", default=None, help="e.g. 16x4096@16/32,1x65536@2/8 (for every family given)")
    ap.add_argument("--quick", action="store_true", help="the pinned configuration only")
    ap.add_argument("--prep-variants", action="store_true",
                    help="GDN: also the pinned fused prefill with each PREP_VARIANTS prep (row key prep_variants)")
    ap.add_argument("--gates", default="mild,realistic",
                    help="gate kinds: mild, realistic, or a model of linattn.testing.gates of each family "
                         "(the first fills the row)")
    a = ap.parse_args()
    from linattn.testing.gates import MODELS

    families = tuple(f for f in a.families.split(",") if f)
    if not families or set(families) - {"gdn", "kda"}:
        ap.error(f"--families takes gdn, kda or both; got {a.families!r}")
    kinds = tuple(k for k in a.gates.split(",") if k)
    for k in kinds:
        if k not in ("mild", "realistic") and (k not in MODELS or set(families) != {MODELS[k].family}):
            ap.error(f"unknown gate kind {k!r}, or a model of another family than {list(families)}; kinds: mild, "
                     f"realistic, {', '.join(n for n, m in MODELS.items() if m.family in families)}")
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # FLA's own Triton kernels, not a plugin backend
    custom = None
    if a.shapes:
        custom = []
        for s in a.shapes.split(","):
            nl, hh = s.split("@")
            n, ln = nl.split("x")
            h, hv = hh.split("/")
            custom.append((int(n), int(ln), int(h), int(hv)))
    out = a.out or results_path("prefill_fused")
    rows, old_notes = kept_rows(out, families) if a.keep else ([], [])
    notes = ["bf16 q/k/v, l2norm in kernel, fp32 'vk' pool (FLA: dense [N,HV,K,V] h0), K = V = 128; triton "
             "do_bench medians (ms); FLA 0.6 (chunk_gated_delta_rule, chunk_kda) with FLA_DISABLE_BACKEND_DISPATCH=1",
             f"Gates {list(kinds)}: mild = logsigmoid(N(3,1)); realistic = the family's model initialisation "
             "(linattn.testing.gates: GDN Qwen3-Next, 1 head in 8 a strong-decay head; KDA Kimi-Linear). The row's "
             "columns are the first kind's; each further kind is a sub-dict (checks, pipeline_ms, fused_ms, fla_ms, "
             "decay).",
             "KDA rows: the fused KDA prefill (kernels/triton/chunk_fused_kda.py) is forced (fused=True); the planner "
             "keeps KDA's pipeline until prefill.plan.FUSED_KDA_DEFAULT is set (planner_fused, planner_reason)."]
    if rows:
        notes.append("Rows with measured_by were kept (--keep) from the earlier file; their own command and commit.")
    notes += [n for n in old_notes if n not in notes]
    for family in families:
        for shp in custom or (KDA_SHAPES if family == "kda" else SHAPES):
            rows.append(run_shape(family, *shp, a.quick, kinds, a.prep_variants))
            print(rows[-1], flush=True)
            write_results(out, rows, notes=notes)
    return rows


if __name__ == "__main__":
    main()
