"""Peer backends: another library's kernels (FLA, FlashInfer) run under linattn's op contract.

A peer is a backend like any other (``backends/base.py``): capabilities as data, predicates that
reject what it cannot honour with a reason, so the dispatcher falls back. What a peer adds:

- **registration**: :mod:`linattn.backends.builtin` registers it only when its library is installed
  (:func:`installed`: its distribution's metadata and ``importlib.util.find_spec``; nothing is
  imported then, and a module of the same name without the distribution does not count); the library itself is imported on the
  first decision for a real CUDA device that reaches :meth:`PeerBackend.supports_toolchain`, once
  per process, and a failed import rejects the backend with reason ``toolchain`` and the error.
- **verification**: no architecture is claimed (``verified_archs`` empty) until the peer's GPU
  tests passed there, so the first eager call of each op and shape class self-checks against
  torch-ref on any GPU.
- **rank**: :attr:`~linattn.dispatch.plugin.verdict.Rank.PEER` (80), behind linattn's own kernel backends
  (``Rank.NATIVE`` 20, ``Rank.BEHIND_NATIVE`` 60) and ahead of a plugin that says nothing (100) and
  of the GPU reference (1000), until a measurement (the tune table) says otherwise; ``explain``
  says so in the accepted verdict's message (:meth:`PeerBackend.plan_note`).
- **translation**: the contract's conventions (log gate, ``vk`` / ``kv`` tiles, packed ``[T, ...]``
  tensors, int32 or int64 ``cu_seqlens``, negative padding slots, ``has_initial_state``) become
  the library's inside the backend. A library without a state pool gets the pool rows gathered
  into a dense fp32 state and the final states scattered back (:func:`gather_states`,
  :func:`scatter_states`); that copy is part of the peer's measured time.

The helpers here never hand a library a negative slot: padding rows are read by nobody (their
gathered state is zeros) and written by nobody (the scatter skips them), and their output rows
are zeroed (:func:`zero_padded_tokens`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from importlib import metadata
from typing import ClassVar, Optional

import torch

from linattn.capabilities import DeviceCapabilities
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.verdict import Check, Rank, Reason

from .base import Backend

__all__ = ["DISTRIBUTIONS", "PeerBackend", "distribution", "gather_states", "import_library", "installed", "scatter_states",
           "write_rows", "zero_fresh_empty", "zero_padded_tokens"]


#: The distributions that provide each peer library's import name: fla-core (FLA 0.3 on; the
#: ``flash-linear-attention`` distribution before it, now a wrapper that requires fla-core) and
#: flashinfer-python.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"fla": ("fla-core", "flash-linear-attention"),
                                             "flashinfer": ("flashinfer-python",)}


def distribution(module: str) -> Optional[str]:
    """The installed distribution (:data:`DISTRIBUTIONS`) that provides the peer library ``module``
    (its top-level name counts), from its metadata without importing anything; None if none is."""
    for name in DISTRIBUTIONS.get(module.partition(".")[0], ()):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return None


def installed(module: str) -> bool:
    """Whether ``module`` is installed, without importing it: found on the path and, for a peer
    library, provided by one of its distributions (:data:`DISTRIBUTIONS`), so a stray ``fla.py`` or
    ``flashinfer/`` folder on ``sys.path`` registers no peer."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    return module.partition(".")[0] not in DISTRIBUTIONS or distribution(module) is not None


@functools.cache
def import_library(module: str) -> tuple[Optional[object], str]:
    """``(module object, "")`` when ``module`` imports, else ``(None, "Type: message")``; once per
    process (a library's import can take seconds: Triton, CuTe DSL)."""
    try:
        return importlib.import_module(module), ""
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable here", with its reason
        return None, f"{type(e).__name__}: {e}"[:400]


