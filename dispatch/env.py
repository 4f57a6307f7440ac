"""The parsing rule for linattn's ``LINATTN_*`` switches and name lists (field fault F48).

A blank variable is unset. Anything else must be well formed, or reading it raises a
:class:`ConfigError` (a ``ValueError``) that names the variable, its value and what is allowed:
a switch takes ``1`` / ``0`` (or ``true`` / ``false``, ``yes`` / ``no``, ``on`` / ``off``, any
case); a name list is comma-separated names with no empty entry. ``LINATTN_BACKEND`` / ``LINATTN_DISABLE`` follow the
same rule with their own grammar (``dispatch/runtime/policy.py``).

Readers: ``LINATTN_FAST_LAUNCH`` (``kernels/triton/launch.py``), ``LINATTN_FUSED_VALUE_CHECKS``
(``dispatch/rules/value_rules.py``), ``LINATTN_PLUGINS`` / ``LINATTN_DISABLE_PLUGINS``
(``dispatch/runtime/registry.py``), ``LINATTN_PEERS`` (``backends/builtin.py``), ``LINATTN_TUNED`` /
``LINATTN_AUTOTUNE`` (``dispatch/plugin/tuning.py``; ``LINATTN_TUNE_DIR`` is a path, read there too);
``LINATTN_CUTEDSL_WALK`` takes its own values (:data:`CUTEDSL_WALK_VALUES`; ``kernels/cutedsl/fused_walk.py``,
``switch_value``: the fused GDN prefill's walk, read when a call is planned), under the same rule;
``LINATTN_CUTEDSL_PREP`` is a switch (``kernels/cutedsl/fused_prep.py``). :func:`check_kernel_switches`
reads both, so that ``explain`` refuses a malformed one before planning anything.

Example:
    >>> import os
    >>> os.environ["LINATTN_EXAMPLE"] = "off"
    >>> env_switch("LINATTN_EXAMPLE", default=True)
    False
    >>> del os.environ["LINATTN_EXAMPLE"]
"""

from __future__ import annotations

import os
from typing import Optional

class ConfigError(ValueError):
    """A malformed ``LINATTN_*`` environment variable (or a policy written in its syntax).

    A ``ValueError``, so ``except ValueError`` callers keep working; the ``linattn`` command line
    prints it as one ``error:`` line and exits 2 (a usage error), whichever command read it.
    """


_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


def env_switch(var: str, default: bool) -> bool:
    """The on/off switch ``var``; ``default`` when unset or blank.

    Raises:
        ConfigError: any other value (``"fasle"``, ``"2"``), naming the variable and the allowed values.
    """
    raw = os.environ.get(var, "").strip().lower()
    if not raw:
        return default
    if raw in _ON or raw in _OFF:
        return raw in _ON
    raise ConfigError(f"{var}={os.environ[var]!r} is not a switch: set it to 1 or 0 (also true/false, yes/no, "
                     f"on/off) or unset it (default: {int(default)})")


#: ``LINATTN_CUTEDSL_WALK``'s values -> the walk (``kernels/cutedsl/fused_walk.py``; blank: the planner's choice)
CUTEDSL_WALK_VALUES = {"0": "triton", "triton": "triton", "1": "sync", "sync": "sync", "wgmma": "wgmma",
                       "fused": "fused"}


def cutedsl_walk(raw: Optional[str] = None) -> str:
    """The walk ``LINATTN_CUTEDSL_WALK`` asks for: ``""`` (unset or blank: the planner's choice),
    ``"triton"``, ``"sync"``, ``"wgmma"`` or ``"fused"`` (the one-kernel prefill, ``kernels/cutedsl/fused_prefill.py``).

    Raises:
        ConfigError: a value not in :data:`CUTEDSL_WALK_VALUES`, naming it and the allowed ones.
    """
    raw = (os.environ.get("LINATTN_CUTEDSL_WALK", "") if raw is None else raw).strip()
    if raw == "":
        return ""
    try:
        return CUTEDSL_WALK_VALUES[raw]
    except KeyError:
        raise ConfigError(f"LINATTN_CUTEDSL_WALK={raw!r}; allowed: unset (the planner's choice), "
                          f"{', '.join(repr(k) for k in CUTEDSL_WALK_VALUES)}") from None


def check_kernel_switches() -> None:
    """Read the kernels' switches (``LINATTN_CUTEDSL_WALK``, ``LINATTN_CUTEDSL_PREP``) once.

    Raises:
        ConfigError: either is malformed (:func:`cutedsl_walk`, :func:`env_switch`).
    """
    cutedsl_walk()
    env_switch("LINATTN_CUTEDSL_PREP", default=True)


def env_names(var: str) -> Optional[set[str]]:
    """The comma-separated names of ``var``; None when unset or blank.

    Raises:
        ConfigError: an empty entry (a stray comma, an unset template variable), naming the
            variable and its value.
    """
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    names = [x.strip() for x in raw.split(",")]
    if not all(names):
        raise ConfigError(f"{var}={raw!r}: entry {names.index('') + 1} is empty (a stray comma or an unset template "
                         "variable); give comma-separated names, or unset it")
    return set(names)
