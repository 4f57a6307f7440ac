"""Running one conformance case: build the inputs, call the public op with the backend forced,
run the float64 reference, compare.

Every case builds its inputs on the CPU from a seed derived from its id (so a failure can be
replayed), moves them to the device, calls ``linattn.<op>(..., backend=NAME)`` and runs the
reference (``linattn.backends.torch_ref.<op>_ref``, ``compute_dtype=torch.float64``) on float64
copies. Checks, each named in the failure message:

- outputs and written states within docs/ops.md's tolerance of the reference (relative Frobenius
  error; fp32 inputs and state 1e-5; 16-bit inputs or state 2e-2 on outputs, 1e-2 on states);
  everything finite. The error, the bounds and the checker are :mod:`linattn.testing.compare`'s
  (shared with the first-call self-check); the seeded draws are :mod:`linattn.testing.inputs`';
- padding rows / sequences: output exactly zero;
- every pool row (and intermediate-state entry) the call does not own: bitwise unchanged, rows
  outside a strided pool view included; inputs are never modified;
- a declared case the backend's predicates decline is *skipped* with their reason; a negative
  case must be declined (``NoBackendError``) before anything is touched.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

import linattn
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.plugin.verdict import NoBackendError, Reason

from .cases import FLOOR_EVERY, FLOOR_FIRST, FLOOR_MILD, UNNORMED, Case, checkpoints_written, problem_of
from .compare import DTYPES, FULL_PRECISION, Comparison, rel_error, tolerances
from .gates import DEFAULT_MODEL, model_gates
from .inputs import betas, decays, generator, qkv, randn, state_shape, states, to_float64

from linattn._namespace import public_dir

__all__ = ["DTYPES", "INDEX", "FULL_PRECISION", "Outcome", "tolerances", "rel_error", "Checker", "execute"]
__dir__ = public_dir(__name__, __all__)

INDEX = {"int32": torch.int32, "int64": torch.int64}


@dataclass
class Outcome:
    """What running a case gave: ``passed``, ``failed``, ``skipped`` (declined / not applicable)."""

    status: str
    message: str = ""
    errors: dict = field(default_factory=dict)  # name -> relative error against the reference


class _Declined(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message

    def __reduce__(self):
        return type(self), (self.reason, self.message)  # pickles as itself (F40)


class Checker(Comparison):
    """:class:`~linattn.testing.compare.Comparison` whose verdict is a case's :class:`Outcome`."""

    def outcome(self) -> Outcome:
        if self.failures:
            return Outcome("failed", "; ".join(self.failures), dict(self.errors))
        return Outcome("passed", "", dict(self.errors))


# -- inputs -----------------------------------------------------------------------------------

def _interleaved(x: torch.Tensor, y: torch.Tensor):
    """``x [..., HV(, K)]`` and ``y [..., HV]`` as strided views into one buffer with their heads
    interleaved (element stride 2 along the head axis, F11)."""
    xs = x if x.dim() == y.dim() else x.flatten(-2)
    width = xs.shape[-1] // y.shape[-1]
    buf = torch.empty(*y.shape, width + 1, dtype=x.dtype)  # per head: x's entries, then y's
    buf[..., :width] = xs.unflatten(-1, (y.shape[-1], width))
    buf[..., width] = y
    xv = buf[..., :width]
    return (xv.squeeze(-1) if x.dim() == y.dim() else xv), buf[..., width]


def _to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Move to ``device`` keeping a view's strides (``.to`` of a view would make it contiguous)."""
    if x.device == torch.device(device) or x.is_contiguous():
        return x.to(device)
    base = x._base if x._base is not None else x
    moved = base.to(device)
    return moved.as_strided(x.shape, x.stride(), x.storage_offset() - base.storage_offset())


def _state_shape(s: dict) -> tuple:
    return state_shape(s["layout"], s["hv"], s["k"], s["v"])


