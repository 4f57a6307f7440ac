"""``linattn bench``: one JSON document with a row per backend x shape, rejections as rows, usage errors exit 2.

Timings themselves are never asserted (no timed tests): only that they exist, are positive and
that the derived figures (GB/s, fraction of copy, tokens/s) follow from them and the byte counts.
"""

import json
import math
import sys

import pytest
import torch
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.apps import bench as B
from linattn.dispatch import explain

runner = CliRunner()
FAST = ("--repeats", "2", "--warmup", "1", "--copy-mib", "4")
TINY = ("--shape", "2,4,16,16")


@pytest.fixture
def registry(nvidia_only_registry):
    return nvidia_only_registry


def bench_json(*args):
    res = runner.invoke(cli.app, ["bench", *args, "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res, json.loads(res.stdout)


def accepted_on_cpu(op, model, **kw):
    d = explain(cli.problem_for(op, model, **kw), torch.device("cpu"))
    return {v.backend for v in d.verdicts if v.ok}, d.chosen


def assert_timed(row):
    assert row["status"] == "ok", row
    assert row["median_us"] > 0 and row["min_us"] > 0 and row["repeats"] >= 1
    assert row["min_us"] <= row["median_us"]
    assert row["timing"] == "perf_counter"


# -- decode ------------------------------------------------------------------------------------------

def test_decode_bench_json_has_a_timed_row_per_backend_and_shape_and_the_copy_bandwidth(registry):
    res, doc = bench_json("gdn_decode", "--batch", "1", "--batch", "4", *FAST)
    assert res.exit_code == 0, res.output
    assert doc["op"] == "gdn_decode" and doc["model"] == "qwen3-next" and doc["device"]["type"] == "cpu"
    assert doc["capabilities"]["vendor"] == "cpu"
    copy = doc["copy_bandwidth"]
    assert copy["GBps"] > 0 and copy["bytes"] == 4 << 20
    assert math.isclose(copy["GBps"], 2 * copy["bytes"] / (copy["median_us"] * 1e-6) / 1e9, rel_tol=1e-9)
    want = set()
    for n in (1, 4):
        names, chosen = accepted_on_cpu("gdn_decode", "qwen3-next", batch=n)
        assert names and chosen == doc["defaults"][f"N={n}"]
        want |= {(name, f"N={n}") for name in names}
    got = [(r["backend"], r["label"]) for r in doc["rows"]]
    assert sorted(got) == sorted(want)  # exactly one row per accepted backend and shape
    for r in doc["rows"]:
        assert_timed(r)
        assert r["shape"]["HV"] == 32 and r["shape"]["H"] == 16 and r["shape"]["P"] == 2 * r["shape"]["N"]
        assert math.isclose(r["GBps"], r["bytes"] / (r["median_us"] * 1e-6) / 1e9, rel_tol=1e-9)
        assert math.isclose(r["frac_of_copy"], r["GBps"] / copy["GBps"], rel_tol=1e-9)
        assert r["default"] == (r["backend"] == doc["defaults"][r["label"]])


def test_decode_bytes_count_state_read_and_write_plus_qkvo_gates_and_indices(registry):
    _, doc = bench_json("gdn_decode", "--batch", "4", "--backend", "torch-ref", *FAST)
    N, H, HV, K, V = 4, 16, 32, 128, 128
    state = 2 * N * HV * V * K * 4
    qkvo = N * (2 * H * K + 2 * HV * V) * 2
    gates = N * HV * 2 * 2
    assert doc["rows"][0]["bytes"] == state + qkvo + gates + 4 * N
    _, kda = bench_json("kda_decode", "--batch", "2", "--backend", "torch-ref", *TINY, *FAST)
    N, H, HV, K, V = 2, 2, 4, 16, 16
    assert kda["model"] == "kimi-linear"
    assert kda["rows"][0]["bytes"] == 2 * N * HV * V * K * 4 + N * (2 * H * K + 2 * HV * V) * 2 \
        + N * HV * (K + 1) * 2 + 4 * N


def test_decode_case_uses_distinct_slots_of_a_2n_pool_and_a_bench_row_leaves_other_rows_untouched(registry):
    case = B.decode_case("gdn_decode", 5, (2, 4, 16, 16), torch.device("cpu"))
    idx = case.args["state_indices"]
    pool = case.args["state_pool"]
    assert pool.shape == (10, 4, 16, 16) and pool.dtype == torch.float32 and idx.dtype == torch.int32
    assert len(set(idx.tolist())) == 5 and 0 <= int(idx.min()) and int(idx.max()) < 10
    assert case.args["q"].dtype == torch.bfloat16 and case.args["v"].dtype == torch.bfloat16
    before = pool.clone()
    timer = B.Timer(torch.device("cpu"))
    row = B.bench_row(case, "torch-ref", torch.device("cpu"), timer, repeats=2, warmup=1, copy_gbps=1.0)
    assert_timed(row)
    others = torch.ones(10, dtype=torch.bool)
    others[idx.long()] = False
    assert torch.equal(pool[others], before[others])  # rows not owned by the call: bitwise unchanged
    assert not torch.equal(pool[idx.long()], before[idx.long()])  # the owned rows were advanced


# -- prefill and clamp -------------------------------------------------------------------------------

@pytest.mark.parametrize("op,model", [("gdn_prefill", "qwen3-next"), ("kda_prefill", "kimi-linear")])
def test_prefill_bench_reports_tokens_per_second_per_backend_and_shape(registry, op, model):
    res, doc = bench_json(op, "--batch", "1", "--batch", "3", "--tokens", "5", *TINY, *FAST)
    assert res.exit_code == 0, res.output
    assert doc["model"] == model
    labels = {r["label"] for r in doc["rows"]}
    assert labels == {"1x5", "3x5"}
    for r in doc["rows"]:
        assert_timed(r)
        assert r["tokens"] == r["shape"]["N"] * r["shape"]["L"]
        assert math.isclose(r["tokens_per_s"], r["tokens"] / (r["median_us"] * 1e-6), rel_tol=1e-9)
        assert r["GBps"] is None
    assert doc["copy_bandwidth"]["GBps"] > 0
    names, _ = accepted_on_cpu(op, model, tokens=5, seqs=3)  # 3 sequences of 5 tokens (the CLI grammar)
    assert {r["backend"] for r in doc["rows"] if r["label"] == "3x5"} == names


def test_prefill_case_is_varlen_pool_mode_and_leaves_other_pool_rows_untouched(registry):
    case = B.prefill_case("kda_prefill", 3, 7, (2, 4, 16, 16), torch.device("cpu"))
    a = case.args
    assert a["cu_seqlens"].tolist() == [0, 7, 14, 21] and a["q"].shape == (21, 2, 16)
    assert a["g"].shape == (21, 4, 16) and a["g"].dtype == torch.float32 and bool((a["g"] <= 0).all())
    assert a["state_pool"].shape == (6, 4, 16, 16) and len(set(a["state_indices"].tolist())) == 3
    before = a["state_pool"].clone()
    row = B.bench_row(case, "torch-ref", torch.device("cpu"), B.Timer(torch.device("cpu")), 2, 1, 1.0)
    assert_timed(row)
    others = torch.ones(6, dtype=torch.bool)
    others[a["state_indices"].long()] = False
    assert torch.equal(a["state_pool"][others], before[others])


def test_clamp_bench_counts_x_read_and_out_written(registry):
    res, doc = bench_json("silu_and_mul_clamp", "--batch", "3", "--batch", "8", "--shape", "40", *FAST)
    assert res.exit_code == 0, res.output
    assert doc["model"] == "deepseek-v4"
    assert {r["label"] for r in doc["rows"]} == {"M=3", "M=8"}
    for r in doc["rows"]:
        assert_timed(r)
        assert r["bytes"] == 3 * r["shape"]["M"] * 40 * 2 and r["shape"]["D"] == 40
        assert r["GBps"] > 0 and r["frac_of_copy"] > 0


def test_prefill_shapes_pair_batch_and_tokens_or_fill_the_token_budget():
    cpu = torch.device("cpu")
    assert B._shapes("gdn_prefill", cpu, [2, 4], [8, 16]) == [(2, 8), (4, 16)]
    assert B._shapes("gdn_prefill", cpu, [2, 4], [8]) == [(2, 8), (4, 8)]
    assert B._shapes("gdn_prefill", cpu, [4], None) == [(4, B.PREFILL_TOKEN_BUDGET["cpu"] // 4)]
    assert B._shapes("gdn_prefill", cpu, None, None) == list(B.CPU_DEFAULTS["prefill"])
    assert B._shapes("gdn_decode", cpu, None, None) == [1, 8]
    assert B.CUDA_DEFAULTS["decode"] == (1, 32, 256, 1024, 4096, 8192)
    assert B.CUDA_DEFAULTS["prefill"] == ((16, 4096), (64, 1024), (256, 256))
    with pytest.raises(B.BenchUsageError, match="pair up"):
        B._shapes("gdn_prefill", cpu, [1, 2, 3], [4, 5])


# -- rejections are rows -----------------------------------------------------------------------------

def test_a_forced_backend_that_is_not_eligible_is_a_row_with_its_reason_not_a_crash(registry):
    res, doc = bench_json("gdn_decode", "--batch", "2", *TINY, *FAST, "--backend", "torch-ref",
                          "--backend", "test-nvidia-only", "--backend", "fla")
    assert res.exit_code == 0, res.output
    rows = {r["backend"]: r for r in doc["rows"]}
    assert set(rows) == {"torch-ref", "test-nvidia-only", "flash-linear-attention"}
    assert_timed(rows["torch-ref"])
    bad = rows["test-nvidia-only"]
    assert bad["status"] == "rejected" and bad["reason"] == "device" and "nvidia" in bad["message"]
    assert bad["median_us"] is None and bad["GBps"] is None
    fla = rows["flash-linear-attention"]
    assert fla["status"] == "rejected" and fla["reason"] == "device" and "CUDA" in fla["message"]


def test_a_backend_that_does_not_implement_the_op_is_rejected_with_reason_op(registry):
    _, doc = bench_json("silu_and_mul_clamp", "--batch", "2", "--shape", "8", *FAST,
                        "--backend", "test-nvidia-only", "--backend", "flash-linear-attention")
    reasons = {r["backend"]: r["reason"] for r in doc["rows"]}
    assert reasons == {"test-nvidia-only": "op", "flash-linear-attention": "op"}


def test_a_backend_that_raises_is_an_error_row(registry, monkeypatch):
    def boom(**kw):
        raise RuntimeError("kaput")

    case = B.clamp_case(2, 8, 10.0, torch.device("cpu"))
    monkeypatch.setattr(B, "linattn_runner", lambda case, name: lambda: boom())
    row = B.bench_row(case, "torch-ref", torch.device("cpu"), B.Timer(torch.device("cpu")), 2, 1, 1.0)
    assert row["status"] == "error" and "kaput" in row["message"] and row["median_us"] is None


# -- timing policy ------------------------------------------------------------------------------------

class _CountingTimer(B.Timer):
    def __init__(self, seconds):
        super().__init__(torch.device("cpu"))
        self.seconds, self.calls = seconds, 0

    def once(self, fn):
        self.calls += 1
        return self.seconds


@pytest.mark.parametrize("seconds,repeats,budget,warm,timed", [
    (0.001, 7, 5.0, 2, 7),  # fast: every warm-up call, every repeat
    (1.0, 10, 5.0, 2, 5),   # repeats cut to the budget
    (10.0, 10, 5.0, 1, 3),  # slow: one warm-up, at least 3 timed calls
])
def test_measure_warms_up_then_times_separate_calls_within_the_budget(seconds, repeats, budget, warm, timed):
    t = _CountingTimer(seconds)
    times = t.measure(lambda: None, repeats=repeats, warmup=2, budget_s=budget)
    assert len(times) == timed and t.calls == warm + timed


# -- usage errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (("gdn_gating",), "gdn_decode, kda_decode, gdn_prefill, kda_prefill, silu_and_mul_clamp"),
    (("no_such_op",), "silu_and_mul_clamp"),
    (("gdn_decode", "--model", "kimi-linear"), "qwen3-next"),
    (("gdn_decode", "--model", "nope"), "known"),
    (("gdn_decode", "--backend", "no-such-backend"), "registered"),
    (("gdn_decode", "--tokens", "4"), "prefill"),
    (("gdn_decode", "--shape", "1,2,3"), "H,HV,K,V"),
    (("gdn_decode", "--batch", "0"), "greater than or equal to 1"),  # typer's min=1
    (("gdn_decode", "--device", "tpu"), "cpu"),
])
def test_bad_arguments_exit_2_with_what_is_allowed(registry, args, needle):
    res, doc = bench_json(*args)
    assert res.exit_code == 2
    assert needle in doc["error"]["message"] and doc["error"]["exit_code"] == 2


def test_unknown_op_in_text_mode_exits_2_and_lists_the_ops(registry):
    res = runner.invoke(cli.app, ["bench", "nope"])
    assert res.exit_code == 2
    assert "gdn_decode" in res.output and "silu_and_mul_clamp" in res.output


def test_plot_without_matplotlib_exits_2_before_measuring(registry, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(B, "run_bench", lambda *a, **k: pytest.fail("measured before checking --plot"))
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--plot", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "matplotlib" in res.output


# -- outputs -----------------------------------------------------------------------------------------

def test_table_output_and_out_file(registry, tmp_path):
    out = tmp_path / "sub" / "bench.json"
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--batch", "2", *TINY, *FAST, "--out", str(out)],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "torch-ref" in res.stdout and "GB/s" in res.stdout and "copy" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["op"] == "gdn_decode" and doc["rows"] and doc["rows"][0]["label"] == "N=2"


def test_plot_writes_a_png_when_matplotlib_is_installed(registry, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--batch", "1", "--batch", "2", *TINY, *FAST,
                                  "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_is_registered_as_a_cli_command():
    names = {c.name or c.callback.__name__ for c in cli.app.registered_commands}
    assert "bench" in names
