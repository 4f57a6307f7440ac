"""Plugins at run time: registered through the pluggy hook, a predicate or a run that raises, a
device probe contributed by a plugin; results checked against the op contract; plugins whose
import or hook misbehaves; names first come, first served; adding and removing plugins while
another thread dispatches (issue 15, field case F30)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

import linattn
from linattn.backends.torch_ref import TorchRefBackend, gdn_decode_ref
from linattn.capabilities import profile
from linattn.dispatch import Problem, Reason, explain, get_registry, reset_registry
from linattn.dispatch.plugin.hookspecs import hookimpl
from linattn.dispatch.runtime.registry import BUILTIN_PLUGIN, Registry
from linattn.dispatch.plugin.verdict import Check

from plugin_fakes import Plugin, RaisesInRun, make_distribution, mangling

CLAMP = Problem(op="silu_and_mul_clamp", n=4, d=8, dtype="float32", mode="none")


class FirstOnCpu(RaisesInRun):
    """Ranked first for the clamp on CPUs, and correct."""

    name = "first-on-cpu"

    def silu_and_mul_clamp(self, *, x, limit=None):
        from linattn.backends.torch_ref import silu_and_mul_clamp_ref

        return silu_and_mul_clamp_ref(x, limit)


class PredicateRaises(FirstOnCpu):
    name = "predicate-raises"

    def supports_shape(self, p, caps) -> Check:
        raise ZeroDivisionError("vendor shape table is empty")


class OtherVendor(FirstOnCpu):
    """Runs on a vendor linattn has no probe for ("other"), described by the plugin's probe."""

    name = "other-vendor"
    vendors = frozenset({"other"})


def test_plugin_added_through_the_hook_is_discovered_ranked_explained_and_run(registry):
    rec = registry.add_plugin(Plugin(FirstOnCpu), name="hook-plugin", distribution="tests", version="9")
    assert rec.status == "loaded" and rec.backends == ("first-on-cpu",)
    assert rec in linattn.list_plugins() and "first-on-cpu" in linattn.list_backends()
    d = explain(CLAMP, "cpu")
    assert d.chosen == "first-on-cpu" and d.runners_up[0] == "torch-ref"
    assert d.verdict("first-on-cpu").rank == 1
    out = linattn.silu_and_mul_clamp(torch.tensor([[20.0, -30.0]]), 10.0)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "first-on-cpu"
    assert torch.allclose(out, torch.tensor([[-99.9955]]), atol=1e-3)


def test_predicate_that_raises_is_backend_error_and_others_are_still_chosen(registry):
    registry.add_plugin(Plugin(PredicateRaises), name="raising", distribution="tests")
    d = explain(CLAMP, "cpu")
    v = d.verdict("predicate-raises")
    assert v.reason == Reason.BACKEND_ERROR and "ZeroDivisionError" in v.message and "shape table" in v.message
    assert d.chosen == "torch-ref"
    out = linattn.silu_and_mul_clamp(torch.randn(3, 8), 10.0)
    assert out.shape == (3, 4) and linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"


def test_run_that_raises_is_a_backend_run_error_then_backend_error(registry):
    registry.add_plugin(Plugin(RaisesInRun), name="crashy", distribution="vendor-crashy")
    assert explain(CLAMP, "cpu").chosen == "raises-in-run"
    x = torch.randn(4, 16)
    with pytest.raises(linattn.BackendRunError, match="raises-in-run.*crashy.*vendor kernel crashed"):
        linattn.silu_and_mul_clamp(x, 10.0)
    d = explain(CLAMP, "cpu")
    v = d.verdict("raises-in-run")
    assert v.reason == Reason.BACKEND_ERROR and "vendor kernel crashed" in v.message
    assert d.chosen == "torch-ref"
    # the next call is not retried on the broken backend: it runs the reference
    out = linattn.silu_and_mul_clamp(x, 10.0)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref" and out.shape == (4, 8)
    # and forcing the broken backend names why it is not eligible
    with pytest.raises(linattn.NoBackendError, match="backend_error"):
        linattn.silu_and_mul_clamp(x, 10.0, backend="raises-in-run")


