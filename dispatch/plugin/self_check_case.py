"""The default first-call self-check: a small case of a shape class against the float64 reference.

What :meth:`~linattn.backends.base.Backend.self_check` and
:meth:`~linattn.backends.base.Backend.self_check_class` do unless a backend overrides them:
:func:`kernel_class` names the shape class (what the built-in kernels specialise on) and
:func:`check_against_reference` runs a small case of it through the backend and compares it with
the reference maths (:mod:`linattn.reference`, torch-ref's functions) in float64. The dispatcher's
self-check runtime (``dispatch/runtime/self_check.py``: when a check runs, once per key, the verdicts, the
log) calls the backend's methods and re-exports these two.

A plugin API module (``tests/test_layering.py``): backends import it, so it imports only the plugin
API (:class:`~linattn.dispatch.plugin.problem.Problem`, the verdicts), the rules (the op table, the
validation layer) and
the base layer (the reference maths, :mod:`linattn.testing.inputs`' seeded cases and
:mod:`linattn.testing.compare`'s comparison at docs/ops.md's tolerances), never the runtime.
"""

from __future__ import annotations

import torch

import linattn.reference as reference_maths
from linattn.testing import inputs
from linattn.testing.compare import Comparison, tolerance_for
from linattn.testing.inputs import (DECODE_INTERMEDIATE, PREFILL_CHECKPOINTS_WRITTEN, PREFILL_LENS, PREFILL_OUT_SLOTS,
                                    PREFILL_SLOTS)

from ..rules.ops_table import FLAGS
from .problem import Problem
from .verdict import Check, Reason

__all__ = ["check_against_reference", "kernel_class", "reference"]


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
    flags = [f.name for f in FLAGS if getattr(p, f.name)]  # the op table's flags, in Problem's order
    mode = f" {p.mode}" if p.phase == "prefill" else ""
    return (f"{p.dtype} state={p.state_dtype}/{p.state_layout}{mode} H={p.h} HV={p.hv} K={p.k} V={p.v}"
            + "".join(f" {f}" for f in flags))


def reference(op: str):
    """The float64 reference function of ``op``: ``<op>_ref`` of :mod:`linattn.reference` (the
    functions torch-ref runs and re-exports)."""
    return getattr(reference_maths, f"{op}_ref")


def _gen(p: Problem) -> torch.Generator:
    """The case's generator, seeded by ``"op|shape class"``."""
    return inputs.generator(f"{p.op}|{kernel_class(p)}")


def _as_check(c: Comparison) -> Check:
    if not c.ok:
        return Check.failed(Reason.SELF_CHECK_FAILED, c.message())
    return Check.passed(c.summary())


def check_against_reference(backend, p: Problem, device) -> Check:
    """The default :meth:`~linattn.backends.base.Backend.self_check`: a small case of ``p``'s shape
    class through ``backend.run`` on ``device``, against the reference maths (torch-ref's) in float64
    on the CPU.

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
    from ..rules.validate import validate

    device = torch.device(device)
    tensors, opts = inputs.CASES[p.phase](p, _gen(p), device)
    args = {**tensors, **opts}
    ref_args = {n: inputs.to_float64(x) for n, x in args.items()}
    before = {n: x.detach().cpu().clone() for n, x in tensors.items() if n in ("state_pool", "intermediate_states")}
    nargs, _ = validate(p.op, args, check_values=True)
    out = backend.run(p.op, **nargs)
    ref = reference(p.op)  # the reference maths (linattn.reference), below every layer
    c = Comparison()
    tol_o, tol_s = tolerance_for(p)
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
            c.untouched("state_pool", args["state_pool"], before["state_pool"], set(owned), "pool rows")
        elif final is None:
            c.fail("dense mode returned no final state")
        else:
            c.close("final_state", final, rfinal, tol_s)
    elif p.phase == "decode":
        ro = ref(**ref_args, compute_dtype=torch.float64)
        c.close("o", out, ro, tol_o)
        owned, padding = inputs.decode_rows(tensors, opts)
        c.zero("o", out[padding], "padding rows (slot -1)")
        if owned:
            rows = sorted(owned)
            c.close("state", args["state_pool"][rows], ref_args["state_pool"][rows], tol_s)
        c.untouched("state_pool", args["state_pool"], before["state_pool"], owned, "pool rows")
        if p.intermediate_states:
            rows = sorted({r for n, r in enumerate(DECODE_INTERMEDIATE) if r >= 0 and n not in padding})
            c.close("intermediate_states", args["intermediate_states"][rows], ref_args["intermediate_states"][rows],
                    tol_s)
    elif p.phase == "gating":
        rg, rb = ref(**ref_args, compute_dtype=torch.float64)
        g, beta = out
        c.close("g", g, rg, tol_o)
        c.close("beta", beta, rb, tol_o)
    else:
        ref_out = ref(ref_args["x"], ref_args["limit"], compute_dtype=torch.float64)
        c.close("out", out, ref_out, tol_o)
    return _as_check(c)
