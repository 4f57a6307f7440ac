"""Host rules of the validation layer: ranks, shapes, dtypes, devices, strides and Python scalars.

Each rule is ``rule(args, dims) -> None``: it reads the normalised keyword arguments, records what
it learns in ``dims`` (sizes, dtype names, mode, ...) and raises on the first broken rule. Host rules
never read tensor values, so they cost no host-device sync and are safe inside CUDA graph capture.
:mod:`linattn.dispatch.rules.validate` lists, per op, which of them run and in which order.

``ValueError`` means a bad shape or value, ``TypeError`` a wrong type or dtype. Source of the rules:
docs/ops.md and the field reports F05 (clamp limit), F11 (strided gate views),
F23 (in-place without indices), F33 (written buffers torch would refuse to write, e.g. an inference
tensor outside inference mode: refused before the first write), F47 (non-strided layouts).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .layouts import byte_range, interleaved_disjoint, overlaps_itself, state_tiles_contiguous

FLOAT_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.float64: "float64"}
STATE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}
GATE_DTYPES = {torch.float32: "float32", torch.float64: "float64"}  # prefill g / beta stay fp32
INDEX_DTYPES = {torch.int32: "int32", torch.int64: "int64"}
STATE_LAYOUTS = ("vk", "kv")

Dims = dict  # n, t, h, hv, k, v, d, p, dtype, state_dtype, mode, max_seqlen, writes_pool, ...
HostRule = Callable[[dict, Dims], None]


# -- message helpers ---------------------------------------------------------------------------

def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t) + "]"


def _names(d: dict) -> str:
    return "{" + ", ".join(d.values()) + "}"


def _tensor(args: dict, name: str) -> torch.Tensor:
    x = args[name]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}; pass a tensor.")
    return x


def _expect_rank(x, name: str, rank: int, layout: str) -> None:
    if x.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {_shape(x.shape)}; "
                         f"reshape it to {layout}.")


def _expect_shape(x, name: str, want: tuple, layout: str) -> None:
    if tuple(x.shape) != want:
        raise ValueError(f"{name} must have shape {layout} = {_shape(want)}, got {_shape(x.shape)}; "
                         f"check that it matches the other inputs.")


def _expect_dtype(x, name: str, allowed: dict, why: str = "") -> str:
    dt = allowed.get(x.dtype)
    if dt is None:
        raise TypeError(f"{name} has dtype {x.dtype}; allowed: {_names(allowed)}{why}. "
                        f"Convert it with .to(...).")
    return dt


def _no_self_overlap(x, name: str) -> None:
    """A written tensor must give every element its own memory (no zero stride on a dim of size
    > 1, no slot or head pitch smaller than what it holds): one write would change rows nobody named."""
    if not overlaps_itself(x):
        return
    zero = [d for d, (size, stride) in enumerate(zip(x.shape, x.stride())) if stride == 0 and size > 1]
    why = (f"has stride 0 on dim {zero[0]} of size {x.shape[zero[0]]}" if zero else
           "has a pitch smaller than the block it steps over (e.g. a slot pitch below one slot)")
    raise ValueError(f"{name} is written in place but {why}, so its elements overlap in memory (shape "
                     f"{_shape(x.shape)}, strides {_shape(x.stride())}) and one write would change "
                     f"entries nobody named; pass a buffer whose slots, heads and entries are disjoint "
                     f"(e.g. a fresh torch.zeros, or a slice of one).")


def _real(value, name: str) -> float:
    tp = type(value)
    if tp is float or tp is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__} ({value!r}); "
                        f"pass a float (a tensor would need a device sync).")
    return float(value)


def _positive_finite(value, name: str) -> float:
    x = _real(value, name)
    if not (0.0 < x < math.inf):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}; pass a positive float.")
    return x


def _flag(args: dict, name: str) -> None:
    if type(args[name]) is not bool:
        raise TypeError(f"{name} must be a bool, got {type(args[name]).__name__} ({args[name]!r}).")


def _ratio(h: int, hv: int) -> None:
    if h < 1 or hv % h:
        raise ValueError(f"HV % H must be 0 (GVA: value head hv reads q/k head hv // (HV // H)), got "
                         f"H={h} (q/k heads) and HV={hv} (value heads); pass HV a multiple of H.")


def _head_dims(dims: Dims) -> None:
    for sym, what in (("k", "K (q/k head dim)"), ("v", "V (v head dim)"), ("hv", "HV (value heads)")):
        if dims[sym] < 1:
            raise ValueError(f"{what} must be >= 1, got {dims[sym]}; check the shapes of q, k and v.")


# -- host rules: q, k, v -------------------------------------------------------------------------

def _qkv(args: dict, dims: Dims, lead: int) -> None:
    """q, k [*L, H, K], v [*L, HV, V] with L = (N, T) for decode, (T,) for prefill; same dtype."""
    layout_qk, layout_v = ("[N, T, H, K]", "[N, T, HV, V]") if lead == 2 else ("[T, H, K]", "[T, HV, V]")
    q, k, v = _tensor(args, "q"), _tensor(args, "k"), _tensor(args, "v")
    _expect_rank(q, "q", lead + 2, layout_qk)
    qs = q.shape
    if k.shape != qs:
        raise ValueError(f"k must have the shape of q {layout_qk} = {_shape(qs)}, got {_shape(k.shape)}.")
    _expect_rank(v, "v", lead + 2, layout_v)
    vs = v.shape
    if vs[:lead] != qs[:lead]:
        raise ValueError(f"v {layout_v} must share the leading dims of q {layout_qk}: got v "
                         f"{_shape(vs)} and q {_shape(qs)}.")
    dtype = _expect_dtype(q, "q", FLOAT_DTYPES)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}; "
                        f"allowed: {_names(FLOAT_DTYPES)}. Cast them to one dtype.")
    if lead == 2:
        dims["n"], dims["t"] = qs[0], qs[1]
    else:
        dims["t"] = qs[0]
    dims["h"], dims["k"], dims["hv"], dims["v"], dims["dtype"] = qs[-2], qs[-1], vs[-2], vs[-1], dtype
    _head_dims(dims)
    _ratio(dims["h"], dims["hv"])


def _decode_qkv(args: dict, dims: Dims) -> None:
    _qkv(args, dims, 2)


def _prefill_qkv(args: dict, dims: Dims) -> None:
    _qkv(args, dims, 1)


# -- host rules: gates ---------------------------------------------------------------------------

def _gate_params(args: dict, dims: Dims, kda: bool) -> None:
    """A_log [HV] and dt_bias [HV] (KDA [HV, K]), any float dtype (computed in fp32)."""
    hv = dims["hv"]
    a_log, dt_bias = _tensor(args, "A_log"), _tensor(args, "dt_bias")
    _expect_shape(a_log, "A_log", (hv,), "[HV]")
    _expect_shape(dt_bias, "dt_bias", (hv, dims["k"]) if kda else (hv,), "[HV, K]" if kda else "[HV]")
    _expect_dtype(a_log, "A_log", FLOAT_DTYPES)
    _expect_dtype(dt_bias, "dt_bias", FLOAT_DTYPES)


_RAW_GATES = ("a", "b", "A_log", "dt_bias")
_READY_GATES = ("g", "beta")


def _decode_gates(args: dict, dims: Dims, kda: bool) -> None:
    """Exactly one gate form: raw (a, b, A_log, dt_bias; gating fused) or precomputed (g, beta)."""
    raw = [n for n in _RAW_GATES if args.get(n) is not None]
    ready = [n for n in _READY_GATES if args.get(n) is not None]
    if raw and ready:
        raise ValueError(f"decode got both gate forms: {', '.join(raw)} (raw gates) and {', '.join(ready)} "
                         f"(precomputed gates); pass either a, b, A_log, dt_bias or g, beta (with a, b, "
                         f"A_log, dt_bias passed as None), not both.")
    if ready:
        _decode_ready_gates(args, dims, kda)
        return
    missing = [n for n in _RAW_GATES if n not in raw]
    if missing:
        raise TypeError(f"decode is missing the gate argument{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(m) for m in missing)}: pass the raw gates a, b, A_log, dt_bias, "
                        f"or the precomputed gates g=..., beta=... (with a, b, A_log, dt_bias as None).")
    _decode_raw_gates(args, dims, kda)


def _decode_ready_gates(args: dict, dims: Dims, kda: bool) -> None:
    """Gate form: g [N, T, HV] (KDA [N, T, HV, K]) fp32 log decay, beta [N, T, HV] fp32 (sigmoided)."""
    for name in _READY_GATES:
        if args.get(name) is None:
            other = "beta" if name == "g" else "g"
            raise TypeError(f"decode got {other} but not {name}: the precomputed-gate form needs both g "
                            f"(log decay) and beta (already sigmoided).")
    if args.get("lower_bound") is not None:
        raise ValueError(f"lower_bound={args['lower_bound']!r} was given with precomputed gates g, beta: the "
                         f"bound belongs to the gating (kda_gating(..., lower_bound=...)), which the gate form "
                         f"skips; apply it when computing g, and drop lower_bound here.")
    for name, default in (("softplus_beta", 1.0), ("softplus_threshold", 20.0)):
        if args.get(name, default) != default:
            raise ValueError(f"{name}={args[name]!r} was given with precomputed gates g, beta: it belongs to "
                             f"the gating, which the gate form skips; apply it when computing g, and drop "
                             f"{name} here.")
    _gate_pair(args, dims, ("g", "beta"), (dims["n"], dims["t"]), "N, T", kda, GATE_DTYPES,
               " (precomputed gates are fp32, as gdn_gating / kda_gating return them)")
    dims["precomputed_gates"] = True


def _gate_pair(args: dict, dims: Dims, names: tuple, lead: tuple, lead_sym: str, kda: bool, allowed: dict,
               why: str = "") -> None:
    """The two per-token gate tensors (``a``/``b`` or ``g``/``beta``): the first ``[*lead, HV]``
    (KDA ``[*lead, HV, K]``, one per key channel), the second ``[*lead, HV]``; dtypes in ``allowed``."""
    first, second = _tensor(args, names[0]), _tensor(args, names[1])
    hv = dims["hv"]
    if kda:
        _expect_shape(first, names[0], (*lead, hv, dims["k"]), f"[{lead_sym}, HV, K]")
    else:
        _expect_shape(first, names[0], (*lead, hv), f"[{lead_sym}, HV]")
    _expect_shape(second, names[1], (*lead, hv), f"[{lead_sym}, HV]")
    _expect_dtype(first, names[0], allowed, why)
    _expect_dtype(second, names[1], allowed, why)


def _decode_raw_gates(args: dict, dims: Dims, kda: bool) -> None:
    """a [N, T, HV] (KDA [N, T, HV, K]) and b [N, T, HV]; any strides (F11)."""
    _gate_pair(args, dims, ("a", "b"), (dims["n"], dims["t"]), "N, T", kda, FLOAT_DTYPES)
    _gate_params(args, dims, kda)


def _gdn_decode_gates(args: dict, dims: Dims) -> None:
    _decode_gates(args, dims, kda=False)


def _kda_decode_gates(args: dict, dims: Dims) -> None:
    _decode_gates(args, dims, kda=True)


def _prefill_gates(args: dict, dims: Dims, kda: bool) -> None:
    """g [T, HV] (KDA [T, HV, K]) and beta [T, HV], fp32 (the output of the gating op)."""
    _gate_pair(args, dims, ("g", "beta"), (dims["t"],), "T", kda, GATE_DTYPES,
               " (gates stay fp32; compute them with gdn_gating / kda_gating)")


def _gdn_prefill_gates(args: dict, dims: Dims) -> None:
    _prefill_gates(args, dims, kda=False)


def _kda_prefill_gates(args: dict, dims: Dims) -> None:
    _prefill_gates(args, dims, kda=True)


def _gating_inputs(args: dict, dims: Dims, kda: bool) -> None:
    """Gating op: a [..., HV] (KDA [..., HV, K]), b [..., HV], A_log [HV], dt_bias [HV] / [HV, K]."""
    a, b = _tensor(args, "a"), _tensor(args, "b")
    rank = 2 if kda else 1
    if a.dim() < rank:
        raise ValueError(f"a must be [..., HV{', K' if kda else ''}] (at least {rank}-D), got shape "
                         f"{_shape(a.shape)}.")
    lead = a.shape[:-1] if kda else a.shape
    if b.shape != lead:
        A_log = args.get("A_log")
        hv = f" (A_log says HV={A_log.shape[0]})" if isinstance(A_log, torch.Tensor) and A_log.dim() == 1 else ""
        raise ValueError(f"a {_shape(a.shape)} and b {_shape(b.shape)} disagree: b must be [..., HV] with "
                         f"a's leading dims and HV{hv}; fix whichever of a, b does not match the model's HV.")
    dims["dtype"] = _expect_dtype(a, "a", FLOAT_DTYPES)
    _expect_dtype(b, "b", FLOAT_DTYPES)
    dims["hv"] = lead[-1]
    dims["k"] = a.shape[-1] if kda else 0
    dims["n"] = math.prod(lead[:-1])
    _gate_params(args, dims, kda)


def _gdn_gating_inputs(args: dict, dims: Dims) -> None:
    _gating_inputs(args, dims, kda=False)


def _kda_gating_inputs(args: dict, dims: Dims) -> None:
    _gating_inputs(args, dims, kda=True)


# -- host rules: state pool, indices, dense state --------------------------------------------------

def _state_layout(args: dict, dims: Dims) -> None:
    layout = args["state_layout"]
    if layout not in STATE_LAYOUTS:
        raise ValueError(f"state_layout must be 'vk' ([.., HV, V, K], K contiguous) or 'kv' "
                         f"([.., HV, K, V]), got {layout!r}.")


def _state_tensor(args: dict, dims: Dims, name: str, lead: tuple, sym: str) -> str:
    """A state tensor [*lead, HV, V, K] ('vk') or [*lead, HV, K, V] ('kv'); returns its dtype name.

    ``lead`` holds the expected leading sizes (None = any); the K != V check makes a pool in the
    other layout an error that names ``state_layout`` instead of a silent misread.
    """
    x = _tensor(args, name)
    layout = args["state_layout"]
    hv, k, v = dims["hv"], dims["k"], dims["v"]
    tail = (hv, v, k) if layout == "vk" else (hv, k, v)
    pretty = f"[{sym}, HV, V, K]" if layout == "vk" else f"[{sym}, HV, K, V]"
    if x.dim() != len(lead) + 3:
        raise ValueError(f"{name} must be {len(lead) + 3}-D {pretty} (state_layout={layout!r}), got "
                         f"shape {_shape(x.shape)}.")
    shape = tuple(x.shape)
    if shape[len(lead):] != tail:
        other = (hv, k, v) if layout == "vk" else (hv, v, k)
        if k != v and shape[len(lead):] == other:
            flip = "kv" if layout == "vk" else "vk"
            raise ValueError(f"{name} has shape {_shape(shape)}, which is the {flip!r} layout, but "
                             f"state_layout={layout!r} expects {pretty} with K={k}, V={v}; pass "
                             f"state_layout={flip!r} (the pool is never transposed silently).")
        raise ValueError(f"{name} must be {pretty} with HV={hv}, K={k}, V={v} (state_layout="
                         f"{layout!r}), got shape {_shape(shape)}.")
    for want, got in zip(lead, shape):
        if want is not None and want != got:
            raise ValueError(f"{name} must be {pretty} with {sym}={want}, got shape {_shape(shape)}.")
    return _expect_dtype(x, name, STATE_DTYPES)


def _pool(args: dict, dims: Dims) -> None:
    """state_pool [P, HV, V, K] / [P, HV, K, V] and the 'in-place needs indices' rule (F23)."""
    pool = args["state_pool"]
    if pool is None:
        if args["state_indices"] is not None:
            raise ValueError("state_indices was given without state_pool; pass the state_pool the "
                             "indices refer to, or drop state_indices for dense mode.")
        return
    x = _tensor(args, "state_pool")
    if x.dim() != 4:
        raise ValueError(f"state_pool must be 4-D [P, HV, V, K] (state_layout='vk') or [P, HV, K, V] "
                         f"('kv'), got shape {_shape(x.shape)}.")
    if x.requires_grad:
        raise ValueError("state_pool requires grad: the pool is updated in place and is no autograd leaf; "
                         "pass state_pool.detach() (or allocate it under torch.no_grad()).")
    dims["p"] = x.shape[0]
    dims["state_dtype"] = _state_tensor(args, dims, "state_pool", (None,), "P")
    if args["state_indices"] is None:
        raise ValueError("in-place mode without indices: state_pool was given but state_indices is "
                         "None; pass state_indices [N] (int32/int64, -1 = padding) naming each "
                         "sequence's slot.")


def _indices(x, name: str, want: tuple, layout: str) -> None:
    _expect_dtype(x, name, INDEX_DTYPES)
    if tuple(x.shape) != want:
        raise ValueError(f"{name} must have shape {layout} = {_shape(want)}, got {_shape(x.shape)}.")


def _decode_indices(args: dict, dims: Dims) -> None:
    """state_indices [N] or a per-token slot table [N, T]; num_accepted_tokens [N] needs the table."""
    idx = _tensor(args, "state_indices")
    n, t = dims["n"], dims["t"]
    nat = args["num_accepted_tokens"]
    if nat is not None:
        if idx.dim() != 2:
            raise ValueError(f"num_accepted_tokens needs a per-token slot table state_indices [N, T] = "
                             f"[{n}, {t}], got state_indices of shape {_shape(idx.shape)}; pass the "
                             f"table or drop num_accepted_tokens.")
        _indices(_tensor(args, "num_accepted_tokens"), "num_accepted_tokens", (n,), "[N]")
    if idx.dim() == 2:
        _indices(idx, "state_indices", (n, t), "[N, T]")
        dims["table"] = True
    else:
        _indices(idx, "state_indices", (n,), "[N] (or a per-token table [N, T])")


def _prefill_state(args: dict, dims: Dims) -> None:
    """Pool mode (state_pool + state_indices [N]) XOR dense mode (initial_state [N, HV, V, K] / None)."""
    init = args["initial_state"]
    if init is not None and args["state_pool"] is not None:
        raise ValueError("state_pool and initial_state were both given; pass either state_pool + "
                         "state_indices (pool mode, updated in place) or initial_state (dense mode, "
                         "returns a new final state), not both.")
    if args["state_pool"] is not None:
        dims["mode"] = "pool"
        _indices(_tensor(args, "state_indices"), "state_indices", (dims["n"],), "[N]")
    elif init is not None:
        dims["state_dtype"] = _state_tensor(args, dims, "initial_state", (dims["n"],), "N")


def _pool_mode_tensor(args: dict, dims: Dims, name: str, refusal: str) -> Optional[torch.Tensor]:
    """``args[name]`` (a tensor), or None when it is not given; ``ValueError(refusal)`` when it is
    given outside pool mode (an argument that only names or flags pool slots)."""
    if args.get(name) is None:
        return None
    x = _tensor(args, name)
    if dims["mode"] != "pool":
        raise ValueError(refusal)
    return x


def _has_initial_state(args: dict, dims: Dims) -> None:
    """has_initial_state [N] bool (pool-mode prefill and decode): False = start from a zero state
    without reading the slot. Refused in dense-mode prefill (initial_state says it there)."""
    x = _pool_mode_tensor(args, dims, "has_initial_state",
                          "has_initial_state is for pool mode (state_pool + state_indices); in dense mode "
                          "pass initial_state (None, or zeros for the sequences that start fresh) instead.")
    if x is None:
        return
    if x.dtype != torch.bool:
        raise TypeError(f"has_initial_state has dtype {x.dtype}; allowed: {{torch.bool}} (True: continue from "
                        f"the slot's state, False: start from zeros). Convert it with .bool() or (x != 0).")
    if tuple(x.shape) != (dims["n"],):
        raise ValueError(f"has_initial_state must have shape [N] = [{dims['n']}] (one flag per sequence), "
                         f"got {_shape(x.shape)}.")
    dims["has_initial_state"] = True


def _output_state_indices(args: dict, dims: Dims) -> None:
    """output_state_indices [N] (pool-mode prefill and decode with ``state_indices [N]``): the slot each
    sequence's final state is written to, read from ``state_indices`` (None = write where read).
    Same dtypes and shape as ``state_indices [N]``; refused in dense mode, with a per-token slot
    table ``[N, T]`` and with ``disable_state_update=True`` (docs/ops.md "Separate read and write slots")."""
    x = _pool_mode_tensor(args, dims, "output_state_indices",
                          "output_state_indices is for pool mode (state_pool + state_indices: the read slots); "
                          "in dense mode the final state is returned, so there is no slot to write. Drop it, "
                          "or pass state_pool and state_indices.")
    if x is None:
        return
    if dims.get("table"):
        raise ValueError("output_state_indices applies to state_indices [N]; with a per-token slot table "
                         "state_indices [N, T] the table already names where the state after each token "
                         "is written (the load slot is column 0, or num_accepted_tokens - 1). Put the "
                         "write slots in the table's columns, or pass state_indices [N] with "
                         "output_state_indices [N].")
    if not dims["writes_pool"]:
        raise ValueError("output_state_indices was given with disable_state_update=True, which writes no "
                         "pool slot; drop one of the two.")
    _indices(x, "output_state_indices", (dims["n"],), "[N] (as state_indices)")
    dims["output_state_indices"] = True


#: The chunk (tokens) of the contract's chunked prefill: ``checkpoint_every`` must be a multiple of it,
#: so that every checkpoint falls on a chunk boundary (docs/ops.md "State checkpoints").
CHECKPOINT_CHUNK = 64


def _checkpoints(args: dict, dims: Dims) -> None:
    """checkpoint_every (tokens, a positive multiple of :data:`CHECKPOINT_CHUNK`) with checkpoint_indices
    ``[N, max_checkpoints]`` int32/int64 (pool-mode prefill): the state after ``(j + 1) * checkpoint_every``
    tokens of sequence ``n`` goes to slot ``checkpoint_indices[n, j]`` (docs/ops.md "State checkpoints").
    Both or neither; refused in dense mode."""
    every, table = args.get("checkpoint_every"), args.get("checkpoint_indices")
    if every is None and table is None:
        return
    if every is None or table is None:
        given, missing = ("checkpoint_every", "checkpoint_indices") if table is None else \
            ("checkpoint_indices", "checkpoint_every")
        raise ValueError(f"{given} was given without {missing}; checkpoints need both: checkpoint_every (tokens "
                         f"between checkpoints, a multiple of {CHECKPOINT_CHUNK}) and checkpoint_indices "
                         f"[N, max_checkpoints] (the slot of each, -1 = none). Pass both or neither.")
    if dims["mode"] != "pool":
        raise ValueError("checkpoint_every / checkpoint_indices are for pool mode (state_pool + state_indices): "
                         "checkpoints are written to pool slots. Drop them, or pass state_pool and state_indices.")
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every <= 0 \
            or every % CHECKPOINT_CHUNK:
        raise ValueError(f"checkpoint_every must be a positive multiple of the chunk ({CHECKPOINT_CHUNK} tokens: "
                         f"{CHECKPOINT_CHUNK}, {2 * CHECKPOINT_CHUNK}, ...), got {every!r}; a checkpoint is the "
                         f"state at a chunk boundary.")
    x = _tensor(args, "checkpoint_indices")
    _expect_dtype(x, "checkpoint_indices", INDEX_DTYPES)
    if x.dim() != 2 or x.shape[0] != dims["n"]:
        raise ValueError(f"checkpoint_indices must have shape [N, max_checkpoints] with N = {dims['n']} "
                         f"(one row per sequence), got {_shape(x.shape)}.")
    dims["checkpoints"] = True


def _intermediate(args: dict, dims: Dims) -> None:
    """intermediate_states [S, steps >= T, HV, V, K] (pool layout) with intermediate_state_indices [N]."""
    buf, idx = args["intermediate_states"], args["intermediate_state_indices"]
    if buf is None and idx is None:
        return
    if buf is None or idx is None:
        given, missing = (("intermediate_states", "intermediate_state_indices") if idx is None
                          else ("intermediate_state_indices", "intermediate_states"))
        raise ValueError(f"{given} was given without {missing}; pass both (buffer [S, steps, HV, V, K] "
                         f"and row indices [N], -1 = skip) or neither.")
    x = _tensor(args, "intermediate_states")
    if x.dim() != 5:
        raise ValueError(f"intermediate_states must be 5-D [S, steps, HV, V, K] (state_layout 'vk'; "
                         f"[S, steps, HV, K, V] for 'kv'), got shape {_shape(x.shape)}.")
    if x.shape[1] < dims["t"]:
        raise ValueError(f"intermediate_states has {x.shape[1]} steps (shape {_shape(x.shape)}) but the "
                         f"call runs T={dims['t']} tokens; pass a buffer with steps >= T.")
    _state_tensor(args, dims, "intermediate_states", (None, None), "S, steps")
    dims["s"] = x.shape[0]
    _indices(_tensor(args, "intermediate_state_indices"), "intermediate_state_indices", (dims["n"],), "[N]")


def _cu_seqlens(args: dict, dims: Dims) -> None:
    """cu_seqlens [N + 1], int32/int64, 1-D; N = numel - 1 (max_seqlen known only when N <= 1)."""
    cu = _tensor(args, "cu_seqlens")
    _expect_dtype(cu, "cu_seqlens", INDEX_DTYPES)
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] with at least one entry (prefix sums starting "
                         f"at 0), got shape {_shape(cu.shape)}.")
    dims["n"] = n = cu.shape[0] - 1
    dims["max_seqlen"] = dims["t"] if n == 1 else 0


# -- host rules: scalars and flags -----------------------------------------------------------------

def _scale_and_norm(args: dict, dims: Dims) -> None:
    scale = args["scale"]
    args["scale"] = dims["k"] ** -0.5 if scale is None else _positive_finite(scale, "scale")
    _flag(args, "use_qk_l2norm")


def _decode_flags(args: dict, dims: Dims) -> None:
    _flag(args, "disable_state_update")
    dims["writes_pool"] = not args["disable_state_update"]


def _softplus(args: dict, dims: Dims) -> None:
    args["softplus_beta"] = _positive_finite(args["softplus_beta"], "softplus_beta")
    args["softplus_threshold"] = _positive_finite(args["softplus_threshold"], "softplus_threshold")


def _lower_bound(args: dict, dims: Dims) -> None:
    lb = args["lower_bound"]
    if lb is None:
        return
    x = _real(lb, "lower_bound")
    if not (-math.inf < x < 0.0):
        raise ValueError(f"lower_bound must be None or finite and < 0 (g = lower_bound * sigmoid(...) "
                         f"is a log decay <= 0), got {lb!r}; e.g. pass -5.0.")
    args["lower_bound"] = x


def _clamp_input(args: dict, dims: Dims) -> None:
    """silu_and_mul_clamp: x [M, 2D] = gate || up with D >= 1; limit None or finite > 0 (F05)."""
    x = _tensor(args, "x")
    if x.dim() != 2 or x.shape[1] < 2 or x.shape[1] % 2:
        raise ValueError(f"x must be 2-D [M, 2D] (gate || up, D >= 1), got shape {_shape(x.shape)}; "
                         f"the last dim must be even and >= 2.")
    dims["n"], dims["d"] = x.shape[0], x.shape[1] // 2
    dims["dtype"] = _expect_dtype(x, "x", FLOAT_DTYPES)
    limit = args["limit"]
    if limit is not None:
        args["limit"] = _positive_finite(limit, "limit")


def _same_device(args: dict, dims: Dims) -> None:
    """Every tensor on one device, and that device able to hold data: plain ``meta`` tensors carry
    shapes only, so a call with them is refused here, before selection (field case F31). Fake
    tensors (``FakeTensorMode``, what ``torch.compile`` traces with) report their fake device and
    pass; under ``torch.compile`` the ops' fake implementations give their output shapes."""
    first = None
    for name, x in args.items():
        if isinstance(x, torch.Tensor):
            if first is None:
                first, dev = name, x.device
            elif x.device != dev:
                to = x.device if dev.type == "meta" else dev  # a device that holds data (meta holds shapes only)
                raise ValueError(f"all tensors must be on one device: {first} is on {dev} but {name} is "
                                 f"on {x.device}; move them with .to({str(to)!r}).")
    if first is not None and dev.type == "meta":
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(args[first], FakeTensor):
            raise ValueError(f"the tensors are on the meta device ({first} is on {dev}): meta tensors hold "
                             f"shapes but no data, so no backend can compute on them; allowed: tensors on a "
                             f"real device (cpu, cuda, ...). Move them there, or for output shapes only "
                             f"trace with torch.compile (or call torch.ops.linattn.<op> under FakeTensorMode).")
    dims["device"] = None if first is None else dev



