"""The main job end to end at tiny sizes: serving, slot reuse, decisions, and checks that can fail."""

import json

import pytest
import torch
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.backends.torch_ref import TorchRefBackend
from linattn.apps.demo import (TOL_OUTPUT_BF16, TOL_STATE_BF16, DemoConfigError, DemoReport, SlotAllocator,
                          render_demo, run_demo)
from linattn.dispatch import reset_registry
from linattn.dispatch.plugin.hookspecs import hookimpl
from linattn.dispatch.runtime.registry import Registry

runner = CliRunner()
TINY = dict(requests=3, decode_batch=4, steps=2, shape=(1, 2, 16, 16), prompt_len=(2, 9), output_len=(1, 2),
            device="cpu", check_every=1)
TINY_ARGS = ["--requests", "3", "--decode-batch", "4", "--steps", "2", "--shape", "1,2,16,16",
             "--prompt-len", "2,9", "--output-len", "1,2", "--check-every", "1", "--device", "cpu"]


@pytest.fixture
def builtin_registry():
    reg = reset_registry(Registry().load(entry_points=False))
    yield reg
    reset_registry()


@pytest.mark.parametrize("model, fam", [("qwen3-next", "gdn"), ("kimi-linear", "kda")])
def test_tiny_demo_serves_every_request_and_passes_against_float64(builtin_registry, model, fam):
    rep = run_demo(model, **{**TINY, "steps": 4})
    assert rep.passed
    assert rep.requests.finished == 3 and rep.requests.waiting_at_end == 0
    assert rep.prefill.tokens >= 3 * 2 and rep.decode.tokens >= 3
    assert {d.op for d in rep.decisions} == {f"{fam}_gating", f"{fam}_prefill", f"{fam}_decode"}
    assert all(d.chosen == (["torch-chunked"] if d.op.endswith("_decode") else ["torch-ref"]) for d in rep.decisions)
    errs = {e.op: e for e in rep.errors}
    assert set(errs) == {f"{fam}_gating", f"{fam}_prefill", f"{fam}_decode"}
    for op in (f"{fam}_prefill", f"{fam}_decode"):
        e = errs[op]
        assert e.checked_calls >= 1 and e.passed
        assert 0 < e.output_error <= TOL_OUTPUT_BF16  # bf16 outputs vs a float64 oracle: never exactly 0
        assert e.state_error <= TOL_STATE_BF16
    assert rep.padding_zero.ok and rep.padding_zero.checks == rep.decode.calls
    assert rep.idle_rows_unchanged.ok and rep.idle_rows_unchanged.checks == rep.decode.calls + rep.prefill.calls


def test_demo_reuses_freed_slots_when_requests_outnumber_the_pool(builtin_registry):
    rep = run_demo(requests=6, decode_batch=2, steps=12, shape=(1, 2, 8, 8), prompt_len=(1, 4), output_len=(1, 2),
                   device="cpu", check_every=3, pool_slots=3)
    assert rep.pool["slots"] == 3 < rep.requests.total
    assert rep.requests.finished == 6 and rep.requests.slot_reuses >= 3
    assert rep.decode.padded_rows > 0
    assert rep.passed


def test_demo_is_deterministic_for_a_seed(builtin_registry):
    a = run_demo(**TINY, seed=7)
    b = run_demo(**TINY, seed=7)
    assert a.prefill.tokens == b.prefill.tokens and a.errors == b.errors


