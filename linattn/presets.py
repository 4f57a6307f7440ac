"""Model presets as data (``presets.toml``), each with its source.

Users add their own with ``LINATTN_PRESETS=/path/to/more.toml`` (the same schema: one ``[name]``
table per preset). That file is checked as it is read (field fault F46; docs/ops-decisions.md):

- a problem is one line naming the file and what is wrong: the file is missing or unreadable,
  not valid TOML (with the line and column), an entry that is not a ``[table]``, a preset with
  an unknown or missing field or a bad value (``H=-4``, ``HV`` not a multiple of ``H``);
- a user preset named like a shipped one is refused (a problem), never a silent replacement;
- a bad preset is left out and the good ones kept (:func:`preset_table`); :func:`presets` raises
  :class:`PresetFileError` when the file has any problem, :func:`preset` only when the name
  asked for is missing (a shipped preset stays usable beside a broken file, with a logged
  warning); ``linattn report`` lists each problem and reports the rest.

A blank ``LINATTN_PRESETS`` is unset.

Example:
    >>> from linattn.presets import preset
    >>> preset("qwen3-next").HV
    32
"""

from __future__ import annotations

import functools
import logging
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from linattn.dispatch.rules.ops_table import OP_TABLE, find_op, ops_of
from linattn.dispatch.plugin.problem import OPS, Problem

log = logging.getLogger("linattn")


class PresetFileError(KeyError, ValueError):
    """The ``LINATTN_PRESETS`` file cannot give the presets asked for: the message is one line that
    names the file and the problem. A ``KeyError`` (as an unknown preset name is) and a ``ValueError``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ModelPreset(BaseModel):
    """One model's linear-attention (or SwiGLU-clamp) layer shapes at tensor-parallel rank 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str
    family: Literal["gdn", "kda", "swiglu"]
    H: int = 0
    HV: int = 0
    K: int = 0
    V: int = 0
    D: int = 0
    limit: Optional[float] = None
    layers: str = ""
    source: str

    @model_validator(mode="after")
    def _shape_of_family(self) -> "ModelPreset":
        unused = ("H", "HV", "K", "V") if self.family == "swiglu" else ("D",)
        negative = [n for n in unused if getattr(self, n) < 0]
        if negative:
            got = " ".join(f"{n}={getattr(self, n)}" for n in negative)
            raise ValueError(f"a {self.family} preset does not use {', '.join(negative)}: leave it out or 0 (got {got})")
        if self.family == "swiglu":
            if self.D <= 0:
                raise ValueError(f"a swiglu preset needs D > 0 (got D={self.D})")
        elif min(self.H, self.HV, self.K, self.V) <= 0 or self.HV % self.H:
            raise ValueError(f"a {self.family} preset needs H, HV, K, V > 0 and HV a multiple of H (got H={self.H} "
                             f"HV={self.HV} K={self.K} V={self.V})")
        return self

    @property
    def ops(self) -> tuple[str, ...]:
        """The ops of the preset's family (op table order): gating, decode and prefill for
        ``gdn`` / ``kda``, the clamp for ``swiglu``."""
        return ops_of(self.family)

    def op_for(self, phase: str) -> str:
        """The preset's op in ``phase`` (``decode``, ``prefill``, ``gating``, ``mlp``), from the op table.

        Raises:
            ValueError: the family has no op in that phase (the SwiGLU clamp has no decode).
        """
        op = find_op(self.family, phase)
        if op is None:
            raise ValueError(f"preset {self.name!r} (family {self.family!r}) has no {phase} op; its ops: "
                             f"{', '.join(self.ops)}")
        return op

    @property
    def decode_op(self) -> str:
        return self.op_for("decode")

    @property
    def prefill_op(self) -> str:
        return self.op_for("prefill")

    @property
    def gating_op(self) -> str:
        return self.op_for("gating")


class PresetTable(BaseModel):
    """The presets that loaded, and one line per problem of the ``LINATTN_PRESETS`` file."""

    model_config = ConfigDict(frozen=True)

    presets: dict[str, ModelPreset]
    problems: tuple[str, ...] = ()


def _describe(err: dict) -> str:
    field = ".".join(str(x) for x in err["loc"]) or "its shape"
    if err["type"] == "extra_forbidden":
        allowed = ", ".join(f for f in ModelPreset.model_fields if f != "name")
        return f"unknown field {field!r} (fields: {allowed})"
    if err["type"] == "missing":
        return f"missing field {field!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{field}={err['input']!r}: {msg}" if err["loc"] else msg


