"""The backend contract: declarative capabilities plus one predicate per concern.

A backend is a class. Its capabilities are data on the class (ops, vendors, dtypes, head dims,
layouts, toolchain needs); each predicate answers one concern with a :class:`Check` that carries
the verdict and its reason together. The dispatcher runs every predicate and ranks the backends
that pass. To run, the dispatcher calls the method named after the op with keyword arguments
that the validation layer has already checked and normalised (``scale`` is a float,
``state_layout`` is ``"vk"`` or ``"kv"``).

Op methods and their keyword arguments (shapes in ops.md):

- ``gdn_gating(A_log, a, b, dt_bias, softplus_beta, softplus_threshold) -> (g, beta)``
- ``kda_gating(A_log, a, b, dt_bias, lower_bound, softplus_beta, softplus_threshold) -> (g, beta)``
- ``gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, scale, use_qk_l2norm,
  state_layout, intermediate_states, intermediate_state_indices, disable_state_update,
  num_accepted_tokens, softplus_beta, softplus_threshold) -> o``
- ``kda_decode(<as gdn_decode>, lower_bound) -> o``
- ``gdn_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
  use_qk_l2norm, state_layout) -> (o, final_state or None)``
- ``kda_prefill(<as gdn_prefill>) -> (o, final_state or None)``
- ``silu_and_mul_clamp(x, limit) -> out``
"""

from __future__ import annotations

from typing import Callable, ClassVar, Iterable, Optional

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.problem import Problem
from linattn.dispatch.verdict import Check, Reason

ALL_VENDORS = frozenset({"nvidia", "amd", "intel", "cpu", "other"})
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float64"})


def _fmt(values: Iterable) -> str:
    return "{" + ", ".join(str(v) for v in sorted(values)) + "}"


class Backend:
    """Base class of every backend (built-in or plugin). Subclasses set the class fields.

    Class fields:
        name: unique name (``torch-ref``, ``triton-split``, ...).
        summary: one line for ``linattn backends``.
        ops: the ops it implements.
        vendors: device vendors it runs on (``nvidia``, ``amd``, ``intel``, ``cpu``, ``other``).
        dtypes: q/k/v (or x) dtypes; ``state_dtypes``: pool / state dtypes.
        head_dims_k / head_dims_v: supported K and V (None = any).
        state_layouts: pool layouts it reads (``vk``, ``kv``).
        requires: toolchain components it needs (``triton``, ``cutlass_dsl``).
        api_version: the plugin API version it was written for.
    """

    name: ClassVar[str] = "unnamed"
    summary: ClassVar[str] = ""
    ops: ClassVar[frozenset[str]] = frozenset()
    vendors: ClassVar[frozenset[str]] = ALL_VENDORS
    dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "bfloat16", "float16"})
    state_dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "bfloat16"})
    head_dims_k: ClassVar[Optional[frozenset[int]]] = None
    head_dims_v: ClassVar[Optional[frozenset[int]]] = None
    state_layouts: ClassVar[frozenset[str]] = frozenset({"vk", "kv"})
    requires: ClassVar[tuple[str, ...]] = ()
    api_version: ClassVar[str] = "1"
    # Filled in by the registry: where the backend came from.
    plugin: ClassVar[str] = "linattn"
    distribution: ClassVar[str] = "linattn"
    version: ClassVar[str] = ""

    # -- predicates: one per concern, each returns a Check (verdict and reason together) --------

    def predicates(self) -> list[Callable[[Problem, DeviceCapabilities], Check]]:
        """The predicates the dispatcher runs, in order. Extend with ``super().predicates() + [...]``."""
        return [self.supports_op, self.supports_device, self.supports_toolchain,
                self.supports_dtype, self.supports_shape, self.supports_layout]

    def supports_op(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if p.op in self.ops:
            return Check.passed()
        return Check.failed(Reason.OP, f"op={p.op!r} is not implemented; implemented: {_fmt(self.ops)}")

    def supports_device(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if caps.vendor in self.vendors:
            return Check.passed()
        return Check.failed(Reason.DEVICE, f"vendor={caps.vendor!r} ({caps.name}); supported: {_fmt(self.vendors)}",
                            "run on a supported device or pick another backend")

    def supports_toolchain(self, p: Problem, caps: DeviceCapabilities) -> Check:
        for comp in self.requires:
            if getattr(caps.toolchain, comp) is None:
                dist = {"cutlass_dsl": "nvidia-cutlass-dsl"}.get(comp, comp)
                return Check.failed(Reason.TOOLCHAIN, f"{dist} is not installed",
                                    f"pip install 'linattn[{'cutedsl' if comp == 'cutlass_dsl' else comp}]'")
        return Check.passed()

    def supports_dtype(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if p.dtype not in self.dtypes:
            return Check.failed(Reason.DTYPE, f"dtype={p.dtype}; supported: {_fmt(self.dtypes)}")
        if p.op not in ("silu_and_mul_clamp",) and not p.op.endswith("gating") and p.state_dtype not in self.state_dtypes:
            return Check.failed(Reason.DTYPE, f"state dtype={p.state_dtype}; supported: {_fmt(self.state_dtypes)}")
        return Check.passed()

    def supports_shape(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if p.op in ("silu_and_mul_clamp",) or p.op.endswith("gating"):
            return Check.passed()
        if self.head_dims_k is not None and p.k not in self.head_dims_k:
            return Check.failed(Reason.SHAPE, f"unsupported head_dim K={p.k}; supported: {_fmt(self.head_dims_k)}")
        if self.head_dims_v is not None and p.v not in self.head_dims_v:
            return Check.failed(Reason.SHAPE, f"unsupported head_dim V={p.v}; supported: {_fmt(self.head_dims_v)}")
        return Check.passed()

    def supports_layout(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if p.op in ("silu_and_mul_clamp",) or p.op.endswith("gating"):
            return Check.passed()
        if p.state_layout in self.state_layouts:
            return Check.passed()
        return Check.failed(Reason.LAYOUT, f"state_layout={p.state_layout!r}; supported: {_fmt(self.state_layouts)}")

    # -- ranking and running ---------------------------------------------------------------------

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        """Lower is better; may depend on the shape. The reference is 1000."""
        return 100

    def run(self, op: str, **kwargs):
        """Run ``op`` with validated, normalised keyword arguments (see the module docstring)."""
        return getattr(self, op)(**kwargs)