# -- host rules run for every op: tensor layouts and storage (F47, F33) ---------------------------

def _is_fake(x: torch.Tensor) -> bool:
    return isinstance(x, FakeTensor) or x.device.type == "meta"


def _dense_tensors(args: dict, dims: Dims) -> None:
    """Every tensor argument is a strided (dense) tensor whose memory is what its strides say.

    Refused here, naming the argument, before any other rule reads strides or data pointers:

    - a non-strided layout (sparse COO / CSR / CSC / BSR / BSC, mkldnn): no backend reads such a
      tensor, and torch's own error would be "Cannot access data pointer" (field case F47);
      ``TypeError``, pass ``x.to_dense()``;
    - a lazily negated or conjugated view (``x.is_neg()`` / ``x.is_conj()``): its memory holds the
      un-negated values, which a kernel reading or writing memory would use as they are;
    - a storage smaller than the elements the shape and strides address (freed or shrunk with
      ``untyped_storage().resize_(...)``, as FSDP does): a kernel would read or write past it, and
      torch itself crashes on such a tensor.
    """
    for name, x in args.items():
        if isinstance(x, torch.Tensor):
            _dense_tensor(x, name)


def _dense_tensor(x: torch.Tensor, name: str) -> None:
    if x.layout is not torch.strided:
        raise TypeError(f"{name} has layout {x.layout}; allowed: torch.strided (dense) tensors only, since every "
                        f"backend reads and writes memory through strides. Pass {name}.to_dense() (for a buffer "
                        f"written in place, keep the dense tensor and use it from then on).")
    if x.is_neg() or x.is_conj():
        raise ValueError(f"{name} is a lazily {'negated' if x.is_neg() else 'conjugated'} view (its memory holds "
                         f"the values before the sign change, which a kernel would read or write as they are); "
                         f"pass {name}.resolve_neg().resolve_conj() (a copy), or build it without the view.")
    if x.numel() == 0 or _is_fake(x) or not (type(x) is torch.Tensor or isinstance(x, torch.nn.Parameter)):
        return
    need = (x.storage_offset() + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) + 1) * x.element_size()
    have = x.untyped_storage().nbytes()
    if have < need:
        raise ValueError(f"{name} (shape {_shape(x.shape)}, strides {_shape(x.stride())}, storage offset "
                         f"{x.storage_offset()}) addresses {need} bytes but its storage holds {have} (it was freed "
                         f"or shrunk, e.g. with untyped_storage().resize_(), as FSDP does to unsharded "
                         f"parameters); pass a tensor whose storage is allocated.")


