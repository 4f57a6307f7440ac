"""Hugging Face transformers: route a model's linear-attention kernels to linattn, in one line.

    import linattn.integrations.transformers as lt
    model = lt.enable(AutoModelForCausalLM.from_pretrained(...))   # then model.generate(...) as usual
    lt.disable(model)                                               # back to the model's own path

Covered layers (whichever the installed transformers has; ``supported_layers()`` lists them):
Qwen3-Next ``Qwen3NextGatedDeltaNet``, Qwen3.5 ``Qwen3_5GatedDeltaNet`` / ``Qwen3_5MoeGatedDeltaNet``,
OLMo-hybrid ``OlmoHybridGatedDeltaNet`` (its negative-eigenvalue ``beta`` in ``(0, 2)`` included) and
Kimi-Linear ``KimiLinearDeltaAttention``. Their ``forward`` calls module-level functions of the
modeling file (``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``, Kimi's
``chunk_kimi_delta_attention`` / ``recurrent_kimi_delta_attention``), made by transformers'
``use_kernel_func_from_hub_with_fallback`` with FLA's signatures. Those are looked up in the
modeling module's globals at call time, not on the layer, so a per-instance attribute would not be
seen. The mechanism is therefore:

1. Each of those globals that an enabled layer's ``forward`` names is replaced, while at least one
   layer uses it, by a *router* that keeps the original object. The router sends a call to
   :mod:`linattn.compat.fla` only while an **enabled layer's** forward is running (a context
   variable set by 2.) and otherwise calls the original unchanged: other models, even of the same
   class, keep transformers' own path (FLA if installed, hub kernels if kernelized, else PyTorch).
2. Each enabled layer instance gets an instance-level ``forward``, a :class:`_RoutedForward`
   object that sets that context variable around the class's forward (an existing instance
   ``forward``, e.g. accelerate's hook, is wrapped and restored on ``disable``).

Copies (F35). The routed forward is plain data on the instance, not a closure: the layer it
runs, the instance ``forward`` it wraps (or None: the class's), and the options. ``copy.deepcopy``
remaps all three to the copy's own, ``pickle`` / ``torch.save`` store them, and a ``state_dict``
holds none of them (it is loaded into any model, enabled or not). So a copy of an enabled model is
an enabled model that runs its own layers and weights; ``is_enabled``, ``enabled_layers`` and
``disable`` read the instance (no registry keyed by the original), and a copy installs the
module-level routers it needs on its first call (in a fresh process too).

The router passes on the keywords FLA's function declares, as transformers' own wrapper does for
FLA (``cu_seqlens``, which Qwen-family layers fill from ``cu_seq_lens_q`` for packed sequences,
reaches linattn; other model keywords are dropped, exactly as with FLA installed).

Training: while grad mode is on and an input tensor requires grad, the router defers to the
model's own implementation and says so once in the log (linattn's ops are inference ops and would
raise :class:`linattn.GradModeError`). Under ``torch.no_grad()`` / ``inference_mode`` (``generate``
uses no_grad) linattn runs; :func:`linattn.last_decision` says which backend.

Why not transformers' kernel hub (``kernels`` + ``kernelize``): it replaces the forward of one
process-wide function module shared by every model of that class, needs the ``kernels`` package in
transformers' version window, and its ``LayerRepository`` resolves through the Hub; the patch above
affects only the given model and needs nothing beyond transformers.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch

import linattn
import linattn.compat.fla as fla
from linattn.dispatch import find_op
from linattn.dispatch.rules.validate import check_options

from linattn._namespace import public_dir

__all__ = ["enable", "disable", "is_enabled", "enabled_layers", "supported_layers", "tiny_random_model",
           "TINY_MODELS", "FUNCTIONS", "LAYERS"]
__dir__ = public_dir(__name__, __all__)

logger = logging.getLogger("linattn.integrations.transformers")

#: Module-level function names in transformers' modeling files -> the FLA function they stand for.
FUNCTIONS = {
    "torch_chunk_gated_delta_rule": "chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule",
    "chunk_kimi_delta_attention": "chunk_kda",
    "recurrent_kimi_delta_attention": "fused_recurrent_kda",
}

#: (modeling module, layer class) pairs known to call the functions above (transformers 5.17-5.23).
LAYERS = (
    ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet"),
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet"),
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"),
    ("transformers.models.olmo_hybrid.modeling_olmo_hybrid", "OlmoHybridGatedDeltaNet"),
    ("transformers.models.kimi_linear.modeling_kimi_linear", "KimiLinearDeltaAttention"),
)


@dataclass(frozen=True)
class _LayerOptions:
    backend: Optional[str]
    validate: bool


#: The enabled layer whose forward is running in this thread / task (None outside one).
_ACTIVE: contextvars.ContextVar[Optional[_LayerOptions]] = contextvars.ContextVar("linattn_hf_active_layer",
                                                                                  default=None)
_LOCK = threading.RLock()
_ROUTERS: dict = {}  # (module name, global name) -> _Router
_FUNCTIONS_OF: "weakref.WeakKeyDictionary[type, list]" = weakref.WeakKeyDictionary()  # layer class -> its globals
_ATTR = "_linattn_forward"  # the instance attribute naming an enabled layer's _RoutedForward
_WARNED: set = set()
#: per name of :data:`FUNCTIONS`: the parameter names of its linattn.compat.fla function (a table made at import,
#: read by every router made: enable() after the last disable() makes them again)
_PARAMS = {name: frozenset(inspect.signature(getattr(fla, target)).parameters) for name, target in FUNCTIONS.items()}


class _Router:
    """Stands in for one module-level kernel function; see the module docstring.

    From transformers 5.25 those functions are ``torch.nn.Module`` objects of the ``kernels`` package,
    and a layer that holds one is pickled by reference: on loading, ``kernels`` rebuilds it as
    ``type(module.<name>)()``, which reads the router while one is installed. So each router is an
    instance of its own subclass (:func:`_router_for`) whose call without arguments builds a new
    instance of the original's class, as that rebuild expects (a model pickled while enabled loads)."""

    #: the original's class where ``type(router)()`` must build one (:func:`_router_for`), else None
    _rebuilds: Optional[type] = None

    def __new__(cls, *args, **kwargs):
        if not args and not kwargs and cls._rebuilds is not None:  # kernels' rebuild by reference
            return cls._rebuilds()
        return super().__new__(cls)

    def __init__(self, module, name: str, original):
        self.module, self.name, self.original = module, name, original
        self.target = getattr(fla, FUNCTIONS[name])
        self.params = _PARAMS[name]
        self.layers: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # enabled layers seen using it
        functools.update_wrapper(self, original, updated=())

    @property
    def users(self) -> int:
        """How many live enabled layers use this router (it is removed when none is left)."""
        return len(self.layers)

    def __call__(self, *args, **kwargs):
        opts = _ACTIVE.get()
        if opts is None:
            return self.original(*args, **kwargs)
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in (*args, *kwargs.values())):
            key = ("grad", self.module.__name__, self.name)
            if key not in _WARNED:
                _WARNED.add(key)
                logger.warning("linattn: grad is required (training) in %s.%s; deferring to the model's own "
                               "implementation (linattn's ops are inference ops). Call under torch.no_grad() "
                               "or torch.inference_mode() to run linattn. (Said once.)",
                               self.module.__name__, self.name)
            return self.original(*args, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k in self.params}
        return fla._run_with_options(self.target, opts.backend, opts.validate, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<linattn router for {self.module.__name__}.{self.name} -> linattn.compat.fla.{self.target.__name__}>"


def _functions_of(layer: torch.nn.Module) -> list:
    """[(module, global name)] of the kernel functions (:data:`FUNCTIONS`) that this layer's
    class-level ``forward`` names, looked up in the globals of the module defining that forward."""
    for klass in type(layer).__mro__:
        fwd = klass.__dict__.get("forward")
        if fwd is not None:
            break
    else:
        return []
    fn = inspect.unwrap(fwd)
    code, module = getattr(fn, "__code__", None), sys.modules.get(getattr(fn, "__module__", ""), None)
    if code is None or module is None:
        return []
    return [(module, n) for n in FUNCTIONS if n in code.co_names and n in vars(module)]


def supported_layers() -> list:
    """Names of the layer classes the installed transformers has (of :data:`LAYERS`)."""
    import importlib

    out = []
    for mod, cls in LAYERS:
        try:
            if hasattr(importlib.import_module(mod), cls):
                out.append(cls)
        except ImportError:
            pass
    return out


def _functions_cached(layer: torch.nn.Module) -> list:
    funcs = _FUNCTIONS_OF.get(type(layer))
    if funcs is None:
        funcs = _FUNCTIONS_OF[type(layer)] = _functions_of(layer)
    return funcs


def _install(layer: torch.nn.Module) -> None:
    """The routers of every kernel function ``layer``'s forward names, in place in their modules
    (installed when missing: after a copy, an unpickling or the last other layer's ``disable``),
    each knowing that ``layer`` uses it."""
    with _LOCK:
        for module, name in _functions_cached(layer):
            router = vars(module).get(name)
            if not isinstance(router, _Router):
                router = _router_for(router)(module, name, router)
                setattr(module, name, router)
                _ROUTERS[(module.__name__, name)] = router
            router.layers.add(layer)


def _router_for(original) -> type:
    """:class:`_Router`, or for an original that is a ``torch.nn.Module`` (transformers 5.25+) a
    subclass whose call without arguments builds a new instance of the original's class (the rebuild
    ``kernels`` does when a model that holds the original is unpickled)."""
    if not isinstance(original, torch.nn.Module):
        return _Router
    return type("_Router", (_Router,), {"_rebuilds": type(original), "__module__": __name__})


def _release(layer: torch.nn.Module) -> None:
    """``layer`` no longer uses its routers; a router no live enabled layer uses is removed."""
    for module, name in _functions_cached(layer):
        router = vars(module).get(name)
        if not isinstance(router, _Router):
            continue
        router.layers.discard(layer)
        if not router.layers:
            setattr(module, name, router.original)
            _ROUTERS.pop((module.__name__, name), None)


class _RoutedForward:
    """An enabled layer's instance ``forward``: runs the layer's own forward (``inner``, the
    instance ``forward`` it replaced, or None for the class's) with the layer's options active.

    Plain data, so that ``copy.deepcopy`` maps ``layer`` and ``inner`` to the copy's and pickling
    stores them (F35); ``self`` is resolved at call time through ``layer``, never captured in a
    closure.
    """

    def __init__(self, layer: torch.nn.Module, inner, options: Optional[_LayerOptions]):
        self.layer, self.inner, self.options = layer, inner, options

    def __call__(self, *args, **kwargs):
        layer = self.layer
        if self.options is None:  # disabled while another wrapper still calls this one
            return self.__wrapped__(*args, **kwargs)
        if not all(isinstance(vars(m).get(n), _Router) and layer in vars(m)[n].layers
                   for m, n in _functions_cached(layer)):
            _install(layer)  # a copy's or an unpickled model's first call
        token = _ACTIVE.set(self.options)
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    @property
    def __wrapped__(self):
        """The forward this one runs, bound to its layer (``inspect.signature`` follows it)."""
        return self.inner if self.inner is not None else type(self.layer).forward.__get__(self.layer)

    def __repr__(self) -> str:
        return f"<linattn routed forward of {type(self.layer).__name__} (backend={self.options.backend or 'auto'})>"


def _routed(layer: torch.nn.Module) -> Optional[_RoutedForward]:
    rf = layer.__dict__.get(_ATTR)
    return rf if isinstance(rf, _RoutedForward) and rf.layer is layer else None


def _check_enable_args(model, backend: Optional[str], validate: bool) -> None:
    """:func:`enable`'s arguments, checked before any layer is touched (a bad backend name would
    otherwise only fail at the first forward)."""
    where = "linattn.integrations.transformers.enable"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module (a *ForCausalLM, a bare model or a layer), got "
                        f"{type(model).__name__}")
    check_options(validate, where=where)
    if backend is None:
        return
    if not isinstance(backend, str):
        raise TypeError(f"{where}: backend must be a backend's name (a string) or None, got {type(backend).__name__}")
    known = linattn.list_backends()
    if backend not in known:
        raise ValueError(f"{where}: backend={backend!r} is not a registered backend; registered: "
                         f"{', '.join(sorted(known))} (`linattn backends` lists them), or None to let the "
                         "dispatcher choose")


