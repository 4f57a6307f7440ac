"""Decode and SwiGLU-clamp benchmark on a CUDA GPU (the H200 through the device tool); installed equivalent: `linattn bench gdn_decode` (apps/bench.py).

What it measures (issue 3, item 7), all in one process so the ceilings and the kernels see the
same card:

- the copy ceiling: a device-to-device copy of 4 GiB (bytes read + written over time);
- GDN decode at Qwen3-Next shapes (H=16, HV=32, K=V=128, bf16 q/k/v/a/b, fp32 pool of 2N slots,
  random slot per sequence) for N = 1 .. 8,192: our triton-split kernel against
  flash-linear-attention's ``fused_recurrent_gated_delta_rule`` on the same data (gates fused in
  its kernel too, dense state ``[N, HV, V, K]`` so it pays no indexing); KDA at Kimi-Linear
  shapes (H=HV=32) against ``fused_recurrent_kda``. Effective bandwidth counts the state read
  and write and the q/k/v/a/b/o (and index) bytes once;
- N=1 latency: CUDA-graph replay of one call (ours and FLA's), and an eager call through the
  backend and through ``linattn.gdn_decode(validate=False)`` (dispatch included);
- SwiGLU clamp at M=8,192, D=18,432 bf16 against the copy ceiling.

Kernel times are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``), so launch
gaps do not count. The kernels write the pool in place; repeating them is fine for timing (the
state stays bounded), never for correctness checks, which run first on fresh copies.

Writes the ``benchmarks/_results.py`` schema; rows of ``kind`` copy, decode, latency_n1,
silu_and_mul_clamp (and explore, tune_decode in those modes).

Usage:
    python benchmarks/decode.py                    # benchmark -> benchmarks/results/decode_<device>.json
    python benchmarks/decode.py --explore          # also the placement / tile experiment at N=1024
    python benchmarks/decode.py --tune             # decode tiles x slot order, cache hints -> ./decode_tune_<device>.json
    python benchmarks/decode.py --sanitize         # small calls, for compute-sanitizer (F22)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import device_tag, results_path, write_results  # noqa: E402

NS = (1, 32, 256, 1024, 4096, 8192)
SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}


def _dev():
    return torch.device("cuda")


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (TB/s)."""
    import triton.testing as tt

    x = torch.empty(nbytes // 4, dtype=torch.float32, device=_dev()).normal_()
    y = torch.empty_like(x)
    ms = tt.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e12


def make_inputs(gate: str, N: int, *, T: int = 1, seed: int = 0, pool_slots=None):
    s = SHAPES[gate]
    H, HV, K, V = s["H"], s["HV"], s["K"], s["V"]
    g = torch.Generator(device=_dev()).manual_seed(seed)
    bf = torch.bfloat16
    P = pool_slots or 2 * N
    d = dict(
        q=torch.randn(N, T, H, K, device=_dev(), generator=g).to(bf),
        k=torch.randn(N, T, H, K, device=_dev(), generator=g).to(bf),
        v=torch.randn(N, T, HV, V, device=_dev(), generator=g).to(bf),
        a=torch.randn(N, T, HV, *((K,) if gate == "kda" else ()), device=_dev(), generator=g).to(bf),
        b=torch.randn(N, T, HV, device=_dev(), generator=g).to(bf),
        A_log=torch.randn(HV, device=_dev(), generator=g) * 0.5,
        dt_bias=torch.randn(HV, *((K,) if gate == "kda" else ()), device=_dev(), generator=g) * 0.5,
        state_pool=torch.randn(P, HV, V, K, device=_dev(), generator=g) * 0.1,
        state_indices=torch.randperm(P, device=_dev(), generator=g)[:N].to(torch.int32),
        scale=K ** -0.5,
    )
    torch.cuda.synchronize()  # timing runs on a side stream: the inputs must be complete
    return d


def decode_bytes(gate: str, N: int, T: int = 1) -> int:
    s = SHAPES[gate]
    H, HV, K, V = s["H"], s["HV"], s["K"], s["V"]
    state = 2 * N * HV * K * V * 4
    qkv_o = N * T * (2 * H * K + 2 * HV * V) * 2
    gates = N * T * HV * ((K if gate == "kda" else 1) + 1) * 2
    return state + qkv_o + gates + N * 4


def _ours(gate, d, caps, **kw):
    from linattn.kernels.triton.decode import recurrent_decode

    return lambda: recurrent_decode(gate=gate, **d, caps=caps, layout="split", **kw)


def _fla(gate, d):
    """FLA 0.6 on the same data: dense initial state [N, HV, V, K] (state_v_first), gates fused."""
    h0 = d["state_pool"][d["state_indices"].long()].contiguous()
    common = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, A_log=d["A_log"], dt_bias=d["dt_bias"],
                  use_beta_sigmoid_in_kernel=True, state_v_first=True, scale=d["scale"])
    if gate == "gdn":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as f

        return lambda: f(d["q"], d["k"], d["v"], g=d["a"], beta=d["b"], **common)
    from fla.ops.kda import fused_recurrent_kda as f

    return lambda: f(d["q"], d["k"], d["v"], g=d["a"], beta=d["b"], **common)


