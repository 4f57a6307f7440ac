"""Fixtures of the benchmark scripts' CPU tests."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark():
    """``load(script, name)``: ``benchmarks/<script>.py`` as the module ``name`` (in ``sys.modules``); the
    ``sys.path`` entry a script adds for its neighbours (``_results``, ``fused_walk``, ...) is taken out again,
    since benchmarks/ holds modules named decode, prefill, ..."""
    def load(script: str, name: str):
        saved = list(sys.path)
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{script}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.path[:] = saved
        return mod

    return load


@pytest.fixture
def usage_error(capsys):
    """``usage_error(main, argv)``: a benchmark's ``main(argv)`` exits as argparse does on a bad argument (code
    2); returns what it wrote to stderr."""
    def run(main, argv) -> str:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        return capsys.readouterr().err

    return run