def _pool(gen, s: dict, device):
    """(pool passed to the op, its base tensor on the device, CPU snapshot of the base, base row of slot i).
    The slots of fresh sequences (``has_initial_state`` False: ``s["fresh"]``) hold NaN: a backend that
    read one would carry it into that sequence's output and state."""
    P, sdt = s["p"], DTYPES[s["state_dtype"]]
    pitch = 2 if s.get("pool_view") == "strided" else 1
    base = states(gen, pitch * P, _state_shape(s), sdt)
    for slot, carry in zip(s["slots"], s.get("fresh", ())):
        if not carry and slot >= 0:
            base[pitch * slot] = float("nan")
    base_dev = base.to(device)
    return base_dev[::pitch], base_dev, base.clone(), (lambda i: pitch * i)


def _snapshots(args: dict, skip=()) -> dict:
    return {k: v.detach().cpu().clone() for k, v in args.items() if isinstance(v, torch.Tensor) and k not in skip}


def _call(op: str, backend: str, args: dict):
    """The public op with the backend forced; a predicate decline becomes :class:`_Declined`."""
    try:
        return getattr(linattn, op)(**args, backend=backend)
    except NoBackendError as e:
        v = e.decision.verdict(backend) if any(x.backend == backend for x in e.decision.verdicts) else None
        reason = v.reason.value if v is not None and not v.ok else "?"
        message = v.message if v is not None and not v.ok else str(e)
        raise _Declined(reason, message) from e


def _reference(op: str):
    from linattn.backends import torch_ref

    return getattr(torch_ref, f"{op}_ref")


def _options(s: dict, q: torch.Tensor, k: torch.Tensor) -> tuple:
    """``(q, k, keyword options)`` of a case's ``scale``, ``l2norm`` (False: q and k rows scaled to norm
    :data:`~linattn.testing.cases.UNNORMED`, read as given) and softplus options."""
    opts = {n: s[n] for n in ("scale", "softplus_beta", "softplus_threshold") if n in s}
    if s.get("l2norm") is False:
        q, k = (torch.nn.functional.normalize(x.float(), dim=-1).mul_(UNNORMED).to(x.dtype) for x in (q, k))
        opts["use_qk_l2norm"] = False
    return q, k, opts


def _model_gates(case: Case, gen: torch.Generator, T: int, HV: int, K: int):
    """A draw of the op family's default model (:data:`linattn.testing.gates.DEFAULT_MODEL`: Qwen3-Next
    for GDN, Kimi-Linear for KDA), every second head a strong-decay head."""
    family = OP_TABLE[case.op].family
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen))
    return model_gates(DEFAULT_MODEL[family], T, hv=HV, k=K, seed=seed, strong_every=2)


# -- prefill ---------------------------------------------------------------------------------------

