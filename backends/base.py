"""The backend contract: declarative capabilities, one predicate per concern, one method per phase.

A backend is a class. Its capabilities are data on the class (ops, vendors, dtypes, head dims,
layouts, toolchain needs); each predicate answers one concern with a :class:`Check` that carries
the verdict and its reason together. The dispatcher runs every predicate and ranks the backends
that pass (:class:`~linattn.dispatch.plugin.verdict.Rank` names the tiers).

**Plugin API 2** (``api_version = "2"``): one method per phase, each taking a typed, frozen call
object (``dispatch/plugin/calls.py``) whose fields are named as in the op contract and already validated
and normalised (``scale`` a float, ``state_layout`` ``"vk"`` or ``"kv"``); the op, its family
(``call.family``: ``gdn`` or ``kda``) and the prefill mode (``call.mode``) come with it:

- ``decode(call: DecodeCall) -> o [N, T, HV, V]`` (``gdn_decode``, ``kda_decode``)
- ``prefill(call: PrefillCall) -> (o [T, HV, V], final_state or None)`` (``gdn_prefill``, ``kda_prefill``)
- ``gating(call: GatingCall) -> (g, beta)`` (``gdn_gating``, ``kda_gating``)
- ``clamp(call: ClampCall) -> out [M, D]`` (``silu_and_mul_clamp``)

The phase methods' defaults call the method named after the op with ``call.arguments()``, which
is how the built-in backends keep their per-op methods while being dispatched through the same
interface (a subclass overriding ``gdn_decode`` is honoured). ``Backend`` has one run path,
:meth:`Backend.run`: the phase method the class overrides, given a call object, else the op method.

**Plugin API 1** (a first-release backend) implements one method per op, named after it, taking
keywords:

<the op methods: filled in from the op table, _api1_methods()>

The API version tells the two apart (:meth:`Backend.effective_api_version`): the class's own
``api_version`` when it sets one, else its plugin module's ``LINATTN_API_VERSION``. The registry
wraps each version-1 backend once, at registration, in :class:`FirstReleaseAdapter`, which
presents the API 2 interface (phase methods taking call objects, ``run``) over the backend's own
``run(op, **call.arguments())``; so a first-release plugin, an override of ``run`` included, keeps
working unchanged, and nothing asks for the API version at call time.

The arguments of the second release (decode's ``g`` / ``beta``, ``has_initial_state``,
``output_state_indices``, prefill's ``checkpoint_every`` / ``checkpoint_indices``) reach a
per-op method only when the caller gives them (declare them as optional keywords, default None),
and only a backend that declares them in :attr:`Backend.features` is chosen for such a call (the
``supports_features`` predicate rejects the others with reason ``feature``).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Hashable, Iterable, Optional

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.plugin.calls import ClampCall, DecodeCall, GatingCall, OpCall, PrefillCall, make_call
from linattn.dispatch.plugin.hookspecs import PLUGIN_API_VERSION
from linattn.dispatch.rules.ops_table import FEATURES, FLAGS, METHODS, OP_TABLE
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.self_check_case import check_against_reference, kernel_class
from linattn.dispatch.plugin.verdict import Check, Rank, Reason, join_plan

__all__ = ["ALL_VENDORS", "FEATURES", "FLOAT_DTYPES", "Backend", "Check", "ClampCall", "DecodeCall",
           "FirstReleaseAdapter", "GatingCall", "OpCall", "PrefillCall", "Rank", "Reason"]

ALL_VENDORS = frozenset({"nvidia", "amd", "intel", "cpu", "other"})
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float64"})
#: Optional call features (``Problem`` fields) a backend must declare in ``Backend.features`` to run
#: (the op table's ``FLAGS`` marked ``feature``).
_NEEDS = {f.name: f.needs for f in FLAGS if f.feature}


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
        api_version: the plugin API version it was written for: ``"2"`` (phase methods taking call
            objects; the default) or ``"1"`` (one keyword method per op, run through
            :class:`FirstReleaseAdapter`). A class that does not set it itself takes its plugin
            module's ``LINATTN_API_VERSION`` (:meth:`effective_api_version`).
        triton_kernels: names of the Triton kernels it launches (``linattn.kernels.triton.registry``);
            the conformance suite checks each one's program-id contract.
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
    api_version: ClassVar[str] = PLUGIN_API_VERSION
    #: The Triton kernels the backend launches (names in ``linattn.kernels.triton.registry.KERNELS``):
    #: ``linattn check`` runs each one's program-id contract (cases of kind ``contract``).
    triton_kernels: ClassVar[tuple[str, ...]] = ()
    #: Read-only tensor arguments the kernels read through their strides, per op: ``{op: {arg:
    #: "any" | "inner"}}`` (``"inner"``: the last dim must have stride 1). Every other read-only
    #: tensor argument is handed over contiguous (``dispatch/rules/layouts.py`` copies it), so a backend
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
    #: (decode from ready ``g`` / ``beta``), ``has_initial_state`` (pool-mode mask of fresh
    #: sequences), ``output_state_indices`` (separate write slots) and ``checkpoints`` (pool-mode
    #: prefill's ``checkpoint_every`` / ``checkpoint_indices``: states at chunk-multiple token counts
    #: written to named slots). A call using a feature the backend does not declare is rejected (reason
    #: ``feature``), so the dispatcher falls back. A subclass that overrides an op method must declare
    #: the features again (its own ``features``): inherited declarations do not cover a method written
    #: without them (:meth:`declared_features`).
    features: ClassVar[frozenset[str]] = frozenset()
    #: A hook that runs a call's value rules as one kernel launch (``dispatch/rules/value_rules.py``
    #: ``ValueCheckHook``: ``available()``, ``plan(rules, args, dims, like)``), or None. The registry
    #: keeps the first one linattn's built-in backends provide (the Triton backends':
    #: ``backends/triton.py`` ``TritonValueChecks``) and the dispatcher runs it for every call on a
    #: device where it is available, whichever backend runs the call; a plugin's is ignored (the hook
    #: stands in for the value rules of every backend).
    value_check_hook: ClassVar[Optional[Any]] = None
    # Where the backend came from, and its plugin's API version: set by the registry on each
    # registered instance (never on the class, which two plugins may both register); these class
    # values are what an instance no registry registered reports.
    plugin: str = "linattn"
    distribution: str = "linattn"
    version: str = ""
    plugin_api_version: Optional[str] = None
    #: The phase methods (``decode``, ...) the class implements itself (computed per subclass, never
    #: set by hand): :meth:`run` hands these a call object; the others run the op method named after
    #: the op with the keywords as they are (no call object is built). Empty on a first-release
    #: backend's instance (:class:`FirstReleaseAdapter`): its methods are per-op methods whatever
    #: they are named.
    own_phase_methods: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # a class written for API 1 (it says so itself, or inherits it) has no phase methods: a method
        # of its own that happens to be named decode / prefill / gating / clamp is an ordinary method,
        # registered or not (the registry wraps it in FirstReleaseAdapter, which empties this too)
        first_release = cls.effective_api_version() == "1"
        cls.own_phase_methods = frozenset() if first_release else \
            frozenset(m for m in METHODS if getattr(cls, m) is not getattr(Backend, m))

    @classmethod
    def effective_api_version(cls, plugin_api: Optional[str] = None) -> str:
        """The plugin API the class was written for: ``api_version`` if the class sets it itself,
        else ``plugin_api`` (its plugin module's ``LINATTN_API_VERSION``; the registry passes it),
        else the inherited ``api_version``. So a first-release plugin's subclass of a built-in
        backend is on API 1, and a class that says ``api_version = "2"`` is run as such. The
        registry asks it once, at registration, with the plugin's version: a backend it answers
        ``"1"`` for is registered behind :class:`FirstReleaseAdapter` (whose
        ``effective_api_version()`` is ``"1"``), every other one runs on API 2."""
        own = cls.__dict__.get("api_version")
        if own is not None:
            return str(own)
        return str(plugin_api) if plugin_api is not None else str(cls.api_version)

    # -- predicates: one per concern, each returns a Check (verdict and reason together) --------

    def predicates(self) -> list[Callable[[Problem, DeviceCapabilities], Check]]:
        """The predicates the dispatcher runs, in order. Extend with ``super().predicates() + [...]``."""
        return [self.supports_op, self.supports_grad, self.supports_features, self.supports_device,
                self.supports_toolchain, self.supports_dtype, self.supports_shape, self.supports_layout]

    def declared_features(self, op: str) -> frozenset[str]:
        """The features that cover ``op``: the ``features`` declared by the class that defines the op
        method (or the phase method that runs it, ``decode`` for ``gdn_decode``), or by a subclass of
        it (the most derived declaration wins). A class that overrides such a method without
        declaring ``features`` itself declares none for that op: e.g. a plugin backend that
        subclasses torch-ref and rewrote ``gdn_decode`` with the first release's arguments does not
        inherit torch-ref's features for it."""
        mro = type(self).__mro__
        phase = OP_TABLE[op].method if op in OP_TABLE else None  # a first-release `decode` is no phase method
        names = (op, phase) if phase in self.own_phase_methods else (op,)
        owner = next((i for i, c in enumerate(mro) if c is not Backend and any(n in c.__dict__ for n in names)),
                     None)
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
        return Check.failed(Reason.FEATURE, f"{p.op} with {'; '.join(_NEEDS[f] for f in missing)}: {self.name} does "
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
        if OP_TABLE[p.op].has_state and p.state_dtype not in self.state_dtypes:
            return Check.failed(Reason.DTYPE, f"state dtype={p.state_dtype}; supported: {_fmt(self.state_dtypes)}")
        return Check.passed()

    def supports_shape(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if not OP_TABLE[p.op].has_state:
            return Check.passed()
        if self.head_dims_k is not None and p.k not in self.head_dims_k:
            return Check.failed(Reason.SHAPE, f"unsupported head_dim K={p.k}; supported: {_fmt(self.head_dims_k)}")
        if self.head_dims_v is not None and p.v not in self.head_dims_v:
            return Check.failed(Reason.SHAPE, f"unsupported head_dim V={p.v}; supported: {_fmt(self.head_dims_v)}")
        return Check.passed()

    def supports_layout(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if not OP_TABLE[p.op].has_state:
            return Check.passed()
        if p.state_layout not in self.state_layouts:
            return Check.failed(Reason.LAYOUT,
                                f"state_layout={p.state_layout!r}; supported: {_fmt(self.state_layouts)}")
        if not p.state_tiles_contiguous and p.op not in self.strided_state_ops:
            return Check.failed(Reason.LAYOUT, "a written state buffer (state_pool or intermediate_states) does not "
                                "hold each head's state matrix as one dense block (last two dims not contiguous); "
                                f"{self.name} reads and writes {p.op}'s state tiles as dense blocks "
                                "(any slot and head pitch)",
                                "pass a pool whose last two dims are contiguous, or use a backend that reads "
                                "strided tiles (torch-ref)")
        return Check.passed()

    # -- ranking, forcing and running -----------------------------------------------------------

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        """Lower is better; may depend on the shape. Tiers: :class:`~linattn.dispatch.plugin.verdict.Rank`
        (torch-ref is ``CPU_DEFAULT`` on CPUs and ``GPU_REFERENCE`` on GPUs)."""
        return Rank.DEFAULT

    def needs_forcing(self, p: Problem, caps: DeviceCapabilities) -> Optional[str]:
        """A message when the backend accepts ``p`` on ``caps`` but may run it only when forced
        (``backend=``, ``policy``, ``LINATTN_BACKEND``): e.g. Triton in the CPU interpreter. The
        dispatcher then rejects it with reason ``not_forced`` unless it is forced. None (the
        default): it may be chosen."""
        return None

    def capture_refusal(self, p: Problem, caps: DeviceCapabilities) -> Optional[str]:
        """A message when the backend cannot run ``p`` inside CUDA-graph capture (e.g. its library
        reads ``cu_seqlens`` back to the host, which capture forbids); the dispatcher then rejects it
        during capture only (reason ``capture``) and chooses another. None (the default): it may run
        in capture. Read from the problem alone, so the answer is the same for every call of a shape
        class."""
        return None

    def plan_note(self, p: Problem, caps: DeviceCapabilities) -> str:
        """What the backend would launch for ``p`` on ``caps`` and why, for ``explain`` (the
        accepted verdict's message), from the problem's shapes alone. The default: :meth:`plan_parts`
        as ``"name: text; name: text"`` ("" where it names none). A backend whose plan depends on the
        shape (e.g. the Triton prefill's segment-parallel state pass) says it here or in its parts."""
        return join_plan(self.plan_parts(p, caps))

    plan_note.joins_parts = True  # the dispatcher joins the parts itself instead of asking twice

    def plan_parts(self, p: Problem, caps: DeviceCapabilities) -> dict[str, str]:
        """The plan note's parts by name (the accepted verdict's ``plan``, ``linattn explain --json``), so a
        tool reads a choice without parsing prose: e.g. the Triton prefill's ``{"prefill": why fused or
        not, "prep": ..., "walk": ...}``. Names and texts are strings; :func:`join_plan` shows a name as
        written, or as ``PLAN_LABELS`` spells it (``state_stage`` -> ``state stage``). Like the
        message, what a cached decision holds is its shape class's first call's (:meth:`size_class`).
        {} (the default): none."""
        return {}

    def size_class(self, p: Problem, caps: DeviceCapabilities) -> Hashable:
        """What this backend's predicates, :meth:`rank` and :meth:`needs_forcing` read of the sizes
        that change from call to call (``p.n``, ``p.t``, ``p.max_seqlen``), as a hashable value.

        The dispatcher caches a decision per shape class: the problem without those sizes plus
        every backend's ``size_class`` (``dispatch/runtime/selection.py`` ``shape_class``). Two problems
        with equal values here must get the same verdict from this backend (ok or not, reason
        codes, rank); messages (a rejection's numbers, :meth:`plan_note`) may be the class's first
        call's. Return the outcome of each size-reading rule, e.g. ``p.t / max(p.n, 1) >= 128`` for
        a rank with that threshold, or ``()`` when nothing reads the sizes.

        Default: the exact ``(p.n, p.t, p.max_seqlen)``, right for any backend but deciding again
        for every new prefill length or decode batch. A backend (or a subclass of one) whose rules
        read the sizes must return at least what they read. Raising, or an unhashable value, counts as the default.
        """
        return (p.n, p.t, p.max_seqlen)

    def prepare(self, op: str, kwargs: dict) -> Optional[Callable[[dict], Any]]:
        """An optional cached launch for calls like this one (``dispatch/runtime/fast_path.py``): given the
        validated keyword arguments of the first call with a call key, return a function of a
        later call's keyword arguments that runs it, or None (the default) to run :meth:`run`."""
        return None

    def run(self, op: str, **kwargs):
        """Run ``op`` with its validated, normalised keyword arguments (the dispatcher's and the
        self-check's one entry).

        The phase method the class overrides gets the call object (:meth:`execute`); a phase
        method left at its default runs the op method named after the op with these keywords (no
        call object is built). A first-release backend is registered behind
        :class:`FirstReleaseAdapter`, whose ``run`` is the backend's own.
        """
        method = OP_TABLE[op].method
        if method in self.own_phase_methods:
            return getattr(self, method)(make_call(op, kwargs))
        fn = getattr(self, op, None)
        if fn is None:
            self._op_method(op)  # raises, naming what is missing
        return fn(**kwargs)

    def execute(self, call: OpCall):
        """Run one call object: the phase method (``decode``, ``prefill``, ``gating``, ``clamp``) the
        class overrides, else the op method named after the op (API 1's)."""
        if call.spec.method in self.own_phase_methods:
            return getattr(self, call.spec.method)(call)
        return self._by_op(call)

    # -- the phase methods of plugin API 2 (defaults: the op method named after the op) -----------

    def decode(self, call: DecodeCall):
        """Decode over the state pool, in place; returns ``o [N, T, HV, V]`` in q's dtype."""
        return self._by_op(call)

    def prefill(self, call: PrefillCall):
        """Chunked prefill; returns ``(o [T, HV, V], None)`` in pool mode, ``(o, final_state)`` in dense."""
        return self._by_op(call)

    def gating(self, call: GatingCall):
        """Gates from the raw projections; returns ``(g, beta)`` in fp32, shaped as ``a`` and ``b``."""
        return self._by_op(call)

    def clamp(self, call: ClampCall):
        """SwiGLU with a clamp; returns ``[M, D]`` in x's dtype."""
        return self._by_op(call)

    def _by_op(self, call: OpCall):
        return self._op_method(call.op)(**call.arguments())

    def _op_method(self, op: str) -> Callable:
        fn = getattr(self, op, None)
        if fn is None:
            raise NotImplementedError(f"{self.name} declares {op} but implements neither "
                                      f"{OP_TABLE[op].method}(call) (plugin API 2) nor {op}(**kwargs) (API 1)")
        return fn

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
        :func:`linattn.dispatch.plugin.self_check_case.kernel_class` (dtypes, state layout, mode, head counts,
        head dims and flags; never the batch or token counts)."""
        return kernel_class(p)

    def self_check(self, p: Problem, caps: DeviceCapabilities, device) -> Check:
        """Run a small case of ``p``'s shape class on ``device`` (a ``torch.device``) through this
        backend and compare it with torch-ref in float64 at docs/ops.md's tolerances.

        The dispatcher calls it eagerly (never during CUDA-graph capture), before the first user
        call this backend would run on an unverified arch; ``caps`` is that device's capabilities
        (a test may pass a profile such as ``sm100`` with CPU tensors). Returns a passed
        :class:`Check` (message: the measured errors) or a failed one (reason
        ``self_check_failed``, message: what differed); raising counts as a failure. Default:
        :func:`linattn.dispatch.plugin.self_check_case.check_against_reference`.
        """
        return check_against_reference(self, p, device)


class FirstReleaseAdapter:
    """A plugin-API-1 backend presented through the API 2 interface: what the registry registers in
    its place (``registry.backends[name]``), built once at registration.

    The phase methods (``decode``, ``prefill``, ``gating``, ``clamp``) and :meth:`execute` take a
    call object and run the backend's own ``run(call.op, **call.arguments())``: exactly the keywords
    of its op method (the second release's only when given), and an override of ``run`` is honoured.
    :meth:`run` (the dispatcher's and the self-check's entry, keyword arguments) is the backend's
    ``run`` as it is. Everything else (name, capabilities, predicates, rank, self-check, the
    registry's provenance tags) is the backend's: reading, setting or deleting any other attribute
    reaches the adapted instance. The adapted instance's :attr:`Backend.own_phase_methods` is emptied
    (a first-release method named ``decode`` is a helper of its own, not a phase method), which also
    keeps its features per op method (:meth:`Backend.declared_features`).
    """

    __slots__ = ("adapted",)

    def __init__(self, backend: Backend) -> None:
        backend.own_phase_methods = frozenset()
        object.__setattr__(self, "adapted", backend)

    def __getattr__(self, name: str):
        if name == "adapted":  # not set yet (a copy being built): never recurse
            raise AttributeError(name)
        return getattr(self.adapted, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.adapted, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.adapted, name)

    def __repr__(self) -> str:
        return f"<plugin API 1 backend {self.adapted!r}>"

    @property
    def __class__(self):
        """The adapted backend's class: ``isinstance`` sees the plugin's class, and per-class
        caches (``dispatch/rules/layouts.py``) keep one entry per backend class, not one for every
        adapter (``type()`` still names the adapter)."""
        return type(self.adapted)

    def effective_api_version(self, plugin_api: Optional[str] = None) -> str:
        """``"1"``: the API the adapted backend was written for."""
        return "1"

    def run(self, op: str, **kwargs):
        return self.adapted.run(op, **kwargs)

    def execute(self, call: OpCall):
        return self.adapted.run(call.op, **call.arguments())

    # every phase method is execute: the call object names its op
    decode = prefill = gating = clamp = execute


#: what each plugin-API-1 op method returns, per backend method (``OpSpec.method``)
_API1_RETURNS = {"gating": "(g, beta)", "decode": "o", "prefill": "(o, final_state or None)", "clamp": "out"}


def _api1_methods() -> str:
    """Plugin API 1's op methods for the module docstring, one per op, from the op table: each
    argument entry in table order (keywords; the second release's only when given, see below)."""
    import textwrap

    return "\n".join(textwrap.fill(f"``{op}({', '.join(a.name for a in spec.args)}) -> {_API1_RETURNS[spec.method]}``",
                                    100, initial_indent="- ", subsequent_indent="  ")
                      for op, spec in OP_TABLE.items())


if __doc__:  # None under python -OO
    __doc__ = __doc__.replace("<the op methods: filled in from the op table, _api1_methods()>", _api1_methods())
