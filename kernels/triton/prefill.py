"""Chunked prefill for GDN and KDA in Triton, with the state pool read and written in place.

Launches per call (C = 64 rows per chunk; chunks never cross sequences):

0. :mod:`.chunk_tables` — the chunk index tables (one launch; torch ops past
   :data:`TABLES_TRITON_MAX_N` sequences).
1. :mod:`.chunk_intra` — per (chunk, value head), on a persistent grid: chunk-local cumulative
   gates, ``A`` (K K^T with decays), ``(I + A)^-1``, ``W`` and ``U`` (and, for KDA, the intra-chunk
   query-key matrix, the decayed queries and keys and the chunks' total decays, which stages 2 and
   3 read). KDA builds its ``A`` and those operands in a launch before it (one program per
   (chunk, value head)); the persistent kernel then solves and forms ``W`` and ``U``. GDN's bf16
   path writes ``Tm diag(beta)`` instead of ``U`` (pinned ``gdn_state_u``): stage 2 forms ``U``.
   GDN's bf16 path then forms the state loop's gate factors in a small launch
   (:func:`.chunk_state.chunk_gdn_gates_kernel`, pinned ``gdn_hoist``).
2. :mod:`.chunk_state` — per (value block, sequence, value head), grid from the launch-grid
   planner: the sequential pass over the sequence's chunks; pool mode loads ``h0`` from
   ``state_pool[state_indices[n]]`` and stores the final state to the same row inside the kernel.
3. :mod:`.chunk_output` — per (chunk, value head, value block): the output rows (GDN's bf16 path at
   GROUP = 2: per (chunk, key head, value block), both value heads from one ``q k^T``; stage 2
   stores the state entering every second chunk only and this stage rebuilds the others' share
   from the chunk before: pinned ``gdn_half_hbuf``). KDA's bf16 path at K <= 128 writes the output
   in stage 2 instead.

The chunk index table (sequence and first token of every chunk) is built on the device from
``cu_seqlens`` with no host sync: the intra and output stages cover the upper bound
``T // 64 + N`` chunks, and work past the real count is skipped at once. So a prefill call can be
captured in a CUDA graph (the validation layer's own checks aside).

Configurations are pinned per shape class (K, V, dtype): nothing is autotuned, so the kernel that
writes the pool runs exactly once per call (ops.md: the pool is advanced exactly once).

Precision: fp32 inputs use ``input_precision="ieee"`` dots everywhere (tf32 would miss ops.md's
1e-5 against float64); bf16 inputs run the dots that touch W, U, the states and the outputs on
bf16 operands with fp32 accumulation (state kept in fp32, stored per chunk in bf16 as the
reference implementations do; GDN's grouped path: every second chunk); fp16 inputs run those dots in fp32 (tf32), since an fp16 copy of a
state holding values past 65,504 would overflow (field case F17). The triangular solve is fp32:
ieee dots for fp32 inputs; for bf16/fp16, 3xTF32 dots for the diagonal blocks (the Neumann
product) and tf32 dots for the blocks below them. Under ``TRITON_INTERPRET=1`` every dot runs on fp32 operands (the
interpreter's bf16 dot is wrong).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Optional

import torch
import triton
import triton.language as tl

from linattn.capabilities import DeviceCapabilities, interpreter_enabled, probe
from linattn.kernels.grid import plan_grid

from .chunk_intra import KDA_FAST_SPAN, chunk_intra_kernel, chunk_kda_system_kernel
from .chunk_output import chunk_output_grouped_kernel, chunk_output_kernel
from .chunk_state import chunk_gdn_gates_kernel, chunk_state_kernel
from .chunk_tables import chunk_tables_triton

from .limits import _MIN_SMEM, _PIPELINED_SMEM, _PIPELINED_SMEM_OTHER, DTYPES, HEAD_DIMS, prefill_supported  # noqa: F401

CHUNK = 64
#: up to this many sequences the chunk tables come from one Triton launch
#: (:func:`.chunk_tables.chunk_tables_triton`), beyond it from :func:`chunk_tables` (torch ops)
TABLES_TRITON_MAX_N = 16384


def _tl_dtype(dt: torch.dtype):
    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dt]


def _row_major(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def chunk_tables(cu_seqlens: torch.Tensor, T: int):
    """Chunk index tables, built on the device with no host sync.

    Args:
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of the sequence lengths.
        T: total tokens (``cu_seqlens[-1]``, known from the shapes).
    Returns:
        ``(chunk_off [N+1] int64, chunk_seq [NT_max] int32, chunk_start [NT_max] int64, NT_max)``:
        sequence ``n`` owns chunks ``chunk_off[n] .. chunk_off[n+1]-1``; chunk ``c`` starts at token
        ``chunk_start[c]`` of sequence ``chunk_seq[c]``; entries past the real count hold
        ``chunk_seq = N`` (the kernels skip them). ``NT_max = T // 64 + N`` bounds the count.
    """
    cu = cu_seqlens.to(torch.int64)
    N = cu.numel() - 1
    nck = (cu[1:] - cu[:-1] + CHUNK - 1) // CHUNK
    chunk_off = torch.zeros(N + 1, dtype=torch.int64, device=cu.device)
    torch.cumsum(nck, 0, out=chunk_off[1:])
    nt_max = T // CHUNK + N
    c = torch.arange(nt_max, dtype=torch.int64, device=cu.device)
    seq = torch.searchsorted(chunk_off[1:], c, right=True)  # N for c >= real count
    seq_c = seq.clamp(max=max(N - 1, 0))
    start = cu[seq_c] + CHUNK * (c - chunk_off[seq_c])
    return chunk_off, seq.to(torch.int32), start, nt_max


def chunk_prefill(family: Literal["gdn", "kda"], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
                  state_pool: Optional[torch.Tensor], state_indices: Optional[torch.Tensor],
                  initial_state: Optional[torch.Tensor], scale: float, use_qk_l2norm: bool,
                  state_layout: str, layout: str = "split",
                  caps: Optional[DeviceCapabilities] = None,
                  state_kernel=None,
                  has_initial_state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GDN / KDA chunked prefill (ops.md ``gdn_prefill`` / ``kda_prefill``), pool or dense mode.

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
        state_layout: ``"vk"`` or ``"kv"``.
        layout: launch-grid layout of the state kernel (``"split"`` or ``"folded"``).
        caps: device capabilities (default: probed from q's device).
        state_kernel: an alternative implementation of stage 2 (the sequential state kernel), e.g.
            :func:`linattn.kernels.cutedsl.chunk_state.cutedsl_chunk_state`; called with the
            keywords ``kda, k, g, w, u, rk, cu_seqlens, chunk_off, state_indices, h0, ht, hbuf, vn,
            state_layout`` on the same buffers (bf16 path only), plus ``has_initial_state`` when
            given. None: the Triton state kernel.
        has_initial_state: pool mode only: ``[N]`` bool or None. False starts that sequence from a
            zero state: the state kernel's h0 load is masked (the slot is never read, NaN there is
            harmless) and the final state is stored as usual. No extra launch.
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
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    kda = family == "kda"
    why = prefill_supported(family, K, V, q.dtype)
    if why is not None:
        raise ValueError(f"Triton chunked prefill: {why}")
    dev = q.device
    N = cu_seqlens.numel() - 1
    pool_mode = state_pool is not None
    if pool_mode and state_indices is None:
        raise ValueError("pool mode (state_pool given) needs state_indices [N]: the slot of each "
                         "sequence, read as h0 and overwritten with the final state")
    o = torch.empty(T, HV, V, dtype=q.dtype, device=dev)
    final = None
    if not pool_mode:  # a new tensor in initial_state's dtype (fp32 without one), as torch_ref
        shape = (N, HV, V, K) if state_layout == "vk" else (N, HV, K, V)
        fdt = initial_state.dtype if initial_state is not None else torch.float32
        final = torch.empty(shape, dtype=fdt, device=dev)
    if T == 0 or N == 0:  # nothing to compute: the final state is the initial state
        if pool_mode and has_initial_state is not None and N > 0:  # fresh ones: the zero state
            fresh = (state_indices.to(torch.long) >= 0) & ~has_initial_state.to(device=dev, dtype=torch.bool)
            state_pool[state_indices.to(torch.long)[fresh]] = 0  # no kernel runs at T = 0
        if final is not None:
            if initial_state is not None:
                final.copy_(initial_state)
            else:
                final.zero_()
        return o, final
    if caps is None:
        caps = probe(dev)

    q, k, v = _row_major(q), _row_major(k), _row_major(v)
    g = _row_major(g) if kda else g
    if has_initial_state is not None:
        if not pool_mode:
            raise ValueError("has_initial_state is for pool mode; in dense mode pass initial_state")
        has_initial_state = has_initial_state.contiguous().view(torch.uint8)  # read as [N] bytes
    # In-chunk offsets are int32 (row * token stride for 64 rows); a view whose token stride is so
    # large that this would overflow (field case F10) is copied first.
    q, k, v, g, beta = (x if x.stride(0) * CHUNK < 2**31 else x.contiguous() for x in (q, k, v, g, beta))
    interp = interpreter_enabled()
    if interp or q.dtype != torch.bfloat16:
        buf_dt, DT = torch.float32, tl.float32
    else:
        buf_dt, DT = torch.bfloat16, tl.bfloat16
    PREC = "ieee" if q.dtype == torch.float32 else "tf32"
    GROUP = HV // H

    # one launch; at tens of thousands of sequences the torch ops are faster (H200, CUDA graph:
    # 65,536 sequences 92 against 40 us; 8,192: 11 against 36 us)
    tables = chunk_tables_triton if N <= TABLES_TRITON_MAX_N else chunk_tables
    chunk_off, chunk_seq, chunk_start, nt_max = tables(cu_seqlens, T)
    cfg = pinned_config(family, K, V, q.dtype,
                        None if caps.device_type == "cpu" else caps.shared_memory_per_block)
    opt = stage_options(family, GROUP, cfg, replaced_state=state_kernel is not None)
    bufs = intra_buffers(kda, T, HV, K, V, nt_max, buf_dt, dev, u_width=CHUNK if opt.state_u else V)
    # KDA: the state kernel writes the output itself (cfg "state_fuse_o"), unless a replacement
    # state kernel runs: then that hands over the per-chunk states and Vn to the output kernel
    fuse_o = kda and state_kernel is None and cfg["state_fuse_o"]
    if fuse_o:
        vn = hbuf = torch.empty(0, dtype=buf_dt, device=dev)  # not touched
    else:
        vn = torch.empty(T, HV, V, dtype=buf_dt, device=dev)
        hbuf = torch.empty(nt_max, HV, K, V, dtype=buf_dt, device=dev)
    launch_intra(q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, nt_max, bufs, scale=scale,
                 kda=kda, use_qk_l2norm=use_qk_l2norm, DT=DT, PREC=PREC, cfg=cfg, caps=caps,
                 tmout=opt.state_u)
    w, u, rk = bufs["w"], bufs["u"], bufs["rk"]
    if opt.hoist:  # GDN: the state loop's gate factors, formed before it
        bufs["kf"] = torch.empty(T, HV, dtype=torch.float32, device=dev)
        bufs["ec"] = torch.empty(nt_max, HV, dtype=torch.float32, device=dev)
        BH = min(32, triton.next_power_of_2(HV))
        chunk_gdn_gates_kernel[(nt_max, triton.cdiv(HV, BH))](
            g, rk, bufs["kf"], bufs["ec"], cu_seqlens, chunk_seq, chunk_start, g.stride(0), g.stride(1),
            N, HV, BH=BH, num_warps=4)
    # what stages 2 and 3 read for q, k and g: GDN the inputs themselves; KDA stage 1's decayed
    # queries and keys (per value head: GROUP 1) and per-chunk total decays (a replacement state
    # kernel gets the raw k and g either way)
    if kda:
        qs, ks, gs, grp = bufs["qg"], bufs["kd"], bufs["gl"], 1
    else:
        qs, ks, gs, grp = q, k, g, GROUP
    srk, sg = (bufs["kf"], bufs["ec"]) if opt.hoist else (rk, gs)

    BV = cfg["state_bv"]
    plan = plan_grid(N, HV, V // BV, caps, layout)
    if pool_mode:
        h0 = ht = state_pool
        s0 = st = _state_strides(state_pool, state_layout)
        sidx = state_indices
    else:
        h0 = initial_state if initial_state is not None else final
        s0 = _state_strides(h0, state_layout)
        ht = final
        st = _state_strides(final, state_layout)
        sidx = chunk_off  # unused in dense mode
    if state_kernel is not None:
        if buf_dt != torch.bfloat16:
            raise ValueError("a replacement state_kernel runs on the bf16 path only (bf16 q/k/v, compiled)")
        extra = {} if has_initial_state is None else {"has_initial_state": has_initial_state}
        state_kernel(kda=kda, k=k, g=g, w=w, u=u, rk=rk, cu_seqlens=cu_seqlens, chunk_off=chunk_off,
                     state_indices=state_indices if pool_mode else None,
                     h0=state_pool if pool_mode else initial_state, ht=ht, hbuf=hbuf, vn=vn,
                     state_layout=state_layout, **extra)
    elif not plan.empty:
        sq, sa = (v, u) if opt.state_u else (qs, bufs.get("aqk", rk))  # UTM: v as q, Tm diag(beta) as aqk
        chunk_state_kernel[plan.grid](
            ks, sg, w, u, srk, cu_seqlens, chunk_off, sidx,
            has_initial_state if has_initial_state is not None else sidx, h0, ht, hbuf, vn, sq, sa, o,
            ks.stride(0), ks.stride(1), sg.stride(0), sg.stride(1), sq.stride(0), sq.stride(1), *s0, *st,
            grp, HV, K=K, V=V, BV=BV, **plan.constexprs, KDA=kda, POOL=pool_mode,
            HAS_H0=initial_state is not None, DT=DT, PREC=PREC, FUSE_O=fuse_o, HOIST=opt.hoist,
            HSTEP=2 if opt.half_hbuf else 1, UTM=opt.state_u, HAS_INIT=has_initial_state is not None,
            **cfg["state_fused" if fuse_o else "state"],
        )
    if fuse_o:
        return o, final

    OBV = cfg["output_bv"]
    if opt.grouped_output:  # one program per key head: one q k^T
        chunk_output_grouped_kernel[(nt_max, H, V // OBV)](
            q, k, g, rk, hbuf, vn, o, cu_seqlens, chunk_seq, chunk_start, sidx,
            bufs["kf"] if opt.half_hbuf else rk, bufs["ec"] if opt.half_hbuf else rk,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), g.stride(1),
            N, HV, float(scale), K=K, V=V, BK=64, BV=OBV, GROUP=GROUP, L2NORM=use_qk_l2norm,
            POOL=pool_mode, DT=DT, PREC=PREC, HALF=opt.half_hbuf, **cfg["output_grouped"],
        )
        return o, final
    chunk_output_kernel[(nt_max, HV, V // OBV)](
        qs, ks, gs, rk, bufs.get("aqk", rk), hbuf, vn, o, cu_seqlens, chunk_seq, chunk_start, sidx,
        qs.stride(0), qs.stride(1), ks.stride(0), ks.stride(1), gs.stride(0), gs.stride(1),
        N, grp, HV, float(scale),
        K=K, V=V, BK=64, BV=OBV, KDA=kda, L2NORM=use_qk_l2norm, POOL=pool_mode, DT=DT, PREC=PREC,
        **cfg["output"],
    )
    return o, final


class StageOptions(NamedTuple):
    """How GDN's chunked prefill splits its stages for one call (:func:`stage_options`)."""

    #: stage 3 runs one program per key head (``chunk_output_grouped_kernel``)
    grouped_output: bool
    #: the state loop's gate factors come from ``chunk_gdn_gates_kernel``
    hoist: bool
    #: the state stage stores the state entering every second chunk only (grouped output: HALF)
    half_hbuf: bool
    #: stage 1 writes ``Tm diag(beta)``; the state stage forms ``U``
    state_u: bool


