"""Every shipped Triton build's sm_90 code equals the digest recorded in tools/sm90_digests.json.

``tools/sm90_digests.py`` builds each launch of the representative call classes for
``cuda:90`` on the CPU, disassembles it with Triton's bundled cuobjdump, normalises the code and
hashes it. A host-side change must leave every digest as it is; a change that moves one is either
a defect or a kernel change measured on the H200, after which the digests are recorded again
(``--write``). Takes minutes on a cold Triton cache, seconds on a warm one.

``make test`` checks the builds of :data:`SELECT` (decode, the SwiGLU clamp and the bf16 prefill at
K = V = 128, the served models' head dims: 225 of the 728 recorded builds) to keep CI's run under 15
minutes; the bf16 prefill at other head dims (75: the same launchers with other tile constants) and the
fp16 and fp32 prefill builds (428: the same launchers and host code with another element type) are
checked when ``LINATTN_DIGESTS=all`` (``make test-full``, or ``.venv-triton-device/bin/python
tools/sm90_digests.py``).
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
#: the call classes checked by make test (every class with LINATTN_DIGESTS=all)
SELECT = r"^(decode|silu_clamp) |^prefill \S+ bf16 K128 V128 "
_ARGS = [] if os.environ.get("LINATTN_DIGESTS") == "all" else ["--select", SELECT]
if _RUNS:
    subprocess_jobs.register("sm90-digests", [sys.executable, str(TOOL), *_ARGS],
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


def test_the_selected_classes_are_the_served_dtypes_and_every_decode_and_clamp_build():
    import re

    names = {k.split(" :: ")[0] for k in _recorded()["builds"]}
    chosen = {n for n in names if re.search(SELECT, n)}
    assert {n.split()[0] for n in chosen} == {"decode", "silu_clamp", "prefill"}
    assert all(n.split()[2] == "bf16" for n in chosen if n.startswith("prefill"))
    assert {n for n in names if not n.startswith("prefill")} <= chosen
    assert {n for n in names if n.startswith("prefill") and n.split()[2:5] == ["bf16", "K128", "V128"]} <= chosen
    assert not any(n.split()[3:5] != ["K128", "V128"] for n in chosen if n.startswith("prefill"))
