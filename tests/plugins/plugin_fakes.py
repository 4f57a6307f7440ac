"""Backends, plugins and distributions the plugin tests register, each odd in one known way.

``make_distribution`` writes a tiny installed distribution (``<name>-<ver>.dist-info`` with
``METADATA`` and ``entry_points.txt``, plus the plugin modules) into a folder on ``sys.path``:
``importlib.metadata`` discovers it exactly as it discovers a pip-installed one, and no pip runs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from linattn.backends.torch_ref import TorchRefBackend
from linattn.dispatch.plugin.hookspecs import BackendPlugin, hookimpl


class Plugin(BackendPlugin):
    """:class:`BackendPlugin` that may also answer the device-probe hook."""

    def __init__(self, *classes, probe=None):
        super().__init__(*classes)
        self.probe = probe

    @hookimpl
    def linattn_probe_device(self, device):
        return self.probe(device) if self.probe is not None else None


class GdnOnCpu(TorchRefBackend):
    """torch-ref's GDN decode and prefill, fp32, on CPUs, ranked last: the base of the fakes below that get one
    thing wrong each."""

    ops = frozenset({"gdn_decode", "gdn_prefill"})
    vendors = frozenset({"cpu"})
    dtypes = frozenset({"float32"})
    state_dtypes = frozenset({"float32"})

    def rank(self, p, caps) -> int:
        return 900


class IgnoresPadding(GdnOnCpu):
    """Correct maths, but reads a padding index -1 the way Python indexing does: the last slot."""

    name = "ignores-padding"

    @staticmethod
    def _wrap(state_pool, state_indices):
        return torch.where(state_indices < 0, state_indices + state_pool.shape[0], state_indices)

    def gdn_decode(self, *, state_pool, state_indices, **kw):
        return super().gdn_decode(state_pool=state_pool, state_indices=self._wrap(state_pool, state_indices), **kw)

    def gdn_prefill(self, *, state_pool=None, state_indices=None, **kw):
        if state_pool is not None:
            state_indices = self._wrap(state_pool, state_indices)
        return super().gdn_prefill(state_pool=state_pool, state_indices=state_indices, **kw)


class AcceptsEverything(TorchRefBackend):
    """Declares fp32 only, but its dtype predicate accepts any dtype (and computes bf16 as fp32)."""

    name = "accepts-everything"
    ops = frozenset({"silu_and_mul_clamp"})
    vendors = frozenset({"cpu"})
    dtypes = frozenset({"float32"})

    def supports_dtype(self, p, caps):
        from linattn.dispatch.plugin.verdict import Check

        return Check.passed()


class RaisesInRun(TorchRefBackend):
    """Eligible for ``silu_and_mul_clamp`` on CPUs and ranked first, but every run raises."""

    name = "raises-in-run"
    ops = frozenset({"silu_and_mul_clamp"})
    vendors = frozenset({"cpu"})

    def rank(self, p, caps) -> int:
        return 1

    def silu_and_mul_clamp(self, *, x, limit=None):
        raise RuntimeError("vendor kernel crashed")


class Mangles(TorchRefBackend):
    """Computes the reference, then returns ``mangle(result)``: a result that breaks the contract in
    one known way. CPU only, ranked first. Make one with :func:`mangling`."""

    vendors = frozenset({"cpu"})

    @staticmethod
    def mangle(result):
        return result

    def rank(self, p, caps) -> int:
        return 1

    def run(self, op: str, **kwargs):
        return type(self).mangle(super().run(op, **kwargs))


def mangling(name: str, ops, mangle=None) -> type:
    """A :class:`Mangles` backend class named ``name`` for ``ops`` (one op name or several) that
    returns ``mangle(reference result)`` (None: the reference result itself, a correct plugin)."""
    ops = frozenset({ops} if isinstance(ops, str) else ops)
    body = {"name": name, "ops": ops, "__doc__": f"{name}: mangles {', '.join(sorted(ops))} results"}
    if mangle is not None:
        body["mangle"] = staticmethod(mangle)
    return type(name.replace("-", "_"), (Mangles,), body)


def make_distribution(root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str],
                      version: str = "0.1") -> Path:
    """Write an installed-looking distribution into ``root`` (which the caller puts on sys.path).

    Args:
        root: a folder on ``sys.path``.
        dist: the distribution name (``METADATA`` ``Name``).
        entry_points: ``linattn.backends`` entry points, name -> ``module`` or ``module:attr``.
        modules: module name -> source text (dedented), written as ``root/<module>.py``.
    Returns:
        The ``.dist-info`` folder.
    """
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[linattn.backends]\n{lines}")
    for mod, src in modules.items():
        (root / f"{mod}.py").write_text(textwrap.dedent(src))
    return info


def backend_module(backend_name: str, api: str = "1", op: str = "silu_and_mul_clamp", body: str = "",
                   returns: str = "") -> str:
    """Source of a plugin module registering one small CPU backend named ``backend_name``.

    ``body`` adds lines to the backend class; ``returns`` replaces the hook's body (default: return
    the class).
    """
    cls = "B_" + backend_name.replace("-", "_")
    extra = textwrap.indent(textwrap.dedent(body), " " * 4)
    hook = textwrap.indent(textwrap.dedent(returns or f"return [{cls}]"), " " * 4)
    return (f"from linattn.backends.torch_ref import TorchRefBackend\n"
            f"from linattn.dispatch.plugin.hookspecs import BackendPlugin, hookimpl\n\n"
            f"LINATTN_API_VERSION = {api!r}\n\n\n"
            f"class {cls}(TorchRefBackend):\n"
            f"    name = {backend_name!r}\n"
            f"    ops = frozenset({{{op!r}}})\n"
            f"    vendors = frozenset({{'cpu'}})\n\n"
            f"    def rank(self, p, caps):\n"
            f"        return 3\n"
            f"{extra}\n\n"
            f"@hookimpl\n"
            f"def linattn_register_backends():\n"
            f"{hook}\n")


class WrapsBelowMinusOne(IgnoresPadding):
    """Treats -1 as padding but wraps every other negative slot to a row (``-2`` is ``P - 2``)."""

    name = "wraps-below-minus-one"

    @staticmethod
    def _wrap(state_pool, state_indices):
        return torch.where(state_indices < -1, state_indices + state_pool.shape[0], state_indices)


class IgnoresFreshSequences(GdnOnCpu):
    """Declares ``has_initial_state`` but drops it: a fresh sequence reads its slot."""

    name = "ignores-fresh"
    features = frozenset({"has_initial_state", "precomputed_gates"})

    def gdn_decode(self, *, has_initial_state=None, **kw):
        return super().gdn_decode(**kw)

    def gdn_prefill(self, *, has_initial_state=None, **kw):
        return super().gdn_prefill(**kw)


class ZeroesReadyGates(GdnOnCpu):
    """Declares ``precomputed_gates`` but runs a gate-form decode with ``g = 0`` (no decay)."""

    name = "zeroes-ready-gates"
    features = frozenset({"precomputed_gates"})

    def gdn_decode(self, *, g=None, **kw):
        return super().gdn_decode(g=None if g is None else torch.zeros_like(g), **kw)


class DropsCallOptions(GdnOnCpu):
    """Declares the features, honours them, but drops ``scale``, ``use_qk_l2norm`` and the softplus options
    (runs the defaults)."""

    name = "drops-call-options"
    ops = frozenset({"gdn_decode", "gdn_prefill", "gdn_gating"})
    _DROPPED = ("scale", "use_qk_l2norm", "softplus_beta", "softplus_threshold")

    def gdn_gating(self, **kw):
        return super().gdn_gating(**{n: x for n, x in kw.items() if n not in self._DROPPED})

    def gdn_decode(self, **kw):
        return super().gdn_decode(**{n: x for n, x in kw.items() if n not in self._DROPPED})

    def gdn_prefill(self, **kw):
        return super().gdn_prefill(**{n: x for n, x in kw.items() if n not in self._DROPPED})
