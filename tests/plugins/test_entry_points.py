"""Plugins found through the ``linattn.backends`` entry-point group: discovery, API versions,
import failures, allow/deny lists, and plugins whose registration goes wrong."""

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
import torch

import linattn
import linattn.testing
from linattn.dispatch import Problem, Reason, explain, get_registry, reset_registry

from plugin_fakes import backend_module, make_distribution

CLAMP = Problem(op="silu_and_mul_clamp", n=4, d=8, dtype="float32", mode="none")
LONG_PREFILL = Problem(op="gdn_prefill", n=1, t=8192, h=16, hv=32, k=128, v=128)  # Qwen3-Next shapes


def _record(name):
    return next(p for p in get_registry().plugins if p.name == name)


def _example_installed() -> bool:
    return any(ep.name == "cpu-chunked" for ep in metadata.entry_points(group="linattn.backends"))


needs_example = pytest.mark.skipif(
    not _example_installed(),
    reason="the example plugin is not installed: pip install -e examples/linattn-cpu-chunked (CI does)")


@needs_example
def test_example_plugin_is_discovered_through_its_real_entry_point(registry):
    rec = _record("cpu-chunked")
    assert rec.status == "loaded" and rec.api_version == "2"
    assert rec.distribution == "linattn-cpu-chunked" and rec.backends == ("cpu-chunked",)
    b = linattn.list_backends()["cpu-chunked"]
    assert (b.plugin, b.distribution) == ("cpu-chunked", "linattn-cpu-chunked")
    # ranked ahead of torch-ref for long sequences on the CPU (behind the built-in torch-chunked), behind
    # torch-ref for short ones
    long = explain(LONG_PREFILL, "cpu")
    assert long.chosen == "torch-chunked" and long.runners_up[:2] == ["cpu-chunked", "torch-ref"]
    short = explain(Problem(op="gdn_prefill", n=64, t=1024, h=16, hv=32, k=128, v=128), "cpu")
    assert short.verdict("cpu-chunked").rank > short.verdict("torch-ref").rank
    # never on a GPU, never for decode; each with its reason
    assert explain(LONG_PREFILL, "sm90").verdict("cpu-chunked").reason == Reason.DEVICE
    assert explain(Problem(op="gdn_decode", n=4, h=16, hv=32, k=128, v=128), "cpu").verdict(
        "cpu-chunked").reason == Reason.OP


@needs_example
def test_example_plugin_runs_a_long_prefill_chosen_by_the_dispatcher(registry):
    T, H, HV, K, V = 130, 1, 2, 16, 16
    q, k, v = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, HV, V)
    g, beta = -torch.rand(T, HV) * 0.2, torch.rand(T, HV)
    with linattn.policy(disable="torch-chunked"):  # the built-in chunked prefill ranks first on the CPU
        o, ht = linattn.gdn_prefill(q, k, v, g, beta, torch.tensor([0, T]))
    assert linattn.last_decision("gdn_prefill").chosen == "cpu-chunked"
    from linattn.backends.torch_ref import gdn_prefill_ref

    ro, rht = gdn_prefill_ref(q, k, v, g, beta, torch.tensor([0, T]), compute_dtype=torch.float64)
    assert float((o.double() - ro).norm() / ro.norm()) < 1e-5
    assert float((ht.double() - rht).norm() / rht.norm()) < 1e-5


def test_plugin_for_another_api_version_is_rejected_with_reason_api_version(site):
    make_distribution(site, "vendor-future", {"future": "future_plugin"},
                      {"future_plugin": backend_module("future-backend", api="3")})
    reset_registry()
    rec = _record("future")
    assert rec.status == "api_version" and rec.distribution == "vendor-future" and rec.api_version == "3"
    assert "future-backend" not in get_registry().backends
    d = explain(CLAMP, "cpu")
    v = d.verdict("plugin:future")
    assert v.reason == Reason.API_VERSION and "'3'" in v.message and "['1', '2']" in v.message
    assert d.chosen == "torch-ref"


def test_plugin_without_an_api_version_is_rejected_too(site):
    src = backend_module("unversioned-backend").replace("LINATTN_API_VERSION = '1'", "")
    make_distribution(site, "vendor-unversioned", {"unversioned": "unversioned_plugin"}, {"unversioned_plugin": src})
    reset_registry()
    assert _record("unversioned").status == "api_version"
    assert "unversioned-backend" not in get_registry().backends


