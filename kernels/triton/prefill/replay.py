"""The prepared prefill of a call class whose token and sequence counts change from call to call
(:class:`PrefillReplay`, issue 28): one recorded plan per (T bucket, N), replayed on every T of the bucket.
"""

from __future__ import annotations

from typing import Optional

import torch

from linattn.capabilities import DeviceCapabilities

from ..chunk_tables import CHUNK
from ..launch import NotReplayable
from .plan import SEGMENT_MAX_K, PrefillBuffers, PrefillPlan, plan_prefill, plan_segments
from .run import PrefillLaunch, conform_inputs, forked, launch_stages, prefill_state, run_prefill

#: T buckets a :class:`PrefillReplay` splits each power of two into (the workspace's overhead is at
#: most a quarter of T, and at least one chunk)
REPLAY_BUCKETS_PER_OCTAVE = 4


def replay_tokens(T: int) -> int:
    """The token count a replay of a ``T``-token call is planned for (:class:`PrefillReplay`): ``T``
    rounded up to a multiple of ``max(64, 2**(bit_length(T) - 3))`` (4 buckets per power of two:
    ``T <= result < 1.25 T + 64``)."""
    step = max(CHUNK, 1 << max(0, T.bit_length() - REPLAY_BUCKETS_PER_OCTAVE.bit_length()))
    return -(-T // step) * step


class PrefillReplay:
    """The chunked prefill of every call of one class whose token count ``T`` and sequence count
    ``N`` change from call to call (issue 28: an engine's packed prefill), at the host cost of a
    recorded replay.

    The stages read ``T`` only through the chunk bound ``T // 64 + N`` (grids of the chunk-parallel
    stages, the chunk tables' size, the intermediate buffers' rows); which chunks are real and where
    they start comes from ``cu_seqlens`` on the device (the chunk tables: entries past the real count
    hold ``chunk_seq = N`` and every stage skips them). So a plan made for ``T_b =``
    :func:`replay_tokens` ``(T) >= T`` tokens and the call's ``N`` runs a ``T``-token call: its
    grids cover more chunk slots, the extra ones exit at once, each real chunk is computed by the
    same instructions on the same operands (bitwise the result of a plan for ``T``,
    ``tests/prefill/test_prefill_replay.py``), and its workspace is sized by the bucket, so calls of
    one bucket ask the allocator for one size (on CUDA the caching allocator hands back the block the
    last call freed, on the call's stream). The output ``o`` is ``[T, HV, V]``, allocated per call.

    Per ``(T_b, N)`` the plan is made once and its launches recorded (:class:`PrefillLaunch`); a
    later call with a new ``T`` of a known bucket is a replay: the output and workspace allocations
    and the recorded launches on the call's tensors, the table pointers carved from the new
    workspace. Where a bucket's plan cannot be replayed (not :attr:`~PrefillPlan.replayable`: the
    torch chunk tables past :data:`TABLES_TRITON_MAX_N` sequences, a segment-parallel state pass)
    or where the planner would cut ``T`` itself into segments, the call is planned for its own
    ``T`` (:func:`plan_prefill`, :func:`run_prefill`).

    Args:
        family: ``"gdn"`` or ``"kda"``. layout, caps: as :func:`plan_prefill`.
        args: the first call's arguments (the class's metadata: dtypes, strides, which optional
            tensors are given, ``scale``, ``use_qk_l2norm``, ``state_layout``); later calls must be of
            the same class (the dispatcher's class key, ``dispatch/runtime/fast_path.py``: same dtypes,
            strides, head dims, flags and scalars; other ``T`` and ``N``).
    """

    __slots__ = ("family", "caps", "layout", "scale", "flags", "entries", "exact")
    #: serves every T and N of its call class (the dispatcher's class plans share it)
    serves_class = True

    def __init__(self, family: str, args: dict, caps: DeviceCapabilities, layout: str):
        from linattn.dispatch.lru import PREFILL_REPLAYS_MAX, LRUCache

        self.family, self.caps, self.layout = family, caps, layout
        self.scale = args["scale"]
        self.flags = (args.get("state_pool") is not None, args["use_qk_l2norm"], args["state_layout"])
        #: per (T bucket, N): ``(plan, launch)``, ``launch`` None where the bucket's plan is not replayable
        self.entries = LRUCache(PREFILL_REPLAYS_MAX)
        #: per exact (T, N): the call's own plan, where the bucket cannot serve it
        self.exact = LRUCache(PREFILL_REPLAYS_MAX)

    def _plan(self, a: dict, q: torch.Tensor) -> PrefillPlan:
        return plan_prefill(self.family, q=q, v=a["v"], cu_seqlens=a["cu_seqlens"], state_pool=a.get("state_pool"),
                            state_indices=a.get("state_indices"), initial_state=a.get("initial_state"),
                            has_initial_state=a.get("has_initial_state"), use_qk_l2norm=self.flags[1],
                            state_layout=self.flags[2], layout=self.layout, caps=self.caps,
                            checkpoint_indices=a.get("checkpoint_indices"))

    def _bucket(self, a: dict, key: tuple) -> list:
        """Plan the bucket ``key = (T_b, N)`` from the call ``a``'s metadata (the bucket's q shape
        stands in for q's); its launches are recorded on the bucket's second call (:meth:`__call__`)."""
        q = a["q"]
        stand_in = q.new_empty(()).expand(key[0], *q.shape[1:])  # the bucket's shape; no storage
        plan = self._plan(a, stand_in)
        #: the plan, its recorded launches (None: not yet, or _NOT_REPLAYED), whether the planner's
        #: segment choice may differ at another T of the bucket
        entry = [plan, None if plan.replayable else _NOT_REPLAYED, _segments_vary(plan, self.caps)]
        self.entries.put(key, entry)
        return entry

    def bind(self, a: dict) -> "PrefillReplay":
        """What runs calls with the lengths of ``a``: this replay (it finds the bucket per call)."""
        return self

    def __call__(self, a: dict) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Run the call ``a`` (the op's tensor arguments by name); returns ``(o, final_state)``.

        A bucket's first call runs the stages of the bucket's plan one by one (their launches through
        :func:`.launch.launch`, direct where the kernels were compiled for another call of the same
        int classes), so a bucket used once pays no recording; its second call records the launches
        (:class:`PrefillLaunch`), and every call after replays them. With ``output_state_indices`` the
        read slots are first copied into the write slots (:func:`forked`) and the call runs in place there."""
        a = forked(a)
        q = a["q"]
        T, N = q.shape[0], a["cu_seqlens"].shape[0] - 1
        if T and N and a.get("checkpoint_indices") is None:  # a call with checkpoints: its own plan, not replayed
            key = (replay_tokens(T), N)
            entry = self.entries.get(key)
            first = entry is None
            if first:
                entry = self._bucket(a, key)
            plan, launch, vary = entry
            if launch is not _NOT_REPLAYED and not (vary and _segmented(plan, T, self.caps)):
                if launch is not None:
                    return launch(*_tensors(a))
                if not first:
                    try:
                        launch = entry[1] = PrefillLaunch(plan, _tensors(a), self.scale)
                    except NotReplayable:
                        entry[1] = _NOT_REPLAYED
                    else:
                        return launch(*_tensors(a))
                else:
                    return _run_bucket(plan, a, T, self.scale)
        plan = self.exact.get((T, N))
        if plan is None:
            plan = self._plan(a, q)
            self.exact.put((T, N), plan)
        return run_prefill(plan, **_prefill_kwargs(a), scale=self.scale)


#: a :class:`PrefillReplay` bucket whose launches cannot be replayed (its calls are planned for their own T)
_NOT_REPLAYED = object()


def _run_bucket(plan: PrefillPlan, a: dict, T: int, scale: float) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The stages of a bucket's plan run one by one on a ``T``-token call (``o`` of its own ``T`` rows;
    the other buffers the bucket's)."""
    bufs = PrefillBuffers(**{b.name: torch.empty((T, *b.shape[1:]) if b.name == "o" else b.shape, dtype=b.dtype,
                                                 device=plan.device) for b in plan.buffers})
    x = conform_inputs(plan, a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"])
    st = prefill_state(plan, bufs, a.get("state_pool"), a.get("state_indices"), a.get("initial_state"),
                       a.get("has_initial_state"))
    launch_stages(plan, x, bufs, st, scale)
    return bufs.o, bufs.final


def _tensors(a: dict) -> tuple:
    """The tensors of a call as :class:`PrefillLaunch` takes them."""
    get = a.get
    return (a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu_seqlens"], get("state_pool"), get("state_indices"),
            get("initial_state"), get("has_initial_state"))


def _prefill_kwargs(a: dict) -> dict:
    names = ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state",
             "has_initial_state", "checkpoint_every", "checkpoint_indices")
    return {n: a.get(n) for n in names}


def _segments_vary(plan: PrefillPlan, caps: DeviceCapabilities) -> bool:
    """Whether :func:`plan_segments` may cut a call of ``plan``'s ``N`` into segments at another
    ``T`` (False where it answers 0 before reading the chunk bound: fp32, a large ``K``, a state
    grid that fills the SMs, the fused prefill ...)."""
    if plan.empty or plan.fused is not None or plan.state_kernel is not None or plan.segment_chunks:
        return plan.segment_chunks != 0
    bv = plan.config.state.block_v
    return not (plan.dtype == torch.float32 or plan.K > SEGMENT_MAX_K or plan.V % bv or plan.K % bv
                or plan.N * plan.HV * (plan.V // bv) >= caps.sm_count)


def _segmented(plan: PrefillPlan, T: int, caps: DeviceCapabilities) -> bool:
    """Whether the planner cuts a ``T``-token call of ``plan``'s class into segments."""
    bv = plan.config.state.block_v
    L, _ = plan_segments(N=plan.N, HV=plan.HV, K=plan.K, V=plan.V, nt_max=T // CHUNK + plan.N, block_v=bv,
                         caps=caps, even=plan.stages.every_second_state, fp32=plan.dtype == torch.float32)
    return L != 0
