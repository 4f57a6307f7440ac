"""The ``linattn`` command line: what this device can do, which backend runs, and why.

Every command prints a rich table by default and, with ``--json``, exactly one JSON document on
stdout (nothing else), so scripts can parse it::

    linattn report [--profile sm90]                         # device, every backend's verdict per op, sweep
    linattn explain gdn_decode --model qwen3-next --batch 4096 --profile sm90
    linattn backends / linattn plugins
    linattn demo --model qwen3-next                          # the main job (see linattn/demo.py)

Exit codes: 0 success; 1 ``explain`` found no backend (or the forced one is not eligible), the
demo's errors exceed the ops.md tolerances, or a demo call found no backend; 2 a bad argument (unknown op, model, profile or
backend).

Problems are built from the model presets (``linattn/presets.toml``) with the same fields the
validation layer derives from a real call (``dispatch/validate.py``), so ``explain`` answers
exactly what a call of that shape would get.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

import linattn
from linattn.dispatch import get_registry, resolve_device
from linattn.demo import DEFAULTS as DEMO_DEFAULTS
from linattn.dispatch.problem import OPS, Problem

app = typer.Typer(
    name="linattn",
    help="Explainable dispatch for linear-attention kernels (GDN, KDA) over a state pool.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document instead of tables.")
PROFILE_OPT = typer.Option(None, "--profile", help="A device profile: sm100, sm90, sm103, sm120, mi300x, "
                                                   "xpu-pvc, cpu (default: the probed device).")


class UsageError(Exception):
    """A bad argument: printed (as JSON with --json) and exit code 2."""


# -- helpers -------------------------------------------------------------------------------------

def _console() -> Console:
    return Console(soft_wrap=False)


def _emit_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, default=str))


def _fail_usage(err: Exception, as_json: bool) -> None:
    msg = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if as_json:
        _emit_json({"error": msg, "type": type(err).__name__})
    else:
        Console(stderr=True).print(f"[bold red]error:[/] {msg}", markup=True, highlight=False)
    raise typer.Exit(code=2)


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
        UsageError: an unknown op or model, a model of another family, or a bad size.
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


def _verdict_cells(v) -> tuple[str, str, str, str, str]:
    if v.ok:
        return "accepted", "", v.message, "", str(v.rank)
    return "rejected", v.reason.value, v.message, v.hint, ""


def _caps_table(caps) -> Table:
    t = Table(title="Device capabilities", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    tc = caps.toolchain
    rows = [
        ("device", f"{caps.name} ({caps.vendor}, {caps.device_type}"
                   f"{'' if caps.device_index is None else ':' + str(caps.device_index)})"),
        ("profile", caps.profile or "(probed)"),
        ("arch", caps.arch + (f"  cc {caps.compute_capability[0]}.{caps.compute_capability[1]}"
                              if caps.compute_capability else "")),
        ("SMs / CUs / cores", str(caps.sm_count)),
        ("grid limits x / y / z", f"{caps.grid.x:,} / {caps.grid.y:,} / {caps.grid.z:,}"
                                  + (f"  total {caps.grid.total:,}" if caps.grid.total else "")),
        ("grid source", caps.grid.source),
        ("threads per block", f"{caps.max_threads_per_block:,}"),
        ("shared memory per block", f"{caps.shared_memory_per_block:,} B"),
        ("warp size", str(caps.warp_size)),
        ("memory", f"{caps.total_memory / 2**30:.1f} GiB" if caps.total_memory else "-"),
        ("toolchain", ", ".join(f"{k}={getattr(tc, k)}" for k in ("torch", "triton", "cutlass_dsl", "cuda", "hip")
                                if getattr(tc, k) is not None) or "-"),
        ("Triton interpreter", "on" if tc.triton_interpreter else "off"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _plugin_rows():
    return [p.model_dump(mode="json") for p in linattn.list_plugins()]


# -- report --------------------------------------------------------------------------------------

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
    """The ``linattn report`` document (see :func:`report`)."""
    caps = resolve_target(profile)
    names = sorted(registered_backends())
    ops = {}
    for op in OPS:
        prob = representative_problem(op)
        d = linattn.explain(prob, caps)
        ops[op] = {"problem": prob.model_dump(mode="json"), "brief": prob.brief(), "chosen": d.chosen,
                   "verdicts": {v.backend: v.model_dump(mode="json") for v in d.verdicts}}
    sweep = []
    for model, op, phase, size, prob in sweep_problems():
        d = linattn.explain(prob, caps)
        sweep.append({"model": model, "op": op, "phase": phase,
                      ("batch" if phase == "decode" else "tokens"): size, "n": prob.n, "t": prob.t,
                      "chosen": d.chosen,
                      "rejected": {v.backend: v.reason.value for v in d.verdicts if not v.ok}})
    plugins = _plugin_rows()
    return {
        "device": caps.model_dump(mode="json"),
        "probed": profile is None,
        "profile": profile,
        "backends": names,
        "ops": ops,
        "sweep": sweep,
        "plugins": plugins,
        "plugin_failures": [p for p in plugins if p["status"] not in ("loaded",)],
    }


def _render_report(doc: dict, caps) -> None:
    con = _console()
    con.print(_caps_table(caps))
    names = doc["backends"]
    t = Table(title="Verdict per op (representative problem; rank: lower runs first)", title_justify="left")
    t.add_column("op", style="bold")
    t.add_column("problem")
    for n in names:
        t.add_column(n)
    for op, row in doc["ops"].items():
        cells = []
        for n in names:
            v = row["verdicts"].get(n)
            if v is None:
                cells.append(Text("-"))
            elif v["status"] == "accepted":
                style = "bold green" if n == row["chosen"] else "green"
                cells.append(Text(f"{'* ' if n == row['chosen'] else ''}rank {v['rank']}", style=style))
            else:
                cells.append(Text(v["reason"], style="red"))
        t.add_row(op, row["brief"], *cells)
    con.print(t)
    for phase, sizes, label in (("decode", SWEEP_BATCHES, "batch"), ("prefill", SWEEP_TOKENS, "tokens")):
        st = Table(title=f"Sweep: backend chosen per {label} ({phase})", title_justify="left")
        st.add_column("model", style="bold", overflow="fold")
        st.add_column("op", overflow="fold")
        for s in sizes:
            st.add_column(f"{s:,}", justify="center", overflow="fold")
        rows: dict[tuple, dict] = {}
        for r in doc["sweep"]:
            if r["phase"] == phase:
                rows.setdefault((r["model"], r["op"]), {})[r[label]] = r
        for (model, op), by in rows.items():
            cells = []
            for s in sizes:
                r = by.get(s)
                if r is None:
                    cells.append(Text("-"))
                elif r["chosen"]:
                    cells.append(Text(r["chosen"], style="green"))
                else:
                    cells.append(Text("none: " + ",".join(sorted(set(r["rejected"].values()))), style="red"))
            st.add_row(model, op, *cells)
        con.print(st)
    if doc["plugin_failures"]:
        ft = Table(title="Plugin load failures", title_justify="left")
        for c in ("plugin", "distribution", "version", "status", "error"):
            ft.add_column(c)
        for p in doc["plugin_failures"]:
            ft.add_row(p["name"], p["distribution"], p["version"], Text(p["status"], style="red"), p["error"])
        con.print(ft)
    else:
        con.print(f"plugins: {', '.join(p['name'] for p in doc['plugins'])} (all loaded)")


@app.command()
def report(profile: Optional[str] = PROFILE_OPT, as_json: bool = JSON_OPT) -> None:
    """Device capabilities, every backend's verdict per op, and a sweep of choices over the model presets."""
    try:
        doc = build_report(profile)
        caps = resolve_target(profile)
    except UsageError as e:
        _fail_usage(e, as_json)
    if as_json:
        _emit_json(doc)
    else:
        _render_report(doc, caps)


