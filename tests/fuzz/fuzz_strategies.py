"""Problem generation: hypothesis strategies of small specs, and builders that turn a spec into the
op's arguments (views included) on a device.

A spec is a frozen dataclass of plain values (sizes, dtypes, flags, the view kind of each argument
and a seed for tensor values), so hypothesis prints a falsifying example as one readable line and
can shrink sizes and flags. The builder draws every tensor from ``torch.Generator(seed)`` on the
CPU, moves it to the device, then replaces the arguments named in ``spec.views`` by views with the
same values carved out of larger buffers:

- junk around a float view is NaN (a kernel that reads it by mistake produces NaN); junk around an
  index view holds *legal but wrong* values (unused slots, -1, in-range lengths), so a kernel that
  reads an index view as if contiguous writes a row it does not own or skips one it does, which
  the checks see, without reading or writing out of bounds;
- written buffers (``state_pool``, ``intermediate_states``) are views of a larger NaN-filled buffer;
  every element outside the rows the call owns must keep its bits.

View kinds (``kind[:dim]``): ``offset`` (storage offset), ``column`` (one column of a ``[..., 3]``
pack), ``every_other:d`` (stride 2 along dim d), ``narrow:d`` (a slice of a dim 3 larger),
``prefix:d`` (the first entries of a larger dim), ``wide_last`` (rows of a wider last dim),
``transposed`` (last two dims stored swapped), ``reversed`` (all dims stored reversed),
``slot_major`` (first two dims stored swapped), ``broadcast:d`` (stride 0 along dim d, read-only),
and the group kinds ``fused`` (q, k, v cut out of one fused projection; GDN a, b out of one
``[.., 2 HV]`` tensor; GDN prefill g, beta likewise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from hypothesis import strategies as st

from linattn.testing.gates import MODELS, model_gates

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
      "int32": torch.int32, "int64": torch.int64}
NAN = float("nan")

# -- views --------------------------------------------------------------------------------------


def _float_junk(dtype, device):
    return lambda shape: torch.full(tuple(shape), NAN, dtype=dtype, device=device)


def _index_junk(values: list, dtype, device, gen: torch.Generator):
    """Junk for an index view: entries drawn from ``values`` (legal but wrong)."""
    vals = torch.tensor(values if values else [-1], dtype=torch.int64)

    def junk(shape):
        n = math.prod(shape)
        pick = torch.randint(0, len(vals), (n,), generator=gen)
        return vals[pick].view(tuple(shape)).to(dtype=dtype, device=device)
    return junk


def make_view(x: torch.Tensor, kind: str, junk) -> torch.Tensor:
    """A tensor with the values of ``x`` (except ``broadcast``: the first entry along the dim,
    repeated) laid out as ``kind`` says, inside a fresh buffer filled by ``junk(shape)``."""
    if kind == "contig":
        return x
    name, _, arg = kind.partition(":")
    nd = x.dim()
    if name == "broadcast":
        d = int(arg or 0)
        if x.shape[d] == 0:
            return x
        return x.narrow(d, 0, 1).expand(x.shape)
    if name == "transposed":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if name == "reversed":
        perm = list(range(nd))[::-1]
        return x.permute(perm).contiguous().permute(perm)
    if name == "slot_major":
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    shape = list(x.shape)
    if name == "offset":
        buf = junk((x.numel() + 3,))
        y = buf[3:].view(x.shape)
    elif name == "column":
        buf = junk(shape + [3])
        y = buf[..., 1]
    elif name == "every_other":
        d = int(arg)
        shape[d] = 2 * shape[d] + 1
        buf = junk(shape)
        sl = [slice(None)] * nd
        sl[d] = slice(1, None, 2)
        y = buf[tuple(sl)]
    elif name in ("narrow", "prefix", "wide_last"):
        d = nd - 1 if name == "wide_last" else int(arg)
        shape[d] += 3
        buf = junk(shape)
        y = buf.narrow(d, 0 if name == "prefix" else 1, x.shape[d])
    else:
        raise ValueError(f"unknown view kind {kind!r}")
    assert tuple(y.shape) == tuple(x.shape), (kind, y.shape, x.shape)
    y.copy_(x)
    return y


def _fused(parts: list[torch.Tensor], junk) -> list[torch.Tensor]:
    """Views of ``parts`` (same leading dims) cut out of one fused buffer ``[*lead, sum(widths) + 2]``
    (e.g. q ‖ k ‖ v of a QKV projection), each part's trailing dims flattened into its columns."""
    lead = parts[0].shape[:-2] if parts[0].dim() >= 3 else parts[0].shape[:-1]
    nlead = len(lead)
    widths = [math.prod(p.shape[nlead:]) for p in parts]
    buf = junk(list(lead) + [sum(widths) + 2])
    out, col = [], 1
    for p, w in zip(parts, widths):
        y = buf[..., col:col + w].view(p.shape)
        y.copy_(p)
        out.append(y)
        col += w
    return out


