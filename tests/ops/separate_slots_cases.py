"""Shared cases of separate read and write slots (``output_state_indices``, docs/ops.md "Separate
read and write slots") for the CPU tests and the GPU tests.

The oracle of every case is the same backend run in place: a pool whose write slots first hold a
copy of the read slots (zeros for a fresh sequence), called with ``state_indices =
output_state_indices``. The maths is identical, so outputs and written slots must be bitwise equal
to it; every other pool row, the read slots included, keeps the bits it had.
"""

from __future__ import annotations

import torch

import linattn

#: decode rows: rows 0 and 1 fork from one shared slot (1) into slots 4 and 6; row 2 reads and writes
#: slot 3 (in place); row 3 is padding; row 4 reads slot 0 and writes slot 2
DECODE_READ = [1, 1, 3, -1, 0]
DECODE_WRITE = [4, 6, 3, -1, 2]
#: prefill sequences (lengths below): a shared prefix slot 2 read by sequences 0 and 1 (1 is empty:
#: its final state is its initial state, copied to slot 5), an in-place sequence, padding, and a
#: fresh sequence whose read slot (7) is not read
PREFILL_LENS = [70, 0, 9, 4, 5]
PREFILL_READ = [2, 2, 3, -1, 7]
PREFILL_WRITE = [6, 5, 3, -1, 0]
P = 9


def written(write: list) -> list:
    return sorted(s for s in write if s >= 0)