def test_plugin_probe_describes_a_device_linattn_does_not_know(registry):
    def probe(device):
        if device.type == "privateuseone":  # PyTorch's slot for an out-of-tree vendor device
            return profile("cpu").model_copy(update=dict(vendor="other", device_type="other", name="VendorChip 1"))
        return None

    registry.add_plugin(Plugin(OtherVendor, probe=probe), name="vendor-chip", distribution="tests")
    d = explain(CLAMP, torch.device("privateuseone"))
    assert d.device == "VendorChip 1" and d.chosen == "other-vendor"
    assert explain(CLAMP, "cpu").verdict("other-vendor").reason == Reason.DEVICE
    assert get_registry().probe_device(torch.device("cpu")) is None  # no answer: linattn's own probe


# -- results checked at run time (issue 15, F30) -------------------------------------------------------

H, HV, K, V = 1, 2, 4, 8  # K != V and HV != V, so a transposed tensor has a wrong shape


def _decode_args(N=3, T=2, P=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(N * 10 + T)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    pool = r(P, HV, V, K)
    return dict(q=r(N, T, H, K).to(dtype), k=r(N, T, H, K).to(dtype), v=r(N, T, HV, V).to(dtype),
                a=r(N, T, HV), b=r(N, T, HV), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV),
                state_pool=pool, state_indices=torch.arange(N).flip(0) + 1)  # rows 0 and N+1.. are not owned


def _prefill_args(lens=(3, 0, 2), dtype=torch.float32, kda=False):
    g = torch.Generator().manual_seed(sum(lens))
    T = sum(lens)
    gate = -torch.rand(T, HV, K, generator=g) if kda else -torch.rand(T, HV, generator=g)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return dict(q=torch.randn(T, H, K, generator=g).to(dtype), k=torch.randn(T, H, K, generator=g).to(dtype),
                v=torch.randn(T, HV, V, generator=g).to(dtype), g=gate, beta=torch.rand(T, HV, generator=g),
                cu_seqlens=cu)


def _pool_prefill_args(P=6):
    """Pool mode: sequences 0 and 2 own slots 4 and 1, sequence 1 is padding; slots 0, 2, 3, 5 are not owned."""
    return dict(_prefill_args(), state_pool=torch.randn(P, HV, V, K), state_indices=torch.tensor([4, -1, 1]))


# case -> (op, a function giving fresh (args, kwargs) for the public op)
_CALLS = {
    "clamp": ("silu_and_mul_clamp", lambda: ((torch.randn(4, 16),), dict(limit=10.0))),
    "gdn_gating": ("gdn_gating", lambda: ((torch.zeros(HV), torch.randn(3, HV), torch.randn(3, HV),
                                           torch.zeros(HV)), {})),
    "kda_gating": ("kda_gating", lambda: ((torch.zeros(HV), torch.randn(3, HV, K), torch.randn(3, HV),
                                           torch.zeros(HV, K)), {})),
    "decode": ("gdn_decode", lambda: ((), _decode_args())),
    "dense": ("gdn_prefill", lambda: ((), _prefill_args())),
    "dense-kv": ("gdn_prefill", lambda: ((), dict(_prefill_args(), state_layout="kv",
                                                  initial_state=torch.randn(3, HV, K, V)))),
    "dense-bf16-state": ("gdn_prefill", lambda: ((), dict(_prefill_args(),
                                                          initial_state=torch.randn(3, HV, V, K).bfloat16()))),
    "kda-dense": ("kda_prefill", lambda: ((), _prefill_args(kda=True))),
    "pool": ("gdn_prefill", lambda: ((), _pool_prefill_args())),
}

