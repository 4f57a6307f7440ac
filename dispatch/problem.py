"""The :class:`Problem`: what a call asks for, as far as choosing a backend is concerned.

It holds shapes, dtypes, layout and flags, never tensors, so it can be built from a model preset
(``linattn explain``) as well as from a real call, hashed, cached and printed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .ops_table import OP_TABLE, OPS, OpSpec, Phase, op_spec

Op = Literal[OPS]  # type: ignore[valid-type]  # the op table's names (dispatch/ops_table.py)
DTypeName = Literal["float32", "bfloat16", "float16", "float64"]

__all__ = ["OPS", "Op", "Phase", "Problem", "phase_of"]


def phase_of(op: str) -> str:
    """The policy phase an op belongs to (``decode``, ``prefill``, ``gating`` or ``mlp``), from the
    op table.

    Raises:
        ValueError: ``op`` is not an op.
    """
    return op_spec(op).phase


class Problem(BaseModel):
    """Shapes and flags of one op call.

    Symbols as in docs/ops.md: ``n`` sequences (decode batch rows, or prefill sequences; rows ``M`` for
    ``silu_and_mul_clamp``), ``t`` tokens per sequence (decode) or total tokens (prefill), ``h``
    q/k heads, ``hv`` value heads, ``k``/``v`` head dims, ``d`` the clamp's output width.

    Example:
        >>> Problem(op="gdn_decode", n=4096, t=1, h=16, hv=32, k=128, v=128).phase
        'decode'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Op
    n: int = Field(1, ge=0)
    t: int = Field(1, ge=0)
    h: int = Field(1, ge=0)
    hv: int = Field(1, ge=0)
    k: int = Field(0, ge=0)
    v: int = Field(0, ge=0)
    d: int = Field(0, ge=0)
    dtype: DTypeName = "bfloat16"
    state_dtype: DTypeName = "float32"
    state_layout: Literal["vk", "kv"] = "vk"
    mode: Literal["pool", "dense", "none"] = "pool"
    max_seqlen: int = Field(0, ge=0, description="longest sequence (prefill); 0 = unknown")
    intermediate_states: bool = False
    num_accepted_tokens: bool = False
    disable_state_update: bool = False
    lower_bound: bool = False
    clamp_limit: bool = False
    state_tiles_contiguous: bool = Field(True, description="every written state buffer (pool, intermediate "
                                         "states) holds each (slot, head) state matrix as one dense block "
                                         "(last two dims contiguous); slot and head pitch are free")
    requires_grad: bool = Field(False, description="grad mode is on and a tensor argument requires grad "
                                "(only a backend declaring autograd support may run it)")
    precomputed_gates: bool = Field(False, description="decode takes ready gates g / beta instead of a, b, "
                                    "A_log, dt_bias (only a backend declaring the feature may run it)")
    has_initial_state: bool = Field(False, description="a has_initial_state [N] mask is given: sequences marked "
                                    "False start from a zero state without reading their slot")
    output_state_indices: bool = Field(False, description="output_state_indices [N] is given: each sequence "
                                       "writes its final state to a slot of its own, read from state_indices")
    checkpoints: bool = Field(False, description="checkpoint_every / checkpoint_indices are given (pool-mode "
                              "prefill): the state every checkpoint_every tokens is written to named slots")

    @model_validator(mode="after")
    def _consistent(self) -> "Problem":
        spec = OP_TABLE[self.op]
        if spec.method == "clamp":
            if self.d < 1:
                raise ValueError(f"{self.op} needs d >= 1 (the output width D), got d={self.d}")
        elif spec.has_state:
            for name in ("h", "hv", "k", "v"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{self.op} needs {name} >= 1, got {name}={getattr(self, name)}: give the "
                                     f"model's shape (h, hv, k, v) or use a preset (linattn.presets())")
            if self.hv % self.h:
                raise ValueError(f"hv={self.hv} must be a multiple of h={self.h} (GVA)")
            if self.phase == "prefill" and self.n == 0 and self.t > 0:
                raise ValueError(f"{self.t} tokens in n=0 sequences: give n >= 1")
        return self

    @property
    def spec(self) -> OpSpec:
        """The op's row of the op table (family, phase, arguments, rules, ...)."""
        return OP_TABLE[self.op]

    @property
    def phase(self) -> str:
        return OP_TABLE[self.op].phase

    @property
    def family(self) -> str:
        """``gdn``, ``kda`` or ``swiglu`` (the clamp), from the op table."""
        return OP_TABLE[self.op].family

    def brief(self) -> str:
        if OP_TABLE[self.op].method == "clamp":
            return f"M={self.n} D={self.d} {self.dtype}"
        return (f"N={self.n} T={self.t} H={self.h} HV={self.hv} K={self.k} V={self.v} {self.dtype} "
                f"state={self.state_dtype}/{self.state_layout} mode={self.mode}")
