"""Selection by measurement on a CUDA GPU (dispatch/plugin/tuning.py, apps/tune.py): ``linattn tune``
times the GPU backends of a small bucket and the dispatcher follows the table; the table's key
carries the driver; a call captured into a real CUDA graph with ``LINATTN_AUTOTUNE=1`` measures
nothing (the measurement syncs) and replays.

Run on the H200: ``python3 -m pytest -q tests/gpu/test_tuning_gpu.py`` (seconds; part of ``tests/gpu``).
"""

import json

import pytest
import torch
from typer.testing import CliRunner

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import linattn  # noqa: E402
from linattn import tune as measuring  # noqa: E402
from linattn.apps import cli  # noqa: E402
from linattn.dispatch import Problem, clear_cache, explain  # noqa: E402
from linattn.dispatch.runtime import selection  # noqa: E402
from linattn.dispatch.plugin.tuning import TuneTable, current_key, table_path  # noqa: E402

CUDA = torch.device("cuda")


def test_tune_times_the_gpu_backends_and_selection_follows_the_table(tuned):
    res = CliRunner().invoke(cli.app, ["tune", "--device", "cuda", "--buckets", "gdn_decode:64,gdn_prefill:2x256",
                                       "--shape", "2,4,128,128", "--repeats", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    caps = selection.resolve_device(CUDA)
    table = TuneTable.model_validate_json(table_path(current_key(caps)).read_text())
    assert table.key.driver and table.key.device == torch.cuda.get_device_name()
    for e in doc["entries"]:
        assert {"torch-ref", "triton-split"} <= set(e["times_ms"]), e  # the reference and the native kernels
    for op, n, t in (("gdn_decode", 64, 1), ("gdn_prefill", 2, 512)):  # prefill 2x256: 2 sequences, 512 tokens
        d = explain(Problem(op=op, n=n, t=t, h=2, hv=4, k=128, v=128, max_seqlen=t if n == 1 and op.endswith("prefill") else 0), caps)
        assert d.tuning.measured and d.tuning.origin == "user"
        timed = {v.backend: v.measured_ms for v in d.verdicts if v.ok and v.measured_ms is not None}
        assert d.chosen == min(timed, key=timed.get)


def test_a_captured_call_measures_nothing_and_replays(tuned, monkeypatch):
    monkeypatch.setenv("LINATTN_AUTOTUNE", "1")
    clear_cache()  # read with the tables
    monkeypatch.setattr(measuring, "measure_bucket", lambda *a, **kw: pytest.fail("measured during capture"))
    args = measuring.inputs(Problem(op="gdn_decode", n=8, h=2, hv=4, k=128, v=128), CUDA)
    linattn.gdn_decode(**args, backend="torch-ref", validate=False)  # forced: warms up without autotuning
    pool = args["state_pool"].clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = linattn.gdn_decode(**args, validate=False)
    d = linattn.last_decision("gdn_decode")
    assert d.capturing and d.tuning is None
    args["state_pool"].copy_(pool)
    g.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and not table_path(current_key(selection.resolve_device(CUDA))).exists()
    owned = set(args["state_indices"].tolist())
    others = [r for r in range(pool.shape[0]) if r not in owned]
    assert torch.equal(args["state_pool"][others], pool[others])  # rows the call does not own
