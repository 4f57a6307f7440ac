"""The peer backends in the dispatcher, on device profiles (nothing launches, no library is
imported): registered only when installed, ranked behind linattn's own backends with ``explain``
saying so, every undeclared case rejected with its reason (so the dispatcher falls back), CUDA-graph
capture refused where the peer syncs, and FLA's own backend redirection detected."""

from __future__ import annotations

import importlib.util
import types

import pytest

import linattn
from linattn.backends import builtin
from linattn.backends import fla as fla_backend
from linattn.backends import peer
from linattn.dispatch import Problem, Rank, Reason
from linattn.dispatch.runtime.registry import Registry


@pytest.fixture
def peers_installed(monkeypatch):
    """Both libraries count as installed (``find_spec``), whatever this machine has, and enabled
    (and ``LINATTN_PEERS=all``); a fresh registry."""
    monkeypatch.setattr(peer, "installed", lambda module: True)
    monkeypatch.setenv("LINATTN_PEERS", "all")
    linattn.dispatch.reset_registry()
    yield
    monkeypatch.undo()
    linattn.dispatch.reset_registry()


def _verdict(problem: Problem, name: str, device="sm90", capturing=False):
    d = linattn.dispatch.explain(problem, device, capturing=capturing)
    return next(v for v in d.verdicts if v.backend == name), d


PREFILL = dict(op="gdn_prefill", n=2, t=512, h=2, hv=8, k=128, v=128, dtype="bfloat16")
DECODE = dict(op="gdn_decode", n=64, t=1, h=2, hv=8, k=128, v=128, dtype="bfloat16")


def test_peers_register_only_when_installed_and_enabled(monkeypatch):
    monkeypatch.setattr(peer, "installed", lambda module: True)
    monkeypatch.delenv("LINATTN_PEERS", raising=False)
    assert builtin.PEERS_VERIFIED == frozenset({"fla", "flashinfer"})  # both passed conformance on the H200
    # installed and verified: registered without LINATTN_PEERS; installed and unverified: not
    assert {"fla", "flashinfer"} == {"fla", "flashinfer"} & {c.name for c in builtin.linattn_register_backends()}
    monkeypatch.setattr(builtin, "PEERS_VERIFIED", frozenset())
    assert not {"fla", "flashinfer"} & {c.name for c in builtin.linattn_register_backends()}
    monkeypatch.setenv("LINATTN_PEERS", "fla")
    assert {"fla"} == {"fla", "flashinfer"} & {c.name for c in builtin.linattn_register_backends()}
    monkeypatch.setenv("LINATTN_PEERS", "fla,flash-infer")
    with pytest.raises(ValueError, match="LINATTN_PEERS names \\['flash-infer'\\]"):
        builtin.linattn_register_backends()
    # the registry raises it (a usage error: the CLI's one `error:` line, exit 2), never marks the built-ins broken
    with pytest.raises(ValueError, match="LINATTN_PEERS"):
        Registry().load(entry_points=False)
    monkeypatch.setenv("LINATTN_PEERS", "all")
    monkeypatch.setattr(peer, "installed", lambda module: module == "flashinfer")
    names = {c.name for c in builtin.linattn_register_backends()}
    assert "flashinfer" in names and "fla" not in names and "triton-split" in names
    monkeypatch.setattr(peer, "installed", lambda module: False)
    assert not {"fla", "flashinfer"} & {c.name for c in builtin.linattn_register_backends()}
    reg = Registry().load(entry_points=False)
    assert not {"fla", "flashinfer"} & set(reg.backends)
    monkeypatch.setenv("LINATTN_PEERS", "flash-infer")  # a name that is no peer's, with no peer installed
    with pytest.raises(ValueError, match="LINATTN_PEERS names \\['flash-infer'\\]"):
        builtin.linattn_register_backends()


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill", "gdn_decode"])
def test_peers_rank_behind_linattns_own_backends_and_explain_says_so(peers_installed, op):
    p = Problem(**{**(PREFILL if "prefill" in op else DECODE), "op": op})
    v, d = _verdict(p, "fla")
    assert v.ok and v.rank == Rank.PEER and "behind linattn's own kernel backends" in v.message
    assert "tune table" in v.message and d.chosen == "triton-split"
    own = next(x for x in d.verdicts if x.backend == "triton-split")
    assert own.ok and own.rank < v.rank < next(x for x in d.verdicts if x.backend == "torch-ref").rank
    forced = linattn.dispatch.explain(p, "sm90", backend="fla")
    assert forced.chosen == "fla"


