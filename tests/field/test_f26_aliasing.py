"""F26: pools whose slots overlap in memory, and written buffers overlapping the pool or an input,
are refused with a ``ValueError`` before launch; the memory stays bitwise unchanged.

The check is host-only (strides and address ranges, no device sync), in the validation layer
(``dispatch/rules/host_rules.py``, ``_written_buffers``), so it holds on every backend alike.
"""

from __future__ import annotations

import pytest
import torch

import linattn

from field_cases import DEVICE, HV, decode_inputs, prefill_inputs

K = V = 16


def _half_pitch_pool(P: int = 6):
    """An ``as_strided`` pool whose slot pitch is half a slot: slot s+1 starts inside slot s."""
    base = torch.randn(P * HV * V * K, device=DEVICE)
    pool = base.as_strided((P, HV, V, K), (HV * V * K // 2, V * K, K, 1))
    return base, pool


def _decode(pool, idx, **extra):
    args, _ = decode_inputs()
    return linattn.gdn_decode(**args, state_pool=pool, state_indices=idx, **extra)


def test_pool_with_overlapping_slots_is_refused_before_launch():
    base, pool = _half_pitch_pool()
    before = base.clone()
    with pytest.raises(ValueError, match="state_pool is written in place but has a pitch smaller"):
        _decode(pool, torch.tensor([0, 1, -1, 2], device=DEVICE))
    assert torch.equal(base, before)


def test_pool_with_overlapping_heads_is_refused_in_prefill():
    base = torch.randn(6 * HV * 64 * 64, device=DEVICE)
    pool = base.as_strided((6, HV, 64, 64), (HV * 64 * 64, 64 * 64 // 2, 64, 1))
    before = base.clone()
    args, _ = prefill_inputs()
    with pytest.raises(ValueError, match="state_pool is written in place"):
        linattn.gdn_prefill(**args, state_pool=pool, state_indices=torch.tensor([0, 1, 2, 3], device=DEVICE))
    assert torch.equal(base, before)


def test_intermediate_states_overlapping_the_pool_is_refused():
    P, T = 6, 2
    base = torch.randn(P + 4 * T, HV, V, K, device=DEVICE)
    pool = base[:P]
    inter = base[P - 1:P - 1 + 4 * T].view(4, T, HV, V, K)  # its first row is the pool's last slot
    before = base.clone()
    args, _ = decode_inputs(T=T)
    with pytest.raises(ValueError, match="intermediate_states .* overlaps state_pool|state_pool .* overlaps intermediate"):
        linattn.gdn_decode(**args, state_pool=pool, state_indices=torch.tensor([0, 1, -1, 2], device=DEVICE),
                           intermediate_states=inter,
                           intermediate_state_indices=torch.tensor([0, 1, -1, 2], device=DEVICE))
    assert torch.equal(base, before)


def test_input_inside_the_pool_is_refused():
    pool = torch.randn(9, HV, V, K, device=DEVICE)
    before = pool.clone()
    args, _ = decode_inputs()
    args["v"] = pool[8, 0, :4].reshape(4, 1, 1, K).expand(4, 1, HV, K)  # v read from slot 8's memory
    with pytest.raises(ValueError, match="state_pool .* overlaps v"):
        linattn.gdn_decode(**args, state_pool=pool, state_indices=torch.tensor([0, 1, -1, 2], device=DEVICE))
    assert torch.equal(pool, before)


def test_disjoint_views_of_one_allocation_are_accepted():
    """A pool sliced from a larger buffer (a slot pitch above one slot) and an intermediate buffer
    from another part of the same allocation are legal: nothing overlaps."""
    P, T = 6, 2
    big = torch.zeros(2 * P + 4 * T, HV, V, K, device=DEVICE)
    pool = big[: 2 * P : 2]
    inter = big[2 * P:].view(4, T, HV, V, K)
    args, _ = decode_inputs(T=T)
    before = big.clone()
    linattn.gdn_decode(**args, state_pool=pool, state_indices=torch.tensor([0, 1, -1, 2], device=DEVICE),
                       intermediate_states=inter, intermediate_state_indices=torch.tensor([0, 1, -1, 2], device=DEVICE))
    # the odd slots between the pool's rows, and the pool's unnamed rows 3..5, keep their bits
    assert torch.equal(big[1: 2 * P: 2], before[1: 2 * P: 2])
    assert torch.equal(pool[3:], before[6: 2 * P: 2])
    assert not torch.equal(pool[:3], before[0:6:2])


def test_read_only_pool_may_alias_itself_in_verify_only_decode():
    """With ``disable_state_update=True`` the pool is only read: a self-overlapping pool is legal."""
    base, pool = _half_pitch_pool()
    before = base.clone()
    o = _decode(pool, torch.tensor([0, 1, -1, 2], device=DEVICE), disable_state_update=True)
    assert torch.isfinite(o).all()
    assert torch.equal(base, before)


def test_interleaved_pool_and_intermediate_rows_of_one_allocation_are_accepted():
    """Pool slots and intermediate rows interleaved in one raw buffer (each pitch holds one pool slot
    and then one intermediate row, as an engine carving several caches out of one allocation): the
    address ranges meet but no element is shared, so the call runs and writes only what it names."""
    P, T = 4, 2
    slot, row = HV * V * K, T * HV * V * K
    pitch = slot + row
    raw = torch.randn(P * pitch, device=DEVICE)
    pool = raw.as_strided((P, HV, V, K), (pitch, V * K, K, 1), 0)
    inter = raw.as_strided((P, T, HV, V, K), (pitch, HV * V * K, V * K, K, 1), slot)
    before = raw.clone()
    args, _ = decode_inputs(T=T)
    idx = torch.tensor([0, 1, -1, 2], device=DEVICE)
    linattn.gdn_decode(**args, state_pool=pool, state_indices=idx, intermediate_states=inter,
                       intermediate_state_indices=torch.tensor([3, 0, -1, 1], device=DEVICE))
    assert torch.equal(pool[3], before.as_strided((HV, V, K), (V * K, K, 1), 3 * pitch))  # slot 3 not named
    assert torch.equal(inter[2], before.as_strided((T, HV, V, K), (HV * V * K, V * K, K, 1), 2 * pitch + slot))
    assert not torch.equal(pool[0], before.as_strided((HV, V, K), (V * K, K, 1), 0))


def test_interleaved_disjoint_proves_only_real_disjointness():
    from linattn.dispatch.rules.layouts import interleaved_disjoint

    buf = torch.zeros(8, HV, V, K)
    assert interleaved_disjoint(buf[0::2], buf[1::2])
    assert not interleaved_disjoint(buf[0::2], buf[0::2])
    half = buf.view(-1).as_strided((4, HV, V, K), (2 * HV * V * K, V * K, K, 1), HV * V * K // 2)
    assert not interleaved_disjoint(buf[0::2], half)  # starts inside the even slots' blocks
    assert not interleaved_disjoint(buf[0::2], buf[1:5])  # another pitch: not proven
