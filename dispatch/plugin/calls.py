"""Call objects of plugin API 2: one frozen, typed record per validated op call.

A backend written for plugin API 2 implements one method per phase, each taking one of these
(``backends/base.py``)::

    def decode(self, call: DecodeCall) -> Tensor                      # o [N, T, HV, V]
    def prefill(self, call: PrefillCall) -> tuple[Tensor, Optional[Tensor]]  # (o [T, HV, V], final state or None)
    def gating(self, call: GatingCall) -> tuple[Tensor, Tensor]      # (g, beta), fp32
    def clamp(self, call: ClampCall) -> Tensor                        # out [M, D]

The classes are written out, so IDEs and type checkers see their fields; each is held to the op
table's argument entries (``dispatch/rules/ops_table.py`` ``Arg``: name, ``call_annotation``,
default) by ``tests/plugins/test_call_types.py``, which names the field to add when an argument is
added to the table without it. Construction is by keyword only. The field order is the one
documented before the classes were generated from the table (required tensors, the gates, the
second release's slot arguments, then the options); a new field goes after them. Every field is named
as in the op contract (docs/ops.md, ``linattn/ops.py``) and holds what the
validation layer checked and normalised: ``scale`` is a float, ``state_layout`` is ``"vk"`` or
``"kv"``, index and shape rules hold. Which op it is, its family (``gdn``: one decay per value
head; ``kda``: one per key channel) and, for prefill, the mode (``pool`` or ``dense``) are
properties of the call, read from the op table (``call.spec``). Arguments an op does not take
are None (``lower_bound`` of a GDN call).

A plugin-API-1 backend (one method per op, named after the op, taking keywords) is run through
the adapter: ``call.arguments()`` gives exactly the keywords of its op method, the second
release's ``g`` / ``beta`` / ``has_initial_state`` / ``output_state_indices`` / ``checkpoint_*`` only when given (:meth:`OpCall.arguments`).

Example:
    >>> import torch
    >>> call = make_call("silu_and_mul_clamp", {"x": torch.ones(2, 4), "limit": 10.0})
    >>> call.op, call.family, call.limit, sorted(call.arguments())
    ('silu_and_mul_clamp', 'swiglu', 10.0, ['limit', 'x'])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from ..rules.ops_table import OP_TABLE, OpSpec

__all__ = ["CALL_TYPES", "ClampCall", "DecodeCall", "GatingCall", "OpCall", "PrefillCall", "make_call"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OpCall:
    """What every call object has: its op's row of the op table (left out of the repr)."""

    spec: OpSpec = dataclasses.field(repr=False)

    @property
    def op(self) -> str:
        """The op name (``gdn_decode``, ...)."""
        return self.spec.name

    @property
    def family(self) -> str:
        """``gdn``, ``kda`` or ``swiglu``."""
        return self.spec.family

    def arguments(self) -> dict:
        """The op's keyword arguments as a plugin-API-1 op method takes them (``backends/base.py``):
        every argument of the op contract, the second release's only when given (not None)."""
        given = self.spec.only_when_given
        out = {}
        for name in self.spec.arguments:
            value = getattr(self, name)
            if value is None and name in given:
                continue
            out[name] = value
        return out

    def replace(self, **changes) -> "OpCall":
        """A copy with some fields changed (e.g. a backend handing a contiguous ``q`` on)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodeCall(OpCall):
    """``gdn_decode`` / ``kda_decode``: one step (T = 1) or a speculative verify (T > 1) over a pool.

    Tensors: ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``; raw gates ``a [N, T, HV]`` (KDA
    ``[N, T, HV, K]``), ``b [N, T, HV]``, ``A_log [HV]``, ``dt_bias [HV]`` (KDA ``[HV, K]``), or
    precomputed gates ``g`` (shaped as ``a``, fp32 log decay) and ``beta [N, T, HV]`` (fp32), the
    other form None; ``state_pool [P, HV, V, K]`` (``state_layout="vk"``) or ``[P, HV, K, V]``
    (``"kv"``), written in place; ``state_indices [N]`` or ``[N, T]`` (negative: padding);
    optional ``has_initial_state [N]`` bool, ``output_state_indices [N]`` (write slots, with an
    ``[N]`` ``state_indices``: read there, written here), ``intermediate_states [S, steps, HV, V, K]`` with
    ``intermediate_state_indices [N]``, ``num_accepted_tokens [N]``; ``scale`` is ``K ** -0.5`` unless
    the caller gave one; ``lower_bound`` is KDA's (None in a GDN call).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    state_pool: Tensor
    state_indices: Tensor
    a: Optional[Tensor] = None
    b: Optional[Tensor] = None
    A_log: Optional[Tensor] = None
    dt_bias: Optional[Tensor] = None
    g: Optional[Tensor] = None
    beta: Optional[Tensor] = None
    has_initial_state: Optional[Tensor] = None
    output_state_indices: Optional[Tensor] = None
    scale: float  # K ** -0.5 unless the caller gave one
    use_qk_l2norm: bool = True
    state_layout: str = "vk"
    intermediate_states: Optional[Tensor] = None
    intermediate_state_indices: Optional[Tensor] = None
    disable_state_update: bool = False
    num_accepted_tokens: Optional[Tensor] = None
    softplus_beta: float = 1.0
    softplus_threshold: float = 20.0
    lower_bound: Optional[float] = None  # KDA only

    @property
    def mode(self) -> str:
        return "pool"

    @property
    def precomputed_gates(self) -> bool:
        """The gate form: ready ``g`` / ``beta`` instead of ``a, b, A_log, dt_bias``."""
        return self.g is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefillCall(OpCall):
    """``gdn_prefill`` / ``kda_prefill``: chunked prefill over varlen sequences.

    Tensors: ``q, k [T, H, K]``, ``v [T, HV, V]``, ``g [T, HV]`` (KDA ``[T, HV, K]``) fp32 log decay,
    ``beta [T, HV]`` fp32, ``cu_seqlens [N + 1]``; pool mode: ``state_pool [P, HV, V, K]`` (or
    ``[P, HV, K, V]``) with ``state_indices [N]`` and optional ``has_initial_state [N]`` and
    ``output_state_indices [N]`` (write slots; None = write where read), ``checkpoint_every`` (tokens,
    a multiple of 64) with ``checkpoint_indices [N, max_checkpoints]`` (slots for the states after
    every ``checkpoint_every`` tokens, -1 = none); dense mode:
    ``initial_state [N, HV, V, K]`` or None. Returns ``(o, None)`` in pool mode, ``(o, final_state)``
    in dense mode; ``scale`` is ``K ** -0.5`` unless the caller gave one.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    beta: Tensor
    cu_seqlens: Tensor
    state_pool: Optional[Tensor] = None
    state_indices: Optional[Tensor] = None
    initial_state: Optional[Tensor] = None
    has_initial_state: Optional[Tensor] = None
    output_state_indices: Optional[Tensor] = None
    checkpoint_every: Optional[int] = None
    checkpoint_indices: Optional[Tensor] = None
    scale: float  # K ** -0.5 unless the caller gave one
    use_qk_l2norm: bool = True
    state_layout: str = "vk"

    @property
    def mode(self) -> str:
        """``pool`` (state_pool + state_indices, updated in place) or ``dense``."""
        return "pool" if self.state_pool is not None else "dense"


@dataclass(frozen=True, kw_only=True, slots=True)
class GatingCall(OpCall):
    """``gdn_gating`` / ``kda_gating``: ``A_log [HV]``, ``a [..., HV]`` (KDA ``[..., HV, K]``),
    ``b [..., HV]``, ``dt_bias [HV]`` (KDA ``[HV, K]``); KDA's optional bounded gate ``lower_bound``
    (None in a GDN call). Returns ``(g, beta)`` in fp32 (fp64 for fp64 inputs), shaped as ``a`` and ``b``."""

    A_log: Tensor
    a: Tensor
    b: Tensor
    dt_bias: Tensor
    softplus_beta: float = 1.0
    softplus_threshold: float = 20.0
    lower_bound: Optional[float] = None  # KDA only


@dataclass(frozen=True, kw_only=True, slots=True)
class ClampCall(OpCall):
    """``silu_and_mul_clamp``: ``x [M, 2D]`` (gate || up) and ``limit`` (None or a float > 0).
    Returns ``[M, D]`` in x's dtype."""

    x: Tensor
    limit: Optional[float] = None


#: backend method (``OpSpec.method``) -> its call type
CALL_TYPES: dict[str, type] = {"decode": DecodeCall, "prefill": PrefillCall, "gating": GatingCall,
                               "clamp": ClampCall}


def make_call(op: str, kwargs: dict) -> OpCall:
    """The call object of ``op`` from its validated, normalised keyword arguments (the output of
    ``dispatch/rules/validate.py``); arguments left out (the second release's, when not given) are None.

    Raises:
        KeyError: ``op`` is not an op. TypeError: an argument the op contract does not have.
    """
    spec = OP_TABLE[op]
    return CALL_TYPES[spec.method](spec=spec, **kwargs)
