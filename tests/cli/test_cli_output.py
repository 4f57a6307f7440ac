"""The CLI for people and pipes: whole cells when piped, one verdict structure, refused options, help text.

typer's CliRunner captures stdout in a buffer, which is not a terminal: exactly the piped case.
"""

import json
import re

import pytest
import typer
from typer.core import TyperOption
from typer.testing import CliRunner

import linattn
import linattn.apps.cli as cli
from linattn.dispatch import OPS, Problem
from linattn.dispatch.plugin.verdict import DecisionPolicy
from linattn.apps.report import REPORT_DECODE_BATCH, REPORT_PREFILL_SEQS, REPORT_PREFILL_TOKENS, UsageError

runner = CliRunner()
PIPED = {"COLUMNS": None}  # piped without COLUMNS: tables keep every cell whole


@pytest.fixture
def registry(nvidia_only_registry):
    return nvidia_only_registry


def table_rows(text: str, title: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the body lines (split into cells) of the rich table titled ``title``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    header, body, section = [], [], None
    for line in lines[start + 1:]:
        if line.startswith("┡"):
            section = "body"
        elif line.startswith("┃"):
            header.append([c.strip() for c in line.strip("┃").split("┃")])
        elif line.startswith("│") and section == "body":
            body.append([c.strip() for c in line.strip("│").split("│")])
        elif line.startswith("└"):
            break
    assert len(header) == 1, f"the header of {title!r} takes {len(header)} lines (a name was folded)"
    return header[0], body


def invoke(*args, env=PIPED):
    res = runner.invoke(cli.app, list(args), env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


# -- piped output keeps every cell whole ------------------------------------------------------------

def test_piped_backends_prints_each_backend_on_one_line_with_its_name_whole(registry):
    res = invoke("backends")
    assert res.exit_code == 0, res.output
    header, body = table_rows(res.stdout, "Backends")
    assert header[:2] == ["name", "plugin"]
    assert sorted(row[0] for row in body) == sorted(registry.backends)  # one line per backend: nothing folded
    torch_ref = next(row for row in body if row[0] == "torch-ref")
    assert set(torch_ref[4].split(", ")) == set(OPS)  # the ops cell, whole


def test_piped_explain_prints_each_verdict_on_one_line(registry):
    res = invoke("explain", "gdn_decode", "--profile", "sm90")
    assert res.exit_code == 0, res.output
    _, body = table_rows(res.stdout, "Decision trace")
    d = linattn.explain(cli.problem_for("gdn_decode", "qwen3-next"), "sm90")
    assert sorted(row[0].removeprefix("-> ") for row in body) == sorted(v.backend for v in d.verdicts)
    for row in body:  # one line per verdict: the whole message and hint in their cells
        v = d.verdict(row[0].removeprefix("-> "))
        assert row[3] == v.message and row[4] == getattr(v, "hint", "")


def test_piped_report_keeps_every_backend_name_whole_in_header_and_cells(registry):
    res = invoke("report", "--profile", "cpu")
    assert res.exit_code == 0, res.output
    header, body = table_rows(res.stdout, "Verdict per op")
    assert header == ["op", "problem", *sorted(registry.backends)]
    assert [row[0] for row in body] == list(OPS)  # one line per op
    for row in body:  # the CPU's defaults: torch-chunked for prefill and decode, torch-ref for the rest
        chosen = "torch-chunked" if row[0].endswith(("_prefill", "_decode")) else "torch-ref"
        assert row[2 + sorted(registry.backends).index(chosen)].startswith("* rank")
    for title in ("Sweep: backend chosen per batch (decode)", "Sweep: backend chosen per tokens (prefill)"):
        _, sweep = table_rows(res.stdout, title)
        assert sweep and all(
            cell in ("torch-chunked" if row[1].endswith(("_prefill", "_decode")) else "torch-ref", "-")
            for row in sweep for cell in row[2:])


def test_a_terminal_gets_its_own_width_and_a_pipe_gets_whole_cells_or_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.stdout_console().width == cli.PIPE_WIDTH  # under pytest stdout is captured: not a terminal
    monkeypatch.setenv("COLUMNS", "72")
    assert cli.stdout_console().width == 72  # piped with COLUMNS: its width
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.stdout_console().width == 80


@pytest.mark.parametrize("args", [("backends",), ("plugins",), ("report", "--profile", "cpu"),
                                  ("explain", "gdn_decode", "--profile", "sm90")])
def test_piped_output_honours_columns(registry, args):
    res = invoke(*args, env={"COLUMNS": "60"})
    assert res.exit_code == 0, res.output
    widest = max(len(line) for line in res.stdout.splitlines())
    assert widest <= 60, f"a line of {widest} columns with COLUMNS=60"
    assert max(len(line) for line in invoke(*args).stdout.splitlines()) > 60  # without COLUMNS: whole cells


# -- report --json and explain --json: one verdict structure --------------------------------------------

def _explain_args(op: str) -> list[str]:
    """``linattn explain`` options that ask about report's representative problem of ``op``."""
    if op.endswith("_decode"):
        return ["--batch", str(REPORT_DECODE_BATCH)]
    if op.endswith("_prefill"):  # packed tokens in all, lengths unknown
        return ["--total-tokens", str(REPORT_PREFILL_TOKENS), "--seqs", str(REPORT_PREFILL_SEQS)]
    return ["--tokens", str(REPORT_PREFILL_TOKENS)]


def test_report_json_holds_for_each_op_the_document_explain_json_prints(registry):
    report = json.loads(invoke("report", "--profile", "cpu", "--json").stdout)
    for op in OPS:
        res = invoke("explain", op, "--profile", "cpu", *_explain_args(op), "--json")
        assert res.exit_code == 0, res.output
        explained = json.loads(res.stdout)
        assert report["ops"][op] == explained, op
        assert isinstance(explained["verdicts"], list) and set(explained["policy"]) == {"force", "disable", "source"}


def test_decision_problem_and_policy_are_typed_models():
    d = linattn.explain("gdn_decode", "cpu", model="qwen3-next", n=8)
    assert isinstance(d.problem, Problem) and d.problem.n == 8 and d.problem.hv == 32
    assert isinstance(d.policy, DecisionPolicy) and d.policy.force == {} and d.policy.source == "default"
    with linattn.policy(decode="torch-ref"):
        forced = linattn.explain("gdn_decode", "cpu", model="qwen3-next", n=8)
    assert forced.policy.force == {"decode": "torch-ref"} and forced.forced == "torch-ref"
    dumped = d.model_dump(mode="json")
    assert dumped["problem"]["hv"] == 32 and dumped["policy"] == {"force": {}, "disable": [], "source": "default"}


# -- options that do not apply to the op are refused ---------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (("explain", "gdn_decode", "--mode", "dense"), "--mode dense does not apply to gdn_decode"),
    (("explain", "kda_decode", "--mode", "pool"), "--mode pool does not apply to kda_decode"),
    (("explain", "gdn_gating", "--layout", "kv"), "--layout kv does not apply"),
    (("explain", "silu_and_mul_clamp", "--state-dtype", "bfloat16"), "--state-dtype bfloat16 does not apply"),
    (("explain", "kda_gating", "--mode", "dense"), "--mode dense does not apply"),
])
def test_an_option_that_does_not_apply_to_the_op_exits_2_and_says_where_it_applies(registry, args, needle):
    res = invoke(*args, "--json")
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "UsageError" and err["exit_code"] == 2
    assert needle in err["message"] and "prefill" in err["message"]
    text = invoke(*args)
    assert text.exit_code == 2 and "does not apply" in text.output


