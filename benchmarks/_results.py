"""One schema for every file under ``benchmarks/results/``, and the helper the benchmarks write it with.

A results file is one JSON object with exactly these keys (:class:`Results`):

- ``command``: the command line that produced the rows (as typed, wrappers included);
- ``commit``: the git commit of the code that ran (``$LINATTN_COMMIT`` where set, else ``abc1234``;
  ``abc1234-dirty`` with uncommitted changes; ``unknown ...`` where neither was there);
- ``device``: what it ran on, at least ``name`` (``kind`` ``cuda`` / ``cpu``; ``arch``, memory, count);
- ``toolchain``: versions of python and the packages that matter (None: not installed);
- ``rows``: the measurements, one flat-ish object per row (a ``kind`` field where a file mixes kinds);
- ``notes``: free text (what the rows mean, what was not measured, when it ran).

Each benchmark has one canonical file, ``benchmarks/results/<name>_<device tag>.json`` (the tag from
the device name: ``h200`` on an NVIDIA H200, ``cpu`` on the CPU), overwritten by its next run;
``benchmarks/results/README.md`` says what each shows. ``LINATTN_RESULTS_DIR`` redirects the
default folder (the device wrappers point it at ``$OUT``, the folder that comes back).

Usage::

    from _results import results_path, write_results
    write_results(results_path("decode"), rows, notes=["..."])  # command, commit, device, toolchain filled in

    python benchmarks/_results.py            # check every file under benchmarks/results/ (exit 1 on a problem)
    python benchmarks/_results.py junit DIR --name reliability --command "..."   # junit XML -> schema rows
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The most JSON files ``benchmarks/results/`` may hold, subfolders included (issue "house in order").
MAX_FILES = 15
#: Distributions whose versions a results file records (None where not installed).
PACKAGES = ("torch", "triton", "flash-linear-attention", "fla-core", "nvidia-cutlass-dsl", "pydantic",
            "hypothesis", "linattn")


class Results(BaseModel):
    """One results file. Unknown top-level keys are refused: everything else goes in rows or notes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str
    commit: str
    device: dict[str, Any]
    toolchain: dict[str, str | None]
    rows: list[dict[str, Any]]
    notes: list[str] = []

    @field_validator("command", "commit")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank (write what is known, and say in notes what is not)")
        return v

    @field_validator("device")
    @classmethod
    def _named(cls, v: dict) -> dict:
        if not v.get("name"):
            raise ValueError(f"device needs a 'name' (got keys {sorted(v)})")
        return v


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def current_commit() -> str:
    """``$LINATTN_COMMIT`` where set (a copy of the tree whose ``.git`` is not the one the code came
    from, as on the GPU machine), else ``abc1234`` (``-dirty`` when tracked files differ), else
    ``unknown``."""
    if os.environ.get("LINATTN_COMMIT"):
        return os.environ["LINATTN_COMMIT"]
    head = _git("rev-parse", "--short=7", "HEAD")
    if head:
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return head + ("-dirty" if dirty else "")
    return os.environ.get("LINATTN_COMMIT") or \
        "unknown (no .git here; pass LINATTN_COMMIT=$(git rev-parse --short HEAD))"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info() -> dict[str, Any]:
    """The first CUDA device (name, arch, memory, count) or, without one, the CPU."""
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return {"name": torch.cuda.get_device_name(0), "kind": "cuda", "arch": f"sm_{p.major}{p.minor}",
                    "memory_gib": round(p.total_memory / 2 ** 30, 1), "count": torch.cuda.device_count()}
        threads = torch.get_num_threads()
    except ImportError:
        threads = None
    return {"name": _cpu_name(), "kind": "cpu", "logical_cpus": os.cpu_count(), "torch_threads": threads}


def device_tag(name: str | None = None) -> str:
    """Short lower-case tag of a device name for file names: ``NVIDIA H200`` -> ``h200``; CPU -> ``cpu``."""
    if name is None:
        info = device_info()
        if info["kind"] == "cpu":
            return "cpu"
        name = info["name"]
    for tok in name.split():
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z0-9]*", tok):
            return tok.lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def toolchain_info() -> dict[str, str | None]:
    """Python, CUDA runtime (from torch) and the :data:`PACKAGES` versions."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in PACKAGES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    if "torch" in sys.modules:
        out["cuda"] = getattr(sys.modules["torch"].version, "cuda", None)
    return out


def results_path(name: str, tag: str | None = None) -> Path:
    """The canonical file of benchmark ``name``: ``$LINATTN_RESULTS_DIR`` (default
    ``benchmarks/results``) / ``<name>_<device tag>.json``."""
    folder = Path(os.environ.get("LINATTN_RESULTS_DIR") or RESULTS)
    return folder / f"{name}_{tag or device_tag()}.json"


def invoked_command(argv: list[str] | None = None) -> str:
    """The running script's command line, ``python <script relative to the repo> <args>``."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else None
    shown = os.path.relpath(script, ROOT) if script and script.is_file() else (argv[0] if argv else "?")
    return " ".join(["python", shown, *(shlex.quote(a) for a in argv[1:])])


