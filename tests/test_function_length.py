"""No host-side function or method in shipped code is longer than 80 lines.

Shipped code: the folders pyproject.toml maps into the ``linattn`` package (``linattn/``, ``apps/``,
``dispatch/``, ``backends/``, ``kernels/``, ``capabilities/``) and the example plugin. A function's
length runs from its ``def`` line to its last line (docstring included, decorators not). Device
code is exempt: functions decorated with ``triton.jit`` / ``jit`` and CuTe DSL kernels
(``cute.kernel``, ``cute.jit``).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("linattn", "apps", "dispatch", "backends", "kernels", "capabilities", "examples/linattn-cpu-chunked")
MAX_LINES = 80
#: Decorators of device code, as dotted names (a call such as ``@triton.jit(...)`` counts too).
DEVICE_DECORATORS = {"triton.jit", "jit", "tl.jit", "cute.kernel", "cute.jit"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def long_functions(source: str, max_lines: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """``(line, qualified name, length)`` of every host function in ``source`` over ``max_lines`` lines."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                device = any(_dotted(d) in DEVICE_DECORATORS for d in child.decorator_list)
                length = child.end_lineno - child.lineno + 1
                if not device and length > max_lines:
                    out.append((child.lineno, name, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def shipped_files() -> list[Path]:
    return sorted(p for folder in SHIPPED for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts and ".egg-info" not in str(p))


def test_no_shipped_host_function_is_longer_than_80_lines():
    offenders = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                 for path in shipped_files() for line, name, length in long_functions(path.read_text())]
    for o in offenders:
        print(o)
    assert not offenders, (f"{len(offenders)} host function(s) over {MAX_LINES} lines; split them by "
                           f"responsibility:\n  " + "\n  ".join(offenders))


def test_the_shipped_folders_hold_python_files():
    files = shipped_files()
    for folder in SHIPPED:
        assert any(ROOT / folder in p.parents for p in files), folder


def _function(name: str, lines: int, indent: str = "", decorator: str = "") -> str:
    """Source of a function ``lines`` long (def line included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return (f"{indent}@{decorator}\n" if decorator else "") + f"{indent}def {name}(x):\n" + body


def test_a_long_host_function_is_found_and_device_kernels_are_exempt():
    src = "import triton\nimport cutlass.cute as cute\n\n" + "\n".join([
        _function("host", MAX_LINES + 1),
        _function("exactly_the_limit", MAX_LINES),
        _function("triton_kernel", MAX_LINES + 1, decorator="triton.jit"),
        _function("autotuned", MAX_LINES + 1, decorator="triton.jit(do_not_specialize=['x'])"),
        "class StateKernel:",
        _function("kernel", MAX_LINES + 1, "    ", "cute.kernel"),
        _function("__call__", MAX_LINES + 1, "    ", "cute.jit"),
        _function("launch", MAX_LINES + 1, "    "),
    ])
    found = [(name, n) for _, name, n in long_functions(src)]
    assert found == [("host", MAX_LINES + 1), ("StateKernel.launch", MAX_LINES + 1)]
