"""Plots of benchmark results: decode GB/s over N against the copy ceiling and FLA; prefill Mtok/s per shape.

:func:`plot_data` reads any of these documents into one :class:`PlotData`:

- a ``linattn bench`` document (``op``, ``copy_bandwidth``, ``rows`` of ``backend``, ``label``,
  ``shape``, ``GBps`` / ``tokens_per_s``): one series per backend;
- a results file in the common schema ``{command, commit, device, toolchain, rows, notes}``
  (``benchmarks/results/*.json``) whose rows are wide: ``op`` (or ``family`` for prefill, or
  ``kind``), ``N`` / ``M`` or ``shape``, and one column per series, ``<series>_TBps`` /
  ``<series>_GBps`` (decode, clamp) or ``<series>_mtok_s`` (prefill); the copy ceiling is the
  row of ``kind`` ``copy``;
- the results files written before that schema: decode runs as ``run_N.benchmark`` (with
  ``decode``, ``silu`` and ``copy_TBps``; the latest run is read) and prefill summaries as
  ``gdn`` / ``kda`` ``.results``.

:func:`render_png` draws it with matplotlib (the ``plot`` extra, Agg backend, no display):
decode and clamp as lines over N (log scale) with the copy ceiling dashed; prefill as grouped
bars per shape.

Example:
    >>> doc = {"op": "gdn_decode", "device": "H200", "rows": [
    ...     {"kind": "copy", "TBps": 4.0},
    ...     {"op": "gdn_decode", "N": 1, "ours_TBps": 1.5, "fla_TBps": 1.5},
    ...     {"op": "gdn_decode", "N": 256, "ours_TBps": 4.0, "fla_TBps": 4.1}]}
    >>> d = plot_data(doc, "gdn_decode")
    >>> sorted(d.series), d.ceiling
    (['flash-linear-attention', 'linattn'], 4000.0)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from linattn.dispatch.rules.ops_table import OP_TABLE, find_op

FLA = "flash-linear-attention"
FLA_GS = "flash-linear-attention+gather-scatter"
#: Column prefixes of the results files and the names their series are drawn under.
SERIES_NAMES = {"": "linattn", "ours": "linattn", "linattn": "linattn", "linattn_pool": "linattn (pool)",
                "fla": FLA, "fla_gather_scatter": FLA_GS}
#: Row fields that tell apart several rows of one series at the same size (tile sweeps).
VARIANT_KEYS = ("variant", "order", "BD", "BV", "num_warps")
_RATE = re.compile(r"^(?:(?P<prefix>.+)_)?(?P<unit>TBps|GBps|mtok_s)$")
_TO_PLOT_UNIT = {"TBps": 1e3, "GBps": 1.0, "mtok_s": 1.0}  # -> GB/s, Mtok/s


class PlotError(ValueError):
    """A document that holds nothing to plot for the op (the message says what it holds)."""


class PlotData(BaseModel):
    """What one plot shows: series of (size, rate) points and the copy ceiling.

    ``x`` is the row count N (decode) or M (clamp), or the shape label ``NxL`` (prefill);
    ``y`` is GB/s (decode, clamp) or Mtok/s (prefill).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str
    phase: Literal["decode", "prefill", "mlp"]
    title: str
    unit: Literal["GB/s", "Mtok/s"]
    ceiling: Optional[float] = Field(None, description="copy bandwidth in GB/s (decode, clamp)")
    series: dict[str, list[tuple[Union[int, str], float]]]


def _phase(op: str) -> str:
    """The op's phase, from the op table; a name that is not an op raises :class:`PlotError`."""
    spec = OP_TABLE.get(op)
    if spec is None:
        raise PlotError(f"unknown op {op!r}; ops: {', '.join(OP_TABLE)}")
    return spec.phase


def _device_name(doc: dict) -> str:
    dev = doc.get("device")
    if isinstance(dev, dict):
        return str(dev.get("name") or dev.get("type") or "")
    return str(dev or "")


# -- linattn bench documents ------------------------------------------------------------------------

def _from_bench(doc: dict) -> PlotData:
    op = doc["op"]
    prefill = _phase(op) == "prefill"
    series: dict[str, list] = {}
    for r in doc["rows"]:
        if r.get("status") != "ok":
            continue
        if prefill:
            point = (r["label"], r["tokens_per_s"] / 1e6)
        else:
            sizes = r.get("shape") or {}
            point = (int(sizes.get("N", sizes.get("M", 0))), r["GBps"])
        series.setdefault(r["backend"], []).append(point)
    ceiling = None if prefill else (doc.get("copy_bandwidth") or {}).get("GBps")
    return PlotData(op=op, phase=_phase(op), title=f"linattn bench {op} ({doc.get('model', '')}) on "
                    f"{_device_name(doc)}", unit="Mtok/s" if prefill else "GB/s", ceiling=ceiling, series=series)


