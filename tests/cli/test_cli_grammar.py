"""One grammar for every verb (issue 30, section 5): the op as OP or --op, one meaning of --batch
(= --seqs) and --tokens, --device / --profile, --version, one JSON error shape, help that reflows.
"""

import json

import pytest
import typer
from typer.testing import CliRunner

import linattn
import linattn.apps.cli as cli

runner = CliRunner()
PIPED = {"COLUMNS": None}


def run(*args, env=PIPED):
    res = runner.invoke(cli.app, list(args), env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # never a traceback
    return res


def problem(*args) -> dict:
    res = run("explain", *args, "--profile", "cpu", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["problem"]


def json_error(res, exit_code=2) -> dict:
    assert res.exit_code == exit_code, res.output
    doc = json.loads(res.stdout)
    assert set(doc) == {"error"} and {"type", "message", "exit_code"} <= set(doc["error"]), doc
    assert doc["error"]["exit_code"] == exit_code
    return doc["error"]


# -- the op: OP or --op ----------------------------------------------------------------------------

def test_explain_takes_the_op_as_positional_or_option_alike():
    assert problem("gdn_decode", "--batch", "8") == problem("--op", "gdn_decode", "--batch", "8")
    assert problem("kda_prefill") == problem("kda_prefill", "--op", "kda_prefill")  # both, the same: fine


@pytest.mark.parametrize("verb", ["explain", "bench", "check", "tune"])
def test_an_op_given_twice_differently_is_a_usage_error_in_every_verb(verb):
    err = json_error(run(verb, "gdn_decode", "--op", "kda_decode", "--json"))
    assert "given twice" in err["message"] and "'gdn_decode'" in err["message"] and "'kda_decode'" in err["message"]


@pytest.mark.parametrize("verb", ["explain", "bench"])
def test_a_verb_that_needs_an_op_says_both_spellings_when_it_is_missing(verb):
    err = json_error(run(verb, "--json"))
    assert "OP or --op OP" in err["message"] and "gdn_decode" in err["message"]
    text = run(verb)
    assert text.exit_code == 2 and "OP or --op OP" in text.output


def test_check_takes_its_op_as_a_positional_too():
    a = run("check", "silu_and_mul_clamp", "--backend", "torch-ref", "--json")
    b = run("check", "--op", "silu_and_mul_clamp", "--backend", "torch-ref", "--json")
    assert a.exit_code == b.exit_code == 0, a.output
    ops = lambda res: {r["op"] for r in json.loads(res.stdout)["backends"][0]["results"]}
    assert ops(a) == ops(b) == {"silu_and_mul_clamp"}


def test_tune_takes_an_op_and_measures_only_its_buckets(monkeypatch, tmp_path):
    import linattn.apps.tune as T

    seen = []
    monkeypatch.setattr(T, "run", lambda buckets, *a, **k: seen.extend(buckets) or [])
    res = run("tune", "kda_decode", "--device", "cpu", "--quick", "--out", str(tmp_path / "t.json"), "--json")
    assert res.exit_code == 0, res.output
    assert seen and {b.op for b in seen} == {"kda_decode"}
    assert json.loads(res.stdout)["command"].startswith("linattn tune kda_decode ")
    err = json_error(run("tune", "--op", "gdn_gating", "--device", "cpu", "--json"))
    assert "gdn_decode" in err["message"]  # the tuned ops


# -- sizes: --batch (= --seqs) sequences N, --tokens tokens per sequence L -------------------------------

def test_batch_and_seqs_are_one_option_the_sequences_of_the_call():
    assert problem("gdn_prefill", "--batch", "16", "--tokens", "256") == problem("gdn_prefill", "--seqs", "16",
                                                                                  "--tokens", "256")
    assert problem("gdn_decode", "--seqs", "32")["n"] == 32 == problem("gdn_decode", "--batch", "32")["n"]


def test_tokens_is_tokens_per_sequence_in_decode_and_prefill():
    p = problem("gdn_prefill", "--batch", "16", "--tokens", "4096")
    assert (p["n"], p["t"], p["max_seqlen"]) == (16, 65536, 4096)  # 16 sequences of 4,096: T = 65,536 packed
    d = problem("gdn_decode", "--batch", "16", "--tokens", "4")
    assert (d["n"], d["t"]) == (16, 4)  # 4 tokens per row (speculative verify)


def test_gating_and_clamp_rows_are_sequences_times_tokens():
    assert problem("gdn_gating", "--batch", "4", "--tokens", "100")["n"] == 400
    assert problem("silu_and_mul_clamp", "--tokens", "100")["n"] == 100 == problem("silu_and_mul_clamp",
                                                                                    "--batch", "100")["n"]


def test_total_tokens_keeps_uneven_packing_and_refuses_tokens_with_it():
    p = problem("gdn_prefill", "--seqs", "7", "--total-tokens", "5000")
    assert (p["n"], p["t"], p["max_seqlen"]) == (7, 5000, 0)
    err = json_error(run("explain", "gdn_prefill", "--total-tokens", "5000", "--tokens", "10", "--json"))
    assert "give one of them" in err["message"]
    assert "not for gdn_decode" in json_error(run("explain", "gdn_decode", "--total-tokens", "5", "--json"))["message"]


def test_bench_takes_seqs_as_batch(monkeypatch):
    import linattn.apps.bench as B

    got = {}

    def seen(op, **kw):  # stop before measuring: the sizes are what this test is about
        got.update(kw)
        raise B.BenchUsageError("sizes seen")

    monkeypatch.setattr(B, "run_bench", seen)
    res = run("bench", "gdn_prefill", "--seqs", "2", "--seqs", "3", "--tokens", "5", "--device", "cpu")
    assert res.exit_code == 2 and "sizes seen" in res.output
    assert got["batch"] == [2, 3] and got["tokens"] == [5]


def test_tune_takes_batch_and_tokens_with_the_meaning_they_have_in_every_verb(monkeypatch, tmp_path):
    import linattn.apps.tune as T
    from linattn.dispatch import Problem
    from linattn.dispatch.plugin.tuning import bucket_of

    seen = []
    monkeypatch.setattr(T, "run", lambda buckets, *a, **k: seen.extend(buckets) or [])

    def buckets(*args):
        seen.clear()
        res = run("tune", *args, "--device", "cpu", "--out", str(tmp_path / "t.json"), "--json")
        assert res.exit_code == 0, res.output
        return list(seen)

    same = buckets("--buckets", "gdn_prefill:16x256")
    assert buckets("gdn_prefill", "--batch", "16", "--tokens", "256") == same
    assert buckets("--op", "gdn_prefill", "--seqs", "16", "--tokens", "256") == same
    by_op = {b.op: b for b in buckets("--batch", "8")}  # every tuned op, at the problem explain builds
    assert set(by_op) == {"gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill"}
    for op, b in by_op.items():
        assert b == bucket_of(Problem.model_validate(problem(op, "--batch", "8"))), op
    err = json_error(run("tune", "--batch", "2", "--buckets", "gdn_decode:1", "--device", "cpu", "--json"))
    assert "--buckets and --batch/--tokens both choose the buckets" in err["message"]


def _int_options():
    """``(verb, option, click parameter)`` for every int-valued option of every verb."""
    import inspect

    group = typer.main.get_command(cli.app)
    for verb, cmd in group.commands.items():
        ann = {n: str(p.annotation) for n, p in inspect.signature(cmd.callback).parameters.items()}
        for p in cmd.params:
            if "int" in ann.get(p.name, "") and p.opts[0].startswith("--"):
                yield verb, p.opts[0], p


#: int options where 0 means "none" (no warm-up calls, no float64 checks) or that are not counts (a seed)
ZERO_MEANS_NONE = {"--warmup", "--check-every"}
NOT_COUNTS = {"--seed"}


def test_every_count_option_refuses_zero_unless_zero_means_none():
    checked = set()
    for verb, opt, p in _int_options():
        if opt in NOT_COUNTS:
            continue
        checked.add((verb, opt))
        assert p.min == (0 if opt in ZERO_MEANS_NONE else 1), (verb, opt, p.min)
    assert {("explain", "--batch"), ("explain", "--tokens"), ("explain", "--total-tokens"), ("tune", "--batch"),
            ("tune", "--repeats"), ("bench", "--repeats"), ("bench", "--warmup"), ("demo", "--steps")} <= checked


@pytest.mark.parametrize("args", [
    ("explain", "gdn_decode", "--batch", "0"),
    ("explain", "gdn_prefill", "--tokens", "0"),
    ("explain", "gdn_prefill", "--total-tokens", "0"),
    ("bench", "gdn_decode", "--batch", "4", "--batch", "0"),
    ("tune", "--batch", "0"),
    ("demo", "--requests", "0"),
    ("demo", "--context-parallel", "2", "--tokens", "0"),
])
def test_a_zero_count_is_a_usage_error_that_names_the_option(args):
    err = json_error(run(*args, "--json"))
    assert f"'{args[-2]}'" in err["message"] and "greater than or equal to 1" in err["message"], err


@pytest.mark.parametrize("value", ["-1", "-0.5"])
def test_tune_refuses_a_negative_max_seconds_at_parse_time(value, monkeypatch):
    """A duration below zero is a usage error naming the option, as a count below its minimum is;
    nothing is measured (the parser stops first)."""
    from linattn.apps import tune

    monkeypatch.setattr(tune, "run", lambda *a, **k: pytest.fail("measured despite a bad --max-seconds"))
    err = json_error(run("tune", "gdn_decode", "--device", "cpu", "--max-seconds", value, "--json"))
    assert "'--max-seconds'" in err["message"] and "greater than or equal to 0" in err["message"], err
    assert "[x>=0" in run("tune", "--help", env={"COLUMNS": "1000"}).stdout


@pytest.mark.parametrize("verb", ["explain", "demo", "bench", "tune"])
def test_help_shows_a_readable_range_for_counts(verb):
    out = run(verb, "--help", env={"COLUMNS": "1000"}).stdout
    assert "2147483647" not in out and "<int range>" not in out
    assert "[x>=1]" in out


# -- dtypes: the help lists what the ops take, and explain takes exactly those ---------------------------

def test_explain_dtypes_are_the_ops_dtypes_and_the_help_lists_them():
    from linattn.dispatch.rules.validate import FLOAT_DTYPES, STATE_DTYPES

    out = " ".join(run("explain", "--help", env={"COLUMNS": "1000"}).stdout.split())
    assert f"q/k/v dtype: {', '.join(FLOAT_DTYPES.values())}" in out and "float64" in out
    assert f"pool dtype, {', '.join(STATE_DTYPES.values())}" in out
    for name in FLOAT_DTYPES.values():
        assert problem("gdn_decode", "--dtype", name)["dtype"] == name
    for name in STATE_DTYPES.values():
        assert problem("gdn_prefill", "--state-dtype", name)["state_dtype"] == name
    d = json.loads(run("explain", "gdn_decode", "--dtype", "float64", "--profile", "sm90", "--json").stdout)
    assert d["chosen"] in ("torch-ref", "torch-chunked")  # the oracle mode runs on the PyTorch backends
    err = json_error(run("explain", "gdn_decode", "--state-dtype", "float16", "--profile", "cpu", "--json"))
    assert "--state-dtype float16" in err["message"] and "float32, bfloat16, float64" in err["message"]
    assert "--dtype int8" in json_error(run("explain", "gdn_decode", "--dtype", "int8", "--json"))["message"]


# -- --device and --profile ------------------------------------------------------------------------------

@pytest.mark.parametrize("verb", [("bench", "gdn_decode"), ("tune",), ("check",), ("demo",)])
def test_a_verb_that_runs_kernels_refuses_profile_and_says_what_to_use(verb):
    err = json_error(run(*verb, "--profile", "sm90", "--json"))
    assert "--device" in err["message"] and "linattn explain OP --profile sm90" in err["message"]


def test_explain_and_report_probe_a_device_or_plan_for_a_profile_not_both():
    assert run("explain", "gdn_decode", "--device", "cpu", "--json").exit_code == 0
    assert json.loads(run("report", "--device", "cpu", "--json").stdout)["probed"] is True
    for verb in (("explain", "gdn_decode"), ("report",)):
        assert "give one" in json_error(run(*verb, "--device", "cpu", "--profile", "sm90", "--json"))["message"]
    assert "--profile sm90" in json_error(run("explain", "gdn_decode", "--device", "sm90", "--json"))["message"]


@pytest.mark.parametrize("verb", ["report", "explain", "backends", "plugins", "demo", "check", "bench", "tune"])
def test_every_verb_help_explains_device_profile_and_the_sizes(verb):
    out = " ".join(run(verb, "--help", env={"COLUMNS": "1000"}).stdout.split())
    assert "--device is a torch device" in out and "--profile is a device explain and report plan for" in out
    assert "--batch N (or --seqs N) is the sequences of a call" in out and "--tokens L is tokens per sequence" in out


# -- --version, the JSON error shape, help that reflows ------------------------------------------------------

def test_version_prints_the_package_version():
    res = run("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"linattn {linattn.__version__}"


@pytest.mark.parametrize("args", [("--version", "--json"), ("--json", "--version")])
def test_version_with_json_prints_one_json_document(args):
    res = run(*args)
    assert res.exit_code == 0 and json.loads(res.stdout) == {"name": "linattn", "version": linattn.__version__}


def test_the_groups_own_json_flag_follows_the_json_error_conventions():
    err = json_error(run("--json"))  # no --version, no command
    assert err["type"] == "UsageError" and "--version" in err["message"]
    err = json_error(run("--json", "backends"))  # a command's --json goes after it
    assert "linattn backends ... --json" in err["message"]
    err = json_error(run("--no-such-option", "--json"))
    assert err["type"] == "NoSuchOption"
    res = run("--no-such-option")
    assert res.exit_code == 2 and "No such option" in res.output and not res.stdout.lstrip().startswith("{")


@pytest.mark.parametrize("args, kind", [
    (("explain", "gdn_decode", "--batch", "x"), "BadParameter"),       # typer's own parse error
    (("explain", "gdn_decode", "--no-such-option"), "NoSuchOption"),
    (("explain", "no_such_op"), "UsageError"),                          # linattn's usage error
    (("bench", "gdn_decode", "--device", "tpu"), "BenchUsageError"),
    (("check", "--op", "no_such_op"), "ValueError"),
    (("tune", "--dtype", "fp8"), "UsageError"),
    (("tune", "--op", "gdn_decode", "--shape", "16,30,128,128", "--batch", "1", "--tokens", "1"), "UsageError"),
    (("demo", "--model", "no-such-model"), "DemoConfigError"),
])
def test_every_verb_prints_the_one_json_error_shape_with_exit_2(args, kind):
    err = json_error(run(*args, "--json"))
    assert err["type"] == kind and err["message"]


def test_help_paragraphs_reflow_to_the_width():
    narrow = run("explain", "--help", env={"COLUMNS": "60"}).stdout
    wide = run("explain", "--help", env={"COLUMNS": "1000"}).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 60
    line = next(ln for ln in wide.splitlines() if "Nothing runs:" in ln)
    assert "never silently ignored" in line  # the docstring's 5-line paragraph is one line at 1000 columns


def test_demo_batch_is_the_decode_batch_and_tokens_is_the_context_parallel_prompt(monkeypatch):
    import linattn.apps.demo as D

    got = {}

    def seen(**kw):  # stop before serving: the options are what this test is about
        got.update(kw)
        raise D.DemoConfigError("options seen")

    monkeypatch.setattr(D, "run_demo", seen)
    res = run("demo", "--batch", "4", "--device", "cpu")
    assert res.exit_code == 2 and "options seen" in res.output and got["decode_batch"] == 4
    err = json_error(run("demo", "--tokens", "64", "--json"))
    assert "--context-parallel" in err["message"]
