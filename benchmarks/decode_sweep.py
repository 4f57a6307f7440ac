"""bf16 state pool decode sweep on a CUDA GPU (issue 32 item 5): every candidate launch config of the
Triton decode for GDN and KDA, timed and checked in one process, so that one device call picks the
bf16 row of ``kernels/triton/decode.py``'s ``PINNED``.

What it measures, per family (GDN at Qwen3-Next heads H=16 HV=32, KDA at Kimi-Linear heads H=HV=32,
K = V = 128) and N (256, 1,024, 4,096 by default):

- every :data:`CANDIDATES` config (``DecodeConfig``: BV, warps, stages, register cap, value blocks
  per program, key elements per thread) on a bf16 pool, and the pinned fp32 config on the fp32 pool
  of the same values (the reference row of benchmarks/decode.py, as a check of the method);
- the method of benchmarks/decode.py: its inputs (``make_inputs``: bf16 q/k/v/a/b, a pool of 2N
  slots, random slots; here the pool cast to bf16), its bytes (``decode_bytes``, the state read and
  written counted at the pool's itemsize), its timer (median of CUDA-graph replays below N = 4,096,
  graphs of :data:`GRAPH_MS` ms of kernels instead of 100 to fit one device call; eager ``do_bench``
  median at 4,096) and its copy ceiling (4 GiB device copy) of the same run;
- checks, before any timing and on fresh copies of the pool: each config's output and written pool
  rows against the pinned bf16 config's (max abs diff; ``bitwise`` where equal), that the pool rows
  the call does not own keep their bits, and the error against the float64 reference
  (``torch_ref``'s oracle mode, first :data:`ORACLE_ROWS` sequences): ``||x - ref|| / ||ref||`` of
  the output and of the new state (the state as the pool stores it, bf16: its rounding included).

Writes the ``benchmarks/_results.py`` schema (``decode_sweep_<device>.json`` under
``$LINATTN_RESULTS_DIR``), after every (family, N). Rows: ``kind`` copy | sweep (one per family,
N, config). A config that fails to build or run gets a row with its ``error``. benchmarks/results/
keeps no file of its own for it (at most 15 files): ``--merge`` puts a run's rows into the decode
benchmark's file, ``benchmarks/results/decode_<device>.json``, as rows of ``kind`` bf16_sweep /
bf16_sweep_copy (replacing the previous sweep's rows and note; the other rows kept), or with
``--label NAME`` beside them (rows tagged ``sweep=NAME``; a later merge of that label replaces only it).

Usage:
    python benchmarks/decode_sweep.py                       # 61 s on the H200 with 88722f3's 16 configs (2026-12-02)
    python benchmarks/decode_sweep.py --ns 1024 --families gdn --configs pinned,bv16_w1_vec4
    python benchmarks/decode_sweep.py --merge /path/to/decode_sweep_h200.json --note "how it ran"
        # -> benchmarks/results/decode_h200.json (--into another file); no GPU needed
    python benchmarks/decode_sweep.py --merge /path/to/decode_sweep_h200.json --label exp2-s12 --note "..."
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import device_tag, results_path, write_results  # noqa: E402
from decode import SHAPES, copy_bandwidth, decode_bytes, make_inputs  # noqa: E402

from linattn.kernels.triton.decode import DecodeConfig, decode_launch_config, recurrent_decode  # noqa: E402
from linattn.testing.compare import rel_error as _rel  # noqa: E402

NS = (256, 1024, 4096)
#: milliseconds of kernels per CUDA graph (benchmarks/decode.py: 100); the median of 10 replays either way
GRAPH_MS = 50
#: sequences whose output and state are held against the float64 reference
ORACLE_ROWS = 32
#: the candidates, by name: ``None`` is the pinned bf16 config (the baseline every other is checked against)
CANDIDATES: dict[str, DecodeConfig | None] = {
    "pinned": None,
    # why each: docs/performance.md#decode-on-bf16-pools (register counts and layouts of the sm_90 builds).
    # Registers, spills and programs per SM below: the sm_90a builds at the sweep's shapes (Triton 3.6,
    # cuobjdump -res-usage), GDN / KDA where they differ; 65,536 registers, at most 32 one-warp programs.
    # The previous sweep's (88722f3, 2026-12-02) BV 4 configs, bv8_w2, bv8_w1_stages1 (no tile loop to pipeline:
    # the same times), bv8_w1_blk2, bv8_w1_blk4_vec4 and bv16_w2_vec4 are left out: each below the pin at every N
    # in both families (their rows: benchmarks/results/decode_h200.json@ff72420).
    "bv16_w1": DecodeConfig(16, 1),                          # the pin until this run (two-pass norms): the same bits
    "bv8_w1": DecodeConfig(8, 1),                            # the previous pin and the fp32 pin's config (72 registers)
    "bv8_w1_reg64": DecodeConfig(8, 1, maxnreg=64),          # register cap: more programs per SM
    "bv8_w1_vec4": DecodeConfig(8, 1, state_vec=4),          # the key vectors' layout: no shuffles
    "bv8_w1_blk2_vec4": DecodeConfig(8, 1, blocks=2, state_vec=4),  # fp32's bytes per program; GDN's best so far
    "bv16_w2": DecodeConfig(16, 2),
    "bv32_w4": DecodeConfig(32, 4),
    # BV 16 at 1 warp (128 registers, 16 programs per SM, 4 KiB each) with the knobs the last sweep tried only
    # with BV 8 or 2 warps (docs/performance.md#decode-on-bf16-pools, "Not tried yet" item 1)
    "bv16_w1_vec4": DecodeConfig(16, 1, state_vec=4),                 # 96 registers: 21 programs, no SHFL.IDX
    "bv16_w1_reg64": DecodeConfig(16, 1, maxnreg=64),                 # spills 288 / 344 B of stack
    "bv16_w1_reg112": DecodeConfig(16, 1, maxnreg=112),               # the lowest cap without spills: 18 programs
    "bv16_w1_vec4_reg64": DecodeConfig(16, 1, state_vec=4, maxnreg=64),  # spills 120 / 216 B
    "bv16_w1_vec4_reg80": DecodeConfig(16, 1, state_vec=4, maxnreg=80),  # 25 programs; spills 16 / 64 B
    "bv16_w1_vec4_reg88": DecodeConfig(16, 1, state_vec=4, maxnreg=88),  # 23 programs, no spills
    "bv16_w1_blk2": DecodeConfig(16, 1, blocks=2),                    # 8 KiB per program; 168 / 176 registers
    "bv16_w1_blk2_vec4": DecodeConfig(16, 1, blocks=2, state_vec=4),  # 128 registers: 16 programs x 8 KiB
    "bv16_w1_blk2_vec4_reg112": DecodeConfig(16, 1, blocks=2, state_vec=4, maxnreg=112),  # 18 x 8 KiB, no spills
    "bv16_w1_blk2_vec4_reg96": DecodeConfig(16, 1, blocks=2, state_vec=4, maxnreg=96),    # 21 x 8 KiB; spills 48 / 56 B
    "bv32_w1_vec4": DecodeConfig(32, 1, state_vec=4),                 # 8 KiB per program; 168 / 254 registers, no spills
    # q's and k's norms in one cross-lane reduction for ordinary rows (the max pass only past SS_LIMIT): the same bits
    "bv16_w1_onepass": DecodeConfig(16, 1, l2norm_one_pass=True),  # the pin since this run (2026-12-03): its spread from "pinned" is the noise
    "bv8_w1_blk2_vec4_onepass": DecodeConfig(8, 1, blocks=2, state_vec=4, l2norm_one_pass=True),
    # the decay exp(g) as exp2 of a log2 (decode._log2_decay): a shorter chain from a to the state update
    # (2026-12-03: with the gates computed beforehand GDN's pin ran 92.7-94.3% of copy, in the kernel 89.6-91.2)
    "bv16_w1_onepass_exp2": DecodeConfig(16, 1, l2norm_one_pass=True, decay_exp2=True),
}


def _time(fn, graph: bool = True) -> tuple[float, str]:
    """benchmarks/decode.py's timer: the median of CUDA-graph replays (graphs of :data:`GRAPH_MS`), or
    eager ``do_bench`` for long kernels."""
    import triton.testing as tt

    if not graph:
        torch.cuda.synchronize()
        return tt.do_bench(fn, warmup=10, rep=100, return_mode="median"), "eager"
    return tt.do_bench_cudagraph(fn, rep=GRAPH_MS, return_mode="median"), "cudagraph"


def _bytes(gate: str, N: int, state_itemsize: int) -> int:
    """benchmarks/decode.py's bytes with the state read and written counted at ``state_itemsize``."""
    s = SHAPES[gate]
    return decode_bytes(gate, N) - 2 * N * s["HV"] * s["K"] * s["V"] * (4 - state_itemsize)