def _time(fn, graph: bool = True) -> tuple[float, str]:
    import triton.testing as tt

    if not graph:  # long kernels: launch gaps do not matter, and no graph pool holds copies
        torch.cuda.synchronize()
        return tt.do_bench(fn, warmup=10, rep=100, return_mode="median"), "eager"
    try:
        return tt.do_bench_cudagraph(fn, rep=100, return_mode="median"), "cudagraph"
    except Exception as e:  # noqa: BLE001 - a wrapper that cannot be captured is timed eagerly
        print(f"  (graph capture failed: {type(e).__name__}: {e}; timing eagerly)", file=sys.stderr)
        torch.cuda.synchronize()
        return tt.do_bench(fn, warmup=25, rep=100, return_mode="median"), "eager"


def _rel(x, ref, chunk: int = 256) -> float:
    """||x - ref|| / ||ref|| in float64, a chunk of rows at a time (states can be 17 GB)."""
    num = den = 0.0
    for i in range(0, x.shape[0], chunk):
        xs, rs = x[i:i + chunk].double(), ref[i:i + chunk].double()
        num += float(((xs - rs) ** 2).sum())
        den += float((rs ** 2).sum())
    return (num / max(den, 1e-60)) ** 0.5


class split_order:
    """Context manager: the split planner's placement preference (for the layout experiment)."""

    ORDERS = {"seq_on_x": (0, 1, 2), "blk_on_x": (2, 1, 0)}

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        from linattn.kernels import grid

        self._old = grid._SPLIT_ORDER
        grid._SPLIT_ORDER = (self.ORDERS[self.name],) + tuple(o for o in self._old if o != self.ORDERS[self.name])
        grid._plan.cache_clear()

    def __exit__(self, *exc):
        from linattn.kernels import grid

        grid._SPLIT_ORDER = self._old
        grid._plan.cache_clear()
        return False