def tiles_dense(x: torch.Tensor) -> bool:
    rows, cols = x.shape[-2], x.shape[-1]
    return (cols <= 1 or x.stride(-1) == 1) and (rows <= 1 or x.stride(-2) == cols)


# -- menus of view kinds per argument --------------------------------------------------------------

def float_menu(rank: int) -> tuple:
    """View kinds of a float argument, the most telling first (hypothesis tries the first one
    first and shrinks towards it)."""
    kinds = ["column", f"every_other:{max(rank - 2, 0)}"]
    if rank >= 2:
        kinds += ["transposed", "reversed"]
    kinds += ["wide_last", "broadcast:0", "offset"]
    kinds += [f"every_other:{d}" for d in range(rank) if d != max(rank - 2, 0)]
    return tuple(kinds)


PARAM1_MENU = ("column", "every_other:0", "broadcast:0", "offset")
INDEX1_MENU = ("column", "every_other:0", "offset")
INDEX2_MENU = ("transposed", "column", "every_other:1", "every_other:0", "wide_last", "offset")
POOL_DENSE_MENU = ("every_other:0", "narrow:1", "slot_major", "narrow:2", "offset")
POOL_STRIDED_TILE_MENU = ("transposed", "wide_last", "every_other:2", "every_other:3")
INTER_DENSE_MENU = ("prefix:1", "every_other:0", "slot_major", "every_other:1", "narrow:2", "offset")
INTER_STRIDED_TILE_MENU = ("transposed", "wide_last")
INITIAL_MENU = ("every_other:0", "transposed", "narrow:1", "slot_major", "wide_last", "every_other:2", "offset")


def decode_menu(op: str, arg: str, table: bool) -> tuple:
    kda = op == "kda_decode"
    if arg in ("q", "k", "v", "b"):
        return float_menu(4 if arg != "b" else 3)
    if arg == "a":
        return float_menu(4 if kda else 3)
    if arg == "A_log":
        return PARAM1_MENU
    if arg == "dt_bias":
        return float_menu(2) if kda else PARAM1_MENU
    if arg == "state_indices":
        return INDEX2_MENU if table else INDEX1_MENU
    if arg in ("num_accepted_tokens", "intermediate_state_indices", "has_initial_state"):
        return INDEX1_MENU
    if arg == "g":
        return float_menu(4 if kda else 3)
    if arg == "beta":
        return float_menu(3)
    if arg == "state_pool":
        return POOL_DENSE_MENU
    if arg == "intermediate_states":
        return INTER_DENSE_MENU
    if arg == "qkv":
        return ("fused",)
    if arg == "ab":
        return () if kda else ("fused",)
    raise KeyError(arg)


def prefill_menu(op: str, arg: str) -> tuple:
    kda = op == "kda_prefill"
    if arg in ("q", "k", "v"):
        return float_menu(3)
    if arg == "g":
        return float_menu(3 if kda else 2)
    if arg == "beta":
        return float_menu(2)
    if arg in ("cu_seqlens", "state_indices", "has_initial_state"):
        return INDEX1_MENU
    if arg == "state_pool":
        return POOL_DENSE_MENU + POOL_STRIDED_TILE_MENU
    if arg == "initial_state":
        return INITIAL_MENU
    if arg == "qkv":
        return ("fused",)
    if arg == "gbeta":
        return () if kda else ("fused",)
    raise KeyError(arg)


DECODE_VIEW_ARGS = ("qkv", "q", "k", "v", "ab", "a", "b", "A_log", "dt_bias", "g", "beta", "state_indices",
                    "num_accepted_tokens", "intermediate_state_indices", "has_initial_state", "state_pool",
                    "intermediate_states")
PREFILL_VIEW_ARGS = ("qkv", "q", "k", "v", "gbeta", "g", "beta", "cu_seqlens", "state_indices", "has_initial_state",
                     "state_pool", "initial_state")
RAW_GATE_ARGS = ("ab", "a", "b", "A_log", "dt_bias")


