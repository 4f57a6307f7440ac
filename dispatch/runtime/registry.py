"""The backend registry: pluggy plugins, built-in and external, and what became of each.

Built-in backends come from the plugin module :data:`BUILTIN_MODULE` (``linattn.backends.builtin``,
whose backends are ``"module:Class"`` strings too); external ones from the entry-point group
``linattn.backends``. Both are loaded by name (:func:`load_object`), so ``dispatch/`` imports no
module of ``backends/`` (``tests/test_layering.py``; the self-check's float64 reference is the
reference maths, :mod:`linattn.reference`, below every layer). What backends provide the dispatcher besides their runs, the
registry holds: the value rules as one kernel (:attr:`Registry.value_check_hook`, the Triton
backends'), so ``dispatch/`` imports no module of ``kernels/`` either.

Loading is lazy (first use), never at ``import linattn``, and never fails because of a plugin: a
plugin that cannot be imported (whatever it raises, ``sys.exit()`` and other ``BaseException``
subclasses included; only ``KeyboardInterrupt`` propagates), targets an unsupported API version,
or raises while registering is recorded with its status and skipped.

Names are first come, first served: a plugin named like one already loaded (``linattn-builtin``
included) is recorded as ``plugin_load_failed`` next to the loaded one, which it never replaces;
a backend named like a registered one fails its plugin and leaves the registered backend alone.

Concurrency: readers (selection, ``list_backends``) never lock. Writers (``add_plugin``,
``remove_plugin``, ``mark_broken``) serialise on one lock and never mutate ``backends``,
``plugins`` or ``broken`` in place: they build new ones and swap them in (copy-on-write), then bump
``generation``, which invalidates the decision cache. A reader holding one of them therefore
iterates a consistent snapshot while plugins come and go.

Environment (read here, once per load): ``LINATTN_PLUGINS`` — comma-separated allow-list of
external plugin names (entry-point names or distributions); ``LINATTN_DISABLE_PLUGINS`` —
comma-separated names never loaded. A plugin either skips is recorded (``disabled``,
``not_allowed``) with the variable that skipped it, and :meth:`Registry.why_unregistered` names it
when a backend of that name is asked for. A name in either list that no installed plugin has (a
typo, a plugin not installed here) is kept in :attr:`Registry.unknown_names`; the dispatcher warns
about it once (``dispatch/runtime/selection.py``).

This module holds no process state: the process's registry belongs to the dispatcher
(:class:`linattn.dispatch.runtime.selection.Dispatcher`), which creates, loads and replaces it.
``get_registry`` and ``reset_registry`` are importable from here for existing callers; they are
the dispatcher's (``linattn.dispatch.get_registry``).
"""

from __future__ import annotations

import importlib
import threading
import traceback
from importlib import metadata
from typing import Literal, Optional

import pluggy
from pydantic import BaseModel, ConfigDict

from ..env import env_names
from ..plugin.hookspecs import PROJECT, SUPPORTED_API_VERSIONS, LinattnSpec

ENTRY_POINT_GROUP = "linattn.backends"
#: the built-in plugin module (its hook returns the built-in backend classes), loaded by name
BUILTIN_MODULE = "linattn.backends.builtin"
#: the class every backend derives from, loaded by name on the first registration
BACKEND_BASE = "linattn.backends.base:Backend"
#: what a plugin-API-1 backend is registered behind (it presents the API 2 interface), loaded by name
FIRST_RELEASE_ADAPTER = "linattn.backends.base:FirstReleaseAdapter"
#: The name linattn's own backends register under; no other plugin may take it.
BUILTIN_PLUGIN = "linattn-builtin"

PluginStatus = Literal["loaded", "plugin_load_failed", "api_version", "disabled", "not_allowed"]
#: The statuses of a plugin that is installed but skipped because the environment says so.
SKIPPED: tuple[str, ...] = ("disabled", "not_allowed")
#: What to do about a skipped plugin, by status.
_TO_LOAD = {"disabled": "take it out of LINATTN_DISABLE_PLUGINS to load it",
            "not_allowed": "add it to LINATTN_PLUGINS to load it"}


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


