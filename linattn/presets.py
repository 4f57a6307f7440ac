"""Model presets as data (``presets.toml``), each with its source.

Example:
    >>> from linattn.presets import preset
    >>> preset("qwen3-next").HV
    32
"""

from __future__ import annotations

import functools
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from linattn.dispatch.ops_table import find_op, ops_of


class ModelPreset(BaseModel):
    """One model's linear-attention (or SwiGLU-clamp) layer shapes at tensor-parallel rank 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str
    family: Literal["gdn", "kda", "swiglu"]
    H: int = 0
    HV: int = 0
    K: int = 0
    V: int = 0
    D: int = 0
    limit: Optional[float] = None
    layers: str = ""
    source: str

    @property
    def ops(self) -> tuple[str, ...]:
        """The ops of the preset's family (op table order): gating, decode and prefill for
        ``gdn`` / ``kda``, the clamp for ``swiglu``."""
        return ops_of(self.family)

    def op_for(self, phase: str) -> str:
        """The preset's op in ``phase`` (``decode``, ``prefill``, ``gating``, ``mlp``), from the op table.

        Raises:
            ValueError: the family has no op in that phase (the SwiGLU clamp has no decode).
        """
        op = find_op(self.family, phase)
        if op is None:
            raise ValueError(f"preset {self.name!r} (family {self.family!r}) has no {phase} op; its ops: "
                             f"{', '.join(self.ops)}")
        return op

    @property
    def decode_op(self) -> str:
        return self.op_for("decode")

    @property
    def prefill_op(self) -> str:
        return self.op_for("prefill")

    @property
    def gating_op(self) -> str:
        return self.op_for("gating")


@functools.lru_cache(maxsize=None)
def _load(extra: Optional[str]) -> dict[str, ModelPreset]:
    text = resources.files("linattn").joinpath("presets.toml").read_text()
    tables = tomllib.loads(text)
    if extra:
        tables.update(tomllib.loads(Path(extra).read_text()))
    return {name: ModelPreset(name=name, **body) for name, body in tables.items()}


def presets() -> dict[str, ModelPreset]:
    """All presets: the shipped ones plus those in ``$LINATTN_PRESETS`` (a TOML file), if set."""
    return _load(os.environ.get("LINATTN_PRESETS"))


def preset(name: str) -> ModelPreset:
    """The preset called ``name``.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    table = presets()
    if name not in table:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(table))} "
                       f"(add your own with LINATTN_PRESETS=/path/to/presets.toml)")
    return table[name]
