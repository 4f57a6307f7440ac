"""``linattn tune``: time every eligible backend of this device over shape buckets and write the
tuned table selection ranks by (:mod:`linattn.dispatch.plugin.tuning`; docs/architecture.md, "Selection by
measurement").

The measuring (inputs, timing, the median per backend) is :mod:`linattn.tune`'s, shared with
selection's ``LINATTN_AUTOTUNE``; this module is the command around it: buckets, the run, the table.

Examples::

    linattn tune                                    # this device's default buckets (the benchmark shapes)
    linattn tune --quick                            # a few of them
    linattn tune --device cpu --buckets gdn_decode:1,gdn_prefill:2x64 --shape 2,4,16,16
    linattn tune gdn_prefill --batch 16 --tokens 4096   # one bucket: 16 sequences of 4,096 tokens
    linattn tune --device cuda --out linattn/tuned/sm_90.json   # the table shipped for sm_90
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import typer

from linattn import tune as measuring
from linattn.apps.cli_common import JSON_OPT, count_option, hidden_profile_option, no_profile, one_op, op_option
from linattn.apps.report import PREFILL_TOKENS
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.plugin.tuning import (TUNE_DIR_VAR, TUNED_OPS, Bucket, Entry, TuneTable, bucket_of, current_key, now, tune_dir,
                                     write)

#: the family presets the default buckets use (their heads and head dims)
FAMILY_PRESET = {"gdn": "qwen3-next", "kda": "kimi-linear"}
#: default buckets, as ``(phase, sizes)``: decode rows N; prefill (sequences N, tokens per sequence L).
#: CUDA: the benchmark shapes (benchmarks/decode.py, prefill.py, prefill_long.py); CPU: small ones.
DEFAULT_SIZES = {
    # every shape of benchmarks/dispatch_choice.py (decode.py's N, prefill.py's and prefill_long.py's shapes)
    "cuda": {"decode": ((1, 1), (8, 1), (32, 1), (64, 1), (256, 1), (1024, 1), (4096, 1)),
             "prefill": ((16, 4096), (64, 1024), (256, 256), (1, 8192), (1, 32768), (1, 65536))},
    "cpu": {"decode": ((1, 1), (8, 1)), "prefill": ((2, 64), (1, 256))},
}
QUICK_SIZES = {
    "cuda": {"decode": ((1, 1), (256, 1), (4096, 1)), "prefill": ((16, 4096), (1, 65536))},
    "cpu": {"decode": ((1, 1),), "prefill": ((2, 64),)},
}
DTYPES = ("bfloat16", "float16", "float32")
STATE_DTYPES = ("float32", "bfloat16")
#: the stop for new buckets (seconds) by default: a device call of 10 minutes holds the whole run
MAX_SECONDS = 480.0


# -- buckets -----------------------------------------------------------------------------------------

def default_buckets(device_type: str, quick: bool = False, shape: Optional[tuple] = None, dtype: str = "bfloat16",
                    state_dtype: str = "float32") -> list[Bucket]:
    """The default buckets of a device type (:data:`DEFAULT_SIZES`, or :data:`QUICK_SIZES`) for
    both families, with each family's preset heads (or ``shape`` = ``(H, HV, K, V)``)."""
    sizes = (QUICK_SIZES if quick else DEFAULT_SIZES)["cuda" if device_type == "cuda" else "cpu"]
    ops = sorted(TUNED_OPS, key=lambda op: (OP_TABLE[op].family, OP_TABLE[op].phase))  # family by family, decode first
    return [bucket_for(op, n, t, shape, dtype, state_dtype) for op in ops for n, t in sizes[OP_TABLE[op].phase]]


def sized_buckets(n: Optional[int], tokens: Optional[int], shape: Optional[tuple] = None, dtype: str = "bfloat16",
                  state_dtype: str = "float32") -> list[Bucket]:
    """One bucket per tuned op at ``--batch N --tokens L`` as every verb reads them: N sequences
    (decode rows, prefill sequences; default 1) of L tokens each (default 1 for decode, 4,096 for
    prefill, as ``linattn explain``)."""
    ops = sorted(TUNED_OPS, key=lambda op: (OP_TABLE[op].family, OP_TABLE[op].phase))
    return [bucket_for(op, n or 1, tokens or (1 if OP_TABLE[op].phase == "decode" else PREFILL_TOKENS), shape, dtype,
                       state_dtype) for op in ops]