class BackendTable(dict):
    """One snapshot of the registered backends, name -> instance; never changed once installed.

    ``in``, iteration, ``len`` and ``get`` see this snapshot only. Indexing a name that a later
    :meth:`Registry.remove_plugin` removed still returns the removed instance: a decision made on an
    older snapshot can fetch the backend it chose even if another thread removed its plugin since.
    """

    __slots__ = ("_retired",)

    def __init__(self, items=(), retired: Optional[dict] = None) -> None:
        super().__init__(items)
        self._retired = retired if retired is not None else {}

    def __missing__(self, name):
        try:
            return self._retired[name]
        except KeyError:
            raise KeyError(name) from None


def _split_env(var: str) -> Optional[set[str]]:
    """``var``'s names, None when blank; an empty entry is a ``ValueError`` (``dispatch/env.py``)."""
    return env_names(var)


class Registry:
    """All backends known in this process, keyed by name, and the plugin records.

    Attributes (read freely, never mutate: see the module docstring):
        backends: :class:`BackendTable` of backend name -> instance.
        plugins: list of :class:`PluginRecord`, in load order.
        broken: backend name -> error text of a failed run (remembered by name for the life of
            this registry, across ``remove_plugin``; ``reset_registry()`` starts afresh).
        generation: bumped by every change.
        unknown_names: ``LINATTN_PLUGINS`` / ``LINATTN_DISABLE_PLUGINS`` -> the names it gives that
            no installed plugin has (entry-point name or distribution), as read by the last load.
        installed: ``"name (distribution)"`` of every installed external plugin, as read by the last load.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # writers only; re-entrant for a plugin that registers from its hook
        self._retired: dict[str, object] = {}  # backends removed with their plugin, for BackendTable
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(LinattnSpec)
        self.backends: BackendTable = BackendTable(retired=self._retired)
        self.plugins: list[PluginRecord] = []
        self.broken: dict[str, str] = {}  # backend name -> error text from a failed run
        self.generation = 0
        #: the value rules as one kernel (``dispatch/rules/value_rules.py`` ``ValueCheckHook``): the first
        #: ``Backend.value_check_hook`` of the built-in plugin's backends (the Triton backends'), or None
        self.value_check_hook = None
        self.unknown_names: dict[str, tuple[str, ...]] = {}
        self.installed: tuple[str, ...] = ()

    # -- loading ------------------------------------------------------------------------------------

    def load(self, entry_points: bool = True) -> "Registry":
        builtin = importlib.import_module(BUILTIN_MODULE)
        builtin.enabled_peers()  # a malformed LINATTN_PEERS is the caller's ConfigError, not a failed built-in plugin
        self.add_plugin(builtin, name=BUILTIN_PLUGIN, distribution="linattn", version=_own_version())
        if entry_points:
            self._load_entry_points()
        return self

    def _load_entry_points(self) -> None:
        allow = _split_env("LINATTN_PLUGINS")
        deny = _split_env("LINATTN_DISABLE_PLUGINS") or set()
        try:
            eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
        except Exception as e:  # noqa: BLE001 - broken installed metadata must not break linattn
            self._record("<entry points>", "?", "?", None, "plugin_load_failed",
                         f"reading the {ENTRY_POINT_GROUP!r} entry points failed: {_short(e)}")
            return
        names = [_entry_point_names(ep) for ep in eps]
        self.installed = tuple(sorted({f"{n} ({d})" for n, d, _ in names}))
        known = {x for n, d, _ in names for x in (n, d)} | {BUILTIN_PLUGIN, "linattn"}
        self.unknown_names = {var: tuple(sorted(given - known)) for var, given in
                              (("LINATTN_PLUGINS", allow or set()), ("LINATTN_DISABLE_PLUGINS", deny)) if given - known}
        for ep in eps:
            self._load_entry_point(ep, allow, deny)

    def _load_entry_point(self, ep, allow: Optional[set[str]], deny: set[str]) -> None:
        """Load one entry point; whatever its import does (bar Ctrl-C) ends up in its record."""
        name, dist, ver = _entry_point_names(ep)
        names = {name, dist}
        if names & deny:
            self._record(name, dist, ver, None, "disabled", "disabled by LINATTN_DISABLE_PLUGINS")
            return
        if allow is not None and not names & allow:
            self._record(name, dist, ver, None, "not_allowed", "not named in LINATTN_PLUGINS (the allow-list)")
            return
        try:
            plugin = ep.load()
        except BaseException as e:  # noqa: BLE001 - a plugin must never break linattn (sys.exit included)
            if isinstance(e, KeyboardInterrupt):
                raise
            self._record(name, dist, ver, None, "plugin_load_failed", f"importing it raised {_short(e)}")
            return
        self.add_plugin(plugin, name=name, distribution=dist, version=ver)

    def add_plugin(self, plugin, *, name: str, distribution: str = "?", version: str = "?") -> PluginRecord:
        """Register a plugin object or module (tests and embedders may call this directly).

        Never raises because of the plugin (bar ``KeyboardInterrupt``): a plugin whose name is
        taken, whose API version is not supported, or whose hook or backend classes misbehave is
        recorded as failed and returned, and nothing of it stays registered.

        Returns:
            The plugin's new :class:`PluginRecord` (also appended to ``plugins``).
        """
        with self._lock:
            taken = self._loaded(name)
            if taken is not None:
                return self._record(name, distribution, version, None, "plugin_load_failed", _name_taken(taken))
            api, api_error = _api_version(plugin)
            if api_error or api not in SUPPORTED_API_VERSIONS:
                return self._record(
                    name, distribution, version, api, "api_version", api_error or
                    f"targets plugin API {api!r}; this linattn supports {sorted(SUPPORTED_API_VERSIONS)}")
            try:
                new = self._register(plugin, name, distribution, version, api)
            except BaseException as e:  # noqa: BLE001 - SystemExit from a hook is the plugin's failure
                if isinstance(e, KeyboardInterrupt):
                    raise
                return self._record(name, distribution, version, api, "plugin_load_failed", _short(e))
            if new:
                self.backends = BackendTable({**self.backends, **new}, self._retired)
                if name == BUILTIN_PLUGIN and self.value_check_hook is None:
                    self.value_check_hook = next((h for h in (getattr(b, "value_check_hook", None) for b in new.values())
                                                  if h is not None), None)
            return self._record(name, distribution, version, api, "loaded", "", tuple(new))

    def _register(self, plugin, name: str, distribution: str, version: str, api: str) -> dict:
        """Register with pluggy, call the plugin's hook, build its backends (checked, not installed).
        On any failure the plugin is unregistered again and the error propagates."""
        self.pm.register(plugin, name=name)
        try:
            hook = self.pm.subset_hook_caller("linattn_register_backends", remove_plugins=[
                p for p in self.pm.get_plugins() if p is not plugin])
            classes = [c for batch in hook() for c in (batch or [])]
            return self._instantiate(classes, name, distribution, version, api)
        except BaseException:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            raise

    def _instantiate(self, classes: list, plugin: str, distribution: str, version: str, api: str) -> dict:
        """One instance per returned class, name -> instance; a wrong return value, an unsupported
        ``api_version`` on a class or a raising constructor is the plugin's failure, never ours.
        Once all passed, a backend written for plugin API 1 (``Backend.effective_api_version``) is
        wrapped in the adapter that presents it through API 2 (:data:`FIRST_RELEASE_ADAPTER`), and
        each instance is tagged (plugin, distribution, version, the plugin's API version; classes
        are left alone: two plugins may register one class, or subclasses of one)."""
        Backend = load_object(BACKEND_BASE)
        new: dict = {}
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, Backend)):
                raise TypeError(f"linattn_register_backends returned {_safe_repr(cls)}, not a subclass of "
                                f"linattn.backends.base.Backend; return a list of backend classes")
            bname = cls.name
            if not isinstance(bname, str) or not bname or bname.startswith("plugin:"):
                raise ValueError(f"backend class {cls.__qualname__} has name {_safe_repr(bname)}; a backend "
                                 f"name is a non-empty string not starting with 'plugin:'")
            own_api = cls.__dict__.get("api_version")
            if own_api is not None and str(own_api) not in SUPPORTED_API_VERSIONS:
                raise ValueError(f"backend class {cls.__qualname__} declares api_version={own_api!r}; this linattn "
                                 f"supports {sorted(SUPPORTED_API_VERSIONS)}")
            if bname in self.backends or bname in new:
                owner = self.backends[bname].plugin if bname in self.backends else "this plugin"
                raise ValueError(f"backend name {bname!r} is already registered by {owner!r}; give "
                                 f"{cls.__qualname__} another name")
            new[bname] = cls()
        adapter = None
        for bname, inst in new.items():
            if type(inst).effective_api_version(api) == "1":
                adapter = adapter or load_object(FIRST_RELEASE_ADAPTER)
                inst = new[bname] = adapter(inst)
            inst.plugin, inst.distribution, inst.version, inst.plugin_api_version = plugin, distribution, version, api
        return new

    def remove_plugin(self, name: str) -> PluginRecord:
        """Unregister the loaded plugin ``name`` and its backends; drop every record of that name.

        Safe while other threads dispatch: their next decision no longer sees the plugin's
        backends, and a decision already made on the previous snapshot still runs the backend it
        chose. ``broken`` keeps its entries (a backend that raised stays rejected by name).

        Returns:
            The removed plugin's ``loaded`` record.
        Raises:
            ValueError: ``name`` is the built-in plugin, or names no loaded plugin.
        """
        with self._lock:
            if name == BUILTIN_PLUGIN:
                raise ValueError(f"the built-in plugin {BUILTIN_PLUGIN!r} cannot be removed; to keep its "
                                 f"backends out of decisions use policy(disable=...) or LINATTN_DISABLE")
            rec = self._loaded(name)
            if rec is None:
                loaded = [p.name for p in self.plugins if p.status == "loaded" and p.name != BUILTIN_PLUGIN]
                raise ValueError(f"no plugin named {name!r} is loaded; loaded plugins: "
                                 f"{', '.join(loaded) or 'none besides the built-in'} (see `linattn plugins`)")
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            gone = set(rec.backends)
            self._retired.update({n: b for n, b in self.backends.items() if n in gone})
            self.backends = BackendTable({n: b for n, b in self.backends.items() if n not in gone}, self._retired)
            self.plugins = [p for p in self.plugins if p.name != name]
            self.generation += 1
            return rec

    def _loaded(self, name: str) -> Optional[PluginRecord]:
        return next((p for p in self.plugins if p.name == name and p.status == "loaded"), None)

    def _record(self, name, dist, ver, api, status, error="", backends=()) -> PluginRecord:
        """Append a record. It replaces earlier records of the same name, except a ``loaded`` one:
        a loaded plugin's record is never overwritten (a failing namesake is listed next to it)."""
        rec = PluginRecord(name=name, distribution=dist, version=ver, api_version=api, status=status,
                           error=error, backends=backends)
        with self._lock:
            self.plugins = [p for p in self.plugins if p.name != name or p.status == "loaded"] + [rec]
            self.generation += 1
        return rec

    def mark_broken(self, backend: str, error: BaseException, *, where: bool = True) -> None:
        """A run raised (or returned a wrong result): report the backend as ``backend_error`` from now on.

        ``where=False`` leaves out the raising frame (for linattn's own result check: the frame
        would be linattn's, not the backend's)."""
        text = _short(error) if where else error_text(error)
        with self._lock:
            self.broken = {**self.broken, backend: text}
            self.generation += 1

    def forget_broken(self, backend: str) -> bool:
        """Let a backend marked broken by :meth:`mark_broken` be chosen again (the conformance suite
        does this between independent cases). Returns whether it was marked."""
        with self._lock:
            if backend not in self.broken:
                return False
            self.broken = {n: e for n, e in self.broken.items() if n != backend}
            self.generation += 1
            return True

    def failed_plugins(self) -> list[PluginRecord]:
        return [p for p in self.plugins if p.status in ("plugin_load_failed", "api_version")]

    def skipped_plugins(self) -> list[PluginRecord]:
        """The installed plugins the environment kept from loading (:data:`SKIPPED`)."""
        return [p for p in self.plugins if p.status in SKIPPED]

    def why_unregistered(self, backend: str) -> str:
        """Why no backend named ``backend`` is registered, as far as the plugin records tell; ``""``
        when they tell nothing.

        A plugin is not loaded, so its backends' names are unknown: a skipped or failed plugin whose
        entry-point or distribution name is ``backend`` is named as the reason; otherwise the
        skipped plugins are listed.

        Example:
            >>> reg = Registry()
            >>> _ = reg._record("cpu-chunked", "linattn-cpu-chunked", "0.1.0", None, "disabled",
            ...                 "disabled by LINATTN_DISABLE_PLUGINS")
            >>> reg.why_unregistered("cpu-chunked")  # doctest: +NORMALIZE_WHITESPACE
            "its plugin 'cpu-chunked' (distribution 'linattn-cpu-chunked') is disabled by
            LINATTN_DISABLE_PLUGINS; take it out of LINATTN_DISABLE_PLUGINS to load it"
        """
        for p in self.skipped_plugins():
            if backend in (p.name, p.distribution):
                return f"its plugin {p.name!r} (distribution {p.distribution!r}) is {p.error}; {_TO_LOAD[p.status]}"
        for p in self.failed_plugins():
            if backend in (p.name, p.distribution):
                return f"its plugin {p.name!r} (distribution {p.distribution!r}) failed to load: {p.error}"
        skipped = self.skipped_plugins()
        if skipped:
            return "plugins not loaded: " + "; ".join(f"{p.name} ({p.error})" for p in skipped)
        return ""

    def probe_device(self, device):
        """A plugin's capabilities for ``device`` (first answer wins), or None. A raising probe
        (anything bar Ctrl-C) is logged and skipped: it must not break dispatch for that device."""
        try:
            return self.pm.hook.linattn_probe_device(device=device)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            import logging

            logging.getLogger("linattn").warning("linattn: a plugin's linattn_probe_device raised for %s: %s; "
                                                 "using linattn's own probe", device, _short(e))
            return None