def stage_options(family: str, group: int, cfg: dict, replaced_state: bool = False) -> StageOptions:
    """Resolve the pinned options (:func:`pinned_config`) for a call at GVA group size ``group``.

    The options go together as they were measured: every second chunk's state only with the
    grouped output (the kernel that rebuilds the others) and the gate factors of the gates kernel;
    ``U`` in the state stage only with that (with every chunk's state stored, the state kernel needs
    121 KiB of shared memory and measured slower: ``prefill_h200_s7_final_half_off.json``). A
    replacement state kernel (``replaced_state``, e.g. cutedsl) takes none of them: it reads ``U``
    and ``g`` and writes every chunk's state. KDA takes none (it has its own stage split)."""
    gdn = family == "gdn" and not replaced_state
    grouped = family == "gdn" and group in cfg["output_group"]
    hoist = gdn and bool(cfg["gdn_hoist"])
    half = hoist and grouped and bool(cfg["gdn_half_hbuf"])
    return StageOptions(grouped_output=grouped, hoist=hoist, half_hbuf=half,
                        state_u=half and bool(cfg["gdn_state_u"]))


def intra_buffers(kda: bool, T: int, HV: int, K: int, V: int, nt_max: int, buf_dt: torch.dtype,
                  device, u_width: Optional[int] = None) -> dict:
    """The buffers stage 1 writes, by name: ``w [T, HV, K]`` and ``u [T, HV, u_width]`` in ``buf_dt``
    (``u_width``: V, the default, for ``U``; 64 for GDN's ``Tm diag(beta)``, :func:`stage_options`),
    ``rk [T, HV]`` fp32 and, for KDA, the matrices ``abuf [nt_max, HV, 64, 64]`` fp32,
    ``aqk [T, HV, 64]``, the decayed keys ``kd`` and queries ``qg [T, HV, K]`` (all ``buf_dt``)
    and the chunks' total log decays ``gl [nt_max, HV, K]`` fp32
    (:func:`.chunk_intra.chunk_kda_system_kernel` says what each holds)."""
    bufs = dict(w=torch.empty(T, HV, K, dtype=buf_dt, device=device),
                u=torch.empty(T, HV, u_width or V, dtype=buf_dt, device=device),
                rk=torch.empty(T, HV, dtype=torch.float32, device=device))
    if kda:
        bufs.update(abuf=torch.empty(nt_max, HV, CHUNK, CHUNK, dtype=torch.float32, device=device),
                    aqk=torch.empty(T, HV, CHUNK, dtype=buf_dt, device=device),
                    kd=torch.empty(T, HV, K, dtype=buf_dt, device=device),
                    qg=torch.empty(T, HV, K, dtype=buf_dt, device=device),
                    gl=torch.empty(nt_max, HV, K, dtype=torch.float32, device=device))
    return bufs