#: rejection reasons of a forced backend that hold for every shape (it cannot run the op on that device at all)
_WHOLE_DEVICE = frozenset({"op", "device", "arch", "toolchain", "disabled", "plugin_load_failed", "api_version"})


def _family(name: str) -> str:
    """``"kda"`` or ``"gdn"``: the family of a kernel function of :data:`FUNCTIONS`."""
    return "kda" if FUNCTIONS[name].endswith("kda") else "gdn"


def _forced_refusal(layers: list, backend: Optional[str]) -> str:
    """Why the forced ``backend`` can run neither the prefill nor the decode of the ``(name, layer)`` pairs'
    family on a layer's execution device whatever the shapes (:func:`_phase_refusal`), or "" (none forced,
    layers without a known device, or a backend that runs one phase: the other phase's refusal is logged,
    and its calls raise :class:`linattn.NoBackendError`, e.g. a prefill-only backend for scoring)."""
    if backend is None:
        return ""
    where = set()
    for _, layer in layers:
        device, dtype = _execution_device(layer)
        if device is not None:
            where |= {(_family(n), device, dtype) for _, n in _functions_cached(layer)}
    for family, device, dtype in sorted(where, key=str):
        refusals = [why for why in (_phase_refusal(find_op(family, phase), t, device, dtype, backend)
                                    for phase, t in (("prefill", 64), ("decode", 1))) if why]
        if len(refusals) == 2:
            return "; ".join(refusals)
        for why in refusals:
            logger.warning("linattn.integrations.transformers.enable: %s; those calls will raise NoBackendError", why)
    return ""