def test_flashinfer_accepts_its_declared_prefill_and_decode(peers_installed):
    for shape in (PREFILL, {**PREFILL, "state_dtype": "bfloat16", "has_initial_state": True},
                  {**PREFILL, "output_state_indices": True, "checkpoints": True, "has_initial_state": True},
                  {**PREFILL, "mode": "dense"}, DECODE):
        v, _ = _verdict(Problem(**shape), "flashinfer")
        assert v.ok and v.rank == Rank.PEER, v
    for device in ("sm100", "sm103", "sm120"):
        assert _verdict(Problem(**PREFILL), "flashinfer", device)[0].ok


@pytest.mark.parametrize("change, reason", [
    (dict(k=64, v=64), Reason.SHAPE),
    (dict(state_layout="kv"), Reason.LAYOUT),
    (dict(dtype="float32"), Reason.DTYPE),
    (dict(op="kda_prefill"), Reason.OP),
])
def test_flashinfer_rejects_undeclared_prefill_with_its_reason(peers_installed, change, reason):
    v, d = _verdict(Problem(**{**PREFILL, **change}), "flashinfer")
    assert not v.ok and reason in [f.reason for f in v.reasons], v
    assert d.chosen is not None and d.chosen != "flashinfer"  # the dispatcher falls back


@pytest.mark.parametrize("change, reason, words", [
    (dict(t=3), Reason.FEATURE, "T=3"),
    (dict(t=3, intermediate_states=True), Reason.FEATURE, "intermediate_states"),
    (dict(disable_state_update=True), Reason.FEATURE, "disable_state_update"),
    (dict(precomputed_gates=True), Reason.FEATURE, "precomputed gates"),
    (dict(has_initial_state=True), Reason.FEATURE, "has_initial_state"),
    (dict(output_state_indices=True), Reason.FEATURE, "output_state_indices"),
    (dict(state_dtype="bfloat16"), Reason.DTYPE, "slot 0"),
])
def test_flashinfer_rejects_decode_it_does_not_honour(peers_installed, change, reason, words):
    v, d = _verdict(Problem(**{**DECODE, **change}), "flashinfer")
    assert not v.ok and any(f.reason == reason and words in f.message for f in v.reasons), v
    assert d.chosen not in (None, "flashinfer")


@pytest.mark.parametrize("device", ["mi300x", "cpu", "xpu-pvc"])
def test_peers_reject_devices_they_do_not_run_on(peers_installed, device):
    dev = linattn.capabilities.profile("cpu") if device == "cpu" else device
    for name in ("fla", "flashinfer"):
        v, d = _verdict(Problem(**PREFILL), name, dev)
        assert not v.ok and Reason.DEVICE in [f.reason for f in v.reasons] and d.chosen != name, v


def test_fla_rejects_fp32_and_undeclared_head_dims_and_takes_every_decode_feature(peers_installed):
    for shape in (PREFILL, DECODE):
        v, _ = _verdict(Problem(**{**shape, "dtype": "float32"}), "fla")
        assert not v.ok and v.reason == Reason.DTYPE
    v, _ = _verdict(Problem(**{**PREFILL, "k": 256, "v": 256}), "fla")
    assert not v.ok and v.reason == Reason.SHAPE
    assert _verdict(Problem(**{**DECODE, "t": 4, "num_accepted_tokens": True, "intermediate_states": True,
                               "precomputed_gates": True, "state_layout": "kv"}), "fla")[0].ok


