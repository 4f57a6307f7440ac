"""The documents behind ``linattn report``, ``explain``, ``backends`` and ``plugins``: plain dicts, no printing.

Each builder returns the one document a command prints; ``linattn/cli.py`` renders it as rich
tables or, with ``--json``, dumps it as is. So a script that imports these functions sees the
same data as ``linattn <command> --json``::

    >>> from linattn.report import problem_for, build_report
    >>> problem_for("gdn_decode", "qwen3-next", batch=4096).brief()
    'N=4096 T=1 H=16 HV=32 K=128 V=128 bfloat16 state=float32/vk mode=pool'
    >>> sorted(build_report("sm90"))[:3]
    ['backends', 'device', 'ops']

Problems are built from the model presets (``linattn/presets.toml``) with the same fields the
validation layer derives from a real call (``dispatch/validate.py``), so ``explain`` answers
exactly what a call of that shape would get.
"""

from __future__ import annotations

from typing import Optional

import linattn
from linattn.dispatch import resolve_device
from linattn.dispatch.problem import OPS, Problem

#: The preset each op family uses in ``report`` (and ``explain`` without ``--model``).
FAMILY_PRESET = {"gdn": "qwen3-next", "kda": "kimi-linear", "swiglu": "deepseek-v4"}
#: Decode batch sizes and prefill token counts of the ``report`` sweep.
SWEEP_BATCHES = (1, 16, 256, 4096, 65536)
SWEEP_TOKENS = (256, 1024, 4096, 16384, 65536)
#: Sweep prefill rows pack their tokens into sequences of at most this many tokens.
SWEEP_SEQ_TOKENS = 4096
#: The representative problem of each op in ``report``.
REPORT_DECODE_BATCH = 64
REPORT_PREFILL_TOKENS = 8192
REPORT_PREFILL_SEQS = 4


class UsageError(Exception):
    """A bad argument: printed (as JSON with --json) and exit code 2."""


# -- targets and problems --------------------------------------------------------------------------

def op_family(op: str) -> str:
    """``gdn``, ``kda`` or ``swiglu`` (the preset family an op belongs to)."""
    return "swiglu" if op == "silu_and_mul_clamp" else op.split("_")[0]


def registered_backends() -> dict:
    """Backends by name, from the registry (as ``linattn.list_backends()``)."""
    return linattn.list_backends()


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``: what ``report``, ``explain`` and ``demo`` probe."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_target(profile: Optional[str]):
    """Capabilities of the named profile, or of the probed default device.

    Args:
        profile: a profile name (``sm90``, ``cpu``, ... see ``linattn.capabilities.PROFILES``),
            or None to probe :func:`default_device`.
    Returns:
        DeviceCapabilities.
    Raises:
        UsageError: an unknown profile name (the message lists the known ones).
    """
    from linattn.capabilities import PROFILES

    if profile is not None:
        if profile not in PROFILES:
            raise UsageError(f"unknown device profile {profile!r}; known profiles: {', '.join(sorted(PROFILES))}")
        from linattn.capabilities import profile as named_profile

        return named_profile(profile)
    return resolve_device(default_device())


