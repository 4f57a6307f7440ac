"""Running a planned chunked prefill: :func:`run_prefill` (and :func:`chunk_prefill`, plan then run).

:func:`run_prefill` allocates a plan's buffers and calls :func:`launch_stages`: the stage launchers,
each beside its kernels (:func:`.chunk_tables.launch_tables`, :func:`.chunk_intra.launch_intra`,
:func:`.chunk_state.launch_gates`, :func:`.chunk_state.launch_state` or
:func:`.chunk_state.launch_segmented_state`, :func:`.chunk_output.launch_output`; the fused prefill's
:func:`.chunk_fused.launch_fused_stages`), or a replacement state kernel. A replayable plan records
the launches of a tensor signature's second call (:class:`PrefillLaunch`) and replays them from then
on (:class:`.launch.LaunchSequence`); :mod:`.replay` serves a stream of new lengths from recorded
buckets.
"""

from __future__ import annotations

import numbers
import operator
from typing import Literal, Optional

import torch

from linattn.capabilities import DeviceCapabilities

from ..chunk_fused import launch_fused_stages
from ..chunk_intra import launch_intra
from ..chunk_output import launch_output
from ..chunk_state import launch_gates, launch_segmented_state, launch_state
from ..chunk_tables import CHUNK, ChunkTables, launch_tables
from ..launch import NotReplayable, recording, replay_sequence
from .plan import PrefillBuffers, PrefillInputs, PrefillPlan, PrefillState, plan_prefill