def _execution_device(layer: torch.nn.Module) -> tuple:
    """``(device, dtype name)`` a layer runs on: accelerate's hook's execution device where it has one (an
    offloaded layer's parameters are on the CPU or meta), else its first parameter's; ``(None, ...)`` for a
    layer without parameters or on the meta device."""
    param = next(layer.parameters(), None)
    dtype = str(param.dtype).removeprefix("torch.") if param is not None else "float32"
    dtype = dtype if dtype in ("float32", "bfloat16", "float16", "float64") else "float32"
    device = getattr(getattr(layer, "_hf_hook", None), "execution_device", None)
    if device is not None:
        try:
            return torch.device(device), dtype  # accelerate gives an index, a string or a device
        except (RuntimeError, TypeError, ValueError):  # e.g. an index on a host without that accelerator
            return None, dtype
    if param is None or param.device.type == "meta":
        return None, dtype
    return param.device, dtype


def _phase_refusal(op: str, t: int, device: torch.device, dtype: str, backend: str) -> str:
    """Why ``backend``, forced, cannot run ``op`` on ``device`` whatever the shapes (a rejection with a reason of
    :data:`_WHOLE_DEVICE`'s kinds, by :func:`linattn.explain` on a nominal problem), or ""."""
    problem = linattn.Problem(op=op, n=1, t=t, h=1, hv=1, k=64, v=64, dtype=dtype)
    try:
        decision = linattn.explain(problem, device, backend=backend)
    except (ValueError, RuntimeError):  # a device explain cannot describe: the calls decide
        return ""
    if decision.chosen is not None:
        return ""
    why = next((f for f in decision.verdict(backend).reasons if f.reason in _WHOLE_DEVICE), None)
    return f"backend={backend!r} cannot run {op} on {device}: {why.message}" if why is not None else ""