def problem_for(op: str, model: str, *, batch: int = 1, tokens: Optional[int] = None, seqs: Optional[int] = None,
                dtype: str = "bfloat16", state_dtype: str = "float32", layout: str = "vk",
                mode: str = "pool") -> Problem:
    """The :class:`Problem` a call of ``op`` at a model preset's shapes would produce.

    Fields follow the validation layer (``dispatch/validate.py``):

    - decode: ``n = batch`` rows, ``t = tokens`` per row (1 = plain decode, > 1 = speculative verify);
    - prefill: ``t = tokens`` packed tokens in ``n = seqs`` sequences (``max_seqlen = t`` when one);
    - gating: ``n = tokens`` (or ``batch``) rows of gates;
    - ``silu_and_mul_clamp``: ``M = tokens`` (or ``batch``) rows of width ``D`` from the preset.

    Args:
        op: an op name (see ``linattn.dispatch.OPS``).
        model: a preset name whose family matches the op (``qwen3-next`` for GDN ops, ...).
        batch, tokens, seqs: sizes as above (``seqs`` defaults to 1).
        dtype, state_dtype, layout, mode: q/k/v dtype, pool dtype, pool layout, prefill mode.
    Returns:
        Problem.
    Raises:
        UsageError: an unknown op or model, a model of another family, a bad size, or a size
            that does not apply to the op (``batch`` other than 1 for a prefill, ``seqs`` for
            anything else).
    Example:
        >>> problem_for("gdn_decode", "qwen3-next", batch=4096).brief()
        'N=4096 T=1 H=16 HV=32 K=128 V=128 bfloat16 state=float32/vk mode=pool'
    """
    if op not in OPS:
        raise UsageError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    try:
        p = linattn.preset(model)
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    fam = op_family(op)
    if p.family != fam:
        ops = [o for o in OPS if op_family(o) == p.family]
        raise UsageError(f"model {model!r} ({p.title}) is a {p.family!r} model; {op} needs a {fam!r} model "
                         f"such as {FAMILY_PRESET[fam]!r}. Ops for {model!r}: {', '.join(ops)}")
    for name, val in (("batch", batch), ("tokens", tokens), ("seqs", seqs)):
        if val is not None and val < 0:
            raise UsageError(f"--{name} must be >= 0, got {val}")
    # a size that does not apply to the op is an error, not silently ignored
    if op.endswith("_prefill") and batch != 1:
        raise UsageError(f"{op} takes --seqs (sequences) and --tokens (packed tokens in all), not --batch "
                         f"(decode rows, gating / clamp rows)")
    if not op.endswith("_prefill") and seqs is not None:
        raise UsageError(f"{op} takes --batch (rows) and --tokens, not --seqs (prefill sequences)")
    common = dict(op=op, dtype=dtype)
    try:
        if fam == "swiglu":
            m = tokens if tokens is not None else batch
            return Problem(**common, n=m, d=p.D, mode="none", clamp_limit=p.limit is not None)
        if op.endswith("_gating"):
            rows = tokens if tokens is not None else batch
            return Problem(**common, n=rows, hv=p.HV, k=p.K if fam == "kda" else 0, mode="none")
        shape = dict(h=p.H, hv=p.HV, k=p.K, v=p.V, state_dtype=state_dtype, state_layout=layout)
        if op.endswith("_decode"):
            return Problem(**common, **shape, n=batch, t=tokens if tokens is not None else 1, mode="pool")
        t = tokens if tokens is not None else 4096
        n = seqs if seqs is not None else 1
        return Problem(**common, **shape, n=n, t=t, mode=mode, max_seqlen=t if n == 1 else 0)
    except ValueError as e:  # pydantic: a bad dtype / layout / mode name, or an impossible shape
        errors = getattr(e, "errors", None)
        if callable(errors):  # a pydantic ValidationError: say which option, what was given, what is allowed
            parts = []
            for err in e.errors():
                msg = err.get("msg", "").removeprefix("Value error, ")
                loc = ".".join(str(x) for x in err.get("loc", ()))
                parts.append(f"{loc}={err.get('input')!r}: {msg}" if loc else msg)
            raise UsageError(f"bad problem for {op}: " + "; ".join(parts)) from None
        raise UsageError(f"bad problem for {op}: {e}") from None


# -- report ----------------------------------------------------------------------------------------

def representative_problem(op: str) -> Problem:
    """The problem ``report`` asks every backend about for ``op`` (model by op family)."""
    model = FAMILY_PRESET[op_family(op)]
    if op.endswith("_decode"):
        return problem_for(op, model, batch=REPORT_DECODE_BATCH)
    if op.endswith("_prefill"):
        return problem_for(op, model, tokens=REPORT_PREFILL_TOKENS, seqs=REPORT_PREFILL_SEQS)
    return problem_for(op, model, tokens=REPORT_PREFILL_TOKENS)


