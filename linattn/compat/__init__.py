"""Drop-in APIs of other libraries, routed through linattn's public ops (so the dispatcher explains them).

- :mod:`linattn.compat.fla`: flash-linear-attention (fla-core 0.6.0) ``chunk_gated_delta_rule``,
  ``fused_recurrent_gated_delta_rule``, ``chunk_kda``, ``fused_recurrent_kda``.
"""

from linattn._namespace import public_dir

__all__ = ["fla"]
__dir__ = public_dir(__name__, __all__)


def __getattr__(name: str):
    if name == "fla":
        import importlib

        return importlib.import_module("linattn.compat.fla")
    raise AttributeError(f"module 'linattn.compat' has no attribute {name!r}")
