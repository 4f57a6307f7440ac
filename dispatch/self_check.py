"""First-call self-checks: a backend proves itself on an architecture its kernels never ran on.

A backend declares the architectures its kernels were verified on
(:attr:`~linattn.backends.base.Backend.verified_archs`). On any other GPU arch the dispatcher runs,
before the first user call the backend would take, a small case of the same kernel class through
the backend and compares it with torch-ref in float64 (:func:`check_against_reference`):

- **once** per process and key ``(backend, arch, op, shape class)``; the shape class is what the
  kernels specialise on (:meth:`~linattn.backends.base.Backend.self_check_class`, default
  :func:`kernel_class`: dtypes, state layout, mode, head counts and dims, flags; never N or T);
- **eagerly only**: the check syncs with the device, so during CUDA-graph capture an unchecked
  backend is not chosen (reason ``unverified``: run one eager call before capture);
- a mismatch or an exception **disables** the backend for that key (reason
  ``self_check_failed``, a WARNING on the ``linattn`` logger); the dispatcher falls back to the
  next backend, and ``explain`` says why;
- until it has run, ``explain`` marks the verdict ``verified=False`` with a note.

Inputs are made on the CPU from a generator seeded by the key (the global RNG is not touched),
moved to the call's device, validated like a user call (``dispatch/validate.py``) and run under
``torch.no_grad()``; the reference runs on float64 CPU copies. Tolerances are docs/ops.md's: 1e-5 with
fp32 inputs and state, else 2e-2 on outputs and 1e-2 on states; pool rows the case does not own
must stay bitwise unchanged and padding outputs exactly zero.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from .problem import Problem
from .verdict import Accepted, Check, Reason, Rejected

log = logging.getLogger("linattn")

# The small cases (chunk C = 64 for the chunked prefill). Prefill: an empty sequence that owns a
# slot (its state must come back unchanged), one token, one chunk + 1, two chunks + 2, and a
# padding sequence with tokens (slot -1: zero output, nothing read or written). Rows 2, 4, 5, 7
# of the pool are never named and must stay bitwise unchanged.
PREFILL_LENS = (0, 1, 65, 130, 7)
PREFILL_SLOTS = (1, 6, 0, 3, -1)
PREFILL_P = 8
# Decode: five rows, two of them padding; with a per-token table (``num_accepted_tokens``) the
# state after token t goes to table[n, t]; intermediate states land in rows of a larger buffer.
DECODE_SLOTS = (4, -1, 0, 6, -1)
DECODE_P = 8
DECODE_TABLE = ((4, 1, 2), (-1, -1, -1), (0, 3, 3), (6, 5, 7), (-1, -1, -1))
DECODE_NUM_ACCEPTED = (2, 0, 3, 1, 0)
DECODE_TABLE_P = 10
DECODE_INTERMEDIATE = (2, -1, 0, 5, -1)
DECODE_S = 6
HAS_INITIAL_STATE = (True, False, True, False, True)  # prefill sequences / decode rows (False: fresh)
# output_state_indices: the final states go to other slots than the read ones (one sequence in place:
# prefill's empty sequence 0 copies slot 1 into slot 2); the read slots must stay bitwise unchanged
PREFILL_OUT_SLOTS = (2, 6, 4, 5, -1)
DECODE_OUT_SLOTS = (1, -1, 0, 5, -1)
# checkpoints (prefill, every 64 tokens): in five rows added after the pool's PREFILL_P (so they
# combine with output_state_indices): the 65-token sequence's after 64 tokens, the 130-token one's
# after 64 and 128; the 1-token and the padding sequence name slots that must not be written
PREFILL_CHECKPOINT_EVERY = 64
PREFILL_CHECKPOINTS = ((-1, -1), (PREFILL_P + 3, -1), (PREFILL_P, -1), (PREFILL_P + 1, PREFILL_P + 2),
                       (PREFILL_P + 4, -1))
PREFILL_CHECKPOINTS_WRITTEN = (PREFILL_P, PREFILL_P + 1, PREFILL_P + 2)
GATING_ROWS = 7
CLAMP_ROWS = 5
FULL_PRECISION = ("float32", "float64")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class SelfCheckResult(BaseModel):
    """What one self-check found: the key it stands for, ``ok``, and the measured errors or failure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    arch: str
    op: str
    shape_class: str
    ok: bool
    message: str
    device: str
    seconds: float