def sweep_problems() -> list[tuple[str, str, str, int, Problem]]:
    """``(model, op, phase, size, problem)`` for every preset and sweep size.

    Decode rows: the preset's decode op at ``SWEEP_BATCHES`` (and ``silu_and_mul_clamp`` with
    ``M = batch``). Prefill rows: gating and prefill at ``SWEEP_TOKENS`` packed tokens, in
    sequences of at most ``SWEEP_SEQ_TOKENS`` (and ``silu_and_mul_clamp`` with ``M = tokens``).
    """
    out = []
    for name, p in linattn.presets().items():
        if p.family == "swiglu":
            for b in SWEEP_BATCHES:
                out.append((name, "silu_and_mul_clamp", "decode", b, problem_for("silu_and_mul_clamp", name, batch=b)))
            for t in SWEEP_TOKENS:
                out.append((name, "silu_and_mul_clamp", "prefill", t, problem_for("silu_and_mul_clamp", name, tokens=t)))
            continue
        for b in SWEEP_BATCHES:
            out.append((name, p.decode_op, "decode", b, problem_for(p.decode_op, name, batch=b)))
        for t in SWEEP_TOKENS:
            seqs = max(1, -(-t // SWEEP_SEQ_TOKENS))
            out.append((name, f"{p.family}_gating", "prefill", t, problem_for(f"{p.family}_gating", name, tokens=t)))
            out.append((name, p.prefill_op, "prefill", t, problem_for(p.prefill_op, name, tokens=t, seqs=seqs)))
    return out


def build_report(profile: Optional[str] = None) -> dict:
    """The ``linattn report`` document.

    Args:
        profile: a device profile name, or None for the probed default device.
    Returns:
        dict with ``device`` (capabilities), ``probed``, ``profile``, ``backends`` (sorted names),
        ``ops`` (op -> representative problem, chosen backend and every verdict), ``sweep`` (one row
        per :func:`sweep_problems` entry: chosen backend, whether it is ``verified`` on this arch,
        and rejection reasons), ``unverified`` (one row per op and accepted backend whose kernels
        were never verified on this arch: it self-checks against torch-ref on its first eager
        call), ``self_checks`` (the self-checks run in this process), ``plugins`` and
        ``plugin_failures`` (the plugin rows whose status is not ``loaded``).
    Raises:
        UsageError: an unknown profile.
    """
    caps = resolve_target(profile)
    names = sorted(registered_backends())
    ops, unverified = {}, []
    for op in OPS:
        prob = representative_problem(op)
        d = linattn.explain(prob, caps)
        ops[op] = {"problem": prob.model_dump(mode="json"), "brief": prob.brief(), "chosen": d.chosen,
                   "verdicts": {v.backend: v.model_dump(mode="json") for v in d.verdicts}}
        unverified += [{"op": op, "backend": v.backend, "arch": caps.arch, "chosen": v.backend == d.chosen,
                        "message": v.message} for v in d.verdicts if v.ok and not v.verified]
    sweep = []
    for model, op, phase, size, prob in sweep_problems():
        d = linattn.explain(prob, caps)
        sweep.append({"model": model, "op": op, "phase": phase,
                      ("batch" if phase == "decode" else "tokens"): size, "n": prob.n, "t": prob.t,
                      "chosen": d.chosen, "verified": d.chosen is None or d.verdict(d.chosen).verified,
                      "rejected": {v.backend: v.reason.value for v in d.verdicts if not v.ok}})
    from linattn.dispatch.self_check import results as self_check_results

    plugins = plugin_rows()
    return {
        "device": caps.model_dump(mode="json"),
        "probed": profile is None,
        "profile": profile,
        "backends": names,
        "ops": ops,
        "sweep": sweep,
        "unverified": unverified,
        "self_checks": [r.model_dump(mode="json") for r in self_check_results()],
        "plugins": plugins,
        "plugin_failures": [p for p in plugins if p["status"] not in ("loaded",)],
    }


# -- explain ---------------------------------------------------------------------------------------

def decision_doc(decision, prob: Problem, model: str) -> dict:
    """The ``linattn explain --json`` document: the decision's fields plus ``model`` and ``brief``.

    Args:
        decision: the :class:`~linattn.dispatch.verdict.Decision` for ``prob``.
        prob: the problem that was explained.
        model: the preset name the problem was built from.
    Returns:
        dict.
    """
    doc = decision.model_dump(mode="json")
    doc["model"] = model
    doc["brief"] = prob.brief()
    return doc


# -- inventory -------------------------------------------------------------------------------------

def backend_rows() -> list[dict]:
    """One dict per registered backend: name, plugin, distribution, version, ops, vendors, dtypes, summary."""
    rows = []
    for name, b in sorted(registered_backends().items()):
        rows.append({"name": name, "plugin": b.plugin, "distribution": b.distribution, "version": b.version,
                     "ops": sorted(b.ops), "vendors": sorted(b.vendors), "dtypes": sorted(b.dtypes),
                     "state_dtypes": sorted(b.state_dtypes), "state_layouts": sorted(b.state_layouts),
                     "requires": list(b.requires), "summary": b.summary})
    return rows


def plugin_rows() -> list[dict]:
    """One dict per plugin seen (``linattn.list_plugins()``): name, version, distribution, status, error, ..."""
    return [p.model_dump(mode="json") for p in linattn.list_plugins()]
