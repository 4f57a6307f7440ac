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
        ValueError: the file is not TOML, or an entry lacks ``case``/``reason`` or has other keys.
    Example:
        >>> load_xfail(None)
        ()
    """
    if path is None:
        return ()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
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
            raise ValueError(f"xfail file {path}: entry {i + 1} ({entry!r}) is invalid: each [[xfail]] needs "
                             f"case = '<fnmatch pattern>' and reason = '<text>' (optional strict = true). "
                             f"{e}") from e
    return tuple(rules)


def match(rules: Sequence[XfailRule], case_id: str) -> Optional[XfailRule]:
    """The first rule whose pattern matches ``case_id``, or None."""
    for rule in rules:
        if rule.matches(case_id):
            return rule
    return None