def _max_diff(x: torch.Tensor, y: torch.Tensor, chunk: int = 256) -> float:
    """max |x - y| in float32, a chunk of rows at a time."""
    m = 0.0
    for i in range(0, x.shape[0], chunk):
        m = max(m, float((x[i:i + chunk].float() - y[i:i + chunk].float()).abs().max()))
    return m


def _oracle(gate: str, d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 output and new state of the first :data:`ORACLE_ROWS` sequences (torch_ref, oracle mode)."""
    from linattn.backends.torch_ref import gdn_decode_ref, kda_decode_ref

    r = ORACLE_ROWS
    idx = d["state_indices"][:r].long()
    args = {n: d[n][:r].double() for n in ("q", "k", "v", "a", "b")}
    pool = d["state_pool"][idx].double()  # the bf16 values, exactly
    fn = gdn_decode_ref if gate == "gdn" else kda_decode_ref
    o = fn(**args, A_log=d["A_log"].double(), dt_bias=d["dt_bias"].double(), state_pool=pool,
           state_indices=torch.arange(r, device=pool.device), scale=d["scale"], compute_dtype=torch.float64)
    return o, pool


def _call(gate: str, d: dict, pool: torch.Tensor, caps, cfg):
    return lambda: recurrent_decode(gate=gate, **dict(d, state_pool=pool), caps=caps, layout="split", config=cfg)


#: ``--no-prologue`` parts: what of the kernel's per-token prologue is done beforehand
PROLOGUE_PARTS = ("both", "l2norm", "gates")


def without_prologue(gate: str, d: dict, part: str = "both") -> dict:
    """The same call with (part of) the kernel's per-token prologue done beforehand (``--no-prologue``):
    ``l2norm``: q and k l2-normalised in fp32 and rounded to their dtype (``use_qk_l2norm=False``);
    ``gates``: the gates in the precomputed form (``g`` fp32 log decay, ``beta`` fp32;
    ``GATES_PRECOMPUTED``), as ``linattn.reference``'s gating computes them; ``both``. An experiment:
    how fast the state stream runs when the program does only the recurrence (the prologue is the
    same in every value block of a head)."""
    from linattn.reference import gdn_gating_ref, kda_gating_ref

    def norm(x):
        x = x.float()
        return (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)).to(d["q"].dtype)

    out = dict(d)
    if part in ("both", "l2norm"):
        out.update(q=norm(d["q"]), k=norm(d["k"]), use_qk_l2norm=False)
    if part in ("both", "gates"):
        gating = gdn_gating_ref if gate == "gdn" else kda_gating_ref
        g, beta = gating(d["A_log"], d["a"], d["b"], d["dt_bias"])
        out = {n: t for n, t in out.items() if n not in ("a", "b", "A_log", "dt_bias")}
        out.update(g=g.float().contiguous(), beta=beta.float().contiguous())
    return out


def _check(gate: str, d: dict, base: torch.Tensor, caps, cfg, ref, oracle) -> tuple[dict, torch.Tensor, tuple]:
    """Run ``cfg`` once on a fresh copy of ``base``: ``(checks, the pool it ran on, (o, new rows))``;
    the checks hold its differences from the pinned run ``ref`` (``(o, new rows)``, None for the
    pinned run itself) and from the float64 ``oracle``."""
    idx = d["state_indices"].long()
    pool = base.clone()
    o = _call(gate, d, pool, caps, cfg)()
    torch.cuda.synchronize()
    unowned = torch.ones(base.shape[0], dtype=torch.bool, device=base.device)
    unowned[idx] = False
    row = dict(unowned_rows_unchanged=bool(torch.equal(pool[unowned], base[unowned])))
    rows = pool[idx]
    if ref is not None:
        row.update(max_abs_diff_o=_max_diff(o, ref[0]), max_abs_diff_state=_max_diff(rows, ref[1]),
                   bitwise=bool(torch.equal(o, ref[0]) and torch.equal(rows, ref[1])))
    o64, s64 = oracle
    r = ORACLE_ROWS
    row.update(rel_err_o_vs_fp64=_rel(o[:r], o64), rel_err_state_vs_fp64=_rel(rows[:r], s64))
    return row, pool, (o, rows)


def _measure(gate: str, N: int, d: dict, caps, copy_tbps: float, cfg, pool, state_itemsize: int) -> dict:
    nbytes = _bytes(gate, N, state_itemsize)
    ms, how = _time(_call(gate, d, pool, caps, cfg), graph=N < 4096)
    tbps = nbytes / (ms * 1e-3) / 1e12
    return dict(us=ms * 1e3, TBps=tbps, frac_of_copy=tbps / copy_tbps, timing=how, bytes=nbytes)


def _config_fields(cfg: DecodeConfig) -> dict:
    return dict(BV=cfg.block_v, num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
                blocks=cfg.blocks, state_vec=cfg.state_vec, l2norm_one_pass=cfg.l2norm_one_pass,
                decay_exp2=cfg.decay_exp2)


def sweep_one(gate: str, N: int, caps, copy_tbps: float, names: list[str], fp32_row: bool,
              no_prologue: tuple = (), fp32_exp2: bool = False) -> list[dict]:
    """Every config of ``names`` at one (family, N): the checks first, then the timings; for each part of
    ``no_prologue`` (:data:`PROLOGUE_PARTS`), each config again on :func:`without_prologue`'s inputs
    (rows ``prologue_done_before``: the part; only the rows the call does not own and the distance
    from the pinned config's output are checked)."""
    d = make_inputs(gate, N)
    fp32_pool = d["state_pool"]
    base = fp32_pool.to(torch.bfloat16)
    args = dict(d, state_pool=base)
    oracle = _oracle(gate, args)
    s = SHAPES[gate]
    _, pinned = decode_launch_config(s["K"], s["V"], N, gate, torch.bfloat16)
    rows, ref = [], None
    head = dict(op=f"{gate}_decode", N=N, state_dtype="bf16", **SHAPES[gate])
    for name in names:
        cfg = CANDIDATES[name] or pinned
        row = dict(head, config=name, pinned=cfg == pinned, **_config_fields(cfg))
        try:
            checks, pool, out = _check(gate, args, base, caps, cfg, ref, oracle)
            if ref is None:
                ref = out  # the first name is the pinned config (main() puts it first)
            row.update(checks)
            row.update(_measure(gate, N, args, caps, copy_tbps, cfg, pool, 2))
            del pool
        except Exception as e:  # noqa: BLE001 - a config that does not build or run is a result
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        rows.append(row)
        print(f"  {gate} N={N:5d} {name:20s} " + (f"{row['TBps']:.3f} TB/s ({row['frac_of_copy']:.1%})"
              f" diff o {row.get('max_abs_diff_o', 0):.2e} state {row.get('max_abs_diff_state', 0):.2e}"
              f" fp64 o {row['rel_err_o_vs_fp64']:.1e} state {row['rel_err_state_vs_fp64']:.1e}"
              if "TBps" in row else row.get("error", "")), flush=True)
    for part in no_prologue:
        bare = without_prologue(gate, args, part)
        for name in names:
            cfg = CANDIDATES[name] or pinned
            row = dict(head, config=name, pinned=cfg == pinned, prologue_done_before=part, **_config_fields(cfg))
            try:
                pool = base.clone()
                o = _call(gate, bare, pool, caps, cfg)()
                torch.cuda.synchronize()
                idx = args["state_indices"].long()
                unowned = torch.ones(base.shape[0], dtype=torch.bool, device=base.device)
                unowned[idx] = False
                row.update(unowned_rows_unchanged=bool(torch.equal(pool[unowned], base[unowned])),
                           rel_diff_o_vs_pinned=_rel(o, ref[0]), rel_diff_state_vs_pinned=_rel(pool[idx], ref[1]))
                pool = base.clone()
                row.update(_measure(gate, N, bare, caps, copy_tbps, cfg, pool, 2))
                del pool
            except Exception as e:  # noqa: BLE001 - a config that does not build or run is a result
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(row)
            print(f"  {gate} N={N:5d} {name + f' (no {part} prologue)':36s} " + (
                f"{row['TBps']:.3f} TB/s ({row['frac_of_copy']:.1%}) rel diff vs pinned o {row['rel_diff_o_vs_pinned']:.1e}"
                f" state {row['rel_diff_state_vs_pinned']:.1e}" if "TBps" in row else row.get("error", "")), flush=True)
    del ref, base
    if fp32_row:  # the shipped fp32 pool at its pinned config: the method's check against decode_h200.json
        _, cfg32 = decode_launch_config(s["K"], s["V"], N, gate, torch.float32)
        m = _measure(gate, N, args, caps, copy_tbps, cfg32, fp32_pool, 4)
        rows.append(dict(head, state_dtype="fp32", config="fp32_pinned", pinned=True, **_config_fields(cfg32), **m))
        print(f"  {gate} N={N:5d} {'fp32 pool, pinned':20s} {m['TBps']:.3f} TB/s ({m['frac_of_copy']:.1%})", flush=True)
        if fp32_exp2:  # the fp32 pin with decay_exp2, checked against the fp32 pin on fresh copies of the pool
            cfg = cfg32._replace(decay_exp2=True)
            idx = args["state_indices"].long()
            p0, p1 = fp32_pool.clone(), fp32_pool.clone()
            o0, o1 = _call(gate, args, p0, caps, cfg32)(), _call(gate, args, p1, caps, cfg)()
            torch.cuda.synchronize()
            unowned = torch.ones(p1.shape[0], dtype=torch.bool, device=p1.device)
            unowned[idx] = False
            row = dict(head, state_dtype="fp32", config="fp32_pinned_exp2", pinned=False, **_config_fields(cfg),
                       unowned_rows_unchanged=bool(torch.equal(p1[unowned], fp32_pool[unowned])),
                       rel_diff_o_vs_pinned=_rel(o1, o0), rel_diff_state_vs_pinned=_rel(p1[idx], p0[idx]))
            del p0, p1
            row.update(_measure(gate, N, args, caps, copy_tbps, cfg, fp32_pool, 4))
            rows.append(row)
            print(f"  {gate} N={N:5d} {'fp32 pool, exp2 decay':20s} {row['TBps']:.3f} TB/s ({row['frac_of_copy']:.1%})"
                  f" rel diff vs pinned o {row['rel_diff_o_vs_pinned']:.1e} state {row['rel_diff_state_vs_pinned']:.1e}",
                  flush=True)
    return rows


NOTES = [
    "Triton decode on a bf16 state pool, candidate launch configs (benchmarks/decode_sweep.py CANDIDATES; "
    "DecodeConfig fields BV, num_warps, num_stages, maxnreg, blocks, state_vec) at GDN Qwen3-Next heads "
    "(H=16 HV=32) and KDA Kimi-Linear heads (H=HV=32), K=V=128, bf16 q/k/v/a/b, pool of 2N slots, random slots; "
    "benchmarks/decode.py's inputs, bytes (state at the pool's itemsize), timer and copy ceiling.",
    "kind: copy | sweep. config 'pinned' = the PINNED bf16 row when it ran; 'fp32_pinned' = the fp32 pool at its "
    "pinned config (state_dtype fp32). max_abs_diff_* and bitwise: against the pinned bf16 config's output and "
    "written pool rows on the same fresh pool; rel_err_*_vs_fp64: first 32 sequences against torch_ref's float64 "
    "oracle (state as stored in bf16); unowned_rows_unchanged: pool rows no sequence owns keep their bits.",
    "Times: medians of 10 CUDA-graph replays (graphs of 50 ms of kernels; benchmarks/decode.py: 100) below N = 4,096, "
    "eager do_bench at 4,096 (as benchmarks/decode.py).",
]


#: the ``kind`` of a sweep's rows in the decode benchmark's results file (:func:`merge_into`)
MERGED_KINDS = {"sweep": "bf16_sweep", "copy": "bf16_sweep_copy"}
MERGED_NOTE = "rows of kind bf16_sweep / bf16_sweep_copy"


def merge_into(sweep_path, target, note: str = "", label: str = "") -> dict:
    """Put the rows of the sweep's results file ``sweep_path`` into the results file ``target``
    (benchmarks/results/decode_<device>.json) as rows of kind bf16_sweep (sweep rows) and
    bf16_sweep_copy (its copy ceiling), replacing rows of those kinds and the note that begins
    :data:`MERGED_NOTE`; every other row and note is kept. The new note carries the sweep's command,
    commit, notes and ``note`` (how it ran). Both files in the ``benchmarks/_results.py`` schema.
    With ``label``, a sweep is added beside the earlier ones instead: its rows carry ``sweep=label``
    and its note begins with :data:`MERGED_NOTE` and ``[label]``; rows and notes of other labels stay.

    Returns the merged document (written to ``target``).
    Raises:
        ValueError: the sweep file has a row of another kind, or a device other than the target's.
    """
    from _results import Results, read_results

    sweep, doc = read_results(sweep_path), read_results(target)
    if sweep.device.get("name") != doc.device.get("name"):
        raise ValueError(f"sweep ran on {sweep.device.get('name')!r}, {target} holds {doc.device.get('name')!r}")
    bad = {r.get("kind") for r in sweep.rows} - set(MERGED_KINDS)
    if bad:
        raise ValueError(f"{sweep_path}: rows of kind {sorted(bad)}; a sweep file holds {sorted(MERGED_KINDS)}")
    head = f"{MERGED_NOTE} [{label}]" if label else MERGED_NOTE
    ours = (lambda r: r.get("sweep") == label) if label else (lambda r: "sweep" not in r)
    rows = [r for r in doc.rows if r.get("kind") not in MERGED_KINDS.values() or not ours(r)]
    rows += [dict(r, kind=MERGED_KINDS[r["kind"]], **({"sweep": label} if label else {})) for r in sweep.rows]
    text = (f"{head} (benchmarks/decode_sweep.py, merged by its --merge): `{sweep.command}`, "
            f"commit field {sweep.commit}" + (f"; {note}" if note else "") + ". The sweep's notes: "
            + " | ".join(n.replace("kind: copy | sweep", "kind (here): bf16_sweep_copy | bf16_sweep") for n in sweep.notes))
    mine = (lambda n: n.startswith(head)) if label else (lambda n: n.startswith(MERGED_NOTE + " ("))
    notes = [n for n in doc.notes if not mine(n)] + [text]
    merged = Results(command=doc.command, commit=doc.commit, device=doc.device, toolchain=doc.toolchain,
                     rows=rows, notes=notes)
    Path(target).write_text(json.dumps(merged.model_dump(), indent=1, default=str) + "\n")
    return merged.model_dump()


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="results file (default: decode_sweep_<device>.json under "
                                                "$LINATTN_RESULTS_DIR, else ./)")
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--families", default="gdn,kda")
    ap.add_argument("--configs", default=",".join(CANDIDATES), help="names from CANDIDATES ('pinned' always runs first)")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32-pool reference rows")
    ap.add_argument("--fp32-exp2", action="store_true",
                    help="also the fp32 pool's pinned config with decay_exp2 (rows fp32_pinned_exp2)")
    ap.add_argument("--no-prologue", nargs="?", const="both", default="", metavar="PARTS",
                    help="also run each config with q, k normalised and/or the gates computed beforehand: comma-separated "
                         f"parts of {PROLOGUE_PARTS} (no value: both; rows prologue_done_before; an experiment)")
    ap.add_argument("--merge", metavar="SWEEP_JSON", help="no run: merge this sweep file's rows into --into")
    ap.add_argument("--into", default=None, help="with --merge: the results file (default: "
                                                 "benchmarks/results/decode_<device tag of the sweep file>.json)")
    ap.add_argument("--note", default="", help="with --merge: how the sweep ran (the device command, tree, date)")
    ap.add_argument("--label", default="", help="with --merge: add the sweep beside the earlier ones, its rows "
                                                "tagged sweep=LABEL (unlabelled: it replaces the unlabelled sweep)")
    args = ap.parse_args(argv)
    if args.merge:
        from _results import RESULTS, read_results

        into = args.into or RESULTS / f"decode_{device_tag(read_results(args.merge).device.get('name'))}.json"
        merged = merge_into(args.merge, into, args.note, args.label)
        n = sum(r.get("kind") in MERGED_KINDS.values() and r.get("sweep", "") == args.label for r in merged["rows"])
        print(f"merged {n} sweep rows into {into}" + (f" (label {args.label})" if args.label else ""))
        return merged["rows"]
    bad_parts = [p for p in args.no_prologue.split(",") if p and p not in PROLOGUE_PARTS]
    if bad_parts:
        ap.error(f"--no-prologue: unknown parts {bad_parts}; known: {', '.join(PROLOGUE_PARTS)}")
    names = ["pinned"] + [n for n in args.configs.split(",") if n and n != "pinned"]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CANDIDATES)}")
    from linattn.capabilities import probe

    caps = probe(torch.device("cuda"))
    out = args.out or (results_path("decode_sweep") if os.environ.get("LINATTN_RESULTS_DIR")
                       else f"decode_sweep_{device_tag()}.json")
    command = "python benchmarks/decode_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.time()
    copy_tbps = copy_bandwidth()
    rows: list[dict] = [dict(kind="copy", bytes=2 * (4 << 30), TBps=copy_tbps)]
    print(f"copy bandwidth: {copy_tbps:.3f} TB/s", flush=True)
    for gate in args.families.split(","):
        for N in (int(n) for n in args.ns.split(",")):
            rows += [dict(kind="sweep", **r) for r in sweep_one(gate, N, caps, copy_tbps, names, not args.no_fp32,
                                                                 tuple(p for p in args.no_prologue.split(",") if p),
                                                                 fp32_exp2=args.fp32_exp2)]
            write_results(out, rows, NOTES + [f"elapsed {time.time() - t0:.0f} s"], command=command.strip())
            torch.cuda.empty_cache()
    _summary(rows, out, time.time() - t0)
    return rows


