"""Dispatch: the op table, the registry, problems, verdicts, selection, policies and validation."""

from .calls import ClampCall, DecodeCall, GatingCall, OpCall, PrefillCall, make_call
from .env import ConfigError
from .hookspecs import BackendPlugin
from .ops_table import OP_TABLE, OPS, OpSpec, find_op, op_spec
from .policy import Policy, current_policy, policy
from .problem import Problem, phase_of
from .registry import PluginRecord, Registry
from .selection import (Dispatcher, clear_cache, dispatcher, explain, get_registry, last_decision, reset_registry,
                        resolve_device, select)
from .verdict import Accepted, Check, Decision, Failure, NoBackendError, Rank, Reason, Rejected

__all__ = [
    "Accepted", "BackendPlugin", "Check", "ClampCall", "ConfigError", "Decision", "DecodeCall", "Dispatcher", "Failure", "GatingCall",
    "NoBackendError", "OPS", "OP_TABLE", "OpCall", "OpSpec", "PluginRecord", "Policy", "PrefillCall", "Problem", "Rank",
    "Reason", "Registry", "Rejected", "clear_cache", "current_policy", "dispatcher", "explain", "find_op",
    "get_registry", "last_decision", "make_call", "op_spec", "phase_of", "policy", "reset_registry", "resolve_device",
    "select",
]
