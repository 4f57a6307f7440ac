"""Registers linattn's built-in backends through the same hook a plugin uses.

Each entry is ``module:Class``. A module whose optional toolchain is absent still imports (the
backends import triton lazily) and answers with a ``toolchain`` rejection instead.

The peer backends (another library's kernels under linattn's contract, ``backends/peer.py``) are
registered only when their library is installed (its distribution, ``fla-core`` or
``flash-linear-attention``, ``flashinfer-python``, and the module found on the path; not imported here: the
import, seconds for a Triton or CuTe DSL library, happens on the first decision for a CUDA device)
and either verified (:data:`PEERS_VERIFIED`: it passed the conformance suite on a GPU) or named in
``LINATTN_PEERS`` (comma-separated, or ``all``). Both passed their suites on the H200
(``benchmarks/results/check_h200.json``): fla every op (decode 55 of 55 cases, prefill 58 of 58,
gating and SwiGLU clamp), FlashInfer gdn_decode 21 and gdn_prefill 26, dense mode included (the
rest declined by its predicates).
"""

from __future__ import annotations

import importlib

from linattn.dispatch.plugin.hookspecs import hookimpl

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
#: peers registered by default where installed: those that passed ``linattn check --backend NAME
#: --device cuda`` on a GPU for every op they declare (fla and flashinfer: the H200, 2026-12-02); the
#: others only when ``LINATTN_PEERS`` names them
PEERS_VERIFIED: frozenset[str] = frozenset({"fla", "flashinfer"})


def enabled_peers() -> frozenset[str]:
    """The libraries whose peers are registered where installed: :data:`PEERS_VERIFIED` and those
    named in ``LINATTN_PEERS`` (``all``: every peer).

    Raises:
        ConfigError: a malformed ``LINATTN_PEERS`` (:func:`linattn.dispatch.env.env_names`), or a name
            that is no peer's (read by :meth:`linattn.dispatch.runtime.registry.Registry.load` before any plugin).
    """
    from linattn.dispatch.env import ConfigError, env_names

    names = env_names("LINATTN_PEERS") or set()
    known = {name for name, _ in PEERS}
    unknown = names - known - {"all"}
    if unknown:
        raise ConfigError(f"LINATTN_PEERS names {sorted(unknown)}, no peer backend's library; "
                          f"the peers are {sorted(known)} (or 'all')")
    return frozenset(known if "all" in names else names) | PEERS_VERIFIED


def _load(spec: str):
    mod, _, cls = spec.partition(":")
    return getattr(importlib.import_module(mod), cls)


@hookimpl
def linattn_register_backends():
    from .peer import installed

    enabled = enabled_peers()
    return [_load(s) for s in BUILTIN] + [_load(s) for lib, s in PEERS if lib in enabled and installed(lib)]
