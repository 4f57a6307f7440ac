"""F35: copies of a model enabled by ``linattn.integrations.transformers.enable``.

The rule (docs/ops-decisions.md, "F35"): what ``enable`` puts on a layer is plain data on that
instance (a ``_RoutedForward`` holding the layer, the forward it wraps and the options), never a
closure over the original module. So ``copy.deepcopy`` gives an enabled copy that runs its own
layers and weights; ``enable`` / ``disable`` on the copy act on the copy only; ``torch.save`` /
``pickle`` of the whole model round-trips (the loaded model is enabled and installs the routers on
its first call); a ``state_dict`` holds nothing of linattn's and loads into a fresh enabled model.
Tiny random Qwen3-Next (3 linear-attention layers), fp32 on the CPU.

The reference is transformers' own PyTorch path whether or not FLA (or causal-conv1d) is
installed: transformers picks FLA's Triton kernels when it can import them, and those cannot take
CPU tensors, so the fixture ``torch_path`` sets the modeling module's hub-wrapped functions to the
torch functions they wrap (``__wrapped__``) for the test. Every model a test builds is disabled on
teardown, pass or fail, so no router outlives its test.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import io
import pickle

import pytest
import torch

transformers = pytest.importorskip("transformers")

import linattn.integrations.transformers as lt  # noqa: E402

MOD = "transformers.models.qwen3_next.modeling_qwen3_next"
IDS = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(0))


_BUILT: list = []  # the models the running test built (disabled on teardown)


def _model(seed: int = 0):
    try:
        m = lt.tiny_random_model("qwen3-next", seed=seed)
    except ImportError as e:
        pytest.skip(str(e))
    _BUILT.append(m)
    return m


def _torch_only(fn):
    """``fn`` (a torch function of the modeling file) taking the keywords transformers' wrapper
    passes, dropping those ``fn`` does not name (as that wrapper does before calling it)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    return call


@pytest.fixture(autouse=True)
def torch_path(monkeypatch):
    """transformers' torch functions in place of FLA's / causal-conv1d's for the test; on teardown
    every model the test built is disabled and no router is left in the modeling module."""
    module = importlib.import_module(MOD)
    for name, fn in list(vars(module).items()):
        inner = inspect.unwrap(fn) if callable(fn) and hasattr(fn, "__wrapped__") else fn
        if inner is not fn and getattr(inner, "__module__", None) == MOD:
            monkeypatch.setattr(module, name, _torch_only(inner))  # was a hub / package wrapper
    if getattr(module, "FusedRMSNormGated", None) is not None:  # older transformers: FLA's norm
        monkeypatch.setattr(module, "FusedRMSNormGated", None)
    _BUILT.clear()
    try:
        yield
    finally:
        while _BUILT:
            lt.disable(_BUILT.pop())
        left = [name for name, f in vars(module).items() if isinstance(f, lt._Router)]
        for name in left:  # monkeypatch then puts back what was there before the test
            lt._ROUTERS.pop((MOD, name), None)
        assert not left, f"routers outlived their test: {left}"


def _copy(model):
    """A deep copy that the fixture disables on teardown."""
    c = copy.deepcopy(model)
    _BUILT.append(c)
    return c


@pytest.fixture
def routed(monkeypatch):
    """Counts the kernel calls that reached linattn (a router called while an enabled layer runs)."""
    calls = []
    original = lt._Router.__call__

    def spy(self, *args, **kwargs):
        calls.append(lt._ACTIVE.get() is not None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(lt._Router, "__call__", spy)
    return calls


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _halve(model):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)


def _reference(model):
    """The same weights on transformers' own path (a fresh model that was never enabled)."""
    ref = _model()
    ref.load_state_dict(model.state_dict())
    return _logits(ref)


def _kernel_global():
    import importlib

    return vars(importlib.import_module(MOD))["torch_chunk_gated_delta_rule"]


