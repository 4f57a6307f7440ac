"""The documents behind ``linattn report``, ``explain``, ``backends`` and ``plugins``: plain dicts, no printing.

Each builder returns the one document a command prints; ``apps/cli.py`` renders it as rich
tables or, with ``--json``, dumps it as is. So a script that imports these functions sees the
same data as ``linattn <command> --json``::

    >>> from linattn.apps.report import problem_for, build_report
    >>> problem_for("gdn_decode", "qwen3-next", batch=4096).brief()
    'N=4096 T=1 H=16 HV=32 K=128 V=128 bfloat16 state=float32/vk mode=pool'
    >>> sorted(build_report("sm90"))[:3]
    ['backends', 'device', 'ops']

Problems are built from the model presets (``linattn/presets.toml``) with the same fields the
validation layer derives from a real call (``dispatch/rules/validate.py``), so ``explain`` answers
exactly what a call of that shape would get.
"""

from __future__ import annotations

from typing import Optional

import linattn
from linattn.dispatch import resolve_device
from linattn.dispatch.rules.ops_table import OP_TABLE, op_spec
from linattn.dispatch.runtime.registry import SKIPPED
from linattn.dispatch.plugin.problem import OPS, Problem
from linattn.dispatch.rules.validate import FLOAT_DTYPES, STATE_DTYPES
from linattn.presets import UsageError, make_problem, preset_shape, preset_table  # noqa: F401 - UsageError: the CLI's and tests' name

#: The preset each op family uses in ``report`` (and ``explain`` without ``--model``).
#: From the op table's ``default_preset`` (``{"gdn": "qwen3-next", "kda": "kimi-linear", "swiglu": "deepseek-v4"}``).
FAMILY_PRESET = {s.family: s.default_preset for s in OP_TABLE.values()}
#: Decode batch sizes and prefill token counts of the ``report`` sweep.
SWEEP_BATCHES = (1, 16, 256, 4096, 65536)
SWEEP_TOKENS = (256, 1024, 4096, 16384, 65536)
#: Sweep prefill rows pack their tokens into sequences of at most this many tokens.
SWEEP_SEQ_TOKENS = 4096
#: The representative problem of each op in ``report``.
REPORT_DECODE_BATCH = 64
REPORT_PREFILL_TOKENS = 8192
REPORT_PREFILL_SEQS = 4
#: The dtypes ``explain`` takes, exactly those the ops take (``dispatch/rules/validate.py``): q/k/v (and the
#: gating's and the clamp's inputs) and the state pool. float64 is the reference's oracle mode, which
#: only the PyTorch backends run (torch-ref; torch-chunked too).
DTYPE_NAMES = tuple(FLOAT_DTYPES.values())
STATE_DTYPE_NAMES = tuple(STATE_DTYPES.values())
#: Tokens per sequence of a prefill when ``--tokens`` is not given (``explain``, ``tune --batch``).
PREFILL_TOKENS = 4096
#: The largest count a size option of the command line takes (rows, tokens, sequences, steps,
#: repeats): an int32, as the kernels index with; larger is refused as a usage error (exit 2).
SIZE_MAX = 2**31 - 1


# -- targets and problems --------------------------------------------------------------------------

def op_family(op: str) -> Optional[str]:
    """``gdn``, ``kda`` or ``swiglu`` (the preset family an op belongs to, from the op table); None
    for a name that is not an op."""
    spec = OP_TABLE.get(op)
    return spec.family if spec is not None else None


def registered_backends() -> dict:
    """Backends by name, from the registry (as ``linattn.list_backends()``)."""
    return linattn.list_backends()


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``: what ``report``, ``explain`` and ``demo`` probe."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_target(profile: Optional[str], device: Optional[str] = None):
    """Capabilities of the named profile, of the probed ``device``, or of the probed default device.

    Args:
        profile: a profile name (``sm90``, ``cpu``, ... see ``linattn.capabilities.PROFILES``),
            or None.
        device: a torch device string to probe (``cpu``, ``cuda``, ``cuda:1``), or None; with
            neither, :func:`default_device` is probed.
    Returns:
        DeviceCapabilities.
    Raises:
        UsageError: an unknown profile name (the message lists the known ones), both given, or a
            device that is not a torch device or not present.
    """
    from linattn.capabilities import PROFILES

    if profile is not None and device is not None:
        raise UsageError(f"--profile {profile} and --device {device} both name the device; give one (--profile: plan "
                         f"for a device you do not have; --device: probe one you have)")
    if device is not None:
        if device in PROFILES and device != "cpu":
            raise UsageError(f"--device {device}: {device!r} is a profile; give it as --profile {device} (--device is "
                             f"a torch device: cpu, cuda, cuda:N)")
        try:
            return resolve_device(device)
        except ValueError as e:
            raise UsageError(f"--device {device}: {e}") from None
    if profile is not None:
        if profile not in PROFILES:
            raise UsageError(f"unknown device profile {profile!r}; known profiles: {', '.join(sorted(PROFILES))}")
        from linattn.capabilities import profile as named_profile

        return named_profile(profile)
    return resolve_device(default_device())


