"""The properties, as functions of a built problem and a backend (shared by the CPU and GPU tests).

Valid problems (:func:`check_decode`, :func:`check_prefill`):

1. the call runs (or the forced backend declines it in its predicates with reason ``layout``, for a
   written buffer whose state tiles are not dense and an op the backend does not declare in
   ``strided_state_ops``; nothing may be written then);
2. every element of every written buffer's *whole allocation* outside the rows the call owns keeps
   its bits (foreign slots, padding rows' slots, zero-length sequences' slots, the junk around a
   view);
3. padding rows' outputs are exactly zero, all outputs finite;
4. outputs and written rows match the float64 oracle (``fuzz_oracle``) within ops.md's tolerances
   (fp32: 1e-5; bf16 inputs or a bf16 state: 2e-2 on outputs, 1e-2 on states);
5. a call with the same values in contiguous tensors gives the same bits (views are read through
   their strides, or copied, never misread);
6. prefill: pool mode and dense mode give the same bits (ops.md), and a dense final state keeps the
   initial state's dtype and, for an empty sequence, its bits.

Invalid problems (:func:`check_refused`): a ``ValueError`` / ``TypeError`` / ``NoBackendError``
before anything is written: every written buffer and every input keeps its bits.
"""

from __future__ import annotations

from typing import Optional

import torch

import fuzz_oracle as oracle
from fuzz_strategies import Built
from fuzz_support import (bits, bits_equal, call_op, dense_copy, heal_plugin, rejection_reason, rel,
                          twin_equal)


def tolerances(dtype: torch.dtype, state_dtypes) -> tuple[float, float]:
    """(outputs, states): ops.md's 1e-5 for fp32 everything, else 2e-2 / 1e-2."""
    if dtype == torch.float32 and all(d in (None, torch.float32) for d in state_dtypes):
        return 1e-5, 1e-5
    return 2e-2, 1e-2


def _positions(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """For every element of ``view``, its flat index in ``base`` (a contiguous buffer)."""
    pos = torch.arange(base.numel(), device=base.device).view(base.shape)
    return pos.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset())


def _strided_state_ops(backend: Optional[str]) -> frozenset:
    from linattn.dispatch.runtime.registry import get_registry

    impl = get_registry().backends.get(backend) if backend else None
    return frozenset(getattr(impl, "strided_state_ops", frozenset())) if impl is not None else frozenset()


def _untouched(b: Built, before: dict, owned: dict) -> None:
    """Every element of each written allocation outside ``owned[name]`` (row keys) keeps its bits."""
    for name, base in b.bases.items():
        view = b.written[name]
        mask = torch.zeros(base.numel(), dtype=torch.bool, device=base.device)
        if owned.get(name):
            pos = _positions(view, base)
            for key in owned[name]:
                mask[pos[key].reshape(-1)] = True
        now, was = bits(base).reshape(-1), bits(before[name]).reshape(-1)
        changed = (now != was) & ~mask
        if bool(changed.any()):
            first = int(changed.nonzero()[0])
            pos = _positions(view, base).reshape(view.shape[0], -1) if view.numel() else None
            row = None
            if pos is not None:
                hit = (pos == first).any(dim=1).nonzero()
                row = int(hit[0]) if hit.numel() else "outside the view (junk around it)"
            raise AssertionError(f"{name}: {int(changed.sum())} element(s) the call does not own changed "
                                 f"(first at flat index {first} of the allocation, row {row}; owned rows: "
                                 f"{sorted(owned.get(name, ()))})")


#: Rejections that say the machine lacks something (not the problem): the property is skipped.
ENVIRONMENT_REASONS = ("toolchain", "arch", "device", "disabled", "plugin_load_failed", "api_version")


def _features_used(b: Built) -> set:
    used = set()
    if b.kwargs.get("g") is not None and b.op.endswith("decode"):
        used.add("precomputed_gates")
    if b.kwargs.get("has_initial_state") is not None:
        used.add("has_initial_state")
    return used


def _declared_features(backend: Optional[str], op: str) -> frozenset:
    from linattn.dispatch.runtime.registry import get_registry

    impl = get_registry().backends.get(backend) if backend else None
    if impl is None:
        return frozenset()
    fn = getattr(impl, "declared_features", None)
    return frozenset(fn(op) if callable(fn) else getattr(impl, "features", frozenset()))


def _declined(b: Built, backend, out, before) -> bool:
    """A forced backend may decline a valid problem only in its layout predicate, for non-dense state
    tiles of an op it does not declare as reading strided tiles, or in its feature predicate, for a
    second-release keyword it does not declare; nothing written then."""
    reason = rejection_reason(out.error, backend)
    if reason in ENVIRONMENT_REASONS:
        import pytest

        pytest.skip(f"{backend} is not available here ({reason}): {str(out.error).splitlines()[0][:200]}")
    layout_ok = reason == "layout" and not b.tiles_dense and b.op not in _strided_state_ops(backend)
    feature_ok = reason == "feature" and bool(_features_used(b) - _declared_features(backend, b.op))
    if layout_ok or feature_ok:
        for name, base in b.bases.items():
            assert bits_equal(base, before[name]), f"{name} changed although the call was refused"
        return True
    return False


