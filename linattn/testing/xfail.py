"""Known gaps: an xfail file a backend's authors keep next to their code.

A TOML file with one ``[[xfail]]`` table per gap::

    # linattn-xfail.toml
    [[xfail]]
    case = "kda_prefill/accuracy/*float16*"      # fnmatch pattern over case ids
    reason = "fp16 Gram matrices overflow at K=256; tracked in our issue 12"

    [[xfail]]
    case = "gdn_decode/pool/strided-view"
    reason = "we assume a contiguous pool"
    strict = true      # if the case starts passing, report it as a failure (remove the entry)

A failing case that matches is reported as ``xfail`` (with the reason) instead of ``failed``; a
passing one as ``xpass`` (a failure when ``strict``). Case ids are listed by
``linattn check --backend NAME --json`` and in the pytest item names.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from linattn._namespace import public_dir

__all__ = ["XfailRule", "load_xfail", "match"]
__dir__ = public_dir(__name__, __all__)


class XfailRule(BaseModel):
    """One known gap: a case-id pattern and why it fails."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case: str = Field(description="fnmatch pattern over case ids, e.g. 'kda_prefill/accuracy/*'")
    reason: str = Field(min_length=1)
    strict: bool = False

    def matches(self, case_id: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.case)


def load_xfail(path: Union[str, Path, None]) -> tuple[XfailRule, ...]:
    """Read an xfail file (see the module docstring); None gives no rules.

    Args:
        path: a TOML file with ``[[xfail]]`` tables (``case``, ``reason``, optional ``strict``).
    Returns:
        The rules, in file order (the first match wins).
    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is a directory, unreadable, not UTF-8 or not TOML, or an entry lacks ``case``/``reason`` or has other keys.
    Example:
        >>> load_xfail(None)
        ()
    """
    if path is None:
        return ()
    path = Path(path)
    try:
        data = tomllib.loads(_read(path))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"xfail file {path}: not valid TOML ({e}); see linattn.testing.xfail for the format.") from e
    entries = data.get("xfail", [])
    unknown = set(data) - {"xfail"}
    if unknown or not isinstance(entries, list):
        raise ValueError(f"xfail file {path}: expected only [[xfail]] tables, got keys {sorted(data)}; "
                         f"write one [[xfail]] table per gap with case = '<pattern>' and reason = '...'.")
    rules = []
    for i, entry in enumerate(entries):
        try:
            rules.append(XfailRule(**entry))
        except (ValidationError, TypeError) as e:
            raise ValueError(f"xfail file {path}: entry {i + 1} ({entry!r}) is invalid: {_entry_problems(e)}; each "
                             f"[[xfail]] needs case = '<fnmatch pattern>' and reason = '<text>' (optional strict = "
                             f"true).") from None
    return tuple(rules)


def _read(path: Path) -> str:
    """The file's text (UTF-8, as TOML is); a directory, an unreadable or a non-UTF-8 file is a
    ``ValueError`` naming the file (a missing one stays ``FileNotFoundError``, naming it too)."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"xfail file {path}: does not exist ({e.strerror}); give the path of a TOML file") from None
    except IsADirectoryError:
        raise ValueError(f"xfail file {path}: is a directory; give the TOML file itself.") from None
    except OSError as e:
        raise ValueError(f"xfail file {path}: cannot be read ({e.strerror or e}).") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"xfail file {path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                         "TOML files are UTF-8.") from None


def _entry_problems(err: Exception) -> str:
    """One line per pydantic error, joined: ``field 'reason': Field required``."""
    if not isinstance(err, ValidationError):
        return str(err)
    return "; ".join(f"field {'.'.join(str(x) for x in e['loc']) or '?'!r}: {e['msg']}" for e in err.errors())


def match(rules: Sequence[XfailRule], case_id: str) -> Optional[XfailRule]:
    """The first rule whose pattern matches ``case_id``, or None."""
    for rule in rules:
        if rule.matches(case_id):
            return rule
    return None