# -- explain -------------------------------------------------------------------------------------

def _render_decision(d, prob: Problem, model: str) -> None:
    con = _console()
    head = Text.assemble(("op ", "bold"), d.op, ("   model ", "bold"), model, ("   device ", "bold"),
                         f"{d.device}" + (f" (profile {d.profile})" if d.profile else ""))
    con.print(head)
    con.print(Text.assemble(("problem ", "bold"), prob.brief()))
    forced = f"{d.forced} (by {d.forced_by})" if d.forced else "none"
    pol = d.policy or {}
    pol_txt = (f"force={pol.get('force') or {}} disable={pol.get('disable') or []} source={pol.get('source', '-')}")
    con.print(Text.assemble(("forced ", "bold"), forced, ("   policy ", "bold"), pol_txt))
    t = Table(title="Decision trace", title_justify="left")
    for c in ("backend", "verdict", "reason", "message", "hint", "rank"):
        t.add_column(c, overflow="fold")
    for v in d.verdicts:
        verdict, reason, msg, hint, rank = _verdict_cells(v)
        chosen = v.backend == d.chosen
        style = "bold green" if chosen else ("green" if v.ok else "")
        label = ("-> " if chosen else "") + v.backend
        t.add_row(Text(label, style=style), Text(verdict + (" (chosen)" if chosen else ""),
                                                 style="green" if v.ok else "red"),
                  reason, msg, hint, rank, style="on grey15" if chosen else None)
    con.print(t)
    if d.chosen:
        con.print(Text.assemble(("chosen: ", "bold"), (d.chosen, "bold green")))
    elif d.forced:
        v = d.verdict(d.forced)
        why = f"[{v.reason.value}] {v.message}" if not v.ok else ""
        con.print(Text.assemble(("no backend: ", "bold red"), f"forced backend {d.forced!r} is not eligible {why}"))
    else:
        con.print(Text("no backend accepts this problem", style="bold red"))