def launch_intra(q, k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, nt_max, bufs: dict, *, scale: float,
                 kda: bool, use_qk_l2norm: bool, DT, PREC: str, cfg: dict, caps: DeviceCapabilities,
                 tmout: bool = False) -> None:
    """Stage 1 (:func:`.chunk_intra.chunk_intra_kernel`) on the buffers of :func:`intra_buffers`:
    a persistent grid of ``min(NT_max * HV, sm_count * cfg["intra_ctas_per_sm"])`` programs, each
    with its own 32 KiB fp32 scratch; KDA first runs
    :func:`.chunk_intra.chunk_kda_system_kernel` (grid ``(NT_max, HV)``). ``tmout`` (GDN,
    :func:`stage_options`): ``u`` gets ``Tm diag(beta)`` ``[T, HV, 64]`` instead of ``U``, launched
    with ``cfg["intra_tm"]`` and ``cfg["intra_tm_ctas_per_sm"]``. Touches no state."""
    HV = v.shape[1]
    N = cu_seqlens.numel() - 1
    K = q.shape[2]
    items = nt_max * HV
    key = "intra_tm" if tmout else "intra"  # GDN's stage 1 writing Tm diag(beta) has its own launch
    progs = max(1, min(items, caps.sm_count * cfg[key + "_ctas_per_sm"]))
    scratch = torch.empty(progs, 2, CHUNK, CHUNK, dtype=torch.float32, device=q.device)
    rk = bufs["rk"]
    if kda:  # stage 1a: A, Aqk and the later stages' operands
        chunk_kda_system_kernel[(nt_max, HV)](
            q, k, g, beta, cu_seqlens, chunk_seq, chunk_start, bufs["abuf"], rk, bufs["aqk"], bufs["w"],
            bufs["kd"], bufs["qg"], bufs["gl"],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1), N, HV // q.shape[1], HV, float(scale),
            K=K, BK=cfg["kda_system_bk"], L2NORM=use_qk_l2norm, DT=DT, PREC=PREC,
            OP=DT if cfg["kda_system_bf16"] else tl.float32, SPAN=KDA_FAST_SPAN if cfg["kda_system_fast"] else float("-inf"), **cfg["kda_system"],
        )
    chunk_intra_kernel[(progs,)](
        k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, bufs["w"], bufs["u"], rk,
        bufs.get("abuf", rk), scratch,  # GDN: no abuf (rk stands in, never touched)
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        N, HV // q.shape[1], HV, items, K=K, V=v.shape[2],
        BK=cfg["intra_bk"], BV=cfg["intra_bk"], KDA=kda, L2NORM=use_qk_l2norm, DT=DT, PREC=PREC,
        TMOUT=tmout, **cfg["intra_solve"], **cfg[key],
    )


