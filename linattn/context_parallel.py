"""Context-parallel prefill: one long prompt's chunked prefill over the ranks of a torch.distributed group.

Every rank holds a contiguous slice of the packed token stream (q, k, v, g, beta of global tokens
``token_offset .. token_offset + T_r - 1``), the same global ``cu_seqlens`` and its own copy of the
state pool. A sequence may span ranks; its pieces are computed where they lie, and only a few
``[HV, K, K + V]`` tensors per rank cross the wire (never the tokens).

The maths (docs/context-parallel.md; docs/ops.md "Chunked form"): in the maths layout ``S [K, V]``
one piece of a sequence maps its entering state affinely, ``S_out = M S_in + B``, with ``M [K, K]``
the piece's transition and ``B [K, V]`` the state it produces from a zero state. Every column of
``S`` evolves on its own with its column of ``v`` as input, so one ordinary prefill call on the
piece with values ``[v | 0]`` (``V + K`` columns) from the state ``[0 | I]`` ends in ``[B | M]``
(:func:`op_summary`). Ranks then exchange one entry each (all_gather), combine
``S_{j+1} = M_j S_j + B_j`` from the sequence's true initial state, and rerun the pieces that
needed an entering state. The rank holding a sequence's last token stores its final state.

Host-only planning (:func:`make_plan`) is separate from the execution, so the plan can be read and
tested without a process group. Nothing here creates a process group: the tests, the demo and the
benchmark start their ranks with :func:`linattn.testing.spawn.spawn_ranks` (``spawn_ranks`` here is
its deprecated alias, imported when read). ``import linattn`` does
not import this module (``linattn.context_parallel_prefill`` loads it on first use).

Example (a group of one rank is exactly the ordinary call)::

    >>> import torch, torch.distributed as dist, linattn
    >>> from linattn.context_parallel import context_parallel_prefill
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> T, H, K = 6, 1, 4
    >>> q, k, v = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, K)
    >>> g, beta = -torch.rand(T, H), torch.rand(T, H)
    >>> cu = torch.tensor([0, 6])
    >>> o, ht = context_parallel_prefill("gdn", q, k, v, g, beta, cu_seqlens=cu, token_offset=0)
    >>> bool(torch.equal(o, linattn.gdn_prefill(q, k, v, g, beta, cu)[0]))
    True
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import bisect
from typing import Callable, Literal, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from linattn.precision import pinned_fp32_matmul

FAMILIES = ("gdn", "kda")
PieceKind = Literal["whole", "first", "middle", "last"]

__all__ = ["ContextParallelPlan", "Piece", "RankPlan", "context_parallel_prefill", "make_plan", "op_summary",
           "summary_mode"]


# -- the plan (host only) -------------------------------------------------------------------------

class Piece(BaseModel):
    """The part of sequence ``seq`` one rank holds: global tokens ``start .. stop - 1``.

    ``kind``: ``whole`` (the sequence lies on this rank), ``first`` (it continues on a later rank),
    ``last`` (it started on an earlier rank), ``middle`` (both). ``padding``: the sequence's slot is
    negative (pool mode): zero output, nothing read, written or exchanged.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int
    start: int
    stop: int
    kind: PieceKind
    padding: bool = False

    @property
    def tokens(self) -> int:
        return self.stop - self.start


class RankPlan(BaseModel):
    """What one rank computes.

    ``entering``: the piece that needs an entering state from earlier ranks (kind ``middle`` or
    ``last``, never padding; at most one, the rank's first piece). ``leaving``: the piece whose
    sequence continues after this rank (kind ``first`` or ``middle``; the rank's last piece); it
    gives this rank's exchange entry: ``absolute`` (a ``first`` piece: its exit state, computed
    from the true initial state) or ``affine`` (a ``middle`` piece: its ``(M, B)``). ``known``:
    the pieces run in one ordinary call before the exchange (whole sequences and padding pieces),
    in token order; ``empty``: the zero-length sequences this rank answers for (all on rank 0).
    ``chain``: the ranks whose entries, combined in order, give the entering state.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    offset: int
    tokens: int
    pieces: tuple[Piece, ...]
    entering: Optional[Piece] = None
    leaving: Optional[Piece] = None
    known: tuple[Piece, ...] = ()
    empty: tuple[int, ...] = ()
    entry: Optional[Literal["absolute", "affine"]] = None
    chain: tuple[int, ...] = ()


class ContextParallelPlan(BaseModel):
    """Every rank's pieces for one context-parallel call (the same on every rank).

    Example:
        >>> p = make_plan([0, 10, 30], [(0, 15), (15, 15)])
        >>> [(x.seq, x.kind) for x in p.ranks[1].pieces], p.ranks[1].chain, p.exchange
        ([(1, 'last')], (0,), True)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cu_seqlens: tuple[int, ...]
    ranks: tuple[RankPlan, ...]

    @property
    def exchange(self) -> bool:
        """True when some non-padding sequence spans ranks (then every rank joins one all_gather)."""
        return any(r.entry is not None for r in self.ranks)

    def describe(self) -> str:
        """One line per rank: its slice, its pieces (``seq:kind``) and its exchange entry."""
        lines = []
        for r in self.ranks:
            pieces = " ".join(f"{p.seq}:{p.kind}{'(pad)' if p.padding else ''}" for p in r.pieces) or "-"
            lines.append(f"rank {r.rank}: tokens [{r.offset}, {r.offset + r.tokens}) pieces {pieces}; "
                         f"entry {r.entry or '-'}; entering state from ranks {list(r.chain) or '-'}")
        return "\n".join(lines)


