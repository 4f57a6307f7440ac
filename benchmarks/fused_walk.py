"""The fused GDN prefill's walk: Triton (``chunk_gdn_fused_kernel``) against CuTe DSL
(kernels/cutedsl/fused_walk.py: ``LINATTN_CUTEDSL_WALK=1``, warp ``mma.sync``, and
``LINATTN_CUTEDSL_WALK=wgmma``, warpgroup MMAs), on the same prep outputs (issue 27).

Per shape (bf16 q/k/v, l2norm in the prep, fp32 "vk" pool with ``state_indices`` a permutation of
half the pool's rows; gates ``logsigmoid(N(3, 1))`` as benchmarks/prefill.py's "mild"): the call is
planned once (``fused=True``), its tables made once, then ``launch_fused_stages`` is timed
(``triton.testing.do_bench`` medians, ms) six ways: prep + Triton walk (switch off), prep + CuTe
walk for each build (``cutedsl_*``: mma.sync, ``wgmma_*``: warpgroup MMAs; value block
:func:`fused_walk.block_v`, 128, and 64), prep alone (switch on, the walk replaced by nothing);
each walk's time is the difference. Before timing, every walk runs once from the same pool: the
relative difference of its outputs and of the pool rows written to the Triton walk's, and whether
the rows not owned stayed bitwise unchanged.

Writes the ``benchmarks/_results.py`` schema (``$LINATTN_RESULTS_DIR/fused_walk_<device>.json``;
default benchmarks/results/) after every shape, so a timeout keeps the shapes done.

Usage:  python benchmarks/fused_walk.py [--shapes 16x4096@16/32,8x1024@16/32] [--out FILE]
        python benchmarks/fused_walk.py --once [--shapes ...]   # one prep + CuTe walk call (for ncu)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402
from linattn.testing.compare import rel_error as rel  # noqa: E402

K = V = 128
SHAPES = "16x4096@16/32,8x1024@16/32"


def parse(spec: str) -> list[tuple[int, int, int, int]]:
    """``"16x4096@16/32,..."`` -> ``[(N, L, H, HV), ...]``.

    Raises:
        ValueError: an item that is not ``NxL@H/HV`` with positive numbers and ``HV`` a multiple of ``H``
            (the GVA group), naming it.
    """
    out = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)@(\d+)/(\d+)", item.strip())
        if not m or min(int(x) for x in m.groups()) < 1 or int(m[4]) % int(m[3]):
            raise ValueError(f"{item!r}: expected NxL@H/HV (positive, HV a multiple of H), e.g. 16x4096@16/32")
        out.append(tuple(int(x) for x in m.groups()))
    return out


def make(N, L, H, HV, seed=0):
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    T, bf = N * L, torch.bfloat16
    d = dict(q=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             k=torch.randn(T, H, K, device=dev, generator=gen).to(bf),
             v=torch.randn(T, HV, V, device=dev, generator=gen).to(bf),
             g=torch.nn.functional.logsigmoid(torch.randn(T, HV, device=dev, generator=gen) + 3.0),
             beta=torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen)),
             cu_seqlens=torch.arange(0, T + 1, L, device=dev, dtype=torch.int32))
    P = 2 * N
    idx = torch.randperm(P, device=dev, generator=gen)[:N].to(torch.int32)
    pool = torch.randn(P, HV, V, K, device=dev, generator=gen) * 0.1
    return d, pool, idx


class Call:
    """One planned fused call whose stages (prep + walk) can be run again and again."""

    def __init__(self, d, pool, idx, bv=None, l2norm=True):
        import dataclasses

        from linattn.kernels.triton import prefill as pm

        self.pm, self.pool = pm, pool
        # the walk is the plan's (fused_walk: the switch as set now, else the planner's choice); bv: its value block
        self.plan = pm.plan_prefill("gdn", q=d["q"], v=d["v"], cu_seqlens=d["cu_seqlens"], state_pool=pool,
                                    state_indices=idx, use_qk_l2norm=l2norm, state_layout="vk", fused=True)
        assert self.plan.fused is not None, self.plan.fused_reason
        if bv is not None and self.plan.fused_walk.walk != "triton":
            self.plan = dataclasses.replace(self.plan, fused_walk=self.plan.fused_walk._replace(block_v=bv))
        self.bufs = pm.allocate_buffers(self.plan)
        self.x = pm.conform_inputs(self.plan, d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"])
        self.st = pm.prefill_state(self.plan, self.bufs, pool, idx, None, None)
        self.tables = pm.launch_tables(self.plan, self.x.cu_seqlens)
        self.scale = K ** -0.5

    def __call__(self):
        self.pm.launch_fused_stages(self.plan, self.x, self.tables, self.bufs, self.st, self.scale)


#: the CuTe DSL builds timed: row prefix -> the switch's value
BUILDS = {"cutedsl": "1", "wgmma": "wgmma"}


def setenv(name: str, value: str) -> None:
    """Set the environment variable ``name`` to ``value`` ("": unset)."""
    if value:
        os.environ[name] = value
    else:
        os.environ.pop(name, None)


def switch(value: str):
    """Set :data:`fused_walk.ENV_SWITCH` to ``value`` ("": unset, the planner's choice; "0": the Triton
    walk); read when a :class:`Call` plans."""
    from linattn.kernels.cutedsl import fused_walk as fw

    setenv(fw.ENV_SWITCH, value)


def run_shapes(spec: str, measure, out, notes: list[str]) -> int:
    """``measure(N, L, H, HV)`` per shape of ``spec`` (:func:`parse`), its row (or the error's) written to
    ``out`` after each shape, so that a timeout keeps the shapes done. Returns 1 if a shape failed, else 0."""
    rows, rc = [], 0
    for N, L, H, HV in parse(spec):
        try:
            row = measure(N, L, H, HV)
        except Exception as e:  # noqa: BLE001 - recorded in the row, the next shape still runs
            traceback.print_exc()
            row, rc = dict(N=N, L=L, H=H, HV=HV, error=f"{type(e).__name__}: {e}"[:2000]), 1
        rows.append(row)
        print(row, flush=True)
        write_results(out, rows, notes)
    return rc


def measure(N, L, H, HV) -> dict:
    from triton.testing import do_bench

    from linattn.kernels.cutedsl import fused_walk as fw

    d, pool0, idx = make(N, L, H, HV)
    row = dict(N=N, L=L, H=H, HV=HV, K=K, V=V, tokens=N * L, pool="fp32 vk", walk_block_v=fw.block_v(V))
    why = fw.walk_refusal(family="gdn", K=K, V=V, dtype=torch.bfloat16, buf_dtype=torch.bfloat16,
                          device=torch.device("cuda"))
    row["cutedsl_refusal"] = why
    outs = {}
    own = torch.zeros(pool0.shape[0], dtype=torch.bool, device=pool0.device)
    own[idx.long()] = True
    for name, value in (("triton", "0"), *BUILDS.items()):
        pool = pool0.clone()
        switch(value)
        call = Call(d, pool, idx, bv=128)
        call()
        torch.cuda.synchronize()
        outs[name] = (call.bufs.o.clone(), pool[idx.long()].clone(), torch.equal(pool[~own], pool0[~own]))
    switch("")
    for name in BUILDS:
        row[f"o_rel_{name}_vs_triton"] = rel(outs[name][0], outs["triton"][0])
        row[f"pool_rel_{name}_vs_triton"] = rel(outs[name][1], outs["triton"][1])
        row[f"{name}_o_finite"] = bool(torch.isfinite(outs[name][0].float()).all())
    row["rows_not_owned_unchanged"] = all(x[2] for x in outs.values())

    def bench(call):
        return float(do_bench(call, warmup=25, rep=150, return_mode="median"))

    real = fw.run_for_plan
    try:
        switch("0")
        row["prep_triton_walk_ms"] = bench(Call(d, pool0.clone(), idx))
        for name, value in BUILDS.items():
            switch(value)
            row[f"prep_{name}_walk_ms"] = bench(Call(d, pool0.clone(), idx, bv=128))
            row[f"prep_{name}_walk_bv64_ms"] = bench(Call(d, pool0.clone(), idx, bv=64))  # half the warps, 2x the CTAs
        call = Call(d, pool0.clone(), idx)
        row["prep"] = "cutedsl" if call.plan.fused_prep else "triton"  # the planner's (LINATTN_CUTEDSL_PREP)
        fw.run_for_plan = lambda *a: True  # the prep alone
        row["prep_ms"] = bench(call)
    finally:
        fw.run_for_plan = real
        switch("")
    row["triton_walk_ms"] = row["prep_triton_walk_ms"] - row["prep_ms"]
    for name in BUILDS:
        row[f"{name}_walk_ms"] = row[f"prep_{name}_walk_ms"] - row["prep_ms"]
        row[f"{name}_walk_bv64_ms"] = row[f"prep_{name}_walk_bv64_ms"] - row["prep_ms"]
        row[f"{name}_walk_speedup"] = row["triton_walk_ms"] / max(row[f"{name}_walk_ms"], 1e-9)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--once", action="store_true", help="run prep + CuTe walk once per shape, time nothing (ncu)")
    ap.add_argument("--walk", default="1", choices=sorted(BUILDS.values()), help="the build that --once runs")
    a = ap.parse_args(argv)
    if a.once:
        for N, L, H, HV in parse(a.shapes):
            d, pool, idx = make(N, L, H, HV)
            switch(a.walk)
            Call(d, pool, idx, bv=128)()
            torch.cuda.synchronize()
        return 0
    out = a.out or results_path("fused_walk")
    notes = ["prep + walk timed through prefill.launch_fused_stages on one planned call (tables made once); "
             "walk = (prep + walk) - prep alone; triton.testing.do_bench medians, ms; the prep is the planner's "
             "(row key prep)",
             "cutedsl walk: kernels/cutedsl/fused_walk.py (mma.sync, cp.async double-buffered; "
             "LINATTN_CUTEDSL_WALK=1 forces it); wgmma walk: the same with warpgroup MMAs, the state as the register "
             "A operand (LINATTN_CUTEDSL_WALK=wgmma)"]
    return run_shapes(a.shapes, measure, out, notes)


if __name__ == "__main__":
    sys.exit(main())
