"""The README's quick start says what the Makefile does: ``make demo`` and ``make test`` share the
setup step, which installs the dev extras and the example plugin."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_says_make_demo_installs_what_the_shared_setup_installs():
    make = (ROOT / "Makefile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^demo: \$\(STAMP\)$", make, re.M) and re.search(r"^test: \$\(STAMP\)$", make, re.M)
    setup = make.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "-e examples/linattn-cpu-chunked" in setup and ".[dev," in setup
    intro = readme.split("(Both install", 1)[0]
    assert "make demo" in intro and "examples/linattn-cpu-chunked" in intro and "`dev," in intro
    assert "`make test` installs it" not in readme  # the plugin: both targets install it