def _check_cu(cu: Sequence[int]) -> None:
    if len(cu) < 1 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease (prefix sums of the sequence lengths); "
                         f"got {list(cu)[:16]}{' ...' if len(cu) > 16 else ''}")


def _check_slices(cu: Sequence[int], slices: Sequence[tuple[int, int]]) -> None:
    """Rank r's slice must start where rank r - 1's ends, from 0 to ``cu[-1]`` (the whole stream)."""
    expect = 0
    for r, (off, n) in enumerate(slices):
        if n < 0 or off != expect:
            shown = ", ".join(f"rank {i}: [{o}, {o + t})" for i, (o, t) in enumerate(slices))
            raise ValueError(f"the ranks' token slices must be contiguous and in rank order, starting at 0: rank {r} "
                             f"has token_offset={off} and {n} tokens, expected token_offset={expect}. Slices: "
                             f"{shown}. Give rank r the tokens [token_offset_r, token_offset_r + T_r) with "
                             f"token_offset_r = T_0 + ... + T_(r-1).")
        expect = off + n
    if expect != cu[-1]:
        raise ValueError(f"the ranks' slices cover {expect} tokens but cu_seqlens[-1] = {cu[-1]}: every token of the "
                         f"stream must be on exactly one rank")


def _pieces(cu: Sequence[int], start: int, stop: int, padding: Sequence[bool]) -> list[Piece]:
    out = []
    n = max(0, bisect.bisect_right(cu, start) - 1)
    while n < len(cu) - 1 and cu[n] < stop:
        lo, hi = max(cu[n], start), min(cu[n + 1], stop)
        if lo < hi:
            kind = {(True, True): "whole", (True, False): "first", (False, True): "last",
                    (False, False): "middle"}[(lo == cu[n], hi == cu[n + 1])]
            out.append(Piece(seq=n, start=lo, stop=hi, kind=kind, padding=bool(padding[n])))
        n += 1
    return out


def _rank_plan(rank: int, off: int, n: int, pieces: list[Piece], ranks_of: dict, empty: tuple) -> RankPlan:
    entering = pieces[0] if pieces and pieces[0].kind in ("middle", "last") and not pieces[0].padding else None
    leaving = pieces[-1] if pieces and pieces[-1].kind in ("first", "middle") and not pieces[-1].padding else None
    known = tuple(p for p in pieces if p is not entering and p is not leaving)
    entry = None if leaving is None else ("absolute" if leaving.kind == "first" else "affine")
    chain = tuple(j for j in ranks_of[entering.seq] if j < rank) if entering is not None else ()
    return RankPlan(rank=rank, offset=off, tokens=n, pieces=tuple(pieces), entering=entering, leaving=leaving,
                    known=known, empty=empty, entry=entry, chain=chain)


def make_plan(cu_seqlens: Sequence[int], slices: Sequence[tuple[int, int]],
              padding: Optional[Sequence[bool]] = None) -> ContextParallelPlan:
    """The pieces of every rank, from the global ``cu_seqlens`` and the ranks' slices (host only).

    Args:
        cu_seqlens: ``N + 1`` Python ints, prefix sums of the sequence lengths.
        slices: ``(token_offset, T_r)`` of every rank, in rank order.
        padding: ``N`` flags, True where a sequence is padding (pool mode, negative slot); None: none.
    Returns:
        ContextParallelPlan. Zero-length sequences belong to rank 0 (they have no token to place them).
    Raises:
        ValueError: ``cu_seqlens`` does not start at 0 or decreases; the slices are not contiguous in
            rank order from 0, or do not cover exactly ``cu_seqlens[-1]`` tokens.
    Example:
        >>> p = make_plan([0, 4, 4, 20], [(0, 8), (8, 0), (8, 12)])
        >>> [(x.seq, x.kind) for x in p.ranks[0].pieces], p.ranks[0].empty, p.ranks[2].chain
        ([(0, 'whole'), (2, 'first')], (1,), (0,))
    """
    cu = [int(c) for c in cu_seqlens]
    _check_cu(cu)
    slices = [(int(o), int(t)) for o, t in slices]
    _check_slices(cu, slices)
    N = len(cu) - 1
    pad = [False] * N if padding is None else [bool(x) for x in padding]
    if len(pad) != N:
        raise ValueError(f"padding has {len(pad)} flags for {N} sequences")
    pieces = [_pieces(cu, off, off + n, pad) for off, n in slices]
    ranks_of: dict[int, list[int]] = {}
    for r, ps in enumerate(pieces):
        for p in ps:
            ranks_of.setdefault(p.seq, []).append(r)
    empty = tuple(n for n in range(N) if cu[n] == cu[n + 1])
    return ContextParallelPlan(cu_seqlens=tuple(cu), ranks=tuple(
        _rank_plan(r, off, n, pieces[r], ranks_of, empty if r == 0 else ()) for r, (off, n) in enumerate(slices)))


# -- the piece summary (M, B) through the ordinary op ----------------------------------------------

