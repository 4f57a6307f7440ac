"""Dispatch: the op table, the registry, problems, verdicts, selection, policies and validation.

Three subpackages (issue 30), each importing only those below it (``tests/test_layering.py``):
``runtime/`` (selection, the fast path, the registry, policies, the self-check runtime, result
checks), ``plugin/`` (what a backend implements and is checked with: hook specs, call objects,
problems, verdicts, tuned-table types, the default self-check case) and ``rules/`` (the op table
and the validation rules it names). ``env.py`` (the ``LINATTN_*`` parsing rule) and ``lru.py``
(the bounded caches) sit below all three; kernels read them too.

Two module paths that plugin authors were told to import before the split stay importable:
``linattn.dispatch.hookspecs`` (``hookimpl``) and ``linattn.dispatch.verdict`` (``Check``,
``Reason``, ``Rank``) are the modules ``linattn.dispatch.plugin.hookspecs`` and
``linattn.dispatch.plugin.verdict``, under their old names too.
"""

import sys as _sys

from .plugin.calls import ClampCall, DecodeCall, GatingCall, OpCall, PrefillCall, make_call
from .env import ConfigError
from .plugin.hookspecs import BackendPlugin
from .rules.ops_table import OP_TABLE, OPS, OpSpec, find_op, op_spec
from .runtime.policy import Policy, current_policy, policy
from .plugin.problem import Problem, phase_of
from .runtime.registry import PluginRecord, Registry
from .runtime.selection import (Dispatcher, clear_cache, dispatcher, explain, get_registry, last_decision,
                                reset_registry, resolve_device, select)
from .plugin.verdict import Accepted, Check, Decision, Failure, NoBackendError, Rank, Reason, Rejected

from .plugin import hookspecs, verdict

# the plugin API's documented import paths of before the split (docs/writing-a-backend.md)
_sys.modules.setdefault(f"{__name__}.hookspecs", hookspecs)
_sys.modules.setdefault(f"{__name__}.verdict", verdict)

__all__ = [
    "Accepted", "BackendPlugin", "Check", "ClampCall", "ConfigError", "Decision", "DecodeCall", "Dispatcher", "Failure", "GatingCall",
    "NoBackendError", "OPS", "OP_TABLE", "OpCall", "OpSpec", "PluginRecord", "Policy", "PrefillCall", "Problem", "Rank",
    "Reason", "Registry", "Rejected", "clear_cache", "current_policy", "dispatcher", "explain", "find_op",
    "get_registry", "last_decision", "make_call", "op_spec", "phase_of", "policy", "reset_registry", "resolve_device",
    "select",
]