def load_object(spec: str):
    """The object a ``"module:attribute"`` string names, importing the module (``"a.b:C"`` is
    ``a.b.C``; the attribute may be dotted).

    Raises:
        ImportError: the module does not import. AttributeError: it has no such attribute.
        ValueError: ``spec`` has no ``":"``.
    """
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"{spec!r} is not a 'module:attribute' string")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _name_taken(taken: PluginRecord) -> str:
    how = ("register this one under another name" if taken.name == BUILTIN_PLUGIN else
           f"register this one under another name, or remove_plugin({taken.name!r}) first")
    return (f"a plugin named {taken.name!r} is already loaded (distribution {taken.distribution!r} "
            f"{taken.version}, backends {', '.join(taken.backends) or 'none'}); {how}")


# -- formatting what a plugin raised (it may not even format) ------------------------------------------

def error_text(e: BaseException) -> str:
    """``"Type: message"`` for any exception, never raising: ``sys.exit(code)`` reads as such, and an
    exception whose ``str()`` itself raises is named with that failure instead of its message."""
    kind = _type_name(e)
    if isinstance(e, SystemExit):
        return f"{kind}: sys.exit({_safe_repr(e.code)}) was called"
    try:
        msg = str(e)
    except BaseException as inner:  # noqa: BLE001 - a plugin's __str__ is plugin code
        if isinstance(inner, KeyboardInterrupt):
            raise
        return f"{kind} (its message could not be formatted: str() raised {_type_name(inner)})"
    return f"{kind}: {msg}" if msg else kind