# -- decode ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeSpec:
    op: str = "gdn_decode"
    N: int = 1
    T: int = 1
    H: int = 1
    G: int = 1  # GVA group: HV = H * G
    K: int = 8
    V: int = 8
    extra: int = 0  # spare pool slots / intermediate rows
    dtype: str = "float32"  # q, k, v
    gate_dtype: str = "same"  # a, b: "same" as q, or "float32"
    pool_dtype: str = "float32"
    layout: str = "vk"
    idx_dtype: str = "int32"
    table: bool = False  # per-token slots [N, T]
    nat: bool = False  # num_accepted_tokens (with the table)
    inter: bool = False  # intermediate_states + intermediate_state_indices
    disable: bool = False  # disable_state_update
    share: bool = False  # with disable: two rows read the same slot
    pad: tuple = ()  # padding rows
    l2norm: bool = True
    scale: Optional[float] = None
    lower_bound: Optional[float] = None
    softplus: tuple = (1.0, 20.0)
    gate_form: str = "raw"  # "raw" (a, b, A_log, dt_bias) or "pre" (precomputed fp32 g, beta)
    his: bool = False  # has_initial_state [N] bool given (False rows start from a zero state)
    gate_model: Optional[str] = None  # a model of linattn.testing.gates: its gate distribution (kind "model gates")
    views: tuple = ()  # ((arg, kind), ...)
    seed: int = 0

    @property
    def HV(self) -> int:
        return self.H * self.G


@dataclass
class Built:
    """The op's keyword arguments for one spec, plus what the checks need."""

    op: str
    spec: object
    kwargs: dict
    written: dict = field(default_factory=dict)  # name -> the view passed as that argument
    bases: dict = field(default_factory=dict)  # name -> the contiguous buffer behind it
    has_views: bool = False

    @property
    def tiles_dense(self) -> bool:
        return all(tiles_dense(x) for x in self.written.values())


