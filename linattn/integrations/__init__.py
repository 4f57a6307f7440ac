"""Integrations of linattn into applications.

- :mod:`linattn.integrations.transformers`: ``enable(model)`` / ``disable(model)`` route the
  linear-attention layers of Hugging Face Qwen3-Next, Qwen3.5 (dense and MoE), Kimi-Linear and
  OLMo-hybrid models to linattn (through :mod:`linattn.compat.fla`). Needs ``linattn[transformers]``.

vLLM and sglang recipes (untested, no adapter ships): ``docs/integrations.md``.
"""

from linattn._namespace import public_dir

__all__ = ["transformers"]
__dir__ = public_dir(__name__, __all__)


def __getattr__(name: str):
    if name == "transformers":  # imported on first use: linattn.integrations.transformers
        import importlib

        return importlib.import_module("linattn.integrations.transformers")
    raise AttributeError(f"module 'linattn.integrations' has no attribute {name!r}")
