"""Selection by measurement: the tuned table, its key, where it lives, and what selection reads of it.

``linattn tune`` (``apps/tune.py``) times every eligible backend of this device over shape
**buckets** and writes a :class:`TuneTable`; selection then ranks the accepted backends of a call
by the table's measured times where the table has the call's bucket, and by their static rank
(:class:`~linattn.dispatch.plugin.verdict.Rank`) elsewhere (``docs/architecture.md``, "Selection by
measurement").

- **Bucket** (:class:`Bucket`, :func:`bucket_of`): the op (hence its family), ``floor(log2)`` of the
  tokens (``Problem.t``: tokens per row for decode, packed tokens for prefill) and of the sequences
  (``Problem.n``), the heads per rank (``h``, ``hv``), the head dims (``k``, ``v``) and the dtypes
  (``dtype``, ``state_dtype``). Everything but the two logarithms is already in the decision
  cache's shape class, so selection adds only ``(log2 tokens, log2 sequences)`` to the shape class
  (:meth:`Tuning.bucket_key`): two calls in one bucket share one cached decision, and a table costs
  nothing per call (it is read on a decision-cache miss only).
- **Key** (:class:`TableKey`, :func:`current_key`): the device's name and arch, the driver version,
  and the versions of torch, triton, linattn and each peer library (FLA, FlashInfer, CuTe DSL). A
  table whose key differs from this process's is ignored, with one INFO line on the ``linattn``
  logger saying which field differs.
- **Where**: the user's table is ``<dir>/<device>-<arch>.json``, ``<dir>`` being
  ``LINATTN_TUNE_DIR`` or platformdirs' user cache dir for ``linattn`` plus ``tune``. When there is
  none, the table shipped with the package for the arch (``linattn/tuned/<arch>.json``) is read, if
  one ships. Only a probed device has a table; a profile (``explain --profile sm90``) never does.
- ``LINATTN_TUNED=0``: no table is read (static ranks only; the test suite runs so, but for its
  tuning tests) and nothing is autotuned. ``LINATTN_AUTOTUNE=1``: a decode or prefill call whose bucket the table lacks measures it on
  its first eager call (never during CUDA-graph capture) and the entry is added to the user's table.

Example:
    >>> from linattn.dispatch import Problem
    >>> bucket_of(Problem(op="gdn_prefill", n=16, t=65536, h=16, hv=32, k=128, v=128)).label()
    'gdn_prefill T~2^16 N~2^4 H16/HV32 K128/V128 bfloat16/float32'
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import re
import threading
from importlib import metadata, resources
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..env import env_switch
from ..rules.ops_table import OP_TABLE
from .problem import Problem

log = logging.getLogger("linattn")

TUNE_DIR_VAR = "LINATTN_TUNE_DIR"
AUTOTUNE_VAR = "LINATTN_AUTOTUNE"
TUNED_VAR = "LINATTN_TUNED"
FORMAT = 1
#: the ops a table ranks (the stateful ones: decode and prefill of both families)
TUNED_OPS = tuple(op for op, spec in OP_TABLE.items() if spec.phase in ("decode", "prefill"))
#: distributions whose versions key a table: the stack under every backend and each peer library
VERSIONED = ("torch", "triton", "linattn", "nvidia-cutlass-dsl", "fla-core", "flashinfer-python")

__all__ = ["AUTOTUNE_VAR", "Bucket", "Entry", "TUNED_VAR", "TUNE_DIR_VAR", "TableKey", "TuneTable", "Tuned", "Tuning", "TuningNote",
           "bucket_of", "current_key", "shipped_path", "table_path", "tune_dir"]


def _log2(x: int) -> int:
    return max(int(x), 1).bit_length() - 1


class Bucket(BaseModel):
    """One cell of the table: calls whose op, heads, head dims and dtypes are these, with
    ``2**log2_tokens <= t < 2**(log2_tokens + 1)`` and the same for ``n`` (``log2_seqs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str
    family: str
    log2_tokens: int = Field(ge=0, description="floor(log2(t)): tokens per row (decode), packed tokens (prefill)")
    log2_seqs: int = Field(ge=0, description="floor(log2(n)): decode rows or prefill sequences")
    h: int
    hv: int
    k: int
    v: int
    dtype: str
    state_dtype: str

    def label(self) -> str:
        return (f"{self.op} T~2^{self.log2_tokens} N~2^{self.log2_seqs} H{self.h}/HV{self.hv} K{self.k}/V{self.v} "
                f"{self.dtype}/{self.state_dtype}")

    def problem(self) -> Problem:
        """The bucket's representative problem (its smallest sizes: ``n = 2**log2_seqs``,
        ``t = 2**log2_tokens``, prefill sequences of equal length): what ``linattn tune`` times.
        ``max_seqlen`` as validation derives it from ``cu_seqlens`` (known for one sequence only)."""
        n, t = 1 << self.log2_seqs, 1 << self.log2_tokens
        prefill = OP_TABLE[self.op].phase == "prefill"
        return Problem(op=self.op, n=n, t=t, h=self.h, hv=self.hv, k=self.k, v=self.v, dtype=self.dtype,
                       state_dtype=self.state_dtype, max_seqlen=(t if prefill and n == 1 else 0))


def bucket_of(p: Problem) -> Bucket:
    """The bucket of problem ``p`` (module docstring)."""
    return Bucket(op=p.op, family=p.family, log2_tokens=_log2(p.t), log2_seqs=_log2(p.n), h=p.h, hv=p.hv, k=p.k,
                  v=p.v, dtype=p.dtype, state_dtype=p.state_dtype)


class Entry(BaseModel):
    """The measurement of one bucket: the median milliseconds of each backend that ran, through the
    public op with the backend forced (host cost included), and the error of each that raised."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: Bucket
    shape: str = Field("", description="the problem timed, Problem.brief()")
    times_ms: dict[str, float] = Field(default_factory=dict, description="backend -> median ms")
    failed: dict[str, str] = Field(default_factory=dict, description="backend -> the exception it raised")


class TableKey(BaseModel):
    """What a table was measured with: a table is read only by a process whose key is equal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str
    arch: str
    driver: Optional[str] = None
    versions: dict[str, Optional[str]] = Field(default_factory=dict, description="distribution -> version (None: absent)")

    def differences(self, other: "TableKey") -> list[str]:
        """``field: table's value != this process's`` for every field that differs."""
        out = [f"{f}: {getattr(self, f)!r} != {getattr(other, f)!r}" for f in ("device", "arch", "driver")
               if getattr(self, f) != getattr(other, f)]
        for dist in sorted(set(self.versions) | set(other.versions)):
            if self.versions.get(dist) != other.versions.get(dist):
                out.append(f"{dist}: {self.versions.get(dist)} != {other.versions.get(dist)}")
        return out


class TuneTable(BaseModel):
    """A tuned table: its key, when and how it was made, and one entry per bucket."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal[1] = FORMAT
    key: TableKey
    made: str = Field(description="UTC time, ISO 8601")
    command: str = ""
    entries: list[Entry] = Field(default_factory=list)

    def entry(self, bucket: Bucket) -> Optional[Entry]:
        for e in self.entries:
            if e.bucket == bucket:
                return e
        return None

    def with_entries(self, entries: list[Entry]) -> "TuneTable":
        """A copy with ``entries`` added (replacing the entries of their buckets)."""
        new = {e.bucket for e in entries}
        return self.model_copy(update={"entries": [e for e in self.entries if e.bucket not in new] + list(entries)})


class TuningNote(BaseModel):
    """What a decision read of the tuned table (``Decision.tuning``; ``explain`` shows it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    origin: Literal["user", "shipped"]
    path: str
    made: str
    bucket: Bucket
    measured: bool = Field(description="the table has this bucket: the accepted backends it timed run fastest first")
    times_ms: dict[str, float] = Field(default_factory=dict)
    failed: dict[str, str] = Field(default_factory=dict)


# -- the key and the paths ------------------------------------------------------------------------------

def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def driver_version(device_type: str) -> Optional[str]:
    """The CUDA driver's version (``cuDriverGetVersion``, e.g. ``12.8``) on an NVIDIA device; the
    HIP runtime's on ROCm; None elsewhere or when it cannot be read."""
    if device_type != "cuda":
        return None
    import torch

    if getattr(torch.version, "hip", None):
        return f"hip {torch.version.hip}"
    try:
        out = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(out)) != 0:
            return None
    except OSError:
        return None
    return f"{out.value // 1000}.{out.value % 1000 // 10}"


def current_key(caps) -> Optional[TableKey]:
    """This process's key for the probed device ``caps``; None for a profile (no table applies)."""
    if caps.profile is not None:
        return None
    versions = {d: _version(d) for d in VERSIONED}
    import torch

    versions["torch"] = torch.__version__  # a source build may have no metadata
    return TableKey(device=caps.name, arch=caps.arch, driver=driver_version(caps.device_type), versions=versions)


def tune_dir() -> Path:
    """``LINATTN_TUNE_DIR``, else platformdirs' user cache dir for ``linattn`` plus ``tune`` (where
    platformdirs is missing, e.g. an install without dependencies: ``$XDG_CACHE_HOME`` or
    ``~/.cache``, then ``linattn/tune``)."""
    env = os.environ.get(TUNE_DIR_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "linattn" / "tune"
    return Path(platformdirs.user_cache_dir("linattn")) / "tune"


def table_path(key: TableKey) -> Path:
    """The user's table file for ``key``'s device: ``<tune_dir>/<device>-<arch>.json``."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", key.device).strip("-").lower() or "device"
    return tune_dir() / f"{slug}-{key.arch}.json"


def shipped_path(arch: str) -> Optional[Path]:
    """The table shipped for ``arch`` (``linattn/tuned/<arch>.json``), or None when none ships."""
    try:
        path = resources.files("linattn") / "tuned" / f"{arch}.json"
    except (ModuleNotFoundError, TypeError):
        return None
    return Path(str(path)) if path.is_file() else None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# -- what selection reads -------------------------------------------------------------------------------

class Tuned(BaseModel):
    """A table in force for a device, and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: TuneTable
    origin: Literal["user", "shipped"]
    path: str

    def note(self, p: Problem) -> TuningNote:
        bucket = bucket_of(p)
        e = self.table.entry(bucket)
        return TuningNote(origin=self.origin, path=self.path, made=self.table.made, bucket=bucket, measured=e is not None,
                          times_ms=dict(e.times_ms) if e else {}, failed=dict(e.failed) if e else {})


def _read(key: TableKey, path: Path) -> tuple[Optional[TuneTable], str]:
    """The table at ``path`` when it parses and has ``key``, else None and why it cannot be used."""
    try:
        table = TuneTable.model_validate_json(path.read_text())
    except ValidationError as e:  # invalid JSON too: name the first field (or the JSON error) that fails
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "JSON"
        return None, f"not a table of format {FORMAT} ({where}: {err.get('msg', '')})"
    except (OSError, ValueError) as e:
        return None, f"not a table of format {FORMAT} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if table.key != key:
        return None, f"made for other versions ({'; '.join(table.key.differences(key))})"
    return table, ""


def load(key: TableKey, paths: list[tuple[str, Optional[Path]]]) -> Optional[Tuned]:
    """The first of ``paths`` (``(origin, path)``) that exists, parses and has ``key``; every one that
    exists but is not used gets one INFO line saying why."""
    for origin, path in paths:
        if path is None or not path.is_file():
            continue
        table, why = _read(key, path)
        if table is None:
            log.info("linattn: tuned table %s ignored: %s; static ranks apply until `linattn tune` measures again",
                     path, why)
            continue
        return Tuned(table=table, origin=origin, path=str(path))
    return None


def ignored(caps) -> list[str]:
    """For ``linattn explain`` when no table is in force for the probed device ``caps``: one line per
    table file that exists (the user's, the shipped one) but cannot be used, ``"<path>: <why>"``
    (unparsable, another format, made for other versions); ``LINATTN_TUNED=0`` is named as such.
    Empty for a profile and where no file exists. Never raises (an unreadable cache dir is a line)."""
    if caps.profile is not None:
        return []
    if not env_switch(TUNED_VAR, default=True):
        return [f"{TUNED_VAR}=0 turns tables off (unset it to use them)"]
    try:
        key = current_key(caps)
        out = []
        for path in (table_path(key), shipped_path(key.arch)):
            if path is not None and path.is_file():
                table, why = _read(key, path)
                if table is None:
                    out.append(f"{path}: {why}; `linattn tune` measures again")
        return out
    except Exception as e:  # noqa: BLE001 - a diagnostic line, never a failure of explain
        return [f"{type(e).__name__}: {e}"]


def _device_key(caps) -> tuple:
    """The key of :attr:`Tuning._tables`: one probed device (or profile) of the process."""
    return caps.device_type, caps.device_index, caps.name, caps.profile


class Tuning:
    """The tables in force, per probed device, loaded on first use (held by the dispatcher).

    Thread-safe; :meth:`reload` forgets them (after ``linattn tune`` wrote one, or a test changed
    ``LINATTN_TUNE_DIR``, ``LINATTN_TUNED`` or ``LINATTN_AUTOTUNE``; ``linattn.dispatch.clear_cache()``
    calls it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple, Optional[Tuned]] = {}
        self._autotune: Optional[bool] = None
        self._skipped: set[Bucket] = set()  # buckets whose autotuning raised in this process: not retried

    def reload(self) -> None:
        """Forget the tables read, ``LINATTN_AUTOTUNE`` and the buckets :meth:`skip` set aside: all are
        read (tried) again on next use."""
        with self._lock:
            self._tables.clear()
            self._autotune = None
            self._skipped.clear()

    def skip(self, p: Problem) -> None:
        """Autotune ``p``'s bucket no more in this process (its measurement raised)."""
        with self._lock:
            self._skipped.add(bucket_of(p))

    def table_for(self, caps) -> Optional[Tuned]:
        """The table in force for ``caps`` (the user's, else the shipped one), or None."""
        dev = _device_key(caps)
        try:
            return self._tables[dev]
        except KeyError:
            pass
        key = current_key(caps) if env_switch(TUNED_VAR, default=True) else None
        try:
            tuned = None if key is None else load(key, [("user", table_path(key)), ("shipped", shipped_path(key.arch))])
        except Exception as e:  # noqa: BLE001 - an unreadable cache dir must not break dispatch: static ranks
            log.info("linattn: no tuned table read for %s (%s: %s); static ranks apply", caps.name, type(e).__name__, e)
            tuned = None
        with self._lock:
            return self._tables.setdefault(dev, tuned)

    def autotune(self, caps) -> bool:
        """``LINATTN_AUTOTUNE`` is on, tables are on (``LINATTN_TUNED=0``, static ranks only, turns
        autotuning off too: a measurement no decision may read is not made) and ``caps`` is a probed
        device (a table can be made for it). The variables are read once, with the tables (again
        after :meth:`reload`)."""
        if self._autotune is None:
            self._autotune = env_switch(AUTOTUNE_VAR, default=False) and env_switch(TUNED_VAR, default=True)
        return self._autotune and caps.profile is None

    def bucket_key(self, p: Problem, caps) -> Optional[tuple]:
        """What selection adds to the shape class: ``(log2 tokens, log2 sequences)`` while a table or
        autotuning applies to ``caps`` and the op is tuned; else None (the shape class alone decides)."""
        if p.op not in TUNED_OPS:
            return None
        if self.table_for(caps) is None and not self.autotune(caps):
            return None
        return _log2(p.t), _log2(p.n)

    def missing(self, p: Problem, caps) -> bool:
        """Autotuning is on and the table in force (if any) lacks ``p``'s bucket."""
        if p.op not in TUNED_OPS or not self.autotune(caps):
            return False
        tuned, bucket = self.table_for(caps), bucket_of(p)
        return bucket not in self._skipped and (tuned is None or tuned.table.entry(bucket) is None)

    def record(self, caps, entries: list[Entry], command: str) -> Tuned:
        """Add ``entries`` to the user's table of ``caps`` (started from the table in force, shipped
        or user; where none is in force, e.g. under ``LINATTN_TUNED=0``, from the user's table on
        disk when it has this process's key, so that its other buckets are kept), write it, and put
        it in force. A write that fails keeps it in memory, with a warning.

        Raises:
            ValueError: ``caps`` is a profile (no table is made for one).
        """
        key = current_key(caps)
        if key is None:
            raise ValueError(f"{caps.name} is a profile: a table is measured on a probed device")
        path = table_path(key)
        old = self.table_for(caps)
        if old is None:  # tables off, or none readable: the user's own file still keeps its other buckets
            try:
                old = load(key, [("user", path)])
            except OSError:
                old = None
        base = old.table if old is not None else TuneTable(key=key, made=now(), command=command)
        table = base.with_entries(entries).model_copy(update={"made": now(), "command": command})
        try:
            write(table, path)
        except OSError as e:
            log.warning("linattn: could not write the tuned table to %s (%s); it is kept in memory only; set %s to a "
                        "writable folder", path, e, TUNE_DIR_VAR)
        tuned = Tuned(table=table, origin="user", path=str(path))
        with self._lock:
            self._tables[_device_key(caps)] = tuned
        return tuned


def write(table: TuneTable, path: Path) -> None:
    """Write ``table`` to ``path`` as indented JSON (atomically: a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(table.model_dump_json(indent=1) + "\n")
    tmp.replace(path)