def bench_decode(gate: str, caps, ns=NS, have_fla=True) -> list[dict]:
    rows = []
    for N in ns:
        d = make_inputs(gate, N)
        nbytes = decode_bytes(gate, N)
        # correctness against FLA on fresh copies first
        row = dict(op=f"{gate}_decode", N=N, bytes=nbytes, **SHAPES[gate])
        if have_fla:
            idx = d["state_indices"].long()
            o_fla, ht = _fla(gate, d)()
            o = _ours(gate, d, caps)()
            torch.cuda.synchronize()
            row["rel_err_o_vs_fla"] = _rel(o, o_fla)
            row["rel_err_state_vs_fla"] = _rel(d["state_pool"][idx], ht)
            del o_fla, ht, o
        big = N >= 4096
        ms, how = _time(_ours(gate, d, caps), graph=not big)
        row.update(ours_us=ms * 1e3, ours_TBps=nbytes / (ms * 1e-3) / 1e12, timing=how)
        from linattn.kernels import grid as _grid

        row["ours_grid"] = list(_grid.plan_grid(N, SHAPES[gate]["HV"], 1, caps, "split").axes)
        if N <= 65535:  # the other split placement: value blocks on x, sequences on z
            with split_order("blk_on_x"):
                ms2, _ = _time(_ours(gate, d, caps), graph=not big)
            row.update(ours_blk_on_x_us=ms2 * 1e3, ours_blk_on_x_TBps=nbytes / (ms2 * 1e-3) / 1e12)
        if have_fla:
            ms_f, how_f = _time(_fla(gate, d), graph=not big)
            fla_bytes = nbytes - N * 4
            row.update(fla_us=ms_f * 1e3, fla_TBps=fla_bytes / (ms_f * 1e-3) / 1e12, fla_timing=how_f)
        rows.append(row)
        print(f"  {gate} N={N:5d}: ours {row['ours_us']:8.2f} us {row['ours_TBps']:.2f} TB/s"
              + (f" (blk_on_x {row['ours_blk_on_x_TBps']:.2f})" if "ours_blk_on_x_TBps" in row else "")
              + (f" | fla {row['fla_us']:8.2f} us {row['fla_TBps']:.2f} TB/s" if have_fla else ""), flush=True)
        del d
        torch.cuda.empty_cache()
    return rows


def graph_replay_us(fn, reps: int = 2000) -> float:
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(50):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def eager_call_us(fn, reps: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / reps


def bench_latency(caps, have_fla=True) -> list[dict]:
    """N=1 microseconds per call, one row per (op, path): graph replay and eager calls, ours and FLA's."""
    import linattn
    from linattn.backends.triton_split import TritonSplitBackend

    rows = []
    for gate in ("gdn", "kda"):
        op = f"{gate}_decode"
        d = make_inputs(gate, 1)
        be = TritonSplitBackend()
        meth = getattr(be, op)
        api = getattr(linattn, op)
        args = {k: d[k] for k in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "state_indices")}
        rows.append(dict(op=op, path="graph_replay", us=graph_replay_us(_ours(gate, d, caps))))
        if have_fla:
            rows.append(dict(op=op, path="fla_graph_replay", us=graph_replay_us(_fla(gate, d))))
        rows.append(dict(op=op, path="eager_backend_call", us=eager_call_us(lambda: meth(**d))))
        us = eager_call_us(lambda: api(**args, validate=False))
        rows.append(dict(op=op, path="eager_api_call_validate_off", us=us, backend=linattn.last_decision().chosen))
        us = eager_call_us(lambda: api(**args), reps=500)
        rows.append(dict(op=op, path="eager_api_call_validate_on", us=us, backend=linattn.last_decision().chosen))
        if have_fla:
            rows.append(dict(op=op, path="fla_eager_call", us=eager_call_us(_fla(gate, d))))
    for r in rows:
        print(f"  {r['op']} {r['path']}: {r['us']:.2f} us")
    return rows


def silu_bytes(M: int, D: int, itemsize: int = 2) -> int:
    return 3 * M * D * itemsize