def chunk_prefill(family: Literal["gdn", "kda"], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
                  state_pool: Optional[torch.Tensor], state_indices: Optional[torch.Tensor],
                  initial_state: Optional[torch.Tensor], scale: float, use_qk_l2norm: bool,
                  state_layout: str, layout: str = "split",
                  caps: Optional[DeviceCapabilities] = None,
                  state_kernel=None,
                  has_initial_state: Optional[torch.Tensor] = None,
                  segment_chunks: Optional[int] = None,
                  fused: Optional[bool] = None,
                  output_state_indices: Optional[torch.Tensor] = None,
                  checkpoint_every: Optional[int] = None,
                  checkpoint_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GDN / KDA chunked prefill (ops.md ``gdn_prefill`` / ``kda_prefill``), pool or dense mode:
    :func:`plan_prefill` then :func:`run_prefill`.

    Args:
        family: ``"gdn"`` (scalar gate per value head) or ``"kda"`` (one gate per key channel).
        q, k: ``[T, H, K]`` fp32/bf16/fp16 (last dim contiguous; token and head strides honoured).
        v: ``[T, HV, V]``, same dtype; value head ``hv`` reads q/k head ``hv // (HV // H)``.
        g: log-space decay, fp32, ``[T, HV]`` (GDN) or ``[T, HV, K]`` (KDA), from the gating op.
        beta: ``[T, HV]`` fp32.
        cu_seqlens: ``[N+1]`` int32/int64, contiguous (the public ops hand it over so, as
            ``state_indices``); zero-length sequences allowed anywhere.
        state_pool: pool mode: ``[P, HV, V, K]`` (``"vk"``) or ``[P, HV, K, V]`` (``"kv"``), fp32 or
            bf16, any slot pitch; row ``state_indices[n]`` is read as h0 and overwritten in place
            with the final state. A negative index is padding: zero output rows, the pool is
            neither read nor written for that sequence (ops.md; torch_ref agrees).
        state_indices: ``[N]`` int32/int64 (pool mode), valid and distinct (checked upstream).
        initial_state: dense mode: ``[N, HV, V, K]`` (or ``[N, HV, K, V]`` for ``"kv"``) or None.
        scale: query scale (> 0). use_qk_l2norm: l2-normalise q and k in the kernels.
        state_layout: ``"vk"`` or ``"kv"``; layout: the state kernel's grid (``"split"`` or ``"folded"``).
        caps: device capabilities (default: probed from q's device).
        state_kernel: an alternative implementation of stage 2 (the sequential state kernel), e.g.
            :func:`linattn.kernels.cutedsl.chunk_state.cutedsl_chunk_state`; called with the
            keywords ``kda, k, g, w, u, rk, cu_seqlens, chunk_off, state_indices, h0, ht, hbuf, vn,
            state_layout`` on the same buffers (bf16 path only), plus ``has_initial_state`` and
            ``checkpoint_indices``, ``checkpoint_every`` when given. None: the Triton state kernel.
        has_initial_state: pool mode only: ``[N]`` bool or None. False starts that sequence from a
            zero state: the state kernel's h0 load is masked (the slot is never read, NaN there is
            harmless) and the final state is stored as usual. No extra launch.
        segment_chunks: the segment-parallel state pass (:func:`plan_segments`): None the
            planner's choice, 0 off, ``L >= 1`` segments of ``L`` chunks (tests, sweeps).
        fused: the fused prefill (GDN, KDA) (:func:`plan_fused`): None the planner's choice, True forced
            on, False off (tests, sweeps).
        output_state_indices: pool mode only, ``[N]`` write slots or None: the read rows are first
            copied into the write rows (:func:`forked`) and the prefill runs in place on the write
            slots (docs/ops.md "Separate read and write slots").
        checkpoint_every, checkpoint_indices: pool mode, both or neither (docs/ops.md "State
            checkpoints"; validated upstream): tokens (a multiple of 64) and ``[N, max_checkpoints]``
            int32/int64 slots (-1: none); the state after ``(j + 1) * checkpoint_every`` tokens of
            sequence ``n`` goes to slot ``[n, j]`` from the state loop (:func:`plan_prefill`).
    Returns:
        ``(o, final_state)``: ``o [T, HV, V]`` in q's dtype; ``final_state`` is a new tensor
        ``[N, HV, V, K]`` (layout as ``state_layout``) in ``initial_state``'s dtype (fp32 without
        an initial state) in dense mode, None in pool mode. Dense and pool mode run the same
        instructions, so a dense final state equals the pool row of the same dtype bitwise.
    Raises:
        ValueError: an unsupported head dim or dtype (:func:`prefill_supported`); a pool without
            ``state_indices`` (field case F23).
        linattn.kernels.grid.GridLimitError: the state kernel's grid does not fit the device.
    Source: ops.md "Chunked form" (Yang et al. 2024, WY representation; Yang, Kautz, Hatamizadeh
    2025; Kimi Linear 2025).
    Example:
        >>> T, H, HV, K, V = 100, 1, 2, 64, 64
        >>> q, k = torch.randn(T, H, K), torch.randn(T, H, K); v = torch.randn(T, HV, V)
        >>> g, beta = -torch.rand(T, HV), torch.rand(T, HV)
        >>> o, ht = chunk_prefill("gdn", q=q, k=k, v=v, g=g, beta=beta,
        ...     cu_seqlens=torch.tensor([0, 30, 100]), state_pool=None, state_indices=None,
        ...     initial_state=None, scale=K ** -0.5, use_qk_l2norm=True, state_layout="vk")
    """
    _check_checkpoint_every(checkpoint_indices, checkpoint_every)  # before forked() writes any pool row
    states = forked(dict(state_pool=state_pool, state_indices=state_indices, initial_state=initial_state,
                         has_initial_state=has_initial_state, output_state_indices=output_state_indices))
    del states["output_state_indices"]  # None now: the call runs in place on the write slots
    plan = plan_prefill(family, q=q, v=v, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                        state_layout=state_layout, layout=layout, caps=caps, state_kernel=state_kernel,
                        segment_chunks=segment_chunks, fused=fused, checkpoint_indices=checkpoint_indices, **states)
    return run_prefill(plan, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, scale=scale,
                       checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices, **states)


def _check_checkpoint_every(checkpoint_indices: Optional[torch.Tensor], checkpoint_every) -> None:
    """With ``checkpoint_indices``, ``checkpoint_every`` must be a positive multiple of :data:`CHUNK`
    (the kernels divide by it in chunks; the op layer's host rules check it too, this guards direct
    callers). Raises ValueError before any launch or pool write."""
    if checkpoint_indices is None:
        return
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, numbers.Integral) \
            or checkpoint_every <= 0 or checkpoint_every % CHUNK:
        raise ValueError(f"checkpoint_every must be a positive multiple of {CHUNK} tokens with checkpoint_indices, "
                         f"got {checkpoint_every!r}")


def forked(a: dict) -> dict:
    """The call ``a`` (the op's arguments by name) to run in place: unchanged without
    ``output_state_indices``; else each read slot copied into its write slot (``fork_slots``: only
    where they differ and the sequence reads a state) and ``state_indices`` replaced by the write
    slots (docs/ops.md "Separate read and write slots")."""
    out = a.get("output_state_indices")
    if out is None:
        return a
    from ..fork_slots import fork_slots

    fork_slots(a["state_pool"], a["state_indices"], out, a.get("has_initial_state"))
    return dict(a, state_indices=out, output_state_indices=None)


def allocate_buffers(plan: PrefillPlan) -> PrefillBuffers:
    """Fresh (uninitialised) tensors for every buffer of ``plan``."""
    return PrefillBuffers(**{b.name: torch.empty(b.shape, dtype=b.dtype, device=plan.device) for b in plan.buffers})


def conform_inputs(plan: PrefillPlan, q, k, v, g, beta, cu_seqlens) -> PrefillInputs:
    """The inputs with their last dim contiguous (and KDA's ``g``'s), copied where a token stride
    times 64 would overflow the kernels' int32 in-chunk offsets (field case F10)."""
    q, k, v = _row_major(q), _row_major(k), _row_major(v)
    g = _row_major(g) if plan.kda else g
    q, k, v, g, beta = (x if x.stride(0) * CHUNK < 2**31 else x.contiguous() for x in (q, k, v, g, beta))
    return PrefillInputs(q, k, v, g, beta, cu_seqlens)


def _row_major(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def prefill_state(plan: PrefillPlan, bufs: PrefillBuffers, state_pool, state_indices, initial_state,
                  has_initial_state, checkpoint_indices=None, checkpoint_every: int = 0) -> PrefillState:
    """Where the state stage reads and writes (:class:`PrefillState`)."""
    if plan.pool_mode:
        flags = None if has_initial_state is None else has_initial_state.contiguous().view(torch.uint8)
        table = None if checkpoint_indices is None else checkpoint_indices.contiguous()
        # flags read as [N] bytes
        return PrefillState(state_pool, state_pool, state_indices, flags, table, int(checkpoint_every or 0))
    return PrefillState(initial_state, bufs.final, None, None)


def run_prefill(plan: PrefillPlan, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                state_pool: Optional[torch.Tensor] = None, state_indices: Optional[torch.Tensor] = None,
                initial_state: Optional[torch.Tensor] = None,
                has_initial_state: Optional[torch.Tensor] = None, checkpoint_every: Optional[int] = None,
                checkpoint_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Run a planned call on tensors of the plan's signature: the stages in order.

    A :attr:`~PrefillPlan.replayable` plan notes, per signature of the tensors (which are given,
    their dtypes and strides, q's, v's and ``cu_seqlens``' shapes) and ``scale``, its first call
    (run stage by stage), records the launches of its second (:class:`PrefillLaunch`, in
    ``plan.launches``) and replays them from then on: the same kernels with the same arguments on
    each call's own tensors, so bitwise the same results, without redoing the host work (buffers,
    grids, argument lists). Other plans, and signatures that cannot be replayed, run the stages one
    by one.

    Args: the tensors of :func:`chunk_prefill` (with the shapes, dtypes and optional ones the plan
    was made for) and ``scale``. Returns and Raises: as :func:`chunk_prefill`.
    Example:
        >>> inp = dict(q=torch.randn(100, 1, 64), k=torch.randn(100, 1, 64), v=torch.randn(100, 2, 64),
        ...            g=-torch.rand(100, 2), beta=torch.rand(100, 2), cu_seqlens=torch.tensor([0, 30, 100]))
        >>> plan = plan_prefill("gdn", q=inp["q"], v=inp["v"], cu_seqlens=inp["cu_seqlens"])
        >>> o, ht = run_prefill(plan, **inp, scale=0.125)
    """
    tensors = (q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, has_initial_state)
    first = None  # the signature of a replayable plan's first call of it
    if plan.replayable:
        key = _call_signature(tensors, scale)
        run = plan.launches.get(key, _UNKNOWN)
        if run is _SEEN_ONCE:
            run = _prepare_launch(plan, key, tensors, scale)
        if run.__class__ is PrefillLaunch:
            return run(*tensors)
        first = key if run is _UNKNOWN else None
    _check_signature(plan, q, v, cu_seqlens, state_pool, initial_state, has_initial_state)
    if (checkpoint_indices is not None) != plan.checkpoints:
        raise ValueError("run_prefill: checkpoint_indices given to a plan made without them, or the reverse; plan "
                         "the call again (plan_prefill(checkpoint_indices=...))")
    _check_checkpoint_every(checkpoint_indices, checkpoint_every)
    bufs = allocate_buffers(plan)
    if plan.empty:  # no chunk runs, so no checkpoint falls inside a sequence (each is past its length)
        _run_empty(plan, bufs, state_pool, state_indices, initial_state, has_initial_state)
        return bufs.o, bufs.final
    x = conform_inputs(plan, q, k, v, g, beta, cu_seqlens)
    st = prefill_state(plan, bufs, state_pool, state_indices, initial_state, has_initial_state, checkpoint_indices,
                       checkpoint_every)
    launch_stages(plan, x, bufs, st, scale)
    if first is not None:
        _keep_launch(plan, first, _SEEN_ONCE)
    return bufs.o, bufs.final


def launch_stages(plan: PrefillPlan, x: PrefillInputs, bufs: PrefillBuffers, st: PrefillState,
                  scale: float) -> ChunkTables:
    """The stages of a non-empty call in order, on conformed inputs (:func:`conform_inputs`), its
    buffers (:func:`allocate_buffers`) and states (:func:`prefill_state`); returns the chunk tables."""
    tables = launch_tables(plan, x.cu_seqlens)
    if plan.fused is not None:
        launch_fused_stages(plan, x, tables, bufs, st, scale)
        return tables
    launch_intra(plan, x, tables, bufs, scale)
    if plan.stages.gates_kernel:
        launch_gates(plan, x, tables, bufs)
    if plan.state_kernel is not None:
        _run_state_kernel(plan, x, tables, bufs, st)
    elif plan.segment_chunks:
        launch_segmented_state(plan, x, tables, bufs, st)
    else:
        launch_state(plan, x, tables, bufs, st)
    if not plan.state_writes_output:
        launch_output(plan, x, tables, bufs, st, scale)
    return tables


_UNKNOWN = object()
#: ``plan.launches`` entry of a signature run once (one by one): its next call records the launches,
#: so that a plan run once (:func:`chunk_prefill`) pays for no recording
_SEEN_ONCE = object()
#: signatures kept per plan; past this many they are all forgotten (each is recorded again)
_LAUNCHES_PER_PLAN = 64


def _call_signature(tensors: tuple, scale) -> tuple:
    """What a recorded call's launches depend on besides the plan: ``scale``, each tensor's dtype
    and strides (None for one not given), and the shapes :func:`_check_signature` and the stages
    read (q, v, ``cu_seqlens`` and ``has_initial_state``'s; the others' are the plan's, and their
    strides are what the kernels take). Addresses are not in it: the replay keys its compiled
    kernels on their alignment (:class:`.launch.LaunchSequence`)."""
    flags = tensors[9]
    key = [scale, tensors[0].shape, tensors[2].shape, tensors[5].shape, None if flags is None else flags.shape]
    for x in tensors:
        if x is None:
            key.append(None)
        else:
            key += (x.dtype, x.stride())
    return tuple(key)


def _prepare_launch(plan: PrefillPlan, key: tuple, tensors: tuple, scale) -> Optional["PrefillLaunch"]:
    """Record the launches of a call of a signature run once (None where it cannot be replayed: one
    tensor passed as two arguments, or a launcher copying an input, e.g. a strided ``cu_seqlens``)
    and keep them in ``plan.launches``. Raises as :func:`_check_signature`, keeping nothing."""
    q, v, cu, pool, h0, flags = tensors[0], tensors[2], tensors[5], tensors[6], tensors[8], tensors[9]
    _check_signature(plan, q, v, cu, pool, h0, flags)
    try:
        run = PrefillLaunch(plan, tensors, scale)
    except NotReplayable:
        run = None
    _keep_launch(plan, key, run)
    return run


def _keep_launch(plan: PrefillPlan, key: tuple, entry) -> None:
    if len(plan.launches) >= _LAUNCHES_PER_PLAN:
        plan.launches.clear()
    plan.launches[key] = entry


#: byte alignment of each buffer in a :class:`PrefillLaunch` workspace (that of a fresh CUDA allocation)
WORKSPACE_ALIGN = 512


class PrefillLaunch:
    """The launches of a planned call, recorded once per signature of its tensors and replayed on
    later calls of that signature (:func:`run_prefill` keeps one per signature in ``plan.launches``).

    Recording runs :func:`launch_stages` with the launches recorded, not made
    (:func:`.launch.recording`), on the call's conformed inputs and on stand-in buffers without
    storage (``meta`` tensors of the plan's buffer specs). A replay
    (:class:`.launch.LaunchSequence`; :class:`.launch.SteppedSequence` where a stage launched a
    :class:`.launch.ReplayStep`, the CuTe DSL fused walk) makes the same launches, with the same
    kernels, scalar arguments, constexprs and launch options, on a later call's tensors. Per call it copies only the
    inputs whose strides need it (:func:`conform_inputs`, :func:`prefill_state`), allocates the
    output ``o``, in dense mode the final state, and one workspace holding every non-empty
    intermediate buffer (:class:`PrefillBuffers`) and the chunk tables, each at a
    :data:`WORKSPACE_ALIGN`-byte offset; the direct launch passes the workspace's buffers as
    addresses. So a replay computes bitwise what :func:`launch_stages` computes on the same tensors.

    Args:
        plan: a :attr:`~PrefillPlan.replayable` plan.
        tensors: ``(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state,
            has_initial_state)`` of one call, as :func:`run_prefill` takes them (None where not given).
        scale: the query scale (> 0).
    Raises:
        linattn.kernels.triton.launch.NotReplayable: one tensor passed as two arguments, or a
            launch on a tensor the stages made themselves (a copy of ``cu_seqlens``).
    """

    __slots__ = ("sequence", "copies", "copy_flags", "device", "o_spec", "final_spec", "workspace", "offsets",
                 "ws_bytes", "_present")

    def __init__(self, plan: PrefillPlan, tensors: tuple, scale: float):
        q, k, v, g, beta, cu, pool, idx, h0, flags = tensors
        x = conform_inputs(plan, q, k, v, g, beta, cu)
        self.copies = tuple(a is not b for a, b in zip(tensors[:5], x[:5]))
        self.copy_flags = flags is not None and not flags.is_contiguous()
        # no storage; an empty buffer (KDA's unread vn, hbuf) is a real one, kept as a constant of the replay
        stand_in = PrefillBuffers(**{b.name: torch.empty(b.shape, dtype=b.dtype, device=plan.device if 0 in b.shape
                                                         else "meta") for b in plan.buffers})
        st = prefill_state(plan, stand_in, pool, idx, h0, flags)
        with recording() as records:
            tables = launch_stages(plan, x, stand_in, st, scale)
        carved = [t for t in (getattr(stand_in, b.name) for b in plan.buffers if b.name not in ("o", "final"))
                  if t.numel()] + list(tables)
        self.workspace, self.offsets, self.ws_bytes = _workspace_layout(carved)
        sources = (*x, pool, idx, h0, st.has_initial_state, stand_in.o, stand_in.final, *carved)
        self.sequence = replay_sequence(records, sources)
        self.device = plan.device
        specs = {b.name: b for b in plan.buffers}
        self.o_spec, self.final_spec = specs["o"], specs.get("final")
        present = [i for i, t in enumerate(tensors[:10] + (stand_in.o, stand_in.final)) if t is not None]
        self._present = operator.itemgetter(*present)

    def __call__(self, q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state,
                 has_initial_state) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Launch on a call's tensors (:func:`run_prefill`'s, of the recorded signature); returns
        ``(o, final_state)`` as :func:`chunk_prefill`."""
        if True in self.copies:
            q, k, v, g, beta = (a.contiguous() if c else a for a, c in zip((q, k, v, g, beta), self.copies))
        if self.copy_flags:
            has_initial_state = has_initial_state.contiguous()
        o_shape = self.o_spec.shape
        if q.shape[0] != o_shape[0]:  # a call of a T bucket's replay (:class:`PrefillReplay`): o has its own T rows
            o_shape = (q.shape[0], *o_shape[1:])
        o = torch.empty(o_shape, dtype=self.o_spec.dtype, device=self.device)
        f = self.final_spec
        final = None if f is None else torch.empty(f.shape, dtype=f.dtype, device=self.device)
        ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=self.device)
        base = ws.data_ptr()
        tensors = (q, k, v, g, beta, cu_seqlens, state_pool, state_indices, initial_state, has_initial_state, o, final)
        key = (base & 15 == 0, *[t.data_ptr() & 15 == 0 for t in self._present(tensors)])
        self.sequence(key, tensors + tuple(map(base.__add__, self.offsets)), lambda: self._views(tensors, ws), ws)
        return o, final

    def _views(self, tensors: tuple, ws: torch.Tensor) -> tuple:
        """The sources with the workspace's buffers as tensors, and the ``has_initial_state`` bytes
        as :func:`prefill_state` views them (Triton's ordinary launch types pointers by dtype)."""
        flags = tensors[9]
        head = tensors[:9] + (None if flags is None else flags.view(torch.uint8),) + tensors[10:]
        return head + tuple(ws[o:o + n].view(dt).view(shape) for o, n, dt, shape in self.workspace)


def _workspace_layout(buffers: list) -> tuple[tuple, tuple, int]:
    """``(layout, offsets, total bytes)`` of a workspace holding tensors shaped as ``buffers``:
    per buffer ``(byte offset, bytes, dtype, shape)``, each offset a multiple of :data:`WORKSPACE_ALIGN`."""
    layout, at = [], 0
    for b in buffers:
        n = b.numel() * b.element_size()
        layout.append((at, n, b.dtype, tuple(b.shape)))
        at += -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return tuple(layout), tuple(o for o, *_ in layout), at


def _check_signature(plan: PrefillPlan, q, v, cu_seqlens, state_pool, initial_state, has_initial_state) -> None:
    got = (tuple(q.shape), tuple(v.shape[1:]), q.dtype, cu_seqlens.numel() - 1, state_pool is not None,
           initial_state is not None, has_initial_state is not None)
    want = ((plan.T, plan.H, plan.K), (plan.HV, plan.V), plan.dtype, plan.N, plan.pool_mode, plan.has_h0,
            plan.has_init_flags)
    if got != want:
        raise ValueError(f"run_prefill: the tensors do not match the plan: got (q shape, v shape[1:], dtype, N, "
                         f"pool, initial_state, has_initial_state) = {got}, the plan was made for {want}; "
                         "plan the call again (plan_prefill)")


def _run_empty(plan: PrefillPlan, bufs: PrefillBuffers, state_pool, state_indices, initial_state,
               has_initial_state) -> None:
    """No token or no sequence: the final state is the initial state (a fresh pool slot: zeros)."""
    if plan.pool_mode and has_initial_state is not None and plan.N > 0:
        idx = state_indices.to(torch.long)
        fresh = (idx >= 0) & ~has_initial_state.to(device=plan.device, dtype=torch.bool)
        state_pool[idx[fresh]] = 0  # no kernel runs at T = 0
    if bufs.final is not None:
        if initial_state is not None:
            bufs.final.copy_(initial_state)
        else:
            bufs.final.zero_()


def _run_state_kernel(plan: PrefillPlan, x: PrefillInputs, t: ChunkTables, b: PrefillBuffers,
                      st: PrefillState) -> None:
    """Stage 2 by the replacement state kernel, on the same buffers (the raw k and g)."""
    extra = {} if st.has_initial_state is None else {"has_initial_state": st.has_initial_state}
    if st.checkpoints is not None:  # state checkpoints: the replacement kernel stores them (CuTe DSL's does)
        extra.update(checkpoint_indices=st.checkpoints, checkpoint_every=st.checkpoint_every)
    plan.state_kernel(kda=plan.kda, k=x.k, g=x.g, w=b.w, u=b.u, rk=b.rk, cu_seqlens=x.cu_seqlens,
                      chunk_off=t.chunk_off, state_indices=st.state_indices, h0=st.h0, ht=st.ht, hbuf=b.hbuf,
                      vn=b.vn, state_layout=plan.state_layout, **extra)