def _prefill_op(family: str) -> str:
    """The family's prefill op name, from the op table."""
    from linattn.dispatch.rules.ops_table import find_op

    op = find_op(family, "prefill")
    if op is None:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {family!r}")
    return op


def _prefill_fn(family: str):
    """The family's public prefill op (``linattn.gdn_prefill`` / ``linattn.kda_prefill``)."""
    import linattn

    return getattr(linattn, _prefill_op(family))


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def summary_mode(family: str, q: Tensor, v: Tensor, *, compute_dtype: torch.dtype = torch.float32,
                 backend: Optional[str] = None) -> tuple[str, str]:
    """How :func:`op_summary` runs a piece: ``("wide", reason)`` or ``("split", reason)``.

    ``wide``: one dense call with ``V + K`` value columns, taken when the dispatcher gives that call
    the backend it gives the piece's ordinary call (width ``V``). Otherwise ``split``: one call for
    ``B`` and ``ceil(K / V)`` calls of ``V`` columns for ``M`` (e.g. the Triton prefill's head dims
    are 64, 128, 256: ``K = V = 256`` makes 512 columns, which would fall back to torch-ref).
    """
    from linattn.dispatch import Problem, explain

    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]

    def chosen(width: int) -> Optional[str]:
        p = Problem(op=_prefill_op(family), n=1, t=T, h=H, hv=HV, k=K, v=width, dtype=_dtype_name(q.dtype),
                    state_dtype=_dtype_name(compute_dtype), mode="dense", max_seqlen=T)
        return explain(p, q.device, backend=backend).chosen

    narrow, wide = chosen(V), chosen(V + K)
    if wide is not None and wide == narrow:
        return "wide", f"{wide} takes V + K = {V + K} value columns"
    return "split", (f"V + K = {V + K} value columns go to {wide or 'no backend'}, V = {V} to {narrow}: "
                     f"{1 + -(-K // V)} calls of {V} columns")


def _to_maths(tile: Tensor, layout: str) -> Tensor:
    """Op-layout state ``[.., V, K]`` (``"vk"``) or ``[.., K, V]`` (``"kv"``) as the maths' ``S [.., K, V]``."""
    return tile.transpose(-1, -2) if layout == "vk" else tile


def _from_maths(S: Tensor, layout: str) -> Tensor:
    return S.transpose(-1, -2) if layout == "vk" else S


def _final_of(fn, q, k, v, g, beta, S0: Tensor, kw: dict) -> Tensor:
    """The maths-layout final state ``[HV, K, width]`` of one dense call on one sequence from ``S0``."""
    cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    _, fin = fn(q, k, v, g, beta, cu, initial_state=_from_maths(S0, "vk")[None], state_layout="vk", **kw)
    return _to_maths(fin[0], "vk")


def op_summary(family: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
               scale: Optional[float] = None, use_qk_l2norm: bool = True, backend: Optional[str] = None,
               compute_dtype: torch.dtype = torch.float32, mode: str = "auto") -> Tensor:
    """``[M | B]`` of one piece of one sequence, from the ordinary prefill op (backend-agnostic).

    ``S_out = M S_in + B`` in the maths layout (``S [K, V]``): ``M [HV, K, K]`` is the piece's
    transition, ``B [HV, K, V]`` its final state from a zero state. The op is run in dense mode on
    values ``[v | 0]`` from the initial state ``[0 | I]`` (column ``V + j`` of the state starts as
    the unit vector ``e_j`` with zero values, so it ends as column ``j`` of ``M``); docs/ops.md
    "Recurrence": each column of ``S`` is updated by its own column of ``v`` only.

    Args:
        family: ``"gdn"`` or ``"kda"``. q, k: ``[T, H, K]``; v: ``[T, HV, V]``; g: ``[T, HV]`` (KDA
            ``[T, HV, K]``) fp32 log decay; beta ``[T, HV]``: the piece's tokens, one sequence.
        scale, use_qk_l2norm, backend: as in :func:`linattn.gdn_prefill`.
        compute_dtype: float32, or float64 (the reference's oracle mode: then q, k, v are float64).
        mode: ``"wide"`` (one call of ``V + K`` columns), ``"split"`` (``1 + ceil(K / V)`` calls of
            ``V`` columns) or ``"auto"`` (:func:`summary_mode`).
    Returns:
        ``[HV, K, K + V]`` in ``compute_dtype``: columns ``:K`` are ``M``, ``K:`` are ``B``.
    Raises:
        ValueError: an unknown family or mode; the op's errors for bad inputs.
    Example:
        >>> T, K = 5, 4
        >>> x = lambda *s: torch.randn(*s, dtype=torch.float64)
        >>> MB = op_summary("gdn", x(T, 1, K), x(T, 1, K), x(T, 1, 3), -torch.rand(T, 1), torch.rand(T, 1),
        ...                 compute_dtype=torch.float64)
        >>> tuple(MB.shape)
        (1, 4, 7)
    """
    fn = _prefill_fn(family)
    T, HV, V = v.shape
    K = q.shape[-1]
    if mode == "auto":
        mode = summary_mode(family, q, v, compute_dtype=compute_dtype, backend=backend)[0]
    kw = dict(scale=scale, use_qk_l2norm=use_qk_l2norm, backend=backend, validate=False)
    eye = torch.eye(K, dtype=compute_dtype, device=q.device).expand(HV, K, K)
    if mode == "wide":
        S0 = torch.cat([torch.zeros(HV, K, V, dtype=compute_dtype, device=q.device), eye], -1)
        S = _final_of(fn, q, k, torch.cat([v, v.new_zeros(T, HV, K)], -1), g, beta, S0, kw)
        return torch.cat([S[..., V:], S[..., :V]], -1)
    if mode != "split":
        raise ValueError(f"mode must be 'auto', 'wide' or 'split'; got {mode!r}")
    zeros = torch.zeros(HV, K, V, dtype=compute_dtype, device=q.device)
    cols = [_final_of(fn, q, k, v, g, beta, zeros, kw)]  # B
    for j in range(0, K, V):
        w = min(V, K - j)
        S0 = zeros.clone()
        S0[:, j:j + w, :w] = eye[:, :w, :w]
        cols.insert(-1, _final_of(fn, q, k, torch.zeros_like(v), g, beta, S0, kw)[..., :w])
    return torch.cat(cols, -1)


