"""The op table: every fact about an op, in one place.

One :class:`OpSpec` per op says its family (``gdn``, ``kda``, ``swiglu``), its policy phase
(``gating``, ``decode``, ``prefill``, ``mlp``), the plugin-API-2 backend method that runs it
(``gating``, ``decode``, ``prefill``, ``clamp``), its arguments, the host and value rules the
validation layer runs, and the model preset it is explained with by default. Each argument is one
:class:`Arg` (name, tensor or scalar type, default, whether it is written in place, the
:class:`Flag` it sets, the release that added it, what its dim 0 counts, a one-line doc); the
required arguments, the defaults, the mutated tensors, the second release's arguments and the
public signature's order are read from them.

Everything else reads these facts from here: validation and its signature (``dispatch/rules/validate.py``),
the problem model's flag fields (``dispatch/plugin/problem.py``), the policy keys, the public ops' custom
ops and fake registrations (``linattn/ops.py``), the backends' feature predicate, the result
checks, the self-check's kernel classes, the fast path's length arguments, the presets and the
conformance suite. No code parses an op's name. A new optional argument is one :class:`Arg` here
(and a :class:`Flag` when backends must declare it), one host rule, one field of its call object
(``dispatch/plugin/calls.py``, written out for IDEs and type checkers), and the backends that
implement it; the public function's typed signature is held to :attr:`OpSpec.signature` by
``tests/api/test_op_signatures.py``, the call objects' fields to the arguments by
``tests/plugins/test_call_types.py``.

Shapes (docs/ops.md): decode ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``, ``state_pool [P, HV, V, K]``;
prefill ``q, k [T, H, K]``, ``v [T, HV, V]``, ``cu_seqlens [N + 1]``; gating ``a [..., HV]`` (KDA
``[..., HV, K]``); clamp ``x [M, 2D]``.

Example:
    >>> OP_TABLE["kda_decode"].family, OP_TABLE["kda_decode"].phase, OP_TABLE["kda_decode"].mutates
    ('kda', 'decode', ('state_pool', 'intermediate_states'))
    >>> find_op("gdn", "prefill")
    'gdn_prefill'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, Mapping, Optional

from torch import Tensor

from .host_rules import (_clamp_input, _cu_seqlens, _decode_flags, _decode_indices, _decode_qkv, _gdn_decode_gates,
                         _gdn_gating_inputs, _gdn_prefill_gates, _has_initial_state, _intermediate, _kda_decode_gates,
                         _kda_gating_inputs, _kda_prefill_gates, _lower_bound, _output_state_indices, _pool, _prefill_qkv, _prefill_state,
                         _checkpoints,
                         _same_device, _scale_and_norm, _softplus, _state_layout)
from .value_rules import (_v_cu_seqlens, _v_decode_log_decay, _v_intermediate, _v_log_decay, _v_num_accepted,
                          _v_output_state_indices, _v_shared_gate_params, _v_state_indices, _v_checkpoints)

Family = Literal["gdn", "kda", "swiglu"]
Phase = Literal["gating", "decode", "prefill", "mlp"]
Method = Literal["gating", "decode", "prefill", "clamp"]
#: The policy phases, in the order ``linattn.policy`` documents them.
PHASES: tuple[str, ...] = ("decode", "prefill", "gating", "mlp")
#: The plugin-API-2 backend methods, one per phase (``backends/base.py``).
METHODS: tuple[str, ...] = ("gating", "decode", "prefill", "clamp")
FAMILIES: tuple[str, ...] = ("gdn", "kda", "swiglu")


class _Required:
    """The default of an argument the caller must give (:data:`REQUIRED`)."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of an :class:`Arg` that must be given.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Flag:
    """A yes/no fact of a call that an optional argument sets: a :class:`~linattn.dispatch.plugin.problem.Problem`
    field, part of the selection's shape class and the self-check's kernel class.

    Fields:
        name: the ``Problem`` field.
        doc: its description (``Problem.model_fields[name].description``).
        feature: a backend runs a call with it only when it declares it in ``Backend.features``
            (``backends/base.py``; the ``supports_features`` predicate, reason ``feature``).
        needs: for a feature, what such a call asks, as the rejection names it.
    """

    name: str
    doc: str
    feature: bool = False
    needs: str = ""


