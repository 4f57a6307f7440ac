"""Usage errors of every command: one ``error:`` line and exit 2, never a traceback.

A malformed ``LINATTN_*`` variable (``ConfigError``), an unusable file path and an absurd size are
the user's to fix; a genuine internal error still propagates (it is not a usage error).
"""

import pytest
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.dispatch import ConfigError, dispatcher

runner = CliRunner()
BENCH = ("bench", "gdn_decode", "--device", "cpu", "--batch", "1", "--repeats", "1", "--shape", "1,1,16,16")


def assert_one_error_line(res, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def unloaded_registry(monkeypatch):
    """The process-wide registry not loaded yet, so the command reads LINATTN_PLUGINS itself."""
    monkeypatch.setattr(dispatcher(), "_registry", None)


@pytest.mark.parametrize("args", [("demo", "--device", "cpu"), ("report",), BENCH])
def test_malformed_linattn_backend_is_a_usage_error_in_every_command(args, monkeypatch):
    monkeypatch.setenv("LINATTN_BACKEND", "decode=")
    assert_one_error_line(runner.invoke(cli.app, list(args)), "LINATTN_BACKEND='decode='", "names no backend")


@pytest.mark.parametrize("var", ["LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS"])
@pytest.mark.parametrize("args", [("backends",), ("plugins",), ("report",), ("demo", "--device", "cpu"), BENCH])
def test_malformed_plugin_lists_are_a_usage_error_in_every_command(args, var, monkeypatch, unloaded_registry):
    monkeypatch.setenv(var, ",")
    assert_one_error_line(runner.invoke(cli.app, list(args)), f"{var}=','", "is empty")


def test_malformed_variable_with_json_prints_the_error_document(monkeypatch, unloaded_registry):
    monkeypatch.setenv("LINATTN_PLUGINS", "a,,b")
    res = runner.invoke(cli.app, ["backends", "--json"])
    assert res.exit_code == 2
    assert '"type": "ConfigError"' in res.stdout and "LINATTN_PLUGINS" in res.stdout


def test_config_error_is_still_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_an_internal_value_error_is_not_turned_into_a_usage_error(monkeypatch):
    def broken():
        raise ValueError("a bug inside linattn")

    monkeypatch.setattr(cli, "backend_rows", broken)
    res = runner.invoke(cli.app, ["backends"])
    assert res.exit_code == 1 and isinstance(res.exception, ValueError)


# -- file paths ------------------------------------------------------------------------------------

def test_check_with_a_directory_as_xfail_file_exits_2(tmp_path):
    assert_one_error_line(runner.invoke(cli.app, ["check", "--op", "gdn_gating", "--xfail", str(tmp_path)]),
                          f"--xfail {tmp_path}: is a directory")


def test_check_with_a_missing_xfail_file_names_the_option_and_the_file(tmp_path):
    missing = tmp_path / "nonexistent.toml"
    assert_one_error_line(runner.invoke(cli.app, ["check", "--op", "gdn_gating", "--xfail", str(missing)]),
                          f"error: --xfail {missing}: does not exist")


def test_check_with_a_non_utf8_xfail_file_names_the_file(tmp_path):
    bad = tmp_path / "gaps.toml"
    bad.write_bytes(b'[[xfail]]\ncase = "\xff"\nreason = "x"\n')
    assert_one_error_line(runner.invoke(cli.app, ["check", "--op", "gdn_gating", "--xfail", str(bad)]),
                          f"--xfail {bad}: not UTF-8")


def test_a_bad_xfail_entry_is_one_line_naming_file_entry_and_field(tmp_path):
    bad = tmp_path / "gaps.toml"
    bad.write_text('[[xfail]]\ncase = "a"\nreason = "r"\n\n[[xfail]]\ncase = "b"\nreson = "typo"\n')
    res = runner.invoke(cli.app, ["check", "--op", "gdn_gating", "--xfail", str(bad)])
    assert_one_error_line(res, f"--xfail {bad}: entry 2", "field 'reason': Field required",
                          "field 'reson': Extra inputs are not permitted")


@pytest.fixture
def no_measuring(monkeypatch):
    from linattn.apps import bench as B

    monkeypatch.setattr(B, "run_bench", lambda *a, **k: pytest.fail("measured before checking the output paths"))


@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_bench_refuses_a_directory_as_output_before_measuring(option, tmp_path, no_measuring):
    assert_one_error_line(runner.invoke(cli.app, [*BENCH, option, str(tmp_path)]),
                          f"{option} {tmp_path} is a directory")


def test_bench_refuses_an_unwritable_output_before_measuring(tmp_path, no_measuring):
    (tmp_path / "file").write_text("")
    assert_one_error_line(runner.invoke(cli.app, [*BENCH, "--out", str(tmp_path / "file" / "x.json")]),
                          "is a file, not a folder")
    assert_one_error_line(runner.invoke(cli.app, [*BENCH, "--out", "/proc/linattn-x.json"]), "cannot be written")


@pytest.mark.parametrize("option,name", [("--out", "o.json"), ("--plot", "p.png")])
def test_bench_refuses_a_folder_that_cannot_be_created_before_measuring(option, name, no_measuring):
    # root passes os.access on /proc, yet nothing can be made there: the check probes for real
    path = f"/proc/linattn-missing/{name}"
    assert_one_error_line(runner.invoke(cli.app, [*BENCH, option, path]), f"{option} {path}", "cannot be created")


def test_bench_from_refuses_an_uncreatable_plot_folder_before_reading(tmp_path):
    path = "/proc/linattn-missing/p.png"
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(tmp_path / "r.json"), "--plot", path])
    assert_one_error_line(res, f"--plot {path}", "cannot be created")