def _r(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _written(b: Built, name: str, x: torch.Tensor) -> None:
    base = x._base if x._base is not None else x
    assert base.is_contiguous()
    b.written[name] = x
    b.bases[name] = base
    b.kwargs[name] = x


def build_decode(spec: DecodeSpec, device="cpu") -> Built:
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(spec.seed)
    N, T, H, HV, K, V = spec.N, spec.T, spec.H, spec.HV, spec.K, spec.V
    kda = spec.op == "kda_decode"
    dt = DT[spec.dtype]
    gdt = dt if spec.gate_dtype == "same" else torch.float32
    pdt = DT[spec.pool_dtype]
    idt = DT[spec.idx_dtype]
    qk = 1.0 if spec.l2norm else K ** -0.5  # unnormalised keys of norm ~1 keep the delta rule stable
    t = dict(
        q=(_r(gen, N, T, H, K) * qk).to(dt), k=(_r(gen, N, T, H, K) * qk).to(dt), v=_r(gen, N, T, HV, V).to(dt),
        a=(_r(gen, N, T, HV, *((K,) if kda else ())) * 2).to(gdt), b=(_r(gen, N, T, HV) * 2).to(gdt),
        A_log=_r(gen, HV) * 0.5, dt_bias=_r(gen, HV, *((K,) if kda else ())) * 0.5,
    )
    tile = (V, K) if spec.layout == "vk" else (K, V)
    width = T if spec.table else 1
    P = max(1, N * max(width, 1) + spec.extra)
    pool = _r(gen, P, HV, *tile).to(pdt)
    perm = torch.randperm(P, generator=gen).tolist()
    pad = set(spec.pad)
    nacc = [int(torch.randint(0, T + 1, (1,), generator=gen)) for _ in range(N)] if spec.nat else None
    if spec.table:
        rows = []
        for n in range(N):
            own = perm[n * T:(n + 1) * T]
            row = list(own)
            for j in range(T):
                u = float(torch.rand(1, generator=gen))
                if u < 0.2:
                    row[j] = -1
                elif u < 0.35:
                    row[j] = own[int(torch.randint(0, T, (1,), generator=gen))]
            c = (nacc[n] - 1) if (nacc is not None and nacc[n] > 0) else 0
            row[c] = -1 if n in pad else own[c]
            rows.append(row)
        if spec.share and spec.disable and N >= 2 and 0 not in pad and 1 not in pad:
            c0 = (nacc[0] - 1) if (nacc is not None and nacc[0] > 0) else 0
            c1 = (nacc[1] - 1) if (nacc is not None and nacc[1] > 0) else 0
            rows[1][c1] = rows[0][c0]
        idx = torch.tensor(rows, dtype=torch.int64).view(N, T)
    else:
        slots = [(-1 if n in pad else perm[n]) for n in range(N)]
        if spec.share and spec.disable and N >= 2 and 0 not in pad and 1 not in pad:
            slots[1] = slots[0]
        idx = torch.tensor(slots, dtype=torch.int64)
    used = set(idx.flatten().tolist())
    unused_slots = [s for s in range(P) if s not in used] + [-1]
    t["state_indices"] = idx.to(idt)
    t["num_accepted_tokens"] = None if nacc is None else torch.tensor(nacc, dtype=idt)
    t["g"] = t["beta"] = t["has_initial_state"] = None
    if spec.gate_form == "pre":  # fp32 log decays and sigmoided betas instead of the raw gates
        t["g"] = -torch.nn.functional.softplus(_r(gen, N, T, HV, *((K,) if kda else ())) * 2)
        t["beta"] = torch.rand(N, T, HV, generator=gen)
        t["a"] = t["b"] = t["A_log"] = t["dt_bias"] = None
    if spec.gate_model:
        _model_decode_gates(spec, t, gdt)
    if spec.his:
        t["has_initial_state"] = torch.rand(N, generator=gen) < 0.5
    inter = inter_idx = None
    unused_rows = [-1]
    if spec.inter:
        S = N + spec.extra
        iperm = torch.randperm(max(S, 1), generator=gen)[:N].tolist()
        irows = [(-1 if float(torch.rand(1, generator=gen)) < 0.25 else r) for r in iperm]
        inter = _r(gen, S, T, HV, *tile).to(pdt)
        inter_idx = torch.tensor(irows, dtype=idt)
        unused_rows = [r for r in range(S) if r not in irows] + [-1]
    t = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    pool = pool.to(dev)
    inter = inter.to(dev) if inter is not None else None
    inter_idx = inter_idx.to(dev) if inter_idx is not None else None

    views = dict(spec.views)
    fj = lambda x: _float_junk(x.dtype, dev)  # noqa: E731
    if views.get("qkv") == "fused":
        t["q"], t["k"], t["v"] = _fused([t["q"], t["k"], t["v"]], fj(t["q"]))
    if views.get("ab") == "fused" and t["a"] is not None and t["a"].dtype == t["b"].dtype:
        t["a"], t["b"] = _fused([t["a"], t["b"]], fj(t["a"]))
    for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "g", "beta"):
        if name in views and t[name] is not None:
            t[name] = make_view(t[name], views[name], fj(t[name]))
    if "has_initial_state" in views and t["has_initial_state"] is not None:
        t["has_initial_state"] = make_view(t["has_initial_state"], views["has_initial_state"],
                                           _index_junk([0, 1], torch.bool, dev, gen))
    if "state_indices" in views:
        t["state_indices"] = make_view(t["state_indices"], views["state_indices"],
                                       _index_junk(unused_slots, idt, dev, gen))
    if "num_accepted_tokens" in views and t["num_accepted_tokens"] is not None:
        t["num_accepted_tokens"] = make_view(t["num_accepted_tokens"], views["num_accepted_tokens"],
                                             _index_junk(list(range(T + 1)), idt, dev, gen))
    if "intermediate_state_indices" in views and inter_idx is not None:
        inter_idx = make_view(inter_idx, views["intermediate_state_indices"],
                              _index_junk(unused_rows, idt, dev, gen))
    if "state_pool" in views:
        pool = make_view(pool, views["state_pool"], _float_junk(pdt, dev))
    if "intermediate_states" in views and inter is not None:
        inter = make_view(inter, views["intermediate_states"], _float_junk(pdt, dev))

    kw = dict(q=t["q"], k=t["k"], v=t["v"], a=t["a"], b=t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"],
              state_indices=t["state_indices"], scale=spec.scale, use_qk_l2norm=spec.l2norm,
              state_layout=spec.layout, intermediate_state_indices=inter_idx,
              disable_state_update=spec.disable, num_accepted_tokens=t["num_accepted_tokens"],
              softplus_beta=spec.softplus[0], softplus_threshold=spec.softplus[1])
    if kda:
        kw["lower_bound"] = spec.lower_bound
    if t["g"] is not None:  # the new keywords only when used (a call without them is a v1 call)
        kw["g"], kw["beta"] = t["g"], t["beta"]
    if t["has_initial_state"] is not None:
        kw["has_initial_state"] = t["has_initial_state"]
    b = Built(op=spec.op, spec=spec, kwargs=kw, has_views=any(k != "contig" for k in views.values()))
    _written(b, "state_pool", pool)
    if inter is not None:
        _written(b, "intermediate_states", inter)
    else:
        kw["intermediate_states"] = None
    return b


