"""Forcing and disabling backends: per call, scoped, or from the environment.

Keys are phases (``decode``, ``prefill``, ``gating``, ``mlp``), op names (``gdn_decode``, ...), or
``all``. A key *covers* the ops it names: ``all`` every op, a phase the ops of that phase, an op
name itself.

Precedence (field faults F42, F48; docs/ops-decisions.md):

1. A call's ``backend=`` beats every policy.
2. Scopes nest, the environment being the outermost one: ``LINATTN_BACKEND`` is overridden by a
   :func:`policy` block, which is overridden by a ``policy`` block inside it. **The innermost scope
   that forces an op wins**, whatever its key's granularity: ``with policy(gdn_decode=A): with
   policy(decode=B):`` runs ``gdn_decode`` on B, and ``LINATTN_BACKEND=gdn_decode=A`` under
   ``with policy(all=B):`` runs it on B. Ops an inner scope does not cover keep the outer force.
3. Within one scope the more specific key wins: ``gdn_decode`` over ``decode`` over ``all``.
4. A contradiction inside one scope is refused (``ValueError`` naming the entries): the same key
   forced to two backends (``LINATTN_BACKEND="decode=a,decode=b"``, or ``"a,all=b"``).
5. ``disable`` accumulates over every scope; forcing a disabled backend is never a silent fallback:
   the call is refused (``NoBackendError``, the backend rejected as ``disabled``).

:meth:`Policy.merged_over` applies rule 2 by dropping each outer key that an inner key covers, so
the merged ``force`` table resolves with rule 3 alone (:meth:`Policy.forced_for`); a merged
policy is a pure function of its scopes and the decision and call-plan caches key on it.

Environment, read here and nowhere else:
    LINATTN_BACKEND="decode=triton-folded,prefill=torch-ref"   (a bare name means all=name)
    LINATTN_DISABLE="triton-folded,triton-split"
A blank variable is unset. Any malformed entry is a ``ConfigError`` (``dispatch/env.py``; a
``ValueError``) naming the variable and the entry: an empty entry (a stray comma), an empty key or backend name (``decode=``, ``=x``), an
unknown key, a key given twice with different backends, ``key=`` in ``LINATTN_DISABLE``. A
backend name that is not registered is refused when an op it is forced for is selected.

Example:
    >>> import linattn
    >>> with linattn.policy(gdn_decode="triton-folded"):
    ...     with linattn.policy(decode="torch-ref"):
    ...         linattn.dispatch.current_policy().forced_for("gdn_decode")
    'torch-ref'
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator, Optional

from pydantic import BaseModel, ConfigDict

from ..env import ConfigError
from ..lru import ENV_POLICIES_MAX, MERGED_POLICIES_MAX, LRUCache
from ..rules.ops_table import OPS, PHASES
from ..plugin.problem import phase_of

_KEYS = set(PHASES) | set(OPS) | {"all"}
#: key -> the ops it covers.
_COVERS: dict[str, frozenset[str]] = {
    key: frozenset(OPS) if key == "all" else frozenset(op for op in OPS if key in (op, phase_of(op)))
    for key in _KEYS
}
_ALLOWED_KEYS = f"allowed: phases {PHASES}, op names {OPS}, or 'all'"


class Policy(BaseModel):
    """Frozen, hashable: part of the decision and call-plan cache keys.

    Fields:
        force: ``(key, backend)`` pairs, sorted; at most one per key (module docstring, rule 3).
        disable: backend names never picked.
        source: the scope that set the policy (``default``, ``env``, ``policy()``).
        force_from: ``(key, source)`` for keys set by another scope than ``source`` (a merged policy).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    force: tuple[tuple[str, str], ...] = ()  # (key, backend)
    disable: frozenset[str] = frozenset()
    source: str = "default"
    force_from: tuple[tuple[str, str], ...] = ()  # (key, source) where not ``source``

    def _key_for(self, op: str) -> Optional[str]:
        table = dict(self.force)
        for key in (op, phase_of(op), "all"):
            if key in table:
                return key
        return None

    def forced_for(self, op: str) -> Optional[str]:
        """The backend forced for ``op``, or None: the most specific key that covers it (rule 3)."""
        key = self._key_for(op)
        return None if key is None else dict(self.force)[key]

    def forced_by(self, op: str) -> Optional[str]:
        """The scope (``env``, ``policy()``) whose key forces ``op``, or None when nothing does."""
        key = self._key_for(op)
        return None if key is None else self.forced_by_key(key)

    def forced_by_key(self, key: str) -> str:
        """The scope that set ``key`` (a key of ``force``)."""
        return dict(self.force_from).get(key, self.source)

    def merged_over(self, base: "Policy") -> "Policy":
        """This (inner) scope over ``base`` (outer): rule 2 of the module docstring. Every outer key
        that one of this scope's keys covers is dropped, so the inner force wins for those ops."""
        mine = [_COVERS[key] for key, _ in self.force]
        kept = {k: v for k, v in base.force if not any(_COVERS[k] <= ops for ops in mine)}
        source = self.source if self.force or self.disable else base.source
        origin = {k: base.forced_by_key(k) for k in kept}
        origin.update({k: self.forced_by_key(k) for k, _ in self.force})
        force = {**kept, **dict(self.force)}
        return Policy(force=tuple(sorted(force.items())), disable=base.disable | self.disable, source=source,
                      force_from=tuple(sorted((k, s) for k, s in origin.items() if s != source)))