#: The summary's signature: ``summary(family, q, k, v, g, beta, *, scale, use_qk_l2norm, backend,
#: compute_dtype) -> [HV, K, K + V]`` (``[M | B]``, maths layout). :func:`op_summary` is the default;
#: a faster one (a state-only kernel) can be passed as ``context_parallel_prefill(summary=...)``.
Summary = Callable[..., Tensor]


# -- validation and agreement across ranks ---------------------------------------------------------

def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("context_parallel_prefill needs torch.distributed initialised: call "
                         "torch.distributed.init_process_group(...) in every rank first (gloo on the CPU, nccl on "
                         "GPUs), or use linattn.testing.spawn.spawn_ranks in tests")
    return dist.get_world_size(group), dist.get_rank(group)


def _host_cu(cu_seqlens: Tensor, cu_seqlens_cpu, check: bool) -> list[int]:
    """The global ``cu_seqlens`` as Python ints: ``cu_seqlens_cpu`` when given (checked against the
    tensor when ``check``), else one ``.tolist()`` (a host-device sync on a GPU)."""
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dim() != 1:
        raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor [N + 1]; got {type(cu_seqlens).__name__} "
                        f"{tuple(getattr(cu_seqlens, 'shape', ()))}")
    if cu_seqlens_cpu is None:
        return [int(c) for c in cu_seqlens.tolist()]
    cu = [int(c) for c in (cu_seqlens_cpu.tolist() if isinstance(cu_seqlens_cpu, Tensor) else cu_seqlens_cpu)]
    if check and cu != [int(c) for c in cu_seqlens.tolist()]:
        raise ValueError("cu_seqlens_cpu differs from cu_seqlens: pass the same prefix sums (or leave cu_seqlens_cpu "
                         "None)")
    return cu


def _local_cu(cu: list[int], offset: int, T: int) -> list[int]:
    """Prefix sums of every sequence's length inside the slice ``[offset, offset + T)`` (0 outside it)."""
    if offset < 0 or offset + T > cu[-1]:
        raise ValueError(f"token_offset={offset} with {T} local tokens reaches past the stream's {cu[-1]} tokens "
                         f"(cu_seqlens[-1]): token_offset must be in 0 .. cu_seqlens[-1] - T")
    out = [0]
    for a, b in zip(cu, cu[1:]):
        out.append(out[-1] + max(0, min(b, offset + T) - max(a, offset)))
    return out


def _check_local(family: str, x: tuple, cu: list[int], offset, args: dict, validate: bool,
                 check_finite: bool) -> tuple[dict, object]:
    """The ordinary op's validation of this rank's call, as if its pieces were whole sequences; returns
    the normalised arguments and the dispatcher's decision for it (NoBackendError when none fits)."""
    from linattn.dispatch import select
    from linattn.dispatch.rules.validate import validate as validate_call

    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"token_offset must be a Python int (the global index of this rank's first token); got "
                        f"{type(offset).__name__}")
    q, k, v, g, beta = x
    T = q.shape[0] if isinstance(q, Tensor) and q.dim() == 3 else 0
    cu_t = torch.tensor(_local_cu(cu, offset, T), dtype=torch.int64, device=getattr(q, "device", None))
    op = _prefill_op(family)
    op_args = {key: val for key, val in args.items() if key != "backend"}
    try:
        out, sig = validate_call(op, dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_t, **op_args),
                                 check_values=validate, check_finite=check_finite)
    except ValueError as e:
        quoted = _global_positions(e, offset)
        if quoted is e:
            raise
        raise quoted from e
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (*x, args["initial_state"])):
        raise ValueError(f"{op} (context parallel): grad mode is on and an input requires grad; linattn's ops are "
                         f"inference ops: call under torch.no_grad() or pass detached tensors")
    _, decision = select(op, sig, q.device, args.get("backend"))
    return out, decision


def _global_positions(err: ValueError, offset: int) -> ValueError:
    """``err`` with every token position of this rank's inputs (``g[7, 1]``) given as the global token index
    (``g[offset + 7, 1]``, the index in the whole sequence the ranks split), as the caller numbers them."""
    from linattn.dispatch.rules.value_rules import TOKEN_POSITION, requote_token_positions

    msg = str(err)
    if not offset or not TOKEN_POSITION.search(msg):
        return err
    msg = f"{requote_token_positions(msg, lambda t: str(t + offset))} (token positions global: this rank's first " \
          f"token is {offset})"
    try:
        return type(err)(msg)  # the same class (a ValueError subclass such as ConfigError)
    except TypeError:  # a subclass with another constructor
        return ValueError(msg)


