"""Function calls per call of the host path, two source trees compared: a deterministic A/B (issue 28).

Timed host costs on a shared machine move by 2x from run to run; cProfile's count of function
calls (Python functions and C methods alike) per call does not. For each tree (a checkout of the
repository, e.g. ``git worktree add /tmp/old 9149609``) a child process imports ``linattn`` from
that tree (its ``pyproject.toml`` package-dir mapping, ahead of the installed package) and runs that
tree's CPU proxy (``benchmarks/host_overhead_cpu.py``: ``triton-split`` forced, kernel launches
stubbed): 2,000 repeated ``gdn_decode`` calls (batch 1) and 500 ``gdn_prefill`` calls (1 x 64), and
the stream passes of ``_streams.py`` (300 calls each of the same T / a new T / the same N / a new
N, one pass after a warm pass and ``clear_cache()``), validate off and on. Prints each row's calls
per call in both trees and the functions whose counts grew; ``--out`` writes them as JSON. The
children run with ``PYTHONHASHSEED=0`` unless it is set: some trees' new-length passes vary by a few
calls per call with the hash seed.

    git worktree add --detach /tmp/old 9149609
    .venv/bin/python benchmarks/host_calls_ab.py /tmp/old .            # old tree against this one
    HOST_BENCH_FUSED=0 .venv/bin/python benchmarks/host_calls_ab.py /tmp/old .   # torch value checks
    git worktree remove /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def _import_from(tree: Path) -> None:
    """Make ``import linattn`` (and its mapped subpackages) load from ``tree``."""
    import importlib.util
    import tomllib

    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {name: tree / d for name, d in dirs.items()}

    class Finder:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            d = mapping.get(name)
            if d is None:
                return None
            return importlib.util.spec_from_file_location(name, d / "__init__.py", submodule_search_locations=[str(d)])

    sys.meta_path.insert(0, Finder)


def _counts(prof, n: int) -> dict:
    """Calls per call, in all and by function (``file:name``, the file relative to the tree or site-packages)."""
    import pstats

    root = str(Path.cwd()) + "/"
    funcs: dict[str, int] = {}
    for (file, _, name), (_, ncalls, *_) in pstats.Stats(prof).stats.items():
        file = file[len(root):] if file.startswith(root) else file.split("site-packages/")[-1]
        funcs[f"{file}:{name}"] = funcs.get(f"{file}:{name}", 0) + ncalls
    return dict(per_call=round(sum(funcs.values()) / n, 2), funcs={k: round(v / n, 3) for k, v in funcs.items()})


def child(tree: Path) -> dict:
    """The rows of the tree this process runs in (the working directory is ``tree``)."""
    import cProfile

    _import_from(tree)
    sys.path.insert(0, str(tree / "benchmarks"))
    import host_overhead_cpu as proxy  # noqa: E402 - the tree's own proxy, after the import hook
    import linattn
    import torch
    from _streams import StreamInputs, stream

    assert Path(linattn.__file__).resolve().is_relative_to(tree), linattn.__file__
    torch.set_num_threads(1)
    rows = {}
    with torch.inference_mode(), proxy.stubbed_launch():
        for op_name, n in (("gdn_decode", 2000), ("gdn_prefill", 500)):
            make, _ = proxy.OPS[op_name]
            op, x = getattr(linattn, op_name), make(op_name.split("_")[0])
            for validate in (False, True):
                for _ in range(10):
                    op(**x, validate=validate, backend=proxy.BACKEND)
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(n):
                    op(**x, validate=validate, backend=proxy.BACKEND)
                prof.disable()
                rows[f"{op_name} repeated, validate={validate}"] = _counts(prof, n)
        inputs = StreamInputs("gdn", "cpu")
        for validate in (False, True):
            for kind in ("same_t", "new_t", "same_n", "new_n"):
                passes = stream(kind, inputs, 300)
                linattn.dispatch.clear_cache()
                proxy._timed_pass(passes, validate)
                linattn.dispatch.clear_cache()
                prof = cProfile.Profile()
                prof.enable()
                proxy._timed_pass(passes, validate)
                prof.disable()
                rows[f"stream {kind}, validate={validate}"] = _counts(prof, len(passes))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="two source trees: before, after")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="a JSON file for both trees' counts")
    ap.add_argument("--top", type=int, default=8, help="grown functions listed per row")
    args = ap.parse_args(argv)
    if args.child:
        rows = child(Path(args.child).resolve())
        sys.stdout.write("\n" + json.dumps(rows) + "\n")
        return 0
    if len(args.trees) != 2:
        ap.error("give two trees: before, after")
    got = []
    for tree in map(Path, args.trees):
        tree = tree.resolve()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(tree)], cwd=tree,
                              env={**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}, check=True, capture_output=True, text=True)
        got.append(json.loads(done.stdout.strip().splitlines()[-1]))
    before, after = got
    for row, a in before.items():
        b = after[row]
        print(f"{row:36s} {a['per_call']:8.1f} -> {b['per_call']:8.1f}")
        grew = sorted(((b["funcs"][f] - a["funcs"].get(f, 0), f) for f in b["funcs"]
                       if b["funcs"][f] > a["funcs"].get(f, 0) + 1e-9), reverse=True)
        for d, f in grew[:args.top]:
            print(f"    +{d:7.3f}  {f}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(trees=[str(t) for t in args.trees], before=before, after=after),
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