#: Every flag, in ``Problem``'s field order: the plain flags, then the features.
FLAGS: tuple[Flag, ...] = (
    Flag("intermediate_states", "intermediate_states is given (decode): the state after every token is stored"),
    Flag("num_accepted_tokens", "num_accepted_tokens [N] is given (decode over an [N, T] slot table)"),
    Flag("disable_state_update", "disable_state_update=True (decode): no pool slot is written"),
    Flag("lower_bound", "lower_bound is given (KDA): the bounded gate"),
    Flag("clamp_limit", "limit is given (SwiGLU clamp)"),
    Flag("precomputed_gates", "decode takes ready gates g / beta instead of a, b, A_log, dt_bias (only a "
         "backend declaring the feature may run it)", True,
         "decode from precomputed gates (g=, beta= instead of a, b, A_log, dt_bias)"),
    Flag("has_initial_state", "a has_initial_state [N] mask is given: sequences marked False start from a "
         "zero state without reading their slot", True,
         "has_initial_state= (sequences starting from a zero state without reading their slot)"),
    Flag("output_state_indices", "output_state_indices [N] is given: each sequence writes its final state to "
         "a slot of its own, read from state_indices", True,
         "output_state_indices= (final states written to other slots than the ones read)"),
    Flag("checkpoints", "checkpoint_every / checkpoint_indices are given (pool-mode prefill): the state every "
         "checkpoint_every tokens is written to named slots", True,
         "checkpoint_every= / checkpoint_indices= (states every checkpoint_every tokens written to pool slots)"),
)
#: The flags a backend must declare to run a call that sets them (``Backend.features``).
FEATURES: tuple[str, ...] = tuple(f.name for f in FLAGS if f.feature)


@dataclass(frozen=True)
class Arg:
    """One argument of an op's contract, named as in the public function and the call objects.

    Fields:
        name: the argument (``state_pool``, ``has_initial_state``, ...).
        type: what a given value is: ``Tensor`` or a scalar type (``float``, ``int``, ``bool``, ``str``).
        default: :data:`REQUIRED`, or the value when not given (None: unset).
        doc: shape, dtype and meaning, one line (docs/ops.md has the contract).
        mutated: written in place (declared to ``torch.library``, never copied, alias-checked).
        flag: the :class:`Flag` a given value sets (a ``bool`` argument: its value).
        since: the release that added it; ``2``: a plugin-API-1 backend is handed it only when the
            caller gives it, and the public function and the custom op take it after ``backend``,
            ``validate`` and ``check_finite``.
        length: what dim 0 is when it changes from call to call (``n``: sequences, ``t``: tokens);
            the per-call fast path buckets it (``dispatch/runtime/fast_path.py``).
        filled: a host rule fills in the default (``scale``: ``K ** -0.5``), so the call object's
            field has no default.
        refuses_none: None is the default, but a host rule refuses it with its own message (decode's
            ``state_indices``); the custom op and the call object take it as required.
    """

    name: str
    type: type
    default: Any = REQUIRED
    doc: str = ""
    mutated: bool = False
    flag: str = ""
    since: int = 1
    length: str = ""
    filled: bool = False
    refuses_none: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def tensor(self) -> bool:
        return self.type is Tensor

    @property
    def annotation(self):
        """The type the custom op takes: ``Optional[type]`` when None is a valid value."""
        return Optional[self.type] if self.default is None and not self.refuses_none else self.type

    @property
    def call_annotation(self):
        """The type of the validated call object's field (``dispatch/plugin/calls.py``)."""
        return self.type if self.filled or self.refuses_none else Optional[self.type] if self.default is None \
            else self.type


#: The call options every public op and custom op takes besides its contract (``linattn/ops.py``):
#: name, type, default of the public function.
CALL_OPTIONS: tuple[Arg, ...] = (
    Arg("backend", str, None, "force a backend by name"),
    Arg("validate", bool, True, "run the value rules (one device sync; skipped in capture)"),
    Arg("check_finite", bool, False, "refuse NaN / inf inputs before computing (one device sync)"),
)