def test_bench_accepts_an_output_under_a_creatable_folder_and_leaves_no_probe(tmp_path):
    from linattn.apps import bench as B

    B.check_writable(tmp_path / "new" / "deeper" / "o.json", "--out")
    assert list(tmp_path.iterdir()) == []


def test_bench_output_checks_leave_no_file_and_create_no_folder(tmp_path, no_measuring):
    out = tmp_path / "o.json"
    res = runner.invoke(cli.app, [*BENCH, "--out", str(out), "--plot", str(tmp_path)])
    assert res.exit_code == 2 and not out.exists()
    res = runner.invoke(cli.app, [*BENCH, "--out", str(tmp_path / "new" / "o.json"), "--plot", str(tmp_path)])
    assert res.exit_code == 2 and not (tmp_path / "new").exists()


# -- sizes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("explain", "gdn_decode", "--batch", "99999999999999999999"),
    ("explain", "gdn_prefill", "--tokens", str(2**31)),
    ("explain", "gdn_prefill", "--seqs", str(2**31)),
    ("demo", "--requests", str(2**31)),
    ("demo", "--decode-batch", str(2**31)),
    ("bench", "gdn_decode", "--batch", "1", "--batch", str(2**31)),
    ("bench", "gdn_decode", "--repeats", str(2**31)),
])
def test_size_options_beyond_int32_are_refused_with_exit_2(args, no_measuring):
    res = runner.invoke(cli.app, list(args))
    assert res.exit_code == 2 and "Invalid value" in res.output and "2147483647" in res.output, res.output


def test_the_largest_size_is_accepted():
    res = runner.invoke(cli.app, ["explain", "gdn_decode", "--batch", str(cli.SIZE_MAX), "--profile", "cpu"])
    assert res.exit_code == 0, res.output


# -- LINATTN_AUTOTUNE in explain -------------------------------------------------------------------

@pytest.mark.parametrize("args", [("explain", "gdn_prefill"), ("explain", "gdn_prefill", "--profile", "sm90"),
                                  ("explain", "kda_decode", "--profile", "cpu")])
def test_explain_refuses_a_malformed_autotune_switch_as_a_call_does(args, monkeypatch):
    import torch

    import linattn

    monkeypatch.setenv("LINATTN_AUTOTUNE", "bogus")
    dispatcher().tuning.reload()
    with pytest.raises(ConfigError) as call:
        linattn.gdn_prefill(*(torch.randn(8, 1, 16),) * 3, torch.zeros(8, 1), torch.ones(8, 1),
                            torch.tensor([0, 8], dtype=torch.int32))
    dispatcher().tuning.reload()
    assert_one_error_line(runner.invoke(cli.app, list(args)), f"error: {call.value}")
