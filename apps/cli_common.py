"""The grammar every ``linattn`` verb shares: its options, one JSON error shape, the stdout console.

One meaning per name, in every verb that takes it (issue 30, section 5):

- the op: ``OP`` positional or ``--op OP`` (one of them, the same value if both);
- ``--batch N`` (also spelt ``--seqs N``): the sequences of the call, decode rows N or prefill
  sequences N (``cu_seqlens [N+1]``); gating and the clamp have no sequences, their rows are N x L;
- ``--tokens L``: tokens per sequence, decode tokens per row T (1 = decode, > 1 = speculative
  verify) or prefill tokens per sequence L (packed ``T = N L``);
- ``--device DEV``: the torch device a verb runs on, or probes (``cpu``, ``cuda``, ``cuda:N``);
- ``--profile NAME``: a device a verb plans for without having it (``sm90``, ``mi300x``, ...):
  only the verbs that decide (``explain``, ``report``); the verbs that run kernels refuse it and
  say which verb to use;
- ``--json``: exactly one JSON document on stdout; an error is ``{"error": {"type", "message",
  "exit_code", ...}}`` with the exit code of the text mode (2: a usage error).

The verbs' modules (``apps/cli.py``, ``bench.py``, ``tune.py``, ``testing/cli.py``) take their
options and error handling from here, so they cannot drift apart.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.exceptions import TyperException

from linattn.apps.report import SIZE_MAX
from linattn.dispatch.plugin.problem import OPS

__all__ = ["DEVICE_HELP", "EPILOG", "JSON_OPT", "PIPE_WIDTH", "PROFILE_HELP", "PROFILES_TEXT", "count_option", "echo", "error_doc",
           "emit_json", "fail", "hidden_profile_option", "no_profile", "one_op", "op_argument", "op_option",
           "output_may_end_early", "quiet_stdout", "stdout_console"]

#: Width of tables written to a pipe or file when ``COLUMNS`` is not set: no cell is cut or folded.
PIPE_WIDTH = 10_000

PROFILES_TEXT = "sm90, sm100, sm103, sm120, mi300x, mi355x, xpu-pvc, cpu"
PROFILE_HELP = (f"Plan for this device without having it: a profile ({PROFILES_TEXT}). Default: the probed "
                "device. Not with --device.")
DEVICE_HELP = "The torch device to run on: cpu, cuda or cuda:N."

#: Under every verb's help: what the shared names mean (typer shows it below the options).
EPILOG = ("**Sizes** (every verb): `--batch N` (or `--seqs N`) is the sequences of a call: decode rows, prefill "
          "sequences; `--tokens L` is tokens per sequence: decode tokens per row (> 1 = speculative verify), "
          "prefill tokens per sequence; gating and the clamp take N x L rows; a verb refuses a size it cannot "
          "take (exit 2). "
          "**Where**: `--device` is a torch device a verb runs on (demo, bench, tune, check) or probes (explain, "
          "report); `--profile` is a device explain and report plan for without having it (sm90, mi300x, ...). "
          "`--json`: one JSON document; an error is `{\"error\": {\"type\", \"message\", \"exit_code\"}}`.")

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document instead of tables (an error too).")


def count_option(default: Any, *names: str, minimum: int = 1, maximum: int = SIZE_MAX, **kw: Any):
    """An option that counts (sequences, tokens, requests, steps, ranks, repeats): an int from ``minimum``
    to ``maximum``, else a usage error (exit 2) that names the option and the bound.

    ``minimum`` is 1 where zero is meaningless (``--batch 0``, ``--tokens 0``), 0 where zero means
    none (``--warmup``, ``--check-every``). Help shows ``[x>=1]``; the upper bound (an int32:
    :data:`~linattn.apps.report.SIZE_MAX`, the kernels' index type) is checked by a callback rather
    than click's range, whose help would print ``[1<=x<=2147483647]``. A list option (``--batch``
    repeated) is checked item by item.
    """

    def at_most(value: Any) -> Any:
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if v is not None and v > maximum:
                raise typer.BadParameter(f"{v} is beyond the largest count, {maximum}"
                                         + (" (an int32: the kernels index with int32)" if maximum == SIZE_MAX else ""))
        return value

    kw.setdefault("metavar", "N")  # not typer's "<int range>"
    return typer.Option(default, *names, min=minimum, callback=at_most, **kw)


def op_argument(ops: tuple[str, ...] = OPS, required: bool = True):
    """The op as a positional ``OP`` (or ``--op``, :func:`op_option`); resolved by :func:`one_op`."""
    what = "The op" if required else "Only this op"
    return typer.Argument(None, metavar="OP", show_default=False,
                          help=f"{what}: {', '.join(ops)}. Or give it as --op.")


def op_option():
    """``--op OP``: the same as the positional op (:func:`op_argument`)."""
    return typer.Option(None, "--op", metavar="OP", help="The op, as an option (the same as the positional OP).")


def one_op(positional: Optional[str], option: Optional[str], *, required: bool = True) -> Optional[str]:
    """The op a verb was given, as ``OP`` or ``--op OP``.

    Raises:
        typer.BadParameter: neither was given (``required``), or both with different values (a usage
            error: exit 2, or the JSON error document with ``--json``).
    """
    if positional is not None and option is not None and positional != option:
        raise typer.BadParameter(f"the op is given twice, as {positional!r} and as --op {option!r}; give one",
                                 param_hint="OP / --op")
    op = positional if positional is not None else option
    if op is None and required:
        raise typer.BadParameter(f"missing: give the op as OP or --op OP, one of {', '.join(OPS)}",
                                 param_hint="OP / --op")
    return op


def no_profile(profile: Optional[str], verb: str) -> None:
    """A verb that runs kernels is given ``--profile``: refuse it, saying what to do instead.

    Raises:
        typer.BadParameter: ``profile`` is not None (a usage error, as :func:`one_op`).
    """
    if profile is not None:
        raise typer.BadParameter(f"--profile {profile} plans for a device without having it, but `linattn {verb}` runs "
                               f"kernels, so it runs on --device (cpu, cuda, cuda:N); to see what would run on "
                               f"{profile}: linattn explain OP --profile {profile}", param_hint="'--profile'")


def hidden_profile_option():
    """``--profile`` on a verb that runs kernels: accepted by the parser, refused by :func:`no_profile`."""
    return typer.Option(None, "--profile", hidden=True, help="Refused: see --device.")


def quiet_stdout() -> None:
    """The reader of stdout went away (``linattn report | head -1``): point stdout at devnull, so that
    neither a later write nor the interpreter's last flush raises ``BrokenPipeError``. Python's advice
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe); the verb then ends quietly with its
    own exit code (0 when it succeeded), never a traceback. A stdout without a file descriptor (a test
    runner's buffer) is left as it is."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _StdoutConsole(Console):
    """rich's console, except that a closed pipe (rich's ``on_broken_pipe``, which exits 1) makes it
    quiet (:func:`quiet_stdout`) and lets the verb finish."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        quiet_stdout()


def stdout_console() -> Console:
    """A console on stdout: on a terminal its width; piped, ``COLUMNS`` when set, else :data:`PIPE_WIDTH`.

    Tables fold long cells to fit the width; written to a pipe or a file without ``COLUMNS`` they keep
    every cell whole on its line (``linattn backends | grep torch-ref`` finds the whole row);
    ``COLUMNS=100 linattn report | less`` gets tables 100 columns wide (rich reads ``COLUMNS``). A reader
    that closes the pipe early (``| head -1``) ends the output, not the verb (:func:`quiet_stdout`).
    """
    con = _StdoutConsole(soft_wrap=False)
    if con.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return con
    return _StdoutConsole(soft_wrap=False, width=PIPE_WIDTH)


def echo(text: str) -> None:
    """``typer.echo(text)`` on stdout; a reader that closed the pipe early ends the output quietly
    (:func:`quiet_stdout`), not the verb."""
    try:
        typer.echo(text)
    except BrokenPipeError:
        quiet_stdout()


@contextmanager
def output_may_end_early() -> Iterator[None]:
    """Around the whole command: a ``BrokenPipeError`` from a write :func:`echo` and
    :func:`stdout_console` do not cover (click's help, a plugin's print) ends the verb quietly with
    exit 0 (:func:`quiet_stdout`), not click's exit 1."""
    try:
        yield
    except BrokenPipeError:
        quiet_stdout()
        raise typer.Exit(0) from None


def emit_json(doc: Any) -> None:
    """Print ``doc`` as the one JSON document of a ``--json`` run."""
    echo(json.dumps(doc, indent=2, default=str))


def error_doc(err: BaseException, exit_code: int, **extra: Any) -> dict:
    """The JSON error document every verb prints with ``--json``.

    Returns:
        ``{"error": {"type": <exception class>, "message": <text>, "exit_code": <code>, **extra}}``.
    """
    if isinstance(err, TyperException):  # typer's (click's) usage errors: "Invalid value for ..."
        msg = err.format_message()
    elif isinstance(err, KeyError) and err.args:
        msg = str(err.args[0])
    else:
        msg = str(err)
    return {"error": {"type": type(err).__name__, "message": msg, "exit_code": exit_code, **extra}}


def fail(err: BaseException, as_json: bool, exit_code: int = 2, **extra: Any) -> NoReturn:
    """End the verb on ``err``: the JSON error document (``as_json``) on stdout, else one ``error:``
    line on stderr; exit ``exit_code`` (2: a usage error, 1: the run failed). ``extra`` goes into the
    JSON document only."""
    doc = error_doc(err, exit_code, **extra)
    if as_json:
        emit_json(doc)
    else:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(doc['error']['message'])}", markup=True,
                                   highlight=False, soft_wrap=True)
    raise typer.Exit(code=exit_code)