@app.command()
def explain(
    op: str = typer.Argument(..., help=f"The op: {', '.join(OPS)}."),
    model: Optional[str] = typer.Option(None, "--model", help="A model preset (default by op family: qwen3-next "
                                                              "for GDN, kimi-linear for KDA, deepseek-v4 for the clamp)."),
    batch: int = typer.Option(1, "--batch", help="Decode rows N (gating / clamp rows when --tokens is not given)."),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="Prefill: total packed tokens (default 4096). "
                                                                "Decode: tokens per row (default 1; >1 = verify)."),
    seqs: Optional[int] = typer.Option(None, "--seqs", help="Prefill: number of sequences (default 1)."),
    profile: Optional[str] = PROFILE_OPT,
    dtype: str = typer.Option("bfloat16", "--dtype", help="q/k/v dtype: bfloat16, float16, float32."),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="Pool dtype: float32, bfloat16."),
    layout: str = typer.Option("vk", "--layout", help="Pool layout: vk ([P, HV, V, K]) or kv."),
    mode: str = typer.Option("pool", "--mode", help="Prefill: pool (state pool in place) or dense."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Force this backend (as a call's backend=)."),
    as_json: bool = JSON_OPT,
) -> None:
    """The whole decision trace for one problem. Exit 0 when a backend was chosen, 1 otherwise."""
    try:
        model = model or FAMILY_PRESET.get(op_family(op), "qwen3-next")
        prob = problem_for(op, model, batch=batch, tokens=tokens, seqs=seqs, dtype=dtype,
                           state_dtype=state_dtype, layout=layout, mode=mode)
        caps = resolve_target(profile)
        try:
            d = linattn.explain(prob, caps, backend=backend)
        except ValueError as e:  # an unregistered forced backend
            raise UsageError(str(e)) from None
    except UsageError as e:
        _fail_usage(e, as_json)
    if as_json:
        doc = d.model_dump(mode="json")
        doc["model"] = model
        doc["brief"] = prob.brief()
        _emit_json(doc)
    else:
        _render_decision(d, prob, model)
    raise typer.Exit(code=0 if d.chosen else 1)


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


@app.command()
def backends(as_json: bool = JSON_OPT) -> None:
    """Registered backends: where each comes from and what it declares."""
    rows = backend_rows()
    if as_json:
        _emit_json(rows)
        return
    t = Table(title="Backends", title_justify="left")
    for c in ("name", "plugin", "distribution", "version", "ops", "vendors", "dtypes", "summary"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(Text(r["name"], style="bold"), r["plugin"], r["distribution"], r["version"], "\n".join(r["ops"]),
                  "\n".join(r["vendors"]), "\n".join(r["dtypes"]), r["summary"])
    con = _console()
    con.print(t)
    if not rows:
        con.print(Text("no backend is registered: see `linattn plugins`", style="bold red"))


@app.command()
def plugins(as_json: bool = JSON_OPT) -> None:
    """Plugins seen (built-in, and external from the entry-point group linattn.backends) and their status."""
    rows = _plugin_rows()
    if as_json:
        _emit_json(rows)
        return
    t = Table(title="Plugins", title_justify="left")
    for c in ("name", "version", "distribution", "api", "backends", "status", "error"):
        t.add_column(c, overflow="fold")
    for r in rows:
        ok = r["status"] == "loaded"
        t.add_row(Text(r["name"], style="bold"), r["version"], r["distribution"], r["api_version"] or "-",
                  ", ".join(r["backends"]), Text(r["status"], style="green" if ok else "red"), r["error"])
    _console().print(t)


# -- demo ------------------------------------------------------------------------------------------

def _parse_shape(shape: Optional[str]) -> Optional[tuple[int, int, int, int]]:
    if not shape:
        return None
    try:
        parts = tuple(int(x) for x in shape.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 4 or min(parts) < 1:
        raise UsageError(f"--shape must be four positive integers H,HV,K,V (e.g. 2,4,16,16), got {shape!r}")
    return parts  # type: ignore[return-value]


def _parse_range(text: Optional[str], name: str) -> Optional[tuple[int, int]]:
    if not text:
        return None
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--{name} must be LO,HI (e.g. 16,256), got {text!r}") from None
    return lo, hi


@app.command()
def demo(
    model: str = typer.Option(DEMO_DEFAULTS["model"], "--model", help="qwen3-next (GDN) or kimi-linear (KDA), or any "
                                                            "gdn/kda preset."),
    requests: int = typer.Option(DEMO_DEFAULTS["requests"], "--requests", help="Requests in the stream."),
    decode_batch: int = typer.Option(DEMO_DEFAULTS["decode_batch"], "--decode-batch", help="Fixed decode batch (CUDA-graph size); "
                                                               "free rows are padding (-1)."),
    steps: int = typer.Option(DEMO_DEFAULTS["steps"], "--steps", help="Scheduler iterations (each: admit + prefill, one decode step)."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    seed: int = typer.Option(DEMO_DEFAULTS["seed"], "--seed", help="Seed of the request stream and the random inputs."),
    as_json: bool = JSON_OPT,
    shape: Optional[str] = typer.Option(None, "--shape", hidden=True, help="Override H,HV,K,V (tests)."),
    prompt_len: Optional[str] = typer.Option(None, "--prompt-len", hidden=True, help="LO,HI prompt tokens."),
    output_len: Optional[str] = typer.Option(None, "--output-len", hidden=True, help="LO,HI decode steps."),
    check_every: Optional[int] = typer.Option(None, "--check-every", hidden=True,
                                              help="Check every k-th decode step against float64."),
) -> None:
    """The main job: serve a request stream through one linear-attention layer over a state pool.

    Exit 1 when an error against the float64 reference exceeds the ops.md tolerance.
    """
    from linattn.demo import DemoConfigError, render_demo, run_demo

    try:
        kw = {}
        if (s := _parse_shape(shape)) is not None:
            kw["shape"] = s
        if (r := _parse_range(prompt_len, "prompt-len")) is not None:
            kw["prompt_len"] = r
        if (r := _parse_range(output_len, "output-len")) is not None:
            kw["output_len"] = r
        kw["check_every"] = check_every if check_every is not None else DEMO_DEFAULTS["check_every"]
        rep = run_demo(model=model, requests=requests, decode_batch=decode_batch, steps=steps,
                       device=device, seed=seed, **kw)
    except (UsageError, DemoConfigError) as e:
        _fail_usage(e, as_json)
    except (linattn.NoBackendError, linattn.BackendRunError) as e:  # the trace says why; exit 1, not a traceback
        if as_json:
            doc = {"error": str(e), "type": type(e).__name__}
            if isinstance(e, linattn.NoBackendError):
                doc["decision"] = e.decision.model_dump(mode="json")
            _emit_json(doc)
        else:
            Console(stderr=True).print(Text(str(e), style="red"))
        raise typer.Exit(code=1)
    if as_json:
        _emit_json(rep.model_dump(mode="json"))
    else:
        render_demo(rep, _console())
    raise typer.Exit(code=0 if rep.passed else 1)


# -- commands other modules contribute --------------------------------------------------------------

def register_optional(module: str, attr: str, name: str, into: Optional[typer.Typer] = None) -> bool:
    """Add ``module:attr`` as command ``name`` (of ``into``, default :data:`app`) if ``module`` exists.

    Returns:
        True when registered; False when ``module`` itself (or a package above it) does not exist.
    Raises:
        ImportError: ``module`` exists but one of *its* imports fails (never swallowed).
        AttributeError: ``module`` has no ``attr``.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        missing = e.name or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            return False  # that module is not written yet
        raise
    (into or app).command(name)(getattr(mod, attr))
    return True


register_optional("linattn.testing.cli", "check", "check")
register_optional("linattn.bench", "bench", "bench")


if __name__ == "__main__":  # pragma: no cover
    app()
