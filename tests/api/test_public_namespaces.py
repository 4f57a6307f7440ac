"""The public modules show their API and nothing else (issue 30, section 5).

``dir(M)`` (and so ``help`` and tab completion) of each public module -- ``linattn``, and every
module of ``linattn.compat``, ``linattn.integrations`` and ``linattn.testing`` -- is exactly its
``__all__``, plus the public subpackages already imported, plus (``linattn.testing`` only)
pytest's hooks, which pluggy finds through ``dir()``. ``from M import *`` gives ``__all__`` and no
typing construct or imported module (``linattn.Optional``, ``linattn.compat.fla.torch`` leaked).
"""

import dataclasses
import importlib
import pathlib
import pkgutil
import types
import typing

import pydantic
import pytest

import linattn

PACKAGES = ("linattn.compat", "linattn.integrations", "linattn.testing")


def public_modules() -> list[str]:
    """``linattn``, the public packages and every module in them (found, not listed by hand)."""
    names = ["linattn"]
    for pkg in PACKAGES:
        names.append(pkg)
        names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__)
                  if not m.name.startswith("_")]
    return names


#: What ``dir()`` may list beyond ``__all__``: public subpackages and submodules once imported
#: (attributes of their package), and pytest's hooks on ``linattn.testing``.
BEYOND_ALL = {
    "linattn": {"backends", "capabilities", "compat", "dispatch", "integrations", "kernels", "testing"},
    "linattn.testing": {"cases", "cli", "compare", "execute", "gates", "inputs", "pytest_plugin", "runner", "xfail",
                        "pytest_addoption", "pytest_collection_modifyitems", "pytest_configure"},
}


@pytest.mark.parametrize("name", public_modules())
def test_dir_of_a_public_module_is_its_all(name):
    mod = importlib.import_module(name)
    assert hasattr(mod, "__all__"), f"{name} defines no __all__"
    shown = {n for n in dir(mod) if not n.startswith("_")}
    extra = shown - set(mod.__all__)
    assert extra <= BEYOND_ALL.get(name, set()), f"{name} shows names outside __all__: {sorted(extra)}"
    assert set(mod.__all__) <= shown, f"{name}: __all__ names missing from dir(): {sorted(set(mod.__all__) - shown)}"


@pytest.mark.parametrize("name", public_modules())
def test_every_all_name_exists_and_star_import_leaks_no_typing_or_module(name):
    mod = importlib.import_module(name)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what the module does not have: {missing}"
    ns: dict = {}
    exec(f"from {name} import *", ns)
    got = {k: v for k, v in ns.items() if k != "__builtins__"}
    assert set(got) == set(mod.__all__)
    subpackages = set(BEYOND_ALL["linattn"]) | {"fla", "transformers"}  # lazily imported submodules in __all__
    leaks = [k for k, v in got.items()
             if (isinstance(v, types.ModuleType) and k not in subpackages)
             or any(v is getattr(lib, k, None) for lib in (typing, dataclasses, pathlib, pydantic))]
    assert not leaks, f"from {name} import * brings {leaks}"


def test_the_names_a_new_user_saw_leak_no_more():
    import linattn.compat.fla as fla

    assert "Optional" not in dir(linattn) and "annotations" not in dir(linattn) and "get_registry" not in dir(linattn)
    assert not {"torch", "Optional", "Any", "dataclass", "math"} & set(dir(fla))
    assert "gdn_decode" in dir(linattn) and "chunk_gated_delta_rule" in dir(fla)


def test_lazy_subpackages_in_all_resolve_on_first_use():
    import linattn.compat as compat
    import linattn.integrations as integrations

    assert isinstance(compat.fla, types.ModuleType) and compat.fla.__name__ == "linattn.compat.fla"
    assert integrations.transformers.__name__ == "linattn.integrations.transformers"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        integrations.nope  # noqa: B018


def test_pytest_finds_the_plugin_hooks_through_dir():
    """pluggy registers what ``dir(plugin)`` lists: hiding imports must not hide the hooks."""
    import linattn.testing
    import linattn.testing.pytest_plugin as plugin

    for mod in (linattn.testing, plugin):
        assert {"pytest_addoption", "pytest_configure", "pytest_collection_modifyitems"} <= set(dir(mod))
    assert not {n for n in linattn.testing.__all__ if n.startswith("pytest_")}  # not via import * into a conftest
