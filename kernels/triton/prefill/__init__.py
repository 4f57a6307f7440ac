"""Chunked prefill for GDN and KDA in Triton, with the state pool read and written in place.

The host side reads as typed stages, one module per concern:

- :mod:`.config`: the frozen :class:`PrefillConfig` per shape class (:func:`prefill_config`; a
  partial override by field paths: :func:`override_config`);
- :mod:`.plan`: the :class:`PrefillPlan` built from host-known facts only (:func:`plan_prefill`:
  shapes, dtypes, flags; never a tensor's values, no device sync), with the segment-parallel and
  fused decisions (:func:`plan_segments`, :func:`plan_fused`, the fused walk :func:`plan_walk`);
- :mod:`.run`: :func:`run_prefill` (and :func:`chunk_prefill`, plan then run), the recorded launches
  (:class:`PrefillLaunch`); :mod:`.replay`: :class:`PrefillReplay`;
- each stage's launcher beside its kernels, which :func:`run_prefill` calls in order:

0. :func:`launch_tables` (:mod:`..chunk_tables`): the chunk index tables (one launch; torch ops
   past :data:`TABLES_TRITON_MAX_N` sequences).
1. :func:`launch_intra` (:mod:`..chunk_intra`): per (chunk, value head), on a persistent grid:
   chunk-local cumulative gates, ``A`` (K K^T with decays), ``(I + A)^-1``, ``W`` and ``U`` (and,
   for KDA, the intra-chunk query-key matrix, the decayed queries and keys and the chunks' total
   decays, which stages 2 and 3 read). KDA builds its ``A`` and those operands in a launch before
   it (one program per (chunk, value head)); the persistent kernel then solves and forms ``W`` and
   ``U``. GDN's bf16 path writes ``Tm diag(beta)`` instead of ``U``
   (:attr:`GdnStageSplit.u_in_state`): stage 2 forms ``U``.
2. :func:`launch_gates` (GDN's bf16 path, :attr:`GdnStageSplit.gates_kernel`): the state loop's
   gate factors (:func:`.chunk_state.chunk_gdn_gates_kernel`).
3. :func:`launch_state` (:mod:`..chunk_state`): per (value block, sequence, value head), grid from
   the launch-grid planner: the sequential pass over the sequence's chunks; pool mode loads ``h0``
   from ``state_pool[state_indices[n]]`` and stores the final state to the same row inside the
   kernel. KDA's bf16 path at K <= 128 writes the output here (:attr:`StateConfig.writes_output`).
4. :func:`launch_output` (:mod:`..chunk_output`): per (chunk, value head, value block): the output
   rows (GDN's bf16 path at GROUP = 2: per (chunk, key head, value block), both value heads from
   one ``q k^T``; the state stage stores the state entering every second chunk only and this stage
   rebuilds the others' share from the chunk before: :attr:`GdnStageSplit.every_second_state`).

The chunk index table (sequence and first token of every chunk) is built on the device from
``cu_seqlens`` with no host sync: the intra and output stages cover the upper bound
``T // 64 + N`` chunks, and work past the real count is skipped at once. So a prefill call can be
captured in a CUDA graph (the validation layer's own checks aside).

Host cost. :func:`run_prefill` records the launches of a plan's second call of a tensor
signature (:class:`PrefillLaunch`: grids, scalar arguments, constexprs and launch options, derived
once by the stage functions themselves) and replays them on later calls of that signature: one
workspace allocation for every intermediate buffer and the chunk tables, no input copy where the
strides need none, and on CUDA each compiled kernel's launcher called directly
(:class:`.launch.LaunchSequence`). The dispatcher's prepared launch (:class:`PrefillReplay`) goes
further for an engine's stream of new lengths: one recorded plan per (T bucket, N) serves every T
of the bucket, bitwise as a plan for that T (issue 28).

Configurations are pinned per shape class (K, V, dtype): nothing is autotuned, so the kernel that
writes the pool runs exactly once per call (ops.md: the pool is advanced exactly once). Why each
pinned value won: docs/performance.md#prefill.

Precision: fp32 inputs use ``input_precision="ieee"`` dots everywhere (tf32 would miss ops.md's
1e-5 against float64); bf16 inputs run the dots that touch W, U, the states and the outputs on
bf16 operands with fp32 accumulation (state kept in fp32, stored per chunk in bf16 as the
reference implementations do; GDN's grouped path: every second chunk); fp16 inputs run those dots
in fp32 (tf32), since an fp16 copy of a state holding values past 65,504 would overflow (field
case F17). The triangular solve is fp32: ieee dots for fp32 inputs; for bf16/fp16, 3xTF32 dots for
the diagonal blocks (the Neumann product) and tf32 dots for the blocks below them. Under
``TRITON_INTERPRET=1`` every dot runs on fp32 operands (the interpreter's bf16 dot is wrong).

Unused kernel operands go in as None (each kernel's constexprs say which it reads), so a kernel
parameter always holds what its name says. One exception keeps a shipped build's code: where KDA's
state kernel writes the output, its unread ``rk``, ``has_init``, ``hbuf`` and ``vn`` are the real key
norms and zero-size tensors (:func:`.chunk_state.launch_state`).

This package's namespace re-exports the names callers use (``from linattn.kernels.triton.prefill
import chunk_prefill, plan_prefill, prefill_config, ...``). An override of the pinned configuration
replaces :func:`.config.prefill_config` in :mod:`.config` (the planner looks it up there at each
plan) or passes ``config=`` to :func:`plan_prefill`.
"""