def test_demo_cli_json_has_the_report_keys_and_errors_within_tolerance(builtin_registry):
    res = runner.invoke(cli.app, ["demo", *TINY_ARGS, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(DemoReport.model_fields) <= set(doc)
    for key in ("calls", "tokens", "seconds", "tokens_per_s"):
        assert key in doc["prefill"] and key in doc["decode"]
    assert doc["shape"] == {"H": 1, "HV": 2, "K": 16, "V": 16} and doc["passed"] is True
    for e in doc["errors"]:
        assert e["output_error"] <= e["output_tol"]
        assert e["state_error"] is None or e["state_error"] <= e["state_tol"]
    for d in doc["decisions"]:
        assert d["chosen"] and d["summaries"]


def test_demo_cli_table_says_pass(builtin_registry):
    res = runner.invoke(cli.app, ["demo", *TINY_ARGS, "--model", "kimi-linear"], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    for needle in ("kda_decode", "torch-ref", "padding rows", "PASS", "tokens/s"):
        assert needle in res.stdout


@pytest.mark.parametrize("args, needle", [
    (["--model", "deepseek-v4"], "linear-attention layer"),
    (["--model", "no-such"], "known:"),
    (["--shape", "1,2,3"], "H,HV,K,V"),
    (["--shape", "3,4,8,8"], "multiple of H"),
    (["--requests", "0"], "'--requests': Input should be greater than or equal to 1"),  # typer's min=1
])
def test_demo_bad_arguments_exit_2(builtin_registry, args, needle):
    res = runner.invoke(cli.app, ["demo", "--device", "cpu", *args, "--json"])
    assert res.exit_code == 2
    assert needle in json.loads(res.stdout)["error"]["message"]


def test_demo_rejects_a_non_linear_attention_model():
    with pytest.raises(DemoConfigError, match="gdn or kda preset"):
        run_demo("deepseek-v4", device="cpu")


def test_slot_allocator_hands_out_slot_0_first_and_reuses_freed_slots_fifo():
    a = SlotAllocator(3)
    assert [a.alloc(), a.alloc(), a.alloc(), a.alloc()] == [0, 1, 2, None]
    a.release(1)
    a.release(0)
    assert (a.alloc(), a.alloc()) == (1, 0) and a.reuses == 2 and a.allocations == 5
    a.release(2)
    with pytest.raises(ValueError, match="released twice"):
        a.release(2)


# -- the demo's checks catch a backend that is wrong -----------------------------------------------

class FaultyDecode(TorchRefBackend):
    """torch-ref with one injected fault in gdn_decode, ranked ahead of torch-ref on the CPU."""

    name = "test-faulty"
    fault = "none"
    ops = frozenset({"gdn_decode"})

    def rank(self, p, caps):
        return 0

    def gdn_decode(self, **kw):
        o = super().gdn_decode(**kw)
        idx, pool = kw["state_indices"].long(), kw["state_pool"]
        if self.fault == "output":
            o[idx >= 0] *= 1.1
        elif self.fault == "padding":
            o[idx < 0] = 1.0
        elif self.fault == "state":
            pool[idx[idx >= 0]] *= 1.05
        elif self.fault == "idle":
            free = sorted(set(range(pool.shape[0])) - set(idx.tolist()))
            pool[free[0]] += 1.0
        return o


class _Plugin:
    LINATTN_API_VERSION = "1"

    def __init__(self, cls):
        self.cls = cls

    @hookimpl
    def linattn_register_backends(self):
        return [self.cls]


@pytest.mark.parametrize("fault, flag", [("output", "errors"), ("padding", "padding_zero"),
                                         ("state", "errors"), ("idle", "idle_rows_unchanged")])
def test_demo_fails_when_the_chosen_backend_is_wrong(fault, flag):
    cls = type(f"Faulty_{fault}", (FaultyDecode,), {"fault": fault})
    reg = Registry().load(entry_points=False)
    reg.add_plugin(_Plugin(cls), name="test-faulty-plugin")
    reset_registry(reg)
    try:
        rep = run_demo(**TINY)
        res = runner.invoke(cli.app, ["demo", *TINY_ARGS, "--json"])
    finally:
        reset_registry()
    assert next(d for d in rep.decisions if d.op == "gdn_decode").chosen == ["test-faulty"]
    assert not rep.passed
    if flag == "errors":
        assert not next(e for e in rep.errors if e.op == "gdn_decode").passed
    else:
        assert not getattr(rep, flag).ok
    assert res.exit_code == 1 and json.loads(res.stdout)["passed"] is False


def test_render_demo_prints_fail_for_a_failed_report(builtin_registry):
    from rich.console import Console

    rep = run_demo(**TINY).model_copy(update={"passed": False})
    con = Console(record=True, width=160)
    render_demo(rep, con)
    assert "FAIL" in con.export_text()


@pytest.mark.gpu
def test_tiny_demo_on_the_gpu_uses_the_dispatcher_and_passes():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rep = run_demo(**{**TINY, "device": "cuda", "shape": (2, 4, 128, 128), "steps": 4})
    assert rep.passed and rep.device.startswith("cuda")
    assert {d.op for d in rep.decisions} == {"gdn_gating", "gdn_prefill", "gdn_decode"}



class NvidiaOnlyDecode(TorchRefBackend):
    name = "test-nvidia-only"
    ops = frozenset({"gdn_decode"})
    vendors = frozenset({"nvidia"})


def test_demo_with_a_forced_ineligible_backend_exits_1_with_the_trace(monkeypatch):
    reg = Registry().load(entry_points=False)
    reg.add_plugin(_Plugin(NvidiaOnlyDecode), name="test-nvidia-plugin")
    reset_registry(reg)
    monkeypatch.setenv("LINATTN_BACKEND", "decode=test-nvidia-only")
    try:
        res = runner.invoke(cli.app, ["demo", *TINY_ARGS, "--json"])
    finally:
        reset_registry()
    assert res.exit_code == 1
    err = json.loads(res.stdout)["error"]  # the one error shape, exit 1 (the run failed), the trace inside
    assert (err["type"], err["exit_code"]) == ("NoBackendError", 1)
    assert "test-nvidia-only" in err["message"] and "[device]" in err["message"]
    assert err["decision"]["forced"] == "test-nvidia-only" and err["decision"]["chosen"] is None


@pytest.mark.interpreter
def test_demo_with_decode_forced_to_triton_split_in_the_interpreter_passes(builtin_registry, monkeypatch):
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("needs the Triton interpreter on a CPU-only machine (tests/conftest.py sets it)")
    monkeypatch.setenv("LINATTN_BACKEND", "decode=triton-split")
    rep = run_demo(**TINY)
    assert next(d for d in rep.decisions if d.op == "gdn_decode").chosen == ["triton-split"]
    assert rep.passed


def test_demo_counts_calls_per_chosen_backend_and_never_lists_a_chosen_one_as_rejected():
    rep = run_demo(**TINY, seed=3)
    for d in rep.decisions:
        assert sum(d.chosen_calls.values()) == d.calls
        assert set(d.chosen_calls) == set(d.chosen)
        assert not set(d.chosen) & set(d.others)
