"""F40: linattn's refusals cross process boundaries and compile boundaries as themselves.

The rules (docs/ops-decisions.md, "F40"):

- Every public exception class of linattn (found by walking its modules, so a new one is covered)
  pickles and unpickles to the same type, message, ``args`` and attributes; an exception whose
  ``__init__`` takes other arguments than its message defines ``__reduce__`` with them. A
  refusal raised in a ``ProcessPoolExecutor`` worker reaches the parent as itself, and the pool
  keeps working (it was ``BrokenProcessPool`` before).
- A grad-requiring input raises the same :class:`linattn.GradModeError` message in eager mode,
  under ``torch.compile`` and under ``torch.compile(fullgraph=True)`` (Dynamo reported an
  ``Unsupported`` ``super()`` call, or an observed exception, before), and nothing is written.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil

import pytest
import torch

import linattn
from linattn.dispatch import Problem

from fake_grid import assert_same_exception
from field_cases import HV, decode_inputs

PACKAGES = ("linattn", "linattn.dispatch", "linattn.backends", "linattn.kernels", "linattn.capabilities")


def public_exceptions() -> list:
    """Every exception class defined in a linattn module whose name does not start with ``_``.
    (``linattn.__main__`` runs the CLI when imported; modules whose optional dependencies are
    missing cannot define what is raised here.)"""
    found = {}
    for pkg in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            for obj in vars(module).values():
                if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("linattn")
                        and not obj.__name__.startswith("_")):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


EXCEPTIONS = public_exceptions()


def _no_backend_error() -> linattn.NoBackendError:
    try:
        linattn.gdn_gating(torch.zeros(HV), torch.zeros(3, HV), torch.zeros(3, HV), torch.zeros(HV),
                           backend="triton-split")
    except linattn.NoBackendError as e:
        return e
    raise AssertionError("triton-split has no gating: a forced call must be refused")


def _grad_mode_error() -> linattn.GradModeError:
    try:
        linattn.gdn_gating(torch.zeros(HV, requires_grad=True), torch.zeros(3, HV), torch.zeros(3, HV), torch.zeros(HV))
    except linattn.GradModeError as e:
        return e
    raise AssertionError("a grad-requiring A_log must be refused")


def _value_for(param: inspect.Parameter):
    ann = str(param.annotation)
    if "Decision" in ann:
        return linattn.explain(Problem(op="gdn_decode", n=1, h=1, hv=1, k=16, v=16), "cpu")
    if "list" in ann:
        return ["x"]
    if "int" in ann:
        return 3
    return f"{param.name} text"


def make_instance(cls) -> BaseException:
    """An instance of ``cls``: a real refusal for the dispatcher's errors, otherwise built from its
    constructor's annotations (a new exception with other parameters needs a line here)."""
    if cls is linattn.NoBackendError:
        return _no_backend_error()
    if cls is linattn.GradModeError:
        return _grad_mode_error()
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return cls("what was given, what is allowed, what to do")
    return cls(*[_value_for(p) for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD])


def test_the_enumeration_finds_the_dispatchers_refusals():
    names = {c.__name__ for c in EXCEPTIONS}
    assert {"NoBackendError", "GradModeError", "BackendRunError", "ResultError"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_public_exception_pickles_as_itself(cls):
    e = make_instance(cls)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        assert_same_exception(pickle.loads(pickle.dumps(e, protocol=protocol)), e)


def _refused_in_worker(kind: str) -> str:
    if kind == "grad":
        raise _grad_mode_error()
    if kind == "nobackend":
        raise _no_backend_error()
    return "ok"


def test_a_refusal_in_a_process_pool_worker_reaches_the_parent_as_itself():
    """One worker (fork: no fresh interpreter to start), two refusals, then a job that runs: the
    pool survives the refusals."""
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        grad = pool.submit(_refused_in_worker, "grad")
        nobackend = pool.submit(_refused_in_worker, "nobackend")
        fine = pool.submit(_refused_in_worker, "fine")
        with pytest.raises(linattn.GradModeError) as info:
            grad.result(timeout=60)
        assert_same_exception(info.value, _grad_mode_error())
        with pytest.raises(linattn.NoBackendError) as info:
            nobackend.result(timeout=60)
        assert str(info.value) == str(_no_backend_error()) and info.value.decision.chosen is None
        assert fine.result(timeout=60) == "ok"


# -- the same GradModeError in eager, compile and fullgraph ------------------------------------------

def _gating_discarding_output(A_log, a, b, dt_bias):
    linattn.gdn_gating(A_log, a, b, dt_bias)  # (g, beta) unused: the refusal must still run
    return dt_bias * 2


def _decode_discarding_output(q, k, v, a, b, A_log, dt_bias, pool, idx):
    linattn.gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, idx)  # o unused: only the pool write counts
    return pool.sum()


def _prefill(q, k, v, g, beta, cu):
    return linattn.gdn_prefill(q, k, v, g, beta, cu)


def _message(fn, args, mode: str) -> str:
    torch._dynamo.reset()
    run = fn if mode == "eager" else torch.compile(fn, backend="aot_eager", fullgraph=mode == "fullgraph")
    with pytest.raises(linattn.GradModeError) as info:
        run(*args)
    return str(info.value)


def _decode_args():
    d, pool = decode_inputs(N=2)
    d["A_log"].requires_grad_(True)
    idx = torch.tensor([3, -1], device=pool.device)  # decode_inputs puts everything on the GPU when there is one
    return (d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], pool, idx), pool


def test_grad_mode_error_is_the_same_in_eager_compile_and_fullgraph():
    gating = (torch.zeros(HV), torch.zeros(3, HV, requires_grad=True), torch.zeros(3, HV), torch.zeros(HV))
    msgs = {mode: _message(_gating_discarding_output, gating, mode) for mode in ("eager", "compile", "fullgraph")}
    assert len(set(msgs.values())) == 1 and "a requires grad" in msgs["eager"], msgs
    decode, pool = _decode_args()
    before = pool.clone()
    msgs = {mode: _message(_decode_discarding_output, decode, mode) for mode in ("eager", "compile", "fullgraph")}
    assert len(set(msgs.values())) == 1 and "A_log requires grad" in msgs["eager"], msgs
    assert torch.equal(pool, before)  # refused before any write, in every mode


def test_grad_mode_error_under_fullgraph_for_prefill_and_the_op_runs_without_grad():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 1, 16, generator=gen, requires_grad=True)
    args = (q, q.detach(), torch.randn(5, HV, 16, generator=gen), -torch.rand(5, HV, generator=gen),
            torch.rand(5, HV, generator=gen), torch.tensor([0, 2, 5]))
    assert _message(_prefill, args, "fullgraph") == _message(_prefill, args, "eager")
    torch._dynamo.reset()
    with torch.no_grad():
        o, final = torch.compile(_prefill, backend="aot_eager", fullgraph=True)(*args)
        want_o, want_final = _prefill(*args)
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(final, want_final)