# (case, how the plugin mangles the reference's result, what the error must say)
WRONG = [
    ("clamp", lambda out: torch.cat([out, out], 1), r"out of shape \(4, 16\); the contract is \[M, D\] = \(4, 8\)"),
    ("clamp", lambda out: out.double(), r"out in float64; the contract is .* in float32 \(x's dtype\)"),
    ("clamp", lambda out: out.to("meta"), r"out on meta; the contract is .* on cpu"),
    ("clamp", lambda out: (out,), r"out = a tuple of 1 items"),
    ("clamp", lambda out: None, r"out = None"),
    ("gdn_gating", lambda r: r[0], r"returned a tensor of shape \(3, 2\); the contract is a tuple \(g, beta\)"),
    ("gdn_gating", lambda r: list(r), r"returned a list of 2 items; the contract is a tuple \(g, beta\)"),
    ("gdn_gating", lambda r: (r[0], r[1].bfloat16()), r"beta in bfloat16"),
    ("kda_gating", lambda r: (r[0][..., 0], r[1]), r"g of shape \(3, 2\); the contract is a's shape = \(3, 2, 4\)"),
    ("decode", lambda o: o.transpose(-1, -2),
     r"o of shape \(3, 2, 8, 2\); the contract is \[N, T, HV, V\] = \(3, 2, 2, 8\)"),
    ("decode", lambda o: o.double(), r"o in float64; the contract is .* \(q's dtype\)"),
    ("dense", lambda r: (r[0], None), r"final_state = None; the contract is \[N, HV, V, K\] = \(3, 2, 8, 4\)"),
    ("dense", lambda r: r[0],
     r"returned a tensor of shape \(5, 2, 8\); the contract is a tuple \(o, final_state\)"),
    ("dense", lambda r: (r[0], r[1].transpose(-1, -2)), r"final_state of shape \(3, 2, 4, 8\)"),
    ("dense", lambda r: (r[0], r[1].bfloat16()),
     r"final_state in bfloat16; .* in float32 \(no initial_state was given\)"),
    ("dense-kv", lambda r: (r[0], r[1].transpose(-1, -2)), r"the contract is \[N, HV, K, V\] = \(3, 2, 4, 8\)"),
    ("dense-bf16-state", lambda r: (r[0], r[1].float()), r"in bfloat16 \(initial_state's dtype\)"),
    ("kda-dense", lambda r: (*r, None), r"a tuple of 3 items; the contract is \(o, final_state\), 2 items"),
    ("pool", lambda r: (r[0], torch.zeros(3, HV, V, K)), r"final_state = a tensor of shape .*: return None there"),
    ("pool", lambda r: (r[0][:-1], None), r"o of shape \(4, 2, 8\); the contract is \[T, HV, V\] = \(5, 2, 8\)"),
    # the right shape and values in other strides: torch.compile traces the op's contiguous fake
    ("decode", lambda o: o.transpose(0, 1).contiguous().transpose(0, 1), r"o with strides .*, not contiguous"),
    ("dense", lambda r: (r[0], r[1].transpose(-1, -2).contiguous().transpose(-1, -2)),
     r"final_state with strides .*, not contiguous"),
]


def _run(case):
    """(op, args, kwargs, call): fresh inputs for ``case``, the same on every call (seeded)."""
    op, make = _CALLS[case]
    torch.manual_seed(0)
    args, kwargs = make()
    return op, args, kwargs, (lambda **extra: getattr(linattn, op)(*args, **kwargs, **extra))


def _tensors(out, kwargs):
    """The result's tensors and the pool (None-free), to compare two runs bitwise."""
    items = list(out) if isinstance(out, tuple) else [out]
    return [t for t in items + [kwargs.get("state_pool")] if t is not None]


def _unowned_rows(kwargs):
    """(pool, rows the call does not own, their bits before the call), or None without a pool."""
    pool = kwargs.get("state_pool")
    if pool is None:
        return None
    owned = {int(i) for i in kwargs["state_indices"].flatten() if int(i) >= 0}
    rows = [r for r in range(pool.shape[0]) if r not in owned]
    return pool, rows, pool[rows].clone()


def _assert_unowned_unchanged(snap):
    if snap is not None:
        pool, rows, before = snap
        assert torch.equal(pool[rows], before), "a pool row the call does not own was written"


