"""The wheel ships what the package reads at run time, and setuptools builds it without warnings about
the layout: the tuned tables (``linattn/tuned/*.json``, a folder without ``__init__.py``) and the
model presets are package data, and no folder is "absent from the packages configuration"."""

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """Build the wheel from a copy of what the build reads (pyproject.toml, README.md and the
    package-dir folders), without build isolation (the venv's setuptools); ``(wheel, pip's output)``."""
    pytest.importorskip("setuptools")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in sorted(set(project["tool"]["setuptools"]["package-dir"].values())):
        if "/" not in folder:  # the top folders (kernels/triton is inside kernels)
            shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return next((tmp_path / "dist").glob("linattn-*.whl")), out.stdout + out.stderr


def test_the_wheel_ships_the_tuned_tables_and_presets_without_a_layout_warning(tmp_path):
    wheel, log = _build_wheel(tmp_path)
    assert "is absent from the `packages` configuration" not in log, log
    assert "Package would be ignored" not in log, log
    names = set(zipfile.ZipFile(wheel).namelist())
    tuned = {f"linattn/tuned/{p.name}" for p in (ROOT / "linattn" / "tuned").glob("*.json")}
    assert tuned and tuned <= names, sorted(tuned - names)
    assert "linattn/presets.toml" in names and "linattn/apps/cli.py" in names