def bucket_for(op: str, n: int, t: int, shape: Optional[tuple], dtype: str, state_dtype: str) -> Bucket:
    """The bucket of ``op`` with ``n`` rows / sequences and ``t`` tokens per row / sequence."""
    from linattn.presets import make_problem, preset

    if shape is None:
        pr = preset(FAMILY_PRESET[OP_TABLE[op].family])
        shape = (pr.H, pr.HV, pr.K, pr.V)
    H, HV, K, V = shape
    total = t if OP_TABLE[op].phase == "decode" else n * t
    # make_problem: a shape Problem refuses (hv not a multiple of h, ...) is a UsageError (exit 2, one line)
    return bucket_of(make_problem(op, n=n, t=total, h=H, hv=HV, k=K, v=V, dtype=dtype, state_dtype=state_dtype))


def parse_buckets(text: str, shape: Optional[tuple], dtype: str, state_dtype: str) -> list[Bucket]:
    """``OP:SIZE`` items, comma-separated: SIZE is ``N`` or ``NxT`` (decode: N rows of T tokens)
    or ``NxL`` (prefill: N sequences of L tokens), e.g. ``gdn_decode:1,gdn_prefill:16x4096``.

    Raises:
        ValueError: an item that is not of that form, or an op that is not tuned.
    """
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        op, _, size = item.partition(":")
        parts = size.lower().split("x")
        if op not in TUNED_OPS or not size or len(parts) > 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise ValueError(f"--buckets item {item!r}: give OP:N or OP:NxL with OP one of {', '.join(TUNED_OPS)} "
                             f"and positive sizes (e.g. gdn_decode:256, gdn_prefill:16x4096)")
        if OP_TABLE[op].phase == "prefill" and len(parts) != 2:
            raise ValueError(f"--buckets item {item!r}: a prefill size is NxL (N sequences of L tokens), e.g. {op}:16x4096")
        n, t = int(parts[0]), int(parts[1]) if len(parts) == 2 else 1
        out.append(bucket_for(op, n, t, shape, dtype, state_dtype))
    return list(dict.fromkeys(out))


def run(buckets: list[Bucket], device: torch.device, *, repeats: Optional[int] = None, max_seconds: float = MAX_SECONDS,
        progress: Optional[Callable[[str], None]] = None,
        on_entry: Optional[Callable[[list[Entry]], object]] = None) -> list[Entry]:
    """Measure ``buckets`` in order; buckets not started after ``max_seconds`` are left out (reported).
    ``on_entry(entries so far)`` after each bucket (the command saves the table then, so a run cut
    short keeps what it measured)."""
    t0, out = time.monotonic(), []
    for i, b in enumerate(buckets):
        if time.monotonic() - t0 > max_seconds:
            if progress:
                progress(f"stopped after {max_seconds:.0f} s: {len(buckets) - i} buckets not measured")
            break
        e = measuring.measure_bucket(b, device, repeats=repeats)
        out.append(e)
        if on_entry:
            on_entry(list(out))
        if progress:
            ranked = ", ".join(f"{k} {ms:.4g} ms" for k, ms in sorted(e.times_ms.items(), key=lambda x: x[1]))
            progress(f"[{i + 1}/{len(buckets)}] {b.label()}: {ranked or 'nothing ran'}"
                     + (f"; failed: {', '.join(e.failed)}" if e.failed else ""))
    return out


def save(entries: list[Entry], device: torch.device, command: str, out: Optional[Path] = None) -> str:
    """Write ``entries``: to ``out`` as a new table (e.g. the shipped one), else into the user's
    table of ``device`` (merged with the table in force), which is then in force. Returns the path."""
    from linattn.dispatch.runtime.selection import dispatcher, resolve_device

    caps = resolve_device(device)
    if out is None:
        path = dispatcher().tuning.record(caps, entries, command).path
    else:
        key = current_key(caps)
        if key is None:  # pragma: no cover - resolve_device of a torch device is always probed
            raise ValueError(f"{caps.name} is a profile")
        write(TuneTable(key=key, made=now(), command=command, entries=entries), out)
        path = str(out)
    dispatcher().tuning_changed()  # decisions made before the table are not reused
    return path