def forked_pool(pool: torch.Tensor, read: list, write: list, fresh: list | None = None) -> torch.Tensor:
    """The in-place oracle's pool: a copy of ``pool`` with each write slot holding its read slot
    (left as it is where ``fresh`` marks the sequence as starting from zeros: it is not read)."""
    out = pool.clone()
    for n, (r, w) in enumerate(zip(read, write)):
        if r >= 0 and (fresh is None or not fresh[n]):
            out[w] = pool[r]
    return out


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bit patterns (NaN rows compare equal to themselves)."""
    return x.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def assert_untouched(before: torch.Tensor, after: torch.Tensor, write: list) -> None:
    """Every row not in ``write`` (the read slots included) keeps its exact bits."""
    rest = [i for i in range(before.shape[0]) if i not in set(write)]
    assert rest, "the case must leave rows that are not written"
    assert torch.equal(bits(after[rest]), bits(before[rest]))


def decode_fn(family: str):
    return linattn.kda_decode if family == "kda" else linattn.gdn_decode


def prefill_fn(family: str):
    return linattn.kda_prefill if family == "kda" else linattn.gdn_prefill


def decode_inputs(family: str, N: int, T: int, H: int, HV: int, K: int, V: int, dtype, device, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    kda = family == "kda"
    d = dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V),
             a=r(*((N, T, HV, K) if kda else (N, T, HV))), b=r(N, T, HV))
    d = {n: x.to(dtype) for n, x in d.items()}
    d.update(A_log=r(HV) * 0.5, dt_bias=r(*((HV, K) if kda else (HV,))) * 0.5)
    return {n: x.to(device) for n, x in d.items()}


def prefill_inputs(family: str, lens: list, H: int, HV: int, K: int, V: int, dtype, device, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    g = -(torch.rand((T, HV, K) if family == "kda" else (T, HV), generator=gen) * 0.3 + 0.01)
    d = dict(q=r(T, H, K).to(dtype), k=r(T, H, K).to(dtype), v=r(T, HV, V).to(dtype), g=g,
             beta=torch.rand(T, HV, generator=gen) * 0.9 + 0.05,
             cu_seqlens=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))
    return {n: x.to(device) for n, x in d.items()}


def run_decode(family, d, pool, read, write=None, **kw):
    idx = torch.tensor(read, dtype=torch.int32, device=pool.device)
    if write is not None:
        kw["output_state_indices"] = torch.tensor(write, dtype=torch.int64, device=pool.device)
    return decode_fn(family)(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], pool, idx, **kw)


def run_prefill(family, d, pool, read, write=None, **kw):
    kw["state_indices"] = torch.tensor(read, dtype=torch.int32, device=pool.device)
    if write is not None:
        kw["output_state_indices"] = torch.tensor(write, dtype=torch.int32, device=pool.device)
    return prefill_fn(family)(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], state_pool=pool, **kw)


def fork_pattern(N: int, P: int, seed: int = 0) -> tuple[list, list]:
    """``(read, write)`` slots for ``N`` sequences in a pool of ``P >= 2 N + 2`` slots: distinct write
    slots; about a quarter of the rows in place (read = write), an eighth padding (both -1), the
    rest reading one of a few shared prefix slots that nobody writes (forks)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(P, generator=gen).tolist()
    write, prefixes = perm[:N], perm[N:N + max(1, N // 4)]
    read = []
    for n in range(N):
        u = float(torch.rand((), generator=gen))
        if u < 0.125:
            read.append(-1)
            write[n] = -1
        elif u < 0.375:
            read.append(write[n])
        else:
            read.append(prefixes[int(torch.randint(len(prefixes), (), generator=gen))])
    if all(r < 0 for r in read):
        read[0], write[0] = prefixes[0], perm[0]
    return read, write


def _forked_rows(read: list, write: list, fresh: list | None) -> list:
    return [n for n, (r, w) in enumerate(zip(read, write)) if r >= 0 and r != w and not (fresh and fresh[n])]


def _check_against_oracle(run, family: str, backend: str, pool: torch.Tensor, d: dict, read: list, write: list,
                          fresh: list | None, state_layout: str) -> tuple[torch.Tensor, torch.Tensor, list]:
    """``run`` (run_decode or run_prefill) with separate slots equals the in-place oracle bitwise
    (outputs and written slots), on ``backend``; rows not written keep their bits. Returns the
    output, the pool after the call and the forked rows (at least one)."""
    kw = dict(backend=backend, state_layout=state_layout)
    if fresh is not None:
        kw["has_initial_state"] = torch.tensor([not f for f in fresh], device=pool.device)
    got_pool = pool.clone()
    o = run(family, d, got_pool, read, write, **kw)
    assert linattn.last_decision().chosen == backend
    want_pool = forked_pool(pool, read, write, fresh)
    o_want = run(family, d, want_pool, write, **kw)
    assert torch.equal(o, o_want)
    assert torch.equal(got_pool[written(write)], want_pool[written(write)])
    assert_untouched(pool, got_pool, write)
    forks = _forked_rows(read, write, fresh)
    assert forks, "the case must fork at least one row (sequence)"
    return o, got_pool, forks


def check_decode_fork(family: str, backend: str, pool: torch.Tensor, d: dict, *, fresh: list | None = None,
                      state_layout: str = "vk", read: list = DECODE_READ, write: list = DECODE_WRITE) -> None:
    """Decode with separate slots equals the in-place oracle bitwise; unwritten rows unchanged."""
    o, got_pool, forks = _check_against_oracle(run_decode, family, backend, pool, d, read, write, fresh, state_layout)
    for n in forks:  # the forked row was advanced, its source was not
        assert not torch.equal(got_pool[write[n]], pool[read[n]])
    for n in (n for n, r in enumerate(read) if r < 0):
        assert o[n].eq(0).all()  # padding: zero output


def check_prefill_fork(family: str, backend: str, pool: torch.Tensor, d: dict, *, fresh: list | None = None,
                       state_layout: str = "vk", read: list = PREFILL_READ, write: list = PREFILL_WRITE,
                       lens: list = PREFILL_LENS) -> None:
    """Prefill with separate slots equals the in-place oracle bitwise; unwritten rows unchanged."""
    _, got_pool, forks = _check_against_oracle(run_prefill, family, backend, pool, d, read, write, fresh,
                                               state_layout)
    for n in forks:  # an empty sequence: its initial state, copied; a longer one: advanced, its source not
        assert torch.equal(got_pool[write[n]], pool[read[n]]) == (lens[n] == 0)
