"""Shared check of state checkpoints from prefill on the Triton chunked prefill (issue 32 item 1;
docs/ops.md "State checkpoints"), for the interpreter tests (tests/ops/test_checkpoints_triton.py)
and the H200 tests (tests/gpu/test_checkpoints_gpu.py).

:func:`check_triton_checkpoints` runs one pool-mode call with checkpoints through
``kernels.triton.prefill.chunk_prefill`` with the pipeline or the fused prefill forced (so that the
prefill stopped at a checkpoint runs the same kernels: the chunk decomposition is identical) and holds

* each written checkpoint bitwise to the same prefill stopped after that many tokens of its sequence
  (a call of those tokens alone on a copy of the pool as it was), and within ``tol`` (relative
  Frobenius error, float64) of the float64 token-serial reference (torch-ref) stopped there;
* the outputs and final states bitwise to the same call without checkpoints;
* every pool row the call does not own (checkpoints past a length, a padding sequence's, slots no
  one names) bitwise unchanged.
"""

from __future__ import annotations

import torch

from linattn.backends.torch_ref import gdn_prefill_ref, kda_prefill_ref
from linattn.kernels.triton.prefill import chunk_prefill
from linattn.testing.execute import rel_error


def written_checkpoints(lens: list, read: list, marks: list, every: int) -> dict:
    """``{(n, j): slot}``: the checkpoints a call writes (a live sequence, a slot named, within its length)."""
    return {(n, j): s for n, row in enumerate(marks) for j, s in enumerate(row)
            if s >= 0 and read[n] >= 0 and (j + 1) * every <= lens[n]}


def check_triton_checkpoints(family: str, d: dict, pool: torch.Tensor, read: list, marks: list, every: int, *,
                             fused: bool, tol: float, state_layout: str = "vk", layout: str = "split",
                             caps=None) -> int:
    """See the module docstring. ``d``: q, k, v, g, beta, cu_seqlens of the call (one device);
    ``pool``: the pool before the call (not changed); ``read``: state_indices; ``marks``: the
    ``[N, max_checkpoints]`` slot table; ``every``: checkpoint_every. Returns how many checkpoints
    were checked (the caller asserts the case writes some)."""
    dev = pool.device
    K = d["q"].shape[-1]
    kw = dict(initial_state=None, scale=K ** -0.5, use_qk_l2norm=True, state_layout=state_layout, layout=layout,
              caps=caps, fused=fused, segment_chunks=None if fused else 0)
    idx = torch.tensor(read, device=dev)
    plain = pool.clone()
    o_plain, _ = chunk_prefill(family, **d, state_pool=plain, state_indices=idx, **kw)
    p = pool.clone()
    o, _ = chunk_prefill(family, **d, state_pool=p, state_indices=idx, checkpoint_every=every,
                         checkpoint_indices=torch.tensor(marks, device=dev), **kw)
    assert torch.equal(o, o_plain), "the output changed with checkpoints"
    finals = sorted(s for s in read if s >= 0)
    assert torch.equal(p[finals], plain[finals]), "a final state changed with checkpoints"
    lens = (d["cu_seqlens"][1:] - d["cu_seqlens"][:-1]).tolist()
    marked = written_checkpoints(lens, read, marks, every)
    for (n, j), slot in marked.items():
        t, c0 = (j + 1) * every, int(d["cu_seqlens"][n])
        cut = {x: d[x][c0:c0 + t] for x in ("q", "k", "v", "g", "beta")}
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        stopped = pool.clone()  # the same kernels stopped after t tokens
        chunk_prefill(family, **cut, cu_seqlens=cu, state_pool=stopped, state_indices=idx[n:n + 1], **kw)
        assert torch.equal(p[slot], stopped[read[n]]), f"checkpoint {(n, j)} (slot {slot}, {t} tokens) != stopped prefill"
        err = rel_error(p[slot], stopped_reference(family, d, pool, n, t, read[n], state_layout))
        assert err <= tol, f"checkpoint {(n, j)} (slot {slot}, {t} tokens): {err:.2e} > {tol:.0e} against float64"
    owned = set(finals) | set(marked.values())
    rest = [i for i in range(pool.shape[0]) if i not in owned]
    assert rest and torch.equal(p[rest], pool[rest]), "a pool row the call does not own changed"
    return len(marked)


def stopped_reference(family: str, d: dict, pool: torch.Tensor, n: int, t: int, slot: int,
                      state_layout: str = "vk") -> torch.Tensor:
    """The float64 token-serial reference (torch-ref) state of sequence ``n`` of the call ``d`` after
    its first ``t`` tokens, from pool row ``slot`` as it was (``pool``): ``[HV, V, K]`` float64."""
    c0 = int(d["cu_seqlens"][n])
    cut = {x: d[x][c0:c0 + t].double() for x in ("q", "k", "v", "g", "beta")}
    oracle = pool.double()
    ref = kda_prefill_ref if family == "kda" else gdn_prefill_ref
    ref(**cut, cu_seqlens=torch.tensor([0, t], dtype=torch.int32, device=pool.device), state_pool=oracle,
        state_indices=torch.tensor([slot], device=pool.device), scale=d["q"].shape[-1] ** -0.5, use_qk_l2norm=True,
        state_layout=state_layout, compute_dtype=torch.float64)
    return oracle[slot]
