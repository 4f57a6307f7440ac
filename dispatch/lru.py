"""The bounded, least-recently-used caches of the call path, and their sizes (issue 28, fault F41).

Every per-process cache an op call can add to (but one: the compiled launches, below) is one :class:`LRUCache` with its size from a
constant here, so that a stream of calls with ever new shapes (an engine's packed prefill length,
its decode batch) keeps the process's memory bounded: the entry used longest ago is dropped, one at
a time, never the whole cache at once (which used to drop hot decode plans with the cold ones).

| cache | owner | key | size |
|---|---|---|---|
| call plans | ``dispatch/runtime/fast_path.py`` ``_plans`` | the call key (exact shapes) | :data:`CALL_PLANS_MAX` |
| class plans | ``dispatch/runtime/fast_path.py`` ``_classes`` | the call key, lengths T and N bucketed | :data:`CLASS_PLANS_MAX` |
| decisions | ``Dispatcher._cache`` (``dispatch/runtime/selection.py``) | the shape class (``Backend.size_class``) | :data:`DECISIONS_MAX` |
| first-choice log keys | ``Dispatcher._logged`` | (device, op, backend, reason) | :data:`FIRST_CHOICE_LOG_MAX` |
| input-copy plans | ``dispatch/rules/layouts.py`` ``_PLANS`` | (op, backend class) | :data:`LAYOUT_PLANS_MAX` |
| environment policies | ``dispatch/runtime/policy.py`` ``_env_cache`` | (``LINATTN_BACKEND``, ``LINATTN_DISABLE``) | :data:`ENV_POLICIES_MAX` |
| merged policies | ``dispatch/runtime/policy.py`` ``_merged`` | (scoped policy, environment policy) | :data:`MERGED_POLICIES_MAX` |
| Triton grid verdicts | ``backends/triton.py`` ``_GRID_FITS`` | (layout, op, N, heads, head dims, dtype, device) | :data:`GRID_FITS_MAX` |
| prefill replays (per class) | ``kernels/triton/prefill/replay.py`` ``PrefillReplay`` | (T bucket, N); exact (T, N) | :data:`PREFILL_REPLAYS_MAX` |
| decode launches (per class) | ``kernels/triton/decode.py`` ``DecodeReplay`` | N | :data:`DECODE_ROWS_MAX` |
| compiled launches (not an LRU) | ``kernels/triton/launch.py`` ``_compiled`` | the launch key (what Triton specializes on) | :data:`COMPILED_LAUNCHES_MAX` |

Who clears them: the process's :class:`~linattn.dispatch.runtime.selection.Dispatcher` (``dispatcher().clear()``),
which empties its own caches (decisions, first-choice log keys, self-check results, tuned tables
read) and every module-level cache named in :data:`PROCESS_CACHES` (issue 30): the table above and
the memoised functions (``functools.lru_cache``) of ``dispatch/``, ``backends/``, ``kernels/`` and
``capabilities/``. They are named as ``"module:attribute"`` strings and looked up in ``sys.modules``
only, so clearing imports nothing and a module never imported has nothing to clear; no module
registers itself, and no call pays a lookup for it. The per-plan caches (a call plan's prepared
launch, ``CallPlan.prepared``; a prefill plan's recorded launches, ``PrefillPlan.launches``; a
replay's launches per length) live in the call plans and go with them.

The one exception is the compiled-launch cache of ``kernels/triton/launch.py``, read on every kernel
launch: it is a plain dict that drops the entry stored longest ago when full (first in, first out),
because an :class:`LRUCache` hit (``move_to_end`` in a Python method) measured about 0.3 us more
per launch than a dict lookup (0.60 against 0.28 us, a 24-item launch key, CPython 3.11). Its keys
are bounded by the kernels and the classes of their arguments, not by the shapes, so it rarely fills.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any, Hashable

#: Call plans kept (``dispatch/runtime/fast_path.py``): one per distinct call key. A plan holds the prepared
#: launch and its recorded launch sequences, about 20 KB for a prefill.
CALL_PLANS_MAX = 1024
#: Class plans kept (``dispatch/runtime/fast_path.py``): one per call class (a call key with its lengths
#: T and N bucketed); each holds one call plan, which new lengths of the class derive theirs from.
CLASS_PLANS_MAX = 256
#: Triton grid verdicts kept (``backends/triton.py`` ``size_class``): one per layout, op, N, head shape,
#: dtype and device; a bool each.
GRID_FITS_MAX = 4096
#: Per prefill call class (``PrefillReplay``): (T bucket, N) plans with their recorded launches kept, and
#: as many exact (T, N) plans where a bucket cannot serve; a recorded plan is about 20 KB.
PREFILL_REPLAYS_MAX = 256
#: Per decode call class (``DecodeReplay``): launches kept, one per batch size N (a few hundred bytes each).
DECODE_ROWS_MAX = 512
#: Decisions kept (``Dispatcher``): one per shape class, device, policy, forced backend, registry
#: generation and capture state; a decision with every verdict is a few KB.
DECISIONS_MAX = 1024
#: First-choice log keys kept: one per (device, op, chosen backend, reason): bounded by the ops and
#: backends, the cap only guards against a registry that keeps adding backends.
FIRST_CHOICE_LOG_MAX = 256
#: Input-copy plans kept (``dispatch/rules/layouts.py``): one per (op, backend class).
LAYOUT_PLANS_MAX = 256
#: Environment policies kept (``dispatch/runtime/policy.py``): one per distinct pair of values of
#: ``LINATTN_BACKEND`` / ``LINATTN_DISABLE`` seen by an op call (a process that rewrites them per call
#: parses each pair once while it is among the last 64).
ENV_POLICIES_MAX = 64
#: Merged policies kept (``dispatch/runtime/policy.py``): one per (``policy()`` scope, environment policy) pair.
MERGED_POLICIES_MAX = 256
#: Compiled kernels kept by ``kernels/triton/launch.py`` (first in, first out: module docstring): one
#: per launch key (kernel, device, options, constexprs, argument dtypes, alignment and int classes).
COMPILED_LAUNCHES_MAX = 4096


#: Every module-level cache of the call path, as ``"module:attribute"``: what
#: :meth:`~linattn.dispatch.runtime.selection.Dispatcher.clear` empties (module docstring), each a dict (an
#: :class:`LRUCache` included) or a ``functools.lru_cache`` function. The call plans, class plans and
#: grid verdicts are dropped by ``clear_cache()`` too (``fast_path.clear``); the rest (input-copy
#: plans, policies, memoised configurations, probes, compiled kernels) only by ``Dispatcher.clear()``.
#: ``tests/dispatch/test_cache_owner.py`` holds this list against the modules' own caches.
PROCESS_CACHES: tuple[str, ...] = (
    "linattn.dispatch.runtime.fast_path:_plans",
    "linattn.dispatch.runtime.fast_path:_classes",
    "linattn.dispatch.runtime.fast_path:_SHAPE_AT",
    "linattn.dispatch.rules.layouts:_PLANS",
    "linattn.dispatch.runtime.policy:_env_cache",
    "linattn.dispatch.runtime.policy:_merged",
    "linattn.backends.triton:_GRID_FITS",
    "linattn.backends.triton:_prefill_state_bv",
    "linattn.backends.torch_chunked:_SCALES",
    "linattn.backends.torch_chunked:_LAYOUTS",
    "linattn.backends.torch_chunked:_CONSTANTS",
    "linattn.backends.peer:import_library",
    "linattn.kernels.grid:_plan",
    "linattn.kernels.triton.decode:_config",
    "linattn.kernels.triton.silu_clamp:silu_config",
    "linattn.kernels.cutedsl:device_arch",
    "linattn.kernels.cutedsl:importable",
    "linattn.capabilities.probe:_probe",
    "linattn.kernels.triton.launch:_compiled",
    "linattn.kernels.cutedsl.chunk_state:_CACHE",
    "linattn.kernels.cutedsl.fused_walk:_CACHE",
    "linattn.kernels.cutedsl.fused_walk:_STEPS",
    "linattn.kernels.cutedsl.fused_walk:_LAYOUTS",
    "linattn.kernels.cutedsl.fused_prep:_CACHE",
    "linattn.kernels.cutedsl.fused_prefill:_CACHE",
    "linattn.compat.fla:_OPTION_SETS",
    "linattn.compat.fla:_CPU_SLOTS",
)


def process_caches() -> dict[str, Any]:
    """The caches of :data:`PROCESS_CACHES` whose modules are imported, by ``"module:attribute"``.
    Imports nothing."""
    out = {}
    for spec in PROCESS_CACHES:
        mod, _, attr = spec.partition(":")
        module = sys.modules.get(mod)
        if module is not None:
            out[spec] = getattr(module, attr)
    return out


def cache_size(cache: Any) -> int:
    """Entries held by a dict or a ``functools.lru_cache`` function."""
    info = getattr(cache, "cache_info", None)
    return info().currsize if info is not None else len(cache)


def clear_process_caches() -> None:
    """Empty every cache :func:`process_caches` gives (``Dispatcher.clear`` calls this)."""
    for cache in process_caches().values():
        clear = getattr(cache, "cache_clear", None)
        (clear or cache.clear)()


class LRUCache(OrderedDict):
    """A dict that keeps at most ``maxsize`` entries, dropping the least recently used.

    :meth:`get` counts as a use (the entry moves to the recent end); :meth:`put` stores and drops the
    oldest entry beyond ``maxsize``. Plain ``[]`` reads and ``in`` do not reorder. Thread-safe as
    far as the callers need it: a concurrent eviction of the entry being read makes :meth:`get`
    return the default (a miss), never raise ``KeyError``; an unhashable key raises ``TypeError``
    as a dict does.

    Args:
        maxsize: entries kept, >= 1.
        distinct_values: every value is stored under one key only (a call plan, a class plan): then a
            :meth:`get` of the entry used last (the same value as the last get or put) skips the
            reordering, which is a no-op for it, so a repeated hit costs one dict lookup (one hash of
            the key) instead of two (``dispatch/runtime/fast_path.py``'s call keys hash some 90 items).
    Raises:
        ValueError: ``maxsize < 1``.

    Example:
        >>> c = LRUCache(2); c.put("a", 1); c.put("b", 2); c.get("a"); c.put("c", 3); list(c)
        1
        ['a', 'c']
    """

    def __init__(self, maxsize: int, *, distinct_values: bool = False):
        if not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"an LRU cache needs maxsize >= 1 (an int); got {maxsize!r}")
        super().__init__()
        self.maxsize = maxsize
        self._distinct = distinct_values
        self._recent: Any = _NONE  # distinct_values: the value used last (at the recent end)

    def get(self, key: Hashable, default: Any = None) -> Any:
        if self._distinct:
            value = _dict_get(self, key, _NONE)
            if value is _NONE:
                return default
            if value is not self._recent:  # else it is at the recent end already
                try:
                    self.move_to_end(key)
                except KeyError:  # dropped by another thread meanwhile: a miss
                    return default
                self._recent = value
            return value
        try:
            self.move_to_end(key)
            return self[key]
        except KeyError:
            return default

    def put(self, key: Hashable, value: Any) -> None:
        size = len(self)
        _od_setdefault(self, key, value)  # a new key: stored at the recent end (one hash of the key)
        if len(self) == size:  # the key was there: replace its value and mark it used
            self[key] = value
            self.move_to_end(key)
        self._recent = value
        while len(self) > self.maxsize:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                break

    def clear(self) -> None:
        super().clear()
        self._recent = _NONE


_NONE = object()  # no value (a stored value may be None)
_dict_get = dict.get
_od_setdefault = OrderedDict.setdefault
