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
  num_accepted_tokens, softplus_beta, softplus_threshold, g, beta, has_initial_state) -> o``
  (``g``, ``beta``: feature ``precomputed_gates``, and then a, b, A_log, dt_bias are None;
  ``has_initial_state``: feature of that name, ``[N]`` bool)
- ``kda_decode(<as gdn_decode>, lower_bound) -> o``
- ``gdn_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, scale,
  use_qk_l2norm, state_layout, has_initial_state) -> (o, final_state or None)``
  (``has_initial_state``: feature of that name, pool mode only)
- ``kda_prefill(<as gdn_prefill>) -> (o, final_state or None)``
- ``silu_and_mul_clamp(x, limit) -> out``

The arguments of the second release (decode's ``g`` / ``beta``, ``has_initial_state``) are passed
only when the caller gives them (a backend declaring them takes them as optional keywords,
default None), and only to a backend that declares them in :attr:`Backend.features`
(the ``supports_features`` predicate rejects the others with reason ``feature``), so a backend
written for the first release keeps working unchanged and is never handed an argument it would ignore.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Iterable, Optional

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.problem import Problem
from linattn.dispatch.verdict import Check, Reason

ALL_VENDORS = frozenset({"nvidia", "amd", "intel", "cpu", "other"})
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float64"})
#: Optional call features (``Problem`` fields) a backend must declare in ``Backend.features`` to run.
FEATURES = ("precomputed_gates", "has_initial_state")


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
        verified_archs: the GPU architectures its kernels were verified on (None: no claim); on
            others the first eager call self-checks against torch-ref (:meth:`self_check`).
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
    #: Read-only tensor arguments the kernels read through their strides, per op: ``{op: {arg:
    #: "any" | "inner"}}`` (``"inner"``: the last dim must have stride 1). Every other read-only
    #: tensor argument is handed over contiguous (``dispatch/layouts.py`` copies it), so a backend
    #: that names nothing sees contiguous inputs only. ``"any"`` for the whole field: every argument
    #: of every op is read through its strides.
    input_strides: ClassVar = {}
    #: Ops whose written state buffers (pool, intermediate states) the backend reads and writes
    #: through any strides; for the others each (slot, head) state matrix must be one dense block
    #: (``Problem.state_tiles_contiguous``), else the ``layout`` predicate rejects the call.
    strided_state_ops: ClassVar[frozenset[str]] = frozenset()
    #: Whether the backend records an autograd graph (a backward). No built-in does: with grad mode
    #: on and an input requiring grad, they are all rejected (reason ``feature``).
    supports_autograd: ClassVar[bool] = False
    #: Architectures (``caps.arch``: ``sm_90``, ``sm_100``, ``gfx942``, ...) the kernels were verified
    #: on: run there and checked against the float64 reference. None (the default): no claim, so
    #: nothing is self-checked (the reference; plugins that do not opt in). A set: on a GPU of any
    #: other arch the first eager call of each op and shape class first runs :meth:`self_check`
    #: against torch-ref, and a failure disables the backend there (reason ``self_check_failed``);
    #: during CUDA-graph capture an unchecked backend is not chosen (reason ``unverified``).
    verified_archs: ClassVar[Optional[frozenset[str]]] = None
    #: Optional call features the backend implements (see :data:`FEATURES`): ``precomputed_gates``
    #: (decode from ready ``g`` / ``beta``) and ``has_initial_state`` (pool-mode mask of fresh
    #: sequences). A call using a feature the backend does not declare is rejected (reason
    #: ``feature``), so the dispatcher falls back. A subclass that overrides an op method must declare
    #: the features again (its own ``features``): inherited declarations do not cover a method written
    #: without them (:meth:`declared_features`).
    features: ClassVar[frozenset[str]] = frozenset()
    # Filled in by the registry: where the backend came from.
    plugin: ClassVar[str] = "linattn"
    distribution: ClassVar[str] = "linattn"
    version: ClassVar[str] = ""

    # -- predicates: one per concern, each returns a Check (verdict and reason together) --------

    def predicates(self) -> list[Callable[[Problem, DeviceCapabilities], Check]]:
        """The predicates the dispatcher runs, in order. Extend with ``super().predicates() + [...]``."""
        return [self.supports_op, self.supports_grad, self.supports_features, self.supports_device,
                self.supports_toolchain, self.supports_dtype, self.supports_shape, self.supports_layout]

    def declared_features(self, op: str) -> frozenset[str]:
        """The features that cover ``op``: the ``features`` declared by the class that defines the op
        method, or by a subclass of it (the most derived declaration wins). A class that overrides
        an op method without declaring ``features`` itself declares none for that op: e.g. a plugin
        backend that subclasses torch-ref and rewrote ``gdn_decode`` with the first release's
        arguments does not inherit torch-ref's features for it."""
        mro = type(self).__mro__
        owner = next((i for i, c in enumerate(mro) if op in c.__dict__), None)
        if owner is None:
            return frozenset(self.features)
        for c in mro[:owner + 1]:
            if "features" in c.__dict__:
                return frozenset(c.__dict__["features"])
        return frozenset()

    def supports_features(self, p: Problem, caps: DeviceCapabilities) -> Check:
        used = [f for f in FEATURES if getattr(p, f, False)]
        if not used:
            return Check.passed()
        missing = [f for f in used if f not in self.declared_features(p.op)]
        if not missing:
            return Check.passed()
        what = {"precomputed_gates": "decode from precomputed gates (g=, beta= instead of a, b, A_log, dt_bias)",
                "has_initial_state": "has_initial_state= (sequences starting from a zero state without reading "
                                     "their slot)"}
        return Check.failed(Reason.FEATURE, f"{p.op} with {'; '.join(what[f] for f in missing)}: {self.name} does "
                            f"not declare {', '.join(repr(f) for f in missing)} (declared: "
                            f"{_fmt(self.declared_features(p.op))})",
                            "another backend runs it (e.g. torch-ref); a plugin adds the feature to its "
                            "`features` once its op method takes the argument")

    def supports_grad(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if not p.requires_grad or self.supports_autograd:
            return Check.passed()
        return Check.failed(Reason.FEATURE, "grad mode is on and an input requires grad (e.g. an nn.Parameter "
                            f"A_log): {self.name} runs inference only (it writes the state pool in place "
                            "and records no autograd graph)",
                            "call under torch.no_grad() or torch.inference_mode(), or pass detached tensors")

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
        if p.state_layout not in self.state_layouts:
            return Check.failed(Reason.LAYOUT, f"state_layout={p.state_layout!r}; supported: {_fmt(self.state_layouts)}")
        if not p.state_tiles_contiguous and p.op not in self.strided_state_ops:
            return Check.failed(Reason.LAYOUT, "a written state buffer (state_pool or intermediate_states) does not "
                                "hold each head's state matrix as one dense block (last two dims not contiguous); "
                                f"{self.name} reads and writes {p.op}'s state tiles as dense blocks "
                                "(any slot and head pitch)",
                                "pass a pool whose last two dims are contiguous, or use a backend that reads "
                                "strided tiles (torch-ref)")
        return Check.passed()

    # -- ranking and running ---------------------------------------------------------------------

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        """Lower is better; may depend on the shape. The reference is 1000."""
        return 100

    def run(self, op: str, **kwargs):
        """Run ``op`` with validated, normalised keyword arguments (see the module docstring)."""
        return getattr(self, op)(**kwargs)

    # -- first-call self-check on an architecture the kernels were never verified on --------------

    def needs_self_check(self, p: Problem, caps: DeviceCapabilities) -> bool:
        """Whether ``p`` on ``caps`` must pass :meth:`self_check` before this backend runs it.

        Default: the backend claims :attr:`verified_archs`, the device is no CPU (CPUs run the
        reference or the Triton interpreter, which the test suite covers on any host) and
        ``caps.arch`` is not in the claim. The dispatcher asks once per decision; the check itself
        runs once per process and (backend, arch, op, :meth:`self_check_class`).
        """
        return self.verified_archs is not None and caps.vendor != "cpu" and caps.arch not in self.verified_archs

    def self_check_class(self, p: Problem) -> str:
        """The shape class of ``p``: what this backend's kernels specialise on, so that one
        self-check stands for every call of the class. Default:
        :func:`linattn.dispatch.self_check.kernel_class` (dtypes, state layout, mode, head counts,
        head dims and flags; never the batch or token counts)."""
        from linattn.dispatch.self_check import kernel_class

        return kernel_class(p)

    def self_check(self, p: Problem, caps: DeviceCapabilities, device) -> Check:
        """Run a small case of ``p``'s shape class on ``device`` (a ``torch.device``) through this
        backend and compare it with torch-ref in float64 at ops.md's tolerances.

        The dispatcher calls it eagerly (never during CUDA-graph capture), before the first user
        call this backend would run on an unverified arch; ``caps`` is that device's capabilities
        (a test may pass a profile such as ``sm100`` with CPU tensors). Returns a passed
        :class:`Check` (message: the measured errors) or a failed one (reason
        ``self_check_failed``, message: what differed); raising counts as a failure. Default:
        :func:`linattn.dispatch.self_check.check_against_reference`.
        """
        from linattn.dispatch.self_check import check_against_reference

        return check_against_reference(self, p, device)