@dataclass(frozen=True, eq=False)
class OpSpec:
    """Everything linattn knows about one op (see the module docstring).

    Fields:
        name: the op name (``gdn_decode``, ...), the public function and the custom op
            ``torch.ops.linattn.<name>``.
        family: ``gdn`` (one decay per value head), ``kda`` (one decay per key channel) or
            ``swiglu`` (the SwiGLU clamp).
        phase: the policy key it is forced and disabled under (``LINATTN_BACKEND=decode=...``).
        method: the backend method that runs it under plugin API 2 (``Backend.decode(call)``, ...).
        args: its arguments (:class:`Arg`), in the order of the public function's signature (less
            the call options); required ones, defaults (None: unset; ``scale`` is filled in by a
            host rule as ``K ** -0.5``), the mutated tensors and the second release's arguments
            are read from them.
        host_rules / value_rules: the validation rules, in the order they run.
        mode: the ``Problem.mode`` before the rules look at the call (prefill's rule switches
            ``dense`` to ``pool`` when a pool is given).
        default_preset: the model preset (``linattn/presets.toml``) the op is explained and
            benchmarked with when none is named.
    """

    name: str
    family: Family
    phase: Phase
    method: Method
    args: tuple[Arg, ...]
    host_rules: tuple = ()
    value_rules: tuple = ()
    mode: Literal["pool", "dense", "none"] = "none"
    default_preset: str = ""
    notes: str = field(default="", repr=False)

    @cached_property
    def arg(self) -> Mapping[str, Arg]:
        """Argument name -> :class:`Arg`."""
        return MappingProxyType({a.name: a for a in self.args})

    @cached_property
    def required(self) -> tuple[str, ...]:
        """The arguments that must be given (not None)."""
        return tuple(a.name for a in self.args if a.required)

    @cached_property
    def defaults(self) -> Mapping[str, Any]:
        """The optional arguments and their defaults."""
        return MappingProxyType({a.name: a.default for a in self.args if not a.required})

    @cached_property
    def arguments(self) -> tuple[str, ...]:
        """Every argument of the op contract, required ones first, in table order."""
        return (*self.required, *self.defaults)

    @cached_property
    def keys(self) -> frozenset[str]:
        return frozenset(self.arguments)

    @cached_property
    def mutates(self) -> tuple[str, ...]:
        """The tensor arguments written in place (declared to ``torch.library``, never copied, alias-checked)."""
        return tuple(a.name for a in self.args if a.mutated)

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """The arguments that are read and never written (all but :attr:`mutates`)."""
        return tuple(k for k in self.arguments if k not in self.mutates)

    @cached_property
    def only_when_given(self) -> tuple[str, ...]:
        """The second release's arguments (``since=2``): a plugin-API-1 backend is handed them only
        when the caller gives them (its ``features`` must declare them, ``backends/base.py``)."""
        return tuple(a.name for a in self.args if a.since > 1)

    @cached_property
    def signature(self) -> tuple[Arg, ...]:
        """The public function's and the custom op's parameters, in order: the first release's
        arguments, the call options (:data:`CALL_OPTIONS`), the second release's."""
        return (*(a for a in self.args if a.since == 1), *CALL_OPTIONS, *(a for a in self.args if a.since > 1))

    @property
    def writes_pool(self) -> bool:
        """The op works on a recurrent state (pool or dense) that it writes: state dtypes, state
        layouts and head dims apply to it."""
        return "state_pool" in self.mutates

    @property
    def has_state(self) -> bool:
        """Whether state dtypes, state layouts and head dims apply (decode and prefill)."""
        return self.writes_pool

    @property
    def per_channel_gates(self) -> bool:
        """KDA: the gates ``g`` / ``a`` and ``dt_bias`` carry a key-channel dim ``K``."""
        return self.family == "kda"

    def takes(self, argument: str) -> bool:
        """Whether ``argument`` is part of this op's contract (e.g. ``lower_bound`` for KDA only)."""
        return argument in self.keys


# -- the rows ------------------------------------------------------------------------------------
# Shapes: docs/ops.md "Symbols". KDA's gates carry a key-channel dim K where GDN's do not.

_SOFTPLUS = (Arg("softplus_beta", float, 1.0, "softplus sharpness; finite, > 0"),
             Arg("softplus_threshold", float, 20.0, "softplus is linear above it; finite, > 0"))
_SCALE_NORM_LAYOUT = (
    Arg("scale", float, None, "query scale, > 0; None: K ** -0.5", filled=True),
    Arg("use_qk_l2norm", bool, True, "L2-normalise q and k"),
    Arg("state_layout", str, "vk", "'vk': states [.., V, K] (K contiguous); 'kv': [.., K, V]"))
