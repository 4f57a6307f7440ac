"""Field case F46 (issue 26): a malformed or shadowing ``LINATTN_PRESETS`` file.

A syntax error, an unknown field or a missing file gave raw tracebacks from every command; a user
preset named like a shipped one silently replaced it; one bad preset broke ``linattn report``.
The rule (linattn/presets.py, docs/ops-decisions.md): each problem is one line naming the file
and what is wrong; a shipped name is never replaced (refused); a bad preset is left out and the
rest kept; ``presets()`` refuses a file with problems, ``preset(name)`` only a missing name;
the CLI exits 2 with that line (no traceback) and ``report`` lists the problem and reports the rest.
"""

import json

import pytest
from typer.testing import CliRunner

from linattn.apps import cli
from linattn.presets import PresetFileError, preset, preset_table, presets

GOOD = '[mine]\ntitle="m"\nfamily="gdn"\nH=2\nHV=4\nK=64\nV=64\nsource="x"\n'
BAD_FILES = {
    "syntax": ('[broken\nfamily=', "not valid TOML: .*line 1"),
    "typo": ('[typo]\ntitle="t"\nfamily="gdn"\nH=1\nHV=1\nK=64\nV=64\nHv=2\nsource="x"\n', "unknown field 'Hv'"),
    "missing_field": ('[nosrc]\ntitle="t"\nfamily="gdn"\nH=1\nHV=1\nK=64\nV=64\n', "missing field 'source'"),
    "shadow": ('[qwen3-next]\ntitle="shadow"\nfamily="kda"\nH=1\nHV=1\nK=1\nV=1\nsource="x"\n',
               "'qwen3-next' is already a shipped preset"),
    "negative": ('[neg]\ntitle="n"\nfamily="gdn"\nH=-4\nHV=8\nK=128\nV=128\nsource="x"\n', "needs H, HV, K, V > 0 .*H=-4"),
    "negative_unused": ('[negd]\ntitle="n"\nfamily="gdn"\nH=4\nHV=8\nK=128\nV=128\nD=-1\nsource="x"\n',
                        "does not use D: leave it out or 0 \\(got D=-1\\)"),
    "gva": ('[odd]\ntitle="n"\nfamily="gdn"\nH=3\nHV=8\nK=128\nV=128\nsource="x"\n', "HV a multiple of H"),
    "not_a_table": ('answer = 42\n', "'answer' is not a \\[table\\]"),
}
runner = CliRunner()


def _file(tmp_path, monkeypatch, name, text):
    path = tmp_path / f"{name}.toml"
    if text is not None:
        path.write_text(text + GOOD if name != "syntax" else text)
    monkeypatch.setenv("LINATTN_PRESETS", str(path))
    return path


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_f46_each_problem_is_one_line_naming_the_file_and_the_rest_is_kept(tmp_path, monkeypatch, name):
    text, problem = BAD_FILES[name]
    path = _file(tmp_path, monkeypatch, name, text)
    table = preset_table()
    assert len(table.problems) == 1 and "\n" not in table.problems[0]
    assert table.problems[0].startswith(f"LINATTN_PRESETS={path}")
    with pytest.raises(PresetFileError, match=problem):
        presets()
    assert preset("qwen3-next").title == "Qwen3-Next-80B-A3B"  # shipped, never replaced
    assert ("mine" in table.presets) == (name != "syntax")  # the good preset beside a bad one is kept
    with pytest.raises(KeyError, match=f"unknown model preset 'absent'.*{path}"):  # names the file's problem
        preset("absent")


def test_f46_a_missing_file_or_a_folder_is_one_line(tmp_path, monkeypatch):
    _file(tmp_path, monkeypatch, "gone", None)
    with pytest.raises(PresetFileError, match=r"gone.toml: no such file"):
        presets()
    monkeypatch.setenv("LINATTN_PRESETS", str(tmp_path))
    with pytest.raises(PresetFileError, match="is a folder"):
        presets()
    monkeypatch.setenv("LINATTN_PRESETS", " ")  # blank: unset
    assert "mine" not in presets() and "qwen3-next" in presets()


@pytest.mark.parametrize("name", ["syntax", "typo", "shadow"])
def test_f46_the_cli_exits_2_with_the_line_not_a_traceback(tmp_path, monkeypatch, name):
    path = _file(tmp_path, monkeypatch, name, BAD_FILES[name][0])
    wanted = "typo" if name == "typo" else "absent"
    for args in (["explain", "gdn_decode", "--model", wanted], ["demo", "--model", wanted]):
        res = runner.invoke(cli.app, [*args, "--json"])
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
        doc = json.loads(res.stdout)
        msg = doc["error"]["message"]
        assert res.exit_code == 2 and str(path) in msg and "\n" not in msg, args


def test_f46_report_lists_the_bad_preset_and_reports_the_rest(tmp_path, monkeypatch):
    path = _file(tmp_path, monkeypatch, "negative", BAD_FILES["negative"][0])
    res = runner.invoke(cli.app, ["report", "--profile", "sm90", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["preset_problems"]) == 1 and str(path) in doc["preset_problems"][0]
    models = {r["model"] for r in doc["sweep"]}
    assert "mine" in models and "neg" not in models and "qwen3-next" in models
    text = runner.invoke(cli.app, ["report", "--profile", "sm90"])
    assert text.exit_code == 0 and "preset left out" in text.stdout and "'neg'" in text.stdout
