"""The ``linattn`` command line: what this device can do, which backend runs, and why.

Every command prints a rich table by default and, with ``--json``, exactly one JSON document on
stdout (nothing else), so scripts can parse it::

    linattn --version [--json]                               # {"name": "linattn", "version": ...} with --json
    linattn report [--profile sm90 | --device cuda:1]       # device, every backend's verdict per op, sweep
    linattn explain gdn_decode --model qwen3-next --batch 4096 --profile sm90
    linattn explain --op gdn_prefill --batch 16 --tokens 4096    # 16 sequences of 4,096 tokens
    linattn backends / linattn plugins
    linattn demo --model qwen3-next                          # the main job (see apps/demo.py)
    linattn tune [--quick | --buckets gdn_decode:1,gdn_prefill:16x4096]   # measure, write the tuned table

One grammar for every verb (``apps/cli_common.py``): the op as ``OP`` or ``--op OP``;
``--batch N`` (or ``--seqs N``) the sequences of a call, ``--tokens L`` tokens per sequence;
``--device`` a torch device a verb runs on or probes, ``--profile`` a device ``explain`` and
``report`` plan for without having it; with ``--json`` an error is the document
``{"error": {"type", "message", "exit_code"}}``, also for an error of the command line itself.

On a terminal, tables fit its width; piped or redirected, they fit ``COLUMNS`` when it is set, else
they are as wide as their cells, so no name is ever broken across lines (``linattn backends | grep
torch-ref``). Help text reflows to the width (typer's markdown mode).

Exit codes: 0 success; 1 ``explain`` found no backend (or the forced one is not eligible), the
demo's errors exceed the docs/ops.md tolerances, or a demo call found no backend; 2 a bad argument
(unknown op, model, profile or backend, an option that does not apply to the op, a size beyond
``SIZE_MAX``, an unusable file path, an error of the command line) or a malformed ``LINATTN_*``
variable (``ConfigError``), in every command: one ``error:`` line (or the JSON error document),
never a traceback.

This module holds the typer commands and their rich rendering only; the documents they print
(report, decision, backend and plugin rows, and the problems built from the model presets) are
built by ``apps/report.py``, so text and ``--json`` always show the same data.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException

import linattn
from linattn.apps.cli_common import (DEVICE_HELP, EPILOG, JSON_OPT, PIPE_WIDTH, PROFILE_HELP, count_option, echo,  # noqa: F401
                                emit_json, fail, hidden_profile_option, no_profile, one_op, op_argument, op_option,
                                output_may_end_early, stdout_console)
from linattn.apps.demo import DEFAULTS as DEMO_DEFAULTS
from linattn.dispatch.env import ConfigError
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.tuning import ignored as tuning_ignored
# The data builders live in apps/report.py; re-exported here because tests and scripts import them from linattn.apps.cli.
from linattn.apps.report import (DTYPE_NAMES, FAMILY_PRESET, REPORT_DECODE_BATCH, REPORT_PREFILL_SEQS, REPORT_PREFILL_TOKENS,  # noqa: F401
                            SIZE_MAX, STATE_DTYPE_NAMES, SWEEP_BATCHES, SWEEP_SEQ_TOKENS, SWEEP_TOKENS, UsageError, backend_rows, build_report,
                            decision_doc, default_device, op_family, plugin_rows, problem_for, registered_backends,
                            representative_problem, resolve_target, skipped_plugin_notes, sweep_problems)


class _FlagHelp:
    """Help that shows no type for an on/off flag (``--json``, ``--help``): it takes no value."""

    def format_help(self, ctx, formatter):
        for param in self.get_params(ctx):
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        try:
            return super().format_help(ctx, formatter)
        except SystemExit as e:  # typer's help console on a closed pipe: rich's on_broken_pipe, stdout now devnull
            if e.code != 1:
                raise
            raise typer.Exit(0) from None


class Command(_FlagHelp, TyperCommand):
    """The class of every ``linattn`` command (see :class:`_FlagHelp`).

    A malformed ``LINATTN_*`` variable (``ConfigError``, ``dispatch/env.py``), wherever the
    command reads it, is a usage error: one ``error:`` line (or the ``--json`` error document) and
    exit 2, never a traceback. With ``--json``, an error of the command line itself (a missing
    argument, an unknown option, a value out of range, an op given twice: typer's usage errors) is
    the same JSON error document, exit 2; without it, typer's usage panel. Other exceptions
    propagate: they are bugs, not usage errors.
    """

    def make_context(self, info_name, args, parent=None, **extra):
        as_json = "--json" in args  # before parsing: the parser consumes ``args``
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except TyperException as e:
            if as_json:
                fail(e, True, getattr(e, "exit_code", 2))
            raise

    def invoke(self, ctx):
        as_json = any(ctx.params.get(k) for k in ("as_json", "json_"))
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            fail(e, as_json)
        except TyperException as e:
            if as_json:
                fail(e, True, getattr(e, "exit_code", 2))
            raise


class Group(_FlagHelp, TyperGroup):
    """The class of the ``linattn`` command group (see :class:`_FlagHelp`). A reader that closes
    stdout early (``linattn report | head -1``) ends the output, never the verb with a traceback or
    exit 1 (:func:`~linattn.apps.cli_common.output_may_end_early`). With ``--json`` anywhere, an
    error of the group's own options is the JSON error document, as in every command."""

    def make_context(self, info_name, args, parent=None, **extra):
        as_json = "--json" in args  # before parsing: the parser consumes ``args``
        with output_may_end_early():  # --help
            try:
                return super().make_context(info_name, args, parent=parent, **extra)
            except TyperException as e:  # an unknown option before the command: the JSON error with --json
                if as_json:
                    fail(e, True, getattr(e, "exit_code", 2))
                raise

    def invoke(self, ctx):
        with output_may_end_early():
            return super().invoke(ctx)


app = typer.Typer(
    name="linattn",
    help="Explainable dispatch for linear-attention kernels (GDN, KDA) over a state pool.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # help paragraphs reflow to the terminal's (or COLUMNS') width
)

PROFILE_OPT = typer.Option(None, "--profile", metavar="NAME", help=PROFILE_HELP)
PROBE_DEVICE_OPT = typer.Option(None, "--device", metavar="DEV", help="Probe this torch device instead of the default "
                                "(cuda when visible, else cpu): cpu, cuda, cuda:N. Not with --profile.")


def version_doc() -> dict:
    """The ``linattn --version --json`` document: ``{"name": "linattn", "version": ...}``."""
    return {"name": "linattn", "version": linattn.__version__}


@app.callback(invoke_without_command=True)
def _main(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", help="Print linattn's version and exit."),
          as_json: bool = typer.Option(False, "--json", help="With --version: print it as one JSON document, "
                                                             '{"name": "linattn", "version": ...}.')) -> None:
    """Explainable dispatch for linear-attention kernels (GDN, KDA) over a state pool."""
    if version:
        if as_json:
            _emit_json(version_doc())
        else:
            echo(f"linattn {linattn.__version__}")
        raise typer.Exit()
    if as_json:  # --json before the command: each command takes its own
        where = f"after the command: `linattn {ctx.invoked_subcommand} ... --json`" if ctx.invoked_subcommand else \
            "with --version, or after a command (`linattn backends --json`)"
        fail(click.UsageError(f"--json goes {where}", ctx), True, 2)
    if ctx.invoked_subcommand is None:  # options but no command (``linattn`` alone prints the help)
        raise click.UsageError("Missing command.", ctx)


# -- helpers -------------------------------------------------------------------------------------

def _emit_json(doc: Any) -> None:
    emit_json(doc)


def _fail_usage(err: Exception, as_json: bool) -> None:
    """A usage error: the JSON error document or one ``error:`` line, exit 2 (see apps/cli_common.py)."""
    fail(err, as_json, 2)


def _caps_rows(caps) -> list[tuple[str, str]]:
    tc = caps.toolchain
    vendor = "" if caps.vendor in (caps.device_type, caps.name.split()[0].lower()) else f"{caps.vendor}, "
    index = "" if caps.device_index is None else f":{caps.device_index}"
    cc = f"  cc {caps.compute_capability[0]}.{caps.compute_capability[1]}" if caps.compute_capability else ""
    tools = ", ".join(f"{k}={getattr(tc, k)}" for k in ("torch", "triton", "cutlass_dsl", "cuda", "hip")
                      if getattr(tc, k) is not None)
    return [
        ("device", f"{caps.name} ({vendor}{caps.device_type}{index})"),
        ("profile", caps.profile or "(probed)"),
        ("arch", caps.arch + cc),
        ("SMs / CUs / cores", str(caps.sm_count)),
        ("grid limits x / y / z", f"{caps.grid.x:,} / {caps.grid.y:,} / {caps.grid.z:,}"
                                  + (f"  total {caps.grid.total:,}" if caps.grid.total else "")),
        ("grid source", caps.grid.source),
        ("threads per block", f"{caps.max_threads_per_block:,}"),
        ("shared memory per block", f"{caps.shared_memory_per_block:,} B"),
        ("warp size", str(caps.warp_size)),
        ("memory", f"{caps.total_memory / 2**30:.1f} GiB" if caps.total_memory else "-"),
        ("toolchain", tools or "-"),
        ("Triton interpreter", "on" if tc.triton_interpreter else "off"),
    ]


def _caps_table(caps) -> Table:
    t = Table(title="Device capabilities", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    for k, v in _caps_rows(caps):
        t.add_row(k, v)
    return t


# -- report --------------------------------------------------------------------------------------

def _report_cell(v: Optional[dict], chosen: bool) -> Text:
    """One backend's verdict on one op: ``* rank N`` (chosen), ``rank N [unverified]`` or the reason code."""
    if v is None:
        return Text("-")
    if v["status"] != "accepted":
        return Text(v["reason"], style="red")
    mark = "" if v.get("verified", True) else " unverified"
    return Text(f"{'* ' if chosen else ''}rank {v['rank']}{mark}", style="bold green" if chosen else "green")


def _verdicts_table(doc: dict) -> Table:
    t = Table(title="Verdict per op (representative problem; rank: lower runs first)", title_justify="left",
              caption="rank N: eligible (* chosen; unverified: never verified on this arch, self-checks "
                      "against torch-ref on its first eager call); otherwise the reason it is not (op, device, "
                      "arch, toolchain, dtype, shape, not_forced, ...; `linattn explain OP` gives the message and "
                      "hint)",
              caption_justify="left")
    t.add_column("op", style="bold", overflow="fold")  # on a terminal: fold, not cut
    t.add_column("problem", overflow="fold")
    for n in doc["backends"]:
        t.add_column(n, overflow="fold")
    for op, row in doc["ops"].items():
        by = {v["backend"]: v for v in row["verdicts"]}
        t.add_row(op, row["brief"], *(_report_cell(by.get(n), n == row["chosen"]) for n in doc["backends"]))
    return t


def _sweep_cell(r: Optional[dict]) -> Text:
    if r is None:
        return Text("-")
    if r["chosen"]:
        ok = r.get("verified", True)
        return Text(r["chosen"] + ("" if ok else " (unverified)"), style="green" if ok else "yellow")
    return Text("none: " + ",".join(sorted(set(r["rejected"].values()))), style="red")


def _sweep_table(doc: dict, phase: str, sizes: tuple[int, ...], label: str) -> Table:
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
        st.add_row(model, op, *(_sweep_cell(by.get(s)) for s in sizes))
    return st


def _print_report_notes(doc: dict, con: Console) -> None:
    """Unverified backends, self-checks run in this process, preset file problems and plugin load failures."""
    for line in doc.get("preset_problems", []):
        con.print(Text(f"preset left out: {line}", style="bold red"))
    for u in doc.get("unverified", []):
        con.print(Text(f"{u['backend']} for {u['op']}: {u['message']}", style="yellow"))
    for r in doc.get("self_checks", []):
        con.print(Text(f"self-check {'passed' if r['ok'] else 'FAILED'}: {r['backend']} {r['op']} on {r['arch']} "
                       f"({r['shape_class']}): {r['message']}", style="green" if r["ok"] else "bold red"))
    if not doc["plugin_failures"]:
        con.print(Text(f"plugins: {', '.join(p['name'] for p in doc['plugins'])} (all loaded)"))
        return
    ft = Table(title="Plugin load failures", title_justify="left")
    for c in ("plugin", "distribution", "version", "status", "error"):
        ft.add_column(c)
    for p in doc["plugin_failures"]:
        ft.add_row(p["name"], p["distribution"], p["version"], Text(p["status"], style="red"), p["error"])
    con.print(ft)


def _render_report(doc: dict, caps) -> None:
    con = stdout_console()
    con.print(_caps_table(caps))
    con.print(_verdicts_table(doc))
    con.print(_sweep_table(doc, "decode", SWEEP_BATCHES, "batch"))
    con.print(_sweep_table(doc, "prefill", SWEEP_TOKENS, "tokens"))
    _print_report_notes(doc, con)


@app.command(cls=Command, epilog=EPILOG)
def report(profile: Optional[str] = PROFILE_OPT, as_json: bool = JSON_OPT, device: Optional[str] = PROBE_DEVICE_OPT) -> None:
    """Device capabilities, every backend's verdict per op, and a sweep of choices over the model presets."""
    try:
        doc = build_report(profile, device=device)
        caps = resolve_target(profile, device)
    except UsageError as e:
        _fail_usage(e, as_json)
    if as_json:
        _emit_json(doc)
    else:
        _render_report(doc, caps)


# -- explain -------------------------------------------------------------------------------------

def _verdict_cells(v, tuning) -> tuple[str, str, str, str, str, str]:
    measured = ""
    if tuning is not None and tuning.measured:
        ms = tuning.times_ms.get(v.backend)
        measured = f"{ms:.4g}" if ms is not None else ("failed" if v.backend in tuning.failed else "-")
    if v.ok:
        return ("accepted" if v.verified else "accepted, unverified"), "", v.message, "", str(v.rank), measured
    return "rejected", v.reason.value, v.message, v.hint, "", measured


def _trace_table(d) -> Table:
    tuned = d.tuning is not None and d.tuning.measured
    caption = ("measured: the tuned table's median ms in this bucket; the fastest measured accepted backend runs, "
               "then the lowest-ranked unmeasured one, unless one is forced" if tuned else
               "rank: the lowest-ranked accepted backend runs, unless one is forced")
    t = Table(title="Decision trace", title_justify="left", caption=caption, caption_justify="left")
    for c in ("backend", "verdict", "reason", "message", "hint", "rank") + (("measured ms",) if tuned else ()):
        t.add_column(c, overflow="fold")
    for v in d.verdicts:
        cells = _verdict_cells(v, d.tuning)
        verdict, reason, msg, hint, rank = cells[:5]
        chosen = v.backend == d.chosen
        style = "bold green" if chosen else ("green" if v.ok else "")
        t.add_row(Text(("-> " if chosen else "") + v.backend, style=style),
                  Text(verdict + (" (chosen)" if chosen else ""), style="green" if v.ok else "red"),
                  reason, msg, hint, rank, *cells[5:] if tuned else (), style="on grey15" if chosen else None)
    return t


def _tuning_line(d, caps=None) -> Text:
    """Which tuned table the decision read, and what it holds for the problem's bucket; where none is
    in force, why a table file that exists was not used (``caps``: the probed device)."""
    n = d.tuning
    if n is None:
        why = tuning_ignored(caps) if caps is not None else []
        if why:
            return Text.assemble(("tuning ", "bold"), "no tuned table in force, static ranks; ignored: " + "; ".join(why))
        if d.profile:
            return Text.assemble(("tuning ", "bold"), f"a profile ({d.profile}) reads no tuned table: static ranks "
                                 "(on the device itself its table, shipped or from `linattn tune`, ranks)")
        return Text.assemble(("tuning ", "bold"), "no tuned table for this device: static ranks (`linattn tune` makes one)")
    what = "measured" if n.measured else "no entry for this bucket: static ranks"
    return Text.assemble(("tuning ", "bold"), f"{n.origin} table {n.path} (made {n.made}); bucket {n.bucket.label()}: {what}")


def _outcome(d) -> list[Text]:
    """The lines under the trace: the chosen backend (and a note if unverified), or why none runs."""
    if d.chosen:
        v = d.verdict(d.chosen)
        note = [] if v.verified else [Text(f"note: {v.message}", style="yellow")]
        return [Text.assemble(("chosen: ", "bold"), (d.chosen, "bold green")), *note]
    if d.forced:
        v = d.verdict(d.forced)
        why = f"[{v.reason.value}] {v.message}" if not v.ok else ""
        return [Text.assemble(("no backend: ", "bold red"), f"forced backend {d.forced!r} is not eligible {why}")]
    return [Text("no backend accepts this problem", style="bold red")]


def _render_decision(d, prob: Problem, model: str, caps=None) -> None:
    con = stdout_console()
    device = f"{d.device.removesuffix(' (profile)')} (profile {d.profile})" if d.profile else d.device
    con.print(Text.assemble(("op ", "bold"), d.op, ("   model ", "bold"), model, ("   device ", "bold"), device))
    con.print(Text.assemble(("problem ", "bold"), prob.brief()))
    forced = f"{d.forced} (by {d.forced_by})" if d.forced else "none"
    pol = d.policy
    pol_txt = f"force={pol.force} disable={pol.disable} source={pol.source}"
    con.print(Text.assemble(("forced ", "bold"), forced, ("   policy ", "bold"), pol_txt))
    con.print(_tuning_line(d, caps))
    con.print(_trace_table(d))
    for line in _outcome(d):
        con.print(line)
    for note in skipped_plugin_notes():
        con.print(Text(f"note: {note}", style="yellow"))


@app.command(cls=Command, epilog=EPILOG)
def explain(
    op: Optional[str] = op_argument(),
    model: Optional[str] = typer.Option(None, "--model", help="A model preset (default by op family: qwen3-next for "
                                                              "GDN, kimi-linear for KDA, deepseek-v4 for the clamp)."),
    batch: Optional[int] = count_option(None, "--batch", "--seqs", metavar="N",
                                        help="Sequences N (default 1): decode rows, prefill sequences; gating and "
                                             "the clamp take N x L rows."),
    tokens: Optional[int] = count_option(None, "--tokens", metavar="L",
                                         help="Tokens per sequence L: decode tokens per row (default 1; > 1 = "
                                              "speculative verify), prefill tokens per sequence (default 4,096)."),
    total_tokens: Optional[int] = count_option(None, "--total-tokens", metavar="T",
                                               help="Prefill only, instead of --tokens: T packed tokens in all, "
                                                    "sequence lengths unknown (max_seqlen 0 unless N = 1)."),
    profile: Optional[str] = PROFILE_OPT,
    dtype: str = typer.Option("bfloat16", "--dtype", help=f"q/k/v dtype: {', '.join(DTYPE_NAMES)} (float64: the "
                              "reference's oracle mode, run by the PyTorch backends only)."),
    state_dtype: Optional[str] = typer.Option(None, "--state-dtype", help="Decode, prefill: pool dtype, "
                                              f"{', '.join(STATE_DTYPE_NAMES)} (default float32)."),
    layout: Optional[str] = typer.Option(None, "--layout", help="Decode, prefill: pool layout, vk ([P, HV, V, K], "
                                                                "default) or kv ([P, HV, K, V])."),
    mode: Optional[str] = typer.Option(None, "--mode", help="Prefill only: pool (the state pool in place, default) "
                                                            "or dense."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Force this backend (as a call's backend=)."),
    as_json: bool = JSON_OPT,
    device: Optional[str] = PROBE_DEVICE_OPT,
    op_opt: Optional[str] = op_option(),
) -> None:
    """The whole decision trace for one problem. Exit 0 when a backend was chosen, 1 otherwise.

    Nothing runs: the problem is built from a model preset and the sizes, and every backend's
    verdict is asked on the probed device (--device) or a profile (--profile). An option that does
    not apply to the op (--mode on a decode, --tokens on nothing, ...) is an error (exit 2), never
    silently ignored.
    """
    op = one_op(op, op_opt)
    try:
        model = model or (OP_TABLE[op].default_preset if op in OP_TABLE else "qwen3-next")
        prob = problem_for(op, model, batch=batch, tokens=tokens, total_tokens=total_tokens, dtype=dtype,
                           state_dtype=state_dtype, layout=layout, mode=mode)
        caps = resolve_target(profile, device)
        try:
            d = linattn.explain(prob, caps, backend=backend)
        except ValueError as e:  # an unregistered forced backend
            raise UsageError(str(e)) from None
    except UsageError as e:
        _fail_usage(e, as_json)
    if as_json:
        _emit_json(decision_doc(d, prob, model))
    else:
        _render_decision(d, prob, model, caps)
    raise typer.Exit(code=0 if d.chosen else 1)


# -- inventory -------------------------------------------------------------------------------------

@app.command(cls=Command, epilog=EPILOG)
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
        t.add_row(Text(r["name"], style="bold"), r["plugin"], r["distribution"], r["version"], ", ".join(r["ops"]),
                  ", ".join(r["vendors"]), ", ".join(r["dtypes"]), r["summary"])
    con = stdout_console()
    con.print(t)
    if not rows:
        con.print(Text("no backend is registered: see `linattn plugins`", style="bold red"))
    for note in skipped_plugin_notes():
        con.print(Text(f"note: {note}", style="yellow"))


@app.command(cls=Command, epilog=EPILOG)
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
    stdout_console().print(t)


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


def _demo_overrides(shape: Optional[str], prompt_len: Optional[str], output_len: Optional[str],
                    check_every: Optional[int]) -> dict:
    """The demo's hidden test options as :func:`linattn.apps.demo.run_demo` keywords (only those given)."""
    kw = {"check_every": check_every if check_every is not None else DEMO_DEFAULTS["check_every"]}
    if (s := _parse_shape(shape)) is not None:
        kw["shape"] = s
    if (r := _parse_range(prompt_len, "prompt-len")) is not None:
        kw["prompt_len"] = r
    if (r := _parse_range(output_len, "output-len")) is not None:
        kw["output_len"] = r
    return kw


def _fail_run(err: Exception, as_json: bool) -> None:
    """A demo call found no backend, or a backend failed: the trace says why; exit 1, not a traceback.
    The JSON error document carries the decision (``error.decision``) of a ``NoBackendError``."""
    extra = {"decision": err.decision.model_dump(mode="json")} if isinstance(err, linattn.NoBackendError) else {}
    fail(err, as_json, 1, **extra)


@app.command(cls=Command, epilog=EPILOG)
def demo(
    model: str = typer.Option(DEMO_DEFAULTS["model"], "--model", help="qwen3-next (GDN) or kimi-linear (KDA), "
                                                                      "or any gdn/kda preset."),
    requests: int = count_option(DEMO_DEFAULTS["requests"], "--requests", help="Requests in the stream."),
    decode_batch: int = count_option(DEMO_DEFAULTS["decode_batch"], "--decode-batch", "--batch", metavar="N",
                                     help="Decode rows N, fixed (the CUDA-graph size); free rows are "
                                                        "padding (-1)."),
    steps: int = count_option(DEMO_DEFAULTS["steps"], "--steps",
                              help="Scheduler iterations (each: admit + prefill, one decode step)."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEV", help=DEVICE_HELP + " Default: cuda if "
                                                                                           "visible, else cpu."),
    seed: int = typer.Option(DEMO_DEFAULTS["seed"], "--seed", help="Seed of the request stream and the random inputs."),
    as_json: bool = JSON_OPT,
    shape: Optional[str] = typer.Option(None, "--shape", hidden=True, help="Override H,HV,K,V (tests)."),
    prompt_len: Optional[str] = typer.Option(None, "--prompt-len", hidden=True, help="LO,HI prompt tokens."),
    output_len: Optional[str] = typer.Option(None, "--output-len", hidden=True, help="LO,HI decode steps."),
    check_every: Optional[int] = count_option(None, "--check-every", hidden=True, minimum=0,
                                              help="Check every k-th decode step against float64 (0: never)."),
    context_parallel: Optional[int] = count_option(None, "--context-parallel", metavar="N",
                                                   help="Instead: one long prompt across N ranks (gloo on the CPU, "
                                                        "NCCL with >= N GPUs): per-rank time, agreement with one rank."),
    cp_tokens: Optional[int] = count_option(None, "--tokens", "--cp-tokens", metavar="L",
                                            help="With --context-parallel: the prompt's tokens L (one sequence)."),
    profile: Optional[str] = hidden_profile_option(),
) -> None:
    """The main job: serve a request stream through one linear-attention layer over a state pool.

    Runs on --device (a model preset's heads; --shape makes them small for tests). Exit 1 when an
    error against the float64 reference exceeds the docs/ops.md tolerance.
    """
    from linattn.apps.demo import DemoConfigError, render_demo, run_demo

    no_profile(profile, "demo")
    if cp_tokens is not None and context_parallel is None:
        _fail_usage(UsageError(f"--tokens {cp_tokens} is the --context-parallel prompt's length; the request-stream "
                               "demo draws its prompt lengths itself"), as_json)

    if context_parallel is not None:
        stream = dict(requests=requests, decode_batch=decode_batch, steps=steps)
        given = [f"--{k.replace('_', '-')}" for k, val in stream.items() if val != DEMO_DEFAULTS[k]]
        given += [f"--{k.replace('_', '-')}" for k, val in dict(device=device, prompt_len=prompt_len,
                                                               output_len=output_len, check_every=check_every).items()
                  if val is not None]
        if given:  # the request-stream options do not apply to the one-prompt demo
            _fail_usage(UsageError(f"--context-parallel runs one long prompt across ranks; {', '.join(given)}: "
                                   "options of the request-stream demo only (the device follows the ranks: NCCL "
                                   "when torch sees N GPUs, else gloo on the CPU)"), as_json)
        _demo_context_parallel(context_parallel, model, seed, shape, cp_tokens, as_json)
    try:
        kw = _demo_overrides(shape, prompt_len, output_len, check_every)
        rep = run_demo(model=model, requests=requests, decode_batch=decode_batch, steps=steps,
                       device=device, seed=seed, **kw)
    except (UsageError, DemoConfigError) as e:
        _fail_usage(e, as_json)
    except (linattn.NoBackendError, linattn.BackendRunError) as e:
        _fail_run(e, as_json)
    _finish_demo(rep, render_demo, as_json)


def _finish_demo(rep, render, as_json: bool) -> None:
    """Print a demo report (``--json`` or ``render``'s text) and exit 0 when it passed, else 1."""
    if as_json:
        _emit_json(rep.model_dump(mode="json"))
    else:
        render(rep, stdout_console())
    raise typer.Exit(code=0 if rep.passed else 1)


def _demo_context_parallel(ranks: int, model: str, seed: int, shape: Optional[str], tokens: Optional[int],
                           as_json: bool) -> None:
    """``linattn demo --context-parallel N``: apps/demo.py's run_context_parallel_demo; exit 0 / 1 / 2."""
    from linattn.apps.demo import CP_TOKENS, DemoConfigError, render_context_parallel_demo, run_context_parallel_demo

    try:
        rep = run_context_parallel_demo(ranks, model=model, tokens=tokens or CP_TOKENS, seed=seed,
                                        shape=_parse_shape(shape))
    except (UsageError, DemoConfigError) as e:
        _fail_usage(e, as_json)
    _finish_demo(rep, render_context_parallel_demo, as_json)


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
    (into or app).command(name, cls=Command, epilog=EPILOG)(getattr(mod, attr))
    return True


register_optional("linattn.testing.cli", "check", "check")
register_optional("linattn.apps.bench", "bench", "bench")
register_optional("linattn.apps.tune", "tune", "tune")


if __name__ == "__main__":  # pragma: no cover
    app()