@pytest.mark.parametrize("case, mangle, says", WRONG, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_wrong_result_is_a_backend_run_error_then_backend_error_and_never_returned(registry, case, mangle, says):
    op, args, kwargs, call = _run(case)
    registry.add_plugin(Plugin(mangling("mangler", op, mangle)), name="mangling-plugin", distribution="vendor-m")
    snap = _unowned_rows(kwargs)
    with pytest.raises(linattn.BackendRunError, match="'mangler' \\(plugin 'mangling-plugin'\\) returned a wrong "
                                                      f"result in {op}: .*{says}") as e:
        call()
    _assert_unowned_unchanged(snap)
    # a call that writes a pool says that its own rows may hold partial writes; one without a pool does not
    assert ("The rows of state_pool this call writes may hold its partial writes" in str(e.value)) == (
        kwargs.get("state_pool") is not None)
    assert "mangler" in get_registry().broken and "ResultError" in get_registry().broken["mangler"]
    # the next call (same inputs, afresh) rejects it (backend_error) and runs the reference
    _, _, kwargs, call = _run(case)
    snap = _unowned_rows(kwargs)
    out = call()
    d = linattn.last_decision(op)
    default = "torch-chunked" if op.endswith("_decode") else "torch-ref"  # the CPU's defaults
    assert d.chosen == default and d.verdict("mangler").reason == Reason.BACKEND_ERROR
    _assert_unowned_unchanged(snap)
    _, _, ref_kwargs, ref_call = _run(case)
    ref = ref_call(backend="torch-ref")
    assert all(torch.equal(a, b) for a, b in zip(_tensors(out, kwargs), _tensors(ref, ref_kwargs), strict=True))
    with pytest.raises(linattn.NoBackendError, match="backend_error"):
        call(backend="mangler")


@pytest.mark.parametrize("case", sorted(_CALLS))
def test_correct_plugin_results_pass_the_check_unchanged(registry, case):
    op, args, kwargs, call = _run(case)
    registry.add_plugin(Plugin(mangling("faithful", op)), name="faithful-plugin")
    snap = _unowned_rows(kwargs)
    out = call()
    assert linattn.last_decision(op).chosen == "faithful" and "faithful" not in get_registry().broken
    _assert_unowned_unchanged(snap)
    _, _, ref_kwargs, ref_call = _run(case)  # the same inputs again through the reference
    ref = ref_call(backend="torch-ref")
    assert all(torch.equal(a, b) for a, b in zip(_tensors(out, kwargs), _tensors(ref, ref_kwargs), strict=True))


def test_fp64_oracle_results_of_a_plugin_pass(registry):
    registry.add_plugin(Plugin(mangling("faithful", {"gdn_prefill", "gdn_gating"})), name="faithful-plugin")
    o, ht = linattn.gdn_prefill(**_prefill_args(dtype=torch.float64))
    assert o.dtype == ht.dtype == torch.float64 and linattn.last_decision("gdn_prefill").chosen == "faithful"
    g, beta = linattn.gdn_gating(torch.zeros(HV, dtype=torch.float64), torch.zeros(3, HV), torch.zeros(3, HV),
                                 torch.zeros(HV))
    assert g.dtype == torch.float64 and linattn.last_decision("gdn_gating").chosen == "faithful"


def test_builtin_results_are_not_checked(registry, monkeypatch):
    import linattn.dispatch.runtime.results as results

    def boom(*a, **k):
        raise AssertionError("a built-in's result went through the plugin result check")

    monkeypatch.setattr(results, "check_result", boom)
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8), backend="torch-ref").shape == (2, 4)
    o, ht = linattn.gdn_prefill(**_prefill_args(), backend="torch-ref")
    assert ht.shape == (3, HV, V, K)


def test_plugin_run_that_calls_sys_exit_is_a_backend_run_error(registry):
    def leave(out):
        raise SystemExit(2)

    registry.add_plugin(Plugin(mangling("exits", "silu_and_mul_clamp", leave)), name="exiting-plugin")
    with pytest.raises(linattn.BackendRunError, match=r"'exits' .*raised .*SystemExit: sys.exit\(2\) was called"):
        linattn.silu_and_mul_clamp(torch.randn(2, 8))
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8)).shape == (2, 4)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("__str__ exploded")


def test_run_error_whose_str_raises_is_still_reported(registry):
    def unprintable(out):
        raise _Unprintable()

    registry.add_plugin(Plugin(mangling("garbled", "silu_and_mul_clamp", unprintable)), name="garbled-plugin")
    with pytest.raises(linattn.BackendRunError, match=r"_Unprintable \(its message could not be formatted: str\(\) "
                                                      r"raised ValueError\)"):
        linattn.silu_and_mul_clamp(torch.randn(2, 8))
    assert "_Unprintable" in get_registry().broken["garbled"]


# -- plugins whose import or hook misbehaves (BaseException, unprintable errors) -------------------------