def test_the_options_that_apply_are_kept(registry):
    doc = json.loads(invoke("explain", "gdn_prefill", "--mode", "dense", "--layout", "kv", "--json").stdout)
    assert (doc["problem"]["mode"], doc["problem"]["state_layout"]) == ("dense", "kv")
    doc = json.loads(invoke("explain", "gdn_decode", "--state-dtype", "bfloat16", "--json").stdout)
    assert (doc["problem"]["mode"], doc["problem"]["state_dtype"]) == ("pool", "bfloat16")


# -- help text --------------------------------------------------------------------------------------

def _commands():
    group = typer.main.get_command(cli.app)
    return [(name, cmd) for name, cmd in group.commands.items()]


@pytest.mark.parametrize("name", [name for name, _ in _commands()])
def test_help_shows_every_bracket_of_the_option_help_and_no_type_for_flags(name):
    cmd = dict(_commands())[name]
    res = invoke(name, "--help", env={"COLUMNS": "1000"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())
    assert "<bool>" not in out  # flags take no value
    for p in cmd.params:
        if isinstance(p, TyperOption) and p.help and not p.hidden:
            shown = " ".join(p.help.replace("\\[", "[").split())
            assert shown in out, (name, p.name)
    assert "<bool>" not in " ".join(invoke("--help", env={"COLUMNS": "1000"}).stdout.split())


def test_the_conformance_help_names_the_xfail_table_whole():
    out = " ".join(invoke("check", "--help", env={"COLUMNS": "1000"}).stdout.split())
    assert "[[xfail]] tables of case = 'ID-PATTERN'" in out and "([] case" not in out
    layout = " ".join(invoke("explain", "--help", env={"COLUMNS": "1000"}).stdout.split())
    assert "vk ([P, HV, V, K], default) or kv ([P, HV, K, V])" in layout


# -- linattn.explain(model=...) --------------------------------------------------------------------------

def test_python_explain_takes_model_like_the_cli(registry):
    d = linattn.explain("gdn_decode", "sm90", model="qwen3-next", n=4096)
    doc = json.loads(invoke("explain", "gdn_decode", "--model", "qwen3-next", "--batch", "4096", "--profile", "sm90",
                            "--json").stdout)
    assert d.model_dump(mode="json") == {k: v for k, v in doc.items() if k not in ("model", "brief")}
    clamp = linattn.explain("silu_and_mul_clamp", "cpu", model="deepseek-v4", n=16)
    assert clamp.problem.d == 18432 and clamp.problem.clamp_limit is True
    override = linattn.explain("kda_prefill", "cpu", model="kimi-linear", n=2, t=64, v=64)
    assert (override.problem.h, override.problem.k, override.problem.v) == (32, 128, 64)


@pytest.mark.parametrize("args, kw, pattern", [
    (("gdn_decode", "cpu"), dict(model="qwen3-next", nn=4), r"unknown field 'nn'; Problem fields: n, t, h, hv"),
    (("gdn_decode", "cpu"), dict(model="qwen3-next", dtype="fp8"), r"dtype='fp8': .*'bfloat16'"),
    (("gdn_decode", "cpu"), dict(model="kimi-linear"), r"'kda' model; gdn_decode needs a 'gdn' model"),
    (("gdn_decode", "cpu"), dict(model="no-such-model"), r"known: .*qwen3-next"),
    (("no_such_op", "cpu"), dict(n=1), r"op='no_such_op': .*'gdn_decode'"),
    (("gdn_decode", "cpu"), dict(n=4), r"needs k >= 1, got k=0"),
])
def test_python_explain_errors_name_the_field_and_what_is_allowed(args, kw, pattern):
    with pytest.raises(ValueError, match=pattern) as e:
        linattn.explain(*args, **kw)
    assert isinstance(e.value, UsageError) and "validation error" not in str(e.value)  # not pydantic's raw text
    assert not re.search(r"https?://errors\.pydantic", str(e.value))


@pytest.mark.parametrize("kw", [{}, dict(n=4), dict(model="qwen3-next")])
def test_python_explain_names_a_bad_profile_before_the_shape(kw):
    with pytest.raises(ValueError, match=r"'sm9000' is neither a device profile \(cpu, .*sm90"):
        linattn.explain("gdn_decode", "sm9000", **kw)  # was: 'gdn_decode needs k >= 1' without a shape


def test_python_explain_refuses_a_problem_with_model_or_shape_keywords():
    p = cli.problem_for("gdn_decode", "qwen3-next")
    with pytest.raises(ValueError, match="got a Problem and also model, n"):
        linattn.explain(p, "cpu", model="qwen3-next", n=4)