def make_results(rows: list[dict], notes: list[str] = (), *, command: str | None = None,
                 device: dict | None = None, toolchain: dict | None = None,
                 commit: str | None = None) -> Results:
    """A validated :class:`Results` for ``rows`` from this process.

    Args:
        rows: the measurements (JSON-serialisable dicts).
        notes: free text; a last note ``written <UTC time>`` is appended.
        command: default :func:`invoked_command`; commit, device, toolchain: default the current ones
            (:func:`current_commit`, :func:`device_info`, :func:`toolchain_info`); a ``device`` dict
            given is merged over the probed one.
    Raises:
        pydantic.ValidationError: a blank command or commit, a device without a name.
    """
    return Results(command=command or invoked_command(), commit=commit or current_commit(),
                   device={**device_info(), **(device or {})}, toolchain=toolchain or toolchain_info(),
                   rows=list(rows),
                   notes=[*notes, f"written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC"])


def write_results(path, rows: list[dict], notes: list[str] = (), **kw) -> Results:
    """Write :func:`make_results` (``kw``: its keywords) to ``path`` (its folder created); return it."""
    doc = make_results(rows, notes, **kw)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc.model_dump(), indent=1, default=str) + "\n")
    return doc


def read_results(path) -> Results:
    """Load and validate one results file (pydantic ``ValidationError`` names the field at fault)."""
    return Results.model_validate_json(Path(path).read_text())


def check(folder: Path = RESULTS) -> list[str]:
    """Problems with ``folder``: too many JSON files, or a file that is not a :class:`Results` with rows."""
    files = sorted(folder.rglob("*.json"))
    problems = [f"{len(files)} JSON files under {folder} (at most {MAX_FILES})"] if len(files) > MAX_FILES else []
    for f in files:
        try:
            if not read_results(f).rows:
                problems.append(f"{f.relative_to(folder)}: no rows")
        except Exception as e:  # noqa: BLE001 - reported with the file's name
            problems.append(f"{f.relative_to(folder)}: {type(e).__name__}: {e}")
    return problems


def junit_rows(folder) -> list[dict]:
    """One row per junit XML file in ``folder`` (the group is the file's stem): passed / failed /
    skipped counts, the failed tests (first 40) with their messages, and the wall time."""
    import xml.etree.ElementTree as ET

    rows = []
    for x in sorted(Path(folder).glob("*.xml")):
        counts, failed, secs = {"passed": 0, "failed": 0, "skipped": 0}, [], 0.0
        for tc in ET.parse(x).getroot().iter("testcase"):
            secs += float(tc.get("time", 0) or 0)
            st = next((t for t in ("failure", "error", "skipped") if tc.find(t) is not None), "passed")
            key = {"failure": "failed", "error": "failed"}.get(st, st)
            counts[key] += 1
            if key == "failed":
                msg = (tc.find(st).get("message") or "")[:300]
                failed.append({"test": f"{tc.get('classname')}::{tc.get('name')}", "message": msg})
        rows.append({"group": x.stem, **counts, "test_seconds": round(secs, 1), "failed_tests": failed[:40]})
    return rows


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="check benchmarks/results/, or write a junit summary in the schema")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("check", help="validate every file under benchmarks/results/ (the default)")
    j = sub.add_parser("junit", help="one row per junit XML file of a folder -> results_path(NAME)")
    j.add_argument("folder")
    j.add_argument("--name", required=True, help="benchmark name (file: <name>_<device>.json)")
    j.add_argument("--command", required=True, help="the command that ran the tests")
    j.add_argument("--note", action="append", default=[], help="a note (repeatable)")
    args = ap.parse_args(argv)
    if args.cmd == "junit":
        rows = junit_rows(args.folder)
        path = results_path(args.name)
        write_results(path, rows, args.note, command=args.command)
        print(f"wrote {path}: " + json.dumps({r["group"]: [r["passed"], r["failed"], r["skipped"]] for r in rows}))
        return 0
    found = check()
    for p in found:
        print(p)
    print(f"{len(list(RESULTS.rglob('*.json')))} files checked: " + ("ok" if not found else f"{len(found)} problem(s)"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(_main())
