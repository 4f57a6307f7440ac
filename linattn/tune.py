"""Measuring the backends of one shape bucket: what ``linattn tune`` (apps/tune.py) and selection's
``LINATTN_AUTOTUNE`` (:meth:`linattn.dispatch.runtime.selection.Dispatcher.autotune`) time, and how.

For a bucket (op, log2 tokens, log2 sequences, heads, head dims, dtypes) the bucket's
representative problem (:meth:`~linattn.dispatch.plugin.tuning.Bucket.problem`) gets random inputs on the
device, and every backend the dispatcher accepts for it (the policy's disabled backends excepted;
forcing ignored) is called through the public op with that backend forced (``backend=``,
``validate=False``), so its host cost (translation, gather / scatter of a pool-less peer) counts:
one warm-up call (compiles, runs a first-call self-check), then up to ``repeats`` calls timed one
by one (CUDA events around the call, after a device sync; ``perf_counter`` on the CPU), of which
the median is kept. A backend whose timed call is more than :data:`SLOW_FACTOR` times the fastest
one so far (the backends are timed in rank order) is kept at that one call: it cannot win. A
backend that raises is recorded under ``failed`` and not ranked. Outputs are not checked here (the
self-check and conformance suites do that).

The inputs and the timer are the ones ``linattn bench`` uses too (:func:`linattn.measure.decode_case`,
:func:`~linattn.measure.prefill_case`, :class:`~linattn.measure.Timer`): a library module, since the
library does not import its tools (``linattn.apps``).
"""

from __future__ import annotations

import functools
import statistics
from typing import Callable, Optional

import torch

import linattn
from linattn.dispatch.rules.ops_table import OP_TABLE
from linattn.dispatch.runtime.policy import Policy, current_policy
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.tuning import Bucket, Entry
from linattn.measure import Timer, decode_case, prefill_case

REPEATS = {"cuda": 25, "cpu": 5}
#: a backend whose timed call exceeds the fastest one's median by this factor is timed by that call only
SLOW_FACTOR = 20.0


def inputs(p: Problem, device: torch.device, seed: int = 0) -> dict:
    """Random keyword arguments of ``linattn.<p.op>`` for problem ``p`` in pool mode (layout vk).

    Decode: ``q, k [N, T, H, K]``, ``v [N, T, HV, V]``, ``a, b [N, T, HV]`` (KDA ``a [N, T, HV, K]``)
    in ``p.dtype``; ``A_log [HV]``, ``dt_bias [HV]`` (KDA ``[HV, K]``) fp32. Prefill: ``N``
    sequences of ``T // N`` tokens, ``q, k [T, H, K]``, ``v [T, HV, V]`` in ``p.dtype``, log-decays
    ``g [T, HV]`` (KDA ``[T, HV, K]``) and ``beta [T, HV]`` fp32, ``cu_seqlens [N + 1]`` int32. Both:
    ``state_pool [2N, HV, V, K]`` in ``p.state_dtype``, ``state_indices [N]`` int32 (distinct slots):
    ``linattn bench``'s inputs (:func:`linattn.measure.decode_case`, :func:`~linattn.measure.prefill_case`).
    """
    dt, sdt = getattr(torch, p.dtype), getattr(torch, p.state_dtype)
    shape, n = (p.h, p.hv, p.k, p.v), max(p.n, 1)
    if OP_TABLE[p.op].phase == "decode":
        return decode_case(p.op, n, shape, device, seed, t=p.t, dtype=dt, state_dtype=sdt).args
    return prefill_case(p.op, n, max(p.t // n, 1), shape, device, seed, dtype=dt, state_dtype=sdt).args


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, best_ms: Optional[float] = None) -> float:
    """Median milliseconds of ``fn``: one warm-up call, then ``repeats`` timed calls (one when the
    first is over :data:`SLOW_FACTOR` times ``best_ms``)."""
    once = Timer(device, flush=False).once  # CUDA events after a sync on CUDA, perf_counter elsewhere
    once(fn)
    times = [once(fn)]
    if best_ms is None or times[0] * 1e3 <= SLOW_FACTOR * best_ms:
        times += [once(fn) for _ in range(max(repeats, 1) - 1)]
    return statistics.median(times) * 1e3


def measure_bucket(bucket: Bucket, device, *, dispatch=None, repeats: Optional[int] = None) -> Entry:
    """Time every eligible backend on ``bucket``'s representative problem (module docstring).

    Args:
        bucket: what to measure. device: a torch device (or its string).
        dispatch: the dispatcher whose registry decides eligibility (default: the process's).
        repeats: timed calls per backend (default :data:`REPEATS` of the device type).
    Returns:
        Entry: median ms per backend that ran, the error of each that raised.
    """
    from linattn.dispatch.runtime.selection import dispatcher, resolve_device

    device = torch.device(device)
    disp = dispatch if dispatch is not None else dispatcher()
    p = bucket.problem()
    pol = Policy(disable=current_policy().disable)
    decision = disp.explain(p, resolve_device(device), policy=pol)
    eligible = sorted((v for v in decision.verdicts if v.ok), key=lambda v: (v.rank, v.backend))
    args = inputs(p, device)
    fn = getattr(linattn, p.op)
    times: dict[str, float] = {}
    failed: dict[str, str] = {}
    with torch.no_grad():
        for v in eligible:
            try:
                times[v.backend] = time_call(functools.partial(fn, **args, backend=v.backend, validate=False), device,
                                             repeats or REPEATS.get(device.type, 5), min(times.values(), default=None))
            except Exception as e:  # noqa: BLE001 - a backend that raises is recorded, not ranked
                failed[v.backend] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
    return Entry(bucket=bucket, shape=p.brief(), times_ms=times, failed=failed)