def _sizes(op: str, batch: Optional[int], tokens: Optional[int], seqs: Optional[int],
           total_tokens: Optional[int]) -> dict:
    """``n``, ``t`` (and ``max_seqlen``) from the CLI's sizes (the grammar of apps/cli_common.py):
    ``batch`` (= ``seqs``) sequences N, ``tokens`` per sequence L; ``total_tokens``: a prefill's packed
    T in all instead (lengths unknown). A size that does not apply is an error."""
    for name, val in (("batch", batch), ("tokens", tokens), ("seqs", seqs), ("total_tokens", total_tokens)):
        if val is not None and val < 1:  # a call of no sequences or no tokens has nothing to decide
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1 (a count), got {val}")
    if batch is not None and seqs is not None and batch != seqs:
        raise UsageError(f"--batch {batch} and --seqs {seqs}: both are the call's sequences N; give one")
    n = next((x for x in (batch, seqs) if x is not None), 1)
    phase = op_spec(op).phase
    if total_tokens is not None:
        if phase != "prefill" or tokens is not None:
            raise UsageError(f"--total-tokens is a prefill's packed tokens in all, instead of --tokens (tokens per "
                             f"sequence): {'give one of them' if tokens is not None else f'not for {op}'}")
        return dict(n=n, t=total_tokens, max_seqlen=total_tokens if n == 1 else 0)
    if phase == "prefill":
        L = tokens if tokens is not None else PREFILL_TOKENS
        return dict(n=n, t=n * L, max_seqlen=L)
    if phase == "decode":
        return dict(n=n, t=tokens if tokens is not None else 1)
    return dict(n=n * (tokens if tokens is not None else 1))


def _state_options(op: str, state_dtype: Optional[str], layout: Optional[str], mode: Optional[str]) -> dict:
    """Pool dtype, layout and prefill mode as Problem fields; an option the op does not take is an error."""
    given = [f"--{name} {val}" for name, val in (("state-dtype", state_dtype), ("layout", layout), ("mode", mode))
             if val is not None]
    spec = op_spec(op)
    if not spec.has_state:  # gating and the clamp
        if given:
            raise UsageError(f"{op} has no state: {', '.join(given)} does not apply to it "
                             f"(--state-dtype and --layout are for decode and prefill, --mode for prefill)")
        return {}
    if spec.phase == "decode" and mode is not None:
        raise UsageError(f"--mode {mode} does not apply to {op}: decode always updates the state pool in place; "
                         f"--mode (pool or dense) is for gdn_prefill / kda_prefill")
    return dict(state_dtype=state_dtype or "float32", state_layout=layout or "vk",
                **({"mode": mode or "pool"} if spec.phase == "prefill" else {}))


