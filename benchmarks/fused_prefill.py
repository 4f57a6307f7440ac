"""The one-kernel GDN prefill against the two kernels it fuses, on an SM90 GPU (issue 27).

kernels/cutedsl/fused_prefill.py (``LINATTN_CUTEDSL_WALK=fused``) against the CuTe DSL prep, then the
``wgmma`` walk (the planner's default).

Per shape (benchmarks/fused_walk.py's inputs: bf16 q/k/v, l2norm, fp32 "vk" pool, "mild" gates) the call
is planned once per switch and its tables made once; both run once on the same inputs and are compared
(outputs and pool rows: bitwise equal expected, rows not owned unchanged); then
``launch_fused_stages`` is timed (``triton.testing.do_bench`` medians, ms) for the two kernels and for
the one kernel at each build of ``--regs``: ``prep/walk`` registers a thread (``setmaxnreg``), with
``:tma`` the k / q tiles by TMA, ``:cpasync`` by the prep's ``cp.async``, neither: the shipped loads
(``fused_prefill.TMA``, ``cp.async``).

Writes the ``benchmarks/_results.py`` schema (``$LINATTN_RESULTS_DIR/fused_prefill_<device>.json``;
default benchmarks/results/) after every shape; the canonical rows live in
``benchmarks/results/prefill_fused_h200.json`` (kind ``one_kernel``).

``--ablate`` times the build (the first ``--regs`` split) with named parts made no-ops instead (kind
``one_kernel_ablation``; dense states, no initial state; timing only: the outputs are meaningless), which says what bounds the kernel: ``idle`` the walk's chunk
products, ``wtiles`` the walk's K K^T / Q K^T tiles, ``solve`` the prep's solve, ``norms`` its q / k norms,
``gates`` its gates' scan, ``loads`` its k, q, v loads, ``store`` the walk's output rows; a variant is
``x[:part+part..]`` (``x`` alone: nothing removed). A variant without ``loads`` runs the ``cp.async`` build
(TMA's waits would never end without its loads); each row names its build's loads.

Usage:  python benchmarks/fused_prefill.py [--shapes 16x4096@16/32,4x8192@16/64,8x1024@16/32] [--regs 112/192,112/192:tma,..]
        [--l2norm on|off|both] [--ablate x,x:idle,x:idle+wtiles,..]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from fused_walk import Call, make, parse, run_shapes, switch  # noqa: E402

SHAPES = "16x4096@16/32,4x8192@16/64,8x1024@16/32"
REGS_VARIANTS = "112/192"
#: the parts ``--ablate`` can make no-ops: (class: the one kernel's or its prep's, method)
PARTS = {"idle": ("prefill", "chunk_products"), "wtiles": ("prefill", "walk_tiles"), "store": ("prefill", "output_rows"),
         "loads": ("prefill", "load_kqv"), "solve": ("prep", "solve_one_head"), "norms": ("prep", "row_norm"),
         "gates": ("prep", "scan_gates")}


def measure(N, L, H, HV, regs_variants, l2norm=True) -> dict:
    from triton.testing import do_bench

    from linattn.kernels.cutedsl import fused_prefill as fpk

    d, pool0, idx = make(N, L, H, HV)
    if not l2norm:  # the rows unit length beforehand, as FlashInfer's comparison (issue 27's table) takes them
        d["q"] = torch.nn.functional.normalize(d["q"].float(), dim=-1).to(torch.bfloat16)
        d["k"] = torch.nn.functional.normalize(d["k"].float(), dim=-1).to(torch.bfloat16)
    row = dict(kind="one_kernel", N=N, L=L, H=H, HV=HV, K=128, V=128, tokens=N * L, pool="fp32 vk", l2norm=l2norm)
    own = torch.zeros(pool0.shape[0], dtype=torch.bool, device=pool0.device)
    own[idx.long()] = True
    calls, outs = {}, {}
    shipped = fpk.REGS, fpk.TMA
    try:
        for name in ("wgmma", "fused"):
            switch(name)
            calls[name] = call = Call(d, pool0.clone(), idx, l2norm=l2norm)
            assert call.plan.fused_walk.walk == name, call.plan.fused_walk
            call()
            torch.cuda.synchronize()
            outs[name] = (call.bufs.o[:N * L].clone(), call.pool.clone())
        o2, p2 = outs["wgmma"]
        o1, p1 = outs["fused"]
        row["o_bitwise"] = bool(torch.equal(o1, o2))
        row["pool_bitwise"] = bool(torch.equal(p1, p2))
        row["o_max_abs_diff"] = float((o1.float() - o2.float()).abs().max())
        row["rows_not_owned_unchanged"] = bool(torch.equal(p1[~own], pool0[~own]))
        print({k: row[k] for k in ("o_bitwise", "pool_bitwise", "o_max_abs_diff", "rows_not_owned_unchanged")},
              flush=True)

        def bench(call):
            return float(do_bench(call, warmup=25, rep=150, return_mode="median"))

        row["two_kernels_ms"] = bench(calls["wgmma"])
        for build in regs_variants:  # "prep/walk[:tma|:cpasync]" (PrefillKey.regs, .tma)
            fpk.REGS, fpk.TMA = _build(build, shipped[1])
            tag = "one_kernel_" + build.replace("/", "_").replace(":", "_")
            one = calls["fused"]
            one.pool.copy_(pool0)  # each build checked on the same entering states: bitwise the two kernels
            one()
            torch.cuda.synchronize()
            row[f"{tag}_bitwise"] = bool(torch.equal(one.bufs.o[:N * L], o2) and torch.equal(one.pool, p2))
            row[f"{tag}_ms"] = bench(one)
            print(build, row[f"{tag}_ms"], "bitwise", row[f"{tag}_bitwise"], flush=True)
    finally:
        fpk.REGS, fpk.TMA = shipped
        switch("")
    row["one_kernel_ms"] = min(v for k, v in row.items() if k.startswith("one_kernel_") and k.endswith("_ms"))
    row["all_builds_bitwise"] = all(v for k, v in row.items() if k.endswith("_bitwise"))
    row["speedup_vs_two_kernels"] = row["two_kernels_ms"] / max(row["one_kernel_ms"], 1e-9)
    return row


def ablate(N, L, H, HV, variants) -> list:
    """``do_bench`` medians (ms) of the one-kernel build (``fused_prefill.REGS``) with the parts each variant names made no-ops
    (module docstring), one row per variant; the kernel is compiled afresh for each."""
    from triton.testing import do_bench

    from linattn.kernels.cutedsl import _fused_prefill_kernel as fpm
    from linattn.kernels.cutedsl import _fused_prep_kernel as prm
    from linattn.kernels.cutedsl import fused_prefill as fpk
    from linattn.kernels.cutedsl import fused_walk as fw

    classes = {"prefill": fpm.FusedPrefillKernel, "prep": prm.FusedPrepKernel}
    real = {part: getattr(classes[c], m) for part, (c, m) in PARTS.items()}
    own = {part for part, (c, m) in PARTS.items() if m in vars(classes[c])}  # else inherited: restored by delattr
    d, _, _ = make(N, L, H, HV)
    T = N * L
    # dense states, no initial state: no variant reads what another wrote (an ablated build's states are garbage)
    args = dict(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"], cu_seqlens=d["cu_seqlens"],
                o=torch.empty(T, HV, 128, device="cuda", dtype=torch.bfloat16), state_indices=None,
                has_initial_state=None, h0=None, ht=torch.empty(N, HV, 128, 128, device="cuda"), s0=(0, 0, 0, 0),
                st=(HV * 128 * 128, 128 * 128, 1, 128), scale=128 ** -0.5, use_qk_l2norm=True)
    rows = []
    tma = fpk.TMA
    try:
        for name in variants:
            off = [p for p in name.partition(":")[2].split("+") if p]
            fpk.TMA = tma and "loads" not in off
            for part, (c, m) in PARTS.items():
                setattr(classes[c], m, (lambda *a, **k: None) if part in off else real[part])
            fpk._CACHE.clear()
            fw._STEPS.clear()
            fpk.cutedsl_fused_prefill(**args)
            torch.cuda.synchronize()
            ms = float(do_bench(lambda: fpk.cutedsl_fused_prefill(**args), warmup=10, rep=100, return_mode="median"))
            rows.append(dict(kind="one_kernel_ablation", N=N, L=L, H=H, HV=HV, variant=name, removed=off, ms=ms,
                             regs=list(fpk.REGS), loads="tma" if fpk.TMA else "cpasync"))
            print(rows[-1], flush=True)
    finally:
        fpk.TMA = tma
        for part, (c, m) in PARTS.items():
            if part in own:
                setattr(classes[c], m, real[part])
            elif m in vars(classes[c]):
                delattr(classes[c], m)
        fpk._CACHE.clear()
        fw._STEPS.clear()
    return rows


def _build(spec: str, shipped_tma: bool) -> tuple:
    """``(regs, tma)`` of a ``--regs`` item ``prep/walk[:tma|:cpasync]`` (no suffix: ``shipped_tma``)."""
    regs, _, loads = spec.partition(":")
    return tuple(int(x) for x in regs.split("/")), {"tma": True, "cpasync": False}.get(loads, shipped_tma)


def _variants(spec: str) -> str:
    """``--ablate``'s value checked: ``x[:part+..]`` items naming parts of :data:`PARTS`."""
    for item in spec.split(","):
        head, _, parts = item.partition(":")
        bad = [p for p in parts.split("+") if p and p not in PARTS]
        if head != "x" or bad:
            raise argparse.ArgumentTypeError(f"{item!r}: expected x[:part+..] with parts from {sorted(PARTS)}")
    return spec