# -- the command -------------------------------------------------------------------------------------

def tune(
    op: Optional[str] = typer.Argument(None, metavar="OP", show_default=False,
                                       help=f"Only this op's buckets: {', '.join(TUNED_OPS)}. Or give it as --op."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEV", help="The torch device to measure on: cpu, "
                                                                              "cuda or cuda:N. Default: cuda if "
                                                                              "visible, else cpu."),
    quick: bool = typer.Option(False, "--quick", help="A few of the default buckets."),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Comma-separated OP:N or OP:NxL, N sequences "
                                          "(decode rows, prefill sequences) of L tokens each (decode default 1), as "
                                          "--batch N --tokens L; e.g. gdn_decode:1,gdn_prefill:16x4096 "
                                          "(default: the benchmark shapes of both families)."),
    batch: Optional[int] = count_option(None, "--batch", "--seqs", help="Instead of the default buckets: one bucket per "
                                        "tuned op (or OP's) of N sequences (decode rows, prefill sequences; default 1)."),
    tokens: Optional[int] = count_option(None, "--tokens", metavar="L", help="With or without --batch: tokens per "
                                         "sequence L (decode tokens per row, default 1; prefill, default 4,096)."),
    shape: Optional[str] = typer.Option(None, "--shape", help="H,HV,K,V for every bucket (default: the family's "
                                                              "preset, qwen3-next for GDN, kimi-linear for KDA)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="q/k/v dtype: bfloat16, float16, float32."),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="Pool dtype: float32 or bfloat16."),
    repeats: Optional[int] = count_option(None, "--repeats", help="Timed calls per backend (default 25 on CUDA, 5 on "
                                                                  "the CPU)."),
    max_seconds: float = typer.Option(MAX_SECONDS, "--max-seconds", min=0.0, metavar="SECONDS",
                                      help="Start no bucket after this many seconds (a duration: negative is refused)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write a new table here (e.g. linattn/tuned/sm_90.json, "
                                       "the table shipped for sm_90) instead of the user's table (LINATTN_TUNE_DIR "
                                       "or the user cache dir)."),
    as_json: bool = JSON_OPT,
    op_opt: Optional[str] = op_option(),
    profile: Optional[str] = hidden_profile_option(),
) -> None:
    """Time every eligible backend over shape buckets and write the tuned table selection ranks by.

    Runs on --device. With OP (or --op), only that op's buckets are measured.
    """
    from linattn.apps.cli import _emit_json, _fail_usage, _parse_shape, stdout_console
    from linattn.apps.report import UsageError
    from rich.console import Console

    from linattn.dispatch.runtime.selection import resolve_device

    op = one_op(op, op_opt, required=False)
    no_profile(profile, "tune")
    try:
        if op is not None and op not in TUNED_OPS:
            raise UsageError(f"unknown op {op!r} for tune; tuned ops: {', '.join(TUNED_OPS)}")
        if dtype not in DTYPES or state_dtype not in STATE_DTYPES:
            raise UsageError(f"--dtype {dtype} --state-dtype {state_dtype}: the dtype is one of {', '.join(DTYPES)}, "
                             f"the state dtype one of {', '.join(STATE_DTYPES)}")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA/ROCm device is visible to torch {torch.__version__}; tune "
                             "measures on a device that is present (--device cpu times the CPU backends)")
        resolve_device(dev)  # a device that is not there is a usage error
        chosen = _choose_buckets(dev, quick, buckets, batch, tokens, _parse_shape(shape), dtype, state_dtype)
        if op is not None:
            chosen = [b for b in chosen if b.op == op]
            if not chosen:
                raise UsageError(f"--buckets {buckets} has no bucket of {op}; give {op}:N or {op}:NxL items, or leave "
                                 f"out the op")
        _check_writable(out)  # before minutes of measuring, not after the first bucket
    except (ValueError, RuntimeError) as e:  # UsageError is a ValueError
        _fail_usage(e, as_json)
    err = Console(stderr=True)
    command = _command(dev, quick, buckets, shape, dtype, state_dtype, repeats, out, op, batch, tokens)
    entries = run(chosen, dev, repeats=repeats, max_seconds=max_seconds,
                  progress=None if as_json else lambda line: err.print(line, highlight=False, soft_wrap=True),
                  on_entry=lambda done: save(done, dev, command, out))  # saved bucket by bucket
    path = save(entries, dev, command, out)
    doc = {"path": path, "device": str(dev), "command": command, "buckets": len(chosen), "measured": len(entries),
           "entries": [e.model_dump(mode="json") for e in entries]}
    if as_json:
        _emit_json(doc)
        return
    _render(doc, stdout_console())