class _Fatal(BaseException):
    """Not an Exception: what a careless plugin may raise."""


def _hook_plugin(exc):
    class HookRaises:
        LINATTN_API_VERSION = "1"

        @hookimpl
        def linattn_register_backends(self):
            raise exc

    return HookRaises()




@pytest.mark.parametrize("exc, says", [
    (SystemExit(4), r"SystemExit: sys.exit\(4\) was called"),
    (SystemExit(), r"SystemExit: sys.exit\(None\) was called"),
    (_Fatal("vendor runtime gone"), r"_Fatal: vendor runtime gone"),
    (_Unprintable(), r"_Unprintable \(its message could not be formatted: str\(\) raised ValueError\)"),
    (GeneratorExit(), r"GeneratorExit"),
], ids=["sys.exit(4)", "sys.exit()", "BaseException", "str-raises", "GeneratorExit"])
def test_hook_raising_anything_but_ctrl_c_is_a_load_failure(registry, exc, says):
    before = dict(registry.backends)
    rec = registry.add_plugin(_hook_plugin(exc), name="hook-misbehaves", distribution="vendor-h")
    assert rec.status == "plugin_load_failed" and re.search(says, rec.error), rec.error
    assert registry.pm.get_plugin("hook-misbehaves") is None and dict(registry.backends) == before
    d = explain(CLAMP, "cpu")
    assert d.verdict("plugin:hook-misbehaves").reason == Reason.PLUGIN_LOAD_FAILED and d.chosen == "torch-ref"
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8)).shape == (2, 4)


def test_ctrl_c_in_a_hook_propagates_and_leaves_nothing_registered(registry):
    n_records = len(registry.plugins)
    with pytest.raises(KeyboardInterrupt):
        registry.add_plugin(_hook_plugin(KeyboardInterrupt()), name="interrupted")
    assert registry.pm.get_plugin("interrupted") is None and len(registry.plugins) == n_records


def test_constructor_that_calls_sys_exit_is_a_load_failure(registry):
    class ExitsInInit(TorchRefBackend):
        name = "exits-in-init"

        def __init__(self):
            raise SystemExit("no licence")

    rec = registry.add_plugin(Plugin(ExitsInInit), name="licensed")
    assert rec.status == "plugin_load_failed" and "sys.exit('no licence')" in rec.error
    assert "exits-in-init" not in registry.backends


@pytest.mark.parametrize("src, says", [
    ("import sys\nsys.exit(3)\n", "importing it raised SystemExit: sys.exit(3) was called"),
    ("class Fatal(BaseException):\n    pass\nraise Fatal('abort')\n", "importing it raised Fatal: abort"),
    ("class E(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise E()\n",
     "importing it raised E (its message could not be formatted: str() raised RuntimeError)"),
], ids=["sys.exit", "BaseException", "str-raises"])
def test_entry_point_whose_import_misbehaves_is_reported_and_linattn_keeps_working(site, src, says):
    make_distribution(site, "vendor-bad", {"bad": "bad_plugin"}, {"bad_plugin": src})
    reg = reset_registry()
    rec = next(p for p in reg.plugins if p.name == "bad")
    assert rec.status == "plugin_load_failed" and says in rec.error, rec.error
    assert next(p for p in reg.plugins if p.name == BUILTIN_PLUGIN).status == "loaded"
    assert explain(CLAMP, "cpu").verdict("plugin:bad").reason == Reason.PLUGIN_LOAD_FAILED
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8)).shape == (2, 4)


