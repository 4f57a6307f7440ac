"""linattn: the fastest correct linear-attention kernel on whatever hardware you run, and why.

Public API (shapes in each docstring; the contract is docs/ops.md):
    ops:        gdn_gating, kda_gating, gdn_decode, kda_decode, gdn_prefill, kda_prefill,
                silu_and_mul_clamp; context_parallel_prefill (docs/context-parallel.md)
    decisions:  explain(Problem | op, device=..., **shape), last_decision(), policy(...)
    inventory:  list_backends(), list_plugins(), device_capabilities(device), presets()

(``linattn.backends``, ``linattn.capabilities``, ``linattn.dispatch`` and ``linattn.kernels`` are
subpackages, so the inventory functions carry other names.)
"""

from __future__ import annotations

from linattn._namespace import public_dir
from linattn.capabilities import DeviceCapabilities, probe
from linattn.dispatch import Decision, NoBackendError, Problem, Reason, last_decision, policy
from linattn.dispatch import explain as _explain
from linattn.ops import (BackendRunError, GradModeError, gdn_decode, gdn_gating, gdn_prefill, kda_decode, kda_gating,
                         kda_prefill, silu_and_mul_clamp)
from linattn.presets import ModelPreset, preset, presets

__version__ = "0.1.0"


def explain(problem: "Problem | str", device=None, *, backend: "str | None" = None, model: "str | None" = None,
            **shape) -> Decision:
    """The decision trace for a problem: a verdict for every backend, and the one chosen.

    Args:
        problem: a :class:`Problem`, or an op name with the shape as keywords (``n=4096, h=16, ...``,
            the :class:`Problem` fields).
        device: a profile name (``"sm90"``, ``"sm100"``, ``"mi300x"``, ``"xpu-pvc"``, ``"cpu"``), a
            torch device, or None for the CPU.
        backend: force a backend by name.
        model: with an op name: a model preset (``"qwen3-next"``, ``"kimi-linear"``, ...) whose head
            counts and dims fill the problem, as ``linattn explain OP --model``; keywords override them.
    Returns:
        Decision.
    Raises:
        ValueError: an unknown device or profile (checked first, so a bad profile is named as such
            whatever the shape), an unknown op, model, field or value (the message names the allowed
            ones), a model of another family, or ``model=`` / keywords given with a :class:`Problem`.
    Example:
        >>> import linattn
        >>> linattn.explain("gdn_decode", "cpu", n=8, h=16, hv=32, k=128, v=128).chosen
        'torch-chunked'
        >>> linattn.explain("gdn_decode", "cpu", model="qwen3-next", n=8).problem.hv
        32
    """
    from linattn.dispatch import resolve_device

    caps = resolve_device(device)  # a bad device or profile is the error, not the fields the shape lacks
    if isinstance(problem, Problem):
        if model is not None or shape:
            given = ", ".join([*(["model"] if model is not None else []), *shape])
            raise ValueError(f"explain() got a Problem and also {given}: pass the Problem alone, or an op name "
                             f"with model= and shape keywords")
    else:
        from linattn.presets import make_problem, preset_shape

        base = preset_shape(problem, model) if model is not None else {}
        problem = make_problem(problem, **{**base, **shape})
    return _explain(problem, caps, backend=backend)


def __getattr__(name: str):
    """``linattn.context_parallel_prefill``, imported on first use: :mod:`linattn.context_parallel`
    needs ``torch.distributed``'s collectives, which ``import linattn`` leaves alone."""
    if name == "context_parallel_prefill":
        from linattn.context_parallel import context_parallel_prefill

        globals()[name] = context_parallel_prefill
        return context_parallel_prefill
    raise AttributeError(f"module 'linattn' has no attribute {name!r}")


def list_backends() -> dict:
    """Registered backends by name (instances of ``linattn.backends.base.Backend``)."""
    from linattn.dispatch import get_registry

    return dict(get_registry().backends)


def list_plugins() -> list:
    """Every plugin seen (built-in and external) with its status."""
    from linattn.dispatch import get_registry

    return list(get_registry().plugins)


def device_capabilities(device=None) -> DeviceCapabilities:
    """Probed capabilities of ``device`` (default the CPU), or of a named profile."""
    from linattn.dispatch import resolve_device

    return resolve_device(device)


__all__ = [
    "BackendRunError", "Decision", "GradModeError", "DeviceCapabilities", "ModelPreset", "NoBackendError", "Problem", "Reason",
    "context_parallel_prefill", "device_capabilities", "explain", "gdn_decode", "gdn_gating", "gdn_prefill", "kda_decode", "kda_gating",
    "kda_prefill", "last_decision", "list_backends", "list_plugins", "policy", "preset", "presets", "probe", "silu_and_mul_clamp",
]

#: Subpackages users import (``linattn.testing``, ...); ``dir(linattn)`` lists those already imported.
_SUBPACKAGES = ("backends", "capabilities", "compat", "dispatch", "integrations", "kernels", "testing")
__dir__ = public_dir(__name__, __all__, _SUBPACKAGES)
