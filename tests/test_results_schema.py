"""benchmarks/results/: at most 15 JSON files, each in the one results schema (benchmarks/_results.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _results_module():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "_results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # pydantic resolves the module's annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_every_results_file_follows_the_schema_and_there_are_at_most_15():
    mod = _results_module()
    files = sorted((ROOT / "benchmarks" / "results").rglob("*.json"))
    assert 0 < len(files) <= mod.MAX_FILES == 15
    assert mod.check() == []
