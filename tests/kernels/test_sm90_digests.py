"""Every shipped Triton build's sm_90 code equals the digest recorded in tools/sm90_digests.json.

``tools/sm90_digests.py`` builds each launch of the representative call classes for
``cuda:90`` on the CPU, disassembles it with Triton's bundled cuobjdump, normalises the code and
hashes it. A host-side change must leave every digest as it is; a change that moves one is either
a defect or a kernel change measured on the H200, after which the digests are recorded again
(``--write``). Takes minutes on a cold Triton cache (about 300 builds), seconds on a warm one.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import subprocess_jobs

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "sm90_digests.py"


def _cuobjdump_missing() -> bool:
    import triton.backends.nvidia as nv

    return not (Path(nv.__file__).parent / "bin" / "cuobjdump").exists()


def _recorded() -> dict:
    return json.loads((ROOT / "tools" / "sm90_digests.json").read_text())


# the tool's subprocess, started ahead of the test on another core (tests/subprocess_jobs.py) where the
# test will run it: the recorded Triton version and the bundled cuobjdump present
_RUNS = not _cuobjdump_missing() and _recorded()["triton"] == triton.__version__
if _RUNS:
    subprocess_jobs.register("sm90-digests", [sys.executable, str(TOOL)],
                             env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, cwd=str(ROOT),
                             timeout=1800)


@pytest.mark.skipif(_cuobjdump_missing(), reason="Triton's bundled cuobjdump (triton/backends/nvidia/bin) is missing")
@pytest.mark.subprocess_job("sm90-digests")
def test_every_shipped_build_keeps_its_recorded_sm90_code():
    recorded = _recorded()
    if recorded["triton"] != triton.__version__:
        pytest.skip(f"digests recorded with triton {recorded['triton']}, this is {triton.__version__}")
    proc = subprocess_jobs.result("sm90-digests")
    assert proc.returncode == 0, f"sm_90 code changed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
