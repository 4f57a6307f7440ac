"""The :class:`Problem`: what a call asks for, as far as choosing a backend is concerned.

It holds shapes, dtypes, layout and flags, never tensors, so it can be built from a model preset
(``linattn explain``) as well as from a real call, hashed, cached and printed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from ..rules.ops_table import FLAGS, OP_TABLE, OPS, OpSpec, Phase, op_spec

Op = Literal[OPS]  # type: ignore[valid-type]  # the op table's names (dispatch/rules/ops_table.py)
DTypeName = Literal["float32", "bfloat16", "float16", "float64"]

__all__ = ["OPS", "Op", "Phase", "Problem", "phase_of"]


def phase_of(op: str) -> str:
    """The policy phase an op belongs to (``decode``, ``prefill``, ``gating`` or ``mlp``), from the
    op table.

    Raises:
        ValueError: ``op`` is not an op.
    """
    return op_spec(op).phase


class _Problem(BaseModel):
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


def _flag(default: bool, doc: str) -> tuple:
    return bool, Field(default, description=doc)


#: The facts of a call that no argument sets by itself (the host rules find them).
_FACTS = {
    "state_tiles_contiguous": _flag(True, "every written state buffer (pool, intermediate "
                                    "states) holds each (slot, head) state matrix as one dense block (last two dims "
                                    "contiguous); slot and head pitch are free"),
    "requires_grad": _flag(False, "grad mode is on and a tensor argument requires grad (only a "
                           "backend declaring autograd support may run it)"),
}

#: The model: the fields above, then one bool per flag of the op table (``dispatch/rules/ops_table.py``
#: ``FLAGS``, set by the arguments that name them), the plain flags before the facts, the features after.
Problem = create_model(
    "Problem", __base__=_Problem, __module__=__name__, __doc__=_Problem.__doc__,
    **{f.name: _flag(False, f.doc) for f in FLAGS if not f.feature}, **_FACTS,
    **{f.name: _flag(False, f.doc) for f in FLAGS if f.feature})