# -- results files ------------------------------------------------------------------------------------

def _legacy_rows(doc: dict) -> list[dict]:
    """Rows of the results files written before the common schema, in its wide-row form."""
    runs = sorted((k for k in doc if re.fullmatch(r"run_\d+", k)), key=lambda k: int(k.split("_")[1]))
    for key in reversed(runs):  # the latest run with a benchmark
        bench = doc[key].get("benchmark") if isinstance(doc[key], dict) else None
        if bench and bench.get("decode"):
            rows = [{"kind": "copy", "TBps": bench["copy_TBps"]}] if "copy_TBps" in bench else []
            rows += [dict(r, kind="decode") for r in bench["decode"]]
            return rows + [dict(r, kind="silu_and_mul_clamp") for r in bench.get("silu", [])]
    return [dict(r, family=fam) for fam in ("gdn", "kda")
            for r in (doc.get(fam) or {}).get("results", []) if isinstance(r, dict)]


def _row_op(row: dict, phase: str) -> Optional[str]:
    if row.get("op"):
        return row["op"]
    if row.get("kind") == "silu_and_mul_clamp":
        return "silu_and_mul_clamp"
    if row.get("family") and phase != "mlp":
        return find_op(row["family"], phase)
    return None


def _ceiling(doc: dict, rows: list[dict]) -> Optional[float]:
    """The copy bandwidth in GB/s: a ``copy`` row, a ``copy_bandwidth`` block or a ``copy_TBps`` field."""
    for r in rows:
        if r.get("kind") == "copy":
            return r["TBps"] * 1e3 if "TBps" in r else r.get("GBps")
    if isinstance(doc.get("copy_bandwidth"), dict):
        return doc["copy_bandwidth"].get("GBps")
    return doc["copy_TBps"] * 1e3 if "copy_TBps" in doc else None


def _series_of(rows: list[dict], prefill: bool) -> dict[str, list]:
    """One series per rate column (``ours_TBps`` -> ``linattn``), points sorted by size."""
    series: dict[str, list] = {}
    for r in rows:
        x = r.get("shape") if prefill else r.get("N", r.get("M"))
        if x is None:
            continue
        for key, val in r.items():
            m = _RATE.match(key)
            if m is None or not isinstance(val, (int, float)) or (m["unit"] == "mtok_s") != prefill:
                continue
            prefix = m["prefix"] or ""
            name = SERIES_NAMES.get(prefix, prefix.replace("ours_", "linattn ").replace("_", " "))
            series.setdefault(name, []).append((x, val * _TO_PLOT_UNIT[m["unit"]], r))
    out = {}
    for name, pts in series.items():
        xs = [p[0] for p in pts]
        for x, y, r in pts:
            variant = " ".join(f"{k}={r[k]}" for k in VARIANT_KEYS if k in r) if xs.count(x) > 1 else ""
            out.setdefault(f"{name} {variant}".strip(), []).append((x, y))
    return {name: (pts if prefill else sorted(pts)) for name, pts in out.items()}


def _from_results(doc: dict, op: str) -> PlotData:
    rows = doc["rows"] if isinstance(doc.get("rows"), list) else _legacy_rows(doc)
    phase = _phase(op)
    mine = [r for r in rows if isinstance(r, dict) and _row_op(r, phase) == op and r.get("kind") != "latency_n1"]
    series = _series_of(mine, phase == "prefill")
    if not series:
        ops = sorted({o for r in rows if isinstance(r, dict) and (o := _row_op(r, phase))})
        raise PlotError(f"no {op} rates (columns *_TBps, *_GBps or *_mtok_s) in this document; "
                        f"its rows hold: {', '.join(ops) or 'nothing plottable'}")
    dev, commit = _device_name(doc), doc.get("commit")
    title = op + (f" on {dev}" if dev else "") + (f" (commit {commit})" if commit else "")
    return PlotData(op=op, phase=phase, title=title, unit="Mtok/s" if phase == "prefill" else "GB/s",
                    ceiling=None if phase == "prefill" else _ceiling(doc, rows), series=series)