def bench_silu(caps, copy_tbps, configs=None) -> list[dict]:
    from linattn.kernels.triton.silu_clamp import silu_and_mul_clamp, silu_config

    M, D = 8192, 18432
    x = (torch.randn(M, 2 * D, device=_dev()) * 8).to(torch.bfloat16)
    rows = []
    configs = configs or [silu_config(D)]
    from linattn.backends.torch_ref import silu_and_mul_clamp_ref

    ref = silu_and_mul_clamp_ref(x[:64], 10.0, compute_dtype=torch.float64)
    for bd, w in configs:
        fn = lambda: silu_and_mul_clamp(x, 10.0, caps=caps, layout="split", block_d=bd, num_warps=w)  # noqa: E731
        err = _rel(fn()[:64], ref)
        for order in ("seq_on_x", "blk_on_x"):
            with split_order(order):
                ms, how = _time(fn)
            tbps = silu_bytes(M, D) / (ms * 1e-3) / 1e12
            rows.append(dict(M=M, D=D, BD=bd, num_warps=w, order=order, us=ms * 1e3,
                             TBps=tbps, frac_of_copy=tbps / copy_tbps, rel_err=err, timing=how))
            print(f"  silu BD={bd} warps={w} {order}: {ms * 1e3:.1f} us {tbps:.2f} TB/s ({tbps / copy_tbps:.0%})")
    return rows


#: tile configs ``(block_v, num_warps)`` the sweep tries per family (value blocks on grid x, the shipped placement)
TUNE_TILES = {"gdn": ((4, 1), (8, 1), (16, 1), (16, 2), (32, 2), (32, 4)),
              "kda": ((8, 1), (16, 1), (16, 2), (32, 2), (32, 4), (64, 2), (64, 4))}
#: cache hints on the state tile the sweep tries at the pinned tile ("": none, as shipped)
TUNE_EVICTION = ("", "evict_first")


def tune_decode(caps, ns=(32, 256, 1024), have_fla=True) -> list[dict]:
    """The decode sweep: every tile of :data:`TUNE_TILES` on random slots (the pool as the
    benchmark fills it) and on identity slots (slot n for sequence n, a dense state as FLA is
    given), the cache hints of :data:`TUNE_EVICTION` at the pinned tile, and FLA on the same data."""
    from linattn.kernels.triton.decode import decode_config

    rows = []
    for gate in ("gdn", "kda"):
        for N in ns:
            d = make_inputs(gate, N)
            ident = dict(d, state_indices=torch.arange(N, device=_dev(), dtype=torch.int32))
            nbytes = decode_bytes(gate, N)
            _, bv0, w0 = decode_config(128, 128, N, caps, gate)
            variants = [(bv, w, slots, "") for bv, w in TUNE_TILES[gate] for slots in ("random", "identity")]
            variants += [(bv0, w0, slots, ev) for ev in TUNE_EVICTION if ev for slots in ("random", "identity")]
            for bv, w, slots, ev in variants:
                inp = d if slots == "random" else ident
                try:
                    ms, _ = _time(_ours(gate, inp, caps, block_v=bv, num_warps=w, state_eviction_policy=ev))
                except Exception as e:  # noqa: BLE001
                    print(f"  {gate} N={N} BV={bv} w={w} {slots} {ev}: {type(e).__name__}: {e}")
                    continue
                rows.append(dict(op=gate, N=N, BV=bv, num_warps=w, slots=slots, eviction=ev or "none",
                                 pinned=(bv, w) == (bv0, w0), us=ms * 1e3, TBps=nbytes / (ms * 1e-3) / 1e12))
            if have_fla:
                ms, _ = _time(_fla(gate, d))
                rows.append(dict(op=gate, N=N, variant="fla", us=ms * 1e3,
                                 TBps=(nbytes - 4 * N) / (ms * 1e-3) / 1e12))
            mine = [r for r in rows if r["op"] == gate and r["N"] == N]
            for slots in ("random", "identity"):
                best = sorted((r for r in mine if r.get("slots") == slots), key=lambda r: r["us"])[:3]
                print(f"  {gate} N={N} {slots}: best " + "; ".join(
                    f"BV={r['BV']} w={r['num_warps']} {r['eviction']} {r['TBps']:.2f}TB/s" for r in best)
                    + "".join(f" | fla {r['TBps']:.2f}" for r in mine if r.get("variant") == "fla"), flush=True)
            del d, ident
            torch.cuda.empty_cache()
    return rows