def _meta(family, x, cu_seqlens, cu_seqlens_cpu, offset, args, validate, check_finite) -> tuple[dict, Optional[dict]]:
    """This rank's contribution to the agreement all_gather, and (when valid) its normalised arguments.

    Nothing here raises: every rank-local refusal (a bad family, shape, dtype, value; no backend;
    grad mode) becomes the entry's ``error`` (F38), so that the rank still joins the all_gather and
    every rank raises it together in :func:`_agree`.
    """
    meta = dict(offset=offset, tokens=-1, error=None)
    try:
        meta["tokens"] = x[0].shape[0] if isinstance(x[0], Tensor) and x[0].dim() == 3 else -1
        cu = _host_cu(cu_seqlens, cu_seqlens_cpu, validate)
        _check_cu(cu)
        out, decision = _check_local(family, x, cu, offset, args, validate, check_finite)
        agreed = _agreed(family, x, args, out, cu, validate, check_finite)
    except (ValueError, TypeError) as e:
        meta["error"] = (type(e).__name__, str(e))
        return meta, None
    except Exception as e:  # NoBackendError, GradModeError: refused on this rank, so on every rank
        meta["error"] = ("RuntimeError", f"{type(e).__name__}: {e}")
        return meta, None
    meta.update(cu=cu, slots=agreed["state_indices"],
                fresh=None if agreed["has_initial_state"] is None else [not h for h in agreed["has_initial_state"]],
                agreed=agreed, backend=decision.chosen)
    return meta, out


def _dtype_of(t) -> Optional[str]:
    return _dtype_name(t.dtype) if isinstance(t, Tensor) else None


def _agreed(family: str, x: tuple, args: dict, out: dict, cu: list[int], validate: bool, check_finite: bool) -> dict:
    """Every argument the ranks must pass alike (F37), by the name the disagreement message uses.

    The values are the validated ones (``scale=None`` and ``K ** -0.5`` agree); ``scale`` is compared
    as its ``repr`` (two NaNs are alike, a NaN and a number are not).
    """
    q, k, v, g, beta = x
    pool, init, idx, his = args["state_pool"], args["initial_state"], args["state_indices"], args["has_initial_state"]
    scale = out.get("scale", args.get("scale"))
    return {
        "family": family,
        "cu_seqlens": cu,
        "mode (state_pool given: pool mode; else dense)": "pool" if pool is not None else "dense",
        "state_indices": None if idx is None else [int(s) for s in idx.tolist()],
        "has_initial_state": None if his is None else [bool(h) for h in his.tolist()],
        "initial_state given (dense mode)": init is not None,
        "state dtype (state_pool or initial_state)": _dtype_of(pool if pool is not None else init),
        "state_layout": out.get("state_layout", args["state_layout"]),
        "head shapes (H, K of q and k; HV, V of v)": (*q.shape[1:], *v.shape[1:]),
        "g shape per token": tuple(g.shape[1:]),
        "q/k/v dtypes": (_dtype_of(q), _dtype_of(k), _dtype_of(v)),
        "g/beta dtypes": (_dtype_of(g), _dtype_of(beta)),
        "scale": None if scale is None else repr(float(scale)),
        "use_qk_l2norm": bool(out.get("use_qk_l2norm", args.get("use_qk_l2norm", True))),
        "validate and check_finite": (bool(validate), bool(check_finite)),
    }


def _compute_dtype(q: Tensor, args: dict) -> torch.dtype:
    """float64 when q or a state is float64 (the reference's oracle mode), else float32."""
    states = (q, args.get("state_pool"), args.get("initial_state"))
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in states) else torch.float32


_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _agree(metas: list[dict], rank: int) -> None:
    """Raise on every rank when any rank refused its call or the ranks disagree on an agreed argument.

    A refusal is raised everywhere as the failing rank's error class (ValueError, TypeError;
    RuntimeError for the others), naming that rank and quoting its message; a disagreement is a
    ValueError naming every argument that differs, with rank 0's value and the first differing rank's.
    """
    bad = [(r, m["error"]) for r, m in enumerate(metas) if m["error"] is not None]
    if bad:
        mine = dict(bad).get(rank)
        first, (cls, msg) = (rank, mine) if mine is not None else bad[0]
        where = f"rank {first}" + (" (this rank)" if first == rank else "")
        others = f" (also refused on ranks {[r for r, _ in bad if r != first]})" if len(bad) > 1 else ""
        raise _ERRORS.get(cls, RuntimeError)(f"context_parallel_prefill refused on {where}{others}: {msg}")
    differ = []
    for name, mine in metas[0]["agreed"].items():
        values = [m["agreed"][name] for m in metas]
        odd = [r for r, val in enumerate(values) if val != mine]
        if odd:
            differ.append(f"{name} (rank 0: {str(mine)[:80]}; rank {odd[0]}: {str(values[odd[0]])[:80]})")
    if differ:
        raise ValueError(f"context_parallel_prefill: the ranks disagree on {'; '.join(differ)}. Every rank must pass "
                         f"the same global arguments (only its slice of q, k, v, g, beta and token_offset differ); "
                         f"fix the rank that differs")


