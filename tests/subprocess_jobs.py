"""The compile checks' subprocesses, started ahead of their tests on a second core.

The sm_90 / AMD build tests (``tests/contract/test_compile*.py``, ``tests/prefill/test_prefill_compile.py``,
``tests/kernels/test_sm90_digests.py``) each run one long subprocess that builds kernels and prints
what it measured; the test then holds that output against its tables. The subprocesses need nothing
from the tests that run before them, so once collection is over (``tests/conftest.py``:
``pytest_collection_finish``) the selected ones start, one at a time and in suite order, in a
background thread, while the main process runs the interpreter tests on the other core. A test
asks for its subprocess's result with :func:`result`: it waits for it, or runs it itself when it
was not started ahead (a worker of ``pytest -n``, or a subprocess not selected ahead). Only where the
commands run changes: every command and every assertion on its output is the test's own.

A module registers its command at import (:func:`register`) and marks the test that reads it with
``@pytest.mark.subprocess_job(key)``.
"""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Job:
    argv: list[str]
    env: Optional[dict] = None
    cwd: Optional[str] = None
    timeout: float = 600
    claimed: bool = False  # taken by the background thread or by the test itself
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Optional[subprocess.CompletedProcess] = None
    error: Optional[BaseException] = None
    proc: Optional[subprocess.Popen] = None

    def run(self) -> None:
        try:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=self.env, cwd=self.cwd)
            try:
                out, err = self.proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
                raise
            self.outcome = subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)
        except BaseException as e:  # handed to the test that reads the job
            self.error = e
        finally:
            self.done.set()


_JOBS: dict[str, Job] = {}
_LOCK = threading.Lock()


def register(key: str, argv: list[str], env: Optional[dict] = None, cwd: Optional[str] = None,
             timeout: float = 600) -> None:
    """Record the command of job ``key`` (nothing starts). Registering a key again keeps the first."""
    with _LOCK:
        _JOBS.setdefault(key, Job(list(argv), env, cwd, timeout))


def _claim(key: str) -> Optional[Job]:
    with _LOCK:
        job = _JOBS.get(key)
        if job is None or job.claimed:
            return None
        job.claimed = True
        return job


def start_ahead(keys: list[str]) -> None:
    """Run the registered jobs ``keys`` one after another in a daemon thread (unknown keys are skipped)."""
    keys = [k for k in dict.fromkeys(keys) if k in _JOBS]
    if not keys:
        return

    def worker():
        for key in keys:
            job = _claim(key)
            if job is not None:
                job.run()

    threading.Thread(target=worker, name="subprocess-jobs", daemon=True).start()


def result(key: str) -> subprocess.CompletedProcess:
    """The finished subprocess of job ``key``: waits for the background run, or runs it now.
    Raises what the run raised (``subprocess.TimeoutExpired`` past the job's timeout)."""
    job = _JOBS[key]
    mine = _claim(key)
    if mine is not None:
        mine.run()
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.outcome


def stop_all() -> None:
    """Kill any job subprocess still running (the session is over)."""
    for job in list(_JOBS.values()):
        if job.proc is not None and job.proc.poll() is None:
            job.proc.kill()
