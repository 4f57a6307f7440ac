"""Chunked prefill (GDN, KDA) with the CuTe DSL state stage and the Triton intra/output stages.

Stages (C = 64; see :mod:`linattn.kernels.triton.prefill`): 1. Triton stage 1
(``chunk_intra_kernel``: W, U, key norms; for KDA after ``chunk_kda_system_kernel``: A, Aqk and
the output stage's decayed queries); 2. **the CuTe DSL state kernel**
(:func:`linattn.kernels.cutedsl.chunk_state.cutedsl_chunk_state`: the pool row is read and written
in place inside the kernel); 3. the Triton output stage (``chunk_output_kernel``, or
``chunk_output_grouped_kernel`` for GDN's bf16 path at GVA group size 2, with every chunk's
state: a replacement state kernel takes none of GDN's stage options, ``prefill.stage_options``).

The CuTe DSL kernel goes in through ``chunk_prefill``'s ``state_kernel=`` hook, so stages 1 and 3
are exactly the Triton prefill's.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch

from .chunk_state import cutedsl_chunk_state


def cutedsl_prefill(family: Literal["gdn", "kda"], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
                    state_pool: Optional[torch.Tensor], state_indices: Optional[torch.Tensor],
                    initial_state: Optional[torch.Tensor], scale: float, use_qk_l2norm: bool,
                    state_layout: str, has_initial_state: Optional[torch.Tensor] = None,
                    output_state_indices: Optional[torch.Tensor] = None, checkpoint_every: Optional[int] = None,
                    checkpoint_indices: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GDN / KDA chunked prefill (docs/ops.md ``gdn_prefill`` / ``kda_prefill``) on SM90 / SM100.

    Args:
        family: ``"gdn"`` or ``"kda"``.
        q, k: ``[T, H, K]`` bf16; v: ``[T, HV, V]`` bf16 (K, V in {64, 128}).
        g: fp32 ``[T, HV]`` (GDN) or ``[T, HV, K]`` (KDA); beta: fp32 ``[T, HV]``.
        cu_seqlens: ``[N+1]`` int32/int64.
        state_pool / state_indices: pool mode (``[P, HV, V, K]`` "vk" or ``[P, HV, K, V]`` "kv", fp32
            or bf16; ``[N]`` slots, negative = padding: zero h0, no store).
        initial_state: dense mode initial state or None.
        scale, use_qk_l2norm, state_layout: as in docs/ops.md.
        has_initial_state: pool mode, ``[N]`` bool or None: False starts that sequence from a zero
            state (the state kernel does not read its slot) and stores its final state as usual.
        output_state_indices: pool mode, ``[N]`` write slots or None: handed to ``chunk_prefill``,
            which copies the read rows into the write rows first
            (:func:`linattn.kernels.triton.prefill.forked`) and runs in place on the write slots
            (docs/ops.md "Separate read and write slots").
        checkpoint_every, checkpoint_indices: pool mode, state checkpoints (docs/ops.md "State
            checkpoints"): stored by the CuTe DSL state kernel in its chunk loop.
    Returns:
        ``(o [T, HV, V] bf16, final_state)``: final_state is a new fp32 ``[N, HV, V, K]`` (or
        ``[N, HV, K, V]``) tensor in dense mode, None in pool mode (the pool was updated in place).
    Raises:
        ValueError: unsupported dtype or head dims.
    Source: docs/ops.md "Chunked form".
    """
    from linattn.kernels.triton import prefill as tp

    if q.dtype != torch.bfloat16:
        raise ValueError(f"cutedsl prefill: dtype {q.dtype}; supported: bfloat16")
    return tp.chunk_prefill(family, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                            state_indices=state_indices, initial_state=initial_state, scale=scale,
                            use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                            has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                            checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
                            state_kernel=cutedsl_chunk_state)