def test_uninstalled_peer_is_rejected_for_its_toolchain_with_the_pip_name(peers_installed, monkeypatch):
    monkeypatch.setattr(peer, "installed", lambda module: module != "flashinfer")
    v, _ = _verdict(Problem(**PREFILL), "flashinfer")
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "flashinfer-python" in v.message


def test_capture_is_refused_where_a_peer_syncs(peers_installed):
    for shape, name, refused in ((PREFILL, "fla", True), (DECODE, "fla", False), (PREFILL, "flashinfer", True),
                                 (DECODE, "flashinfer", False)):
        eager, _ = _verdict(Problem(**shape), name)
        captured, d = _verdict(Problem(**shape), name, capturing=True)
        assert eager.ok and not eager.verified and not captured.ok, (name, shape["op"], captured)
        assert d.chosen not in (None, name)
        # refused for good where it syncs; otherwise only until an eager call has self-checked it
        want = Reason.CAPTURE if refused else Reason.UNVERIFIED
        assert captured.reason == want, (name, shape["op"], captured)
        if refused:
            assert "sync" in captured.message


def test_fla_inner_redirection_is_detected_and_dispatch_off_means_none(monkeypatch):
    active = types.SimpleNamespace(backend_type="tilelang")
    registry = types.SimpleNamespace(get_active=lambda: active)
    backends = types.SimpleNamespace(_DISPATCH_DISABLED=False, _load_operation_registry=lambda op: registry)
    monkeypatch.setattr(fla_backend, "import_library", lambda name: (backends, ""))
    assert fla_backend.inner_redirects("kda") == ["kda -> tilelang"]
    assert fla_backend.inner_redirects("gdn") == []  # GDN's entry point is unwrapped: nothing inside dispatches
    backends._DISPATCH_DISABLED = True
    assert fla_backend.inner_redirects("kda") == []
    backends._DISPATCH_DISABLED, active = False, None
    registry.get_active = lambda: None
    assert fla_backend.inner_redirects("kda") == []


def test_fla_functions_are_flas_own_implementations_not_its_dispatch_wrappers():
    """With the real fla-core installed: the functions the backend calls are FLA's Triton path."""
    if not peer.installed("fla"):
        pytest.skip("fla-core is not installed (pip install 'linattn[peers]')")
    import inspect

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda

    for (family, phase), (mod, name) in fla_backend.FUNCTIONS.items():
        fn = fla_backend.fla_function(family, phase)
        assert not hasattr(fn, "__wrapped__") and fn.__name__ == name and fn.__module__.startswith(mod)
        params = inspect.signature(fn).parameters
        for kw in ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "state_v_first",
                   "cu_seqlens"):
            assert kw in params, (name, kw)
    assert fla_backend.fla_function("gdn", "prefill") is not chunk_gated_delta_rule  # the dispatch wrapper
    assert fla_backend.fla_function("kda", "prefill") is not chunk_kda


@pytest.mark.parametrize("name", ["fla", "flashinfer"])
def test_conformance_negative_cases_pass_on_the_cpu(peers_installed, name):
    """What a peer does not declare (dtypes, state dtypes, layouts, head dims, ops, vendors) is rejected by
    its predicates and a forced call raises NoBackendError before touching anything."""
    from linattn.testing import run_suite

    rep = run_suite(name, kinds=["negative"])
    negatives = [r for r in rep.results if r.kind == "negative"]
    assert len(negatives) >= 8 and not rep.failures(), [(r.id, r.message) for r in rep.failures()]
    assert all(r.status == "passed" for r in negatives), [(r.id, r.status, r.message) for r in negatives]


def _real_sm90():
    """The sm90 profile as if probed from a real device (``profile`` None: the libraries are imported)."""
    return linattn.capabilities.profile("sm90").model_copy(update={"profile": None})