# -- prefill ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefillSpec:
    op: str = "gdn_prefill"
    lens: tuple = (1,)
    H: int = 1
    G: int = 1
    K: int = 8
    V: int = 8
    extra: int = 0
    dtype: str = "float32"
    state_dtype: str = "float32"  # pool / initial_state
    layout: str = "vk"
    idx_dtype: str = "int32"
    cu_dtype: str = "int32"
    mode: str = "pool"  # "pool", "dense" (no initial state), "dense_h0"
    pad: tuple = ()  # padding sequences (pool mode)
    l2norm: bool = True
    scale: Optional[float] = None
    gates: str = "normal"  # "normal", "strong" (-20), "zero", "floor" (-inf, -1e30 spots)
    gate_model: Optional[str] = None  # instead of ``gates``: a model of linattn.testing.gates (g and beta)
    his: bool = False  # has_initial_state [N] bool given (pool mode)
    views: tuple = ()
    seed: int = 0

    @property
    def HV(self) -> int:
        return self.H * self.G


def build_prefill(spec: PrefillSpec, device="cpu") -> Built:
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(spec.seed)
    lens = list(spec.lens)
    N, T, H, HV, K, V = len(lens), sum(lens), spec.H, spec.HV, spec.K, spec.V
    kda = spec.op == "kda_prefill"
    dt, sdt = DT[spec.dtype], DT[spec.state_dtype]
    qk = 1.0 if spec.l2norm else K ** -0.5
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    gshape = (T, HV, K) if kda else (T, HV)
    if spec.gates == "strong":
        g = torch.full(gshape, -20.0)
    elif spec.gates == "zero":
        g = torch.zeros(gshape)
    else:
        g = -torch.nn.functional.softplus(_r(gen, *gshape) - 1.0)
        if spec.gates == "floor" and T:
            flat = g.view(-1)
            for val in (float("-inf"), -1e30, -3e38):
                flat[int(torch.randint(0, flat.numel(), (1,), generator=gen))] = val
    t = dict(q=(_r(gen, T, H, K) * qk).to(dt), k=(_r(gen, T, H, K) * qk).to(dt), v=_r(gen, T, HV, V).to(dt),
             g=g, beta=torch.rand(T, HV, generator=gen),
             cu_seqlens=torch.tensor(cu, dtype=DT[spec.cu_dtype]))
    if spec.gate_model:  # the model's gate distribution, strong-decay heads every second head
        t["g"], t["beta"] = model_gates(spec.gate_model, T, hv=HV, k=K, seed=spec.seed, strong_every=2).log_decay()
    tile = (V, K) if spec.layout == "vk" else (K, V)
    pool = idx = h0 = his = None
    unused = [-1]
    if spec.mode == "pool":
        P = N + spec.extra if N + spec.extra > 0 else 1
        pool = _r(gen, P, HV, *tile).to(sdt)
        perm = torch.randperm(P, generator=gen)[:N].tolist()
        pad = set(spec.pad)
        slots = [(-1 if n in pad else s) for n, s in enumerate(perm)]
        idx = torch.tensor(slots, dtype=DT[spec.idx_dtype])
        unused = [s for s in range(P) if s not in slots] + [-1]
        his = (torch.rand(N, generator=gen) < 0.5) if spec.his else None
    elif spec.mode == "dense_h0":
        h0 = _r(gen, N, HV, *tile).to(sdt)
    t = {k: v.to(dev) for k, v in t.items()}
    pool = pool.to(dev) if pool is not None else None
    idx = idx.to(dev) if idx is not None else None
    h0 = h0.to(dev) if h0 is not None else None
    his = his.to(dev) if his is not None else None

    views = dict(spec.views)
    fj = lambda x: _float_junk(x.dtype, dev)  # noqa: E731
    if views.get("qkv") == "fused":
        t["q"], t["k"], t["v"] = _fused([t["q"], t["k"], t["v"]], fj(t["q"]))
    if views.get("gbeta") == "fused" and not kda:
        t["g"], t["beta"] = _fused([t["g"], t["beta"]], fj(t["g"]))
    for name in ("q", "k", "v", "g", "beta"):
        if name in views:
            t[name] = make_view(t[name], views[name], fj(t[name]))
    if "cu_seqlens" in views:
        t["cu_seqlens"] = make_view(t["cu_seqlens"], views["cu_seqlens"],
                                    _index_junk(list(range(T + 1)), t["cu_seqlens"].dtype, dev, gen))
    if "state_indices" in views and idx is not None:
        idx = make_view(idx, views["state_indices"], _index_junk(unused, idx.dtype, dev, gen))
    if "state_pool" in views and pool is not None:
        pool = make_view(pool, views["state_pool"], _float_junk(sdt, dev))
    if "initial_state" in views and h0 is not None:
        h0 = make_view(h0, views["initial_state"], _float_junk(sdt, dev))
    if "has_initial_state" in views and his is not None:
        his = make_view(his, views["has_initial_state"], _index_junk([0, 1], torch.bool, dev, gen))

    kw = dict(q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], cu_seqlens=t["cu_seqlens"],
              state_indices=idx, initial_state=h0, scale=spec.scale, use_qk_l2norm=spec.l2norm,
              state_layout=spec.layout)
    if his is not None:
        kw["has_initial_state"] = his
    b = Built(op=spec.op, spec=spec, kwargs=kw, has_views=any(k != "contig" for k in views.values()))
    if pool is not None:
        _written(b, "state_pool", pool)
    else:
        kw["state_pool"] = None
    return b