def test_a_deep_copy_runs_its_own_weights_through_linattn(routed):
    m = lt.enable(_model())
    c = _copy(m)
    _halve(c)  # the copy is now another model
    got = _logits(c)
    assert sum(routed) == 3, "the copy's three linear-attention layers must reach linattn"
    torch.testing.assert_close(got, _reference(c), rtol=1e-4, atol=1e-5)
    assert float((got - _logits(m)).abs().max()) > 1e-2  # not the original's weights
    layer = c.model.layers[0].linear_attn
    assert layer.forward.layer is layer and layer.forward.__wrapped__.__self__ is layer
    lt.disable(m)
    lt.disable(c)


def test_enable_and_disable_act_on_the_copy_only(routed):
    m = lt.enable(_model())
    c = _copy(m)
    assert lt.is_enabled(c) and lt.enabled_layers(c) == lt.enabled_layers(m)
    lt.disable(c)
    assert not lt.is_enabled(c) and lt.is_enabled(m)
    assert all("forward" not in layer.__dict__ for layer in c.modules())
    _logits(c)
    assert routed == [False] * 3  # the copy is on transformers' path; the router defers
    _logits(m)
    assert routed[3:] == [True] * 3  # the original still is on linattn's
    lt.enable(c, validate=False)
    assert c.model.layers[0].linear_attn.forward.options.validate is False
    assert m.model.layers[0].linear_attn.forward.options.validate is True
    lt.disable(m)
    lt.disable(c)
    assert not isinstance(_kernel_global(), lt._Router)  # the module's function is back


def test_a_copy_reinstalls_the_routers_after_the_original_is_disabled(routed):
    m = lt.enable(_model())
    c = _copy(m)
    lt.disable(m)
    assert not isinstance(_kernel_global(), lt._Router)  # the copy had not run yet
    got = _logits(c)
    assert routed == [True] * 3 and isinstance(_kernel_global(), lt._Router)
    torch.testing.assert_close(got, _reference(c), rtol=1e-4, atol=1e-5)
    lt.disable(c)
    assert not isinstance(_kernel_global(), lt._Router)


def test_torch_save_and_pickle_round_trips_of_an_enabled_model(routed):
    m = lt.enable(_model())
    want = _logits(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    for loaded in (torch.load(buf, weights_only=False), pickle.loads(pickle.dumps(m))):
        routed.clear()
        _BUILT.append(loaded)
        assert lt.is_enabled(loaded) and loaded.model.layers[0].linear_attn.forward.layer is \
            loaded.model.layers[0].linear_attn
        torch.testing.assert_close(_logits(loaded), want, rtol=0, atol=0)
        assert routed == [True] * 3
        lt.disable(loaded)
        assert not lt.is_enabled(loaded) and lt.is_enabled(m)
    lt.disable(m)


def test_a_state_dict_loads_into_a_fresh_enabled_model():
    m = lt.enable(_model(seed=1))
    plain = _model()
    assert m.state_dict().keys() == plain.state_dict().keys()  # nothing of linattn's in it
    fresh = lt.enable(_model(seed=2))
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(_logits(fresh), _logits(m), rtol=0, atol=0)
    assert lt.is_enabled(fresh)
    lt.disable(m)
    lt.disable(fresh)


def _hooked_forward(module, *args, **kwargs):
    """An accelerate-style instance forward: a partial over the module (deepcopy remaps it)."""
    module.hook_calls = getattr(module, "hook_calls", 0) + 1
    return type(module).forward(module, *args, **kwargs)


def test_an_instance_forward_set_before_enable_is_wrapped_and_copied_with_the_layer(routed):
    m = _model()
    for layer in (m.model.layers[i].linear_attn for i in range(3)):
        layer.forward = functools.partial(_hooked_forward, layer)
    lt.enable(m)
    c = _copy(m)
    _halve(c)
    got = _logits(c)
    assert routed == [True] * 3
    torch.testing.assert_close(got, _reference(c), rtol=1e-4, atol=1e-5)
    assert c.model.layers[0].linear_attn.hook_calls == 1 and not hasattr(m.model.layers[0].linear_attn, "hook_calls")
    lt.disable(c)
    assert isinstance(c.model.layers[0].linear_attn.forward, functools.partial)  # the hook is back
    lt.disable(m)
