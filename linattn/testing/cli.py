"""``linattn check``: the conformance suite on this device, with progress and a summary table.

    linattn check --backend cpu-chunked                 # one backend, every op it declares
    linattn check --backend torch-ref --op gdn_decode   # one op (or: linattn check gdn_decode --backend torch-ref)
    linattn check --xfail linattn-xfail.toml --json     # every backend available here, as JSON

Exit codes: 0 every case passed (or is a recorded xfail); 1 a case failed; 2 a bad argument (an
unknown backend or op, an unreadable xfail file); 3 a backend named with ``--backend`` does not
run on this device (e.g. ``cutedsl`` on a CPU: only its negative cases ran, the report says why;
not a pass).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from linattn.apps.cli_common import (DEVICE_HELP, JSON_OPT, emit_json, fail, hidden_profile_option, no_profile, one_op,
                                     op_argument)
from linattn.dispatch import OPS, get_registry

from .runner import SuiteReport, availability, plan, run_suite
from .xfail import load_xfail

from linattn._namespace import public_dir

__all__ = ["check"]
__dir__ = public_dir(__name__, __all__)

_STATUS_STYLE = {"passed": "green", "failed": "bold red", "xfail": "yellow", "xpass": "magenta", "skipped": "dim"}


def _summary_table(rep: SuiteReport) -> Table:
    t = Table(title=escape(f"linattn check: {rep.backend} ({rep.distribution} {rep.version}, plugin {rep.plugin}) "
                           f"on {rep.device}"), title_justify="left")
    t.add_column("op")
    t.add_column("kind")
    for status in ("passed", "failed", "xfail", "xpass", "skipped"):
        t.add_column(status, justify="right", style=_STATUS_STYLE[status])
    rows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rep.results:
        rows[(r.op, r.kind)][r.status] += 1
    for (op, kind), counts in sorted(rows.items()):
        t.add_row(op, kind, *(str(counts.get(s, 0) or "") for s in ("passed", "failed", "xfail", "xpass", "skipped")))
    return t


def _render(rep: SuiteReport, console: Console) -> None:
    console.print(_summary_table(rep))
    for r in rep.results:
        if r.status == "failed":
            console.print(f"[bold red]FAILED[/] {escape(r.id)}\n    {escape(r.what)}\n    {escape(r.message)}",
                          highlight=False)
    for r in rep.results:
        if r.status in ("xfail", "xpass"):
            console.print(f"[yellow]{r.status.upper()}[/] {escape(r.id)}: {escape(r.xfail_reason)}"
                          + (f"\n    {escape(r.message)}" if r.message else ""), highlight=False)
    skipped = [r for r in rep.results if r.status == "skipped"]
    if skipped:
        reasons = defaultdict(int)
        for r in skipped:
            reasons[r.message] += 1
        for msg, n in reasons.items():
            console.print(f"[dim]skipped {n}: {escape(msg)}[/]", highlight=False)
    for note in rep.notes:
        console.print(f"[dim]note: {escape(note)}[/]", highlight=False)
    c = rep.counts
    verdict = {"passed": "[bold green]PASSED[/]", "failed": "[bold red]FAILED[/]",
               "not_available": "[bold yellow]NOT AVAILABLE[/]"}[rep.status]
    console.print(f"{verdict} {rep.backend}: {c['passed']} passed, {c['failed']} failed, {c['xfail']} xfail, "
                  f"{c['xpass']} xpass, {c['skipped']} skipped")
    if rep.status == "not_available":
        why = next(w for w in rep.availability.values() if w)
        console.print(f"[yellow]{escape(rep.backend)} does not run on {escape(rep.device)}, so none of its accuracy "
                      f"or pool cases ran (only the negative ones): {escape(why)}[/]", highlight=False)


def _targets(backend: Optional[str], op: Optional[str], device: str) -> tuple[list[str], list[str]]:
    """The backends to check and notes on those skipped (not available on this device)."""
    reg = get_registry()
    if backend is not None:
        return [backend], []
    names, notes = [], []
    for name, b in sorted(reg.backends.items()):
        ops = [op] if op else list(OPS)
        avail = availability(b, ops, device)
        if avail and any(why is None for why in avail.values()):
            names.append(name)
        else:
            why = next(iter(avail.values()), None) if avail else f"does not declare {op}"
            notes.append(f"{name}: not checked, not available on {device}: {why}")
    return names, notes


def _check_device(device: str) -> str:
    """``device`` if the suite can run there; raises ValueError naming ``--device`` otherwise
    (``meta``: shapes without data; not a torch device string)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "meta":
        raise ValueError("--device meta: meta tensors hold shapes but no data, so no case can run or be "
                         "compared there; use --device cpu or --device cuda")
    return device