def problem_for(op: str, model: str, *, batch: Optional[int] = None, tokens: Optional[int] = None,
                seqs: Optional[int] = None, dtype: str = "bfloat16", state_dtype: Optional[str] = None,
                layout: Optional[str] = None, mode: Optional[str] = None,
                total_tokens: Optional[int] = None) -> Problem:
    """The :class:`Problem` a call of ``op`` at a model preset's shapes would produce.

    Sizes follow the CLI's grammar (``apps/cli_common.py``): ``batch`` (or its synonym ``seqs``,
    default 1) is the call's sequences N, ``tokens`` the tokens per sequence L. Fields follow the
    validation layer (``dispatch/rules/validate.py``):

    - decode: ``n = N`` rows, ``t = L`` per row (default 1; > 1 = speculative verify);
    - prefill: ``N`` sequences of ``L`` tokens (default 4,096): ``t = N L`` packed, ``max_seqlen = L``;
      or ``total_tokens = T`` packed in all, lengths unknown (``max_seqlen`` 0 unless N = 1);
    - gating: ``n = N L`` rows of gates;
    - ``silu_and_mul_clamp``: ``M = N L`` rows of width ``D`` from the preset.

    Args:
        op: an op name (see ``linattn.dispatch.OPS``).
        model: a preset name whose family matches the op (``qwen3-next`` for GDN ops, ...).
        batch, seqs, tokens, total_tokens: sizes as above.
        dtype: q/k/v dtype (:data:`DTYPE_NAMES`). state_dtype, layout: pool dtype (:data:`STATE_DTYPE_NAMES`,
            default float32) and layout (default ``vk``), decode and prefill only. mode: ``pool``
            (default) or ``dense``, prefill only.
    Returns:
        Problem.
    Raises:
        UsageError: an unknown op or model, a model of another family, a bad size or value, or a
            size or option that does not apply to the op (``batch`` and ``seqs`` that differ,
            ``total_tokens`` outside prefill, ``mode`` for a decode, state options for gating / clamp).
    Example:
        >>> problem_for("gdn_decode", "qwen3-next", batch=4096).brief()
        'N=4096 T=1 H=16 HV=32 K=128 V=128 bfloat16 state=float32/vk mode=pool'
    """
    for option, val, allowed in (("--dtype", dtype, DTYPE_NAMES), ("--state-dtype", state_dtype, STATE_DTYPE_NAMES)):
        if val is not None and val not in allowed:
            raise UsageError(f"{option} {val}: the ops take {', '.join(allowed)} (float64: the reference's oracle "
                             f"mode, run by the PyTorch backends only)")
    shape = preset_shape(op, model)
    sizes = _sizes(op, batch, tokens, seqs, total_tokens)
    options = _state_options(op, state_dtype, layout, mode)
    return make_problem(op, dtype=dtype, **shape, **sizes, **options)


# -- report ----------------------------------------------------------------------------------------

def representative_problem(op: str) -> Problem:
    """The problem ``report`` asks every backend about for ``op`` (model by op family)."""
    spec = op_spec(op)
    model = FAMILY_PRESET[spec.family]
    if spec.phase == "decode":
        return problem_for(op, model, batch=REPORT_DECODE_BATCH)
    if spec.phase == "prefill":
        return problem_for(op, model, total_tokens=REPORT_PREFILL_TOKENS, seqs=REPORT_PREFILL_SEQS)
    return problem_for(op, model, tokens=REPORT_PREFILL_TOKENS)


