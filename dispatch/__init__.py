"""Dispatch: the op table, the registry, problems, verdicts, selection, policies and validation.

Three subpackages (issue 30), each importing only those below it (``tests/test_layering.py``):
``runtime/`` (selection, the fast path, the registry, policies, the self-check runtime, result
checks), ``plugin/`` (what a backend implements and is checked with: hook specs, call objects,
problems, verdicts, tuned-table types, the default self-check case) and ``rules/`` (the op table
and the validation rules it names). ``env.py`` (the ``LINATTN_*`` parsing rule) and ``lru.py``
(the bounded caches) sit below all three; kernels read them too.

Every module path of before the split stays importable, as the same module object under its old
name (``linattn.dispatch.verdict`` is ``linattn.dispatch.plugin.verdict``, ``linattn.dispatch.policy``
is ``linattn.dispatch.runtime.policy``, ...: :data:`PRE_SPLIT_PATHS`): plugin authors were told to
import ``hookspecs`` and ``verdict``, and engines and field reproducers import the others. The
library's own code uses the new paths (``tests/test_layering.py`` places no other dispatch module).
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

#: old module name -> its subpackage since the split (module docstring)
PRE_SPLIT_PATHS = {
    **dict.fromkeys(("ops_table", "host_rules", "value_rules", "validate", "layouts"), "rules"),
    **dict.fromkeys(("hookspecs", "calls", "problem", "verdict", "tuning", "self_check_case"), "plugin"),
    **dict.fromkeys(("selection", "fast_path", "registry", "policy", "self_check", "results"), "runtime"),
}


class _PreSplitFinder:
    """Finds ``linattn.dispatch.<old>`` (:data:`PRE_SPLIT_PATHS`) on first import and answers with the
    moved module itself (imported then, not with the package: ``import linattn`` loads no more)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        pkg, _, old = name.rpartition(".")
        if pkg != __name__ or old not in PRE_SPLIT_PATHS:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, _PreSplitFinder)

    @staticmethod
    def create_module(spec):
        import importlib

        old = spec.name.rpartition(".")[2]
        return importlib.import_module(f"{__name__}.{PRE_SPLIT_PATHS[old]}.{old}")

    @staticmethod
    def exec_module(module):
        pass


_sys.meta_path.append(_PreSplitFinder)

__all__ = [
    "Accepted", "BackendPlugin", "Check", "ClampCall", "ConfigError", "Decision", "DecodeCall", "Dispatcher", "Failure", "GatingCall",
    "NoBackendError", "OPS", "OP_TABLE", "OpCall", "OpSpec", "PluginRecord", "Policy", "PrefillCall", "Problem", "Rank",
    "Reason", "Registry", "Rejected", "clear_cache", "current_policy", "dispatcher", "explain", "find_op",
    "get_registry", "last_decision", "make_call", "op_spec", "phase_of", "policy", "reset_registry", "resolve_device",
    "select",
]