def _prefill_inputs(case: Case, s: dict, device):
    gen = generator(case.id)
    kda = OP_TABLE[case.op].per_channel_gates
    lens = tuple(s["lens"])
    T, H, HV, K, V = sum(lens), s["h"], s["hv"], s["k"], s["v"]
    dt = DTYPES[s["dtype"]]
    q, k, v = qkv(gen, (T,), H, HV, K, V, dt, s.get("strided", False))
    q, k, opts = _options(s, q, k)
    gshape = (T, HV, K) if kda else (T, HV)
    gates = s.get("gates", "normal")
    if gates == "strong":
        g = torch.full(gshape, -20.0)
    elif gates == "zero":
        g = torch.zeros(gshape)
    elif gates == "floor":  # F28: mild gates, one token in FLOOR_EVERY at the floor
        g = torch.full(gshape, FLOOR_MILD)
        g[FLOOR_FIRST::FLOOR_EVERY] = -1000.0
    else:
        g = decays(gen, gshape)
    beta = betas(gen, T, HV)
    if gates == "model":  # the family's real model (linattn.testing.gates), every second head a strong-decay head
        g, beta = _model_gates(case, gen, T, HV, K).log_decay()
    if s.get("strided"):
        g, beta = _interleaved(g, beta)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=INDEX[s["index_dtype"]])
    args = {n: _to_device(x, device) for n, x in dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu).items()}
    args.update(opts, state_layout=s["layout"])
    pool = None
    if s["mode"] == "pool":
        pool = _pool(gen, s, device)
        args["state_pool"] = pool[0]
        args["state_indices"] = torch.tensor(s["slots"], dtype=INDEX[s["index_dtype"]]).to(device)
        if "out_slots" in s:
            args["output_state_indices"] = torch.tensor(s["out_slots"], dtype=INDEX[s["index_dtype"]]).to(device)
        if "fresh" in s:
            args["has_initial_state"] = torch.tensor(s["fresh"]).to(device)
        if "marks" in s:
            args["checkpoint_every"] = s["checkpoint_every"]
            args["checkpoint_indices"] = torch.tensor(s["marks"], dtype=INDEX[s["index_dtype"]]).to(device)
    elif s["mode"] == "dense":
        init = states(gen, len(lens), _state_shape(s), DTYPES[s["state_dtype"]])
        args["initial_state"] = init.to(device)
    return args, pool


def _run_prefill(case: Case, device) -> Outcome:
    s = case.spec
    args, pool = _prefill_inputs(case, s, device)
    snaps = _snapshots(args, skip=("state_pool",))
    ref_args = {n: to_float64(x) for n, x in args.items()}  # the index tensors (integers) as they are
    if pool is not None:
        ref_args["state_pool"] = to_float64(pool[0]).contiguous()
        start = pool[0].detach().clone()  # the pool before the call (a prefill stopped at a checkpoint)
    out = _call(case.op, case.backend, args)
    ro, rfinal = _reference(case.op)(**ref_args, compute_dtype=torch.float64)
    tol_o, tol_s = tolerances(s["dtype"], "float32" if s["mode"] == "dense-zero" else s["state_dtype"], phase="prefill")
    c = Checker()
    lens = list(s["lens"])
    cu = [0, *itertools.accumulate(lens)]
    if s["mode"] == "pool":
        o = out
        if isinstance(out, tuple):
            c.fail("pool mode must return o only (got a tuple)")
            o = out[0]
        c.close("o", o, ro, tol_o)
        c.dtype("o", o, DTYPES[s["dtype"]])
        view, base_dev, base_before, base_row = pool
        slots = list(s["slots"])
        written = list(s.get("out_slots", slots))  # separate write slots: the read slots stay as they were
        marks = checkpoints_written(s)
        written += [slot for _, _, slot in marks]
        owned = {base_row(x) for x in written if x >= 0}
        pad_tokens = [t for n, x in enumerate(slots) if x < 0 for t in range(cu[n], cu[n + 1])]
        c.zero("o", o, "tokens of padding sequences (negative slot)", rows=pad_tokens)
        mine = sorted({x for x in written if x >= 0})
        if mine:
            c.close("state_pool[owned slots]", view[mine], ref_args["state_pool"][mine], tol_s)
        c.untouched("state_pool", base_dev, base_before, owned, "pool rows")
        for n, t, slot in marks:
            c.bitwise(f"checkpoint_indices slot {slot} (sequence {n} after {t} tokens)", view[slot],
                      _stopped(case, args, start, cu[n], t, slots[n]), "the same backend's prefill stopped there")
    else:
        if not (isinstance(out, tuple) and len(out) == 2):
            return Outcome("failed", f"dense mode must return (o, final_state), got {type(out).__name__}")
        o, final = out
        c.close("o", o, ro, tol_o)
        c.dtype("o", o, DTYPES[s["dtype"]])
        c.close("final_state", final, rfinal, tol_s)
        want = DTYPES[s["state_dtype"]] if s["mode"] == "dense" else torch.float32
        c.dtype("final_state", final, want)
    c.inputs_unchanged(args, snaps)
    return c.outcome()


