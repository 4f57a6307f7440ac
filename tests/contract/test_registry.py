"""Every ``@triton.jit`` function in ``kernels/triton/`` is in the registry (as a kernel or a
device helper), so a kernel cannot be added without entering the contract test."""

import pytest

registry = pytest.importorskip("linattn.kernels.triton.registry")


def test_every_jit_function_in_kernels_triton_is_registered():
    registered = {e.kernel for e in registry.KERNELS} | set(registry.HELPERS)
    found = set()
    for module in registry.kernel_modules():
        found |= set(registry.jit_functions(module))
        found |= set(registry.jit_decorated_names(module))
    missing = sorted(found - registered)
    assert not missing, ("@triton.jit functions missing from kernels/triton/registry.py (add a KernelEntry "
                         f"with contract cases, or list device helpers in HELPERS): {missing}")


def test_registry_names_only_existing_jit_functions():
    for e in registry.KERNELS:
        assert callable(e.load_kernel()), e.kernel
        assert callable(e.load_launcher()), e.launcher
    for h in registry.HELPERS:
        mod, _, attr = h.partition(":")
        assert attr in set(n.partition(":")[2] for n in registry.jit_decorated_names(mod)), h


def test_registry_check_sees_a_new_unregistered_kernel(tmp_path, monkeypatch):
    """The completeness check is not vacuous: a jit kernel in a new module is reported."""
    import sys
    import types

    src = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef _new_kernel(x):\n    pass\n"
    path = tmp_path / "newmod.py"
    path.write_text(src)
    spec = __import__("importlib.util").util.spec_from_file_location("linattn_contract_newmod", path)
    mod = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "linattn_contract_newmod", mod)
    assert registry.jit_functions("linattn_contract_newmod") == ["linattn_contract_newmod:_new_kernel"]
    assert registry.jit_decorated_names("linattn_contract_newmod") == ["linattn_contract_newmod:_new_kernel"]
    assert isinstance(mod, types.ModuleType)