def test_plugin_that_uses_the_registry_while_it_is_loaded_does_not_deadlock(site):
    """The pattern of the BackendPlugin docstring, run from a plugin's import during the first load."""
    src = ("import torch, linattn\n"
           "from linattn.backends.torch_ref import TorchRefBackend\n"
           "from linattn.dispatch import get_registry\n"
           "from linattn.dispatch.plugin.hookspecs import BackendPlugin\n"
           "LINATTN_API_VERSION = '1'\n"
           "class SelfAdded(TorchRefBackend):\n"
           "    name = 'self-added'\n"
           "    ops = frozenset({'silu_and_mul_clamp'})\n"
           "get_registry().add_plugin(BackendPlugin(SelfAdded), name='self-added-plugin')\n"
           "linattn.silu_and_mul_clamp(torch.randn(2, 4))  # an op while linattn loads this plugin\n")
    make_distribution(site, "vendor-eager", {"eager": "eager_plugin"}, {"eager_plugin": src})
    code = ("import json, linattn\n"
            "print(json.dumps({p.name: p.status for p in linattn.list_plugins()}))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    for var in ("LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS"):
        env.pop(var, None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["self-added-plugin"] == "loaded" and doc["eager"] == "loaded" and doc[BUILTIN_PLUGIN] == "loaded"


# -- names are first come, first served ----------------------------------------------------------------

def _builtin_state(reg):
    rec = next(p for p in reg.plugins if p.name == BUILTIN_PLUGIN and p.status == "loaded")
    owners = {n: (type(b).__name__, b.plugin) for n, b in reg.backends.items() if n in rec.backends}
    return rec, owners


def test_plugin_named_like_the_builtin_cannot_replace_its_record_or_backends(registry):
    rec0, owners0 = _builtin_state(registry)
    rec = registry.add_plugin(Plugin(mangling("impostor", "silu_and_mul_clamp")), name=BUILTIN_PLUGIN,
                              distribution="vendor-evil")
    assert rec.status == "plugin_load_failed" and "already loaded" in rec.error and "vendor-evil" == rec.distribution
    assert _builtin_state(registry) == (rec0, owners0)
    assert "impostor" not in registry.backends
    # a second failing namesake replaces the first failure, never the loaded record
    registry.add_plugin(object(), name=BUILTIN_PLUGIN, distribution="vendor-evil-2")
    assert _builtin_state(registry) == (rec0, owners0)
    assert [(p.status, p.distribution) for p in registry.plugins if p.name == BUILTIN_PLUGIN] == [
        ("loaded", "linattn"), ("plugin_load_failed", "vendor-evil-2")]
    assert explain(CLAMP, "cpu").chosen == "torch-ref"
    with pytest.raises(ValueError, match="cannot be removed"):
        registry.remove_plugin(BUILTIN_PLUGIN)


def test_entry_point_named_like_the_builtin_that_fails_to_import_leaves_the_builtin_record(site):
    make_distribution(site, "vendor-evil", {BUILTIN_PLUGIN: "evil_plugin"},
                      {"evil_plugin": "raise ImportError('nope')\n"})
    reg = reset_registry()
    recs = [p for p in reg.plugins if p.name == BUILTIN_PLUGIN]
    assert [(p.status, p.distribution) for p in recs] == [("loaded", "linattn"), ("plugin_load_failed", "vendor-evil")]
    assert reg.backends["torch-ref"].plugin == BUILTIN_PLUGIN
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8)).shape == (2, 4)


def test_second_plugin_under_a_loaded_name_is_refused(registry):
    first = registry.add_plugin(Plugin(mangling("first-b", "silu_and_mul_clamp")), name="vendor", distribution="a")
    second = registry.add_plugin(Plugin(mangling("second-b", "gdn_gating")), name="vendor", distribution="b")
    assert first.status == "loaded" and second.status == "plugin_load_failed"
    assert "remove_plugin('vendor')" in second.error
    assert next(p for p in registry.plugins if p.name == "vendor" and p.status == "loaded") == first
    assert "first-b" in registry.backends and "second-b" not in registry.backends


def test_builtin_backend_names_and_classes_stay_the_builtins(registry):
    rec0, owners0 = _builtin_state(registry)

    class Triton(TorchRefBackend):
        name = "triton-split"

    for cls in (TorchRefBackend, Triton):  # the built-in class itself, and a namesake
        rec = registry.add_plugin(Plugin(mangling("fine-one", "gdn_gating"), cls), name=f"takes-{cls.__name__}")
        assert rec.status == "plugin_load_failed" and "already registered by 'linattn-builtin'" in rec.error
        assert "fine-one" not in registry.backends  # all or nothing
    assert _builtin_state(registry) == (rec0, owners0)
    assert registry.backends["torch-ref"].plugin == BUILTIN_PLUGIN and "plugin" not in vars(TorchRefBackend)


# -- remove_plugin, and adding / removing while another thread dispatches --------------------------------

