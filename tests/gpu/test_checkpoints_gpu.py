"""GPU tests of state checkpoints from prefill (``checkpoint_every`` / ``checkpoint_indices``, issue 32
item 1; docs/ops.md "State checkpoints") on the H200, at model head counts.

The Triton and CuTe DSL prefills do not declare the ``checkpoints`` feature yet: a call with
checkpoints must fall back to a backend that does (torch-chunked on CUDA), never run a kernel that
drops them. On CUDA torch-chunked's checkpoints are held bitwise to its own prefill stopped there
and to the float64 reference; every row the call does not write keeps its bits.
"""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.dispatch.verdict import Reason
from linattn.testing.execute import rel_error, tolerances

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
LENS = [1000, 256, 0, 2048, 30]  # 256: a checkpoint at exactly the length
EVERY = 256
P = 64


def _inputs(family, lens, seed=0):
    s = SHAPES[family]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    T = sum(lens)
    gshape = (T, s["HV"], s["K"]) if family == "kda" else (T, s["HV"])
    d = dict(q=torch.randn(T, s["H"], s["K"], generator=gen), k=torch.randn(T, s["H"], s["K"], generator=gen),
             v=torch.randn(T, s["HV"], s["V"], generator=gen), g=-(torch.rand(gshape, generator=gen) * 0.05 + 0.001),
             beta=torch.rand(T, s["HV"], generator=gen) * 0.9 + 0.05)
    d = {n: (x.to(torch.bfloat16) if n in ("q", "k", "v") else x).to(DEV) for n, x in d.items()}
    d["cu_seqlens"] = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    return d


def _table(lens):
    """Checkpoint slots from 20 on: row n names ceil(len / EVERY) + 1 slots (the last past its length)."""
    width = max(-(-n // EVERY) for n in lens) + 1
    rows, nxt = [], 20
    for length in lens:
        row = []
        for _ in range(-(-length // EVERY) + 1):
            row.append(nxt)
            nxt += 1
        rows.append(row + [-1] * (width - len(row)))
    return torch.tensor(rows, device=DEV)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_kernels_refuse_checkpoints_and_the_call_falls_back(family):
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    s = SHAPES[family]
    d = _inputs(family, LENS)
    read = torch.tensor([0, 1, 2, 3, -1], device=DEV)
    pool = torch.randn(P, s["HV"], s["V"], s["K"], device=DEV) * 0.5
    table = _table(LENS)
    p = pool.clone()
    fn(**d, state_pool=p, state_indices=read, checkpoint_every=EVERY, checkpoint_indices=table)
    dec = linattn.last_decision()
    verdicts = {v.backend: v for v in dec.verdicts}
    assert dec.chosen in ("torch-chunked", "torch-ref")
    for name in ("triton-split", "triton-folded"):
        assert not verdicts[name].ok and verdicts[name].reason == Reason.FEATURE, verdicts[name]
    assert "cutedsl" not in verdicts or not verdicts["cutedsl"].ok  # feature, or not installed here
    written = {0, 1, 3}
    for n, length in enumerate(LENS):
        if int(read[n]) < 0:
            continue
        for j, slot in enumerate(table[n].tolist()):  # the last one named is past the length: not written
            t = (j + 1) * EVERY
            if slot < 0 or t > length:
                continue
            written.add(slot)
            c0 = int(d["cu_seqlens"][n])
            cut = {x: d[x][c0:c0 + t] for x in ("q", "k", "v", "g", "beta")}
            stopped = pool.clone()
            fn(**cut, cu_seqlens=torch.tensor([0, t], dtype=torch.int32, device=DEV), state_pool=stopped,
               state_indices=read[n:n + 1], backend=dec.chosen)
            assert torch.equal(p[slot], stopped[int(read[n])]), (n, j)
            oracle = pool.double()  # the float64 token-serial reference (torch-ref on the GPU)
            fn(**{x: y.double() for x, y in cut.items()}, cu_seqlens=torch.tensor([0, t], dtype=torch.int32,
                                                                                 device=DEV),
               state_pool=oracle, state_indices=read[n:n + 1], backend="torch-ref")
            assert rel_error(p[slot], oracle[int(read[n])]) <= tolerances("bfloat16")[1], (n, j)
    rest = [i for i in range(P) if i not in written]
    assert torch.equal(p[rest], pool[rest])
