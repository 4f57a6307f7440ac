"""linattn.integrations.transformers on tiny random models built from transformers' own configs
(4 layers, head dims 64, nothing downloaded), fp32 on the CPU: greedy generation token-identical to
transformers' own PyTorch path, prefill logits within 1e-4 relative, packed varlen prefill through
``cu_seq_lens_q``, per-model routing, the grad-mode deferral, disable."""

from __future__ import annotations

import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

import linattn  # noqa: E402
import linattn.compat.fla as fla  # noqa: E402
import linattn.integrations.transformers as lt  # noqa: E402

NAMES = list(lt.TINY_MODELS)
PROMPT = 70  # longer than one chunk (64)
NEW = 5
FAMILY = {"kimi-linear": "kda"}


def _model(name):
    try:
        return lt.tiny_random_model(name, seed=0)
    except ImportError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module", params=NAMES)
def model(request):
    m = _model(request.param)
    m.tiny_name = request.param
    yield m
    lt.disable(m)


def _prompts(case):
    gen = torch.Generator().manual_seed(1)
    if case == "batch1":
        return torch.randint(3, 256, (1, PROMPT), generator=gen), None
    ids = torch.randint(3, 256, (2, PROMPT), generator=gen)
    if case == "batch2":
        return ids, None
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding of row 1
    ids[1, :7] = 0
    return ids, mask


def _generate(m, ids, mask):
    with torch.no_grad():
        return m.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


def test_prefill_logits_close(model):
    ids, _ = _prompts("batch2")
    lt.disable(model)
    with torch.no_grad():
        ref = model(ids).logits
    lt.enable(model)
    with torch.no_grad():
        got = model(ids).logits
    fam = FAMILY.get(model.tiny_name, "gdn")
    assert linattn.last_decision().op == f"{fam}_prefill"
    rel = float((got - ref).abs().max() / ref.abs().max())
    print(f"{model.tiny_name}: fp32 prefill logits max rel diff {rel:.2e}")
    assert rel < 1e-4


@pytest.mark.parametrize("case", ["batch1", "batch2", "left_padded"])
def test_greedy_generation_token_identical(model, case):
    ids, mask = _prompts(case)
    lt.disable(model)
    ref = _generate(model, ids, mask)
    lt.enable(model)
    got = _generate(model, ids, mask)
    fam = FAMILY.get(model.tiny_name, "gdn")
    assert linattn.last_decision().op == f"{fam}_{fla.recurrent_route(fam)}"
    assert got.shape == (ids.shape[0], PROMPT + NEW)
    assert torch.equal(got, ref), f"{model.tiny_name} {case}: tokens differ\n{got[:, PROMPT:]}\n{ref[:, PROMPT:]}"