# -- execution ---------------------------------------------------------------------------------------

class _Call:
    """One rank's call: its tensors, the global host lists and the keywords of every internal op call."""

    def __init__(self, family, x, args, out, meta, plan, rank, summary):
        self.fn, self.family, self.x, self.plan = _prefill_fn(family), family, x, plan
        self.rp: RankPlan = plan.ranks[rank]
        self.pool, self.idx, self.init = args["state_pool"], args["state_indices"], args["initial_state"]
        self.his = args["has_initial_state"]
        self.slots, self.fresh = meta["slots"], meta["fresh"]
        self.layout = args["state_layout"]
        self.cdt = _compute_dtype(x[0], args)
        self.kw = dict(scale=out["scale"], use_qk_l2norm=out["use_qk_l2norm"], state_layout=self.layout,
                       backend=args["backend"], validate=False)
        self.summary = summary or op_summary
        q, v = x[0], x[2]
        self.H, self.HV, self.K, self.V = q.shape[1], v.shape[1], q.shape[2], v.shape[2]
        self.dev = q.device

    def take(self, p_start: int, p_stop: int) -> tuple:
        lo, hi = p_start - self.rp.offset, p_stop - self.rp.offset
        return tuple(t[lo:hi] for t in self.x)

    def state_shape(self) -> tuple:
        return (self.HV, self.V, self.K) if self.layout == "vk" else (self.HV, self.K, self.V)

    def h0(self, n: int) -> Tensor:
        """Sequence n's true initial state, ``[1, HV, ., .]`` in the op layout and the compute dtype."""
        if self.pool is not None:
            if self.fresh is not None and self.fresh[n]:  # has_initial_state False: the slot is not read
                return torch.zeros(1, *self.state_shape(), dtype=self.cdt, device=self.dev)
            return self.pool[self.slots[n]].to(self.cdt)[None]
        if self.init is None:
            return torch.zeros(1, *self.state_shape(), dtype=self.cdt, device=self.dev)
        return self.init[n:n + 1].to(self.cdt)

    def dense(self, p: Piece, h0: Tensor) -> tuple[Tensor, Tensor]:
        cu = torch.tensor([0, p.tokens], dtype=torch.int32, device=self.dev)
        return self.fn(*self.take(p.start, p.stop), cu, initial_state=h0, **self.kw)


def _run_known(c: _Call, final: Optional[Tensor]) -> Optional[Tensor]:
    """One ordinary call on the pieces that need nothing from other ranks (pool mode: on the pool)."""
    rp = c.rp
    seqs = [p.seq for p in rp.known] + list(rp.empty)
    if not seqs:
        return None
    lens = [p.tokens for p in rp.known] + [0] * len(rp.empty)
    start = rp.known[0].start if rp.known else rp.offset
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=c.dev)
    x = c.take(start, start + sum(lens))
    if c.pool is not None:
        idx = torch.tensor([c.slots[n] for n in seqs], dtype=c.idx.dtype, device=c.idx.device)
        his = None if c.his is None else c.his[torch.tensor(seqs, device=c.his.device)]
        return c.fn(*x, cu, state_pool=c.pool, state_indices=idx, has_initial_state=his, **c.kw)
    init = None if c.init is None else c.init[torch.tensor(seqs, device=c.init.device)]
    o, fin = c.fn(*x, cu, initial_state=init, **c.kw)
    final[torch.tensor(seqs, device=final.device)] = fin.to(final.dtype)
    return o


def _leaving_entry(c: _Call) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """(output of a ``first`` piece, this rank's exchange entry ``[HV, K, K + V]``) or Nones."""
    p = c.rp.leaving
    if c.rp.entry == "absolute":
        o, fin = c.dense(p, c.h0(p.seq))
        S = _to_maths(fin[0], c.layout).to(c.cdt)
        return o, torch.cat([torch.zeros(c.HV, c.K, c.K, dtype=c.cdt, device=c.dev), S], -1)
    if c.rp.entry == "affine":
        MB = c.summary(c.family, *c.take(p.start, p.stop), scale=c.kw["scale"], use_qk_l2norm=c.kw["use_qk_l2norm"],
                       backend=c.kw["backend"], compute_dtype=c.cdt)
        return None, MB.to(c.cdt)
    return None, None


class _Wire(NamedTuple):
    """What the exchange sends, the same on every rank (from agreed facts): whether there is one, the
    head sizes of an entry ``[HV, K, K + V]``, its dtype (the compute dtype) and this rank's device."""

    exchange: bool
    HV: int
    K: int
    V: int
    cdt: torch.dtype
    dev: torch.device


def _wire_of(x: tuple, args: dict, plan: ContextParallelPlan) -> _Wire:
    """The exchange's :class:`_Wire` from the call's tensors (host only: shapes and dtypes)."""
    q, v = x[0], x[2]
    return _Wire(plan.exchange, v.shape[1], q.shape[2], v.shape[2], _compute_dtype(q, args), q.device)


