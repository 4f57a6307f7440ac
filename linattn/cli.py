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

This module holds the typer commands and their rich rendering only; the documents they print
(report, decision, backend and plugin rows, and the problems built from the model presets) are
built by ``linattn/report.py``, so text and ``--json`` always show the same data.
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
from linattn.demo import DEFAULTS as DEMO_DEFAULTS
from linattn.dispatch.problem import OPS, Problem
# The data builders live in linattn/report.py; re-exported here because tests and scripts import them from linattn.cli.
from linattn.report import (FAMILY_PRESET, REPORT_DECODE_BATCH, REPORT_PREFILL_SEQS, REPORT_PREFILL_TOKENS,  # noqa: F401
                            SWEEP_BATCHES, SWEEP_SEQ_TOKENS, SWEEP_TOKENS, UsageError, backend_rows, build_report,
                            decision_doc, default_device, op_family, plugin_rows, problem_for, registered_backends,
                            representative_problem, resolve_target, sweep_problems)

app = typer.Typer(
    name="linattn",
    help="Explainable dispatch for linear-attention kernels (GDN, KDA) over a state pool.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document instead of tables.")
PROFILE_OPT = typer.Option(None, "--profile", help="A device profile: sm100, sm90, sm103, sm120, mi300x, "
                                                   "xpu-pvc, cpu (default: the probed device).")


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
        Console(stderr=True).print(f"[bold red]error:[/] {msg}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _verdict_cells(v) -> tuple[str, str, str, str, str]:
    if v.ok:
        return ("accepted" if v.verified else "accepted, unverified"), "", v.message, "", str(v.rank)
    return "rejected", v.reason.value, v.message, v.hint, ""


def _caps_table(caps) -> Table:
    t = Table(title="Device capabilities", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    tc = caps.toolchain
    rows = [
        ("device", caps.name + " (" + ("" if caps.vendor in (caps.device_type, caps.name.split()[0].lower())
                                       else f"{caps.vendor}, ")
                   + f"{caps.device_type}{'' if caps.device_index is None else ':' + str(caps.device_index)})"),
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


# -- report --------------------------------------------------------------------------------------

def _render_report(doc: dict, caps) -> None:
    con = _console()
    con.print(_caps_table(caps))
    names = doc["backends"]
    t = Table(title="Verdict per op (representative problem; rank: lower runs first)", title_justify="left",
              caption="rank N: eligible (* chosen; unverified: never verified on this arch, self-checks "
                      "against torch-ref on its first eager call); otherwise the reason it is not (op, device, "
                      "arch, toolchain, dtype, shape, not_forced, ...; `linattn explain OP` gives the message and hint)",
              caption_justify="left")
    t.add_column("op", style="bold", overflow="fold")  # fold, not cut: names stay readable at 80 columns
    t.add_column("problem", overflow="fold")
    for n in names:
        t.add_column(n, overflow="fold")
    for op, row in doc["ops"].items():
        cells = []
        for n in names:
            v = row["verdicts"].get(n)
            if v is None:
                cells.append(Text("-"))
            elif v["status"] == "accepted":
                style = "bold green" if n == row["chosen"] else "green"
                mark = "" if v.get("verified", True) else " unverified"
                cells.append(Text(f"{'* ' if n == row['chosen'] else ''}rank {v['rank']}{mark}", style=style))
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
                    cells.append(Text(r["chosen"] + ("" if r.get("verified", True) else " (unverified)"),
                                      style="green" if r.get("verified", True) else "yellow"))
                else:
                    cells.append(Text("none: " + ",".join(sorted(set(r["rejected"].values()))), style="red"))
            st.add_row(model, op, *cells)
        con.print(st)
    for u in doc.get("unverified", []):
        con.print(Text(f"{u['backend']} for {u['op']}: {u['message']}", style="yellow"))
    for r in doc.get("self_checks", []):
        con.print(Text(f"self-check {'passed' if r['ok'] else 'FAILED'}: {r['backend']} {r['op']} on {r['arch']} "
                       f"({r['shape_class']}): {r['message']}", style="green" if r["ok"] else "bold red"))
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
                         (f"{d.device.removesuffix(' (profile)')} (profile {d.profile})" if d.profile else f"{d.device}"))
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
        v = d.verdict(d.chosen)
        if not v.verified:
            con.print(Text(f"note: {v.message}", style="yellow"))
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
        _emit_json(decision_doc(d, prob, model))
    else:
        _render_decision(d, prob, model)
    raise typer.Exit(code=0 if d.chosen else 1)


# -- inventory -------------------------------------------------------------------------------------

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
    rows = plugin_rows()
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
