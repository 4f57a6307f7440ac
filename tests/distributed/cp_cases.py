"""Cases of the context-parallel tests, run inside spawned gloo ranks (``spawn_ranks``).

Every rank builds the same global inputs from a seed, calls ``context_parallel_prefill`` on its
slice, and checks its own part against the single-process call (computed on every rank, on a copy
of the pool) and against the float64 reference: outputs, the final states this rank must write (or
return), and the bits of every pool row it must not touch. A case returns a list of failure
messages (empty: passed), so the parent test reports them by case and rank.

The owners of sequences are computed here from ``cu_seqlens`` and the slices directly, not from
the library's plan, so a wrong plan fails these checks.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Optional

import torch

import linattn
from linattn.backends import torch_ref
from linattn.context_parallel import context_parallel_prefill, op_summary
from linattn.testing.compare import rel_error_exact_zero as _rel

F64 = torch.float64


@dataclass(frozen=True)
class Case:
    """One context-parallel call: global sequences ``lens``, the ranks' token counts ``slices``."""

    family: str
    lens: tuple
    slices: tuple
    mode: str = "pool"  # "pool" or "dense"
    layout: str = "vk"
    dtype: torch.dtype = torch.float32
    H: int = 1
    HV: int = 2
    K: int = 8
    V: int = 8
    slots: Optional[tuple] = None  # pool mode: state_indices (default 0 .. N-1 shuffled)
    fresh: Optional[tuple] = None  # pool mode: sequences with has_initial_state False (their slots hold NaN)
    dense_initial: bool = True
    backend: str = "torch-ref"
    summary_mode: str = "auto"
    seed: int = 0
    tol: tuple = field(default=(1e-5, 1e-5))  # (outputs, states), docs/ops.md

    @property
    def world(self) -> int:
        return len(self.slices)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def make_inputs(c: Case) -> dict:
    """Global inputs: q, k, v, g, beta, cu_seqlens, and the pool / indices / flags or the dense state."""
    gen = torch.Generator().manual_seed(c.seed)
    T, N = sum(c.lens), len(c.lens)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)
    gshape = (T, c.HV, c.K) if c.family == "kda" else (T, c.HV)
    d = dict(q=r(T, c.H, c.K).to(c.dtype), k=r(T, c.H, c.K).to(c.dtype), v=r(T, c.HV, c.V).to(c.dtype),
             g=torch.nn.functional.logsigmoid(r(*gshape) + 2.0).to(torch.float64 if c.dtype == F64 else torch.float32),
             beta=torch.sigmoid(r(T, c.HV)).to(torch.float64 if c.dtype == F64 else torch.float32),
             cu=torch.tensor([0, *torch.tensor(c.lens).cumsum(0).tolist()], dtype=torch.int32))
    tile = (c.HV, c.V, c.K) if c.layout == "vk" else (c.HV, c.K, c.V)
    sdt = F64 if c.dtype == F64 else torch.float32
    if c.mode == "pool":
        P = N + 3
        slots = c.slots if c.slots is not None else tuple(torch.randperm(P, generator=gen)[:N].tolist())
        d["pool"] = (r(P, *tile) * 0.3).to(sdt)
        d["idx"] = torch.tensor(slots, dtype=torch.int32)
        d["his"] = None
        if c.fresh is not None:
            d["his"] = torch.tensor([n not in c.fresh for n in range(N)])
            for n in c.fresh:
                if slots[n] >= 0:
                    d["pool"][slots[n]] = float("nan")  # never read: has_initial_state False
    else:
        d["init"] = (r(N, *tile) * 0.3).to(sdt) if c.dense_initial else None
    return d


