"""Dispatch: the registry, problems, verdicts, selection, policies and validation."""

from .hookspecs import BackendPlugin
from .policy import Policy, current_policy, policy
from .problem import OPS, Problem, phase_of
from .registry import PluginRecord, Registry, get_registry, reset_registry
from .selection import clear_cache, explain, last_decision, resolve_device, select
from .verdict import Accepted, Check, Decision, NoBackendError, Reason, Rejected

__all__ = [
    "Accepted", "BackendPlugin", "Check", "Decision", "NoBackendError", "OPS", "PluginRecord", "Policy", "Problem",
    "Reason", "Registry", "Rejected", "clear_cache", "current_policy", "explain", "get_registry",
    "last_decision", "phase_of", "policy", "reset_registry", "resolve_device", "select",
]
