"""Field case F30 (issue 15, item 5): plugins that misbehave.

A plugin backend whose clamp returns ``[M, 2D]``, a dense prefill that returns ``(o, None)`` or a
lone tensor, and a plugin whose import calls ``sys.exit()``: each is that plugin's failure
(``BackendRunError``, then ``backend_error`` in every later decision, which falls back to another
backend; or a ``plugin_load_failed`` record), never a wrong result in the caller's hands, and
``import linattn`` and every later op keep working.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import linattn
from linattn.backends.torch_ref import gdn_prefill_ref, silu_and_mul_clamp_ref
from linattn.dispatch import Problem, Reason, explain, get_registry, reset_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
from plugin_fakes import Plugin, backend_module, make_distribution, mangling  # noqa: E402

CLAMP = Problem(op="silu_and_mul_clamp", n=4, d=8, dtype="float32", mode="none")




def _prefill_inputs(lens=(4, 0, 3), H=1, HV=2, K=4, V=8):
    g = torch.Generator().manual_seed(30)
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return dict(q=torch.randn(T, H, K, generator=g), k=torch.randn(T, H, K, generator=g),
                v=torch.randn(T, HV, V, generator=g), g=-torch.rand(T, HV, generator=g),
                beta=torch.rand(T, HV, generator=g), cu_seqlens=cu)


def test_f30_clamp_returning_m_by_2d_is_the_plugins_failure_never_the_callers(registry):
    wide = mangling("wide-clamp", "silu_and_mul_clamp", lambda out: torch.cat([out, out], dim=1))
    registry.add_plugin(Plugin(wide), name="vendor-wide", distribution="vendor-wide-dist")
    assert explain(CLAMP, "cpu").chosen == "wide-clamp"
    x = torch.randn(4, 16)
    with pytest.raises(linattn.BackendRunError, match=r"'wide-clamp' \(plugin 'vendor-wide'\) returned a wrong result "
                                                      r"in silu_and_mul_clamp: .*out of shape \(4, 16\); the contract "
                                                      r"is \[M, D\] = \(4, 8\)"):
        linattn.silu_and_mul_clamp(x, 10.0)
    d = explain(CLAMP, "cpu")
    assert d.verdict("wide-clamp").reason == Reason.BACKEND_ERROR and d.chosen == "torch-ref"
    out = linattn.silu_and_mul_clamp(x, 10.0)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"
    assert out.shape == (4, 8) and torch.equal(out, silu_and_mul_clamp_ref(x, 10.0))


@pytest.mark.parametrize("returns, says", [
    (lambda r: (r[0], None), r"final_state = None; the contract is \[N, HV, V, K\] = \(3, 2, 8, 4\)"),
    (lambda r: r[0], r"returned a tensor of shape \(7, 2, 8\); the contract is a tuple \(o, final_state\)"),
], ids=["(o, None)", "one tensor"])
def test_f30_dense_prefill_without_a_final_state_is_the_plugins_failure(registry, returns, says):
    registry.add_plugin(Plugin(mangling("stateless", "gdn_prefill", returns)), name="vendor-stateless")
    args = _prefill_inputs()
    with pytest.raises(linattn.BackendRunError, match=r"'stateless' \(plugin 'vendor-stateless'\) returned a wrong "
                                                      rf"result in gdn_prefill: .*{says}"):
        linattn.gdn_prefill(**args)
    o, ht = linattn.gdn_prefill(**args)
    d = linattn.last_decision("gdn_prefill")
    assert d.chosen == "torch-ref" and d.verdict("stateless").reason == Reason.BACKEND_ERROR
    ro, rht = gdn_prefill_ref(**args)
    assert torch.equal(o, ro) and torch.equal(ht, rht) and ht.shape == (3, 2, 8, 4)
    with pytest.raises(linattn.NoBackendError, match="backend_error"):
        linattn.gdn_prefill(**args, backend="stateless")


def test_f30_plugin_whose_import_calls_sys_exit_is_reported_and_every_op_keeps_working(site):
    make_distribution(site, "vendor-exit", {"exits": "exits_plugin", "fine": "fine_plugin"},
                      {"exits_plugin": "import sys\nsys.exit(3)\n", "fine_plugin": backend_module("fine-clamp")})
    reg = reset_registry()  # loads the entry points: must not exit
    rec = next(p for p in reg.plugins if p.name == "exits")
    assert rec.status == "plugin_load_failed" and rec.distribution == "vendor-exit"
    assert "SystemExit: sys.exit(3) was called" in rec.error
    assert next(p for p in reg.plugins if p.name == "fine").status == "loaded"  # the next plugin still loads
    assert next(p for p in reg.plugins if p.name == "linattn-builtin").status == "loaded"
    d = explain(CLAMP, "cpu")
    assert d.verdict("plugin:exits").reason == Reason.PLUGIN_LOAD_FAILED and d.chosen == "fine-clamp"
    x = torch.randn(3, 8)
    assert torch.equal(linattn.silu_and_mul_clamp(x), silu_and_mul_clamp_ref(x))
    o, ht = linattn.gdn_prefill(**_prefill_inputs())
    assert o.shape == (7, 2, 8) and ht.shape == (3, 2, 8, 4)
    assert get_registry() is reg


def test_f30_import_linattn_survives_a_plugin_that_calls_sys_exit(site):
    make_distribution(site, "vendor-exit", {"exits": "exits_plugin"}, {"exits_plugin": "import sys\nsys.exit(3)\n"})
    code = ("import json, torch, linattn\n"
            "out = linattn.silu_and_mul_clamp(torch.ones(2, 4))  # the first op loads the plugins\n"
            "print(json.dumps({'shape': list(out.shape), 'chosen': linattn.last_decision().chosen,\n"
            " 'plugins': {p.name: [p.status, p.error] for p in linattn.list_plugins()}}))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    for var in ("LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS", "LINATTN_BACKEND", "LINATTN_DISABLE"):
        env.pop(var, None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["shape"] == [2, 2] and doc["chosen"] == "torch-ref"
    status, error = doc["plugins"]["exits"]
    assert status == "plugin_load_failed" and "sys.exit(3)" in error