def test_plugin_that_fails_to_import_is_reported_and_skipped(site):
    make_distribution(site, "vendor-broken", {"broken": "broken_plugin", "gone": "no_such_module_xyz"},
                      {"broken_plugin": 'raise RuntimeError("vendor SDK libfoo.so not found")\n'})
    reset_registry()
    rec = _record("broken")
    assert rec.status == "plugin_load_failed" and "vendor SDK libfoo.so not found" in rec.error
    assert _record("gone").status == "plugin_load_failed" and "no_such_module_xyz" in _record("gone").error
    d = explain(CLAMP, "cpu")
    assert d.verdict("plugin:broken").reason == Reason.PLUGIN_LOAD_FAILED
    assert d.chosen == "torch-ref"
    out = linattn.silu_and_mul_clamp(torch.randn(2, 8), 10.0)  # dispatch still works
    assert out.shape == (2, 4)


def test_import_linattn_never_fails_because_of_a_plugin(site):
    make_distribution(site, "vendor-broken", {"broken": "broken_plugin"},
                      {"broken_plugin": 'raise ImportError("cannot load the vendor runtime")\n'})
    code = ("import json, linattn\n"
            "print(json.dumps({'chosen': linattn.explain('silu_and_mul_clamp', 'cpu', n=2, d=4).chosen,\n"
            " 'plugins': {p.name: p.status for p in linattn.list_plugins()}}))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    env.pop("LINATTN_PLUGINS", None)
    env.pop("LINATTN_DISABLE_PLUGINS", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["chosen"] == "torch-ref" and doc["plugins"]["broken"] == "plugin_load_failed"


def test_registration_that_goes_wrong_is_a_load_failure_not_a_crash(site):
    ctor = backend_module("ctor-raises", body="""
        def __init__(self):
            raise OSError("no device")
        """)
    not_a_backend = backend_module("x", returns="return [object]")
    hook_raises = backend_module("y", returns="raise KeyError('registry exploded')")
    make_distribution(site, "vendor-odd", {"ctor": "ctor_plugin", "notabackend": "nab_plugin", "hookraises": "hr_plugin"},
                      {"ctor_plugin": ctor, "nab_plugin": not_a_backend, "hr_plugin": hook_raises})
    reset_registry()
    assert _record("ctor").status == "plugin_load_failed" and "no device" in _record("ctor").error
    assert _record("notabackend").status == "plugin_load_failed" and "not a subclass" in _record("notabackend").error
    assert _record("hookraises").status == "plugin_load_failed" and "registry exploded" in _record("hookraises").error
    assert {"ctor-raises", "x", "y"}.isdisjoint(get_registry().backends)
    assert explain(CLAMP, "cpu").chosen == "torch-ref"


def test_backend_name_taken_by_a_builtin_leaves_the_builtin_untouched(site):
    src = backend_module("torch-ref")
    make_distribution(site, "vendor-dup", {"dup": "dup_plugin"}, {"dup_plugin": src})
    reset_registry()
    rec = _record("dup")
    assert rec.status == "plugin_load_failed" and "already registered" in rec.error
    ref = get_registry().backends["torch-ref"]
    assert type(ref).__name__ == "TorchRefBackend" and ref.plugin == "linattn-builtin"


@pytest.mark.parametrize("by", ["entry point", "distribution"])
def test_linattn_plugins_is_an_allow_list(site, monkeypatch, by):
    make_distribution(site, "vendor-a", {"good-a": "good_a"}, {"good_a": backend_module("backend-a")})
    make_distribution(site, "vendor-b", {"good-b": "good_b"}, {"good_b": backend_module("backend-b")})
    monkeypatch.setenv("LINATTN_PLUGINS", "good-a" if by == "entry point" else "vendor-a")
    reset_registry()
    assert _record("good-a").status == "loaded"
    rec = _record("good-b")
    assert rec.status == "not_allowed" and "LINATTN_PLUGINS" in rec.error
    assert "backend-a" in get_registry().backends and "backend-b" not in get_registry().backends
    assert "torch-ref" in get_registry().backends  # built-ins are not plugins to allow


def test_linattn_disable_plugins_is_a_deny_list(site, monkeypatch):
    make_distribution(site, "vendor-a", {"good-a": "good_a"}, {"good_a": backend_module("backend-a")})
    make_distribution(site, "vendor-b", {"good-b": "good_b"}, {"good_b": backend_module("backend-b")})
    monkeypatch.setenv("LINATTN_DISABLE_PLUGINS", " vendor-b , other")
    reset_registry()
    assert _record("good-a").status == "loaded"
    assert _record("good-b").status == "disabled"
    assert "backend-b" not in get_registry().backends
    # deny wins over allow
    monkeypatch.setenv("LINATTN_PLUGINS", "good-a,good-b")
    reset_registry()
    assert _record("good-b").status == "disabled" and _record("good-a").status == "loaded"
    # a disabled plugin is not a failure: it is not listed among the rejections
    assert not any(v.backend.startswith("plugin:") for v in explain(CLAMP, "cpu").verdicts)


@pytest.mark.parametrize("var, value, says", [
    ("LINATTN_DISABLE_PLUGINS", "backend-a", "disabled by LINATTN_DISABLE_PLUGINS; take it out of LINATTN_DISABLE_PLUGINS"),
    ("LINATTN_PLUGINS", "backend-b", "not named in LINATTN_PLUGINS (the allow-list); add it to LINATTN_PLUGINS"),
])
def test_forcing_the_backend_of_a_plugin_the_environment_skipped_names_the_variable(site, monkeypatch, var, value, says):
    make_distribution(site, "vendor-a", {"backend-a": "plugin_a"}, {"plugin_a": backend_module("backend-a")})
    make_distribution(site, "vendor-b", {"backend-b": "plugin_b"}, {"plugin_b": backend_module("backend-b")})
    monkeypatch.setenv(var, value)
    reset_registry()
    assert "backend-a" not in get_registry().backends
    with pytest.raises(ValueError, match=r"backend 'backend-a' for silu_and_mul_clamp, which is not registered: its "
                                         r"plugin 'backend-a' \(distribution 'vendor-a'\) is " + re.escape(says)):
        explain(CLAMP, "cpu", backend="backend-a")
    with pytest.raises(ValueError, match=re.escape(says)):  # the conformance suite (linattn check --backend)
        linattn.testing.run_suite("backend-a")
    # a name that is no plugin's: the skipped plugins are listed, as what may hold it
    with pytest.raises(ValueError, match=r"'no-such-backend'.*not registered: plugins not loaded: backend-a \(") as e:
        explain(CLAMP, "cpu", backend="no-such-backend")
    assert "its plugin" not in str(e.value)


def test_a_name_in_linattn_plugins_that_no_installed_plugin_has_warns_once_naming_the_installed_ones(
        site, monkeypatch, caplog):
    make_distribution(site, "vendor-a", {"good-a": "good_a"}, {"good_a": backend_module("backend-a")})
    monkeypatch.setenv("LINATTN_PLUGINS", "good-a,good-aa-typo")
    monkeypatch.setenv("LINATTN_DISABLE_PLUGINS", "vendor-zz-typo")
    with caplog.at_level("WARNING", logger="linattn"):
        reset_registry()
        get_registry()
        reset_registry()  # read again: no second warning for the same names
    lines = [r.getMessage() for r in caplog.records if "no installed plugin" in r.getMessage()]
    assert len(lines) == 2, lines
    allow = next(line for line in lines if line.startswith("linattn: LINATTN_PLUGINS names "))
    deny = next(line for line in lines if line.startswith("linattn: LINATTN_DISABLE_PLUGINS names "))
    assert "'good-aa-typo'" in allow and "'good-a'," not in allow and "a misspelt one is not loaded" in allow
    assert "installed plugins:" in allow and "good-a (vendor-a)" in allow
    assert "'vendor-zz-typo'" in deny and "leaves the plugin it meant loaded" in deny
    assert _record("good-a").status == "loaded"  # what it does name still loads
    # a name that is installed (entry point or distribution), or the built-in plugin's, is no typo
    caplog.clear()
    monkeypatch.setenv("LINATTN_PLUGINS", "vendor-a,linattn-builtin")
    monkeypatch.setenv("LINATTN_DISABLE_PLUGINS", "good-a")
    with caplog.at_level("WARNING", logger="linattn"):
        reset_registry()
    assert get_registry().unknown_names == {} and not [r for r in caplog.records if "no installed plugin" in r.getMessage()]


def test_the_command_line_says_a_plugin_is_disabled_where_its_backend_is_missing(site, monkeypatch):
    from typer.testing import CliRunner

    import linattn.apps.cli as cli

    make_distribution(site, "vendor-a", {"backend-a": "plugin_a"}, {"plugin_a": backend_module("backend-a")})
    monkeypatch.setenv("LINATTN_DISABLE_PLUGINS", "vendor-a")
    reset_registry()
    note = "plugin backend-a (vendor-a) not loaded: disabled by LINATTN_DISABLE_PLUGINS"
    runner = CliRunner(env={"COLUMNS": "1000"})
    listed = runner.invoke(cli.app, ["backends"])
    assert listed.exit_code == 0 and note in listed.stdout
    assert [r["name"] for r in json.loads(runner.invoke(cli.app, ["backends", "--json"]).stdout)] == sorted(
        get_registry().backends)  # the JSON document stays the rows (`linattn plugins --json` has the records)
    res = runner.invoke(cli.app, ["explain", "silu_and_mul_clamp", "--profile", "cpu", "--backend", "backend-a", "--json"])
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 and "disabled by LINATTN_DISABLE_PLUGINS" in err["message"], err
    explained = runner.invoke(cli.app, ["explain", "silu_and_mul_clamp", "--profile", "cpu"])
    assert explained.exit_code == 0 and note in explained.stdout
    monkeypatch.delenv("LINATTN_DISABLE_PLUGINS")
    reset_registry()
    assert note not in runner.invoke(cli.app, ["backends"]).stdout
