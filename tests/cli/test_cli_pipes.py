"""The CLI behind a pipe: a reader that closes early (``linattn report | head -1``) ends the output,
not the verb (no traceback, the verb's own exit code); progress never reaches stdout.

These run ``python -m linattn`` in a subprocess: the closed pipe is the real file descriptor's. One
subprocess per test imports linattn once and forks a child per command (tests/cli/cli_forks.py), so
the eight commands pay for one import of torch per test, not one each.
"""

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import linattn.apps.cli as cli

#: (arguments, the verb's own exit code): explain with a forced backend that is not eligible exits 1.
CLOSED_EARLY = [
    (("report", "--profile", "cpu"), 0),
    (("report", "--profile", "cpu", "--json"), 0),
    (("explain", "gdn_decode", "--profile", "cpu"), 0),
    (("explain", "gdn_decode", "--profile", "cpu", "--json"), 0),
    (("explain", "gdn_decode", "--profile", "cpu", "--backend", "triton-split"), 1),
    (("explain", "--help"), 0),
]


def _forked_runs(runs: list[dict]) -> list[dict]:
    """``python -m linattn ARGS`` for every run, each a fork of one interpreter that imported linattn once
    (tests/cli/cli_forks.py: each child runs linattn/__main__.py and ends as the command ends); a run's
    ``stdout`` is ``"closed"`` (a pipe whose reader is gone before the verb writes) or ``"pipe"``."""
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("cli_forks.py")), json.dumps(runs)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_reader_closing_the_pipe_early_ends_the_output_quietly_with_the_verbs_exit_code():
    runs = _forked_runs([dict(args=list(args), stdout="closed") for args, _ in CLOSED_EARLY])
    assert len(runs) == len(CLOSED_EARLY)
    for (args, code), run in zip(CLOSED_EARLY, runs):
        err = run["stderr"]
        assert run["code"] == code, (args, err)
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, (args, err)


def test_check_shows_no_progress_on_stdout_when_piped():
    res = CliRunner().invoke(cli.app, ["check", "silu_and_mul_clamp", "--backend", "torch-ref"], env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].startswith("linattn check: torch-ref")  # the report first, no bar before it
    assert "done" not in res.output  # nor on stderr: the bar is drawn on a terminal only


def test_check_piped_stdout_is_the_report_alone():
    """``linattn check`` with stdout a pipe, as text and as ``--json`` (both runs in one process:
    :func:`_forked_runs`): the report alone on stdout, no progress bar on either stream."""
    extras = [(), ("--json",)]
    runs = _forked_runs([dict(args=["check", "silu_and_mul_clamp", "--backend", "torch-ref", *extra], stdout="pipe")
                         for extra in extras])
    assert len(runs) == len(extras)
    for extra, p in zip(extras, runs):
        assert p["code"] == 0, (extra, p["stderr"])
        if extra:
            assert json.loads(p["stdout"])["status"] == "passed"  # pure JSON
        else:
            assert p["stdout"].startswith("linattn check: torch-ref") and "━━━" not in p["stdout"].split("\n", 1)[0]
        assert "done" not in p["stderr"], extra