# -- host rules run for every op: written buffers and grad mode ------------------------------------

def write_refusal(x: torch.Tensor) -> Optional[str]:
    """Why an in-place write into ``x`` fails now, or None (field case F33: torch would raise after
    the first rows were written, or a kernel would write memory torch does not expect to change).

    - an inference tensor (created under ``torch.inference_mode()``) outside inference mode:
      torch refuses every in-place update of it there ("Inplace update to inference tensor
      outside InferenceMode"), so ``torch-ref`` would raise after writing the first slots;
    - a tensor that requires grad (a leaf, or a view of one, even a view made under no_grad):
      an in-place write is refused by autograd or corrupts the graph;
    - a lazily negated or conjugated view (also refused for every argument by ``_dense_tensor``).

    Not detectable from the tensor and therefore not refused: memory that is read-only outside
    torch (``torch.from_numpy`` of a non-writable array, ``torch.frombuffer`` of ``bytes``, a
    read-only ``mmap``); torch warns when such a tensor is made.
    """
    if x.is_inference() and not torch.is_inference_mode_enabled():
        return ("is an inference tensor (it was allocated under torch.inference_mode()) and the call runs "
                "outside inference mode, where torch refuses in-place updates of inference tensors")
    if x.requires_grad:
        return "requires grad: it is updated in place and is no autograd leaf or graph node"
    if x.is_neg() or x.is_conj():
        return "is a lazily negated or conjugated view: its memory holds other values than it shows"
    return None