def enable(model: torch.nn.Module, *, backend: Optional[str] = None, validate: bool = True) -> torch.nn.Module:
    """Route ``model``'s linear-attention kernels to linattn (idempotent); returns ``model``.

    Args:
        model: any ``nn.Module`` containing the layers of :data:`LAYERS` (a ``*ForCausalLM``, a bare
            model, or a single layer), on any device linattn has a backend for.
        backend: force a linattn backend by name for this model (None: the dispatcher chooses).
        validate: linattn's value checks (one device sync per call); False skips them.
    Returns:
        ``model``, unchanged apart from its linear-attention layers' instance ``forward``.
    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``backend`` is not a string or ``validate`` not a bool.
        ValueError: ``backend`` is not a registered backend's name, can run neither the model's prefill
            nor its decode on the layers' device whatever the shapes (e.g. a CUDA-only backend on a CPU),
            or the model has no supported linear-attention layer.
    """
    _check_enable_args(model, backend, validate)
    opts = _LayerOptions(backend, validate)
    with _LOCK:
        layers = [(name, layer) for name, layer in model.named_modules() if _functions_cached(layer)]
        if not layers:
            raise ValueError(f"linattn.integrations.transformers.enable: {type(model).__name__} has no linear-attention "
                             f"layer linattn knows ({', '.join(c for _, c in LAYERS)}); nothing was changed.")
        refusal = _forced_refusal(layers, backend)
        if refusal:
            raise ValueError(f"linattn.integrations.transformers.enable: {refusal}; nothing was changed (backend=None "
                             "lets the dispatcher choose).")
        for name, layer in layers:
            rf = _routed(layer)
            if rf is not None:
                if rf.options == opts:
                    continue  # idempotent
                _undo(layer, name)  # enabled again with other options: they apply
            rf = _RoutedForward(layer, layer.__dict__.get("forward"), opts)
            layer.__dict__["forward"] = layer.__dict__[_ATTR] = rf
            _install(layer)
    logger.info("linattn: %d linear-attention layer(s) of %s routed to linattn (backend=%s).", len(layers),
                type(model).__name__, backend or "auto")
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable` for ``model``'s layers (a no-op for layers not enabled); returns ``model``.
    A module-level function is restored once no enabled layer uses it."""
    with _LOCK:
        for name, layer in model.named_modules():
            if _routed(layer) is not None:
                _undo(layer, name)
    return model


def _undo(layer: torch.nn.Module, name: str) -> None:
    """Put back the layer's own forward (unless something wrapped ours since: then it is left, with
    a warning, so that wrapper is not lost) and release the module-level routers."""
    rf = layer.__dict__.pop(_ATTR)
    rf.options = None  # routes nothing from now on, wherever it is still called from
    if layer.__dict__.get("forward") is rf:
        if rf.inner is not None:
            layer.__dict__["forward"] = rf.inner
        else:
            layer.__dict__.pop("forward", None)
    else:
        logger.warning("linattn: %s.forward was wrapped again after enable(); leaving that wrapper in place "
                       "(its calls no longer reach linattn once the routers are released)", name or "layer")
    _release(layer)


def is_enabled(model: torch.nn.Module) -> bool:
    """True when at least one layer of ``model`` (or of a copy made of it after enable) is routed to linattn."""
    return any(_routed(m) is not None for m in model.modules())


def enabled_layers(model: torch.nn.Module) -> list:
    """Qualified names of ``model``'s layers routed to linattn."""
    return [name for name, m in model.named_modules() if _routed(m) is not None]


# -- tiny random models (examples, tests) -------------------------------------------------------------------

#: Small configs (4 layers: 3 linear-attention + 1 full attention, head dims 64) by short name.
TINY_MODELS = {
    "qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64,
        linear_value_head_dim=64, layer_types=["linear_attention"] * 3 + ["full_attention"])),
    "qwen3.5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=64, linear_value_head_dim=64, layer_types=["linear_attention"] * 3 + ["full_attention"])),
    "kimi-linear": ("KimiLinearConfig", "KimiLinearForCausalLM", dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=64, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        linear_num_heads=2, linear_head_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        layer_types=["linear_attention"] * 3 + ["full_attention"], mlp_layer_types=["dense"] * 4)),
    "olmo-hybrid": ("OlmoHybridConfig", "OlmoHybridForCausalLM", dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_allow_neg_eigval=True, pad_token_id=0, eos_token_id=2, bos_token_id=1,
        layer_types=["linear_attention"] * 3 + ["full_attention"])),
}


def _per_layer_lists(kwargs: dict, overrides: dict) -> dict:
    """The per-layer lists of a tiny config (``layer_types``, Kimi's ``mlp_layer_types``) for an overridden
    ``num_hidden_layers`` that the overrides give no list for: the tiny pattern (three linear-attention
    layers, then one full attention) repeated to that length, the last layer full attention below four
    layers (transformers' generate needs one), every MLP dense."""
    n = overrides.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:  # not a layer count: the config class decides
        return {}
    out = {}
    if "layer_types" in kwargs and "layer_types" not in overrides:
        if n < 2:
            raise ValueError(f"tiny_random_model: num_hidden_layers={n} leaves no linear-attention layer (the last is "
                             "full attention, which transformers' generate needs); pass 2 or more, or a layer_types")
        out["layer_types"] = ["full_attention" if i % 4 == 3 or i == n - 1 < 3 else "linear_attention" for i in range(n)]
    if "mlp_layer_types" in kwargs and "mlp_layer_types" not in overrides:
        out["mlp_layer_types"] = ["dense"] * n
    return out


def tiny_random_model(name: str, *, device: Any = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                      **overrides) -> torch.nn.Module:
    """A randomly initialised tiny model from transformers' own config class (nothing downloaded).

    Args:
        name: a key of :data:`TINY_MODELS` (``"qwen3-next"``, ``"qwen3.5"``, ``"kimi-linear"``,
            ``"olmo-hybrid"``).
        device, dtype: where and in which dtype the model lives. seed: the weights' seed (drawn from a
            forked generator: the caller's torch random state is left as it was).
        **overrides: config fields to change (each a field of the model's config class; a change of
            ``num_hidden_layers`` without a ``layer_types`` repeats the tiny pattern, three linear-attention
            layers then one full attention, to that length; below four layers the last is full attention, and
            one layer is a ValueError: it would leave no linear-attention layer).
    Returns:
        the ``*ForCausalLM`` model in eval mode.
    Raises:
        KeyError: unknown name (the message lists the known ones). TypeError: an override that is no
        field of the config class. ValueError: ``num_hidden_layers=1`` without a ``layer_types``.
        ImportError: the installed transformers lacks that model.
    """
    import transformers

    if name not in TINY_MODELS:
        raise KeyError(f"tiny_random_model: unknown model {name!r}; known: {', '.join(TINY_MODELS)}")
    cfg_name, model_name, kwargs = TINY_MODELS[name]
    if not hasattr(transformers, cfg_name):
        raise ImportError(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg_cls = getattr(transformers, cfg_name)
    unknown = sorted(set(overrides) - set(cfg_cls(**kwargs).to_dict())) if overrides else []
    if unknown:
        raise TypeError(f"tiny_random_model: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a field "
                        f"of {cfg_name} (a misspelt override would be kept silently as an unused attribute)")
    kwargs = {**kwargs, **_per_layer_lists(kwargs, overrides)}
    config = cfg_cls(**{**kwargs, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)(config)
    return model.to(device=device, dtype=dtype).eval()
