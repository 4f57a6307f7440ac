"""The ``linattn`` CLI: every command's --json parses, report/explain show whole traces, exit codes."""

import json
import sys

import pytest
import typer
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.dispatch import OPS, Problem, Reason
from linattn.dispatch.plugin.hookspecs import hookimpl

runner = CliRunner()
REASONS = {r.value for r in Reason}


class _BrokenPlugin:
    LINATTN_API_VERSION = "1"

    @hookimpl
    def linattn_register_backends(self):
        raise RuntimeError("this plugin cannot load")


@pytest.fixture
def registry(nvidia_only_registry):
    """The built-ins, the NVIDIA-only test backend and a plugin that fails to load; restored afterwards."""
    nvidia_only_registry.add_plugin(_BrokenPlugin(), name="test-broken", distribution="linattn-broken",
                                    version="0.0")
    return nvidia_only_registry


def invoke_json(*args):
    res = runner.invoke(cli.app, [*args, "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res, json.loads(res.stdout)


@pytest.mark.parametrize("args", [
    ("report",),
    ("report", "--profile", "sm90"),
    ("explain", "gdn_decode", "--model", "qwen3-next", "--batch", "4096", "--profile", "sm90"),
    ("explain", "kda_prefill", "--model", "kimi-linear", "--tokens", "1000", "--seqs", "3"),
    ("explain", "silu_and_mul_clamp", "--model", "deepseek-v4", "--batch", "16", "--profile", "mi300x"),
    ("backends",),
    ("plugins",),
])
def test_every_command_prints_one_parseable_json_document(registry, args):
    res, doc = invoke_json(*args)
    assert res.exit_code == 0, res.output
    assert isinstance(doc, (dict, list)) and doc


def test_report_lists_every_backend_with_a_verdict_per_op(registry):
    res, doc = invoke_json("report", "--profile", "cpu")
    assert res.exit_code == 0
    names = set(registry.backends)
    assert set(doc["backends"]) == names and "test-nvidia-only" in names
    assert set(doc["ops"]) == set(OPS)
    by_op = {op: {v["backend"]: v for v in row["verdicts"]} for op, row in doc["ops"].items()}
    for op, row in doc["ops"].items():
        assert names <= set(by_op[op]), op
        for v in row["verdicts"]:
            assert v["status"] in ("accepted", "rejected")
            if v["status"] == "rejected":
                assert v["reason"] in REASONS and v["message"]
        # the CPU's defaults: torch-chunked for prefill and decode, torch-ref for the rest
        assert row["chosen"] == ("torch-chunked" if op.endswith(("_prefill", "_decode")) else "torch-ref"), op
        assert by_op[op]["test-nvidia-only"]["status"] == "rejected"
    assert by_op["gdn_decode"]["test-nvidia-only"]["reason"] == "device"
    assert by_op["gdn_prefill"]["test-nvidia-only"]["reason"] == "op"
    # the presets' models pick the op family's preset
    assert doc["ops"]["gdn_decode"]["problem"]["hv"] == 32 and doc["ops"]["kda_decode"]["problem"]["h"] == 32
    assert doc["ops"]["silu_and_mul_clamp"]["problem"]["d"] == 18432


def test_report_sweeps_every_preset_over_decode_batches_and_prefill_tokens(registry):
    _, doc = invoke_json("report", "--profile", "cpu")
    decode = {(r["model"], r["batch"]) for r in doc["sweep"] if r["phase"] == "decode"}
    prefill = {(r["model"], r["op"], r["tokens"]) for r in doc["sweep"] if r["phase"] == "prefill"}
    for model in ("qwen3-next", "kimi-linear", "qwen3.5", "kimi-k3", "deepseek-v4"):
        for b in (1, 16, 256, 4096, 65536):
            assert (model, b) in decode
    for t in (256, 1024, 4096, 16384, 65536):
        assert ("qwen3-next", "gdn_prefill", t) in prefill and ("kimi-linear", "kda_gating", t) in prefill
    assert all(r["chosen"] == ("torch-chunked" if r["op"].endswith(("_prefill", "_decode")) else "torch-ref")
               for r in doc["sweep"])


def test_report_shows_plugin_load_failures(registry):
    _, doc = invoke_json("report", "--profile", "cpu")
    failed = {p["name"]: p for p in doc["plugin_failures"]}
    assert failed["test-broken"]["status"] == "plugin_load_failed"
    assert "this plugin cannot load" in failed["test-broken"]["error"]
    text = runner.invoke(cli.app, ["report", "--profile", "cpu"], env={"COLUMNS": "200"})
    assert text.exit_code == 0 and "Plugin load failures" in text.stdout and "test-broken" in text.stdout


@pytest.mark.parametrize("profile", ["sm90", "mi300x", "cpu"])
def test_explain_under_each_profile_exits_0_and_shows_the_chosen_backend(registry, profile):
    res, doc = invoke_json("explain", "gdn_decode", "--model", "qwen3-next", "--batch", "4096", "--profile", profile)
    assert res.exit_code == 0
    assert doc["chosen"] in registry.backends
    assert {v["backend"] for v in doc["verdicts"]} >= set(registry.backends)
    assert doc["profile"] == profile and doc["problem"]["n"] == 4096 and doc["problem"]["hv"] == 32
    text = runner.invoke(cli.app, ["explain", "gdn_decode", "--model", "qwen3-next", "--batch", "4096",
                                   "--profile", profile], env={"COLUMNS": "200"})
    assert text.exit_code == 0
    assert f"chosen: {doc['chosen']}" in text.stdout and "Decision trace" in text.stdout


def test_explain_with_a_forced_ineligible_backend_exits_1_and_names_the_reason(registry):
    args = ["explain", "gdn_decode", "--model", "qwen3-next", "--batch", "8", "--profile", "cpu",
            "--backend", "test-nvidia-only"]
    res, doc = invoke_json(*args)
    assert res.exit_code == 1
    assert doc["chosen"] is None and doc["forced"] == "test-nvidia-only"
    v = next(v for v in doc["verdicts"] if v["backend"] == "test-nvidia-only")
    assert v["status"] == "rejected" and v["reason"] == "device" and "nvidia" in v["message"]
    text = runner.invoke(cli.app, args, env={"COLUMNS": "200"})
    assert text.exit_code == 1
    assert "test-nvidia-only" in text.stdout and "[device]" in text.stdout and "not eligible" in text.stdout


def test_explain_with_a_forced_eligible_backend_exits_0(registry):
    res, doc = invoke_json("explain", "gdn_decode", "--profile", "sm90", "--backend", "test-nvidia-only")
    assert res.exit_code == 0 and doc["chosen"] == "test-nvidia-only" and doc["forced_by"] == "backend= argument"


def test_explain_lists_a_failed_plugin_in_the_trace(registry):
    _, doc = invoke_json("explain", "gdn_decode", "--profile", "cpu")
    v = next(v for v in doc["verdicts"] if v["backend"] == "plugin:test-broken")
    assert v["reason"] == "plugin_load_failed"


def test_explain_prefill_builds_the_problem_from_tokens_per_sequence_and_seqs(registry):
    _, doc = invoke_json("explain", "gdn_prefill", "--tokens", "500", "--seqs", "7", "--profile", "cpu",
                         "--layout", "kv", "--state-dtype", "bfloat16", "--dtype", "float16")
    p = doc["problem"]  # 7 sequences of 500 tokens: T = 3,500 packed, max_seqlen 500
    assert (p["t"], p["n"], p["max_seqlen"], p["h"], p["hv"], p["k"], p["v"]) == (3500, 7, 500, 16, 32, 128, 128)
    assert (p["state_layout"], p["state_dtype"], p["dtype"], p["mode"]) == ("kv", "bfloat16", "float16", "pool")
    _, one = invoke_json("explain", "kda_prefill", "--tokens", "300", "--profile", "cpu")
    assert (one["problem"]["n"], one["problem"]["max_seqlen"], one["model"]) == (1, 300, "kimi-linear")


@pytest.mark.parametrize("args, needle", [
    (("explain", "gdn_decode", "--model", "no-such-model"), "known:"),
    (("explain", "gdn_decode", "--model", "kimi-linear"), "'kda' model"),
    (("explain", "no_such_op"), "ops:"),
    (("explain", "gdn_decode", "--profile", "sm42"), "known profiles"),
    (("explain", "gdn_decode", "--backend", "no-such-backend"), "not registered"),
    (("report", "--profile", "sm42"), "known profiles"),
    (("explain", "gdn_prefill", "--mode", "sparse"), "mode"),
    (("explain", "gdn_decode", "--mode", "dense"), "does not apply"),
])
def test_bad_arguments_exit_2_with_a_message_naming_what_is_allowed(registry, args, needle):
    res, doc = invoke_json(*args)
    assert res.exit_code == 2
    assert needle in doc["error"]["message"] and doc["error"]["exit_code"] == 2


def test_backends_lists_where_each_backend_comes_from(registry):
    _, rows = invoke_json("backends")
    by = {r["name"]: r for r in rows}
    assert set(by) == set(registry.backends)
    for r in rows:
        assert {"name", "plugin", "distribution", "version", "ops", "vendors", "dtypes", "summary"} <= set(r)
    assert set(by["torch-ref"]["ops"]) == set(OPS) and by["torch-ref"]["plugin"] == "linattn-builtin"
    t = by["test-nvidia-only"]
    assert (t["plugin"], t["distribution"], t["version"], t["vendors"]) == ("test-plugin", "linattn-tests", "9.9",
                                                                             ["nvidia"])


def test_plugins_reports_status_and_error_of_each_plugin(registry):
    _, rows = invoke_json("plugins")
    by = {r["name"]: r for r in rows}
    assert by["linattn-builtin"]["status"] == "loaded" and "torch-ref" in by["linattn-builtin"]["backends"]
    assert by["test-plugin"]["backends"] == ["test-nvidia-only"]
    assert by["test-broken"]["status"] == "plugin_load_failed" and "cannot load" in by["test-broken"]["error"]


def test_text_output_of_every_command_renders(registry):
    for args in (["report"], ["backends"], ["plugins"], ["explain", "kda_decode", "--batch", "3"]):
        res = runner.invoke(cli.app, args, env={"COLUMNS": "160"})
        assert res.exit_code == 0, (args, res.output)
        assert res.stdout.strip() and not res.stdout.lstrip().startswith("{")


def test_optional_commands_register_only_when_their_module_exists(tmp_path, monkeypatch):
    (tmp_path / "linattn_test_present.py").write_text("def hello():\n    print('hello')\n")
    (tmp_path / "linattn_test_broken.py").write_text("import linattn_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = typer.Typer()

    @app.command()
    def other():
        pass

    assert cli.register_optional("linattn.no_such_module", "check", "check", into=app) is False
    assert cli.register_optional("linattn_no_such_package.cli", "check", "check", into=app) is False
    assert cli.register_optional("linattn_test_present", "hello", "hello", into=app) is True
    assert runner.invoke(app, ["hello"]).stdout.strip() == "hello"
    with pytest.raises(ImportError, match="linattn_no_such_dependency_xyz"):
        cli.register_optional("linattn_test_broken", "x", "x", into=app)
    sys.modules.pop("linattn_test_present", None)


def test_problem_for_matches_what_a_real_decode_call_would_ask():
    import torch

    from linattn.dispatch.rules.validate import validate

    N, H, HV, K, V = 3, 16, 32, 128, 128
    q = torch.zeros(N, 1, H, K, dtype=torch.bfloat16)
    args = dict(q=q, k=q, v=torch.zeros(N, 1, HV, V, dtype=torch.bfloat16), a=torch.zeros(N, 1, HV),
                b=torch.zeros(N, 1, HV), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV),
                state_pool=torch.zeros(4, HV, V, K), state_indices=torch.tensor([0, 1, -1]))
    _, sig = validate("gdn_decode", args)
    assert cli.problem_for("gdn_decode", "qwen3-next", batch=N) == Problem(**dict(sig))