#: What to write instead, per setting syntax: ``force`` (``LINATTN_BACKEND``) or ``disable`` (names only).
_ADVICE = {
    "force": ("Write comma-separated key=backend entries (e.g. 'decode=triton-folded,prefill=torch-ref', or a "
              f"bare backend name for all ops); keys ({_ALLOWED_KEYS}); `linattn backends` lists the backends."),
    "disable": ("Write comma-separated backend names only (e.g. 'triton-folded,triton-split'): a disabled backend "
                "is off for every op; to pick one per op, force another with LINATTN_BACKEND / policy(key=...); "
                "`linattn backends` lists the backends."),
}


def _malformed(source: str, spec: str, entry: str, problem: str, syntax: str) -> ConfigError:
    return ConfigError(f"{source}={spec!r}: entry {entry!r} {problem}. {_ADVICE[syntax]}")


def _entries(spec: str, source: str, syntax: str) -> list[str]:
    """The comma-separated entries of a non-blank setting; an empty one is refused (F48)."""
    if not spec.strip():
        return []
    entries = [x.strip() for x in spec.split(",")]
    for i, entry in enumerate(entries):
        if not entry:
            raise _malformed(source, spec, entry, f"(number {i + 1}) is empty: a stray comma or an unset "
                             "template variable", syntax)
    return entries


def parse_force(spec: str, source: str) -> tuple[tuple[str, str], ...]:
    """Parse ``"decode=triton-folded,prefill=torch-ref"`` or a bare ``"torch-ref"`` (= ``all=torch-ref``).

    Args:
        spec: the setting (``LINATTN_BACKEND``'s value); blank means nothing forced.
        source: the setting's name, for the error messages.
    Returns:
        ``(key, backend)`` pairs sorted by key.
    Raises:
        ValueError: naming ``source`` and the entry: an empty entry, an empty key or backend name
            (``decode=``), an unknown key (listing the allowed ones), or one key given two backends.

    Example:
        >>> parse_force("decode=torch-ref, gdn_prefill=triton-split", "LINATTN_BACKEND")
        (('decode', 'torch-ref'), ('gdn_prefill', 'triton-split'))
    """
    out: dict[str, str] = {}
    for item in _entries(spec, source, "force"):
        key, sep, name = item.partition("=")
        if not sep:
            key, name = "all", item
        key, name = key.strip(), name.strip()
        if not key:
            raise _malformed(source, spec, item, "has no key before '='", "force")
        if key not in _KEYS:
            raise _malformed(source, spec, item, f"has an unknown key {key!r}", "force")
        if not name:
            raise _malformed(source, spec, item, "names no backend (nothing after '=', as an unset template variable leaves it)",
                             "force")
        if "=" in name or any(c.isspace() for c in name):
            raise _malformed(source, spec, item, f"has a malformed backend name {name!r}", "force")
        if out.get(key, name) != name:
            raise _malformed(source, spec, item, f"contradicts an earlier entry: {key!r} is forced to both "
                             f"{out[key]!r} and {name!r} (a bare name means all=name); keep one", "force")
        out[key] = name
    return tuple(sorted(out.items()))


def parse_disable(spec: str, source: str) -> frozenset[str]:
    """Parse ``"triton-folded,triton-split"`` (backend names; blank means none).

    Raises:
        ValueError: naming ``source`` and the entry: an empty entry, or a ``key=backend`` entry
            (``LINATTN_DISABLE`` disables a backend for every op; force another one per op instead).
    """
    names = _entries(spec, source, "disable")
    for name in names:
        if "=" in name or any(c.isspace() for c in name):
            raise _malformed(source, spec, name, "is not a backend name (this setting takes names only)", "disable")
    return frozenset(names)