def _prepare(backend: Optional[str], op: Optional[str], xfail: Optional[Path], device: str):
    """The xfail rules, the backends to check and notes on the others; a bad argument raises.

    Raises:
        ValueError: an unknown backend or op, or a device the suite cannot run on.
        FileNotFoundError: the xfail file does not exist.
    """
    _check_device(device)
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    try:
        rules = load_xfail(xfail)
    except (ValueError, FileNotFoundError) as e:  # each names the file: "xfail file PATH: why"
        kind = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
        raise kind(f"--xfail {str(e).removeprefix('xfail file ')}") from None
    plan(backend or "torch-ref", device=device, kinds=())  # unknown backend or unusable device: ValueError
    names, notes = _targets(backend, op, device)
    return rules, names, notes


def _run_with_progress(names: list[str], ops: Optional[list[str]], device: str, rules) -> list[SuiteReport]:
    """Run each backend's suite under a progress bar (one task per backend) on stderr, and only when
    stderr is a terminal: stdout holds the report alone, and a pipe or log file gets no bar."""
    reports: list[SuiteReport] = []
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[backend]}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    err = Console(stderr=True)
    with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as progress:
        for name in names:
            task = progress.add_task("", backend=name, total=None)

            def on_result(res, i, total, task=task):
                mark = "" if res.status == "passed" else f" [{_STATUS_STYLE[res.status]}]{res.status}[/]"
                progress.update(task, completed=i + 1, total=total, description=f"{escape(res.id)}{mark}")

            reports.append(run_suite(name, ops=ops, device=device, xfail=rules, on_result=on_result))
            progress.update(task, description="done")
    return reports


def _run_text(names: list[str], ops: Optional[list[str]], device: str, rules, notes: list[str]) -> list[SuiteReport]:
    """Run with progress, then print each report, the notes, or that nothing could be checked."""
    from linattn.apps.cli import stdout_console

    console = stdout_console()
    reports = _run_with_progress(names, ops, device, rules)
    for rep in reports:
        _render(rep, console)
    for note in notes:
        console.print(f"[dim]{escape(note)}[/]", highlight=False)
    if not reports:
        console.print("[yellow]no backend to check on this device[/]")
    return reports


def _run_json(names: list[str], ops: Optional[list[str]], device: str, rules, notes: list[str]) -> list[SuiteReport]:
    """Run every suite quietly, then print one JSON document."""
    reports = [run_suite(name, ops=ops, device=device, xfail=rules) for name in names]
    doc = {"device": device, "ok": all(r.status == "passed" for r in reports), "status": _status(reports),
           "notes": notes, "backends": [r.to_dict() for r in reports]}
    emit_json(doc)
    return reports


def check(
    op_arg: Optional[str] = op_argument(required=False),
    backend: Optional[str] = typer.Option(None, "--backend", help="The backend to check (default: every "
                                                                 "registered backend available on the device)."),
    op: Optional[str] = typer.Option(None, "--op", metavar="OP", help="Only this op, as an option (the same as the "
                                                                     "positional OP)."),
    json_: bool = JSON_OPT,
    xfail: Optional[Path] = typer.Option(None, "--xfail", help=escape("A TOML file of known gaps: [[xfail]] tables "
                                                                      "of case = 'ID-PATTERN', reason = '...'.")),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEV", help=DEVICE_HELP + " Default: cpu (the "
                                                                                           "suite's cases are small)."),
    profile: Optional[str] = hidden_profile_option(),
) -> None:
    """Run the conformance suite: cases from each backend's declared capabilities, compared with the
    float64 reference at the docs/ops.md tolerances, negative cases, the pool rules.

    Exit codes: 0 every case passed (or is a recorded xfail); 1 a case failed; 2 a bad argument
    (an unknown backend or op, an unreadable xfail file, a device that cannot hold data such as
    meta); 3 the backend named with --backend does not run on this device (not a pass).
    """
    op = one_op(op_arg, op, required=False)
    no_profile(profile, "check")
    dev = device or "cpu"
    try:
        rules, names, notes = _prepare(backend, op, xfail, dev)
    except (ValueError, FileNotFoundError) as e:
        fail(e, json_, 2)
    ops = [op] if op else None
    reports = (_run_json if json_ else _run_text)(names, ops, dev, rules, notes)
    status = _status(reports)
    if status != "passed":
        raise typer.Exit(code=1 if status == "failed" else 3)


def _status(reports: list[SuiteReport]) -> str:
    """``failed`` if any report failed, else ``not_available`` if any backend did not run here, else ``passed``."""
    states = {r.status for r in reports}
    return "failed" if "failed" in states else "not_available" if "not_available" in states else "passed"