def _short(e: BaseException) -> str:
    """:func:`error_text` plus where it was raised (the innermost frame)."""
    try:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    except Exception:  # noqa: BLE001
        where = ""
    return f"{error_text(e)}{where}"


def _type_name(e: BaseException) -> str:
    try:
        return str(type(e).__name__)
    except Exception:  # noqa: BLE001
        return "exception"


def _safe_repr(x) -> str:
    try:
        return repr(x)
    except Exception:  # noqa: BLE001
        return f"<{type(x).__qualname__} object (repr raised)>"


def _api_version(plugin) -> tuple[Optional[str], str]:
    """(the plugin's ``LINATTN_API_VERSION`` as a string or None, error text if reading it raised)."""
    try:
        api = getattr(plugin, "LINATTN_API_VERSION", None)
        return (str(api) if api is not None else None), ""
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return None, f"reading LINATTN_API_VERSION raised {_short(e)}"


def _entry_point_names(ep) -> tuple[str, str, str]:
    """(entry-point name, distribution, version), '?' for what its metadata does not say."""
    try:
        dist = ep.dist
        if dist is None:
            return str(ep.name), "?", "?"
        return str(ep.name), str(dist.name), str(dist.version)
    except Exception:  # noqa: BLE001 - odd metadata: still load and report it
        return str(getattr(ep, "name", "?")), "?", "?"


def _own_version() -> str:
    try:
        return metadata.version("linattn")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str):
    """``get_registry`` / ``reset_registry`` for callers that import them from here: the process
    registry is the dispatcher's (``dispatch/runtime/selection.py``); nothing here holds it."""
    if name in ("get_registry", "reset_registry"):
        from . import selection

        return getattr(selection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