def any_unwritable(args: dict, written: tuple) -> bool:
    """The per-call recheck of the fast path (``dispatch/runtime/fast_path.py``), whose call key holds
    neither inference mode nor ``is_inference``: True when a buffer of ``written`` (``CallPlan.written``
    rows, a written argument's name first) is an inference tensor and the call runs outside
    inference mode. Inside inference mode it costs one flag read; outside, about 0.15 us a buffer.

    A negated or conjugated view is always a new call key (every tensor's ``is_neg()`` /
    ``is_conj()`` is in the call key and the class key), so the full validation refuses it and
    nothing needs rechecking here. A freed storage is checked by the full validation, i.e. on the
    first call of each call key: a pool whose storage is freed between two calls of the same key
    is not seen (torch itself crashes on such a tensor)."""
    if torch.is_inference_mode_enabled():
        return False
    for row in written:
        if args[row[0]].is_inference():
            return True
    return False


def _refuse_unwritable(x: torch.Tensor, name: str) -> None:
    why = None if x.numel() == 0 else write_refusal(x)
    if why is None:
        return
    fix = ("allocate it outside inference mode (torch.no_grad() suffices for inference), or run the call "
           "under torch.inference_mode() as well" if x.is_inference() else
           f"pass {name}.detach() and keep using that tensor" if x.requires_grad else
           f"pass {name}.resolve_neg().resolve_conj() and keep using that tensor")
    raise ValueError(f"{name} is written in place but {why}; nothing was written. To fix: {fix}.")


