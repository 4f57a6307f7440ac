"""Registers linattn's built-in backends through the same hook a plugin uses.

Each entry is ``module:Class``. A module whose optional toolchain is absent still imports (the
backends import triton lazily) and answers with a ``toolchain`` rejection instead.
"""

from __future__ import annotations

import importlib

from linattn.dispatch.hookspecs import hookimpl

LINATTN_API_VERSION = "2"

BUILTIN = (
    "linattn.backends.torch_ref:TorchRefBackend",
    "linattn.backends.triton_split:TritonSplitBackend",
    "linattn.backends.triton_folded:TritonFoldedBackend",
    "linattn.backends.cutedsl:CuteDSLBackend",
)


def _load(spec: str):
    mod, _, cls = spec.partition(":")
    return getattr(importlib.import_module(mod), cls)


@hookimpl
def linattn_register_backends():
    return [_load(s) for s in BUILTIN]