def kernel_class(p: Problem) -> str:
    """The default shape class of ``p``: what the built-in kernels specialise on, as one line.

    Decode and prefill: q/k/v dtype, state dtype and layout, prefill mode, ``H``, ``HV``, ``K``,
    ``V`` and the optional features; gating: dtype, ``HV`` (and ``K`` for KDA), the bounded gate;
    the clamp: dtype, ``D``, whether a limit is given. Never ``N`` or ``T`` (runtime sizes).

    Example:
        >>> kernel_class(Problem(op="gdn_prefill", n=4, t=8192, h=16, hv=32, k=128, v=128))
        'bfloat16 state=float32/vk pool H=16 HV=32 K=128 V=128'
    """
    if p.spec.method == "clamp":
        return f"{p.dtype} D={p.d}" + (" limit" if p.clamp_limit else "")
    if p.phase == "gating":
        return f"{p.dtype} HV={p.hv}" + (f" K={p.k}" if p.spec.per_channel_gates else "") + (
            " lower_bound" if p.lower_bound else "")
    flags = [name for name in ("intermediate_states", "num_accepted_tokens", "disable_state_update", "lower_bound",
                               "precomputed_gates", "has_initial_state", "output_state_indices", "checkpoints")
             if getattr(p, name)]
    mode = f" {p.mode}" if p.phase == "prefill" else ""
    return (f"{p.dtype} state={p.state_dtype}/{p.state_layout}{mode} H={p.h} HV={p.hv} K={p.k} V={p.v}"
            + "".join(f" {f}" for f in flags))


# -- state: one log of results per dispatcher ---------------------------------------------------

def key_for(backend, p: Problem, caps) -> tuple[str, str, str, str]:
    """``(backend name, arch, op, shape class)``: what one self-check stands for."""
    return backend.name, caps.arch, p.op, backend.self_check_class(p)


