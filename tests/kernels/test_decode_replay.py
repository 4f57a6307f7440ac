"""A decode class's calls with a new N each (``decode.DecodeReplay``, issue 28): a new N of the same
tile class runs the class's launch on its own grid (``DecodeLaunch.with_rows``), with bitwise the
output and pool of a launch planned for that N; pool rows the call does not own stay unchanged.
Interpreter, small shapes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled, probe  # noqa: E402
from linattn.kernels.triton import decode as dm  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_enabled(), reason="runs kernels in the interpreter (TRITON_INTERPRET=1)")
H, HV, K, V = 1, 2, 16, 16


def _call(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    idx = torch.arange(n, dtype=torch.int32) * 2  # odd slots are not owned
    idx[1] = -1  # padding
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V), a=r(n, 1, HV), b=r(n, 1, HV), A_log=r(HV),
                dt_bias=r(HV), state_pool=r(2 * n, HV, V, K), state_indices=idx, scale=0.25)


def test_a_new_n_runs_the_class_launch_on_its_own_grid_with_the_bits_of_its_own_plan():
    caps = probe(torch.device("cpu"))
    replay = dm.DecodeReplay(gate="gdn", caps=caps, layout="split", **_call(3, seed=0))
    for n in (3, 5, 4):
        x = _call(n, seed=n)
        pool = x["state_pool"].clone()
        got = replay(dict(x, state_pool=pool))
        want_pool = x["state_pool"].clone()
        want = dm.DecodeLaunch(gate="gdn", caps=caps, layout="split", **dict(x, state_pool=want_pool))(
            dict(x, state_pool=want_pool))
        assert got.shape == (n, 1, HV, V) and torch.equal(got, want) and torch.equal(pool, want_pool)
        for slot in range(1, 2 * n, 2):  # not owned
            assert torch.equal(pool[slot], x["state_pool"][slot])
        assert not torch.equal(pool[0], x["state_pool"][0])
    assert sorted(replay.launches.keys()) == [4, 5]
    assert all(d.launch._compiled is replay.first.launch._compiled for d in replay.launches.values())


def test_a_new_n_of_another_tile_class_gets_a_launch_of_its_own(monkeypatch):
    """A tile configuration that differs by batch class (none does in ``PINNED`` today; one is made here)."""
    real = dm.decode_launch_config
    monkeypatch.setattr(dm, "decode_launch_config", lambda K, V, n, gate="gdn", state_dtype=torch.float32:
                        real(K, V, n, gate, state_dtype) if n < 16
                        else (real(K, V, n, gate, state_dtype)[0], dm.DecodeConfig(8, 1)))
    caps = probe(torch.device("cpu"))
    replay = dm.DecodeReplay(gate="gdn", caps=caps, layout="split", **_call(3, seed=0))
    assert replay.first.with_rows(16) is None
    x = _call(16, seed=1)
    pool = x["state_pool"].clone()
    got = replay(dict(x, state_pool=pool))
    want_pool = x["state_pool"].clone()
    want = dm.recurrent_decode(gate="gdn", caps=caps, layout="split", **dict(x, state_pool=want_pool))
    assert torch.equal(got, want) and torch.equal(pool, want_pool)
    assert replay.launches.get(16).constexprs["BV"] == 8 != replay.first.constexprs["BV"]