def _stopped(case: Case, args: dict, start: torch.Tensor, first: int, t: int, slot: int) -> torch.Tensor:
    """Slot ``slot`` after a prefill of the same backend over the ``t`` tokens from ``first`` alone,
    on a copy of the pool as it was before the call."""
    pool = start.clone()
    cut = {n: args[n][first:first + t] for n in ("q", "k", "v", "g", "beta")}
    idx = args["state_indices"]
    _call(case.op, case.backend, dict(cut, cu_seqlens=torch.tensor([0, t], dtype=idx.dtype, device=idx.device),
                                      state_pool=pool, state_indices=torch.tensor([slot], dtype=idx.dtype,
                                                                                  device=idx.device),
                                      state_layout=args["state_layout"]))
    return pool[slot]


# -- decode ------------------------------------------------------------------------------------------

def _decode_inputs(case: Case, s: dict, device):
    gen = generator(case.id)
    kda = OP_TABLE[case.op].per_channel_gates
    N, T, H, HV, K, V = s["n"], s["t"], s["h"], s["hv"], s["k"], s["v"]
    dt = DTYPES[s["dtype"]]
    q, k, v = qkv(gen, (N, T), H, HV, K, V, dt, s.get("strided", False))
    q, k, opts = _options(s, q, k)
    ashape = (N, T, HV, K) if kda else (N, T, HV)
    dshape = (HV, K) if kda else (HV,)
    if s.get("gates") == "strong":  # softplus(0.5413) = 1, exp(A_log) = 20: g = -20 per token
        a, A_log, dt_bias = torch.full(ashape, 0.5413), torch.full((HV,), math.log(20.0)), torch.zeros(dshape)
    else:
        a, A_log, dt_bias = randn(gen, *ashape), randn(gen, HV) * 0.5, randn(gen, *dshape) * 0.5
    b = randn(gen, N, T, HV)
    if s.get("gates") == "model":  # the raw gates of the family's real model (linattn.testing.gates)
        mg = _model_gates(case, gen, N * T, HV, K)
        a, b, A_log, dt_bias = mg.a.view(ashape), mg.b.view(N, T, HV), mg.A_log, mg.dt_bias
    a, b = a.to(dt), b.to(dt)
    if s.get("strided"):
        a, b = _interleaved(a, b)
    idt = INDEX[s["index_dtype"]]
    indices = torch.tensor(s["table"] if "table" in s else s["slots"], dtype=idt)
    gates = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    if s.get("gate_form"):  # the gating's outputs (fp32); its four inputs None (the reference takes them by name)
        g, beta = _reference("kda_gating" if kda else "gdn_gating")(A_log, a.float(), b.float(), dt_bias)
        gates = dict(dict.fromkeys(gates), g=g.float(), beta=beta.float())
    args = {n: x if x is None else _to_device(x, device)
            for n, x in dict(q=q, k=k, v=v, **gates, state_indices=indices).items()}
    if "out_slots" in s:
        args["output_state_indices"] = _to_device(torch.tensor(s["out_slots"], dtype=idt), device)
    if "fresh" in s:
        args["has_initial_state"] = _to_device(torch.tensor(s["fresh"]), device)
    pool = _pool(gen, s, device)
    args.update(opts, state_pool=pool[0], state_layout=s["layout"])
    inter = None
    if "intermediate" in s:
        steps = T + 2  # a buffer for more steps than this call runs; the op gets a view of T steps
        ibase = states(gen, s["s"], (steps, *_state_shape(s)), DTYPES[s["state_dtype"]])
        ibase_dev = ibase.to(device)
        inter = (ibase_dev, ibase.clone())
        args["intermediate_states"] = ibase_dev[:, :T]
        args["intermediate_state_indices"] = torch.tensor(s["intermediate"], dtype=idt).to(device)
    if s.get("disable_state_update"):
        args["disable_state_update"] = True
    if "num_accepted" in s:
        args["num_accepted_tokens"] = torch.tensor(s["num_accepted"], dtype=idt).to(device)
    if s.get("lower_bound") is not None:
        args["lower_bound"] = s["lower_bound"]
    return args, pool, inter