def _model_decode_gates(spec: DecodeSpec, t: dict, gdt: torch.dtype) -> None:
    """Replace the decode gates of ``t`` by a draw of ``spec.gate_model`` (linattn.testing.gates):
    raw ``a, b, A_log, dt_bias`` (the raw form's beta is ``sigmoid(b)``: OLMo-hybrid's doubling is not
    part of it), or the log decay and beta of the precomputed form."""
    N, T, HV = spec.N, spec.T, spec.HV
    kda = spec.op == "kda_decode"
    mg = model_gates(spec.gate_model, N * T, hv=HV, k=spec.K, seed=spec.seed, strong_every=2)
    chan = (HV, spec.K) if kda else (HV,)
    if spec.gate_form == "pre":
        g, beta = mg.log_decay()
        t["g"], t["beta"] = g.view(N, T, *chan), beta.view(N, T, HV)
    else:
        t["a"], t["b"] = mg.a.view(N, T, *chan).to(gdt), mg.b.view(N, T, HV).to(gdt)
        t["A_log"], t["dt_bias"] = mg.A_log, mg.dt_bias


#: Gate models per family (kind "model gates": real models' initialisations, linattn.testing.gates).
GATE_MODELS = {f: tuple(n for n, m in MODELS.items() if m.family == f) for f in ("gdn", "kda")}


@st.composite
def model_gate_specs(draw, base):
    """Specs of ``base`` (decode or prefill) with the gates of a real model's initialisation, drawn
    from :data:`GATE_MODELS` (strong-decay heads every second head); a raw-form decode takes the
    model's ``lower_bound`` and the default softplus."""
    spec = draw(base)
    name = draw(st.sampled_from(GATE_MODELS["kda" if spec.op.startswith("kda") else "gdn"]))
    if isinstance(spec, DecodeSpec):
        lb = MODELS[name].lower_bound if spec.gate_form == "raw" else None
        return replace(spec, gate_model=name, lower_bound=lb, softplus=(1.0, 20.0))
    return replace(spec, gate_model=name, gates="normal")


def legal_views(spec):
    """``spec`` without the view kinds that no longer apply after its fields were changed (a table
    turned into ``[N]`` indices, the intermediate buffer dropped, ...)."""
    if isinstance(spec, DecodeSpec):
        def ok(arg, kind):
            if arg == "num_accepted_tokens" and not spec.nat:
                return False
            if arg in ("intermediate_state_indices", "intermediate_states") and not spec.inter:
                return False
            if (arg in RAW_GATE_ARGS) != (spec.gate_form == "raw") and arg in RAW_GATE_ARGS + ("g", "beta"):
                return False
            if arg == "has_initial_state" and not spec.his:
                return False
            menu = decode_menu(spec.op, arg, spec.table)
            return kind in menu or (arg == "intermediate_states" and kind in INTER_STRIDED_TILE_MENU) or \
                (arg == "state_pool" and kind in POOL_STRIDED_TILE_MENU)
    else:
        def ok(arg, kind):
            if arg in ("state_indices", "state_pool") and spec.mode != "pool":
                return False
            if arg == "initial_state" and spec.mode != "dense_h0":
                return False
            if arg == "has_initial_state" and not spec.his:
                return False
            return kind in prefill_menu(spec.op, arg)
    return replace(spec, views=tuple((a, k) for a, k in spec.views if ok(a, k)))


# -- strategies -----------------------------------------------------------------------------------

INTERP_BACKENDS = ("triton-split", "triton-folded")
SEEDS = st.integers(0, 2 ** 31 - 1)


GROUPS = {"qkv": ("qkv", "q", "k", "v"), "gates": ("ab", "a", "b", "A_log", "dt_bias", "gbeta", "g", "beta")}


