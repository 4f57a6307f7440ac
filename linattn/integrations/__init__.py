"""Integrations of linattn into applications.

- :mod:`linattn.integrations.transformers`: ``enable(model)`` / ``disable(model)`` route the
  linear-attention layers of Hugging Face Qwen3-Next, Qwen3.5 (dense and MoE), Kimi-Linear and
  OLMo-hybrid models to linattn (through :mod:`linattn.compat.fla`). Needs ``linattn[transformers]``.

vLLM and sglang recipes (untested, no adapter ships): ``docs/integrations.md``.
"""

__all__ = ["transformers"]