def _load_slots(s: dict) -> list[int]:
    if "table" not in s:
        return list(s["slots"])
    nat = s.get("num_accepted")
    return [row[max(nat[n] - 1, 0) if nat else 0] for n, row in enumerate(s["table"])]


def _run_decode(case: Case, device) -> Outcome:
    s = case.spec
    args, pool, inter = _decode_inputs(case, s, device)
    snaps = _snapshots(args, skip=("state_pool", "intermediate_states"))
    ref_args = {n: to_float64(x) for n, x in args.items()}  # the index tensors (integers) as they are
    ref_args["state_pool"] = to_float64(pool[0]).contiguous()
    if inter is not None:
        ref_args["intermediate_states"] = to_float64(args["intermediate_states"]).contiguous()
    o = _call(case.op, case.backend, args)
    ro = _reference(case.op)(**ref_args, compute_dtype=torch.float64)
    tol_o, tol_s = tolerances(s["dtype"], s["state_dtype"], phase="decode")
    c = Checker()
    c.close("o", o, ro, tol_o)
    c.dtype("o", o, DTYPES[s["dtype"]])
    load = _load_slots(s)
    padding = [n for n, x in enumerate(load) if x < 0]
    c.zero("o", o, "padding rows (negative slot)", rows=padding)
    view, base_dev, base_before, base_row = pool
    if s.get("disable_state_update"):
        written: set[int] = set()
    elif "table" in s:
        written = {x for n, row in enumerate(s["table"]) if n not in padding for x in row if x >= 0}
    else:  # separate write slots: the read slots stay as they were
        written = {x for x in s.get("out_slots", s["slots"]) if x >= 0}
    if written:
        mine = sorted(written)
        c.close("state_pool[owned slots]", view[mine], ref_args["state_pool"][mine], tol_s)
    c.untouched("state_pool", base_dev, base_before, {base_row(x) for x in written}, "pool rows")
    if inter is not None:
        ibase_dev, ibase_before = inter
        rows = sorted({r for n, r in enumerate(s["intermediate"]) if r >= 0 and n not in padding})
        if rows:
            c.close("intermediate_states[owned rows]", args["intermediate_states"][rows],
                    ref_args["intermediate_states"][rows], tol_s)
        T = s["t"]
        flat_before = ibase_before.reshape(-1, *ibase_before.shape[2:])  # (row, step) pairs
        owned = {r * ibase_before.shape[1] + t for r in rows for t in range(T)}
        c.untouched("intermediate_states", ibase_dev.reshape(flat_before.shape), flat_before, owned,
                    "buffer entries (row * steps + step)")
    c.inputs_unchanged(args, snaps)
    return c.outcome()


# -- gating and SwiGLU ---------------------------------------------------------------------------------

def _gating_inputs(case: Case, s: dict, device):
    gen = generator(case.id)
    kda = OP_TABLE[case.op].per_channel_gates
    lead, HV, K = tuple(s["lead"]), s["hv"], s["k"]
    ashape = (*lead, HV, K) if kda else (*lead, HV)
    dshape = (HV, K) if kda else (HV,)
    dt = DTYPES[s["dtype"]]
    a, b = randn(gen, *ashape), randn(gen, *lead, HV)
    A_log, dt_bias = randn(gen, HV) * 0.5, randn(gen, *dshape) * 0.5
    if s.get("gates") == "extreme":  # F18, one head each: decay 1, softplus above the threshold, decay 0
        A_log[:3] = torch.tensor([100.0, 0.0, 100.0])
        dt_bias.zero_()
        for head, value in ((0, -200.0), (1, 100.0), (2, 1.0)):
            if kda:
                a[..., head, :] = value
            else:
                a[..., head] = value
    args = dict(A_log=A_log.to(device), a=a.to(dt).to(device), b=b.to(dt).to(device), dt_bias=dt_bias.to(device))
    if s.get("lower_bound") is not None:
        args["lower_bound"] = s["lower_bound"]
    args.update({n: s[n] for n in ("softplus_beta", "softplus_threshold") if n in s})
    return args