def pinned_config(family: str, K: int, V: int, dtype: torch.dtype,
                  smem_per_block: Optional[int] = None) -> dict:
    """Launch configuration per shape class (no autotuning: the state kernel writes the pool).

    Chosen from H200 sweeps (benchmarks/prefill.py --sweep --intra-sweep) and sm_90 builds
    (registers, spills and shared memory per CTA, pinned by tests/prefill/test_prefill_compile.py
    and tests/contract/test_compile.py). The state kernel's loads are software-pipelined (2 stages) where the device's shared memory
    per block holds it (``smem_per_block``; None = assume it does), else it runs unpipelined
    (K = 256 always: 227 KiB would not hold it).
    """
    kda = family == "kda"
    gdn_bf16 = not kda and dtype == torch.bfloat16
    full = _PIPELINED_SMEM.get(dtype, _PIPELINED_SMEM_OTHER)
    pipelined = K != 256 and (smem_per_block is None or smem_per_block >= full)
    return {
        # the intra stage is persistent: "intra_ctas_per_sm" programs per SM (each with a 32 KiB
        # fp32 scratch for A and Tm, so the scratch of all of them stays in L2). H200, 16x4096,
        # with the 128-register cap and 8 per SM against no cap and 4 per SM: GDN 2.24 against
        # 3.60 ms, KDA (then building A itself) 16.1 against 22.1 ms (benchmarks/results/
        # prefill_h200_run3.json, _run2_sweeps.json)
        "intra": dict(num_warps=4, num_stages=1, maxnreg=128),
        "intra_ctas_per_sm": 8,
        # GDN's stage 1 where it leaves U to the state stage (stage_options().state_u): a
        # 168-register cap, 3 per SM: 1.32 ms against 1.46 at 128 / 8, 1.40 at 144 / 3 and 1.56
        # uncapped at 2 (H200, 16x4096, prefill_h200_s7_exp4.json)
        "intra_tm": dict(num_warps=4, num_stages=1, maxnreg=168),
        "intra_tm_ctas_per_sm": 3,
        "intra_bk": 32,
        # Tm = (I + A)^-1 (chunk_intra._solve). fp32 inputs: forward substitution and ieee dots
        # (ops.md's 1e-5). bf16/fp16: the diagonal blocks by the Neumann product on 3xTF32 dots
        # (fp32-level accuracy) and the blocks below them on tf32 dots (W/U move by 5.3e-4
        # relative, against bf16's own 3.9e-3 rounding and the 2e-2 tolerance). H200, 16x4096,
        # stage 1 alone: GDN 2.22 -> 1.61 ms, KDA 9.28 -> 8.39 ms with its system kernel
        # (benchmarks/results/prefill_h200_s4_run4_intra.json; all-tf32x3 1.83 / 8.59 ms)
        "intra_solve": (dict(NEUMANN=False, DPREC="ieee", IPREC="ieee") if dtype == torch.float32
                        else dict(NEUMANN=True, DPREC="tf32x3", IPREC="tf32")),
        # KDA's system kernel: 4 warps, channel blocks of 32, the fast path where its bound holds
        # (H200, 16x4096, stage 1 in all: 4.91 ms; level path everywhere 7.40, a 168-register cap
        # 5.17, channel blocks of 64: 5.48, of 16: 6.45; benchmarks/results/
        # prefill_h200_s5_run2_kda_sweep.json; 8 warps: 11.6 in _s5_run1_kda_sweep.json). Its
        # A/Aqk dots run on fp32 operands (tf32); bf16 operands measured 4.80 ms but move W/U by
        # 1.1e-3 relative, so they are not the default
        "kda_system": dict(num_warps=4, num_stages=1),
        "kda_system_bk": 32,
        "kda_system_bf16": False,
        "kda_system_fast": True,
        # bf16: value blocks of 64, 4 warps (H200, 16x4096, whole prefill: GDN 4.72 against 5.10 ms
        # with 32; benchmarks/results/prefill_h200_run4.json); fp32 operand tiles (fp32 and fp16
        # inputs) spill far more at 64, so they keep 32
        "state_bv": 64 if dtype == torch.bfloat16 else 32,
        "state": dict(num_warps=8 if K == 256 else 4, num_stages=2 if pipelined else 1),
        # KDA: the state kernel also writes the output (no per-chunk states or Vn through memory,
        # no output kernel), unpipelined (H200, whole prefill, 16x4096 / 256x256: 6.46 / 6.74 ms
        # against 6.68 / 6.96 apart and 6.84 / 7.17 pipelined; benchmarks/results/
        # prefill_h200_s5_run3_state_sweep.json). GDN: slower fused (4.06 against 3.73 ms), apart.
        # Fused GDN builds also gave wrong outputs at value blocks of 32 unpipelined (rel 16.7
        # against the others in that sweep: a miscompile, as far as we could tell), one more
        # reason to keep it apart. Only bf16 is fused: the measured and GPU-tested build (fp16
        # runs fp32 tiles at value blocks of 32, a build never run on a GPU fused; it spills
        # 272 B fused, 16 B apart); K = 256 keeps it apart (the fused build needs 112 KiB of
        # shared memory; limits: 96), and so do fp32 inputs (ieee dots on FMA: the fused build
        # spills 7.9 KB at K = 64)
        "state_fuse_o": kda and K <= 128 and dtype == torch.bfloat16,
        "state_fused": dict(num_warps=4, num_stages=1),
        # GDN's output stage has two dots in its K loop; with software pipelining (2 stages, 4
        # warps) its bf16 build gave run-to-run different outputs on the H200 (triton 3.6), so it
        # runs unpipelined at 8 warps, the configuration that measured correct and deterministic
        "output": dict(num_warps=4, num_stages=2) if kda else dict(num_warps=8, num_stages=1),
        # the whole value dim per program at V = 128 (the q k^T product is formed once): GDN 4.74
        # against 5.10 ms with 64 (prefill_h200_run4.json)
        "output_bv": 128 if V == 128 else 64,
        # GDN, bf16: at these GVA group sizes (HV / H) one output program per key head writes its
        # value heads from one q k^T (chunk_output_grouped_kernel), 4 warps unpipelined. H200,
        # 16x4096, output stage 1.01 ms (prefill_h200_s6_final.json) against 1.10 per value head
        # (the baselines of prefill_h200_s6_exp_group.json); 8 warps 1.60; pipelined (2 stages)
        # gave run-to-run different, wrong outputs (rel 0.03; _s6_exp_output.json), as the
        # per-head kernel did. Only GROUP = 2 was measured: GROUP 4-16 builds spill 40-48 B and
        # keep the per-head kernel, as do fp32 (the grouped build spills 11 KB) and fp16 (160 B,
        # never measured)
        "output_group": (2,) if not kda and dtype == torch.bfloat16 else (),
        "output_grouped": dict(num_warps=4, num_stages=1),
        # GDN bf16 (H200, whole prefill, prefill_h200_s7_exp2.json / _exp4.json; 16x4096, from
        # 3.60 ms with the one-launch chunk tables, against 3.64 with torch's):
        # - "gdn_hoist": the state loop's gate factors rk exp(G_C - G) and exp(G_C) from their own
        #   small launch (chunk_state.chunk_gdn_gates_kernel, 11 us), not a scan per chunk on the
        #   state loop's serial path: 3.60 -> 3.55 ms (state stage 0.98 -> 0.92);
        # - "gdn_half_hbuf": with the grouped output, the state stage stores the state entering
        #   every second chunk only and the output rebuilds the others' share from the chunk
        #   before (chunk_output_grouped_kernel, HALF): 3.55 -> 3.54 (state 0.92 -> 0.79-0.86,
        #   output 1.01 -> 1.11); forming q k'^T once for both heads (it spills) measured 3.58.
        #   With "gdn_state_u" it is what keeps the state stage fast: without it the state kernel
        #   stores every chunk's state on top of the U operands (121 KiB of shared memory) and the
        #   whole prefill measured 1.02 / 1.05 / 1.13x FLA (prefill_h200_s7_final_half_off.json)
        #   against 1.16 / 1.16 / 1.16x with it (prefill_h200_s7_final.json);
        # - "gdn_state_u": stage 1 writes Tm diag(beta) [T, HV, 64] instead of U and the state
        #   stage forms U = Tm diag(beta) V itself (U is not rounded to bf16 on the way: against
        #   float64, 4 x 1024 tokens, output 3.7e-3 and state 2.4e-3 relative, from 4.0e-3 and
        #   2.9e-3): 3.52 -> 3.45 in one run (_exp3.json), 3.31 with stage 1's 168-register cap (_exp4.json).
        # On the worst-conditioned input (every key the same, beta 1, no decay; a documented limit
        # of the bf16 pipeline, docs/ops-decisions.md) the output moves from 1.9e-2 to 3.3e-2 off
        # float64 with these options (state 2.5e-2 -> 1.8e-2; prefill_h200_s7_worst_case.json)
        "gdn_hoist": gdn_bf16,
        "gdn_half_hbuf": gdn_bf16,
        "gdn_state_u": gdn_bf16,
    }


def _state_strides(x: torch.Tensor, state_layout: str) -> tuple[int, int, int, int]:
    """(slot, head, k, v) element strides of a state tensor in layout ``vk`` or ``kv``."""
    if state_layout == "vk":
        return x.stride(0), x.stride(1), x.stride(3), x.stride(2)
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)