def explore(caps, N: int = 1024) -> list[dict]:
    """Where the bandwidth goes: grid placement, slot order and tile configs at one N (GDN)."""
    rows = []
    d = make_inputs("gdn", N)
    nbytes = decode_bytes("gdn", N)
    ident = dict(d, state_indices=torch.arange(N, device=_dev(), dtype=torch.int32))
    variants = []
    for order in ("seq_on_x", "blk_on_x"):
        for bv, w in ((64, 8), (32, 4), (16, 2), (8, 1), (128, 8)):
            variants.append((f"split/{order}/random", order, "split", d, bv, w))
        variants.append((f"split/{order}/identity", order, "split", ident, 64, 8))
    for bv, w in ((64, 8), (32, 4), (8, 1)):
        variants.append(("folded/random", "seq_on_x", "folded", d, bv, w))
    for name, order, layout, inp, bv, w in variants:
        from linattn.kernels.triton.decode import recurrent_decode

        fn = lambda: recurrent_decode(gate="gdn", **inp, caps=caps, layout=layout, block_v=bv, num_warps=w)  # noqa: E731
        try:
            with split_order(order):
                ms, _ = _time(fn)
        except Exception as e:  # noqa: BLE001
            print(f"  {name} BV={bv} w={w}: {type(e).__name__}: {e}")
            continue
        rows.append(dict(variant=name, N=N, BV=bv, num_warps=w, us=ms * 1e3, TBps=nbytes / (ms * 1e-3) / 1e12))
        print(f"  explore {name:28s} BV={bv:3d} w={w}: {ms * 1e3:8.1f} us {rows[-1]['TBps']:.2f} TB/s", flush=True)
    if _have_fla():
        ms, _ = _time(_fla("gdn", d))
        rows.append(dict(variant="fla", N=N, us=ms * 1e3, TBps=(nbytes - 4 * N) / (ms * 1e-3) / 1e12))
        print(f"  explore fla: {ms * 1e3:8.1f} us {rows[-1]['TBps']:.2f} TB/s")
    return rows


def _have_fla() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True


def sanitize() -> None:
    """Small decode and clamp calls on every layout and feature (run under compute-sanitizer)."""
    from linattn.capabilities import probe
    from linattn.kernels.triton.decode import recurrent_decode
    from linattn.kernels.triton.silu_clamp import silu_and_mul_clamp

    caps = probe(_dev())
    n = 0
    for gate in ("gdn", "kda"):
        for H, HV in ((16, 32), (32, 32)):
            for layout in ("split", "folded"):
                for T in (1, 4):
                    SHAPES[gate] = dict(H=H, HV=HV, K=128, V=128)
                    d = make_inputs(gate, 4, T=T, pool_slots=4 * T + 3)
                    if T > 1:
                        d["state_indices"] = torch.randperm(4 * T + 3, device=_dev())[: 4 * T].view(4, T).to(torch.int32)
                        d["state_indices"][1] = -1
                        inter = torch.zeros(5, 8, HV, 128, 128, device=_dev())[:, :T]
                        extra = dict(intermediate_states=inter,
                                     intermediate_state_indices=torch.tensor([4, -1, 0, 2], device=_dev()),
                                     num_accepted_tokens=torch.tensor([T, 1, 0, 2], device=_dev(), dtype=torch.int32))
                    else:
                        d["state_indices"][2] = -1
                        extra = {}
                    recurrent_decode(gate=gate, **d, caps=caps, layout=layout, **extra,
                                     lower_bound=-5.0 if gate == "kda" and T == 1 else None)
                    n += 1
    for D in (7, 1000, 18432):
        for layout in ("split", "folded"):
            silu_and_mul_clamp(torch.randn(3, 2 * D, device=_dev()).to(torch.bfloat16), 10.0, caps=caps, layout=layout)
            n += 1
    torch.cuda.synchronize()
    print(f"sanitize: {n} launches done")