def _run_gating(case: Case, device) -> Outcome:
    s = case.spec
    args = _gating_inputs(case, s, device)
    snaps = _snapshots(args)
    out = _call(case.op, case.backend, args)
    rg, rb = _reference(case.op)(**{n: to_float64(x) for n, x in args.items()}, compute_dtype=torch.float64)
    c, tol = Checker(), tolerances(s["dtype"], phase="gating")[0]
    if not (isinstance(out, tuple) and len(out) == 2):
        return Outcome("failed", f"{case.op} must return (g, beta), got {type(out).__name__}")
    g, beta = out
    want = torch.float64 if s["dtype"] == "float64" else torch.float32  # fp32 outputs (fp64 in oracle mode)
    for name, x in (("g", g), ("beta", beta)):
        c.dtype(name, x, want)
    if s.get("gates") == "extreme":
        if bool(torch.isnan(g).any()):
            c.fail("g: NaN for extreme inputs (F18)")
        c.close("exp(g)", torch.exp(g.to(torch.float64)), torch.exp(rg), tol)  # -inf and -1000 both mean decay 0
    else:
        c.close("g", g, rg, tol)
    c.close("beta", beta, rb, tol)
    c.inputs_unchanged(args, snaps)
    return c.outcome()


def _run_silu(case: Case, device) -> Outcome:
    s = case.spec
    gen = generator(case.id)
    x = (randn(gen, s["m"], 2 * s["d"]) * 8.0).to(DTYPES[s["dtype"]]).to(device)
    args = dict(x=x, limit=s["limit"])
    snaps = _snapshots(args)
    out = _call(case.op, case.backend, args)
    ref = _reference(case.op)(to_float64(x), s["limit"], compute_dtype=torch.float64)
    c = Checker()
    c.close("out", out, ref, tolerances(s["dtype"], phase="mlp")[0])
    c.dtype("out", out, DTYPES[s["dtype"]])
    c.inputs_unchanged(args, snaps)
    return c.outcome()


#: by the op's backend method (the op table): how a case of that op runs, and how its inputs are built
_RUNNERS: dict[str, Callable] = {"prefill": _run_prefill, "decode": _run_decode, "gating": _run_gating,
                                 "clamp": _run_silu}
_BUILDERS = {"prefill": lambda c, s, d: _prefill_inputs(c, s, d)[0],
             "decode": lambda c, s, d: _decode_inputs(c, s, d)[0],
             "gating": _gating_inputs,
             "clamp": lambda c, s, d: dict(x=torch.zeros(s["m"], 2 * s["d"], dtype=DTYPES[s["dtype"]], device=d),
                                           limit=s["limit"])}


# -- negative and contract cases ---------------------------------------------------------------------

