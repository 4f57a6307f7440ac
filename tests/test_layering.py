"""The layers of linattn import only downwards (issue 30, section 2): a test that holds the line.

Every module of the ``linattn`` import package (the folders ``pyproject.toml``'s ``package-dir``
maps: ``linattn/``, ``apps/``, ``dispatch/``, ``backends/``, ``kernels/``, ``capabilities/``) is
parsed (``ast``, nothing imported) and each of its ``import`` / ``from ... import`` statements of
another linattn module is checked against :data:`LAYERS`, top to bottom:

    tools     linattn.apps (CLI, bench, report, demo, tune), linattn.testing (conformance suite)
    ops       the public ops and the library around them: linattn, linattn.ops, compat,
              integrations, presets, context parallelism (and linattn.testing.spawn, which starts
              its ranks), the tuning measurement
    dispatch  the runtime, ``dispatch/runtime/``: selection, the per-call fast path, the registry,
              the self-check runtime, policies, plugin result checks; and the ``linattn.dispatch``
              package itself (its ``__init__`` re-exports the runtime)
    backends  one module per backend
    kernels   Triton and CuTe DSL kernels and their launchers, the grid planner
    plugin    the plugin API, ``dispatch/plugin/``: what backends implement and are checked with:
              hook specs, call objects, problems, verdicts, tuned-table types, the default
              self-check case
    rules     ``dispatch/rules/``: the op table and the validation rules it names (host rules,
              value rules, the validation that runs them, layouts)
    settings  ``dispatch/env.py`` (the ``LINATTN_*`` parsing rule) and ``dispatch/lru.py`` (the
              bounded caches and their sizes), which kernels read too
    base      device capabilities, precision helpers, the reference maths (linattn.reference),
              the comparison harness and its inputs

The issue writes the layers as ops -> dispatch -> backends -> kernels, and splits ``dispatch/``
into runtime, plugin API and rules (section 4). Only the runtime sits above ``backends/``: a
backend is written against the plugin API (``Problem``, ``Check``, ``Rank``, ``DecodeCall``) and
the rules (the op table), and a kernel reads its cache sizes and switches from the settings. The
rules sit below the plugin API (the problem model and the call objects read the op table; the
default self-check case validates its inputs), so the three subpackages import one way only:
runtime -> plugin -> rules -> settings. The op table shares ``rules/`` with the rules because each
reads the other (the table lists the rule functions; validation reads the table). A module may
import its own layer and any layer below it. Function-level (deferred) imports count too. Besides,
no module of ``dispatch/`` (runtime, plugin API, rules or settings) imports ``backends/`` or
``kernels/``, at module level or deferred (:func:`against_the_layers`): the registry loads the
built-ins from ``"module:Class"`` strings (``dispatch/runtime/registry.py``), the self-check's
float64 reference is the reference maths in the base layer (``linattn.reference``, which torch-ref
runs), and the fused value-check kernel is the Triton backends' hook, which the registry holds
(``Backend.value_check_hook``).

What the test cannot see: importing ``linattn.dispatch.plugin.problem`` runs
``linattn/dispatch/__init__`` (the runtime) first, as Python imports a package before its module;
the check is on the import statements each module writes.

Violations that stay for now would be :data:`ALLOWED`, each with why (it is empty: none stays); a
new one fails the test, and so does an entry of :data:`ALLOWED` that no longer occurs (remove it).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: layer names, top to bottom
ORDER = ("tools", "ops", "dispatch", "backends", "kernels", "plugin", "rules", "settings", "base")
#: (module name or package prefix ending in ".", layer): the first match wins
LAYERS = (
    ("linattn.apps.", "tools"), ("linattn.apps", "tools"), ("linattn.__main__", "tools"),
    ("linattn.testing.compare", "base"), ("linattn.testing.inputs", "base"),
    # starts the ranks of context parallelism (ops) for its tests, demo and benchmark; context_parallel's
    # deprecated alias spawn_ranks imports it when read
    ("linattn.testing.spawn", "ops"),
    ("linattn.testing.", "tools"), ("linattn.testing", "tools"),
    ("linattn.precision", "base"), ("linattn._namespace", "base"), ("linattn.reference", "base"),
    ("linattn.capabilities.", "base"), ("linattn.capabilities", "base"),
    ("linattn.dispatch.env", "settings"), ("linattn.dispatch.lru", "settings"),
    ("linattn.dispatch.rules.", "rules"), ("linattn.dispatch.rules", "rules"),
    ("linattn.dispatch.plugin.", "plugin"), ("linattn.dispatch.plugin", "plugin"),
    ("linattn.dispatch.runtime.", "dispatch"), ("linattn.dispatch.runtime", "dispatch"), ("linattn.dispatch", "dispatch"),
    # the two pre-split plugin paths kept as aliases of the plugin modules (dispatch/__init__.py)
    ("linattn.dispatch.hookspecs", "plugin"), ("linattn.dispatch.verdict", "plugin"),
    ("linattn.dispatch.", ""),  # any other dispatch module: placed in no subpackage's layer (layer() refuses)
    ("linattn.backends.", "backends"), ("linattn.backends", "backends"),
    ("linattn.kernels.", "kernels"), ("linattn.kernels", "kernels"),
    ("linattn.", "ops"), ("linattn", "ops"),
)

#: upward imports that stay for now: (importer, imported, "module" or "deferred") -> why.
ALLOWED: dict[tuple[str, str, str], str] = {}


def _modules() -> dict[str, Path]:
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out = {}
    for pkg, folder in dirs.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if len(rel) > 1 and f"{pkg}.{rel[0]}" in dirs:
                continue  # a subpackage with its own mapping (linattn.kernels.triton)
            out[".".join([pkg, *(p for p in rel if p != "__init__")])] = path
    return out


def layer(module: str) -> str:
    for prefix, name in LAYERS:
        if module == prefix or (prefix.endswith(".") and module.startswith(prefix)):
            if not name:
                break
            return name
    raise AssertionError(f"{module} is in no layer: place it in tests/test_layering.py's LAYERS")


def _imports(module: str, path: Path, modules: dict) -> list[tuple[str, str, int]]:
    """(imported linattn module, "module" or "deferred", line) for each import statement of ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def walk(node, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                targets = {a.name for a in child.names}
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                targets = {f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in child.names}
            else:
                targets = set()
            for t in sorted(targets):
                if (t == "linattn" or t.startswith("linattn.")) and t != module:
                    found.append((t, "deferred" if inner else "module", child.lineno))
            walk(child, inner)

    walk(ast.parse(path.read_text()), False)
    return found


def against_the_layers(module: str, target: str) -> bool:
    """Whether ``module`` importing ``target`` (at module level or deferred) breaks the layers: an
    upward import, or any import of ``backends/`` or ``kernels/`` from a module of ``dispatch/``
    (the runtime's, the plugin API's, the rules' and the settings' alike)."""
    here, there = layer(module), layer(target)
    upward = ORDER.index(there) < ORDER.index(here)
    from_dispatch = (module == "linattn.dispatch" or module.startswith("linattn.dispatch.")) and \
        there in ("backends", "kernels")
    return upward or from_dispatch


def _violations() -> dict[tuple[str, str, str], str]:
    modules = _modules()
    out = {}
    for module, path in sorted(modules.items()):
        for target, when, line in _imports(module, path, modules):
            if against_the_layers(module, target):
                out[(module, target, when)] = f"{path.relative_to(ROOT)}:{line}: {layer(module)} -> {layer(target)}"
    return out


def test_every_module_has_a_layer():
    for module in _modules():
        layer(module)


def test_imports_go_only_downwards():
    found = _violations()
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not new, "imports against the layers (import downwards, or add to ALLOWED with why):\n" + \
        "\n".join(f"  {v}  ({k[0]} -> {k[1]}, {k[2]})" for k, v in new.items())
    gone = set(ALLOWED) - set(found)
    assert not gone, f"ALLOWED lists imports that no longer occur (remove them): {sorted(gone)}"


def test_the_check_sees_an_upward_import(tmp_path):
    """The parser finds a deferred upward import and a module-level one (the test can fail)."""
    src = tmp_path / "k.py"
    src.write_text("from linattn.kernels import grid\n\ndef f():\n    from linattn.dispatch import selection\n")
    got = _imports("linattn.kernels.k", src, {})
    assert ("linattn.dispatch", "deferred", 4) in got and ("linattn.kernels", "module", 1) in got
    assert layer("linattn.dispatch.runtime.selection") == "dispatch" and layer("linattn.kernels.grid") == "kernels"
    assert ORDER.index(layer("linattn.dispatch.runtime.selection")) < ORDER.index("kernels")


def test_dispatch_may_not_import_backends_or_kernels_even_deferred(tmp_path):
    """A function-level import of ``backends/`` or ``kernels/`` in ``dispatch/`` (any of its layers)
    is found and refused; backends and kernels importing the contract below them is not."""
    src = tmp_path / "d.py"
    src.write_text("import torch\n\ndef f():\n    from linattn.backends import torch_ref\n\n"
                   "class C:\n    def g(self):\n        import linattn.kernels.triton.launch\n")
    got = _imports("linattn.dispatch.runtime.selection", src, {})
    assert ("linattn.backends", "deferred", 4) in got and ("linattn.kernels.triton.launch", "deferred", 8) in got
    for module in ("linattn.dispatch.runtime.selection", "linattn.dispatch.runtime.self_check", "linattn.dispatch.rules.value_rules",
                   "linattn.dispatch"):
        assert against_the_layers(module, "linattn.backends.torch_ref")
        assert against_the_layers(module, "linattn.kernels.triton.value_checks")
    assert not against_the_layers("linattn.backends.triton", "linattn.dispatch.rules.value_rules")
    assert not against_the_layers("linattn.kernels.triton.launch", "linattn.dispatch.env")
    assert not against_the_layers("linattn.dispatch.runtime.selection", "linattn.dispatch.rules.value_rules")


def test_the_dispatch_subpackages_import_one_way():
    """runtime -> plugin API -> rules -> settings (issue 30, section 4): never the other way."""
    down = ("linattn.dispatch.runtime.selection", "linattn.dispatch.plugin.problem", "linattn.dispatch.rules.validate",
            "linattn.dispatch.env")
    for i, module in enumerate(down):
        for lower in down[i + 1:]:
            assert not against_the_layers(module, lower), (module, lower)
            assert against_the_layers(lower, module), (lower, module)
    assert layer("linattn.dispatch.lru") == "settings" and layer("linattn.dispatch.plugin") == "plugin"


def test_a_dispatch_module_outside_the_three_subpackages_has_no_layer():
    """Every dispatch module sits in rules/, plugin/ or runtime/ (or is env / lru, or one of the two
    kept aliases): a new top-level dispatch module must be placed explicitly."""
    import pytest

    assert layer("linattn.dispatch.verdict") == layer("linattn.dispatch.plugin.verdict") == "plugin"
    with pytest.raises(AssertionError, match="in no layer"):
        layer("linattn.dispatch.something_new")