def _reference(c: Case, d: dict, f64: bool):
    """The single-process call (f64=False: the op on the case's backend; True: the float64 oracle)."""
    fn = getattr(torch_ref, f"{c.family}_prefill_ref") if f64 else getattr(linattn, f"{c.family}_prefill")
    x = [d[n].to(F64) if f64 else d[n] for n in ("q", "k", "v", "g", "beta")]
    extra = dict(compute_dtype=F64) if f64 else dict(backend=c.backend)
    if c.mode == "pool":
        pool = d["pool"].clone().to(F64) if f64 else d["pool"].clone()
        out = fn(*x, d["cu"], state_pool=pool, state_indices=d["idx"], state_layout=c.layout,
                 has_initial_state=d["his"], **extra)
        return (out[0] if f64 else out), pool
    init = None if d["init"] is None else (d["init"].to(F64) if f64 else d["init"])
    return fn(*x, d["cu"], initial_state=init, state_layout=c.layout, **extra)


def _owned(c: Case, rank: int) -> list[int]:
    """Sequences whose last token is on ``rank`` (zero-length ones: rank 0), from the slices directly."""
    cu = [0, *torch.tensor(c.lens).cumsum(0).tolist()]
    lo = sum(c.slices[:rank])
    hi = lo + c.slices[rank]
    return [n for n in range(len(c.lens))
            if (c.lens[n] == 0 and rank == 0) or (c.lens[n] > 0 and lo <= cu[n + 1] - 1 < hi)]


def _call(c: Case, d: dict, rank: int, x_over: Optional[dict] = None, **over):
    lo = sum(c.slices[:rank])
    hi = lo + c.slices[rank]
    x = [(x_over or {}).get(n, d[n][lo:hi]) for n in ("q", "k", "v", "g", "beta")]
    kw = dict(cu_seqlens=d["cu"], token_offset=lo, state_layout=c.layout, backend=c.backend,
              summary=lambda *a, **k: op_summary(*a, **k, mode=c.summary_mode))
    if c.mode == "pool":
        kw.update(state_pool=d["pool"], state_indices=d["idx"], has_initial_state=d["his"])
    else:
        kw.update(initial_state=d["init"])
    kw.update(over)
    return context_parallel_prefill(c.family, *x, **kw), (lo, hi)


def check_case(c: Case, rank: int) -> list[str]:
    """Run ``c`` on this rank; the list of what disagrees (empty: passed)."""
    d = make_inputs(c)
    ref, ref64 = _reference(c, d, False), _reference(c, d, True)
    before = d["pool"].clone() if c.mode == "pool" else None
    res, (lo, hi) = _call(c, d, rank)
    o = res if c.mode == "pool" else res[0]
    errs = []
    tol_o, tol_s = c.tol
    for name, r in (("single-process call", ref), ("float64 reference", ref64)):
        e = _rel(o, r[0][lo:hi])
        if not e <= tol_o:
            errs.append(f"output vs the {name}: rel error {e:.2e} > {tol_o:.0e}")
    if tuple(o.shape) != (hi - lo, c.HV, c.V) or o.dtype != d["q"].dtype:
        errs.append(f"output shape/dtype {tuple(o.shape)} {o.dtype}")
    if c.mode == "pool":
        pad_tokens = [t for n in range(len(c.lens)) if int(d["idx"][n]) < 0
                      for t in range(int(d["cu"][n]), int(d["cu"][n + 1])) if lo <= t < hi]
        if pad_tokens and not bool((o[torch.tensor(pad_tokens) - lo] == 0).all()):
            errs.append("padding tokens' outputs are not zero")
        errs += _check_pool(c, d, rank, before, ref[1], ref64[1])
    else:
        errs += _check_dense(c, rank, res[1], ref[1], ref64[1])
    return errs


def _check_pool(c: Case, d: dict, rank: int, before, ref_pool, ref64_pool) -> list[str]:
    errs = []
    written = {int(d["idx"][n]) for n in _owned(c, rank) if int(d["idx"][n]) >= 0}
    for row in range(d["pool"].shape[0]):
        if row in written:
            for name, r in (("single-process call", ref_pool), ("float64 reference", ref64_pool)):
                e = _rel(d["pool"][row], r[row])
                if not e <= c.tol[1]:
                    errs.append(f"pool row {row} vs the {name}: rel error {e:.2e} > {c.tol[1]:.0e}")
        elif not torch.equal(_bits(d["pool"][row]), _bits(before[row])):
            errs.append(f"pool row {row} is not this rank's to write but its bits changed")
    return errs


