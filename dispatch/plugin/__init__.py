"""The plugin API: what a backend author implements, and what a backend is checked with.

``hookspecs`` (the pluggy hooks and ``hookimpl``), ``calls`` (the call objects of plugin API 2),
``problem`` (:class:`~linattn.dispatch.plugin.problem.Problem`, what a backend's predicates read),
``verdict`` (``Check``, ``Rank``, ``Reason``, the verdicts and decisions), ``tuning`` (the tuned
table's types and buckets, which a decision carries) and ``self_check_case`` (the default
first-call self-check a backend inherits). The backend base class is ``backends/base.py``; how to
write one is docs/writing-a-backend.md.

Layering (``tests/test_layering.py``): imports the rules (``dispatch/rules/``) and
``dispatch/env.py`` below it, never the runtime (``dispatch/runtime/``). Backends import it.
"""

from .hookspecs import BackendPlugin, hookimpl
from .problem import Problem
from .verdict import Accepted, Check, Rank, Reason, Rejected

__all__ = ["Accepted", "BackendPlugin", "Check", "Problem", "Rank", "Reason", "Rejected", "hookimpl"]