def _exchange(c: _Wire, entry: Optional[Tensor], group, world: int, failed: bool = False) -> Optional[list[Tensor]]:
    """Every rank's entry (one all_gather of ``[HV, K, K + V]`` per rank), when any sequence spans ranks.

    Each rank's entry travels with one status element (1: this rank failed before the exchange), read
    to the host once (one device-to-host sync per call); when some rank failed, every other rank
    raises RuntimeError naming it, so no rank is left waiting for a later collective.
    """
    if not c.exchange:
        return None
    mine = entry.contiguous() if entry is not None else torch.zeros(c.HV, c.K, c.K + c.V, dtype=c.cdt, device=c.dev)
    flat = torch.cat([mine.reshape(-1), mine.new_full((1,), float(failed))])
    out = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(out, flat, group=group)
    status = torch.stack([t[-1] for t in out]).tolist()
    failing = [r for r, flag in enumerate(status) if flag != 0]
    if failing and not failed:
        raise RuntimeError(f"context_parallel_prefill failed on rank(s) {failing} after the agreement (their own error "
                           f"is raised there); this rank stops too. Pool rows of sequences whole on a rank may "
                           f"already be written; rerun the call on every rank once the failing rank is fixed")
    return [t[:-1].view_as(mine) for t in out]


@pinned_fp32_matmul
def _combine(entries: list[Tensor], chain: tuple[int, ...], K: int) -> Tensor:
    """``S_{j+1} = M_j S_j + B_j`` over the chain (its first entry is absolute: an exit state); ``[HV, K, V]``.
    IEEE fp32 whatever the caller's matmul precision flags (linattn/precision.py)."""
    S = entries[chain[0]][..., K:]
    for j in chain[1:]:
        S = torch.baddbmm(entries[j][..., K:], entries[j][..., :K], S)
    return S


def _run_entering(c: _Call, entries: Optional[list[Tensor]], final: Optional[Tensor]) -> Optional[Tensor]:
    """The piece that waited for its entering state; a ``last`` piece stores the sequence's final state."""
    p = c.rp.entering
    if p is None:
        return None
    S = _combine(entries, c.rp.chain, c.K)
    o, fin = c.dense(p, _from_maths(S, c.layout)[None])
    if p.kind == "last":
        target = c.pool[c.slots[p.seq]] if c.pool is not None else final[p.seq]
        target.copy_(fin[0])  # cast once, to the storage dtype
    return o


def _dense_final(c: _Call, q: Tensor) -> Tensor:
    """Dense mode's ``final_state [N, HV, ., .]``: NaN in the rows of sequences finished on other ranks."""
    N = len(c.plan.cu_seqlens) - 1
    dtype = c.init.dtype if c.init is not None else (torch.float64 if q.dtype == torch.float64 else torch.float32)
    return torch.full((N, *c.state_shape()), float("nan"), dtype=dtype, device=c.dev)


def _execute(family: str, x: tuple, args: dict, out: dict, meta: dict, plan: ContextParallelPlan, rank: int,
             summary: Optional[Summary], group, world: int):
    """This rank's share after the agreement. Everything before the exchange (the call's setup, the
    dense ``final_state``, the known pieces, the leaving entry) runs inside one ``try``: a failure
    there (out of memory included) is reported through the exchange, so no peer waits in it."""
    wire = _wire_of(x, args, plan)
    try:
        c = _Call(family, x, args, out, meta, plan, rank, summary)
        final = _dense_final(c, c.x[0]) if c.pool is None else None
        o_known = _run_known(c, final)
        o_first, entry = _leaving_entry(c)
    except Exception as e:
        if wire.exchange:  # tell the others through the exchange, then raise this rank's own error
            _exchange(wire, None, group, world, failed=True)
            e.add_note("context_parallel_prefill: the other ranks were told through the exchange and raise too")
        raise
    o_enter = _run_entering(c, _exchange(wire, entry, group, world), final)
    parts = [o for o in (o_enter, o_known, o_first) if o is not None]
    if not parts:
        parts = [c.x[0].new_zeros((0, c.HV, c.V))]
    o = parts[0] if len(parts) == 1 else torch.cat(parts)
    return o if c.pool is not None else (o, final)