#: per (LINATTN_BACKEND, LINATTN_DISABLE) raw values: their policy (least recently used dropped, dispatch/lru.py)
_env_cache: LRUCache = LRUCache(ENV_POLICIES_MAX)


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
        pol = Policy(force=parse_force(raw[0], "LINATTN_BACKEND"), disable=parse_disable(raw[1], "LINATTN_DISABLE"),
                     source="env" if any(x.strip() for x in raw) else "default")
        _env_cache.put(key, pol)
    return pol


_scoped: contextvars.ContextVar[Optional[Policy]] = contextvars.ContextVar("linattn_policy", default=None)


#: per (scoped, environment) policy pair: the merged policy (least recently used dropped, dispatch/lru.py)
_merged: LRUCache = LRUCache(MERGED_POLICIES_MAX)


def current_policy() -> Policy:
    """The effective policy: the scoped one (if any) over the environment's (merged once per pair;
    every op call reads it).

    Raises:
        ValueError: a malformed ``LINATTN_BACKEND`` / ``LINATTN_DISABLE`` (module docstring).
    """
    env = env_policy()
    scoped = _scoped.get()
    if scoped is None:
        return env
    pol = _merged.get((scoped, env))
    if pol is None:
        pol = scoped.merged_over(env)
        _merged.put((scoped, env), pol)
    return pol


def _check_name(name: object, given: str) -> None:
    """One backend name: a non-empty string without ``=``, ``,`` or whitespace (else ValueError, as F48)."""
    if not isinstance(name, str):
        raise ValueError(f"{given} is not a backend name: give one registered backend's name as a string "
                         f"(`linattn backends` lists them), not a {type(name).__name__}")
    name = name.strip()
    if not name or "=" in name or "," in name or any(c.isspace() for c in name):
        raise ValueError(f"{given} is not a backend name: give one registered backend's name (`linattn backends` "
                         "lists them) per key, or leave the key out")


def _disable_names(disable: object) -> frozenset[str]:
    """``policy(disable=...)``: a string in ``LINATTN_DISABLE``'s syntax, or a sequence of names."""
    if isinstance(disable, str):
        return parse_disable(disable, "policy(disable=...)")
    if isinstance(disable, (bytes, dict)) or not hasattr(disable, "__iter__"):
        raise TypeError(f"policy(): disable={disable!r} is a {type(disable).__name__}; give backend names as a "
                        "list or tuple, or one string such as 'triton-folded,triton-split'")
    names = tuple(disable)
    for name in names:
        _check_name(name, f"policy(): disable={names!r} holds {name!r}, which")
    return frozenset(n.strip() for n in names)


@contextlib.contextmanager
def policy(*, disable: str | tuple[str, ...] | list[str] = (), **force: str) -> Iterator[Policy]:
    """Force or disable backends inside a ``with`` block.

    The innermost scope that covers an op wins, whatever its key's granularity; within one scope
    the op key beats the phase key, which beats ``all``; the environment is the outermost scope
    (module docstring).

    Args:
        disable: backend names never to pick inside the block (added to the outer scopes'): a
            sequence of names, or one string in ``LINATTN_DISABLE``'s syntax (``"torch-ref"``,
            ``"triton-folded,triton-split"``).
        **force: ``decode="triton-folded"``, ``prefill="triton-split"``, ``gdn_decode="torch-ref"``,
            ``all="torch-ref"``: one backend name per key.
    Raises:
        ValueError: an unknown phase/op key, a backend name that is not a non-empty string or
            holds ``=``, ``,`` or whitespace, or a ``disable`` string with an empty entry.
        TypeError: a ``disable`` that is neither a string nor a sequence of names (``5``, bytes, a dict).

    Example:
        >>> with policy(all="torch-ref"):
        ...     with policy(decode="triton-folded"):
        ...         current_policy().forced_for("kda_decode"), current_policy().forced_for("kda_prefill")
        ('triton-folded', 'torch-ref')
    """
    for key, name in force.items():
        if key not in _KEYS:
            raise ValueError(f"policy(): unknown key {key!r}; {_ALLOWED_KEYS}")
        _check_name(name, f"policy(): {key}={name!r}")
    mine = Policy(force=tuple(sorted((k, v.strip()) for k, v in force.items())), disable=_disable_names(disable),
                  source="policy()")
    outer = _scoped.get()
    token = _scoped.set(mine.merged_over(outer) if outer is not None else mine)
    try:
        yield _scoped.get()
    finally:
        _scoped.reset(token)
