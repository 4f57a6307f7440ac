"""GPU tests of the CuTe DSL prefill (H200; run through the device tool, see benchmarks/prefill_cutedsl.py).

Each test runs one check of :mod:`linattn.kernels.cutedsl.selfcheck` (the same checks the committed
benchmark JSON records): the state kernel's address mappings (bitwise), the state stage against its
float64 reference and pool mode equal to dense mode bitwise, the whole prefill against the float64
token-serial reference with pool mode equal to dense mode bitwise and every other pool row
unchanged, field cases F02, F19, F20, F23.

Status on the H200 (benchmarks/results/prefill_cutedsl_h200.json): the state-stage checks pass;
three whole-prefill checks fail on GDN outputs (pool vs dense output not bitwise, o_rel 0.021 and
0.027 against the 0.02 limit) while the states pass; ``--impl triton`` runs the same checks on the
Triton prefill to tell whether that comes from the shared Triton intra/output stages.

The last test runs the conformance suite (``linattn check --backend cutedsl --device cuda``) on
this GPU: every accuracy and pool case must run (none skipped as "not available") and pass.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (SM90 / SM100)", allow_module_level=True)
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
major, _ = torch.cuda.get_device_capability()
if major not in (9, 10):
    pytest.skip(f"the cutedsl kernels support SM90 and SM100 only (this GPU is sm_{major}x)", allow_module_level=True)

from linattn.kernels.cutedsl.selfcheck import CHECKS  # noqa: E402


@pytest.mark.parametrize("name", list(CHECKS))
def test_cutedsl_selfcheck(name):
    res = CHECKS[name]()
    bad = [c for c in res.get("cases", [res]) if not c.get("ok", res.get("ok"))]
    assert res["ok"], f"{name}: {bad or res}"


def test_conformance_suite_runs_every_case_and_passes_on_this_gpu():
    from linattn.testing import run_suite

    rep = run_suite("cutedsl", device="cuda")
    assert rep.available, f"cutedsl is not available on this GPU: {rep.availability}"
    runs = [r for r in rep.results if r.kind in ("accuracy", "pool")]
    assert runs and all(r.status != "skipped" for r in runs), [(r.id, r.message) for r in runs if r.status == "skipped"]
    assert rep.status == "passed", "\n".join(f"{r.id}: {r.message}" for r in rep.failures())