def context_parallel_prefill(family: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
                             cu_seqlens: Tensor, token_offset: int, group=None, state_pool: Optional[Tensor] = None,
                             state_indices: Optional[Tensor] = None, initial_state: Optional[Tensor] = None,
                             has_initial_state: Optional[Tensor] = None, scale: Optional[float] = None,
                             use_qk_l2norm: bool = True, state_layout: str = "vk", backend: Optional[str] = None,
                             validate: bool = True, check_finite: bool = False,
                             cu_seqlens_cpu: Optional[Sequence[int]] = None, summary: Optional[Summary] = None):
    """GDN / KDA chunked prefill of a token stream split over the ranks of ``group`` (docs/context-parallel.md).

    Call it on every rank of ``group`` with that rank's contiguous slice of the packed stream.

    Args:
        family: ``"gdn"`` or ``"kda"``.
        q, k: ``[T_r, H, K]``; v: ``[T_r, HV, V]``; g: ``[T_r, HV]`` (KDA ``[T_r, HV, K]``) fp32 log
            decay; beta: ``[T_r, HV]`` fp32: global tokens ``token_offset .. token_offset + T_r - 1``
            (``T_r = 0`` is allowed). Dtypes as :func:`linattn.gdn_prefill`.
        cu_seqlens: the global ``[N + 1]`` int32/int64 prefix sums, the same on every rank.
        token_offset: Python int, global index of this rank's first token. Rank ``r`` must start where
            rank ``r - 1`` ends (``token_offset_0 = 0``; the slices cover ``cu_seqlens[-1]`` tokens).
        group: a ``torch.distributed`` ProcessGroup (None: the default group); ranks are group ranks.
            gloo (CPU tensors) or nccl (CUDA tensors; set the rank's CUDA device first).
        state_pool, state_indices, has_initial_state: pool mode, as :func:`linattn.gdn_prefill`, with
            the global ``[N]`` tables on every rank and each rank's own pool ``[P, HV, V, K]``: the
            rank holding a sequence's first token reads its slot (unless ``has_initial_state`` is
            False); the rank holding its last token writes its final state; every other rank leaves
            that slot's bits alone. Negative index: padding (zero output on every rank, no slot
            touched). Zero-length sequences are rank 0's (its pool is written as by the plain op).
        initial_state: dense mode: the global ``[N, HV, V, K]`` (``"kv"``: ``[N, HV, K, V]``) or None.
        scale, use_qk_l2norm, state_layout, backend, validate, check_finite: as :func:`linattn.gdn_prefill`;
            ``backend`` is used for every internal call.
        cu_seqlens_cpu: the same prefix sums as Python ints (or a CPU tensor), to spare the one
            ``cu_seqlens.tolist()`` (a host sync on GPUs); checked against ``cu_seqlens`` when ``validate``.
            ``state_indices`` and ``has_initial_state`` are read to the host once either way.
        summary: the function giving a piece's ``[M | B]`` (default :func:`op_summary`).
    Returns:
        pool mode: ``o [T_r, HV, V]`` in q's dtype. Dense mode: ``(o, final_state [N, HV, ., .])``,
        ``final_state`` in initial_state's dtype (fp32 without one) with the final states of the
        sequences whose last token is on this rank and NaN in the other rows. With one rank in the
        group: exactly the ordinary call's result (the same call).
    Raises:
        ValueError / TypeError: on every rank together, before any pool write, when any rank's call
            is invalid for the ordinary op (an unknown family included: the message names the failing
            rank and quotes its error), the slices are not contiguous or do not cover the stream, or
            the ranks disagree on an agreed argument: family, cu_seqlens, mode, state_indices,
            has_initial_state, whether initial_state is given, the state dtype, state_layout, the
            head shapes, the g shape, the q/k/v and g/beta dtypes, scale (as validated),
            use_qk_l2norm, validate and check_finite (the message names each argument and the
            ranks' values). RuntimeError: a rank found no backend (or grad mode refused it). A rank
            that fails after the agreement but before the exchange of entries (a kernel error, out
            of memory, a ``summary`` that raises) tells the others through the exchange: it re-raises
            its error and every other rank raises RuntimeError naming it (pool rows of whole
            sequences may already be written). A failure after the exchange raises on that rank only
            (no collective follows, so no rank waits).
    Sources: docs/ops.md ("Recurrence", "Chunked form") for the affine map of a piece; FLA's
    ``cp_context`` and FlashInfer's context-parallel delta rule for the same decomposition.
    Example:
        ``torch.distributed`` must be initialised; see the module docstring (one rank) and
        ``tests/distributed/cp_cases.py`` (2 and 3 spawned gloo ranks).
    """
    world, rank = _world(group)
    args = dict(state_pool=state_pool, state_indices=state_indices, initial_state=initial_state,
                has_initial_state=has_initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
                state_layout=state_layout, backend=backend)
    if world == 1:
        if token_offset != 0:
            raise ValueError(f"token_offset={token_offset} in a group of one rank: the one rank holds the whole "
                             f"stream, token_offset must be 0")
        return _prefill_fn(family)(q, k, v, g, beta, cu_seqlens, validate=validate, check_finite=check_finite, **args)
    x = (q, k, v, g, beta)
    # every rank-local check happens inside _meta and travels in the agreement (F38): no rank raises before it
    meta, out = _meta(family, x, cu_seqlens, cu_seqlens_cpu, token_offset, args, validate, check_finite)
    metas: list = [None] * world
    dist.all_gather_object(metas, meta, group=group)
    _agree(metas, rank)
    slots = meta["slots"]
    plan = make_plan(meta["cu"], [(m["offset"], m["tokens"]) for m in metas],
                     None if slots is None else [s < 0 for s in slots])
    return _execute(family, x, args, out, meta, plan, rank, summary, group, world)



def __getattr__(name: str):
    """``spawn_ranks`` lived here before it moved to :mod:`linattn.testing.spawn` (a test helper: the
    library spawns no processes). The old name still works, as a deprecated alias: reading it (``from
    linattn.context_parallel import spawn_ranks`` in a field reproducer) imports the helper then,
    not before, and warns with a ``DeprecationWarning`` that names the new path."""
    if name == "spawn_ranks":
        import warnings

        from linattn.testing.spawn import spawn_ranks

        warnings.warn("linattn.context_parallel.spawn_ranks moved to linattn.testing.spawn.spawn_ranks (a test "
                      "helper); import it from there, the old name will go", DeprecationWarning, stacklevel=2)
        return spawn_ranks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