def test_on_a_real_device_a_library_that_does_not_import_is_a_toolchain_rejection(peers_installed, monkeypatch):
    from linattn.backends import flashinfer as fi_backend

    fails = lambda name: (None, "ImportError: no CuTe DSL") if name == "flashinfer.gdn_prefill" else (object(), "")
    monkeypatch.setattr(peer, "import_library", fails)
    monkeypatch.setattr(fi_backend, "import_library", fails)
    v, d = _verdict(Problem(**PREFILL), "flashinfer", _real_sm90())
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "flashinfer.gdn_prefill" in v.message
    assert "no CuTe DSL" in v.message and d.chosen not in (None, "flashinfer")
    no_kernel = types.SimpleNamespace(chunk_gated_delta_rule_sm90=None)
    monkeypatch.setattr(fi_backend, "import_library", lambda name: (no_kernel, ""))
    monkeypatch.setattr(peer, "import_library", lambda name: (object(), ""))
    v, _ = _verdict(Problem(**PREFILL), "flashinfer", _real_sm90())
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "chunk_gated_delta_rule_sm90" in v.message
    assert _verdict(Problem(**DECODE), "flashinfer", _real_sm90())[0].ok  # decode needs no prefill kernel


def test_on_a_real_device_fla_kda_is_rejected_where_fla_would_redirect_inner_kernels(peers_installed, monkeypatch):
    active = types.SimpleNamespace(backend_type="tilelang")
    backends = types.SimpleNamespace(_DISPATCH_DISABLED=False,
                                     _load_operation_registry=lambda op: types.SimpleNamespace(get_active=lambda: active))
    fake = lambda name: (backends if name == "fla.backends" else object(), "")
    monkeypatch.setattr(peer, "import_library", fake)
    monkeypatch.setattr(fla_backend, "import_library", fake)
    v, d = _verdict(Problem(**{**PREFILL, "op": "kda_prefill"}), "fla", _real_sm90())
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "kda -> tilelang" in v.message
    assert "FLA_DISABLE_BACKEND_DISPATCH" in v.hint and d.chosen not in (None, "fla")
    assert _verdict(Problem(**PREFILL), "fla", _real_sm90())[0].ok  # GDN: the entry point is unwrapped


@pytest.mark.parametrize("library, stray", [("fla", "fla.py"), ("flashinfer", "flashinfer/__init__.py")])
def test_a_stray_module_of_a_peers_name_registers_no_peer(monkeypatch, tmp_path, library, stray):
    """A module named like a peer's library but not installed by its distribution (a stray ``fla.py``
    on sys.path) is not the library: the peer is not registered, and its toolchain check says the
    distribution is missing. With the distribution's metadata present, the same module counts."""
    (tmp_path / stray).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / stray).write_text("raise ImportError('a stray module, never imported by the check')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LINATTN_PEERS", "all")
    real = peer.metadata.distribution

    def no_peer_distribution(name):
        if name in {d for ds in peer.DISTRIBUTIONS.values() for d in ds}:
            raise peer.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(peer.metadata, "distribution", no_peer_distribution)
    assert importlib.util.find_spec(library) is not None  # importable by name: what was checked before
    assert not peer.installed(library) and peer.distribution(library) is None
    assert library not in {c.name for c in builtin.linattn_register_backends()}
    from linattn.backends.flashinfer import FlashInferBackend

    cls = fla_backend.FLABackend if library == "fla" else FlashInferBackend
    v = cls().supports_toolchain(Problem(**DECODE), linattn.dispatch.resolve_device("sm90"))
    assert not v.ok and v.reason == Reason.TOOLCHAIN and "not installed" in v.message

    dist = peer.DISTRIBUTIONS[library][-1]  # e.g. the older flash-linear-attention distribution
    monkeypatch.setattr(peer.metadata, "distribution", lambda name: object() if name == dist else no_peer_distribution(name))
    assert peer.installed(library) and peer.distribution(library) == dist
    assert library in {c.name for c in builtin.linattn_register_backends()}