_GATING_ARGS = (
    Arg("A_log", Tensor, doc="[HV] fp32: log of the decay rate"),
    Arg("a", Tensor, doc="[..., HV] (KDA [..., HV, K]): raw decay input"),
    Arg("b", Tensor, doc="[..., HV]: raw write strength (beta = sigmoid(b))"),
    Arg("dt_bias", Tensor, doc="[HV] (KDA [HV, K]): added to a"))
_LOWER_BOUND = Arg("lower_bound", float, None, "KDA: None, or a finite bound < 0 for the bounded gate "
                   "g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))", flag="lower_bound")


def _decode_args(family: Family) -> tuple[Arg, ...]:
    kda = family == "kda"
    return (
        Arg("q", Tensor, doc="[N, T, H, K] bf16/fp16/fp32", length="n"),
        Arg("k", Tensor, doc="[N, T, H, K]", length="n"),
        Arg("v", Tensor, doc="[N, T, HV, V] (HV % H == 0, GVA)", length="n"),
        Arg("a", Tensor, None, f"[N, T, HV{', K' if kda else ''}] raw decay input (None: precomputed gates)",
            length="n"),
        Arg("b", Tensor, None, "[N, T, HV] raw write strength", length="n"),
        Arg("A_log", Tensor, None, "[HV]"),
        Arg("dt_bias", Tensor, None, f"[HV{', K' if kda else ''}]"),
        Arg("state_pool", Tensor, doc="[P, HV, V, K] ('vk') or [P, HV, K, V] ('kv'), fp32/bf16/fp64; written "
            "in place at the slots named", mutated=True),
        Arg("state_indices", Tensor, None, "[N] slots (negative: padding), or [N, T] per-token slots",
            length="n", refuses_none=True),
        *_SCALE_NORM_LAYOUT,
        Arg("intermediate_states", Tensor, None, "[S, steps >= T, HV, V, K]: the state after every token, at "
            "row intermediate_state_indices[n]", mutated=True, flag="intermediate_states"),
        Arg("intermediate_state_indices", Tensor, None, "[N] rows of intermediate_states (negative: skip)",
            length="n"),
        Arg("disable_state_update", bool, False, "leave the pool untouched (verify only)",
            flag="disable_state_update"),
        Arg("num_accepted_tokens", Tensor, None, "[N] in 0..T, with an [N, T] table: load from the slot of "
            "token num_accepted_tokens[n] - 1", length="n", flag="num_accepted_tokens"),
        *((_LOWER_BOUND,) if kda else ()),
        *_SOFTPLUS,
        Arg("g", Tensor, None, "precomputed fp32 log decay, shaped as a", since=2, length="n",
            flag="precomputed_gates"),
        Arg("beta", Tensor, None, "precomputed fp32 write strength [N, T, HV], already sigmoided", since=2,
            length="n", flag="precomputed_gates"),
        Arg("has_initial_state", Tensor, None, "[N] bool: False starts the row from a zero state without "
            "reading its slot", since=2, length="n", flag="has_initial_state"),
        Arg("output_state_indices", Tensor, None, "[N] write slots (None: write where read)", since=2,
            length="n", flag="output_state_indices"),
    )


def _prefill_args(family: Family) -> tuple[Arg, ...]:
    kda = family == "kda"
    return (
        Arg("q", Tensor, doc="[T, H, K] bf16/fp16/fp32", length="t"),
        Arg("k", Tensor, doc="[T, H, K]", length="t"),
        Arg("v", Tensor, doc="[T, HV, V]", length="t"),
        Arg("g", Tensor, doc=f"[T, HV{', K' if kda else ''}] fp32 log decay (<= 0)", length="t"),
        Arg("beta", Tensor, doc="[T, HV] fp32 write strength", length="t"),
        Arg("cu_seqlens", Tensor, doc="[N + 1] int32/int64 prefix sums of the sequence lengths", length="n"),
        Arg("state_pool", Tensor, None, "pool mode: [P, HV, V, K] (or [P, HV, K, V]), read at state_indices "
            "and written in place", mutated=True),
        Arg("state_indices", Tensor, None, "pool mode: [N] slots (negative: padding)", length="n"),
        Arg("initial_state", Tensor, None, "dense mode: [N, HV, V, K] (or [N, HV, K, V]), None: zeros",
            length="n"),
        *_SCALE_NORM_LAYOUT,
        Arg("has_initial_state", Tensor, None, "pool mode: [N] bool, False starts the sequence from a zero "
            "state without reading its slot", since=2, length="n", flag="has_initial_state"),
        Arg("output_state_indices", Tensor, None, "pool mode: [N] write slots (None: write where read)",
            since=2, length="n", flag="output_state_indices"),
        Arg("checkpoint_every", int, None, "pool mode: tokens between checkpoints, a positive multiple of 64",
            since=2, flag="checkpoints"),
        Arg("checkpoint_indices", Tensor, None, "pool mode: [N, max_checkpoints] slots of the checkpoints "
            "(-1: none)", since=2, length="n", flag="checkpoints"),
    )


