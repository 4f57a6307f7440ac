"""GPU self-checks of the CuTe DSL prefill: each check returns a dict with ``ok`` and its numbers.

Shared by ``tests/gpu/test_cutedsl_gpu.py`` (one test per check) and
``benchmarks/prefill_cutedsl.py`` (all checks, recorded in the committed JSON). The oracle is the
float64 token-serial reference (:mod:`linattn.reference`, torch-ref's maths) for whole prefills and
:func:`linattn.kernels.cutedsl.reference.state_stage_ref` for the state stage alone. The relative
error and the tolerances are :mod:`linattn.testing.compare`'s: docs/ops.md's for bf16 inputs with
fp32 state (2e-2 outputs, 1e-2 states); the state stage alone, whose GEMM operands are bf16, is held
to 2e-2 (key ``prefill_state_stage``). A check passes strictly below its bound. Every check that
touches a pool also asserts that the rows not owned by the call are bitwise unchanged.

These are the sign-off checks of an arch (they ran on the H200: ``CuteDSLBackend.verified_archs``).
On an arch that has not been signed off (sm_100 / sm_103), the dispatcher runs the small
first-call check of :mod:`linattn.dispatch.runtime.self_check` instead, once per op and shape class,
before any user data; run these on such a GPU to add it to ``verified_archs``.
"""

from __future__ import annotations

import traceback
from typing import Callable, Optional

import torch

from linattn.testing.compare import rel_error
from linattn.testing.compare import tolerances

from .reference import state_stage_ref

C = 64
CHECKS: dict[str, Callable[[], dict]] = {}
#: The prefill the whole-prefill checks run: "cutedsl", or "triton" (the Triton prefill, to tell
#: which stage a failure comes from; set by ``benchmarks/prefill_cutedsl.py --impl``).
PIPELINE_IMPL = "cutedsl"


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


#: Bounds of the whole prefill (output, state) and of the state stage alone (chunk states, vn, final).
TOL_O, TOL_S = tolerances("bfloat16", "float32", phase="prefill")
TOL_STAGE = tolerances("bfloat16", "float32", phase="prefill_state_stage")[0]


def _cu(lens, dev, dtype=torch.int32):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=dtype, device=dev)


def _gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


# -------------------------------------------------------------------------------------------------
# state stage alone
# -------------------------------------------------------------------------------------------------

def state_inputs(kda, lens, H, HV, K, V, seed=0, dev="cuda"):
    """Synthetic, numerically tame inputs of the state stage (delta-rule-like W)."""
    gen = _gen(seed)
    T = sum(lens)
    grp = HV // H
    k = torch.randn(T, H, K, device=dev, generator=gen).to(torch.bfloat16)
    kf = k.float().repeat_interleave(grp, 1)
    rk = (1.0 / torch.sqrt((kf * kf).sum(-1) + 1e-6)).contiguous()  # [T, HV]
    gs = (T, HV, K) if kda else (T, HV)
    g = -(0.02 + 0.2 * torch.rand(gs, device=dev, generator=gen))
    w = (0.5 * kf * rk[..., None]).to(torch.bfloat16).contiguous()
    u = torch.randn(T, HV, V, device=dev, generator=gen).to(torch.bfloat16)
    return dict(k=k, g=g.contiguous(), w=w, u=u, rk=rk)


