"""Decisions are cached per shape class (issue 28): no backend's rule reads more of the sizes than
its ``size_class`` says, so two problems of one class get the same verdict from every backend."""

import random

import pytest
import torch

import linattn
from linattn.capabilities import profile
from linattn.dispatch import Problem, dispatcher, get_registry
from linattn.dispatch.rules.ops_table import OP_TABLE, OPS
from linattn.dispatch.runtime.selection import shape_class

DEVICES = ("cpu", "sm90", "sm100", "mi300x", "xpu-pvc")


def _problem(op: str, n: int, t: int) -> Problem:
    if OP_TABLE[op].method == "clamp":
        return Problem(op=op, n=n, t=1, d=64)
    if OP_TABLE[op].phase == "prefill":
        return Problem(op=op, n=n, t=t, h=16, hv=32, k=128, v=128, max_seqlen=t)
    return Problem(op=op, n=n, t=1 + t % 4, h=16, hv=32, k=128, v=128)


def _verdicts(d) -> tuple:
    """What a verdict decides: per backend, ok or not, its reason codes and its rank."""
    return tuple((v.backend, v.ok, tuple(f.reason for f in getattr(v, "reasons", ()) or ()),
                  getattr(v, "rank", None)) for v in d.verdicts)


def _sizes(rng: random.Random) -> tuple[int, int]:
    # sizes around every threshold the built-ins and the example plugin read (tokens per sequence
    # 128 / 256 / 512 / 2,048; grid limits at 65,535 and 2**31 - 1 work items), log-uniform
    n = int(2 ** rng.uniform(0, 24))
    return n, max(n, int(n * 2 ** rng.uniform(-2, 13)))


@pytest.mark.parametrize("device", DEVICES)
def test_one_class_one_verdict_for_every_op_and_backend(device):
    rng = random.Random(device)
    caps, reg = profile(device), get_registry()
    for op in OPS:
        for backend in (None, "triton-split"):
            classes: dict = {}
            for _ in range(60):
                n, t = _sizes(rng)
                p = _problem(op, n, t)
                key = (shape_class(p, tuple(p.model_dump().items()), caps, reg), backend)
                got = _verdicts(dispatcher().explain(p, caps, backend=backend))
                first = classes.setdefault(key, (got, p))
                assert got == first[0], (f"{op} on {device}: {p.brief()} and {first[1].brief()} share a shape "
                                         f"class but not their verdicts")
            # a class holds many sizes: far fewer classes than problems
            assert len(classes) <= 12, (op, device, len(classes))


def test_the_class_drops_exact_sizes_but_keeps_a_rank_threshold():
    from linattn.backends.torch_chunked import SHORT

    caps, reg = profile("cpu"), get_registry()
    long_ = [_problem("gdn_prefill", 4, t) for t in (512, 700, 4096)]  # >= 128 tokens per sequence
    short = _problem("gdn_prefill", 4, 4 * SHORT["gdn"] - 4)  # under torch-chunked's threshold: torch-ref first
    keys = {shape_class(p, tuple(p.model_dump().items()), caps, reg) for p in long_}
    assert len(keys) == 1
    assert shape_class(short, tuple(short.model_dump().items()), caps, reg) not in keys
    assert dispatcher().explain(short, caps).chosen == "torch-ref"
    assert {dispatcher().explain(p, caps).chosen for p in long_} == {"torch-chunked"}


def test_a_new_length_reuses_the_class_decision_with_its_own_problem():
    linattn.dispatch.clear_cache()
    d = dispatcher()
    sigs = [tuple(_problem("gdn_prefill", 2, t).model_dump().items()) for t in (64, 80, 96)]
    decisions = [d.select("gdn_prefill", s, torch.device("cpu"))[1] for s in sigs]
    assert len(d.cached_decisions()) == 1  # one class: one decision kept
    assert [x.problem.t for x in decisions] == [64, 80, 96]  # each call's own problem
    assert len({x.chosen for x in decisions}) == 1
    assert linattn.last_decision("gdn_prefill").problem.t == 96