def _run(b: Built, backend, kwargs=None):
    try:
        return call_op(b.op, b.kwargs if kwargs is None else kwargs, backend)
    except Exception:
        heal_plugin(backend)
        raise


def _stack(rows: dict, keys) -> torch.Tensor:
    return torch.stack([rows[k] for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)


def _check_rows(name: str, actual: torch.Tensor, expected: dict, tol: float) -> None:
    keys = sorted(expected)
    if not keys:
        return
    got = torch.stack([actual[k] for k in keys]).detach().double().cpu()
    ref = _stack(expected, keys)
    assert torch.isfinite(got).all(), f"{name}: non-finite values in rows {keys}"
    r = rel(got, ref)
    assert r <= tol, f"{name}: rows {keys} differ from the float64 oracle by {r:.3g} (tolerance {tol:g})"


def check_decode(b: Built, backend: Optional[str], *, twin: bool = True) -> str:
    """All properties of a valid decode problem; returns ``"passed"`` or ``"declined"``."""
    kw = b.kwargs
    q, v, pool = kw["q"], kw["v"], kw["state_pool"]
    inter = kw.get("intermediate_states")
    N, T, HV, V = q.shape[0], q.shape[1], v.shape[2], v.shape[3]
    exp = oracle.decode(b.op, **kw)  # before the call: it reads the pool
    before = {n: x.clone() for n, x in b.bases.items()}
    twin_kw = {k: dense_copy(x) for k, x in kw.items()} if twin and b.has_views else None
    out = _run(b, backend)
    if not out.ran:
        if _declined(b, backend, out, before):
            return "declined"
        raise AssertionError(f"a valid decode problem was refused by {backend}: {out.describe()}")
    o = out.value
    assert tuple(o.shape) == (N, T, HV, V) and o.dtype == q.dtype, f"o: {tuple(o.shape)} {o.dtype}"
    owned = {"state_pool": set(exp.pool_rows), "intermediate_states": set(exp.inter_rows)}
    _untouched(b, before, owned)
    live = exp.live_out.to(o.device)
    if bool((~live).any()):
        assert bool((o[~live] == 0).all()), "padding rows' outputs are not zero"
    assert bool(torch.isfinite(o).all()), "non-finite outputs"
    tol_o, tol_s = tolerances(q.dtype, [pool.dtype, inter.dtype if inter is not None else None])
    r = rel(o[live], exp.o[exp.live_out])
    assert r <= tol_o, f"o differs from the float64 oracle by {r:.3g} (tolerance {tol_o:g})"
    _check_rows("state_pool", pool, exp.pool_rows, tol_s)
    if inter is not None:
        _check_rows("intermediate_states", inter, exp.inter_rows, tol_s)
    if twin_kw is not None:
        o2 = _run(b, backend, twin_kw)
        assert o2.ran, f"the contiguous twin was refused: {o2.describe()}"
        assert twin_equal(o2.value, o, tol_o), "views and their contiguous copies give different outputs"
        assert twin_equal(twin_kw["state_pool"], pool.contiguous(), tol_s), \
            "views and their contiguous copies leave different pools"
        if inter is not None:
            assert twin_equal(twin_kw["intermediate_states"], inter.contiguous(), tol_s), \
                "views and their contiguous copies leave different intermediate states"
    return "passed"


def check_prefill(b: Built, backend: Optional[str], *, twin: bool = True, dense_twin: bool = True) -> str:
    """All properties of a valid prefill problem (pool or dense mode)."""
    kw = b.kwargs
    q, v, pool, h0 = kw["q"], kw["v"], kw["state_pool"], kw["initial_state"]
    cu = [int(c) for c in kw["cu_seqlens"].tolist()]
    N, T, HV, V = len(cu) - 1, q.shape[0], v.shape[1], v.shape[2]
    exp = oracle.prefill(b.op, **kw)
    before = {n: x.clone() for n, x in b.bases.items()}
    twin_kw = {k: dense_copy(x) for k, x in kw.items()} if twin and b.has_views else None
    h0_from_pool = None
    if pool is not None and dense_twin:
        slots = [int(s) for s in kw["state_indices"].tolist()]
        his = kw.get("has_initial_state")
        carry = [True] * N if his is None else [bool(x) for x in his.tolist()]
        h0_from_pool = torch.stack([pool[s] if s >= 0 and c else torch.zeros_like(pool[0])
                                    for s, c in zip(slots, carry)]) \
            if N else pool.new_zeros((0, *pool.shape[1:]))
    out = _run(b, backend)
    if not out.ran:
        if _declined(b, backend, out, before):
            return "declined"
        raise AssertionError(f"a valid prefill problem was refused by {backend}: {out.describe()}")
    if pool is not None:
        o, final = out.value, None
    else:
        o, final = out.value
    assert tuple(o.shape) == (T, HV, V) and o.dtype == q.dtype, f"o: {tuple(o.shape)} {o.dtype}"
    _untouched(b, before, {"state_pool": set(exp.pool_rows)})
    live = exp.live_out.to(o.device)
    if bool((~live).any()):
        assert bool((o[~live] == 0).all()), "padding sequences' outputs are not zero"
    assert bool(torch.isfinite(o).all()), "non-finite outputs"
    sdt = pool.dtype if pool is not None else (h0.dtype if h0 is not None else torch.float32)
    tol_o, tol_s = tolerances(q.dtype, [sdt])
    r = rel(o[live], exp.o[exp.live_out])
    assert r <= tol_o, f"o differs from the float64 oracle by {r:.3g} (tolerance {tol_o:g})"
    if pool is not None:
        _check_rows("state_pool", pool, exp.pool_rows, tol_s)
    else:
        shape = tuple(exp.final.shape)
        assert tuple(final.shape) == shape, f"final state shape {tuple(final.shape)}, expected {shape}"
        assert final.dtype == sdt, f"final state dtype {final.dtype}, expected {sdt}"
        for n in range(N):
            if cu[n + 1] == cu[n]:
                want = h0[n] if h0 is not None else torch.zeros_like(final[n])
                assert bits_equal(final[n].contiguous(), want.contiguous()), \
                    f"empty sequence {n}: final state is not its initial state"
        assert bool(torch.isfinite(final).all()), "non-finite final states"
        r = rel(final, exp.final)
        assert r <= tol_s, f"final states differ from the float64 oracle by {r:.3g} (tolerance {tol_s:g})"
    if twin_kw is not None:
        o2 = _run(b, backend, twin_kw)
        assert o2.ran, f"the contiguous twin was refused: {o2.describe()}"
        if pool is not None:
            assert twin_equal(o2.value, o, tol_o), "views and their contiguous copies give different outputs"
            assert twin_equal(twin_kw["state_pool"], pool.contiguous(), tol_s), \
                "views and their contiguous copies leave different pools"
        else:
            assert twin_equal(o2.value[0], o, tol_o), "views and their contiguous copies give different outputs"
            assert twin_equal(o2.value[1], final, tol_s), "views and their contiguous copies give different final states"
    if h0_from_pool is not None:
        dkw = dict(kw, state_pool=None, state_indices=None, initial_state=h0_from_pool)
        dkw.pop("has_initial_state", None)
        od = _run(b, backend, dkw)
        assert od.ran, f"dense mode was refused where pool mode ran: {od.describe()}"
        o_d, fin_d = od.value
        assert bits_equal(o_d[live], o[live]), "pool mode and dense mode give different outputs"
        for n, s in enumerate(int(x) for x in kw["state_indices"].tolist()):
            if s >= 0 and cu[n + 1] > cu[n]:
                assert bits_equal(fin_d[n].contiguous(), pool[s].contiguous()), \
                    f"sequence {n}: pool mode's slot {s} and dense mode's final state differ"
    return "passed"


# -- refusals ---------------------------------------------------------------------------------------

def snapshot(kwargs: dict) -> dict:
    """Bit copies of every tensor argument's whole allocation (inputs included)."""
    out = {}
    for name, x in kwargs.items():
        if isinstance(x, torch.Tensor):
            base = x._base if x._base is not None else x
            out[name] = (base, base.detach().clone())
    return out


def check_refused(op: str, kwargs: dict, backend: Optional[str], allowed: tuple, **extra) -> str:
    """The call must raise one of ``allowed`` before writing anything (inputs unchanged too)."""
    snap = snapshot(kwargs)
    try:
        out = call_op(op, kwargs, backend, **extra)
    except Exception as e:  # a crash instead of a refusal
        heal_plugin(backend)
        raise AssertionError(f"expected a refusal ({', '.join(a.__name__ for a in allowed)}), the call raised "
                             f"{type(e).__name__}: {str(e)[:300]}") from e
    if out.ran:
        raise AssertionError(f"an invalid input was accepted and ran (expected "
                             f"{', '.join(a.__name__ for a in allowed)})")
    assert isinstance(out.error, allowed), \
        f"refused with {type(out.error).__name__} ({out.describe()}), expected one of " \
        f"{', '.join(a.__name__ for a in allowed)}"
    for name, (base, was) in snap.items():
        with torch.no_grad():
            assert bits_equal(base.detach(), was), f"{name} changed although the call was refused"
    return "refused"