def _views(draw, menu_of, args, focus, exclude) -> tuple:
    """View kinds: with a single-argument focus that argument always gets a non-contiguous kind;
    with a group focus (``qkv``, ``gates``) each member draws one (at least one non-contiguous);
    with ``mixed`` every argument not in ``exclude`` draws one (contig included)."""
    if focus == "mixed":
        members = [a for a in args if a not in exclude]
    elif focus in GROUPS:
        members = [a for a in args if a in GROUPS[focus]]
    else:
        members = [focus] if focus in args else []
    members = [a for a in members if menu_of(a)]
    out = []
    for arg in members:
        menu = tuple(menu_of(arg))
        free = focus == "mixed" or len(members) > 1
        kind = draw(st.sampled_from(("contig",) + menu if free else menu))
        if kind != "contig":
            out.append((arg, kind))
    if focus != "mixed" and not out and members:
        arg = draw(st.sampled_from(members))
        out.append((arg, draw(st.sampled_from(tuple(menu_of(arg))))))
    return tuple(out)


DECODE_FOCI = ("plain", "empty", "qkv", "gates", "A_log", "dt_bias", "g", "state_indices", "num_accepted_tokens",
               "intermediate_state_indices", "has_initial_state", "state_pool", "intermediate_states", "state_tiles",
               "mixed")
PREFILL_FOCI = ("plain", "dense", "empty", "qkv", "gates", "cu_seqlens", "state_indices", "has_initial_state",
                "state_pool", "initial_state", "mixed")


@st.composite
def decode_specs(draw, op: str, backend: Optional[str], focus: str, exclude: frozenset = frozenset(),
                 shapes: Optional[tuple] = None, dtypes=("float32", "bfloat16")):
    """Valid decode specs for ``backend``, with ``focus`` deciding which argument is viewed.
    ``shapes``: fixed ``(H, HV, K, V)`` classes (the GPU suite), else small random heads."""
    interp = backend in INTERP_BACKENDS
    if focus == "empty":
        N = draw(st.integers(0, 2))
        T = draw(st.integers(0, 2)) if N else draw(st.integers(0, 2))
    else:  # one row hides a strided index (or per-row) argument: foci start at two
        N = draw(st.integers(1 if focus == "plain" else 2, 3 if interp else 4))
        T = draw(st.integers(1, 3 if interp else 4))
    if shapes:
        H, HV, K, V = draw(st.sampled_from(shapes))
        G = HV // H
    else:
        # the simplest draw (hypothesis tries it first) is GVA with K != V: per-head arguments and
        # transposed state tiles are visible in it
        H = draw(st.integers(1, 2))
        G = draw(st.sampled_from((2, 1)))
        dims = (8, 16) if interp else (8, 16, 4, 32)
        K, V = draw(st.sampled_from(dims)), draw(st.sampled_from(dims[1::-1] + dims[2:]))
    table = T >= 1 and draw(st.booleans())
    nat = table and draw(st.booleans())
    inter = T >= 1 and draw(st.booleans())
    if focus == "num_accepted_tokens":
        T = max(T, 2)
        table = nat = True
    if focus in ("intermediate_state_indices", "intermediate_states"):
        inter = True
    disable = draw(st.booleans()) if draw(st.booleans()) else False
    share = disable and N >= 2 and draw(st.booleans())
    if focus == "empty" and N and T and draw(st.booleans()):
        pad = tuple(range(N))
    else:
        pad = tuple(n for n in range(N) if n and draw(st.booleans())) if N else ()
        if N and not pad and draw(st.integers(0, 3)) == 3:
            pad = (0,)
    if len(pad) == N and focus != "empty" and N:
        pad = pad[1:]
    dtype = draw(st.sampled_from(dtypes))
    spec = DecodeSpec(
        op=op, N=N, T=T, H=H, G=G, K=K, V=V, extra=draw(st.integers(0, 3)), dtype=dtype,
        gate_dtype=draw(st.sampled_from(("same", "float32"))),
        pool_dtype=draw(st.sampled_from(("float32", "bfloat16"))),
        layout=draw(st.sampled_from(("vk", "kv"))), idx_dtype=draw(st.sampled_from(("int32", "int64"))),
        table=table, nat=nat, inter=inter, disable=disable, share=share, pad=pad,
        l2norm=True if shapes else draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.sampled_from((0.1, 0.35, 1.0)))),
        lower_bound=(draw(st.sampled_from((None, -5.0, -1.0))) if op == "kda_decode" else None),
        softplus=draw(st.sampled_from(((1.0, 20.0), (2.0, 5.0), (0.5, 1.0)))),
        seed=draw(SEEDS),
    )
    # the second release's keywords: precomputed gates, has_initial_state (raw / absent shrink first)
    gate_form = "pre" if focus in ("g", "beta") else draw(st.sampled_from(("raw", "pre")))
    his = focus == "has_initial_state" or draw(st.booleans())
    spec = replace(spec, gate_form=gate_form, his=his)
    if gate_form == "pre":  # the gating's parameters have no meaning there (refused)
        spec = replace(spec, lower_bound=None, softplus=(1.0, 20.0))
    if focus == "state_tiles":
        which = "intermediate_states" if inter and draw(st.booleans()) else "state_pool"
        menu = INTER_STRIDED_TILE_MENU if which == "intermediate_states" else POOL_STRIDED_TILE_MENU
        views = ((which, draw(st.sampled_from(menu))),)
    elif focus in ("plain", "empty"):
        views = ()
    else:
        args = [a for a in DECODE_VIEW_ARGS if not (a == "num_accepted_tokens" and not nat)
                and not (a in ("intermediate_state_indices", "intermediate_states") and not inter)
                and not (a == "has_initial_state" and not his)
                and not (a in RAW_GATE_ARGS and gate_form != "raw")
                and not (a in ("g", "beta") and gate_form != "pre")]
        if focus == "gates":
            args = [a for a in args if a in RAW_GATE_ARGS + ("g", "beta")]
        views = _views(draw, lambda a: decode_menu(op, a, table), args, focus, exclude)
    return replace(spec, views=views)