def _check_dense(c: Case, rank: int, final, ref_final, ref64_final) -> list[str]:
    errs = []
    owned = _owned(c, rank)
    for n in range(len(c.lens)):
        if n in owned:
            for name, r in (("single-process call", ref_final), ("float64 reference", ref64_final)):
                e = _rel(final[n], r[n])
                if not e <= c.tol[1]:
                    errs.append(f"final state of sequence {n} vs the {name}: rel error {e:.2e} > {c.tol[1]:.0e}")
        elif not bool(final[n].isnan().all()):
            errs.append(f"final state row {n} (finished on another rank) is not NaN")
    return errs


# -- refusals: every rank raises, no pool changes ---------------------------------------------------

def check_refusal(c: Case, rank: int, bad_rank: int, what: str, expect: type, words: tuple) -> list[str]:
    """Rank ``bad_rank`` passes a wrong argument (``what``); every rank must raise ``expect`` naming ``words``."""
    d = make_inputs(c)
    before = d["pool"].clone()
    lo = sum(c.slices[:rank])
    over, x_over = {}, {}
    if rank == bad_rank:
        if what == "offset":
            over["token_offset"] = lo - 1  # overlaps rank 0's slice
        elif what == "shape":
            x_over["v"] = d["v"][lo:lo + c.slices[rank], :, :-1]
        elif what == "cu":
            over["cu_seqlens"] = torch.tensor([0, *torch.tensor(c.lens[::-1]).cumsum(0).tolist()], dtype=torch.int32)
    try:
        _call(c, d, rank, x_over, **over)
    except expect as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        errs = [f"the {expect.__name__} does not name {missing}: {msg}"] if missing else []
    except Exception as e:  # noqa: BLE001 - reported
        errs = [f"raised {type(e).__name__} instead of {expect.__name__}: {e}"]
    else:
        errs = [f"no error for a wrong {what} on rank {bad_rank}"]
    if not torch.equal(_bits(d["pool"]), _bits(before)):
        errs.append("a refused call changed the pool")
    return errs


# -- the float64 check of the pieces' (M, B) -----------------------------------------------------------

def check_summaries(c: Case, rank: int) -> list[str]:
    """This rank's piece's [M | B] from the summary against a token-serial float64 product, and the
    affine law final(S) = M S + B for a random S (one process, no collective)."""
    d = make_inputs(c)
    lo = sum(c.slices[:rank])
    hi = lo + c.slices[rank]
    x = [d[n][lo:hi].to(F64) for n in ("q", "k", "v", "g", "beta")]
    MB = op_summary(c.family, *x, compute_dtype=F64, mode=c.summary_mode)
    M, B = serial_transition(c.family, *x)
    errs = []
    for name, got, want in (("M", MB[..., :c.K], M), ("B", MB[..., c.K:], B)):
        e = _rel(got, want)
        if not e <= 1e-12:
            errs.append(f"{name} of rank {rank}'s piece: rel error {e:.2e} against the token-serial product")
    return errs