NOTES = [
    "Triton decode (GDN at Qwen3-Next heads H=16 HV=32 K=V=128; KDA at Kimi-Linear heads H=HV=32) against "
    "flash-linear-attention's fused_recurrent kernels on the same data, fp32 pool of 2N slots, random slots; SwiGLU "
    "clamp at M=8,192, D=18,432 bf16; the copy ceiling (4 GiB device copy, bytes read + written).",
    "kind: copy | decode (ours_* = the planner's placement at the pinned tile configs, ours_blk_on_x_* = value blocks "
    "on x forced; *_frac_of_copy against the copy row) | latency_n1 (N=1, microseconds per call) | silu_and_mul_clamp "
    "(order = grid placement) | explore | tune_decode.",
    "Times: medians of CUDA-graph replays (timing 'cudagraph'); eager do_bench at N >= 4,096.",
]


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="results file (default: benchmarks/results/decode_<device>.json; "
                                                "with --tune: ./decode_tune_<device>.json, an experiment, not committed)")
    ap.add_argument("--tune", action="store_true", help="sweep decode tile configs, slot orders and cache hints "
                                                        "instead of benchmarking")
    ap.add_argument("--sanitize", action="store_true", help="small calls for compute-sanitizer")
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--explore", action="store_true", help="also run the placement/tile experiment at N=1024")
    args = ap.parse_args(argv)
    if args.sanitize:
        sanitize()
        return []
    from linattn.capabilities import probe

    caps = probe(_dev())
    have_fla = not args.no_fla and _have_fla()
    out = args.out or (f"decode_tune_{device_tag()}.json" if args.tune else results_path("decode"))
    command = "python benchmarks/decode.py " + " ".join(argv if argv is not None else sys.argv[1:])
    notes = NOTES + ([] if have_fla else ["flash-linear-attention not installed (or --no-fla): no FLA columns."])
    rows: list[dict] = []

    def save():  # after every stage: a timeout keeps what was measured
        write_results(out, rows, notes, command=command.strip())

    copy_tbps = copy_bandwidth()
    rows.append(dict(kind="copy", bytes=2 * (4 << 30), TBps=copy_tbps))
    print(f"copy bandwidth: {copy_tbps:.3f} TB/s", flush=True)
    save()
    if args.tune:
        rows += [dict(kind="tune_decode", **r) for r in tune_decode(caps, have_fla=have_fla)]
        save()
        return rows
    if args.explore:
        rows += [dict(kind="explore", **r) for r in explore(caps)]
        save()
    ns = tuple(int(n) for n in args.ns.split(","))
    decode = []
    for gate in ("gdn", "kda"):
        decode += bench_decode(gate, caps, ns, have_fla)
        for r in decode:
            for col in ("ours", "ours_blk_on_x", "fla"):
                if f"{col}_TBps" in r:
                    r[f"{col}_frac_of_copy"] = r[f"{col}_TBps"] / copy_tbps
        rows[:] = [r for r in rows if r["kind"] != "decode"] + [dict(kind="decode", **r) for r in decode]
        save()
    rows += [dict(kind="latency_n1", **r) for r in bench_latency(caps, have_fla)]
    save()
    rows += [dict(kind="silu_and_mul_clamp", **r) for r in bench_silu(caps, copy_tbps, [(2048, 8), (1024, 4), (4096, 8)])]
    save()
    print(f"\nwrote {out}\n op    N     ours TB/s (% copy)  blk_on_x   FLA TB/s (% copy)")
    for r in decode:
        print(f" {r['op'][:3]} {r['N']:5d}   {r['ours_TBps']:.2f} ({r['ours_frac_of_copy']:.0%})"
              + (f"   {r['ours_blk_on_x_TBps']:.2f} ({r['ours_blk_on_x_frac_of_copy']:.0%})" if "ours_blk_on_x_TBps" in r else "")
              + (f"   {r['fla_TBps']:.2f} ({r['fla_frac_of_copy']:.0%})" if "fla_TBps" in r else ""))
    return rows


if __name__ == "__main__":
    main()
