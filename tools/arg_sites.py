"""Where an op argument is written out in the shipped code: the measure of issue 30 section 1.

For each argument name, every module of the installed package (the ``package-dir`` folders of
``pyproject.toml``) is parsed with ``ast`` and each *listing* of the name is found: a function
parameter, a keyword in a call, a string constant (a dict key, a tuple of names, a ``getattr``
name) or a class-body field annotation (a dataclass or pydantic field). Reads of an attribute or
a local variable (``call.has_initial_state``, ``x``) are uses, not listings, and are not counted.

A *place* is one innermost enclosing function or class (or the module body) holding at least one
listing: what a new argument's diff must touch by hand. Places are grouped by role: ``spec`` (the
op table), ``rule`` (host and value rules), ``backend`` (backends/ and kernels/: what implements
the argument), ``public`` (the public functions in linattn/ops.py and the plugin API's call classes
in dispatch/plugin/calls.py, typed signatures by design) and
``suite`` (linattn/testing: the conformance cases and input builders that exercise it) and
``plumbing`` (everything else: what issue 30 wants derived from the spec).

    .venv/bin/python tools/arg_sites.py has_initial_state output_state_indices num_accepted_tokens
    .venv/bin/python tools/arg_sites.py -v output_state_indices      # list the places
"""

from __future__ import annotations

import argparse
import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {"gdn_gating", "kda_gating", "gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill", "silu_and_mul_clamp"}
#: the call classes of plugin API 2, written out for IDEs and type checkers (held to the op table by
#: tests/plugins/test_call_types.py)
CALL_CLASSES = {"DecodeCall", "PrefillCall", "GatingCall", "ClampCall"}


def modules() -> list[Path]:
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    seen, out = set(), []
    for d in dirs.values():
        for path in sorted((ROOT / d).glob("*.py")):
            if path not in seen:
                seen.add(path)
                out.append(path)
    for sub in ("testing", "compat", "integrations"):
        out.extend(sorted((ROOT / "linattn" / sub).glob("*.py")))
    for sub in ("rules", "plugin", "runtime"):  # linattn.dispatch's subpackages
        out.extend(sorted((ROOT / "dispatch" / sub).glob("*.py")))
    out.extend(sorted((ROOT / "kernels" / "triton" / "prefill").glob("*.py")))  # linattn.kernels.triton.prefill
    return out


def role(rel: str, scope: str) -> str:
    if rel == "dispatch/rules/ops_table.py":
        return "spec"
    if rel.startswith("dispatch/rules/") and rel not in ("dispatch/rules/validate.py", "dispatch/rules/layouts.py"):
        return "rule"  # host_rules.py, value_rules.py; validate.py (which runs them) and layouts.py are plumbing
    if rel.startswith(("backends/", "kernels/")) and rel != "backends/base.py":
        return "backend"
    if (rel == "linattn/ops.py" and scope in PUBLIC) or (rel == "dispatch/plugin/calls.py" and scope in CALL_CLASSES):
        return "public"
    if rel.startswith("linattn/testing/"):
        return "suite"
    return "plumbing"


def listings(tree: ast.AST, name: str):
    """(scope, line) of each listing of ``name``; scope is the innermost def/class name or '<module>'."""

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else scope
            hit = ((isinstance(child, ast.arg) and child.arg == name)
                   or (isinstance(child, ast.keyword) and child.arg == name)
                   or (isinstance(child, ast.Constant) and child.value == name)
                   or (isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name)
                       and child.target.id == name))
            if hit:
                yield scope, child.lineno
            yield from walk(child, inner)

    yield from walk(tree, "<module>")


def measure(name: str) -> dict:
    places = defaultdict(list)
    for path in modules():
        rel = str(path.relative_to(ROOT))
        for scope, line in listings(ast.parse(path.read_text()), name):
            places[(rel, scope)].append(line)
    by_role = defaultdict(list)
    for (rel, scope), lines in sorted(places.items()):
        by_role[role(rel, scope)].append((rel, scope, lines))
    return by_role


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every place")
    a = ap.parse_args()
    roles = ("spec", "rule", "backend", "public", "suite", "plumbing")
    print(f"{'argument':<24}" + "".join(f"{r:>10}" for r in roles) + f"{'places':>8}{'files':>7}")
    for name in a.names:
        by_role = measure(name)
        total = sum(len(v) for v in by_role.values())
        files = len({rel for v in by_role.values() for rel, _, _ in v})
        print(f"{name:<24}" + "".join(f"{len(by_role.get(r, ())):>10}" for r in roles) + f"{total:>8}{files:>7}")
        if a.verbose:
            for r in roles:
                for rel, scope, lines in by_role.get(r, ()):
                    print(f"    {r:<9} {rel}:{scope} (lines {', '.join(map(str, lines))})")


if __name__ == "__main__":
    main()