def _choose_buckets(dev: torch.device, quick: bool, buckets: Optional[str], batch: Optional[int], tokens: Optional[int],
                    shape: Optional[tuple], dtype: str, state_dtype: str) -> list[Bucket]:
    """The buckets one of --quick, --buckets, --batch/--tokens chooses (none: the device's defaults).

    Raises:
        UsageError: more than one of them; ValueError: a bad --buckets item.
    """
    from linattn.apps.report import UsageError

    given = [name for name, val in (("--quick", quick), ("--buckets", buckets), ("--batch/--tokens", batch or tokens))
             if val]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} {'both' if len(given) == 2 else 'all'} choose the buckets; give one (--quick: a few of the default "
                         "buckets; --buckets: exactly these; --batch N --tokens L: that size for each op)")
    if buckets:
        return parse_buckets(buckets, shape, dtype, state_dtype)
    if batch or tokens:
        return sized_buckets(batch, tokens, shape, dtype, state_dtype)
    return default_buckets(dev.type, quick, shape, dtype, state_dtype)


def _check_writable(out: Optional[Path]) -> None:
    """Raise ``UsageError`` when the table's folder (``--out``'s, else the user's tune dir) cannot be
    created or written."""
    from linattn.apps.report import UsageError

    folder = Path(out).expanduser().parent if out is not None else tune_dir()
    what = f"--out {out}" if out is not None else f"the tuned-table folder {folder} ({TUNE_DIR_VAR} or the user cache dir)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{what} cannot be created ({e.strerror or e}); nothing was measured. "
                         f"Give a writable path{'' if out is not None else f' in {TUNE_DIR_VAR}'}") from None
    try:  # a real probe: root passes os.access on folders such as /proc that take no new file
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"{what} is not writable ({e.strerror or e}); nothing was measured. "
                         f"Give a writable path{'' if out is not None else f' in {TUNE_DIR_VAR}'}") from None


def _command(dev, quick, buckets, shape, dtype, state_dtype, repeats, out, op=None, batch=None, tokens=None) -> str:
    parts = ["linattn tune"] + ([op] if op else []) + [f"--device {dev}"]
    parts += ["--quick"] if quick else []
    parts += [f"--buckets {buckets}"] if buckets else []
    parts += [f"--batch {batch}"] if batch else []
    parts += [f"--tokens {tokens}"] if tokens else []
    parts += [f"--shape {shape}"] if shape else []
    parts += [f"--dtype {dtype}"] if dtype != "bfloat16" else []
    parts += [f"--state-dtype {state_dtype}"] if state_dtype != "float32" else []
    parts += [f"--repeats {repeats}"] if repeats else []
    parts += [f"--out {out}"] if out else []
    return " ".join(parts)


def _render(doc: dict, con) -> None:
    from rich.table import Table

    t = Table(title=f"Tuned table: {doc['path']}", title_justify="left",
              caption=f"{doc['measured']} of {doc['buckets']} buckets measured; the fastest accepted backend runs "
                      "in each bucket (static rank elsewhere)", caption_justify="left")
    for c in ("bucket", "fastest", "median ms per backend", "failed"):
        t.add_column(c)
    for e in doc["entries"]:
        ranked = sorted(e["times_ms"].items(), key=lambda x: x[1])
        b = Bucket.model_validate(e["bucket"])
        t.add_row(b.label(), ranked[0][0] if ranked else "-", ", ".join(f"{k} {ms:.4g}" for k, ms in ranked),
                  ", ".join(f"{k} ({m})" for k, m in e["failed"].items()))
    con.print(t)