from __future__ import annotations

from ..chunk_tables import (CHUNK, ChunkTables, SegmentTables, chunk_tables, launch_tables, segment_tables,
                            segment_tables_torch)
from ..chunk_intra import launch_intra, kda_system_constexprs
from ..chunk_state import (SEGMENT_COMBINE_BLOCK_V, SEGMENT_COMBINE_LAUNCH, launch_gates, launch_state,
                           launch_segmented_state)
from ..chunk_output import launch_output
from ..chunk_fused import FusedConfig, fused_config, fused_prep_items, launch_fused_stages
from ..limits import DTYPES, HEAD_DIMS, prefill_supported
from .config import (LaunchOptions, dot_precision, SolveConfig, IntraConfig, KdaSystemConfig, StateConfig,
                     OutputConfig, GdnStageSplit, PrefillConfig, prefill_config, override_config, config_on_target)
from .plan import (TABLES_TRITON_MAX_N, SEGMENT_MIN_CHUNKS, SEGMENT_PROGRAMS_PER_SM, SEGMENT_MAX_K,
                   FUSED_MIN_PROGRAMS_PER_SM, FUSED_KDA_DEFAULT, FUSED_PIPELINED_SMEM, StageOptions, stage_options,
                   BufferSpec, PrefillGrids, PrefillPlan, PrefillBuffers, SegmentGrids, PrefillInputs, PrefillState,
                   plan_prefill, plan_segments, plan_fused, plan_walk, walk_switch_note)
from .run import (chunk_prefill, forked, allocate_buffers, conform_inputs, prefill_state, run_prefill, launch_stages,
                  WORKSPACE_ALIGN, PrefillLaunch)
from .replay import REPLAY_BUCKETS_PER_OCTAVE, replay_tokens, PrefillReplay

__all__ = [
    "CHUNK", "ChunkTables", "SegmentTables", "chunk_tables", "launch_tables", "segment_tables",
    "segment_tables_torch", "launch_intra", "kda_system_constexprs", "SEGMENT_COMBINE_BLOCK_V",
    "SEGMENT_COMBINE_LAUNCH", "launch_gates", "launch_state", "launch_segmented_state", "launch_output",
    "FusedConfig", "fused_config", "fused_prep_items", "launch_fused_stages", "DTYPES", "HEAD_DIMS",
    "prefill_supported", "LaunchOptions", "dot_precision", "SolveConfig", "IntraConfig", "KdaSystemConfig",
    "StateConfig", "OutputConfig", "GdnStageSplit", "PrefillConfig", "prefill_config", "override_config",
    "config_on_target", "TABLES_TRITON_MAX_N", "SEGMENT_MIN_CHUNKS", "SEGMENT_PROGRAMS_PER_SM", "SEGMENT_MAX_K",
    "FUSED_MIN_PROGRAMS_PER_SM", "FUSED_KDA_DEFAULT", "FUSED_PIPELINED_SMEM", "StageOptions", "stage_options",
    "BufferSpec", "PrefillGrids", "PrefillPlan", "PrefillBuffers", "SegmentGrids", "PrefillInputs", "PrefillState",
    "plan_prefill", "plan_segments", "plan_fused", "plan_walk", "walk_switch_note", "chunk_prefill", "forked", "allocate_buffers", "conform_inputs",
    "prefill_state", "run_prefill", "launch_stages", "WORKSPACE_ALIGN", "PrefillLaunch",
    "REPLAY_BUCKETS_PER_OCTAVE", "replay_tokens", "PrefillReplay",
]
