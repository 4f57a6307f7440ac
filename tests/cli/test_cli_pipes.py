"""The CLI behind a pipe: a reader that closes early (``linattn report | head -1``) ends the output,
not the verb (no traceback, the verb's own exit code); progress never reaches stdout.

These run ``python -m linattn`` in a subprocess: the closed pipe is the real file descriptor's.
"""

import json
import subprocess
import sys

import pytest
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


def _closed_reader(args: tuple) -> subprocess.Popen:
    """Start ``linattn ARGS`` with stdout a pipe whose reader is closed before the verb writes."""
    p = subprocess.Popen([sys.executable, "-m", "linattn", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader goes away (``| head -0``): the verb's first write meets a closed pipe
    return p


def test_a_reader_closing_the_pipe_early_ends_the_output_quietly_with_the_verbs_exit_code():
    procs = [(args, code, _closed_reader(args)) for args, code in CLOSED_EARLY]  # all at once: ~2 s each
    for args, code, p in procs:
        err = p.stderr.read().decode()
        p.stderr.close()
        assert p.wait(timeout=120) == code, (args, err)
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, (args, err)


def test_check_shows_no_progress_on_stdout_when_piped():
    res = CliRunner().invoke(cli.app, ["check", "silu_and_mul_clamp", "--backend", "torch-ref"], env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].startswith("linattn check: torch-ref")  # the report first, no bar before it
    assert "done" not in res.output  # nor on stderr: the bar is drawn on a terminal only


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_check_piped_stdout_is_the_report_alone(extra):
    p = subprocess.run([sys.executable, "-m", "linattn", "check", "silu_and_mul_clamp", "--backend", "torch-ref",
                        *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    if extra:
        assert json.loads(p.stdout)["status"] == "passed"  # pure JSON
    else:
        assert p.stdout.startswith("linattn check: torch-ref") and "━━━" not in p.stdout.split("\n", 1)[0]
    assert "done" not in p.stderr
