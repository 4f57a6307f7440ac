"""Forcing and disabling backends: per call, scoped, or from the environment.

Precedence: a call's ``backend=`` beats a scoped :func:`policy`, which beats the environment.
Keys are phases (``decode``, ``prefill``, ``gating``, ``mlp``), op names (``gdn_decode``, ...), or
``all``; an op key beats its phase key, which beats ``all``.

Environment, read here and nowhere else:
    LINATTN_BACKEND="decode=triton-folded,prefill=torch-ref"   (a bare name means all phases)
    LINATTN_DISABLE="triton-folded,triton-split"

Example:
    >>> import linattn
    >>> with linattn.policy(decode="torch-ref"):
    ...     pass
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator, Optional

from pydantic import BaseModel, ConfigDict

from .ops_table import OPS, PHASES
from .problem import phase_of

_KEYS = set(PHASES) | set(OPS) | {"all"}


class Policy(BaseModel):
    """Frozen, hashable: part of the decision cache key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    force: tuple[tuple[str, str], ...] = ()  # (key, backend)
    disable: frozenset[str] = frozenset()
    source: str = "default"

    def forced_for(self, op: str) -> Optional[str]:
        table = dict(self.force)
        return table.get(op) or table.get(phase_of(op)) or table.get("all")

    def merged_over(self, base: "Policy") -> "Policy":
        force = dict(base.force)
        force.update(dict(self.force))
        return Policy(force=tuple(sorted(force.items())), disable=base.disable | self.disable,
                      source=self.source if self.force or self.disable else base.source)


def parse_force(spec: str, source: str) -> tuple[tuple[str, str], ...]:
    """Parse ``"decode=triton-folded,prefill=torch-ref"`` or a bare ``"torch-ref"``.

    Raises:
        ValueError: an unknown key, naming the allowed keys.
    """
    out = {}
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        key, sep, name = item.partition("=")
        if not sep:
            key, name = "all", item
        key, name = key.strip(), name.strip()
        if key not in _KEYS:
            raise ValueError(f"{source}: unknown key {key!r} in {spec!r}; allowed: phases {PHASES}, "
                             f"op names {OPS}, or 'all'")
        out[key] = name
    return tuple(sorted(out.items()))


_env_cache: dict[tuple, Policy] = {}


#: On POSIX, the bytes mapping ``os.environ`` reads and writes (``os.environ[...] = ...`` and
#: ``del`` update it): reading it skips ``os.environ``'s per-read key encoding, on every op call.
_ENVIRON_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _env_raw() -> tuple:
    data = _ENVIRON_BYTES
    if data is not None:
        return data.get(b"LINATTN_BACKEND", b""), data.get(b"LINATTN_DISABLE", b"")
    return os.environ.get("LINATTN_BACKEND", ""), os.environ.get("LINATTN_DISABLE", "")


def env_policy() -> Policy:
    """The policy from ``LINATTN_BACKEND`` / ``LINATTN_DISABLE`` (parsed once per distinct value)."""
    key = _env_raw()
    pol = _env_cache.get(key)
    if pol is None:
        raw = tuple(os.fsdecode(x) for x in key)
        pol = Policy(force=parse_force(raw[0], "LINATTN_BACKEND"),
                     disable=frozenset(x.strip() for x in raw[1].split(",") if x.strip()),
                     source="env" if any(raw) else "default")
        _env_cache[key] = pol
    return pol


_scoped: contextvars.ContextVar[Optional[Policy]] = contextvars.ContextVar("linattn_policy", default=None)


def current_policy() -> Policy:
    """The effective policy: the scoped one (if any) over the environment's."""
    env = env_policy()
    scoped = _scoped.get()
    return scoped.merged_over(env) if scoped is not None else env


@contextlib.contextmanager
def policy(*, disable: tuple[str, ...] | list[str] = (), **force: str) -> Iterator[Policy]:
    """Force or disable backends inside a ``with`` block (nests; inner wins).

    Args:
        disable: backend names never to pick inside the block.
        **force: ``decode="triton-folded"``, ``prefill="triton-split"``, ``gdn_decode="torch-ref"``,
            ``all="torch-ref"``.
    Raises:
        ValueError: an unknown phase/op key.
    """
    for key in force:
        if key not in _KEYS:
            raise ValueError(f"policy(): unknown key {key!r}; allowed: phases {PHASES}, op names {OPS}, or 'all'")
    mine = Policy(force=tuple(sorted(force.items())), disable=frozenset(disable), source="policy()")
    outer = _scoped.get()
    token = _scoped.set(mine.merged_over(outer) if outer is not None else mine)
    try:
        yield _scoped.get()
    finally:
        _scoped.reset(token)