def _written_buffers(args: dict, dims: Dims, written: tuple) -> None:
    """Buffers written in place (pool, intermediate states): writable where the call runs
    (:func:`write_refusal`, F33), no internal overlap, no overlap with any other tensor argument
    (host-only: strides and address ranges, no sync), and whether every state tile is one dense
    block (``Problem.state_tiles_contiguous``, a backend's layout predicate reads it).

    A pool that is only read (decode with ``disable_state_update``) may alias itself and the inputs;
    its tiles still count. Two buffers whose address ranges meet are refused unless they are
    provably disjoint (same leading pitch, each row's block in its own part of the pitch: e.g. the
    even and odd slots of one allocation, ``dispatch/rules/layouts.py``).
    """
    present = [(n, args[n]) for n in written if isinstance(args.get(n), torch.Tensor)]
    if not present:
        return
    dims["state_tiles_contiguous"] = all(state_tiles_contiguous(x) for _, x in present)
    if any(_is_fake(x) for _, x in present):
        return  # no addresses to compare (shape-only tracing)
    writes = [(n, x) for n, x in present if n != "state_pool" or dims["writes_pool"]]
    for name, x in writes:
        _refuse_unwritable(x, name)
        _no_self_overlap(x, name)
    checked = set()
    for name, x in writes:
        lo, hi = byte_range(x)
        if lo == hi:
            continue
        for other, y in args.items():
            if other == name or not isinstance(y, torch.Tensor) or _is_fake(y) or frozenset((name, other)) in checked:
                continue
            ylo, yhi = byte_range(y)
            if ylo < hi and lo < yhi and not interleaved_disjoint(x, y):
                raise ValueError(f"{name} (written in place) overlaps {other} in memory (addresses "
                                 f"[{lo:#x}, {hi:#x}) and [{ylo:#x}, {yhi:#x})): the op would change "
                                 f"{other} while it runs; pass {other} and {name} in separate "
                                 f"allocations (e.g. {other}.clone()).")
        checked |= {frozenset((name, o)) for o in args}


def _grad_mode(args: dict, dims: Dims) -> None:
    """Record whether autograd would have to track this call (grad mode on and a tensor argument
    requires grad). The dispatcher refuses such a call unless a backend declares autograd support
    (``Backend.supports_autograd``): the ops write a pool in place and record no graph."""
    if not torch.is_grad_enabled():
        return
    names = [n for n, x in args.items() if isinstance(x, torch.Tensor) and x.requires_grad]
    if names:
        dims["requires_grad"] = True
        dims["grad_inputs"] = names