def _builds(spec: str) -> str:
    """``--regs``' value checked: ``prep/walk[:tma|:cpasync]`` items, each a register split the kernel takes
    (``fused_prefill.regs_refusal``)."""
    from linattn.kernels.cutedsl.fused_prefill import regs_refusal

    items = spec.split(",")
    for item in items:
        regs, colon, loads = item.partition(":")
        try:
            split, _ = _build(item, False)
            assert item == item.strip() and "/".join(map(str, split)) == regs
            assert not colon or loads in ("tma", "cpasync")
        except (ValueError, AssertionError):
            raise argparse.ArgumentTypeError(f"{item!r}: expected prep/walk[:tma|:cpasync], e.g. 112/192") from None
        why = regs_refusal(split)
        if why:
            raise argparse.ArgumentTypeError(f"{item!r}: {why}")
    if len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"{spec!r}: a build named twice")
    return spec


def _shapes(spec: str) -> str:
    """``--shapes``' value checked by :func:`fused_walk.parse` (its ValueError an argparse error)."""
    try:
        parse(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES, type=_shapes, help=f"NxL@H/HV,... (default {SHAPES})")
    ap.add_argument("--regs", default=REGS_VARIANTS, type=_builds,
                    help=f"builds 'prep/walk[:tma|:cpasync],...': the setmaxnreg split, ':tma' / ':cpasync' the k / q "
                         f"tiles' loads (neither: the shipped ones; default {REGS_VARIANTS}, the shipped build)")
    ap.add_argument("--l2norm", default="on", choices=("on", "off", "both"),
                    help="the norms in the kernel, not (q, k normalised beforehand), or both")
    ap.add_argument("--ablate", default=None, type=_variants,
                    help="time the build (the first --regs split) with parts made no-ops instead: 'x[:part+..],...', "
                         f"parts {', '.join(PARTS)} (the module docstring says what each is); --l2norm is not read")
    ap.add_argument("--out", default=None, help="result file (default: $LINATTN_RESULTS_DIR/fused_prefill_<device>.json)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU of compute capability 9.x (SM90) with nvidia-cutlass-dsl")
    out = a.out or results_path("fused_prefill")
    regs = a.regs.split(",")
    if a.ablate:
        from linattn.kernels.cutedsl import fused_prefill as fpk

        notes = ["kind one_kernel_ablation: the one-kernel build at the first --regs split timed by "
                 "triton.testing.do_bench (median, ms) with the named parts made no-ops (PARTS: idle = the walk's "
                 "chunk products, wtiles = its tiles, solve / norms / gates / loads = the prep's, store = the output "
                 "rows); timing only, the outputs meaningless; dense fp32 states, no initial state, l2norm in the "
                 "kernel, mild gates (benchmarks/fused_walk.py's make)"]
        shipped = fpk.REGS, fpk.TMA
        fpk.REGS, fpk.TMA = _build(regs[0], shipped[1])
        rows = []
        try:
            for N, L, H, HV in parse(a.shapes):
                rows.extend(ablate(N, L, H, HV, a.ablate.split(",")))
                write_results(out, rows, notes)
        finally:
            fpk.REGS, fpk.TMA = shipped
        return 0
    norms = {"on": (True,), "off": (False,), "both": (True, False)}[a.l2norm]
    notes = ["launch_fused_stages timed on one planned call per switch (tables made once); triton.testing.do_bench "
             "medians, ms; two_kernels: LINATTN_CUTEDSL_WALK=wgmma (CuTe DSL prep, then the wgmma walk); "
             "one_kernel_<prep>_<walk>[_tma|_cpasync]: LINATTN_CUTEDSL_WALK=fused at that setmaxnreg split (k / q "
             "by the shipped loads, cp.async, or as named; the rows measured at 7296f00 name no suffix for TMA, then the "
             "default); speedup_vs_two_kernels: against the fastest build of the row",
             "o_bitwise / pool_bitwise: the one kernel's (shipped build) outputs and pool against the two kernels' on the "
             "same inputs; one_kernel_<build>_bitwise: both, for that build"]
    if len(norms) == 1:
        return run_shapes(a.shapes, lambda N, L, H, HV: measure(N, L, H, HV, regs, norms[0]), out, notes)
    shapes = ",".join(a.shapes.split(",") * 2)  # each shape with the norms in the kernel, then without
    order = iter([n for n in norms for _ in a.shapes.split(",")])
    return run_shapes(shapes, lambda N, L, H, HV: measure(N, L, H, HV, regs, next(order)), out, notes)


if __name__ == "__main__":
    sys.exit(main())