def _run_negative(case: Case, device) -> Outcome:
    s = case.spec
    problem = problem_of(case.op, s["inputs"])
    where = s.get("device") or torch.device(device)  # a profile name, else the real device
    decision = linattn.explain(problem, where, backend=case.backend)
    verdict = decision.verdict(case.backend)
    if decision.chosen is not None or verdict.ok:
        return Outcome("failed", f"{problem.brief()} on {decision.device}: the backend accepted it (rank "
                                 f"{getattr(verdict, 'rank', '?')}) although it does not declare it "
                                 f"({s['expect']}); its predicates must reject what it cannot compute")
    note = f"rejected: [{verdict.reason.value}] {verdict.message}"
    if verdict.reason == Reason.BACKEND_ERROR:
        return Outcome("failed", f"a predicate raised instead of rejecting: {verdict.message}")
    if not s.get("run"):
        return Outcome("passed", note)
    args = _BUILDERS[OP_TABLE[case.op].method](case, s["inputs"], device)
    snaps = _snapshots(args)
    try:
        getattr(linattn, case.op)(**args, backend=case.backend)
    except NoBackendError:
        c = Checker()
        c.inputs_unchanged(args, snaps)  # the pool included: nothing may be touched
        out = c.outcome()
        return Outcome(out.status, out.message or note)
    except Exception as e:  # noqa: BLE001
        return Outcome("failed", f"a forced call raised {type(e).__name__}: {e} (expected NoBackendError)")
    return Outcome("failed", "a forced call ran although explain() rejects it: it must raise NoBackendError")


def _run_contract(case: Case, device) -> Outcome:
    """Program-id contract of one Triton kernel: the probe (same ``decode_pid`` helper, same plan)
    visits every work item exactly once in each of the kernel's layouts."""
    try:
        from linattn.kernels.grid import plan_grid
        from linattn.kernels.triton import registry
        from linattn.kernels.triton.probe import probe_visits
    except ImportError as e:
        return Outcome("skipped", f"the Triton kernel registry is not importable here ({e})")
    name = case.spec["kernel"]
    entry = next((e for e in registry.KERNELS if e.name == name), None)
    if entry is None:
        return Outcome("failed", f"kernel {name!r} is not in linattn.kernels.triton.registry.KERNELS, so the "
                                 f"program-id contract does not cover it; register it there")
    try:
        entry.load_kernel(), entry.load_launcher()
    except Exception as e:  # noqa: BLE001
        return Outcome("failed", f"kernel {name!r}: cannot load {entry.kernel} / {entry.launcher}: {e}")
    if not entry.layouts:
        return Outcome("passed", f"grid not planned: {entry.why_unplanned}")
    from linattn.capabilities import profile

    caps = {"split": profile("sm90"), "folded": profile("mi300x")}
    run_on = device if torch.device(device).type != "cpu" or _interpreting() else None
    if run_on is None:
        return Outcome("skipped", "needs a GPU or TRITON_INTERPRET=1 to launch the probe kernel")
    for layout in entry.layouts:
        for work in ((3, 4, 2), (1, 1, 1), (5, 2, 3)):
            plan = plan_grid(*work, caps[layout], layout)
            counts, overflow = probe_visits(plan, device=run_on)
            if overflow or not bool((counts == 1).all()):
                return Outcome("failed", f"{name}/{layout}: work {work} not visited exactly once "
                                         f"(visits {sorted(set(counts.flatten().tolist()))}, {overflow} out of range)")
    return Outcome("passed")


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def execute(case: Case, device="cpu") -> Outcome:
    """Run one case on ``device`` (a torch device or string); never raises for a backend's fault.

    Returns:
        :class:`Outcome`: ``passed``; ``failed`` with every failed check in ``message``;
        ``skipped`` when the backend's predicates decline a declared case (the reason is given).
    """
    if case.kind == "negative":
        return _run_negative(case, device)
    if case.kind == "contract":
        return _run_contract(case, device)
    try:
        return _RUNNERS[OP_TABLE[case.op].method](case, device)
    except _Declined as d:
        if d.reason == Reason.BACKEND_ERROR.value:
            return Outcome("failed", f"declined with backend_error: {d.message}")
        return Outcome("skipped", f"declined by its predicates: [{d.reason}] {d.message}")
    except linattn.BackendRunError as e:
        return Outcome("failed", f"raised while running: {e.__cause__!r}" if e.__cause__ else str(e))
    except Exception as e:  # noqa: BLE001 - a backend's exception is a failed case, not a crashed suite
        return Outcome("failed", f"raised {type(e).__name__}: {e}")