def _kda_state_operands(inp: dict, cu: torch.Tensor, chunk_off: torch.Tensor):
    """What the Triton intra stage hands KDA's state stage, from raw ``k [T, H, K]``,
    ``g [T, HV, K]`` and ``rk [T, HV]``: the decayed keys ``kd = k rk exp(G_C - G)``
    (``[T, HV, K]`` bf16, G the chunk-local cumulative gates, G_C their chunk total) and the
    totals ``gl [NT, HV, K]`` fp32 (chunks numbered as ``chunk_off``)."""
    k, g, rk = inp["k"], inp["g"], inp["rk"]
    T, HV = g.shape[0], g.shape[1]
    t = torch.arange(T, device=g.device)
    cu = cu.long()
    seq = torch.searchsorted(cu[1:], t, right=True)
    bos = cu[seq]
    chunk = chunk_off[seq] + (t - bos) // 64
    start = bos + (t - bos) // 64 * 64
    G = torch.cumsum(g.double(), 0)
    G = G - torch.where((start > 0)[:, None, None], G[(start - 1).clamp(min=0)], 0.0)
    nt = int(chunk_off[-1])
    gl = torch.zeros(max(nt, 1), HV, g.shape[2], dtype=torch.float64, device=g.device)
    last = torch.ones(T, dtype=torch.bool, device=g.device)  # the last row of each chunk
    last[:-1] = chunk[1:] != chunk[:-1]
    gl[chunk[last]] = G[last]
    kf = k.double().repeat_interleave(HV // k.shape[1], 1) * rk.double()[..., None]
    kd = (kf * torch.exp(gl[chunk] - G)).to(torch.bfloat16).contiguous()
    return kd, gl.float().contiguous()


def run_state(kda, inp, cu, *, pool=None, slots=None, h0=None, state_layout="vk", impl="cutedsl", bufs=None):
    """Run one state kernel; returns (hbuf, vn, final_or_None).

    ``bufs=(chunk_off, hbuf, vn)`` reuses buffers (benchmarks); otherwise fresh NaN-filled ones."""
    from linattn.kernels.triton.prefill import chunk_tables

    from .chunk_state import cutedsl_chunk_state

    T, H, K = inp["k"].shape
    HV, V = inp["u"].shape[1], inp["u"].shape[2]
    N = cu.numel() - 1
    if bufs is not None:
        chunk_off, hbuf, vn = bufs
    else:
        chunk_off, _, _, nt_max = chunk_tables(cu, T)
        hbuf = torch.full((nt_max, HV, K, V), float("nan"), dtype=torch.bfloat16, device=cu.device)
        vn = torch.full((T, HV, V), float("nan"), dtype=torch.bfloat16, device=cu.device)
    final = None
    if pool is None:
        shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
        final = torch.full(shape, float("nan"), dtype=torch.float32, device=cu.device)
    if impl == "cutedsl":
        cutedsl_chunk_state(kda=kda, **inp, cu_seqlens=cu, chunk_off=chunk_off, state_indices=slots,
                            h0=pool if pool is not None else h0, ht=pool if pool is not None else final,
                            hbuf=hbuf, vn=vn, state_layout=state_layout)
    else:  # the Triton state kernel, same buffers
        import triton.language as tl

        from linattn.capabilities import probe
        from linattn.kernels.grid import plan_grid
        from linattn.kernels.triton.chunk_state import chunk_state_kernel
        from linattn.kernels.triton.chunk_state import state_strides
        from linattn.kernels.triton.prefill import prefill_config

        cfg = prefill_config("kda" if kda else "gdn", K, V, torch.bfloat16).state
        bv = cfg.block_v
        plan = plan_grid(N, HV, V // bv, probe(cu.device), "split")
        hh0 = pool if pool is not None else (h0 if h0 is not None else final)
        ht = pool if pool is not None else final
        k, g, grp = inp["k"], inp["g"], HV // H
        if kda:  # the Triton state kernel reads what KDA's intra stage hands it
            k, g = _kda_state_operands(inp, cu, chunk_off)
            grp = 1
        chunk_state_kernel[plan.grid](
            k, g, inp["w"], inp["u"], inp["rk"], cu, chunk_off, slots if slots is not None else chunk_off,
            chunk_off, hh0, ht, hbuf, vn, None, None, None, None, None,
            k.stride(0), k.stride(1), g.stride(0), g.stride(1), 0, 0,
            *state_strides(hh0, state_layout), *state_strides(ht, state_layout),
            grp, HV, None, None, None, K=K, V=V, BV=bv,  # no checkpoints (ckpt, ck_n, ck_every)
            **plan.constexprs, KDA=kda, POOL=pool is not None,
            HAS_H0=h0 is not None, DT=tl.bfloat16, PREC="tf32", FUSE_O=False,
            num_warps=cfg.launch.num_warps, num_stages=cfg.launch.num_stages)  # q, aqk, o, v, tm_beta: not read without FUSE_O / UTM
    return hbuf, vn, final


def _nchunks(lens):
    return sum((n + C - 1) // C for n in lens)


@check
def state_roundtrip_empty_sequences():
    """Zero-length sequences: the final state equals h0 bitwise (pool fp32/bf16, vk/kv, dense);
    negative index: nothing stored; every other pool row unchanged."""
    out = {"ok": True, "cases": []}
    dev = "cuda"
    H, HV, K, V = 1, 2, 128, 64
    lens = [0, 0, 0]
    cu = _cu(lens, dev)
    for kda in (False, True):
        inp = state_inputs(kda, [1], H, HV, K, 128 if False else V)
        inp = {k_: (x[:0] if x.dim() else x) for k_, x in inp.items()}
        for sdt in (torch.float32, torch.bfloat16):
            for lay in ("vk", "kv"):
                shape = (9, HV, V, K) if lay == "vk" else (9, HV, K, V)
                pool = torch.randn(shape, device=dev).to(sdt)
                before = pool.clone()
                slots = torch.tensor([4, -1, 0], dtype=torch.int32, device=dev)
                run_state(kda, inp, cu, pool=pool, slots=slots, state_layout=lay)
                same = bool(torch.equal(pool, before))
                out["cases"].append({"kda": kda, "dtype": str(sdt), "layout": lay, "pool_bitwise_same": same})
                out["ok"] &= same
                h0 = torch.randn((3,) + shape[1:], device=dev)
                _, _, fin = run_state(kda, inp, cu, h0=h0, state_layout=lay)
                same = bool(torch.equal(fin, h0))
                out["cases"].append({"kda": kda, "layout": lay, "dense_final_equals_h0": same})
                out["ok"] &= same
    return out


@check
def state_identity_chunks():
    """W = 0, K = 0, g = 0: vn == u, hbuf[c] == bf16(h0) (as [K, V]), final == h0, all bitwise
    (pins every address mapping of the kernel: pool rows, hbuf, vn, tails)."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    H, HV, K, V = 1, 2, 128, 128
    lens = [64, 37, 130]
    cu = _cu(lens, dev)
    for kda in (False, True):
        inp = state_inputs(kda, lens, H, HV, K, V, seed=1)
        inp["w"].zero_()
        inp["k"].zero_()
        inp["g"].zero_()
        pool = torch.randn(5, HV, V, K, device=dev)
        before = pool.clone()
        slots = torch.tensor([3, 0, 1], dtype=torch.int64, device=dev)
        hbuf, vn, _ = run_state(kda, inp, cu, pool=pool, slots=slots)
        nc = _nchunks(lens)
        exp_h = []
        for n, s in enumerate(slots.tolist()):
            exp_h += [before[s].transpose(-1, -2).to(torch.bfloat16)] * ((lens[n] + C - 1) // C)
        exp_h = torch.stack(exp_h)
        c = {"kda": kda, "vn_equals_u": bool(torch.equal(vn, inp["u"])),
             "hbuf_equals_h0": bool(torch.equal(hbuf[:nc], exp_h)),
             "final_equals_h0": bool(torch.equal(pool, before)),
             "hbuf_max_abs_err": float((hbuf[:nc].float() - exp_h.float()).abs().max()),
             "vn_max_abs_err": float((vn.float() - inp["u"].float()).abs().max())}
        out["cases"].append(c)
        out["ok"] &= c["vn_equals_u"] and c["hbuf_equals_h0"] and c["final_equals_h0"]
    return out


@check
def state_vs_reference():
    """Random lengths (1, 63, 64, 65, 130, 0, 200), one padding row: hbuf, vn and the final state
    against the float64 state-stage reference (and, for information, the Triton state kernel)."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    H, HV = 2, 4
    lens = [1, 63, 64, 65, 130, 0, 200]
    cu = _cu(lens, dev)
    nc = _nchunks(lens)
    for kda in (False, True):
        for K, V in ((128, 128), (64, 64)):
            for sdt, lay in ((torch.float32, "vk"), (torch.bfloat16, "kv")):
                inp = state_inputs(kda, lens, H, HV, K, V, seed=2)
                P = 16
                shape = (P, HV, V, K) if lay == "vk" else (P, HV, K, V)
                pool = (0.5 * torch.randn(shape, device=dev)).to(sdt)
                before = pool.clone()
                slots = torch.tensor([5, 0, 9, 2, -1, 15, 7], dtype=torch.int32, device=dev)
                hbuf, vn, _ = run_state(kda, inp, cu, pool=pool, slots=slots, state_layout=lay)
                rh, rv, rf = state_stage_ref(kda=kda, **inp, cu_seqlens=cu, h0=before, slots=slots,
                                             state_layout=lay)
                live = [n for n in range(len(lens)) if int(slots[n]) >= 0]
                tok_live = torch.cat([torch.arange(int(cu[n]), int(cu[n + 1]), device=dev) for n in live])
                tok_pad = torch.arange(int(cu[4]), int(cu[5]), device=dev)
                got_f = pool[slots[live].long()].double()
                got_f = got_f.transpose(-1, -2) if lay == "vk" else got_f
                untouched = [p for p in range(P) if p not in slots.tolist()]
                c = {"kda": kda, "K": K, "V": V, "state_dtype": str(sdt), "layout": lay,
                     "hbuf_rel": rel_error(hbuf[:nc][_live_chunks(lens, live)], rh[_live_chunks(lens, live)]),
                     "vn_rel": rel_error(vn[tok_live], rv[tok_live]),
                     "final_rel": rel_error(got_f, rf[live]),
                     "padding_vn_zero": bool((vn[tok_pad] == 0).all()),
                     "untouched_rows_same": bool(torch.equal(pool[untouched], before[untouched])),
                     "padding_row_same": True}
                try:
                    pool2 = before.clone()
                    th, tv, _ = run_state(kda, inp, cu, pool=pool2, slots=slots, state_layout=lay, impl="triton")
                    c["triton_hbuf_rel"] = rel_error(th[:nc][_live_chunks(lens, live)], rh[_live_chunks(lens, live)])
                    c["triton_vn_rel"] = rel_error(tv[tok_live], rv[tok_live])
                except Exception as e:  # noqa: BLE001 - informational only
                    c["triton_error"] = f"{type(e).__name__}: {e}"[:300]
                ok = (c["hbuf_rel"] < TOL_STAGE and c["vn_rel"] < TOL_STAGE and c["final_rel"] < TOL_STAGE
                      and c["padding_vn_zero"] and c["untouched_rows_same"])
                c["ok"] = ok
                out["cases"].append(c)
                out["ok"] &= ok
    return out


@check
def state_pool_equals_dense_bitwise():
    """The state kernel alone: pool mode and dense mode (same initial states) write the same hbuf,
    vn and final states, bitwise (GDN, KDA; fp32 and bf16 pools)."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    H, HV, K, V = 2, 4, 128, 128
    lens = [1, 63, 64, 65, 130, 0, 200]
    cu = _cu(lens, dev)
    nc = _nchunks(lens)
    for kda in (False, True):
        inp = state_inputs(kda, lens, H, HV, K, V, seed=9)
        for sdt in (torch.float32, torch.bfloat16):
            pool = (0.5 * torch.randn(16, HV, V, K, device=dev)).to(sdt)
            slots = torch.tensor([5, 0, 9, 2, 11, 15, 7], dtype=torch.int32, device=dev)
            h0 = pool[slots.long()].clone()
            ph, pv, _ = run_state(kda, inp, cu, pool=pool, slots=slots)
            dh, dv, df = run_state(kda, inp, cu, h0=h0)
            c = {"kda": kda, "state_dtype": str(sdt), "hbuf": bool(torch.equal(ph[:nc], dh[:nc])),
                 "vn": bool(torch.equal(pv, dv)), "final": bool(torch.equal(pool[slots.long()], df.to(sdt)))}
            c["ok"] = c["hbuf"] and c["vn"] and c["final"]
            out["cases"].append(c)
            out["ok"] &= c["ok"]
    return out


def _live_chunks(lens, live):
    idx, c = [], 0
    for n, L in enumerate(lens):
        m = (L + C - 1) // C
        if n in live:
            idx += list(range(c, c + m))
        c += m
    return torch.tensor(idx, dtype=torch.long, device="cuda")


# -------------------------------------------------------------------------------------------------
# whole prefill
# -------------------------------------------------------------------------------------------------

def prefill_inputs(kda, lens, H, HV, K, V, seed=0, dev="cuda", cu_dtype=torch.int32):
    gen = _gen(seed)
    T = sum(lens)
    q = torch.randn(T, H, K, device=dev, generator=gen).to(torch.bfloat16)
    k = torch.randn(T, H, K, device=dev, generator=gen).to(torch.bfloat16)
    v = torch.randn(T, HV, V, device=dev, generator=gen).to(torch.bfloat16)
    gs = (T, HV, K) if kda else (T, HV)
    g = torch.nn.functional.logsigmoid(torch.randn(gs, device=dev, generator=gen) + 3.0) * 0.5
    beta = torch.sigmoid(torch.randn(T, HV, device=dev, generator=gen))
    return dict(q=q, k=k, v=v, g=g.float().contiguous(), beta=beta.float().contiguous(),
                cu_seqlens=_cu(lens, dev, cu_dtype))


def run_prefill(family, inp, *, pool=None, slots=None, h0=None, state_layout="vk", impl=None):
    impl = impl or PIPELINE_IMPL
    K = inp["q"].shape[-1]
    kw = dict(inp, state_pool=pool, state_indices=slots, initial_state=h0, scale=K ** -0.5,
              use_qk_l2norm=True, state_layout=state_layout)
    if impl == "cutedsl":
        from .prefill import cutedsl_prefill
        return cutedsl_prefill(family, **kw)
    from linattn.kernels.triton.prefill import chunk_prefill
    return chunk_prefill(family, **kw)


def reference(family, inp, *, pool=None, slots=None, h0=None, state_layout="vk"):
    from linattn.reference import gdn_prefill_ref, kda_prefill_ref

    fn = gdn_prefill_ref if family == "gdn" else kda_prefill_ref
    return fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["cu_seqlens"], state_pool=pool,
              state_indices=slots, initial_state=h0, scale=inp["q"].shape[-1] ** -0.5, use_qk_l2norm=True,
              state_layout=state_layout, compute_dtype=torch.float64)


@check
def prefill_vs_reference_and_pool_equals_dense():
    """Whole prefill (Triton intra/output + CuTe state) against the float64 reference at the Triton
    prefill's test shapes (T not a multiple of 64, length 1, zero length, padding), GDN and KDA,
    fp32 and bf16 pools, vk and kv; pool mode equals dense mode bitwise; other rows unchanged."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    lens = [1, 63, 64, 65, 130, 0, 200, 517]
    H, HV, K, V = 2, 4, 128, 128
    for family in ("gdn", "kda"):
        inp = prefill_inputs(family == "kda", lens, H, HV, K, V, seed=3)
        for sdt, lay in ((torch.float32, "vk"), (torch.bfloat16, "vk"), (torch.float32, "kv"), (torch.bfloat16, "kv")):
            P = 64
            shape = (P, HV, V, K) if lay == "vk" else (P, HV, K, V)
            gen = _gen(4)
            pool = (0.3 * torch.randn(shape, device=dev, generator=gen)).to(sdt)
            before = pool.clone()
            perm = torch.randperm(P, device=dev, generator=gen)[:len(lens)]
            slots = perm.to(torch.int64)
            slots[2] = -1  # padding
            o, _ = run_prefill(family, inp, pool=pool, slots=slots, state_layout=lay)
            ref_pool = before.clone()
            ro, _ = reference(family, inp, pool=ref_pool, slots=slots, state_layout=lay)
            live = [n for n in range(len(lens)) if int(slots[n]) >= 0]
            ls = slots[live]
            cu = inp["cu_seqlens"]
            pad_tok = torch.arange(int(cu[2]), int(cu[3]), device=dev)
            untouched = [p for p in range(P) if p not in slots.tolist()]
            # dense mode with the same initial states
            h0 = before[slots.clamp(min=0)].clone()
            h0[2] = 0
            od, fd = run_prefill(family, inp, h0=h0, state_layout=lay)
            c = {"family": family, "state_dtype": str(sdt), "layout": lay,
                 "o_rel": rel_error(o, ro), "state_rel": rel_error(pool[ls], ref_pool[ls]),
                 "padding_output_zero": bool((o[pad_tok] == 0).all()),
                 "untouched_rows_same": bool(torch.equal(pool[untouched], before[untouched])),
                 "pool_equals_dense_o": bool(torch.equal(o[_tok(cu, live)], od[_tok(cu, live)])),
                 "pool_equals_dense_state": bool(torch.equal(pool[ls], fd[live].to(sdt)))}
            ok = (c["o_rel"] < TOL_O and c["state_rel"] < TOL_S and c["padding_output_zero"]
                  and c["untouched_rows_same"] and c["pool_equals_dense_o"] and c["pool_equals_dense_state"])
            c["ok"] = ok
            out["cases"].append(c)
            out["ok"] &= ok
    return out


def _tok(cu, seqs):
    return torch.cat([torch.arange(int(cu[n]), int(cu[n + 1]), device=cu.device) for n in seqs])


@check
def prefill_edge_cu_seqlens():
    """Field case F19 (and T = 0): cu_seqlens [0,0,5], [0,5,5,5], [0,0], [0,0,0], [0,128,128,256],
    pool and dense: no fault; empty sequences keep their state; matches the reference."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    H, HV, K, V = 1, 2, 128, 128
    for lens in ([0, 5], [5, 0, 0], [0], [0, 0], [128, 0, 128]):
        for family in ("gdn", "kda"):
            inp = prefill_inputs(family == "kda", lens, H, HV, K, V, seed=5, cu_dtype=torch.int64)
            P = 8
            pool = torch.randn(P, HV, V, K, device=dev)
            before = pool.clone()
            slots = torch.arange(len(lens), dtype=torch.int32, device=dev) + 1
            o, _ = run_prefill(family, inp, pool=pool, slots=slots)
            rp = before.clone()
            ro, _ = reference(family, inp, pool=rp, slots=slots)
            c = {"lens": lens, "family": family, "o_rel": rel_error(o, ro) if o.numel() else 0.0,
                 "state_rel": rel_error(pool, rp)}
            c["ok"] = c["o_rel"] < TOL_O and c["state_rel"] < TOL_S
            out["cases"].append(c)
            out["ok"] &= c["ok"]
    return out


@check
def prefill_many_short_sequences():
    """Field case F02: HV=32, N=2,050 documents of 1..40 tokens (N*HV past 65,535) in pool mode:
    equals two launches of half the documents bitwise, and the reference."""
    dev = "cuda"
    gen = _gen(6)
    N, H, HV, K, V = 2050, 16, 32, 128, 128
    lens = torch.randint(1, 41, (N,), generator=gen, device=dev).tolist()
    inp = prefill_inputs(False, lens, H, HV, K, V, seed=7)
    P = N + 10
    pool = (0.1 * torch.randn(P, HV, V, K, device=dev, generator=gen))
    before = pool.clone()
    slots = torch.randperm(P, device=dev, generator=gen)[:N].to(torch.int32)
    o, _ = run_prefill("gdn", inp, pool=pool, slots=slots)
    # two halves
    pool2 = before.clone()
    cu = inp["cu_seqlens"]
    h = N // 2
    outs = []
    for lo, hi in ((0, h), (h, N)):
        t0, t1 = int(cu[lo]), int(cu[hi])
        part = dict(inp, q=inp["q"][t0:t1], k=inp["k"][t0:t1], v=inp["v"][t0:t1], g=inp["g"][t0:t1],
                    beta=inp["beta"][t0:t1], cu_seqlens=(cu[lo:hi + 1] - cu[lo]).contiguous())
        oo, _ = run_prefill("gdn", part, pool=pool2, slots=slots[lo:hi].contiguous())
        outs.append(oo)
    # the reference on the first 64 documents (a float64 token-serial run of all 2,050 is too slow)
    m = 64
    tm = int(cu[m])
    sub = dict(inp, q=inp["q"][:tm], k=inp["k"][:tm], v=inp["v"][:tm], g=inp["g"][:tm], beta=inp["beta"][:tm],
               cu_seqlens=cu[:m + 1].contiguous())
    rp = before.clone()
    ro, _ = reference("gdn", sub, pool=rp, slots=slots[:m])
    sl = slots[:m].long()
    c = {"halves_equal_o": bool(torch.equal(o, torch.cat(outs))), "halves_equal_pool": bool(torch.equal(pool, pool2)),
         "o_rel_first64": rel_error(o[:tm], ro), "state_rel_first64": rel_error(pool[sl], rp[sl]),
         "untouched_rows_same": bool(torch.equal(pool[_others(P, slots)], before[_others(P, slots)]))}
    c["ok"] = (c["halves_equal_o"] and c["halves_equal_pool"] and c["o_rel_first64"] < TOL_O
               and c["state_rel_first64"] < TOL_S and c["untouched_rows_same"])
    return c


def _others(P, slots):
    used = set(slots.tolist())
    return torch.tensor([p for p in range(P) if p not in used], dtype=torch.long, device=slots.device)


@check
def prefill_long_sequence():
    """One 3,000-token sequence and strongly negative gates (g = -20 per token, field cases F20/F23)."""
    dev = "cuda"
    out = {"ok": True, "cases": []}
    for family, gscale in (("gdn", None), ("kda", None), ("gdn", -20.0)):
        inp = prefill_inputs(family == "kda", [3000], 2, 4, 128, 128, seed=8)
        if gscale is not None:
            inp["g"].fill_(gscale)
        pool = 0.3 * torch.randn(2, 4, 128, 128, device=dev)
        rp = pool.clone()
        slots = torch.tensor([1], dtype=torch.int32, device=dev)
        o, _ = run_prefill(family, inp, pool=pool, slots=slots)
        ro, _ = reference(family, inp, pool=rp, slots=slots)
        c = {"family": family, "g": gscale, "o_rel": rel_error(o, ro), "state_rel": rel_error(pool[1], rp[1]),
             "finite": bool(torch.isfinite(o.float()).all() and torch.isfinite(pool).all())}
        c["ok"] = c["finite"] and c["o_rel"] < TOL_O and (c["state_rel"] < TOL_S or gscale is not None
                                                          and rp[1].abs().max() < 1e-30)
        out["cases"].append(c)
        out["ok"] &= c["ok"]
    return out


def run_all(names: Optional[list[str]] = None) -> dict:
    """Run the named checks (default: all); an exception is a failed check with its traceback."""
    res = {}
    for name, fn in CHECKS.items():
        if names and name not in names:
            continue
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            res[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        torch.cuda.synchronize()
    return res
