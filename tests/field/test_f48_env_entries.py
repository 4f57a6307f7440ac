"""Field case F48 (issue 26): ``LINATTN_BACKEND="decode="`` forced nothing, silently.

The rule (dispatch/runtime/policy.py, docs/ops-decisions.md): every entry of ``LINATTN_BACKEND`` /
``LINATTN_DISABLE`` is well formed or the call is refused with a ``ValueError`` naming the
variable and the entry (an empty backend name or key, an empty entry, an unknown key, ``key=`` in
the disable list); a blank variable is unset; ``policy()`` refuses an empty backend name too.
"""

import os
import subprocess
import sys

import pytest
import torch

import linattn
from linattn.dispatch import policy
from linattn.dispatch.runtime.policy import env_policy

BAD_BACKEND = [
    ("decode=", "'decode=' names no backend"),
    ("all=torch-ref,decode=", "'decode=' names no backend"),
    ("=torch-ref", "'=torch-ref' has no key"),
    ("decode=torch-ref,", "is empty"),
    ("decode=torch-ref,,prefill=torch-ref", "is empty"),
    ("decoder=torch-ref", "unknown key 'decoder'"),
    ("decode=torch ref", "malformed backend name"),
    ("decode=a=b", "malformed backend name"),
]
BAD_DISABLE = [("triton-split,", "is empty"), ("decode=triton-split", "not a backend name")]


def _decode():
    pool = torch.randn(3, 1, 4, 4)
    before = pool.clone()
    q = torch.randn(1, 1, 1, 4)
    try:
        linattn.gdn_decode(q, q, torch.randn(1, 1, 1, 4), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1),
                           torch.zeros(1), pool, torch.tensor([1]))
    finally:
        assert torch.equal(pool[0], before[0]) and torch.equal(pool[2], before[2])


@pytest.mark.parametrize("var, value, match", [("LINATTN_BACKEND", v, m) for v, m in BAD_BACKEND]
                         + [("LINATTN_DISABLE", v, m) for v, m in BAD_DISABLE])
def test_f48_a_malformed_entry_refuses_the_call_naming_the_variable_and_entry(registry, monkeypatch, var, value,
                                                                              match):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=f"{var}=.*{match}"):
        _decode()
    with pytest.raises(ValueError, match=var):
        linattn.explain("gdn_decode", "cpu", h=1, hv=1, k=4, v=4)


@pytest.mark.parametrize("var, value", [("LINATTN_BACKEND", "decoder=torch-ref"), ("LINATTN_BACKEND", "a,,b"),
                                        ("LINATTN_DISABLE", "decode=torch-ref"), ("LINATTN_DISABLE", "a,,b")])
def test_f48_the_advice_is_the_variables_own_syntax(registry, monkeypatch, var, value):
    """LINATTN_BACKEND takes key=backend entries (its error lists the keys); LINATTN_DISABLE takes
    backend names only (its error says so and does not suggest key=backend entries)."""
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        _decode()
    message = str(info.value)
    if var == "LINATTN_BACKEND":
        assert "key=backend entries" in message and "op names" in message and "'all'" in message
    else:
        assert "backend names only" in message and "key=backend" not in message and "op names" not in message


def test_f48_blank_variables_are_unset_and_well_formed_ones_force(registry, monkeypatch):
    monkeypatch.setenv("LINATTN_BACKEND", "  ")
    monkeypatch.setenv("LINATTN_DISABLE", "")
    assert env_policy().force == () and env_policy().source == "default"
    monkeypatch.setenv("LINATTN_BACKEND", " decode = torch-ref ")
    _decode()
    assert linattn.last_decision().forced == "torch-ref" and linattn.last_decision().forced_by == "env"


def test_f48_an_unregistered_backend_from_the_environment_names_the_variable(registry, monkeypatch):
    monkeypatch.setenv("LINATTN_BACKEND", "decode=no-such-backend")
    with pytest.raises(ValueError, match="LINATTN_BACKEND .*'no-such-backend'.*not registered"):
        _decode()


@pytest.mark.parametrize("value", ["", "  ", None, 3])
def test_f48_policy_refuses_a_force_that_is_not_a_backend_name(value):
    with pytest.raises(ValueError, match="not a backend name"):
        with policy(decode=value):
            pass
    with pytest.raises(ValueError, match="not a backend name"):
        with policy(disable=["torch-ref", value]):
            pass


def test_f48_the_cli_prints_one_line_and_exits_2(tmp_path):
    """``python -m linattn`` in a child process that imports the linattn this process imported: the
    child runs in ``tmp_path`` (``-m`` puts the working directory first on ``sys.path``, and the repo
    root's ``linattn/`` folder is only part of the package) with this process's ``sys.path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINATTN_")}
    env.update(LINATTN_BACKEND="decode=", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-m", "linattn", "explain", "gdn_decode"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "LINATTN_BACKEND='decode='" in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("value, expected", [("", True), (" ", True), ("1", True), ("0", False), ("off", False),
                                             ("False", False), ("yes", True), ("ON", True)])
def test_f48_switches_take_one_or_zero_and_their_words(monkeypatch, value, expected):
    from linattn.dispatch.env import env_switch

    monkeypatch.setenv("LINATTN_FAST_LAUNCH", value)
    assert env_switch("LINATTN_FAST_LAUNCH", True) is expected


@pytest.mark.parametrize("value", ["fasle", "2", "disabled"])
def test_f48_a_malformed_switch_is_refused_naming_the_variable(monkeypatch, value):
    from linattn.dispatch.env import env_switch
    from linattn.dispatch.rules import value_rules

    monkeypatch.setattr(value_rules, "FUSED_VALUE_CHECKS", None)  # the environment decides
    monkeypatch.setenv("LINATTN_FUSED_VALUE_CHECKS", value)
    with pytest.raises(ValueError, match=f"LINATTN_FUSED_VALUE_CHECKS='{value}' is not a switch"):
        env_switch("LINATTN_FUSED_VALUE_CHECKS", True)
    with pytest.raises(ValueError, match="LINATTN_FUSED_VALUE_CHECKS"):
        value_rules._fusable_device(torch.device("cuda", 0))


@pytest.mark.parametrize("var", ["LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS"])
def test_f48_an_empty_plugin_name_is_refused_when_the_registry_loads(registry, monkeypatch, var):
    from linattn.dispatch.runtime.registry import Registry

    monkeypatch.setenv(var, "cpu-chunked,")
    with pytest.raises(ValueError, match=f"{var}='cpu-chunked,': entry 2 is empty"):
        Registry().load()
    monkeypatch.setenv(var, " ")  # blank: unset
    Registry().load()