def _read_tables(path: str) -> dict:
    """The TOML tables of the user's file.

    Raises:
        PresetFileError: missing, unreadable, not UTF-8 or not valid TOML.
    """
    where = f"LINATTN_PRESETS={path}"
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PresetFileError(f"{where}: no such file; point it at a TOML file of [name] tables "
                              f"(the schema of linattn/presets.toml) or unset it") from None
    except IsADirectoryError:
        raise PresetFileError(f"{where}: is a folder, not a TOML file") from None
    except OSError as e:
        raise PresetFileError(f"{where}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise PresetFileError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise PresetFileError(f"{where}: not valid TOML: {e}") from None


def _user_presets(path: str, shipped: dict[str, ModelPreset]) -> tuple[dict[str, ModelPreset], list[str]]:
    """The good presets of the user's file and one line per problem (module docstring)."""
    try:
        tables = _read_tables(path)
    except PresetFileError as e:
        return {}, [str(e)]
    good, problems = {}, []
    for name, body in tables.items():
        where = f"LINATTN_PRESETS={path}: preset {name!r}"
        if name in shipped:
            problems.append(f"{where} is already a shipped preset ({shipped[name].title}); a user preset "
                            "cannot replace one: give yours another name")
        elif not isinstance(body, dict):
            problems.append(f"{where} is not a [table] (got {type(body).__name__} {body!r})")
        else:
            try:
                good[name] = ModelPreset(name=name, **body)
            except ValidationError as e:
                problems.append(f"{where}: " + "; ".join(_describe(err) for err in e.errors()))
    return good, problems


@functools.lru_cache(maxsize=None)
def _load(extra: Optional[str]) -> PresetTable:
    text = resources.files("linattn").joinpath("presets.toml").read_text()
    shipped = {name: ModelPreset(name=name, **body) for name, body in tomllib.loads(text).items()}
    if not extra:
        return PresetTable(presets=shipped)
    good, problems = _user_presets(extra, shipped)
    for line in problems:
        log.warning("linattn: %s", line)
    return PresetTable(presets={**shipped, **good}, problems=tuple(problems))


def preset_table() -> PresetTable:
    """The shipped presets plus the good ones of ``$LINATTN_PRESETS``, and that file's problems
    (one line each, naming the file). Never raises for the user's file (``linattn report`` uses it)."""
    return _load(os.environ.get("LINATTN_PRESETS", "").strip() or None)


def presets() -> dict[str, ModelPreset]:
    """All presets: the shipped ones plus those in ``$LINATTN_PRESETS`` (a TOML file), if set.

    Raises:
        PresetFileError: the file has a problem (the first one named, and how many more).
    """
    table = preset_table()
    if table.problems:
        more = f" (and {len(table.problems) - 1} more problems)" if len(table.problems) > 1 else ""
        raise PresetFileError(table.problems[0] + more)
    return table.presets


def preset(name: str) -> ModelPreset:
    """The preset called ``name`` (a shipped one stays usable beside a broken ``LINATTN_PRESETS``).

    Raises:
        PresetFileError: ``name`` is not known and the ``LINATTN_PRESETS`` file has problems (named).
        KeyError: unknown name; the message lists the known ones.
    """
    table = preset_table()
    if name in table.presets:
        return table.presets[name]
    known = ", ".join(sorted(table.presets))
    if table.problems:
        raise PresetFileError(f"unknown model preset {name!r} (known: {known}); the LINATTN_PRESETS file has "
                              f"problems: {' | '.join(table.problems)}")
    raise KeyError(f"unknown model preset {name!r}; known: {known} "
                   f"(add your own with LINATTN_PRESETS=/path/to/presets.toml)")


# -- problems from presets (``linattn.explain(op, model=...)``, the CLI's verbs) ---------------------

class UsageError(ValueError):
    """A bad argument: printed (as JSON with --json) and exit code 2."""


def _problem_error(err: dict) -> str:
    """One pydantic error as ``field=value: what is allowed`` (or the unknown field and the known ones)."""
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = err.get("msg", "").removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        known = ", ".join(f for f in Problem.model_fields if f != "op")
        return f"unknown field {loc!r}; Problem fields: {known}"
    return f"{loc}={err.get('input')!r}: {msg}" if loc else msg


def make_problem(op: str, **fields) -> Problem:
    """``Problem(op=op, **fields)``, with an error that names each bad field, its value and what is allowed.

    Args:
        op: an op name (see ``linattn.dispatch.OPS``).
        fields: :class:`Problem` fields (``n``, ``t``, ``h``, ``hv``, ``k``, ``v``, ``d``, ``dtype``, ...).
    Returns:
        Problem.
    Raises:
        UsageError: (a ValueError) an unknown op or field, a bad value, or an impossible shape.
    Example:
        >>> make_problem("gdn_decode", n=2, h=1, hv=2, k=8, v=8).brief()
        'N=2 T=1 H=1 HV=2 K=8 V=8 bfloat16 state=float32/vk mode=pool'
    """
    try:
        return Problem(op=op, **fields)
    except ValidationError as e:
        raise UsageError(f"bad problem for {op}: " + "; ".join(_problem_error(err) for err in e.errors())) from None


def _preset_for(op: str, model: str):
    """The preset ``model``, checked against ``op``'s family."""
    if op not in OPS:
        raise UsageError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    try:
        p = preset(model)
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    fam = OP_TABLE[op].family
    if p.family != fam:
        ops = ops_of(p.family)
        raise UsageError(f"model {model!r} ({p.title}) is a {p.family!r} model; {op} needs a {fam!r} model "
                         f"such as {OP_TABLE[op].default_preset!r}. Ops for {model!r}: {', '.join(ops)}")
    return p


def preset_shape(op: str, model: str) -> dict:
    """The :class:`Problem` fields a model preset fixes for ``op`` (head counts and dims, or ``D``).

    Args:
        op: an op name. model: a preset of the op's family (``qwen3-next`` for GDN ops, ...).
    Returns:
        dict: ``h, hv, k, v`` (decode, prefill); ``hv, k, mode`` (gating; ``k = 0`` for GDN);
        ``d, clamp_limit, mode`` (``silu_and_mul_clamp``).
    Raises:
        UsageError: an unknown op or model, or a model of another family.
    Example:
        >>> preset_shape("gdn_decode", "qwen3-next")
        {'h': 16, 'hv': 32, 'k': 128, 'v': 128}
    """
    p = _preset_for(op, model)
    spec = OP_TABLE[op]
    if spec.method == "clamp":
        return dict(d=p.D, clamp_limit=p.limit is not None, mode="none")
    if spec.phase == "gating":
        return dict(hv=p.HV, k=p.K if spec.per_channel_gates else 0, mode="none")
    return dict(h=p.H, hv=p.HV, k=p.K, v=p.V)
