"""Run ``python -m linattn ARGS`` for several ARGS in one interpreter: import once, fork per run.

Usage: ``python cli_forks.py RUNS_JSON``, where ``RUNS_JSON`` is a list of ``{"args": [...],
"stdout": "closed" | "pipe"}``; prints one JSON list of ``{"code", "stdout", "stderr"}``.

Each run is a forked child of this process, which has done what ``python -m linattn`` does first
(``linattn/__main__.py`` imports ``linattn.apps.cli``) and nothing else: the child points its file
descriptors 1 and 2 at the run's own pipe / file, then runs ``linattn/__main__.py`` as ``__main__``
(``runpy``) and ends as that command ends: click's ``SystemExit`` leaves this module and the
interpreter shuts down as usual, flushing stdout (where a closed pipe would print "Exception
ignored ..."). ``"closed"`` gives stdout a pipe whose reader is closed before the verb writes
(``| head -0``), ``"pipe"`` a pipe read to the end (``| cat``). What a run costs is the verb, not
the ~3 s of importing torch again (tests/cli/test_cli_pipes.py: eight runs in two processes).
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import tempfile

import linattn.apps.cli  # noqa: F401  (the import python -m linattn starts with; the children share it)


def _child(args: list[str], stdout_fd: int, stderr_fd: int) -> None:
    """In the forked child: become ``python -m linattn ARGS`` writing to the given descriptors."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    sys.argv = [sys.argv[0], *args]  # runpy sets argv[0] to linattn/__main__.py's path, as python -m does
    runpy.run_module("linattn", run_name="__main__", alter_sys=True)
    sys.exit(0)  # __main__ ran to its end without raising SystemExit: python -m exits 0 then


def _run(args: list[str], stdout: str) -> dict:
    read_end, write_end = os.pipe()
    if stdout == "closed":
        os.close(read_end)  # the reader goes away before the verb's first write
    err = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        if stdout != "closed":
            os.close(read_end)
        _child(args, write_end, err.fileno())  # never returns: SystemExit ends the child's interpreter
    os.close(write_end)
    out = b""
    if stdout != "closed":
        with os.fdopen(read_end, "rb") as r:
            out = r.read()
    _, status = os.waitpid(pid, 0)
    with err:
        err.seek(0)
        return dict(code=os.waitstatus_to_exitcode(status), stdout=out.decode(), stderr=err.read().decode())


if __name__ == "__main__":
    # the objects of the import above never collected: a child's interpreter shutdown then skips them
    # instead of touching (copying) every page of the ~3 s import (0.9 -> 0.3 s a child here)
    gc.freeze()
    results = [_run(run["args"], run["stdout"]) for run in json.loads(sys.argv[1])]
    print(json.dumps(results))