class PeerBackend(Backend):
    """Base class of the peer backends: NVIDIA CUDA only, rank ``Rank.PEER``, the library checked
    by import on a real device.

    Class fields (besides :class:`~linattn.backends.base.Backend`'s):
        library: the import name (``fla``, ``flashinfer``).
        pip_name: the distribution that provides it, as ``pip install`` spells it.
        tested: the library version(s) its translation was written against.
    """

    api_version: ClassVar[str] = "2"
    vendors: ClassVar[frozenset[str]] = frozenset({"nvidia"})
    library: ClassVar[str] = ""
    pip_name: ClassVar[str] = ""
    tested: ClassVar[str] = ""
    strided_state_ops: ClassVar[frozenset[str]] = frozenset()
    #: No architecture is claimed until the peer's GPU tests pass there (tests/gpu/test_peers_gpu.py,
    #: benchmarks/peers_device.sh): on every GPU the first eager call of each op and shape class runs
    #: the self-check against torch-ref (dispatch/runtime/self_check.py), and CUDA-graph capture does not
    #: choose a peer before that (reason ``unverified``).
    verified_archs: ClassVar[frozenset[str]] = frozenset()

    def library_version(self) -> str:
        """The installed distribution's version (from its metadata: nothing is imported)."""
        name = distribution(self.library) or self.pip_name
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{self.pip_name} not installed"

    def supports_device(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if caps.device_type == "cuda" and caps.vendor == "nvidia":
            return Check.passed()
        return Check.failed(Reason.DEVICE, f"device_type={caps.device_type!r} vendor={caps.vendor!r} ({caps.name}); "
                            f"{self.name} runs {self.library} on NVIDIA CUDA GPUs only",
                            "on this device the dispatcher picks among linattn's own backends")

    def supports_toolchain(self, p: Problem, caps: DeviceCapabilities) -> Check:
        if not installed(self.library):
            return Check.failed(Reason.TOOLCHAIN, f"{self.pip_name} is not installed", f"pip install {self.pip_name}")
        if caps.profile is None and caps.device_type == "cuda":  # a real device: the library must import
            for module in self.modules(p):
                mod, err = import_library(module)
                if mod is None:
                    return Check.failed(Reason.TOOLCHAIN, f"{self.pip_name} is installed but `import {module}` "
                                        f"failed: {err}", f"reinstall it: pip install -U {self.pip_name}")
        return Check.passed()

    def modules(self, p: Problem) -> tuple[str, ...]:
        """The library's modules that ``p`` needs (imported on a real device by the toolchain check)."""
        return (self.library,)

    def rank(self, p: Problem, caps: DeviceCapabilities) -> int:
        return Rank.PEER

    def size_class(self, p: Problem, caps: DeviceCapabilities) -> tuple:
        """Nothing of the sizes is read by the peers' predicates or rank."""
        return ()

    def plan_note(self, p: Problem, caps: DeviceCapabilities) -> str:
        return (f"peer library {self.library} ({self.library_version()}; translation written for {self.tested}): "
                f"static rank {int(Rank.PEER)}, behind linattn's own kernel backends until a measured tune table "
                f"ranks it; {self.translation(p)}")

    def translation(self, p: Problem) -> str:
        """What the backend does to the call around the library's kernel, for ``explain``."""
        return ""


# -- the pool around a library without one ----------------------------------------------------------

def gather_states(pool: torch.Tensor, slots: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """The pool rows ``slots`` as one dense fp32 state ``[N, HV, ., .]`` (the pool's tile layout).

    Args:
        pool: ``[P, HV, ., .]`` fp32 or bf16, any strides.
        slots: ``[N]`` int32/int64 slots; a negative entry is padding.
        read: ``[N]`` bool, whether row n's slot is read (False: padding, or a fresh sequence of
            ``has_initial_state``); those rows are zeros whatever their slot holds.
    Returns:
        A new fp32 tensor; no sync with the host.
    """
    rows = pool.index_select(0, slots.clamp_min(0).long()).float()
    return torch.where(read.view(-1, 1, 1, 1), rows, rows.new_zeros(()))


def scatter_states(pool: torch.Tensor, slots: torch.Tensor, states: torch.Tensor) -> None:
    """Write ``states[n]`` to ``pool[slots[n]]`` (rounded to the pool's dtype) for every
    non-negative slot; padding rows (negative slots) are written nowhere. Slots must be unique
    among the written rows (linattn's validation refuses a write race).

    Syncs once with the host (the row mask), so callers refuse CUDA-graph capture."""
    rows = (slots >= 0).nonzero().squeeze(1)
    if rows.numel():
        pool.index_copy_(0, slots.index_select(0, rows).long(), states.index_select(0, rows).to(pool.dtype))


def write_rows(dst: torch.Tensor, targets: torch.Tensor, states: torch.Tensor) -> None:
    """:func:`scatter_states` without a host sync (capture-safe): ``states[n]`` to
    ``dst[targets[n]]`` for every non-negative target, rounded to ``dst``'s dtype.

    A negative target's row is redirected to the first non-negative target with that row's own
    value (two stores of identical bits), or, when every target is negative, to ``dst[0]`` with
    ``dst[0]``'s own bits: no row changes but the targeted ones. Targets must be unique among the
    non-negative ones (linattn's validation refuses a write race).

    Args:
        dst: ``[R, ...]`` (a pool, or one step of ``intermediate_states``), any strides.
        targets: ``[N]`` int32/int64 rows; negative: not written.
        states: ``[N, ...]`` the rows' new values (fp32).
    """
    if targets.numel() == 0 or dst.shape[0] == 0:
        return
    valid = targets >= 0
    first = torch.argmax(valid.to(torch.int8)).view(1)  # the first valid row; 0 when there is none
    some = valid.index_select(0, first)
    new = states.to(dst.dtype)
    rows = torch.where(valid, targets, torch.where(some, targets.index_select(0, first), 0)).long()
    fill = torch.where(some.view(-1, *([1] * (new.dim() - 1))), new.index_select(0, first), dst[:1])
    dst.index_copy_(0, rows, torch.where(valid.view(-1, *([1] * (new.dim() - 1))), new, fill))


def zero_padded_tokens(o: torch.Tensor, cu_seqlens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """``o [T, ...]`` with the tokens of padding sequences (``padding [N]`` bool) set to zero; no sync.

    ``torch.where``, not a product: a NaN the library computed for a padding row does not survive.
    """
    T = o.shape[0]
    if T == 0:
        return o
    seq = torch.searchsorted(cu_seqlens[1:].long(), torch.arange(T, device=o.device), right=True)
    pad = padding.index_select(0, seq.clamp_max(padding.numel() - 1))
    return torch.where(pad.view(-1, *([1] * (o.dim() - 1))), o.new_zeros(()), o)


def zero_fresh_empty(pool: torch.Tensor, slots: torch.Tensor, has_initial_state: Optional[torch.Tensor],
                     cu_seqlens: torch.Tensor) -> None:
    """Zeros into the slots of empty sequences that ``has_initial_state`` marks fresh (docs/ops.md:
    "an empty fresh prefill sequence leaves zeros in its slot"), for a library that writes nothing
    for an empty sequence or is not called at all (``T = 0``). Nothing without a mask. Syncs once."""
    if has_initial_state is None:
        return
    fresh_empty = (cu_seqlens[1:] == cu_seqlens[:-1]) & ~has_initial_state
    targets = torch.where(fresh_empty, slots, torch.full_like(slots, -1))
    scatter_states(pool, targets, torch.zeros(slots.shape[0], *pool.shape[1:], device=pool.device))