def serial_transition(family: str, q, k, v, g, beta):
    """``(M [HV, K, K], B [HV, K, V])`` of a piece by multiplying the per-token maps in float64:
    ``S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T`` (docs/ops.md "Recurrence")."""
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    kn = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    kn = kn.repeat_interleave(HV // H, dim=1)
    M = torch.eye(K, dtype=F64).expand(HV, K, K).clone()
    B = torch.zeros(HV, K, V, dtype=F64)
    for t in range(T):
        D = torch.diag_embed(torch.exp(g[t])) if family == "kda" else torch.exp(g[t])[:, None, None] * torch.eye(K, dtype=F64)
        kk = kn[t][:, :, None]
        A = torch.eye(K, dtype=F64) - beta[t][:, None, None] * kk @ kk.transpose(1, 2)
        M = A @ D @ M
        B = A @ D @ B + beta[t][:, None, None] * kk @ v[t][:, None, :]
    return M, B


# -- the cases of each world size ------------------------------------------------------------------------

def cases(world: int) -> dict:
    """name -> (check function, arguments), for a group of ``world`` ranks."""
    out = {}
    for fam in ("gdn", "kda"):
        if world == 2:
            out.update({
                # whole on rank 0, an empty sequence, one spanning both, whole on rank 1, padding on rank 1;
                # fresh sequences (NaN slots), among them the spanning one and the empty one
                f"{fam}_pool_mixed": (check_case, Case(fam, (5, 0, 23, 9, 6, 6), (20, 29), slots=(3, 0, 5, -1, 1, 7),
                                                       fresh=(1, 2, 4), seed=1)),
                f"{fam}_pool_padding_spans": (check_case, Case(fam, (10, 20, 10), (15, 25), slots=(2, -1, 0), seed=2)),
                f"{fam}_dense_kv_k_ne_v": (check_case, Case(fam, (7, 30, 4), (20, 21), mode="dense", layout="kv", K=8,
                                                            V=4, H=2, HV=4, seed=3)),
                f"{fam}_dense_no_initial_boundary_on_sequences": (check_case, Case(fam, (16, 16), (16, 16), mode="dense",
                                                                                   dense_initial=False, seed=4)),
                f"{fam}_bf16_pool": (check_case, Case(fam, (40, 24), (30, 34), dtype=torch.bfloat16, tol=(2e-2, 1e-2),
                                                      seed=5)),
            })
        else:
            out.update({
                f"{fam}_pool_spans_all_ranks": (check_case, Case(fam, (3, 41, 2, 12), (15, 14, 29), fresh=(1,), seed=7)),
                f"{fam}_pool_empty_rank_slice": (check_case, Case(fam, (6, 30, 5), (20, 0, 21), slots=(4, 1, -1), seed=8)),
                f"{fam}_dense_float64_exact": (check_case, Case(fam, (9, 40), (20, 15, 14), mode="dense", K=8, V=4,
                                                                dtype=F64, tol=(1e-12, 1e-12), seed=9)),
                f"{fam}_split_summary_k_ne_v": (check_case, Case(fam, (8, 50), (20, 20, 18), K=8, V=3,
                                                                 summary_mode="split", seed=6)),
                f"{fam}_summary_float64": (check_summaries, Case(fam, (60,), (20, 25, 15), K=8, V=4, seed=10)),
                f"{fam}_summary_split_float64": (check_summaries, Case(fam, (60,), (20, 25, 15), K=8, V=3,
                                                                       summary_mode="split", seed=11)),
            })
    if world == 2:
        base = Case("gdn", (12, 20), (14, 18), seed=12)
        out["refused_when_offsets_are_not_contiguous"] = (check_refusal, base, 1, "offset", ValueError,
                                                          ("contiguous", "token_offset"))
        out["refused_on_every_rank_for_one_rank_bad_shape"] = (check_refusal, base, 1, "shape", ValueError,
                                                                 ("refused on", "V"))
        out["refused_when_ranks_disagree_on_cu_seqlens"] = (check_refusal, Case("gdn", (12, 20), (16, 16), seed=13), 1,
                                                            "cu", ValueError, ("disagree", "cu_seqlens"))
    else:
        # the Triton kernels under the interpreter: a middle piece's wide summary (V + K = 128) and both reruns
        out["gdn_triton_interpreter_spans_all_ranks"] = (check_case, Case("gdn", (40, 90, 30), (70, 50, 40), K=64, V=64,
                                                                          backend="triton-split", seed=14))
    return out


def run_cases(rank: int, world: int, names: Optional[list] = None) -> dict:
    """Every case of this world size (or ``names``) on this rank: name -> failure messages."""
    torch.set_num_threads(1)
    out = {}
    for name, (check, *args) in cases(world).items():
        if names is not None and name not in names:
            continue
        try:
            out[name] = check(*args[:1], rank, *args[1:])
        except Exception:  # noqa: BLE001 - reported to the parent by name
            out[name] = [traceback.format_exc()]
    return out