@st.composite
def prefill_specs(draw, op: str, backend: Optional[str], focus: str, exclude: frozenset = frozenset(),
                  shapes: Optional[tuple] = None, dtypes=("float32", "bfloat16"), max_len: Optional[int] = None,
                  long_seqs: bool = True):
    """Valid prefill specs (pool or dense mode) for ``backend``; ``long_seqs``: some sequences cross
    a chunk boundary (60..70 tokens, or up to ``max_len``)."""
    interp = backend in INTERP_BACKENDS
    if shapes:
        H, HV, K, V = draw(st.sampled_from(shapes))
        G = HV // H
    elif interp:
        H, G, K, V = draw(st.integers(1, 2)), draw(st.sampled_from((2, 1))), 64, 64
    else:
        H, G = draw(st.integers(1, 2)), draw(st.sampled_from((2, 1)))
        dims = (8, 16, 4, 32)
        K, V = draw(st.sampled_from(dims)), draw(st.sampled_from(dims[1::-1] + dims[2:]))
    short = st.integers(0, 6 if interp else 12)
    long_ = st.integers(60, 70) if max_len is None else st.integers(max_len // 2, max_len)
    length = (short if not long_seqs else st.one_of(short, long_) if not interp
              else st.one_of(short, short, short, long_))
    if focus == "empty":
        lens = tuple(draw(st.lists(st.just(0), min_size=0, max_size=3)))
    else:
        lens = tuple(draw(st.lists(length, min_size=1 if focus in ("plain", "dense") else 2,
                                   max_size=3 if interp else 4)))
        if not any(lens):
            lens = lens[:-1] + (draw(st.integers(1, 6)),)
    N = len(lens)
    if focus == "dense":
        mode = draw(st.sampled_from(("dense", "dense_h0")))
    elif focus == "initial_state":
        mode = "dense_h0"
    elif focus in ("state_indices", "state_pool", "has_initial_state"):
        mode = "pool"
    else:
        mode = draw(st.sampled_from(("pool", "pool", "dense", "dense_h0")))
    pad = ()
    if mode == "pool" and N:
        pad = tuple(n for n in range(N) if draw(st.integers(0, 3)) == 3)
        if len(pad) == N and focus != "empty":
            pad = pad[1:]
    dtype = draw(st.sampled_from(dtypes))
    spec = PrefillSpec(
        op=op, lens=lens, H=H, G=G, K=K, V=V, extra=draw(st.integers(0, 3)), dtype=dtype,
        state_dtype=draw(st.sampled_from(("float32", "bfloat16"))), layout=draw(st.sampled_from(("vk", "kv"))),
        idx_dtype=draw(st.sampled_from(("int32", "int64"))), cu_dtype=draw(st.sampled_from(("int32", "int64"))),
        mode=mode, pad=pad, l2norm=True if shapes else draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.sampled_from((0.1, 0.35)))),
        gates=draw(st.sampled_from(("normal", "normal", "strong", "zero", "floor"))),
        seed=draw(SEEDS),
    )
    if mode == "pool":
        spec = replace(spec, his=focus == "has_initial_state" or draw(st.booleans()))
    if focus in ("plain", "dense", "empty"):
        views = ()
    else:
        args = [a for a in PREFILL_VIEW_ARGS
                if not (a in ("state_indices", "state_pool") and mode != "pool")
                and not (a == "initial_state" and mode != "dense_h0")
                and not (a == "has_initial_state" and not spec.his)]
        if focus == "gates":
            args = [a for a in args if a in ("gbeta", "g", "beta")]
        views = _views(draw, lambda a: prefill_menu(op, a), args, focus, exclude)
    return replace(spec, views=views)
