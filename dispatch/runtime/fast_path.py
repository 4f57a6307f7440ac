"""The per-call fast path: everything a call's metadata determines, derived once and cached.

A public op call is described, for everything validation and selection look at, by its
*call key*: the op, the per-call ``backend`` / ``validate`` / ``check_finite`` options, grad
mode, the current policy, the registry generation, the CUDA-graph capture state and, for every
argument, its value (scalars) or its dtype, shape, strides, device, ``requires_grad`` and whether
it is a lazily negated or conjugated view (tensors: ``torch._neg_view(x)`` has ``x``'s strides and
other values, and is refused) and its layout (a sparse COO or mkldnn tensor reports strides a
dense tensor may have, and is refused). Every host rule of the validation layer (``dispatch/rules/host_rules.py``) is a function of
that key except one: address overlap between a written buffer and the other arguments, which
depends on the data pointers. So the first call with a key runs the whole validation layer and
the selection and keeps the result here (:class:`CallPlan`): the normalised scalar arguments,
the chosen backend and its decision, the value rules to run, the byte extents of the tensors,
and the backend's prepared launch (``Backend.prepare``) if it has one. A later call with the
same key:

1. checks the written buffers' address ranges against the other tensors' (the one host rule that
   reads pointers; an overlap sends the call through the full validation, which refuses it
   unless the two are provably disjoint);
2. runs the value rules (``validate=True``) in their single sync, as the full path does (the
   decode or prefill rules as one kernel launch where ``value_rules.fused_value_check`` applies);
3. rebuilds the keyword arguments from the cached scalars and the caller's tensors, unless a
   prepared launch runs: it reads only the tensors, so it gets the caller's dict as is;
4. copies the read-only views the backend cannot read (``dispatch/rules/layouts.py``);
5. runs the prepared launch (or the backend's op method).

So a key hit is exactly the call the full path would have validated and dispatched the same
way; nothing is skipped that could differ. A call refused by validation or selection leaves no
plan; a plan is kept once selection succeeded, whether or not the backend's run then raises (a
plugin that raises is marked broken, which changes the registry generation, hence the key).

**Class plans** (issue 28): an engine's packed prefill length T and its decode batch N change
almost every call, and each new length used to be a new key, so a full validation, a selection
and a new plan. Decode and prefill calls are therefore also kept under their *class key*: the call
key with each length argument's dim 0 bucketed (0, 1, 2, or 3 and more: the sizes some rules
single out; :data:`LENGTH_ARGUMENTS`). A call whose exact key misses but whose class key hits
derives its plan from the class's first plan instead of the full path:

1. the size check: every length argument keeps the offset to its length (T or N) that the full
   validation accepted (q, k, v, g, beta share T; ``cu_seqlens`` is N + 1; ``state_indices`` and
   the other per-sequence tensors are N long). Every host rule reads these dims only through
   such equalities and through the buckets, so a call passing it passes the host rules; one
   failing it takes the full path, which raises the same refusal as ever;
2. the sizes of the problem (N, T, max_seqlen) recomputed; every registered backend's
   :meth:`~linattn.backends.base.Backend.size_class` asked again and compared with the class's:
   the same outcome is the same shape class, hence the class's decision (with this call's
   problem); an outcome seen before under the class key (a threshold crossed back and forth, e.g.
   torch-chunked's tokens per sequence) derives from that outcome's first plan likewise; an
   outcome not seen takes the full path (a new decision), whose plan is kept for that outcome;
3. a new :class:`CallPlan` from those (the written buffers' byte spans, the fused value check),
   kept under the exact key; then steps 1 to 5 above as for a key hit.

What is checked on each class's first call only, not per exact key: the storage of a tensor
(freed or shrunk, F47), as a key hit checks it on its key's first call. A lazily negated or
conjugated view is part of both keys, so its first call (exact or class) takes the full validation,
which refuses it and keeps no plan.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch

from ..rules.host_rules import any_unwritable
from ..rules.layouts import byte_range, conform_inputs, interleaved_disjoint
from ..lru import CALL_PLANS_MAX, CLASS_PLANS_MAX, LRUCache
from ..rules.ops_table import OP_TABLE
from .policy import current_policy
from .registry import get_registry
from . import selection
from .selection import dispatcher, resolve_device, select, shape_class
from ..rules.validate import validate_call, value_rules_of, written_arguments
from ..rules.value_rules import _run_value_rules, fused_value_check, live_rules

_Tensor = torch.Tensor
_NoneType = type(None)
_SCALARS = frozenset({_NoneType, bool, int, float, str})
_grad_enabled = torch.is_grad_enabled
_note_decision = dispatcher().note_decision  # selection.note_decision without its wrapper (one call less per hit)
#: the call plans, least recently used dropped first (dispatch/lru.py)
_plans: LRUCache = LRUCache(CALL_PLANS_MAX, distinct_values=True)
#: the class plans (module docstring): per class key, the class's first plan and its length facts
_classes: LRUCache = LRUCache(CLASS_PLANS_MAX, distinct_values=True)
_LENGTH_BUCKETS = 3  # dim-0 sizes 0, 1, 2 are classes of their own; 3 and more share one
#: per op phase: the tensor arguments whose dim 0 is a length that changes from call to call, and
#: which length (``t`` = T, ``n`` = N; ``cu_seqlens`` is N + 1 long): the op table's ``Arg.length``
LENGTH_ARGUMENTS = {spec.phase: {a.name: a.length for a in spec.args if a.length}
                    for spec in OP_TABLE.values() if any(a.length for a in spec.args)}
#: per decode or prefill op: its length arguments (:data:`LENGTH_ARGUMENTS` of its phase)
_LENGTHS_OF = {op: LENGTH_ARGUMENTS[spec.phase] for op, spec in OP_TABLE.items() if spec.phase in LENGTH_ARGUMENTS}


def clear() -> None:
    """Forget every cached call plan and class plan (the decision cache's ``clear_cache`` calls this),
    and the Triton backends' grid verdicts per size (``size_class``), which are decisions too.
    ``dispatcher().clear()`` empties these with every other per-process cache (``dispatch/lru.py``)."""
    _plans.clear()
    _classes.clear()
    triton_backend = sys.modules.get("linattn.backends.triton")
    if triton_backend is not None:
        triton_backend._GRID_FITS.clear()


def call_key(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool) -> Optional[tuple]:
    """The hashable description of a call that validation and selection depend on (module docstring);
    None for a call with a tensor that has no strides (never stored: validation refuses it)."""
    return _key(op, args, backend, validate, check_finite, ())


def _key(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool,
         lengths) -> Optional[tuple]:
    """:func:`call_key`, with the dim 0 of each argument named in ``lengths`` bucketed
    (:func:`class_key`)."""
    key = [op, backend, validate, check_finite, _grad_enabled(), current_policy(), get_registry().generation]
    append, extend = key.append, key.extend
    device = None
    for name, x in args.items():
        cls = x.__class__
        if cls is _NoneType or cls is str:  # equal only to themselves (a str subclass takes the last branch)
            append(x)
        elif cls is _Tensor or (cls not in _SCALARS and isinstance(x, _Tensor)):
            if device is None:
                device = x.device
            try:
                stride = x.stride()
            except RuntimeError:  # sparse CSR/CSC/BSR/BSC: no strides, no key; validation refuses it (F47)
                return None
            shape = x.shape
            if name in lengths and shape:
                shape = (min(shape[0], _LENGTH_BUCKETS), *shape[1:])
            # a pool that requires grad is refused in every grad mode: requires_grad is part of the key;
            # so is a lazily negated or conjugated view (same strides, other values: refused, F33), and
            # the layout (a sparse COO or mkldnn tensor reports strides, e.g. (0, 0), that no dense
            # call's plan may match: validation refuses it). Only a complex tensor can carry the conj
            # bit (torch asserts it), so a real one's is_conj() is not asked (one call less per tensor)
            dtype = x.dtype
            extend((dtype, shape, stride, x.device, x.requires_grad,
                    x.is_neg() or (dtype.is_complex and x.is_conj()), x.layout))
        else:
            append(x)
            append(cls)  # True == 1 == 1.0 as values: the type tells them apart (validation does)
    append(device is not None and selection.stream_capturing(device))
    return tuple(key)


class CallPlan:
    """What the first call with a key derived, to run later calls with the same key.

    Fields: ``op``; ``impl`` the chosen backend instance and ``decision`` its trace (a plan derived
    for a new length keeps its class's decision and its own problem, and makes the copy of the one
    with the other only when the decision is read: ``linattn.last_decision``); ``scalars``
    the normalised non-tensor keyword arguments; ``tensors`` the names of the caller's tensor
    arguments passed through; ``dims`` the validation layer's derived facts (for the value rules);
    ``rules`` the value rules to run per call (on the CPU only those with something to check for the key's
    None arguments: ``value_rules.live_rules``) and ``value_check`` the same as one kernel launch
    (or None: the rules run, on the CPU through their host forms first); ``written`` per written, non-empty tensor argument its name,
    its byte span from its data pointer and the other non-empty tensor arguments' names and spans;
    ``prepared`` the backend's prepared launch (or None: its op method runs); ``replay`` the
    backend's launch for the whole call class where it has one (``serves_class``: the class's plans
    share it), ``prepared`` then being its launch for this plan's lengths (``replay.bind``).
    """

    __slots__ = ("op", "impl", "_decision", "_problem", "scalars", "tensors", "dims", "rules", "refuse_in_capture",
                 "written", "prepare", "prepared", "builtin", "copies", "value_check", "spans", "replay")

    def __init__(self, op: str, nargs: dict, dims: dict, impl, decision, rules: tuple, check_finite: bool,
                 spans: Optional[dict] = None):
        self.op, self.impl, self._decision, self._problem, self.dims, self.rules = op, impl, decision, None, dims, rules
        self.refuse_in_capture = "check_finite=True" if check_finite else None
        self.scalars = {n: x for n, x in nargs.items() if not isinstance(x, _Tensor)}
        self.tensors = tuple(n for n, x in nargs.items() if isinstance(x, _Tensor))
        written = set(written_arguments(op)) if dims.get("writes_pool", True) else \
            set(written_arguments(op)) - {"state_pool"}  # a read-only pool may alias (host_rules)
        #: per tensor argument: its byte span (given: a class plan's, shifted to this call's lengths)
        self.spans = spans = spans if spans is not None else {n: _span(nargs[n]) for n in self.tensors}
        #: per written buffer: its byte span and the other non-empty tensor arguments' (empty ones skipped)
        self.written = tuple((n, spans[n], tuple((o, spans[o]) for o in self.tensors if o != n and spans[o]))
                             for n in self.tensors if n in written and spans[n])
        self.builtin = impl.plugin == "linattn-builtin"
        self.prepare = getattr(impl, "prepare", None) if self.builtin else None
        self.prepared: Optional[Callable] = None  # built by the first run, from the conformed arguments
        self.replay = None  # the class-serving prepared launch (``serves_class``), where the backend's is one
        self.copies: Optional[tuple] = None  # the arguments the backend gets contiguous copies of (first run)
        self.value_check = fused_value_check(rules, nargs, dims) if rules else None

    @property
    def decision(self):
        """The decision behind this plan (for a plan derived for a new length: its class's decision
        with this plan's problem, copied on the first read)."""
        problem = self._problem
        if problem is None:
            return self._decision
        decision = self._decision = self._decision.model_copy(update={"problem": problem})
        self._problem = None
        return decision

    def for_lengths(self, nargs: dict, dims: dict, problem, spans: dict) -> "CallPlan":
        """This plan for another T or N of its class (:func:`_from_class`): the given ``dims``,
        ``problem`` (the decision's, which is copied with it when read: :attr:`decision`) and byte
        ``spans``, the written buffers' spans and the fused value check taken again from them; the
        rest (backend, scalars, rules, a class-serving prepared launch) shared."""
        new = CallPlan.__new__(CallPlan)
        for name in CallPlan.__slots__:
            setattr(new, name, getattr(self, name))
        new._decision = self.decision
        new.dims, new._problem, new.spans = dims, problem, spans
        new.written = tuple((n, spans[n], tuple((o, spans[o]) for o, _ in others)) for n, _, others in self.written)
        new.value_check = fused_value_check(self.rules, nargs, dims, like=self.value_check) if self.rules else None
        if self.replay is not None:  # one prepared launch for every length of the class: its launch for these
            new.prepared = self.replay.bind(nargs)
        else:
            new.prepared, new.copies, new.prepare = None, None, getattr(self.impl, "prepare", None) if self.builtin \
                else None
        return new

    def arguments(self, args: dict) -> dict:
        nargs = dict(self.scalars)
        for n in self.tensors:
            nargs[n] = args[n]
        return nargs

    def overlaps(self, args: dict) -> bool:
        """True when a written buffer's address range meets another tensor argument's and the two
        are not provably disjoint (the full validation then decides, and refuses)."""
        for name, span, others in self.written:
            x = args[name]
            lo = x.data_ptr()
            hi = lo + span
            for other, ospan in others:
                y = args[other]
                p = y.data_ptr()
                if p < hi and lo < p + ospan and not interleaved_disjoint(x, y):
                    return True
        return False

    def check_values(self, args: dict) -> None:
        if self.value_check is not None:
            self.value_check(args)
        elif self.rules:
            _run_value_rules(self.rules, args, self.dims, refuse_in_capture=self.refuse_in_capture)


def _span(x: _Tensor) -> int:
    """Bytes from ``x``'s data pointer to the end of its last element (0 if empty)."""
    lo, hi = byte_range(x)
    return hi - lo


def plan_call(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool,
              on_no_backend: Callable) -> tuple[CallPlan, dict]:
    """Run the full validation and selection for a call; return its plan and its validated
    arguments (the value rules already ran on them). ``on_no_backend(exc, nargs, signature)`` turns
    a :class:`NoBackendError` into the error to raise."""
    from ..plugin.verdict import NoBackendError

    nargs, signature, dims = validate_call(op, args, check_values=validate, check_finite=check_finite)
    try:
        impl, decision = select(op, signature, _device_of(nargs), backend or None)
    except NoBackendError as e:
        raise on_no_backend(e, nargs, signature) from e
    rules = live_rules(value_rules_of(op, check_values=validate, check_finite=check_finite), nargs, dims)
    return CallPlan(op, nargs, dims, impl, decision, rules, check_finite), nargs


def class_key(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool) -> Optional[tuple]:
    """:func:`call_key` with the dim 0 of each length argument (:data:`LENGTH_ARGUMENTS`) bucketed:
    the key of a decode or prefill call's class (module docstring); None for the other ops and for
    a call without a key."""
    spec = OP_TABLE.get(op)
    lengths = LENGTH_ARGUMENTS.get(spec.phase) if spec is not None else None
    if lengths is None:
        return None
    return _key(op, args, backend, validate, check_finite, lengths)


#: per (op, argument names and classes): the call key's positions of the length arguments' shapes
_SHAPE_AT: dict = {}


def _class_of(op: str, key: Optional[tuple], args: dict) -> Optional[tuple]:
    """:func:`class_key` derived from the call's key ``key`` (:func:`call_key` of ``args``) without
    reading the tensors again: the key's shape entry of each length argument with its dim 0 bucketed.
    Where those entries are in the key depends on which arguments are tensors, None or other
    scalars only; kept per op and argument classes. None where :func:`class_key` gives None."""
    lengths = _LENGTHS_OF.get(op)
    if lengths is None or key is None:
        return None
    layout = (op, tuple(args), tuple(map(type, args.values())))
    at = _SHAPE_AT.get(layout)
    if at is None:
        at, i = [], 7  # op, backend, validate, check_finite, grad mode, policy, generation (_key)
        for name, x in args.items():
            cls = x.__class__
            if cls is _NoneType or cls is str:
                i += 1
            elif cls is _Tensor or (cls not in _SCALARS and isinstance(x, _Tensor)):
                if name in lengths:
                    at.append(i + 1)
                i += 7  # dtype, shape, stride, device, requires_grad, neg/conj view, layout
            else:
                i += 2
        at = _SHAPE_AT[layout] = tuple(at)
    out = list(key)
    for i in at:
        shape = out[i]
        if shape:
            out[i] = (min(shape[0], _LENGTH_BUCKETS), *shape[1:])
    return tuple(out)


class _ClassPlan:
    """A class's first plan (``plan``), its length arguments as ``(name, length, offset)`` (dim 0 =
    the length + offset, as the full validation accepted), the device's capabilities and every
    backend's size class of it; ``others``: per other outcome of the backends' size classes seen
    under the same class key (a new length that crossed a backend's threshold, e.g. torch-chunked's
    tokens per sequence), that outcome's first plan, so that lengths going back and forth across a
    threshold take the full path once per outcome (at most :data:`_OUTCOMES_MAX` kept)."""

    __slots__ = ("plan", "members", "sizes", "prefill", "caps", "others")

    def __init__(self, plan: CallPlan, nargs: dict, lengths: dict):
        self.plan, self.prefill = plan, OP_TABLE[plan.op].phase == "prefill"
        dims = plan.dims
        self.members = tuple((name, sym, nargs[name].shape[0] - dims[sym]) for name, sym in lengths.items()
                             if isinstance(nargs.get(name), _Tensor) and nargs[name].dim() >= 1)
        self.caps = resolve_device(_device_of(nargs))  # the class key holds the device
        self.sizes = _size_classes(plan.decision.problem, self.caps)
        self.others: dict = {}

    def add(self, other: "_ClassPlan") -> None:
        """Keep ``other`` (a plan of this class key with another size-class outcome) under its outcome."""
        if other.sizes != self.sizes and (other.sizes in self.others or len(self.others) < _OUTCOMES_MAX):
            self.others[other.sizes] = other


#: per class key, the other size-class outcomes kept (:attr:`_ClassPlan.others`)
_OUTCOMES_MAX = 8


def _size_classes(problem, caps) -> tuple:
    """Every registered backend's size class of ``problem`` (``selection.shape_class``'s second part)."""
    return shape_class(problem, (), caps, get_registry())[1]


def _lengths(entry: _ClassPlan, args: dict) -> Optional[dict]:
    """Step 1, the size check: each length (``t``, ``n``) of ``args`` from ``entry``'s length
    arguments and their offsets; None when two of them disagree (the full validation names them)."""
    got = {}
    for name, sym, offset in entry.members:
        size = args[name].shape[0] - offset
        if got.setdefault(sym, size) != size:
            return None
    return got


def _problem_for(entry: _ClassPlan, got: dict) -> tuple[dict, object]:
    """The plan's facts (``dims``) and the decision's problem for the lengths ``got`` (step 2)."""
    dims = dict(entry.plan.dims)
    dims.update(got)
    if entry.prefill:
        dims["max_seqlen"] = dims["t"] if dims["n"] == 1 else 0
    problem = entry.plan.decision.problem.model_copy(update={"n": dims["n"], "t": dims["t"],
                                                             "max_seqlen": dims["max_seqlen"]})
    return dims, problem


def _from_class(entry: _ClassPlan, args: dict) -> Optional[CallPlan]:
    """The plan of a new length of ``entry``'s class (module docstring, steps 1 to 3), or None when
    the size check fails or the backends' size classes give an outcome not seen in the class (the
    full path decides). An outcome seen before (``entry.others``) derives from its own first plan."""
    got = _lengths(entry, args)
    if got is None:
        return None  # lengths that disagree: the full validation names them
    dims, problem = _problem_for(entry, got)
    sizes = _size_classes(problem, entry.caps)
    if sizes != entry.sizes:
        entry = entry.others.get(sizes)
        if entry is None:
            return None  # another shape class: a new decision
        got = _lengths(entry, args)
        if got is None:
            return None
        dims, problem = _problem_for(entry, got)
    tmpl = entry.plan
    spans = dict(tmpl.spans)
    for name, sym, offset in entry.members:
        if spans[name]:  # non-empty in the whole class (dim 0 of size 0 is a class of its own)
            x = args[name]
            spans[name] += (x.shape[0] - tmpl.dims[sym] - offset) * x.stride(0) * x.element_size()
    return tmpl.for_lengths(tmpl.arguments(args) if tmpl.rules else args, dims, problem, spans)


def plan_miss(op: str, args: dict, key: Optional[tuple], exact_miss: bool, backend: Optional[str], validate: bool,
              check_finite: bool, on_no_backend: Callable) -> tuple[CallPlan, dict]:
    """The plan and checked arguments of a call whose key missed (``exact_miss``) or whose hit needs
    the full validation (an address overlap): from its class plan where one fits, else through
    :func:`plan_call`; kept under ``key`` (and a new class's plan under its class key)."""
    ckey = _class_of(op, key, args) if exact_miss else None
    if ckey is not None:
        entry = lookup_class(ckey)
        plan = None if entry is None else _from_class(entry, args)
        if plan is not None:
            nargs = prepare_hit(plan, args)
            if nargs is not None:
                store(key, plan)
                return plan, nargs
    plan, nargs = plan_call(op, args, backend, validate, check_finite, on_no_backend)
    store(key, plan)
    if ckey is not None:
        lengths = LENGTH_ARGUMENTS[OP_TABLE[op].phase]
        try:
            entry = _classes.get(ckey)
            if entry is None:
                _classes.put(ckey, _ClassPlan(plan, nargs, lengths))
            else:  # the class's size classes gave another outcome (or its plan could not be derived)
                entry.add(_ClassPlan(plan, nargs, lengths))
        except TypeError:
            pass
    return plan, nargs


def lookup_class(ckey: tuple) -> Optional[_ClassPlan]:
    try:
        return _classes.get(ckey)
    except TypeError:
        return None


def lookup(key: tuple) -> Optional[CallPlan]:
    """The plan of ``key``, or None (also for a key that cannot be hashed, e.g. a list passed as a
    tensor argument: the full validation then refuses the call with its own message)."""
    try:
        return _plans.get(key)
    except TypeError:
        return None


def store(key: tuple, plan: CallPlan) -> None:
    """Keep ``plan`` under ``key``; beyond :data:`~linattn.dispatch.lru.CALL_PLANS_MAX` plans the least
    recently used one is dropped (one full validation rebuilds it). A call without a key (None:
    :func:`call_key`) is not kept."""
    if key is None:
        return
    try:
        _plans.put(key, plan)
    except TypeError:
        pass


def prepare_hit(plan: CallPlan, args: dict) -> Optional[dict]:
    """The keyword arguments of a key hit, checked (steps 1 to 3 of the module docstring), or None
    when an address overlap needs the full validation. A plan with a prepared launch reads only
    the tensors, which the caller's dict holds under the same names: it is returned as is."""
    if plan.written and (plan.overlaps(args) or any_unwritable(args, plan.written)):
        return None  # the full validation decides (and refuses an unwritable buffer: F33)
    if plan.rules:
        plan.check_values(args)
    _note_decision(plan.op, plan)  # the plan stands for its decision (CallPlan.decision, read when asked)
    return args if plan.prepared is not None else plan.arguments(args)


def _device_of(args: dict) -> torch.device:
    for v in args.values():
        if isinstance(v, _Tensor):
            return v.device
    return torch.device("cpu")


def run_plan(plan: CallPlan, nargs: dict):
    """Steps 4 and 5: the backend's view copies, then the prepared launch or the op method.
    (Plugins' results are checked by the caller, ``linattn/ops.py``.)"""
    copies = plan.copies
    if copies is None:  # the first run: which views this backend gets copied (fixed by the key's strides)
        conformed = conform_inputs(plan.op, nargs, plan.impl)
        plan.copies = tuple(n for n, x in conformed.items() if x is not nargs[n])
        nargs = conformed
    elif copies:
        nargs = dict(nargs)
        for n in copies:
            nargs[n] = nargs[n].contiguous()
    prepared = plan.prepared
    if prepared is None and plan.prepare is not None:
        prepared = plan.prepared = plan.prepare(plan.op, nargs)  # None: the backend has no plan for the op
        if getattr(prepared, "serves_class", False):
            plan.replay, prepared = prepared, prepared.bind(nargs)
            plan.prepared = prepared
        if prepared is None:
            plan.prepare = None
    if prepared is not None:
        return prepared(nargs)
    return plan.impl.run(plan.op, **nargs)