def sweep_problems() -> list[tuple[str, str, str, int, Problem]]:
    """``(model, op, phase, size, problem)`` for every preset and sweep size.

    Decode rows: the preset's decode op at ``SWEEP_BATCHES`` (and ``silu_and_mul_clamp`` with
    ``M = batch``). Prefill rows: gating and prefill at ``SWEEP_TOKENS`` packed tokens, in
    sequences of at most ``SWEEP_SEQ_TOKENS`` (and ``silu_and_mul_clamp`` with ``M = tokens``).
    Presets the ``LINATTN_PRESETS`` file got wrong are left out (``build_report`` lists them).
    """
    out = []
    clamp = "silu_and_mul_clamp"
    for name, p in preset_table().presets.items():
        if p.family == "swiglu":
            out += [(name, clamp, "decode", b, problem_for(clamp, name, batch=b)) for b in SWEEP_BATCHES]
            out += [(name, clamp, "prefill", t, problem_for(clamp, name, tokens=t)) for t in SWEEP_TOKENS]
            continue
        for b in SWEEP_BATCHES:
            out.append((name, p.decode_op, "decode", b, problem_for(p.decode_op, name, batch=b)))
        for t in SWEEP_TOKENS:
            seqs = max(1, -(-t // SWEEP_SEQ_TOKENS))
            out.append((name, p.gating_op, "prefill", t, problem_for(p.gating_op, name, tokens=t)))
            out.append((name, p.prefill_op, "prefill", t, problem_for(p.prefill_op, name, total_tokens=t, seqs=seqs)))
    return out


def _op_rows(caps) -> tuple[dict, list[dict]]:
    """Per op: the decision document of its representative problem; and the accepted-but-unverified rows."""
    ops, unverified = {}, []
    for op in OPS:
        prob = representative_problem(op)
        d = linattn.explain(prob, caps)
        ops[op] = decision_doc(d, prob, FAMILY_PRESET[OP_TABLE[op].family])
        unverified += [{"op": op, "backend": v.backend, "arch": caps.arch, "chosen": v.backend == d.chosen,
                        "message": v.message} for v in d.verdicts if v.ok and not v.verified]
    return ops, unverified


def _sweep_rows(caps) -> list[dict]:
    """One row per :func:`sweep_problems` entry: the chosen backend, ``verified`` and rejection reasons."""
    rows = []
    for model, op, phase, size, prob in sweep_problems():
        d = linattn.explain(prob, caps)
        rows.append({"model": model, "op": op, "phase": phase,
                     ("batch" if phase == "decode" else "tokens"): size, "n": prob.n, "t": prob.t,
                     "chosen": d.chosen, "verified": d.chosen is None or d.verdict(d.chosen).verified,
                     "rejected": {v.backend: v.reason.value for v in d.verdicts if not v.ok}})
    return rows


def build_report(profile: Optional[str] = None, *, device: Optional[str] = None) -> dict:
    """The ``linattn report`` document.

    Args:
        profile: a device profile name, or None for the probed device.
        device: a torch device to probe (not with ``profile``); None: the default device.
    Returns:
        dict with ``device`` (capabilities), ``probed``, ``profile``, ``backends`` (sorted names),
        ``ops`` (op -> the :func:`decision_doc` of its representative problem: the same document
        as ``linattn explain OP --json`` for that problem, verdicts as a list), ``sweep`` (one row
        per :func:`sweep_problems` entry: chosen backend, whether it is ``verified`` on this arch,
        and rejection reasons), ``unverified`` (one row per op and accepted backend whose kernels
        were never verified on this arch: it self-checks against torch-ref on its first eager
        call), ``self_checks`` (the self-checks run in this process), ``plugins`` and
        ``plugin_failures`` (the plugin rows whose status is not ``loaded``), ``preset_problems``
        (one line per problem of the ``LINATTN_PRESETS`` file, naming it: those presets are left
        out of the sweep, the rest reported).
    Raises:
        UsageError: an unknown profile, or a device that is not there (see :func:`resolve_target`).
    """
    from linattn.dispatch.runtime.self_check import results as self_check_results

    caps = resolve_target(profile, device)
    ops, unverified = _op_rows(caps)
    plugins = plugin_rows()
    return {
        "device": caps.model_dump(mode="json"),
        "probed": profile is None,
        "profile": profile,
        "backends": sorted(registered_backends()),
        "ops": ops,
        "sweep": _sweep_rows(caps),
        "unverified": unverified,
        "self_checks": [r.model_dump(mode="json") for r in self_check_results()],
        "plugins": plugins,
        "plugin_failures": [p for p in plugins if p["status"] != "loaded"],
        "preset_problems": list(preset_table().problems),
    }


# -- explain ---------------------------------------------------------------------------------------

def decision_doc(decision, prob: Problem, model: str) -> dict:
    """The ``linattn explain --json`` document (also each op of ``report --json``).

    Args:
        decision: the :class:`~linattn.dispatch.plugin.verdict.Decision` for ``prob``.
        prob: the problem that was explained.
        model: the preset name the problem was built from.
    Returns:
        dict: the decision's fields (``op, problem, device, profile, verdicts`` as a list of
        ``{status, backend, ...}``, ``chosen, forced, forced_by, policy, capturing``) plus
        ``model`` and ``brief`` (the problem in one line).
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


def skipped_plugin_notes() -> list[str]:
    """One line per installed plugin that ``LINATTN_DISABLE_PLUGINS`` or ``LINATTN_PLUGINS`` kept from
    loading (its backends are then not registered, so ``backends`` and ``explain`` cannot list them).

    Example:
        >>> skipped_plugin_notes()  # nothing skipped
        []
    """
    return [f"plugin {p.name} ({p.distribution}) not loaded: {p.error}; its backends are not registered"
            for p in linattn.list_plugins() if p.status in SKIPPED]


def plugin_rows() -> list[dict]:
    """One dict per plugin seen (``linattn.list_plugins()``): name, version, distribution, status, error, ..."""
    return [p.model_dump(mode="json") for p in linattn.list_plugins()]
