"""An experiment (issue 32, item 5): the decode step on a bf16 state pool in Gluon, with q, k and KDA's gate
loaded in the state tile's own layout, against the pinned Triton decode, on an SM90 GPU.

Why: on bf16 pools the Triton decode (BV 16, 1 warp) reaches 89.6-94.3% of the copy bandwidth, the target is
93% for both families at every N (docs/performance.md, "Decode on bf16 pools"). In its sm_90 builds the key
vectors (q, k, KDA's per-channel gate) are loaded in a layout of their own and shuffled into the state tile's
(``SHFL.IDX``); Triton's layout propagation cannot be told otherwise (loading them as ``[1, BK]`` tiles made it
move the whole tile instead). Gluon states the layouts: here the ``[BV, K]`` bf16 tile is
``BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])`` (16-byte runs, as the Triton pin's) and every key vector
is loaded in its ``SliceLayout(0, .)``, every value vector in ``SliceLayout(1, .)``: no conversion anywhere.

The kernel's scope is the experiment's: K = V = 128, BV = 16, one warp, bf16 pool in the ``vk`` layout, raw
gates (``a``, ``b``, ``A_log``, ``dt_bias``; GDN's decay as exp2 like its pin, KDA's in the log1p form like
its pin), the q / k l2norm in one pass (the F44 scaled pass where the sum of squares reaches ``2**64``), a
negative slot is padding (zero output, nothing read or written), ``T`` tokens per sequence updating one slot.
It is not wired into linattn: a run decides whether it is worth building into the decode's launcher.

Per family (GDN at Qwen3-Next heads H = 16, HV = 32; KDA at Kimi-Linear's H = HV = 32) and N: the inputs,
bytes, timer and copy ceiling of benchmarks/decode_sweep.py (a pool of 2N bf16 slots, random slots); the
pinned Triton decode and the Gluon kernel run once on fresh copies of the pool and are compared (output and
written rows: max abs difference; rows not owned: bitwise unchanged; the first 32 sequences against the
float64 reference), then timed (CUDA-graph medians below N = 4,096, eager at 4,096).

Writes the ``benchmarks/_results.py`` schema (``decode_gluon_<device>.json`` under ``$LINATTN_RESULTS_DIR``);
benchmarks/results/ keeps no file of its own for it (rows merged into decode_h200.json by hand, kind
``gluon_decode``).

Usage:  python benchmarks/decode_gluon.py [--ns 256,1024,4096] [--families gdn,kda] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from linattn.kernels.triton.limits import G_MIN

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import results_path, write_results  # noqa: E402

NS = (256, 1024, 4096)
BV = 16
LOG2E = 1.4426950408889634


@gluon.jit
def l2n(x):
    """``x / sqrt(sum(x^2) + 1e-6)`` of one key vector, one reduction where the sum is below ``2**64``
    (else the F44 power-of-two scale, as ``kernels/triton/_l2norm.py``)."""
    ss = gl.sum(x * x, axis=0)
    if ss < 18446744073709551616.0:
        y = x / gl.sqrt(ss + 1e-6)
    else:
        mx = gl.max(gl.abs(x), axis=0)
        sh = gl.maximum(((mx.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 158, 0)
        s = ((127 - sh) << 23).to(gl.float32, bitcast=True)
        z = x * s
        y = z / gl.sqrt(gl.sum(z * z, axis=0) + 1e-6 * s * s)
    return y

@gluon.jit
def decay_of(x, exp_a, softplus_beta, softplus_threshold, DECAY_EXP2: gl.constexpr, G_FLOOR: gl.constexpr):
    """``exp(max(-exp(A_log) softplus(x), G_MIN))``: the exp2 form (GDN's pin) or the log1p form (KDA's)."""
    if DECAY_EXP2:
        coef = exp_a / softplus_beta
        y = softplus_beta * x * 1.4426950408889634
        l2 = gl.where(softplus_beta * x > softplus_threshold, y,
                      gl.maximum(y, 0.0) + gl.log2(1.0 + gl.exp2(-gl.abs(y))))
        g2 = gl.where(l2 == 0.0, 0.0, gl.where(coef == 0.0, 0.0, -coef * l2))
        d = gl.exp2(gl.where(g2 >= G_FLOOR * 1.4426950408889634, g2, G_FLOOR * 1.4426950408889634))
    else:
        bx = softplus_beta * x
        z = gl.exp(-gl.abs(bx))
        w = 1.0 + z
        l1p = gl.where(w == 1.0, z, gl.log(w) * (z / gl.where(w == 1.0, 1.0, w - 1.0)))
        sp = gl.where(bx > softplus_threshold, x, (gl.maximum(bx, 0.0) + l1p) / softplus_beta)
        g = gl.where(sp == 0.0, 0.0, gl.where(exp_a == 0.0, 0.0, -exp_a * sp))
        d = gl.exp(gl.maximum(g, G_FLOOR))
    return d

@gluon.jit
def decode_kernel(q, k, v, a, b, A_log, dt_bias, o, pool, state_indices, scale, softplus_beta,
                  softplus_threshold, T, s_qn, s_qt, s_qh, s_kn, s_kt, s_kh, s_vn, s_vt, s_vh, s_an, s_at, s_ah,
                  s_bn, s_bt, s_bh, s_pool_slot, s_pool_h,
                  H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                  GATE: gl.constexpr, DECAY_EXP2: gl.constexpr, G_FLOOR: gl.constexpr):
    """One program: value rows ``[i_v BV, (i_v + 1) BV)`` of one (sequence, value head), one warp."""
    L2: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])
    LK: gl.constexpr = gl.SliceLayout(0, L2)
    LV: gl.constexpr = gl.SliceLayout(1, L2)
    i_v = gl.program_id(0)
    i_hv = gl.program_id(1)
    i_n = gl.program_id(2)
    i_h = i_hv // (HV // H)
    offs_v = i_v * BV + gl.arange(0, BV, layout=LV)
    offs_k = gl.arange(0, K, layout=LK)
    slot = gl.load(state_indices + i_n).to(gl.int64)
    valid = slot >= 0
    live = (offs_v[:, None] * 0 + offs_k[None, :] * 0 + slot) >= 0  # the tile's mask: the slot is not padding
    p_s = pool + i_hv * s_pool_h + slot * s_pool_slot + offs_v[:, None] * K + offs_k[None, :]
    h = gl.load(p_s, mask=live, other=0.0).to(gl.float32)
    exp_a = gl.exp(gl.load(A_log + i_hv).to(gl.float32))
    if GATE == "gdn":
        dt = gl.load(dt_bias + i_hv).to(gl.float32)
    else:
        dt = gl.load(dt_bias + i_hv * K + offs_k).to(gl.float32)
    n64 = i_n.to(gl.int64)
    p_q = q + n64 * s_qn + i_h * s_qh + offs_k
    p_k = k + n64 * s_kn + i_h * s_kh + offs_k
    p_v = v + n64 * s_vn + i_hv * s_vh + offs_v
    p_a = a + n64 * s_an + i_hv * s_ah
    p_b = b + n64 * s_bn + i_hv * s_bh
    p_o = o + (n64 * T * HV + i_hv) * V + offs_v
    for t in range(T):
        t64 = t.to(gl.int64)
        b_q = gl.load(p_q + t64 * s_qt).to(gl.float32)
        b_k = gl.load(p_k + t64 * s_kt).to(gl.float32)
        b_v = gl.load(p_v + t64 * s_vt).to(gl.float32)
        b_b = gl.load(p_b + t64 * s_bt).to(gl.float32)
        if GATE == "gdn":
            x = gl.load(p_a + t64 * s_at).to(gl.float32) + dt
        else:
            x = gl.load(p_a + t64 * s_at + offs_k).to(gl.float32) + dt
        decay = decay_of(x, exp_a, softplus_beta, softplus_threshold, DECAY_EXP2, G_FLOOR)
        beta = 1.0 / (1.0 + gl.exp(-b_b))
        b_q = l2n(b_q) * scale
        b_k = l2n(b_k)
        if GATE == "gdn":
            h = h * decay
        else:
            h = h * decay[None, :]
        u = beta * (b_v - gl.sum(h * b_k[None, :], axis=1))
        h = h + u[:, None] * b_k[None, :]
        b_o = gl.sum(h * b_q[None, :], axis=1)
        b_o = gl.where(valid, b_o, 0.0)
        gl.store(p_o + t64 * (HV * V), b_o.to(o.dtype.element_ty))
    gl.store(p_s, h.to(pool.dtype.element_ty), mask=live)



def gluon_decode(gate: str, d: dict, pool: torch.Tensor, maxnreg=None) -> torch.Tensor:
    """The Gluon step on ``d`` (benchmarks/decode.py's ``make_inputs`` dict) and ``pool`` (bf16 ``[P, HV, V, K]``,
    updated in place), ``maxnreg`` a register cap (None: the compiler's 157-166 on sm_90); returns ``o``
    ``[N, T, HV, V]``."""
    q, k, v, a, b = d["q"], d["k"], d["v"], d["a"], d["b"]
    N, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert K == V == 128 and pool.dtype == torch.bfloat16 and pool.is_contiguous() and pool.shape[2:] == (V, K)
    o = torch.empty(N, T, HV, V, dtype=q.dtype, device=q.device)
    decode_kernel[(V // BV, HV, N)](
        q, k, v, a, b, d["A_log"], d["dt_bias"], o, pool, d["state_indices"], float(d["scale"]), 1.0, 20.0, T,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *a.stride()[:3], *b.stride()[:3],
        pool.stride(0), pool.stride(1),
        H=H, HV=HV, K=K, V=V, BV=BV, GATE=gate, DECAY_EXP2=gate == "gdn", G_FLOOR=G_MIN, num_warps=1,
        maxnreg=maxnreg)
    return o


def build_sm90(gate: str, maxnreg=None):
    """The kernel compiled for sm_90 without a GPU (the experiment's shapes: bf16 q / k / v / a / b, fp32
    ``A_log`` / ``dt_bias``, int32 slots; pointers and the strides a launch sees 16-aligned marked so): the
    CompiledKernel (its ``asm``: ``ttgir``, ``ptx``, ``cubin``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ptrs = dict(q="*bf16", k="*bf16", v="*bf16", a="*bf16", b="*bf16", A_log="*fp32", dt_bias="*fp32", o="*bf16",
                pool="*bf16", state_indices="*i32")
    aligned = set(ptrs) | {"s_qn", "s_qt", "s_qh", "s_kn", "s_kt", "s_kh", "s_vn", "s_vt", "s_vh", "s_an", "s_at",
                           "s_bn", "s_bt", "s_pool_slot", "s_pool_h"} | ({"s_ah"} if gate == "kda" else set())
    consts = dict(H=16 if gate == "gdn" else 32, HV=32, K=128, V=128, BV=BV, GATE=gate, DECAY_EXP2=gate == "gdn",
                  G_FLOOR=G_MIN)
    sig, cex, attrs = {}, {}, {}
    for i, p in enumerate(decode_kernel.params):
        if p.name in aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
        if p.is_constexpr:
            sig[p.name], cex[(i,)] = "constexpr", consts[p.name]
        else:
            sig[p.name] = ptrs.get(p.name, "fp32" if p.name in ("scale", "softplus_beta", "softplus_threshold") else "i32")
    return triton.compile(GluonASTSource(decode_kernel, sig, cex, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=1, maxnreg=maxnreg))


def measure(gate: str, N: int, caps, copy_tbps: float) -> list[dict]:
    """The pinned Triton decode and the Gluon kernel at one (family, N): checks, then timings."""
    from decode import make_inputs
    from decode_sweep import _bytes, _call, _check, _max_diff, _oracle, _rel, _time

    from linattn.kernels.triton.decode import decode_launch_config

    d = make_inputs(gate, N)
    base = d["state_pool"].to(torch.bfloat16)
    del d["state_pool"]
    args = dict(d, state_pool=base)
    oracle = _oracle(gate, args)
    _, pinned = decode_launch_config(128, 128, N, gate, torch.bfloat16)
    nbytes = _bytes(gate, N, 2)
    head = dict(kind="gluon_decode", op=f"{gate}_decode", N=N, state_dtype="bf16", bytes=nbytes)
    checks, pool, ref = _check(gate, args, base, caps, pinned, None, oracle)

    ms, how = _time(_call(gate, args, pool, caps, pinned), graph=N < 4096)
    rows = [dict(head, kernel="triton_pinned", **checks, us=ms * 1e3, TBps=nbytes / (ms * 1e-3) / 1e12, timing=how)]
    del pool
    idx = d["state_indices"].long()
    unowned = torch.ones(base.shape[0], dtype=torch.bool, device=base.device)
    unowned[idx] = False
    for name, cap in (("gluon", None), ("gluon_reg128", 128)):
        pool = base.clone()
        o = gluon_decode(gate, args, pool, cap)
        torch.cuda.synchronize()
        row = dict(head, kernel=name, maxnreg=cap, unowned_rows_unchanged=bool(torch.equal(pool[unowned], base[unowned])),
                   max_abs_diff_o=_max_diff(o, ref[0]), max_abs_diff_state=_max_diff(pool[idx], ref[1]),
                   bitwise=bool(torch.equal(o, ref[0]) and torch.equal(pool[idx], ref[1])),
                   rel_err_o_vs_fp64=_rel(o[:32], oracle[0]), rel_err_state_vs_fp64=_rel(pool[idx][:32], oracle[1]))
        ms, how = _time(lambda p=pool, c=cap: gluon_decode(gate, args, p, c), graph=N < 4096)
        row.update(us=ms * 1e3, TBps=nbytes / (ms * 1e-3) / 1e12, timing=how)
        rows.append(row)
        del pool
    for x in rows:
        x["frac_of_copy"] = x["TBps"] / copy_tbps
        print(f"  {gate} N={N:5d} {x['kernel']:14s} {x['TBps']:.3f} TB/s ({x['frac_of_copy']:.1%})"
              f" diff o {x.get('max_abs_diff_o', 0):.2e} state {x.get('max_abs_diff_state', 0):.2e}"
              f" fp64 o {x['rel_err_o_vs_fp64']:.1e} state {x['rel_err_state_vs_fp64']:.1e}"
              f" unowned {x['unowned_rows_unchanged']}", flush=True)
    return rows


def _ns(spec: str) -> list:
    """``--ns``' value: distinct integers in 1..65535 (one program column per sequence on the grid's z)."""
    try:
        ns = [int(n) for n in spec.split(",")]
        assert ns and all(0 < n <= 65535 for n in ns) and len(set(ns)) == len(ns)
    except (ValueError, AssertionError):
        raise argparse.ArgumentTypeError(f"{spec!r}: distinct integers in 1..65535, comma-separated") from None
    return ns


def _families(spec: str) -> str:
    """``--families``' value: gdn, kda or both, each once."""
    items = spec.split(",")
    if not items or any(f not in ("gdn", "kda") for f in items) or len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"{spec!r}: gdn, kda or gdn,kda")
    return spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--ns", default=",".join(map(str, NS)), type=_ns,
                    help=f"sequences per call, comma-separated, each 1..65535 (the grid's z; default {','.join(map(str, NS))})")
    ap.add_argument("--families", default="gdn,kda", type=_families, help="gdn, kda or both, comma-separated (default both)")
    ap.add_argument("--out", default=None, help="result file (default: $LINATTN_RESULTS_DIR/decode_gluon_<device>.json)")
    a = ap.parse_args(argv)
    ns = a.ns
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        ap.error("needs a CUDA GPU of compute capability 9.x (SM90)")
    from decode import copy_bandwidth

    from linattn.capabilities import probe

    caps = probe(torch.device("cuda"))
    out = a.out or results_path("decode_gluon")
    t0 = time.time()
    copy_tbps = copy_bandwidth()
    rows: list[dict] = [dict(kind="copy", bytes=2 * (4 << 30), TBps=copy_tbps)]
    print(f"copy bandwidth: {copy_tbps:.3f} TB/s", flush=True)
    notes = [__doc__.split("\n\n")[0].replace("\n", " "), "kind gluon_decode: kernel triton_pinned | gluon; "
             "max_abs_diff_* and bitwise against the pinned Triton run on the same fresh pool"]
    for gate in a.families.split(","):
        for N in ns:
            rows += measure(gate, N, caps, copy_tbps)
            write_results(out, rows, notes + [f"elapsed {time.time() - t0:.0f} s"])
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