_DECODE_RULES = (_decode_flags, _state_layout, _pool, _decode_indices, _has_initial_state, _output_state_indices,
                 _intermediate, _scale_and_norm, _softplus)
_DECODE_VALUES = (_v_state_indices, _v_output_state_indices, _v_intermediate, _v_num_accepted, _v_shared_gate_params,
                  _v_decode_log_decay)
_PREFILL_RULES = (_cu_seqlens, _state_layout, _pool, _prefill_state, _has_initial_state, _output_state_indices,
                  _checkpoints, _scale_and_norm, _same_device)
_PREFILL_VALUES = (_v_cu_seqlens, _v_state_indices, _v_output_state_indices, _v_checkpoints, _v_log_decay)
_PRESET = {"gdn": "qwen3-next", "kda": "kimi-linear", "swiglu": "deepseek-v4"}


def _gating(family: Family, args: tuple, rules: tuple) -> OpSpec:
    return OpSpec(f"{family}_gating", family, "gating", "gating", args, rules, (), "none", _PRESET[family])


def _decode(family: Family, rules: tuple) -> OpSpec:
    return OpSpec(f"{family}_decode", family, "decode", "decode", _decode_args(family), rules, _DECODE_VALUES,
                  "pool", _PRESET[family])


def _prefill(family: Family, gates) -> OpSpec:
    return OpSpec(f"{family}_prefill", family, "prefill", "prefill", _prefill_args(family),
                  (_prefill_qkv, gates, *_PREFILL_RULES), _PREFILL_VALUES, "dense", _PRESET[family])


_ROWS = (
    _gating("gdn", (*_GATING_ARGS, *_SOFTPLUS), (_gdn_gating_inputs, _softplus, _same_device)),
    _gating("kda", (*_GATING_ARGS, _LOWER_BOUND, *_SOFTPLUS),
            (_kda_gating_inputs, _lower_bound, _softplus, _same_device)),
    _decode("gdn", (_decode_qkv, _gdn_decode_gates, *_DECODE_RULES, _same_device)),
    _decode("kda", (_decode_qkv, _kda_decode_gates, *_DECODE_RULES, _lower_bound, _same_device)),
    _prefill("gdn", _gdn_prefill_gates),
    _prefill("kda", _kda_prefill_gates),
    OpSpec("silu_and_mul_clamp", "swiglu", "mlp", "clamp",
           (Arg("x", Tensor, doc="[M, 2D] = gate || up, bf16/fp16/fp32"),
            Arg("limit", float, None, "None (plain SwiGLU), or a finite bound > 0", flag="clamp_limit")),
           (_clamp_input, _same_device), (), "none", _PRESET["swiglu"]),
)

#: op name -> :class:`OpSpec`, in the order ``linattn.dispatch.OPS`` lists the ops.
OP_TABLE: Mapping[str, OpSpec] = MappingProxyType({s.name: s for s in _ROWS})
OPS: tuple[str, ...] = tuple(OP_TABLE)


def op_spec(op: str) -> OpSpec:
    """The :class:`OpSpec` of ``op``.

    Raises:
        ValueError: ``op`` is not an op; the message lists the ops.
    """
    spec = OP_TABLE.get(op)
    if spec is None:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}.")
    return spec


def find_op(family: str, phase: str) -> Optional[str]:
    """The op of ``family`` in ``phase`` (``find_op("kda", "decode") == "kda_decode"``), or None
    when the family has none (the SwiGLU clamp has no decode op)."""
    return next((s.name for s in _ROWS if s.family == family and s.phase == phase), None)


def ops_of(family: str) -> tuple[str, ...]:
    """Every op of ``family``, in table order."""
    return tuple(s.name for s in _ROWS if s.family == family)
