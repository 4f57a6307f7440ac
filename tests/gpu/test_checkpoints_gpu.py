"""GPU tests of state checkpoints from prefill (``checkpoint_every`` / ``checkpoint_indices``, issue 32
item 1; docs/ops.md "State checkpoints") on the H200, at model head counts (GDN 16/32, KDA 32/32,
K = V = 128, bf16 inputs).

The Triton prefill writes the checkpoints in its state loop (``HAS_CKPT``: the pipeline's state
kernel, the fused walk). Each checkpoint is held bitwise to the same kernels stopped after that many
tokens (the pipeline or the fused prefill forced on both calls, so the chunk decomposition is
identical) and to the float64 token-serial reference within the bf16 state tolerance; outputs and
final states bitwise to the call without checkpoints (tests/ops/checkpoint_cases.py), the fused GDN
walk held to Triton's on every call (``LINATTN_CUTEDSL_WALK=0``: the CuTe DSL walk, SM90's default,
stores no checkpoints, so a call with them runs the Triton walk). The public op
picks a Triton backend for a call with checkpoints. The CuTe DSL prefill (its state kernel stores
them in its chunk loop) is held bitwise to its own prefill stopped there and to float64. The PyTorch fallbacks on CUDA (torch-chunked,
torch-ref) are held to the float64 reference within the same tolerance only: cuBLAS picks other
algorithms for other shapes, so a prefill stopped there need not agree bitwise (it did not, to 4-5
digits, on the H200). The FlashInfer peer (GDN; its non-CP kernel stores them into the named slots,
``checkpoint_state_indices``) is held bitwise to its own prefill stopped there and to float64;
skipped where flashinfer-python does not import. Every pool row a call does not own keeps its bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import linattn
from linattn.testing.execute import rel_error, tolerances

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from checkpoint_cases import check_triton_checkpoints, stopped_reference, written_checkpoints  # noqa: E402

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
LENS = [1000, 256, 0, 2048, 30]  # 256: a checkpoint at exactly the length
READ = [0, 1, 2, 3, -1]
EVERY = 256
P = 64
TOL = tolerances("bfloat16")[1]


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
    return rows


def _pool(family, dtype=torch.float32):
    s = SHAPES[family]
    gen = torch.Generator(device="cpu").manual_seed(1)
    return (torch.randn(P, s["HV"], s["V"], s["K"], generator=gen) * 0.5).to(dtype).to(DEV)


@pytest.mark.parametrize("fused", [False, True], ids=["pipeline", "fused"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
def test_triton_checkpoints_are_the_states_of_a_prefill_stopped_there(family, fused, pool_dtype, monkeypatch):
    """The Triton kernels (KDA's fused walk is opt-in: forced here), checkpoints every 256 tokens. The
    fused GDN walk is Triton's on every call (``LINATTN_CUTEDSL_WALK=0``): the CuTe DSL walk, the
    planner's default on SM90, stores no checkpoints, so a call with them runs the Triton walk and
    the bitwise claims are about that walk."""
    monkeypatch.setenv("LINATTN_CUTEDSL_WALK", "0")
    n = check_triton_checkpoints(family, _inputs(family, LENS), _pool(family, pool_dtype), READ, _table(LENS),
                                 EVERY, fused=fused, tol=tolerances("bfloat16", str(pool_dtype)[6:])[1])
    assert n == 12  # 1000: 3, 256: 1 (its length), 2048: 8; the empty one, padding, past a length: none


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_public_op_picks_triton_and_its_checkpoints_match_float64(family):
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    d, pool = _inputs(family, LENS), _pool(family)
    table = _table(LENS)
    p = pool.clone()
    fn(**d, state_pool=p, state_indices=torch.tensor(READ, device=DEV), checkpoint_every=EVERY,
       checkpoint_indices=torch.tensor(table, device=DEV))
    dec = linattn.last_decision()
    assert dec.chosen in ("triton-split", "triton-folded"), dec
    _held_to_float64(family, d, pool, p, table)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_cutedsl_checkpoints_are_the_states_of_a_prefill_stopped_there(family):
    """backend='cutedsl' (Triton stages 1 and 3 around the CuTe DSL state kernel, which stores the
    checkpoints): each bitwise the same backend stopped there (the same kernels per chunk), within TOL
    of float64; rows not owned unchanged."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed")
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    d, pool = _inputs(family, LENS), _pool(family)
    table = _table(LENS)
    idx = torch.tensor(READ, device=DEV)
    p = pool.clone()
    fn(**d, state_pool=p, state_indices=idx, checkpoint_every=EVERY, checkpoint_indices=torch.tensor(table, device=DEV),
       backend="cutedsl")
    assert linattn.last_decision().chosen == "cutedsl"
    for (n, j), slot in written_checkpoints(LENS, READ, table, EVERY).items():
        t, c0 = (j + 1) * EVERY, int(d["cu_seqlens"][n])
        stopped = pool.clone()
        fn(**{x: d[x][c0:c0 + t] for x in ("q", "k", "v", "g", "beta")},
           cu_seqlens=torch.tensor([0, t], dtype=torch.int32, device=DEV), state_pool=stopped,
           state_indices=idx[n:n + 1], backend="cutedsl")
        assert torch.equal(p[slot], stopped[READ[n]]), (n, j)
    _held_to_float64(family, d, pool, p, table)


