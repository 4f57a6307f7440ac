"""Registers linattn's built-in backends through the same hook a plugin uses.

Each entry is ``module:Class``. A module whose optional toolchain is absent still imports (the
backends import triton lazily) and answers with a ``toolchain`` rejection instead.

The peer backends (another library's kernels under linattn's contract, ``backends/peer.py``) are
registered only when their library is installed (found on the path; not imported here: the
import, seconds for a Triton or CuTe DSL library, happens on the first decision for a CUDA device).
"""

from __future__ import annotations

import importlib

from linattn.dispatch.hookspecs import hookimpl

LINATTN_API_VERSION = "2"

BUILTIN = (
    "linattn.backends.torch_ref:TorchRefBackend",
    "linattn.backends.torch_chunked:TorchChunkedBackend",
    "linattn.backends.triton_split:TritonSplitBackend",
    "linattn.backends.triton_folded:TritonFoldedBackend",
    "linattn.backends.cutedsl:CuteDSLBackend",
)
#: peer backends: (the library's import name, ``module:Class``)
PEERS = (
    ("fla", "linattn.backends.fla:FLABackend"),
    ("flashinfer", "linattn.backends.flashinfer:FlashInferBackend"),
)


def _load(spec: str):
    mod, _, cls = spec.partition(":")
    return getattr(importlib.import_module(mod), cls)


@hookimpl
def linattn_register_backends():
    from .peer import installed

    return [_load(s) for s in BUILTIN] + [_load(s) for lib, s in PEERS if installed(lib)]