class SelfChecks:
    """The self-checks one dispatcher ran: their results by key, and the ones running now.

    The dispatcher (``dispatch/selection.py``) owns one; its ``clear_cache`` resets it. Thread
    safe; re-entrant, since a backend's ``self_check`` may itself call a public op.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._results: dict[tuple[str, str, str, str], SelfCheckResult] = {}
        self._running: set[tuple[str, str, str, str]] = set()

    def result_for(self, key: tuple) -> Optional[SelfCheckResult]:
        """The recorded result for ``key``, or None when no self-check ran for it."""
        return self._results.get(key)

    def results(self) -> list[SelfCheckResult]:
        """Every self-check that ran, in the order they ran."""
        return list(self._results.values())

    def reset(self) -> None:
        """Forget every result (a later call checks again)."""
        with self._lock:
            self._results.clear()

    def run(self, backend, p: Problem, caps, device: torch.device) -> SelfCheckResult:
        """Run ``backend.self_check`` for ``p``'s key once (later calls return the recorded result).

        Args:
            backend: the backend instance.
            p: the problem of the call about to run (its shape class is checked, at small sizes).
            caps: the call's device capabilities (their ``arch`` is part of the key).
            device: the ``torch.device`` the case runs on (the call's).
        Returns:
            SelfCheckResult. A failure (a mismatch, or anything raised) is logged as a WARNING on
            the ``linattn`` logger; the backend is rejected with ``self_check_failed`` for that key
            from then on.
        """
        key = key_for(backend, p, caps)
        with self._lock:
            done = self._results.get(key)
            if done is not None:
                return done
            if key in self._running:  # the check calls its own op: let that inner call run, record nothing
                return SelfCheckResult(backend=key[0], arch=key[1], op=key[2], shape_class=key[3], ok=True,
                                       message="inside its own self-check", device=str(device), seconds=0.0)
            self._running.add(key)
            try:
                res = _timed_check(backend, p, caps, device, key)
            finally:
                self._running.discard(key)
            self._results[key] = res
        _log(res)
        return res

    def verdict_for(self, backend, p: Problem, caps, accepted: Accepted, capturing: bool):
        """``accepted`` as it stands after verification: unchanged where no self-check applies;
        ``verified=False`` with a note before the check has run (eager); rejected with
        ``unverified`` during CUDA-graph capture; rejected with ``self_check_failed`` after a
        failed check."""
        if not backend.needs_self_check(p, caps):
            return accepted
        key = key_for(backend, p, caps)
        return _verdict(backend, p, caps, accepted, capturing, key, self._results.get(key))


def _joined(note: str, plan_note: str) -> str:
    """The verification note, then the backend's own plan note (``Backend.plan_note``) if any."""
    return f"{note}; {plan_note}" if plan_note else note


def _timed_check(backend, p: Problem, caps, device, key: tuple) -> SelfCheckResult:
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            check = backend.self_check(p, caps, device)
        if not isinstance(check, Check):
            raise TypeError(f"self_check returned {type(check).__name__}, not a linattn.dispatch.Check")
        ok, message = check.ok, check.message
    except Exception as e:  # noqa: BLE001 - a raising check is a failed check, never a crashed call
        ok, message = False, f"raised {type(e).__name__}: {e}"
    return SelfCheckResult(backend=key[0], arch=key[1], op=key[2], shape_class=key[3], ok=ok,
                           message=message or ("passed" if ok else "failed"), device=str(device),
                           seconds=round(time.perf_counter() - t0, 4))


def _log(res: SelfCheckResult) -> None:
    if res.ok:
        log.info("linattn: %s passed its self-check against torch-ref on %s (%s, %s) in %.2f s: %s",
                 res.backend, res.arch, res.op, res.shape_class, res.seconds, res.message)
    else:
        log.warning("linattn: %s failed its self-check against torch-ref on %s (%s, %s): %s. It is disabled "
                    "for this shape class on %s in this process (reason self_check_failed); the dispatcher "
                    "falls back to the next backend. Please report this to the backend's authors.",
                    res.backend, res.arch, res.op, res.shape_class, res.message, res.arch)


# -- the process's log (the default dispatcher's), for callers that ask this module ----------------

def results() -> list[SelfCheckResult]:
    """Every self-check the default dispatcher ran in this process, in the order they ran."""
    return _default_log().results()


def result_for(key: tuple) -> Optional[SelfCheckResult]:
    """The default dispatcher's recorded result for ``key``, or None."""
    return _default_log().result_for(key)


def reset() -> None:
    """Forget the default dispatcher's results (``linattn.dispatch.clear_cache`` does this)."""
    _default_log().reset()


def _default_log() -> SelfChecks:
    from .selection import dispatcher  # the dispatcher owns the log; it imports this module

    return dispatcher().self_checks


# -- the verdict --------------------------------------------------------------------------------

def _archs(backend) -> str:
    return "{" + ", ".join(sorted(backend.verified_archs or ())) + "}"


def _verdict(backend, p: Problem, caps, accepted: Accepted, capturing: bool, key: tuple,
             res: Optional[SelfCheckResult]):
    arch, cls = caps.arch, key[3]
    if res is None:
        if capturing:
            return Rejected(backend=backend.name, reason=Reason.UNVERIFIED,
                            message=f"not yet self-checked on {arch} for {p.op} ({cls}); its kernels were "
                                    f"verified on {_archs(backend)} only and the self-check needs a device "
                                    f"sync, which CUDA-graph capture forbids",
                            hint="run one eager call of this shape before capture (a warm-up step); it "
                                 "self-checks then and is chosen in later captures")
        return accepted.model_copy(update={
            "verified": False,
            "message": _joined(f"unverified on {arch}: self-checks against torch-ref on its first eager call "
                               f"({p.op}, {cls}); verified on {_archs(backend)}", accepted.message)})
    if res.ok:
        return accepted.model_copy(update={
            "verified": True,
            "message": _joined(f"self-checked against torch-ref on {arch} in this process ({p.op}, {cls}): "
                               f"{res.message}", accepted.message)})
    return Rejected(backend=backend.name, reason=Reason.SELF_CHECK_FAILED,
                    message=f"its self-check against torch-ref failed on {arch} for {p.op} ({cls}): {res.message}",
                    hint=f"disabled for this shape class on {arch} until the process restarts; the dispatcher "
                         f"falls back. Report it to the backend's authors (plugin {backend.plugin!r})")


# -- the default check ---------------------------------------------------------------------------

def tolerances(dtype: str, state_dtype: str) -> tuple[float, float]:
    """``(output, state)`` relative tolerances against float64 (docs/ops.md "Tolerances")."""
    if dtype in FULL_PRECISION and state_dtype in FULL_PRECISION:
        return 1e-5, 1e-5
    return 2e-2, 1e-2


class _Compare:
    """Collects what differs between the backend's results and the reference's."""

    def __init__(self):
        self.failures: list[str] = []
        self.errors: dict[str, float] = {}

    def close(self, name: str, x: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
        x = x.detach().to("cpu", torch.float64)
        if tuple(x.shape) != tuple(ref.shape):
            self.failures.append(f"{name}: shape {tuple(x.shape)}, reference {tuple(ref.shape)}")
            return
        if not bool(torch.isfinite(x).all()):
            self.failures.append(f"{name}: not finite")
            return
        den, num = float(ref.norm()), float((x - ref).norm())
        err = num / den if den > 0 else num
        self.errors[name] = err
        if not err <= tol:
            self.failures.append(f"{name}: relative error {err:.2e} > {tol:.0e}")

    def zero(self, name: str, x: torch.Tensor, what: str) -> None:
        if x.numel() and bool((x.detach().cpu() != 0).any()):
            self.failures.append(f"{name}: {what} must be exactly zero")

    def untouched(self, after: torch.Tensor, before: torch.Tensor, owned) -> None:
        after = after.detach().cpu()
        changed = [i for i in range(before.shape[0]) if i not in owned and not torch.equal(after[i], before[i])]
        if changed:
            self.failures.append(f"pool rows {changed} changed although the case does not name them")

    def check(self) -> Check:
        if self.failures:
            return Check.failed(Reason.SELF_CHECK_FAILED, "; ".join(self.failures))
        return Check.passed(", ".join(f"{k} {v:.1e}" for k, v in self.errors.items()) or "passed")


def _gen(p: Problem) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{p.op}|{kernel_class(p)}".encode()))


def _state_shape(p: Problem) -> tuple[int, int, int]:
    return (p.hv, p.v, p.k) if p.state_layout == "vk" else (p.hv, p.k, p.v)


def _f64(x):
    return x.detach().to("cpu", torch.float64, copy=True) if isinstance(x, torch.Tensor) and x.is_floating_point() \
        else (x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x)


def _prefill_case(p: Problem, gen, device):
    dt, sdt = _DTYPES[p.dtype], _DTYPES[p.state_dtype]
    kda = p.spec.per_channel_gates
    T = sum(PREFILL_LENS)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = dict(q=r(T, p.h, p.k).to(dt), k=r(T, p.h, p.k).to(dt), v=r(T, p.hv, p.v).to(dt),
                g=-(torch.rand((T, p.hv, p.k) if kda else (T, p.hv), generator=gen) * 0.5 + 0.01),
                beta=torch.rand(T, p.hv, generator=gen) * 0.9 + 0.05,
                cu_seqlens=torch.tensor([0, *torch.tensor(PREFILL_LENS).cumsum(0).tolist()], dtype=torch.int32))
    if p.mode == "pool":
        args["state_pool"] = (r(PREFILL_P, *_state_shape(p)) * 0.5).to(sdt)
        args["state_indices"] = torch.tensor(PREFILL_SLOTS, dtype=torch.int32)
    else:
        args["initial_state"] = (r(len(PREFILL_LENS), *_state_shape(p)) * 0.5).to(sdt)
    if p.has_initial_state and p.mode == "pool":  # fresh sequences start from zeros, slot unread
        args["has_initial_state"] = torch.tensor(HAS_INITIAL_STATE[:len(PREFILL_LENS)])
    if p.output_state_indices and p.mode == "pool":
        args["output_state_indices"] = torch.tensor(PREFILL_OUT_SLOTS, dtype=torch.int32)
    opts = dict(state_layout=p.state_layout)
    if p.checkpoints and p.mode == "pool":
        args["state_pool"] = torch.cat([args["state_pool"], (r(5, *_state_shape(p)) * 0.5).to(sdt)])
        args["checkpoint_indices"] = torch.tensor(PREFILL_CHECKPOINTS, dtype=torch.int32)
        opts["checkpoint_every"] = PREFILL_CHECKPOINT_EVERY
    return {n: x.to(device) for n, x in args.items()}, opts


def _decode_case(p: Problem, gen, device):
    dt, sdt = _DTYPES[p.dtype], _DTYPES[p.state_dtype]
    kda = p.spec.per_channel_gates
    T = min(max(p.t, 1), 3)
    N = len(DECODE_SLOTS)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = dict(q=r(N, T, p.h, p.k).to(dt), k=r(N, T, p.h, p.k).to(dt), v=r(N, T, p.hv, p.v).to(dt),
                a=r(*((N, T, p.hv, p.k) if kda else (N, T, p.hv))).to(dt), b=r(N, T, p.hv).to(dt),
                A_log=r(p.hv) * 0.5, dt_bias=r(*((p.hv, p.k) if kda else (p.hv,))) * 0.5)
    if p.num_accepted_tokens:
        args["state_pool"] = (r(DECODE_TABLE_P, *_state_shape(p)) * 0.5).to(sdt)
        args["state_indices"] = torch.tensor([row[:T] for row in DECODE_TABLE], dtype=torch.int32)
        args["num_accepted_tokens"] = torch.tensor([min(x, T) for x in DECODE_NUM_ACCEPTED], dtype=torch.int32)
    else:
        args["state_pool"] = (r(DECODE_P, *_state_shape(p)) * 0.5).to(sdt)
        args["state_indices"] = torch.tensor(DECODE_SLOTS, dtype=torch.int32)
    if p.intermediate_states:
        args["intermediate_states"] = (r(DECODE_S, T, *_state_shape(p)) * 0.5).to(sdt)
        args["intermediate_state_indices"] = torch.tensor(DECODE_INTERMEDIATE, dtype=torch.int32)
    opts = dict(state_layout=p.state_layout, disable_state_update=p.disable_state_update)
    if p.lower_bound:
        opts["lower_bound"] = -5.0
    if p.has_initial_state:
        args["has_initial_state"] = torch.tensor(HAS_INITIAL_STATE[:N])
    if p.output_state_indices and not p.num_accepted_tokens:  # [N] slots only (the table names its own)
        args["output_state_indices"] = torch.tensor(DECODE_OUT_SLOTS, dtype=torch.int32)
    if p.precomputed_gates:  # the gates as the gating op gives them; the bound goes into the gating
        from linattn.backends.torch_ref import gdn_gating_ref, kda_gating_ref

        lb = opts.pop("lower_bound", None)
        gate = kda_gating_ref if kda else gdn_gating_ref
        g, beta = gate(args["A_log"], args["a"], args["b"], args["dt_bias"], *((lb,) if kda else ()))
        args.update(g=g, beta=beta, a=None, b=None, A_log=None, dt_bias=None)
    return {n: (x.to(device) if x is not None else None) for n, x in args.items()}, opts


def _gating_case(p: Problem, gen, device):
    dt = _DTYPES[p.dtype]
    kda = p.spec.per_channel_gates
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = dict(A_log=r(p.hv) * 0.5, a=r(*((GATING_ROWS, p.hv, p.k) if kda else (GATING_ROWS, p.hv))).to(dt),
                b=r(GATING_ROWS, p.hv).to(dt), dt_bias=r(*((p.hv, p.k) if kda else (p.hv,))) * 0.5)
    return {n: x.to(device) for n, x in args.items()}, ({"lower_bound": -5.0} if p.lower_bound else {})


def _clamp_case(p: Problem, gen, device):
    x = (torch.randn(CLAMP_ROWS, 2 * p.d, generator=gen) * 8.0).to(_DTYPES[p.dtype])
    return {"x": x.to(device)}, {"limit": 10.0 if p.clamp_limit else None}


def _owned_decode(args: dict, opts: dict) -> tuple[set, list]:
    """(pool rows the case writes, rows that are padding)."""
    idx = args["state_indices"].tolist()
    if args.get("num_accepted_tokens") is not None:
        nat = args["num_accepted_tokens"].tolist()
        load = [row[max(n - 1, 0)] for row, n in zip(idx, nat)]
    else:
        load = [row[0] if isinstance(row, list) else row for row in idx]
    padding = [n for n, s in enumerate(load) if s < 0]
    if opts.get("disable_state_update"):
        return set(), padding
    if isinstance(idx[0], list):
        return {s for n, row in enumerate(idx) if n not in padding for s in row if s >= 0}, padding
    if args.get("output_state_indices") is not None:  # separate write slots: the read slots stay as they were
        idx = args["output_state_indices"].tolist()
    return {s for s in idx if s >= 0}, padding


def check_against_reference(backend, p: Problem, device) -> Check:
    """The default :meth:`~linattn.backends.base.Backend.self_check`: a small case of ``p``'s shape
    class through ``backend.run`` on ``device``, against torch-ref in float64 on the CPU.

    Args:
        backend: the backend under test.
        p: the problem whose shape class is checked (dtypes, layout, mode, heads, flags; small sizes).
        device: a ``torch.device`` (or string) to run the backend on.
    Returns:
        Check: passed with the measured relative errors, or failed (reason ``self_check_failed``)
        naming every difference (errors beyond docs/ops.md's tolerances, non-finite values, padding not
        zero, pool rows not owned by the case changed).
    Raises:
        whatever the backend raises (the caller records it as a failure).
    Example:
        >>> from linattn.backends.torch_ref import TorchRefBackend
        >>> p = Problem(op="gdn_decode", n=1, t=1, h=1, hv=2, k=8, v=8, dtype="float32")
        >>> check_against_reference(TorchRefBackend(), p, "cpu").ok
        True
    """
    from linattn.backends import torch_ref

    from .validate import validate

    device = torch.device(device)
    gen = _gen(p)
    build = {"prefill": _prefill_case, "decode": _decode_case, "gating": _gating_case, "mlp": _clamp_case}[p.phase]
    tensors, opts = build(p, gen, device)
    args = {**tensors, **opts}
    ref_args = {n: _f64(x) for n, x in args.items()}
    before = {n: x.detach().cpu().clone() for n, x in tensors.items() if n in ("state_pool", "intermediate_states")}
    nargs, _ = validate(p.op, args, check_values=True)
    out = backend.run(p.op, **nargs)
    ref = getattr(torch_ref, f"{p.op}_ref")
    c = _Compare()
    tol_o, tol_s = tolerances(p.dtype, p.state_dtype)
    if p.phase == "prefill":
        ro, rfinal = ref(**ref_args, compute_dtype=torch.float64)
        o, final = out if isinstance(out, tuple) else (out, None)
        c.close("o", o, ro, tol_o)
        cu = [0, *torch.tensor(PREFILL_LENS).cumsum(0).tolist()]
        if p.mode == "pool":
            pad = [t for n, s in enumerate(PREFILL_SLOTS) if s < 0 for t in range(cu[n], cu[n + 1])]
            c.zero("o", o[pad], "tokens of the padding sequence (slot -1)")
            written = PREFILL_OUT_SLOTS if p.output_state_indices else PREFILL_SLOTS
            written += PREFILL_CHECKPOINTS_WRITTEN if p.checkpoints else ()
            owned = sorted({s for s in written if s >= 0})
            c.close("state", args["state_pool"][owned], ref_args["state_pool"][owned], tol_s)
            c.untouched(args["state_pool"], before["state_pool"], set(owned))
        elif final is None:
            c.failures.append("dense mode returned no final state")
        else:
            c.close("final_state", final, rfinal, tol_s)
    elif p.phase == "decode":
        ro = ref(**ref_args, compute_dtype=torch.float64)
        c.close("o", out, ro, tol_o)
        owned, padding = _owned_decode(tensors, opts)
        c.zero("o", out[padding], "padding rows (slot -1)")
        if owned:
            rows = sorted(owned)
            c.close("state", args["state_pool"][rows], ref_args["state_pool"][rows], tol_s)
        c.untouched(args["state_pool"], before["state_pool"], owned)
        if p.intermediate_states:
            rows = sorted({r for n, r in enumerate(DECODE_INTERMEDIATE) if r >= 0 and n not in padding})
            c.close("intermediate_states", args["intermediate_states"][rows], ref_args["intermediate_states"][rows],
                    tol_s)
    elif p.phase == "gating":
        rg, rb = ref(**ref_args, compute_dtype=torch.float64)
        g, beta = out
        c.close("g", g, rg, 1e-5)
        c.close("beta", beta, rb, 1e-5)
    else:
        ref_out = ref(ref_args["x"], ref_args["limit"], compute_dtype=torch.float64)
        c.close("out", out, ref_out, 1e-5 if p.dtype in FULL_PRECISION else 1e-2)
    return c.check()