@pytest.mark.parametrize("backend", ["torch-chunked", "torch-ref"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_the_torch_fallbacks_on_cuda_match_float64(family, backend):
    """Forced PyTorch backends on CUDA: each checkpoint against the float64 reference within the bf16
    state tolerance (not bitwise against a stopped prefill: cuBLAS algorithms vary with the shape)."""
    fn = linattn.kda_prefill if family == "kda" else linattn.gdn_prefill
    d, pool = _inputs(family, LENS), _pool(family)
    table = _table(LENS)
    p = pool.clone()
    fn(**d, state_pool=p, state_indices=torch.tensor(READ, device=DEV), checkpoint_every=EVERY,
       checkpoint_indices=torch.tensor(table, device=DEV), backend=backend)
    assert linattn.last_decision().chosen == backend
    _held_to_float64(family, d, pool, p, table)


def _held_to_float64(family, d, pool, p, table):
    """Each written checkpoint within TOL of the float64 reference stopped there; rows not owned unchanged."""
    marked = written_checkpoints(LENS, READ, table, EVERY)
    assert len(marked) == 12
    for (n, j), slot in marked.items():
        ref = stopped_reference(family, d, pool, n, (j + 1) * EVERY, READ[n])
        assert rel_error(p[slot], ref) <= TOL, (n, j, rel_error(p[slot], ref))
    owned = {s for s in READ if s >= 0} | set(marked.values())
    rest = [i for i in range(P) if i not in owned]
    assert torch.equal(p[rest], pool[rest])


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
def test_flashinfer_checkpoints_are_the_states_of_a_prefill_stopped_there(flashinfer_peer, pool_dtype):
    """backend='flashinfer' (GDN): FlashInfer 0.7.4's non-CP kernel stores the checkpoints into the
    named slots (checkpoint_state_indices). Each bitwise the same backend stopped there (a call of
    fewer than CP_MIN_TOKENS tokens: FlashInfer's non-CP kernel too), within the bf16 state tolerance
    of float64; rows not owned unchanged. GPU verification of the declaration."""
    d, pool = _inputs("gdn", LENS), _pool("gdn", pool_dtype)
    table = _table(LENS)
    idx = torch.tensor(READ, device=DEV)
    p = pool.clone()
    linattn.gdn_prefill(**d, state_pool=p, state_indices=idx, checkpoint_every=EVERY,
                        checkpoint_indices=torch.tensor(table, device=DEV), backend="flashinfer")
    assert linattn.last_decision().chosen == "flashinfer"
    marked = written_checkpoints(LENS, READ, table, EVERY)
    assert len(marked) == 12
    tol = tolerances("bfloat16", str(pool_dtype)[6:])[1]
    for (n, j), slot in marked.items():
        t, c0 = (j + 1) * EVERY, int(d["cu_seqlens"][n])
        stopped = pool.clone()
        linattn.gdn_prefill(**{x: d[x][c0:c0 + t] for x in ("q", "k", "v", "g", "beta")},
                            cu_seqlens=torch.tensor([0, t], dtype=torch.int32, device=DEV), state_pool=stopped,
                            state_indices=idx[n:n + 1], backend="flashinfer")
        assert torch.equal(p[slot], stopped[READ[n]]), (n, j)
        ref = stopped_reference("gdn", d, pool, n, t, READ[n])
        assert rel_error(p[slot], ref) <= tol, (n, j, rel_error(p[slot], ref))
    owned = {s for s in READ if s >= 0} | set(marked.values())
    rest = [i for i in range(P) if i not in owned]
    assert torch.equal(p[rest], pool[rest])
    # outputs and final states: those of the same call without checkpoints (both FlashInfer's non-CP kernel)
    q = pool.clone()
    o_plain = linattn.gdn_prefill(**d, state_pool=q, state_indices=idx, backend="flashinfer")
    o_ck = linattn.gdn_prefill(**d, state_pool=pool.clone(), state_indices=idx, checkpoint_every=EVERY,
                               checkpoint_indices=torch.tensor(table, device=DEV), backend="flashinfer")
    finals = [s for s in READ if s >= 0]
    assert torch.equal(o_plain, o_ck) and torch.equal(q[finals], p[finals])
