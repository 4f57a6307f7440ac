"""The op table: every fact about an op, in one place.

One :class:`OpSpec` per op says its family (``gdn``, ``kda``, ``swiglu``), its policy phase
(``gating``, ``decode``, ``prefill``, ``mlp``), the plugin-API-2 backend method that runs it
(``gating``, ``decode``, ``prefill``, ``clamp``), whether it writes a state pool, its required
arguments and the defaults of the optional ones, the host and value rules the validation layer
runs, the tensor arguments it mutates in place, the arguments a first-release backend only sees
when given, and the model preset it is explained with by default.

Everything else reads these facts from here: validation (``dispatch/validate.py``), the problem
model and the policy keys, the public ops and their ``torch.library`` registration
(``linattn/ops.py``), the backends' predicates, the result checks, the call objects of the plugin
API (``dispatch/calls.py``), the presets and the conformance suite. No code parses an op's name.

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
        writes_pool: the op works on a recurrent state (pool or dense): state dtypes, state
            layouts and head dims apply to it.
        required: arguments that must be given (not None).
        defaults: optional arguments and their defaults (None: unset; ``scale`` is filled in by
            a host rule as ``K ** -0.5``).
        host_rules / value_rules: the validation rules, in the order they run.
        mode: the ``Problem.mode`` before the rules look at the call (prefill's rule switches
            ``dense`` to ``pool`` when a pool is given).
        mutates: tensor arguments written in place (declared to ``torch.library``, never copied,
            alias-checked).
        only_when_given: second-release arguments a plugin-API-1 backend is handed only when the
            caller gives them (its ``features`` must declare them, ``backends/base.py``).
        default_preset: the model preset (``linattn/presets.toml``) the op is explained and
            benchmarked with when none is named.
    """

    name: str
    family: Family
    phase: Phase
    method: Method
    writes_pool: bool
    required: tuple[str, ...]
    defaults: Mapping[str, Any]
    host_rules: tuple = ()
    value_rules: tuple = ()
    mode: Literal["pool", "dense", "none"] = "none"
    mutates: tuple[str, ...] = ()
    only_when_given: tuple[str, ...] = ()
    default_preset: str = ""
    notes: str = field(default="", repr=False)

    @cached_property
    def arguments(self) -> tuple[str, ...]:
        """Every argument of the op contract, required ones first, in table order."""
        return (*self.required, *self.defaults)

    @cached_property
    def keys(self) -> frozenset[str]:
        return frozenset(self.arguments)

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """The arguments that are read and never written (all but :attr:`mutates`)."""
        return tuple(k for k in self.arguments if k not in self.mutates)

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

_SOFTPLUS = {"softplus_beta": 1.0, "softplus_threshold": 20.0}
_GATING_REQ = ("A_log", "a", "b", "dt_bias")
_DECODE_REQ = ("q", "k", "v", "state_pool")
#: decode's gates: the raw form (a, b, A_log, dt_bias) or the precomputed form (g, beta), exactly one
#: (host rule ``_decode_gates``); has_initial_state [N] bool and output_state_indices [N] (the write
#: slots, when they differ from the read slots state_indices) in pool mode, decode and prefill
_DECODE_OPT = {"a": None, "b": None, "A_log": None, "dt_bias": None, "g": None, "beta": None,
               "has_initial_state": None, "output_state_indices": None, "state_indices": None, "scale": None, "use_qk_l2norm": True,
               "state_layout": "vk", "intermediate_states": None, "intermediate_state_indices": None,
               "disable_state_update": False, "num_accepted_tokens": None, **_SOFTPLUS}
_PREFILL_REQ = ("q", "k", "v", "g", "beta", "cu_seqlens")
_PREFILL_OPT = {"state_pool": None, "state_indices": None, "initial_state": None, "has_initial_state": None,
                "output_state_indices": None, "checkpoint_every": None, "checkpoint_indices": None, "scale": None,
                "use_qk_l2norm": True, "state_layout": "vk"}
_DECODE_RULES = (_decode_flags, _state_layout, _pool, _decode_indices, _has_initial_state, _output_state_indices,
                 _intermediate, _scale_and_norm, _softplus)
_DECODE_VALUES = (_v_state_indices, _v_output_state_indices, _v_intermediate, _v_num_accepted, _v_shared_gate_params,
                  _v_decode_log_decay)
_PREFILL_RULES = (_cu_seqlens, _state_layout, _pool, _prefill_state, _has_initial_state, _output_state_indices,
                  _checkpoints, _scale_and_norm, _same_device)
_PREFILL_VALUES = (_v_cu_seqlens, _v_state_indices, _v_output_state_indices, _v_checkpoints, _v_log_decay)
_DECODE_WRITES = ("state_pool", "intermediate_states")
_PRESET = {"gdn": "qwen3-next", "kda": "kimi-linear", "swiglu": "deepseek-v4"}


def _gating(family: Family, opt: dict, rules: tuple) -> OpSpec:
    return OpSpec(f"{family}_gating", family, "gating", "gating", False, _GATING_REQ, MappingProxyType(opt),
                  rules, (), "none", default_preset=_PRESET[family])


def _decode(family: Family, opt: dict, rules: tuple) -> OpSpec:
    return OpSpec(f"{family}_decode", family, "decode", "decode", True, _DECODE_REQ, MappingProxyType(opt),
                  rules, _DECODE_VALUES, "pool", _DECODE_WRITES, ("g", "beta", "has_initial_state", "output_state_indices"),
                  _PRESET[family])


def _prefill(family: Family, gates) -> OpSpec:
    return OpSpec(f"{family}_prefill", family, "prefill", "prefill", True, _PREFILL_REQ,
                  MappingProxyType(dict(_PREFILL_OPT)), (_prefill_qkv, gates, *_PREFILL_RULES), _PREFILL_VALUES,
                  "dense", ("state_pool",),
                  ("has_initial_state", "output_state_indices", "checkpoint_every", "checkpoint_indices"),
                  _PRESET[family])


_ROWS = (
    _gating("gdn", dict(_SOFTPLUS), (_gdn_gating_inputs, _softplus, _same_device)),
    _gating("kda", {"lower_bound": None, **_SOFTPLUS}, (_kda_gating_inputs, _lower_bound, _softplus, _same_device)),
    _decode("gdn", dict(_DECODE_OPT), (_decode_qkv, _gdn_decode_gates, *_DECODE_RULES, _same_device)),
    _decode("kda", {**_DECODE_OPT, "lower_bound": None},
            (_decode_qkv, _kda_decode_gates, *_DECODE_RULES, _lower_bound, _same_device)),
    _prefill("gdn", _gdn_prefill_gates),
    _prefill("kda", _kda_prefill_gates),
    OpSpec("silu_and_mul_clamp", "swiglu", "mlp", "clamp", False, ("x",), MappingProxyType({"limit": None}),
           (_clamp_input, _same_device), (), "none", default_preset=_PRESET["swiglu"]),
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
