"""The backend registry: pluggy plugins, built-in and external, and what became of each.

Built-in backends come from :mod:`linattn.backends.builtin`; external ones from the entry-point
group ``linattn.backends``. Loading is lazy (first use), never at ``import linattn``, and never
fails because of a plugin: a plugin that cannot be imported, targets an unsupported API version,
or raises while registering is recorded with its status and skipped.

Environment (read here, once per load): ``LINATTN_PLUGINS`` — comma-separated allow-list of
external plugin names (entry-point names or distributions); ``LINATTN_DISABLE_PLUGINS`` —
comma-separated names never loaded.
"""

from __future__ import annotations

import os
import threading
import traceback
from importlib import metadata
from typing import Literal, Optional

import pluggy
from pydantic import BaseModel, ConfigDict

from .hookspecs import PROJECT, SUPPORTED_API_VERSIONS, LinattnSpec

ENTRY_POINT_GROUP = "linattn.backends"

PluginStatus = Literal["loaded", "plugin_load_failed", "api_version", "disabled", "not_allowed"]


class PluginRecord(BaseModel):
    """What happened to one plugin (built-in or external)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    distribution: str
    version: str
    api_version: Optional[str]
    status: PluginStatus
    error: str = ""
    backends: tuple[str, ...] = ()


def _split_env(var: str) -> Optional[set[str]]:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return {x.strip() for x in raw.split(",") if x.strip()}


class Registry:
    """All backends known in this process, keyed by name, and the plugin records."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(LinattnSpec)
        self.backends: dict[str, object] = {}
        self.plugins: list[PluginRecord] = []
        self.broken: dict[str, str] = {}  # backend name -> error text from a failed run
        self.generation = 0

    # -- loading ------------------------------------------------------------------------------------

    def load(self, entry_points: bool = True) -> "Registry":
        from linattn.backends import builtin

        self.add_plugin(builtin, name="linattn-builtin", distribution="linattn", version=_own_version())
        if entry_points:
            self._load_entry_points()
        return self

    def _load_entry_points(self) -> None:
        allow = _split_env("LINATTN_PLUGINS")
        deny = _split_env("LINATTN_DISABLE_PLUGINS") or set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "?"
            ver = ep.dist.version if ep.dist is not None else "?"
            names = {ep.name, dist}
            if names & deny:
                self._record(ep.name, dist, ver, None, "disabled", "LINATTN_DISABLE_PLUGINS names it")
                continue
            if allow is not None and not names & allow:
                self._record(ep.name, dist, ver, None, "not_allowed", "not in LINATTN_PLUGINS")
                continue
            try:
                plugin = ep.load()
            except BaseException as e:  # noqa: BLE001 - a plugin must never break import linattn
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                self._record(ep.name, dist, ver, None, "plugin_load_failed", _short(e))
                continue
            self.add_plugin(plugin, name=ep.name, distribution=dist, version=ver)

    def add_plugin(self, plugin, *, name: str, distribution: str = "?", version: str = "?") -> PluginRecord:
        """Register a plugin object or module (tests and embedders may call this directly)."""
        api = getattr(plugin, "LINATTN_API_VERSION", None)
        api = str(api) if api is not None else None
        if api not in SUPPORTED_API_VERSIONS:
            return self._record(
                name, distribution, version, api, "api_version",
                f"targets plugin API {api!r}; this linattn supports {sorted(SUPPORTED_API_VERSIONS)}",
            )
        try:
            self.pm.register(plugin, name=name)
            hook = self.pm.subset_hook_caller("linattn_register_backends", remove_plugins=[
                p for p in self.pm.get_plugins() if p is not plugin])
            classes = [c for batch in hook() for c in (batch or [])]
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            return self._record(name, distribution, version, api, "plugin_load_failed", _short(e))
        from linattn.backends.base import Backend

        names = []
        try:  # a wrong return value or a raising constructor is the plugin's failure, never ours
            for cls in classes:
                if not (isinstance(cls, type) and issubclass(cls, Backend)):
                    raise TypeError(f"linattn_register_backends returned {cls!r}, not a subclass of "
                                    f"linattn.backends.base.Backend")
                if cls.name in self.backends:
                    raise ValueError(f"backend name {cls.name!r} is already registered by "
                                     f"{type(self.backends[cls.name]).plugin!r}")
                instance = cls()
                cls.plugin, cls.distribution, cls.version = name, distribution, version
                self.backends[cls.name] = instance
                names.append(cls.name)
        except Exception as e:  # noqa: BLE001
            self.pm.unregister(plugin)
            for n in names:
                del self.backends[n]
            return self._record(name, distribution, version, api, "plugin_load_failed", _short(e))
        self.generation += 1
        return self._record(name, distribution, version, api, "loaded", "", tuple(names))

    def _record(self, name, dist, ver, api, status, error="", backends=()) -> PluginRecord:
        rec = PluginRecord(name=name, distribution=dist, version=ver, api_version=api, status=status,
                           error=error, backends=backends)
        self.plugins = [p for p in self.plugins if p.name != name] + [rec]
        self.generation += 1
        return rec

    def mark_broken(self, backend: str, error: BaseException) -> None:
        """A run raised: report the backend as ``backend_error`` from now on."""
        self.broken[backend] = _short(error)
        self.generation += 1

    def failed_plugins(self) -> list[PluginRecord]:
        return [p for p in self.plugins if p.status in ("plugin_load_failed", "api_version")]

    def probe_device(self, device):
        """A plugin's capabilities for ``device`` (first answer wins), or None. A raising probe is
        logged and skipped: it must not break dispatch for that device."""
        try:
            return self.pm.hook.linattn_probe_device(device=device)
        except Exception as e:  # noqa: BLE001
            import logging

            logging.getLogger("linattn").warning("linattn: a plugin's linattn_probe_device raised for %s: %s; "
                                                 "using linattn's own probe", device, _short(e))
            return None


def _short(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def _own_version() -> str:
    try:
        return metadata.version("linattn")
    except metadata.PackageNotFoundError:
        return "0+unknown"


_lock = threading.Lock()
_registry: Optional[Registry] = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = Registry().load()
    return _registry


def reset_registry(registry: Optional[Registry] = None) -> Registry:
    """Reload plugins (after changing ``LINATTN_PLUGINS`` etc.) or install a given registry."""
    global _registry
    with _lock:
        _registry = registry if registry is not None else Registry().load()
    from .selection import clear_cache

    clear_cache()
    return _registry