def test_remove_plugin_unregisters_its_backends_and_records(registry):
    gen = registry.generation
    registry.add_plugin(Plugin(mangling("removable", "silu_and_mul_clamp")), name="removable-plugin")
    assert explain(CLAMP, "cpu").chosen == "removable"
    rec = registry.remove_plugin("removable-plugin")
    assert rec.backends == ("removable",) and registry.generation > gen
    assert "removable" not in registry.backends and "removable" not in linattn.list_backends()
    assert all(p.name != "removable-plugin" for p in registry.plugins)
    assert registry.pm.get_plugin("removable-plugin") is None
    assert explain(CLAMP, "cpu").chosen == "torch-ref"
    assert linattn.silu_and_mul_clamp(torch.randn(2, 8)).shape == (2, 4)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"
    with pytest.raises(ValueError, match="no plugin named 'removable-plugin' is loaded"):
        registry.remove_plugin("removable-plugin")
    # the name is free again
    assert registry.add_plugin(Plugin(mangling("removable", "silu_and_mul_clamp")),
                               name="removable-plugin").status == "loaded"


def test_adding_and_removing_a_plugin_while_another_thread_dispatches_new_shapes():
    """One thread adds and removes a plugin in a loop; this one dispatches a stream of new decode
    shapes on the CPU for about 2 s. No exception; every decision valid; every result right."""
    reg = reset_registry(Registry().load(entry_points=False))
    try:
        flappy = mangling("flappy", "gdn_decode")  # correct, ranked before torch-ref
        stop, errors, cycles = threading.Event(), [], [0]

        def churn():
            try:
                while not stop.is_set():
                    assert reg.add_plugin(Plugin(flappy), name="flappy-plugin").status == "loaded"
                    time.sleep(0)
                    assert reg.remove_plugin("flappy-plugin").backends == ("flappy",)
                    cycles[0] += 1
                    time.sleep(0)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=churn, daemon=True)
        t.start()
        seen, calls, deadline = set(), 0, time.monotonic() + 2.0
        while time.monotonic() < deadline and not errors:
            N, T = 1 + calls % 13, 1 + (calls // 13) % 3  # a new (N, T) on every call
            args = _decode_args(N=N, T=T, P=N + 3)
            snap = _unowned_rows(args)
            expected_pool = args["state_pool"].clone()
            expected = gdn_decode_ref(**dict(args, state_pool=expected_pool))
            o = linattn.gdn_decode(**args)
            d = linattn.last_decision("gdn_decode")
            assert d.chosen in ("flappy", "torch-chunked") and d.verdict(d.chosen).ok
            assert d.problem.n == N and d.problem.t == T
            assert o.shape == (N, T, HV, V)
            if d.chosen == "torch-chunked":  # its own fp32 step (fewer passes over the state): fp32's tolerance
                assert torch.allclose(o, expected, rtol=1e-5, atol=1e-6)
                assert torch.allclose(args["state_pool"], expected_pool, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(o, expected) and torch.equal(args["state_pool"], expected_pool)
            _assert_unowned_unchanged(snap)
            seen.add(d.chosen)
            calls += 1
        stop.set()
        t.join(10)
        assert not t.is_alive() and not errors, errors
        assert calls > 20 and cycles[0] > 20 and seen == {"flappy", "torch-chunked"}, (calls, cycles, seen)
        assert not reg.broken
    finally:
        reset_registry()


class UnhashableSizeClass(FirstOnCpu):
    """Never chosen (ranked last); its size class is a list (unhashable)."""

    name = "unhashable-size-class"

    def rank(self, p, caps) -> int:
        return 10_000

    def size_class(self, p, caps):
        return [p.n, p.t]


def test_a_size_class_that_is_unhashable_counts_as_the_exact_sizes(registry):
    """Calls of its op still run, forced or chosen (the decision cache keys that backend by the exact sizes)."""
    registry.add_plugin(Plugin(UnhashableSizeClass), name="unhashable-plugin")
    for backend in ("torch-ref", None):
        for n in (2, 3, 2):
            assert linattn.silu_and_mul_clamp(torch.randn(n, 16), backend=backend).shape == (n, 8)
    assert linattn.last_decision("silu_and_mul_clamp").chosen == "torch-ref"