@pytest.mark.parametrize("name", ["qwen3-next", "qwen3.5", "olmo-hybrid"])
def test_packed_varlen_prefill(name):
    """Packed sequences in one row with ``cu_seq_lens_q`` (the Qwen-family / OLMo layers pass it as
    ``cu_seqlens``) equal each sequence run alone through transformers' own path. The conv's taps on
    earlier tokens are zeroed: transformers' PyTorch conv does not honour ``cu_seq_lens_q``."""
    m = _model(name)
    layer = m.model.layers[0].linear_attn
    with torch.no_grad():
        layer.conv1d.weight[..., :-1] = 0
    cu = torch.tensor([0, 20, 90, 101])
    x = torch.randn(1, 101, m.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = torch.cat([layer(x[:, s:e]) for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], dim=1)
        lt.enable(m)
        got = layer(x, cu_seq_lens_q=cu)
    assert linattn.last_decision().op == "gdn_prefill" and linattn.last_decision().problem.n == 3
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    lt.disable(m)


def test_enable_is_idempotent_and_disable_restores():
    m = _model("qwen3-next")
    mod = transformers.models.qwen3_next.modeling_qwen3_next
    originals = {n: getattr(mod, n) for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")}
    assert lt.enable(m) is m and lt.enable(m) is m
    assert lt.is_enabled(m) and len(lt.enabled_layers(m)) == 3
    router = mod.torch_chunk_gated_delta_rule
    assert isinstance(router, lt._Router) and router.users == 3 and router.original is originals[
        "torch_chunk_gated_delta_rule"]
    lt.disable(m)
    assert not lt.is_enabled(m)
    for n, f in originals.items():
        assert getattr(mod, n) is f
    assert all("forward" not in layer.__dict__ for layer in m.modules())
    assert lt.disable(m) is m  # a no-op the second time


def test_enable_and_disable_walk_named_modules():
    """enable / disable walk ``named_modules()``: a module shared by two parents once, a None child skipped; a
    layer reached twice is enabled once."""
    m = _model("qwen3-next")
    wrapper = torch.nn.ModuleDict({"a": m, "b": torch.nn.Sequential(torch.nn.Identity(), m.model.layers[0])})
    wrapper.b.register_module("empty", None)
    assert lt.enabled_layers(lt.enable(wrapper)) == [n for n, _ in wrapper.named_modules()
                                                   if n.endswith("linear_attn")]
    lt.disable(wrapper)
    assert not lt.is_enabled(m)


def test_only_the_enabled_model_is_routed():
    a, b = _model("olmo-hybrid"), _model("olmo-hybrid")
    lt.enable(a)
    router = transformers.models.olmo_hybrid.modeling_olmo_hybrid.torch_chunk_gated_delta_rule
    seen = []
    inner = router.target

    def spy(*args, **kwargs):
        seen.append(float(kwargs["beta"].max()))
        return inner(*args, **kwargs)

    router.target = spy
    ids, _ = _prompts("batch1")
    try:
        with torch.no_grad():
            b(ids)
            assert seen == [], "a model that was not enabled must keep its own path"
            a(ids)
    finally:
        router.target = inner
        lt.disable(a)
    assert len(seen) == 3
    # OLMo-hybrid's allow_neg_eigval: beta = 2 * sigmoid, in (0, 2); accepted and used as given
    assert a.model.layers[0].linear_attn.allow_neg_eigval and max(seen) > 1.0


def test_grad_mode_defers_to_the_model(caplog):
    m = _model("kimi-linear")
    ids, _ = _prompts("batch1")
    ids = ids[:, :20]
    with torch.no_grad():
        ref = m(ids).logits
    lt.enable(m)
    lt._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="linattn.integrations.transformers"):
        out = m(ids).logits  # grad on, parameters require grad: the model's own implementation
        m(ids)
    msgs = [r.message for r in caplog.records if "deferring" in r.message]
    assert len(msgs) == 1 and "grad is required" in msgs[0]  # chunk_kda said once
    assert out.requires_grad
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-6)
    lt.disable(m)


