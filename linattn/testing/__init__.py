"""linattn.testing: the conformance suite a backend's authors run on their backend and device.

Run it as ``linattn check --backend NAME [--op OP] [--xfail FILE] [--json]``, as a pytest plugin
(``pytest -p linattn.testing.pytest_plugin --linattn-backend NAME``), or from Python::

    from linattn.testing import run_suite, load_xfail
    report = run_suite("cpu-chunked", xfail=load_xfail("linattn-xfail.toml"))
    assert report.ok, [r.message for r in report.failures()]

Cases are generated from the backend's declared capabilities (:mod:`linattn.testing.cases`) and
compared with the float64 reference at docs/ops.md's tolerances (:mod:`linattn.testing.execute`).
"""

from linattn._namespace import public_dir

from .cases import KINDS, Case, base_spec, generate_cases, head_dim_pairs, problem_of
from .execute import Outcome, execute, rel_error, tolerances
from .runner import CaseResult, SuiteReport, run_case, run_suite
from .xfail import XfailRule, load_xfail

__all__ = [
    "KINDS", "Case", "CaseResult", "Outcome", "SuiteReport", "XfailRule", "base_spec", "execute",
    "generate_cases", "head_dim_pairs", "load_xfail", "problem_of", "rel_error", "run_case", "run_suite",
    "tolerances",
]

try:  # ``pytest -p linattn.testing`` registers this module: expose the plugin's hooks here too
    from .pytest_plugin import pytest_addoption, pytest_collection_modifyitems, pytest_configure  # noqa: F401
except ImportError:  # pytest is not installed: the suite still runs through ``linattn check``
    pass

#: The submodules (``dir()`` lists those imported) and pytest's hooks: pluggy finds a plugin's hooks
#: through ``dir()``, so they are listed there, but not in ``__all__`` (``import *`` into a conftest.py
#: would register them twice).
_SUBMODULES = ("cases", "cli", "execute", "gates", "pytest_plugin", "runner", "xfail")
_PYTEST_HOOKS = tuple(n for n in ("pytest_addoption", "pytest_collection_modifyitems", "pytest_configure") if n in globals())
__dir__ = public_dir(__name__, (*__all__, *_PYTEST_HOOKS), _SUBMODULES)