def plot_data(doc: dict, op: Optional[str] = None) -> PlotData:
    """The series to plot for ``op`` from a bench document or a results file (see the module docstring).

    Args:
        doc: a parsed JSON document.
        op: the op to plot (``gdn_decode``, ``kda_prefill``, ...); default the document's ``op``.
            A bench document for another op is refused.
    Returns:
        PlotData.
    Raises:
        PlotError: no op given or found, or no rates for the op (the message lists the ops it holds).
    """
    rows = doc.get("rows")
    bench = doc.get("command") == "linattn bench" or (isinstance(rows, list) and bool(rows)
                                                      and isinstance(rows[0], dict) and "backend" in rows[0])
    if bench:
        if op is not None and op != doc.get("op"):
            raise PlotError(f"this linattn bench document is for {doc.get('op')}, not {op}")
        return _from_bench(doc)
    op = op or doc.get("op")
    if not op:
        raise PlotError("this results file holds several ops: name the one to plot")
    return _from_results(doc, op)


def load_plot_data(path: Path, op: Optional[str] = None) -> PlotData:
    """:func:`plot_data` of the JSON file at ``path``.

    Raises:
        PlotError: the file does not exist, is not JSON, or holds nothing to plot for ``op``.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PlotError(f"cannot read results from {path}: {e}") from None
    if not isinstance(doc, dict):
        raise PlotError(f"{path} holds a JSON {type(doc).__name__}, not a results document")
    return plot_data(doc, op)


# -- drawing ------------------------------------------------------------------------------------------

def require_matplotlib():
    """``matplotlib.pyplot`` with the Agg backend.

    Raises:
        PlotError: matplotlib is not installed (the message says how to get it).
    """
    try:
        import matplotlib
    except ImportError:
        raise PlotError("--plot needs matplotlib, which is not installed: pip install 'linattn[plot]' "
                        "(or matplotlib; or drop --plot: --json / --out keep the numbers)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_lines(ax, data: PlotData) -> None:
    for name, pts in data.series.items():
        ax.plot(*zip(*pts), marker="o", label=name)
    if data.ceiling:
        ax.axhline(data.ceiling, linestyle="--", color="grey", label=f"copy ceiling ({data.ceiling:,.0f} GB/s)")
    ax.set_xscale("log", base=2)
    sizes = sorted({x for pts in data.series.values() for x, _ in pts})
    ax.set_xticks(sizes, [f"{x:,}" for x in sizes])
    ax.minorticks_off()
    ax.set_xlabel("rows M" if data.phase == "mlp" else "sequences N (one token each)")
    ax.set_ylabel("effective GB/s (bytes the op must move / time)")


def _draw_bars(ax, data: PlotData) -> None:
    labels = list(dict.fromkeys(x for pts in data.series.values() for x, _ in pts))
    width = 0.8 / max(1, len(data.series))
    for i, (name, pts) in enumerate(data.series.items()):
        by = dict(pts)
        xs = [j + (i - (len(data.series) - 1) / 2) * width for j, lab in enumerate(labels) if lab in by]
        bars = ax.bar(xs, [by[lab] for lab in labels if lab in by], width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize="x-small")
    ax.set_xticks(range(len(labels)), labels)
    top = max((y for pts in data.series.values() for _, y in pts), default=1.0)
    ax.set_ylim(0, top * 1.25)  # room for the legend above the bars
    ax.set_xlabel("shape (sequences x tokens per sequence)")
    ax.set_ylabel("Mtok/s")


def png_path(path: Path) -> Path:
    """Where the PNG for ``--plot path`` lands: ``path``, with ``.png`` added when it has no
    suffix (as matplotlib's ``savefig`` does)."""
    path = Path(path)
    return path if path.suffix else path.with_name(path.name + ".png")


def check_plot_format(path: Path) -> None:
    """Refuse a ``--plot`` path whose suffix names no format matplotlib writes (``.png`` by default;
    ``.pdf``, ``.svg``, ``.jpg``, ... by their suffix), before anything is measured.

    Raises:
        PlotError: matplotlib is not installed, or the suffix is no format of its (the message lists them).
    """
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = png_path(path).suffix[1:].lower()
    if suffix not in formats:
        raise PlotError(f"--plot {path}: matplotlib writes no {suffix!r} files; give a path ending in .png (or "
                        f"one of {', '.join('.' + f for f in sorted(formats))})")


def render_png(data: PlotData, path: Path) -> Path:
    """Draw ``data`` to :func:`png_path` of ``path`` (parent folders created): a PNG, or the format of its
    suffix (:func:`check_plot_format` names the ones matplotlib writes).

    Returns:
        the path written (``.png`` added to a path without a suffix).
    Raises:
        PlotError: matplotlib is not installed.
    """
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    (_draw_bars if data.phase == "prefill" else _draw_lines)(ax, data)
    ax.set_title(data.title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=1 if data.phase != "prefill" else len(data.series), loc="best")
    fig.tight_layout()
    path = png_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