def test_enable_refuses_a_model_without_linear_attention():
    with pytest.raises(ValueError, match="no linear-attention layer"):
        lt.enable(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("model, needle", [("x", "got str"), (None, "got NoneType")])
def test_enable_refuses_what_is_not_a_module_with_a_type_error(model, needle):
    with pytest.raises(TypeError, match=f"model must be a torch.nn.Module.*{needle}"):
        lt.enable(model)


def test_enable_checks_the_backend_name_before_routing_anything():
    m = _model(NAMES[0])
    with pytest.raises(ValueError, match=r"backend='nope' is not a registered backend; registered: .*torch-ref"):
        lt.enable(m, backend="nope")
    assert not lt.is_enabled(m)
    with pytest.raises(TypeError, match="backend must be a backend's name"):
        lt.enable(m, backend=3)
    try:
        assert lt.enable(m, backend="torch-ref") is m and lt.is_enabled(m)
    finally:
        lt.disable(m)


def test_a_forced_backend_that_runs_one_phase_is_enabled_with_a_warning(caplog):
    """A prefill-only backend (no decode) serves scoring and use_cache=False runs: enabled; the decode's refusal
    is logged, and a decode call raises NoBackendError."""
    from linattn.backends.torch_ref import TorchRefBackend

    class PrefillOnly(TorchRefBackend):
        name = "prefill-only-test"
        ops = frozenset({"gdn_prefill", "kda_prefill"})

    from linattn.dispatch.runtime.registry import get_registry
    from linattn.dispatch.plugin.hookspecs import BackendPlugin

    registry = get_registry()
    registry.add_plugin(BackendPlugin(PrefillOnly), name="prefill-only-plugin")
    m = _model(NAMES[0])
    try:
        with caplog.at_level("WARNING", logger="linattn.integrations.transformers"):
            lt.enable(m, backend="prefill-only-test")
        assert lt.is_enabled(m)
        assert "cannot run gdn_decode on cpu" in caplog.text and "NoBackendError" in caplog.text
        ids = torch.randint(3, 200, (1, 70), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            m(ids, use_cache=False)  # the prefill runs
            assert linattn.last_decision("gdn_prefill").chosen == "prefill-only-test"
            with pytest.raises(linattn.NoBackendError):  # the decode of a generate does not
                m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        lt.disable(m)
        registry.remove_plugin("prefill-only-plugin")


class _Hook:
    def __init__(self, execution_device):
        self.execution_device = execution_device


@pytest.mark.parametrize("hook, want", [(None, "cpu"), ("cpu", "cpu"), (torch.device("cpu"), "cpu"),
                                        ("not a device", None)])
def test_the_execution_device_is_accelerates_where_a_layer_has_a_hook(hook, want):
    m = _model(NAMES[0])
    layer = next(layer for _, layer in m.named_modules() if lt._functions_cached(layer))
    if hook is not None:
        layer._hf_hook = _Hook(hook)
    device, dtype = lt._execution_device(layer)
    assert (None if device is None else str(device)) == want and dtype == "float32"


def test_offloaded_layers_are_checked_on_their_execution_device_and_meta_ones_not_at_all():
    """Parameters on the meta device (offloaded) with accelerate's hook naming the CPU: a CUDA-only backend is
    refused; without the hook nothing is known of the device, and nothing is refused."""
    m = _model(NAMES[0]).to("meta")
    layers = [(name, layer) for name, layer in m.named_modules() if lt._functions_cached(layer)]
    assert lt._execution_device(layers[0][1])[0] is None
    assert lt._forced_refusal(layers, "cutedsl") == ""
    try:
        assert lt.enable(m, backend="cutedsl") is m and lt.is_enabled(m)
    finally:
        lt.disable(m)
    for _, layer in layers:
        layer._hf_hook = _Hook("cpu")
    assert "backend='cutedsl' cannot run gdn_prefill on cpu" in lt._forced_refusal(layers, "cutedsl")


def test_enable_refuses_a_forced_backend_that_cannot_run_on_the_models_device():
    """Refused at enable, nothing routed (not at the first forward): a backend of another device (cutedsl:
    CUDA only), or one the policy disables."""
    m = _model(NAMES[0])
    with pytest.raises(ValueError, match="backend='cutedsl' cannot run gdn_prefill on cpu: .*nothing was changed"):
        lt.enable(m, backend="cutedsl")
    assert not lt.is_enabled(m)
    with linattn.policy(disable="torch-ref"):
        with pytest.raises(ValueError, match="backend='torch-ref' cannot run gdn_prefill on cpu"):
            lt.enable(m, backend="torch-ref")
    assert not lt.is_enabled(m)


@pytest.mark.parametrize("value", ["no", None, 1])
def test_enable_refuses_a_validate_that_is_no_bool(value):
    m = _model(NAMES[0])
    with pytest.raises(TypeError, match="validate must be a bool"):
        lt.enable(m, validate=value)
    assert not lt.is_enabled(m)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_random_model_of_other_depths_generates_the_models_tokens(name):
    """``num_hidden_layers`` alone: the layer lists follow it (one layer: no linear-attention layer, refused)."""
    ids = torch.randint(3, 200, (1, 6), generator=torch.Generator().manual_seed(0))
    for n in (2, 6):
        m = lt.tiny_random_model(name, num_hidden_layers=n)
        assert m.config.layer_types[-1 if n == 2 else 3] == "full_attention"
        with torch.no_grad():
            want = m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
            lt.enable(m)
            got = m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
        assert len(lt.enabled_layers(m)) == n - 1 and torch.equal(got, want)
    with pytest.raises(ValueError, match="num_hidden_layers=1 leaves no linear-attention layer"):
        lt.tiny_random_model(name, num_hidden_layers=1)
    assert lt._per_layer_lists({"layer_types": []}, {"num_hidden_layers": True}) == {}  # no count: the config decides


def test_supported_layers():
    assert {"Qwen3NextGatedDeltaNet", "KimiLinearDeltaAttention"} <= set(lt.supported_layers())


def test_tiny_random_model_names_its_models_refuses_unknown_overrides_and_keeps_the_callers_rng():
    with pytest.raises(KeyError, match="known: qwen3-next, qwen3.5, kimi-linear, olmo-hybrid"):
        lt.tiny_random_model("qwen3")
    with pytest.raises(TypeError, match="num_hidden_layer is not a field of Qwen3NextConfig"):
        lt.tiny_random_model("qwen3-next", num_hidden_layer=2)  # misspelt: would be kept as an unused attribute
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    a = lt.tiny_random_model("qwen3-next", rms_norm_eps=1e-5)
    assert torch.equal(torch.rand(3), want)  # the caller's generator as it was
    b = lt.tiny_random_model("qwen3-next")
    assert a.config.rms_norm_eps == 1e-5 and all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