def _summary(rows: list[dict], out: str, elapsed: float) -> None:
    """Per family: each config's share of copy at every N, worst N first (the target: >= 93% at every N)."""
    print(f"\nwrote {out} ({elapsed:.0f} s)")
    for gate in sorted({r["op"] for r in rows if r["kind"] == "sweep"}):
        mine = [r for r in rows if r.get("op") == gate and "frac_of_copy" in r]
        by = {}
        for r in mine:
            part = r.get("prologue_done_before")
            by.setdefault(r["config"] + (f" (no {part} prologue)" if part else ""), []).append(r)
        ranked = sorted(by.items(), key=lambda kv: -min(r["frac_of_copy"] for r in kv[1]))
        print(f"{gate}: config, min share of copy over N, then per N (diff vs pinned: o / state)")
        for name, rs in ranked:
            print(f"  {name:20s} min {min(r['frac_of_copy'] for r in rs):.1%}  " + "  ".join(
                f"N={r['N']}: {r['frac_of_copy']:.1%}" for r in sorted(rs, key=lambda r: r["N"]))
                + (f"  diff {max(r.get('max_abs_diff_o', 0) for r in rs):.1e} / "
                   f"{max(r.get('max_abs_diff_state', 0) for r in rs):.1e}" if name != "fp32_pinned" else ""))


if __name__ == "__main__":
    main()
