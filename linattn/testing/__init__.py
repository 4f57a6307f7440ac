"""linattn.testing: the conformance suite a backend's authors run on their backend and device.

Run it as ``linattn check --backend NAME [--op OP] [--xfail FILE] [--json]``, as a pytest plugin
(``pytest -p linattn.testing.pytest_plugin --linattn-backend NAME``), or from Python::

    from linattn.testing import run_suite, load_xfail
    report = run_suite("cpu-chunked", xfail=load_xfail("linattn-xfail.toml"))
    assert report.ok, [r.message for r in report.failures()]

Cases are generated from the backend's declared capabilities (:mod:`linattn.testing.cases`) and
run by :mod:`linattn.testing.execute`, which holds them against the float64 reference at docs/ops.md's
tolerances through :mod:`linattn.testing.compare` (the one relative error, tolerance table and
checker, shared with the first-call self-check, the CuTe DSL sign-off checks and the demo); the
seeded input builders shared with the self-check are :mod:`linattn.testing.inputs`.
"""

import sys
import types
from importlib import import_module
from importlib.util import find_spec

from linattn._namespace import public_dir

__all__ = [
    "KINDS", "Case", "CaseResult", "Outcome", "SuiteReport", "XfailRule", "base_spec", "execute",
    "generate_cases", "head_dim_pairs", "load_xfail", "problem_of", "rel_error", "run_case", "run_suite",
    "tolerances",
]

#: Where each public name lives. The submodules load on first use: ``dispatch/runtime/self_check.py``
#: imports :mod:`.compare` and :mod:`.inputs` (torch only) as ``import linattn`` runs, and must not
#: pull in the suite, its cases or pytest.
_FROM = {"KINDS": "cases", "Case": "cases", "base_spec": "cases", "generate_cases": "cases",
         "head_dim_pairs": "cases", "problem_of": "cases", "Outcome": "execute", "execute": "execute",
         "rel_error": "compare", "tolerances": "compare", "CaseResult": "runner", "SuiteReport": "runner",
         "run_case": "runner", "run_suite": "runner", "XfailRule": "xfail", "load_xfail": "xfail",
         "pytest_addoption": "pytest_plugin", "pytest_collection_modifyitems": "pytest_plugin",
         "pytest_configure": "pytest_plugin"}


def __getattr__(name: str):
    sub = _FROM.get(name)
    if sub is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{sub}"), name)
    if name != "execute":
        globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``linattn.testing.execute`` stays the function: importing the submodule of that name sets it
    on the package, which this ignores (the module is ``sys.modules["linattn.testing.execute"]``)."""

    @property
    def execute(self):
        return import_module(f"{__name__}.execute").execute

    @execute.setter
    def execute(self, value) -> None:
        pass


sys.modules[__name__].__class__ = _Package

#: The submodules (``dir()`` lists those imported) and pytest's hooks: pluggy finds a plugin's hooks
#: through ``dir()`` (``pytest -p linattn.testing``), so they are listed there when pytest is
#: installed, but not in ``__all__`` (``import *`` into a conftest.py would register them twice).
_SUBMODULES = ("cases", "cli", "compare", "execute", "gates", "inputs", "pytest_plugin", "runner", "xfail")
_PYTEST_HOOKS = ("pytest_addoption", "pytest_collection_modifyitems", "pytest_configure") if find_spec("pytest") else ()
__dir__ = public_dir(__name__, (*__all__, *_PYTEST_HOOKS), _SUBMODULES)
