"""Every tensor argument of every Triton op as a strided view (field case F25, issue 15 item 1).

The arguments come from the validation layer's per-op table (``dispatch/rules/validate.py``:
``read_arguments`` and ``written_arguments``), not from a list here, so a new argument enters this
test by being added to the op. For each read-only argument present in an op's contract case, the
call through the public op with that argument replaced by a strided view holding the same values
(every stride doubled, last stride 2, storage offset 1) must give:

- bitwise the outputs and pool bits of the same call on contiguous copies, on every Triton layout;
- within the case's tolerance of the float64 reference (``torch-ref``);
- pool rows the call does not own bitwise unchanged.

Written buffers (``state_pool``, ``intermediate_states``) are never copied: a view with a larger
slot pitch must be honoured; a view whose state tiles are not dense is honoured by the backends that
declare strided state tiles (the chunked prefill) and rejected with reason ``layout`` by the others
(the decode), so the dispatcher falls back to ``torch-ref`` instead of writing wrong rows.

CPU: the Triton interpreter (small shapes). GPU: the same cases compiled (``pytest tests/contract``
on the H200).
"""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.dispatch.rules.validate import read_arguments, written_arguments
from linattn.dispatch.plugin.verdict import NoBackendError, Reason

from contract_cases import CASES, PREFILL_OPS, owned_rows

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OPS = ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill", "silu_and_mul_clamp")
#: the decode case with every optional tensor (slot table, accepted counts) and the one with an
#: intermediate buffer and its row indices
DECODE_CASE_IDS = ("T3-table-accepted", "T3-inter-view")


def _cases(op: str) -> list:
    if op in PREFILL_OPS or op == "silu_and_mul_clamp":
        return CASES[op][:1]
    return [c for c in CASES[op] if c.id.split("-", 1)[1] in DECODE_CASE_IDS]


def strided_view(x: torch.Tensor) -> torch.Tensor:
    """The values of ``x`` in a view whose strides are all doubled (last stride 2, offset 1)."""
    big = torch.zeros(*x.shape, 2, dtype=x.dtype, device=x.device)
    big[..., 1] = x
    view = big[..., 1]
    assert torch.equal(view, x) and (x.numel() <= 1 or not view.is_contiguous())
    return view


def _fresh(args: dict) -> dict:
    """Device copies: written buffers keep their strides (a fresh base), inputs are contiguous."""
    out = {}
    for name, x in args.items():
        if not isinstance(x, torch.Tensor):
            out[name] = x
        elif x._base is not None:
            base = x._base.to(DEVICE, copy=True)
            out[name] = base.as_strided(x.size(), x.stride(), x.storage_offset() - x._base.storage_offset())
        else:
            out[name] = x.to(DEVICE, copy=True)
    return out


def _run(op: str, args: dict, backend: str):
    res = getattr(linattn, op)(**args, backend=backend)
    o = res[0] if isinstance(res, tuple) else res
    written = {n: args[n].detach().cpu().clone() for n in written_arguments(op)
               if isinstance(args.get(n), torch.Tensor)}
    return o.cpu(), written


#: (op, case id, backend) -> the call's results on contiguous copies of the case's arguments. Every
#: argument of a case is held against the same contiguous call (and the same float64 reference), so
#: each is run once per module instead of once per argument (interpreter time; the runs are
#: deterministic: the tests below assert bitwise equality between two of them anyway).
_CONTIGUOUS: dict[tuple[str, str, str], tuple] = {}


def _contiguous(op: str, case, backend: str):
    """``_run`` of ``case`` on fresh contiguous copies, computed once per (op, case, backend).
    ``backend == "torch-ref"``: the float64 reference (floating arguments promoted)."""
    key = (op, case.id, backend)
    if key not in _CONTIGUOUS:
        if backend == "torch-ref":
            with torch.no_grad():
                _CONTIGUOUS[key] = _run(op, {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point()
                                                 else v) for k, v in _fresh(case.args).items()}, backend)
        else:
            _CONTIGUOUS[key] = _run(op, _fresh(case.args), backend)
    o, w = _CONTIGUOUS[key]
    return o.clone(), {n: t.clone() for n, t in w.items()}


def _params():
    for op in OPS:
        for case in _cases(op):
            for name in read_arguments(op):
                if isinstance(case.args.get(name), torch.Tensor) and case.args[name].numel() > 1:
                    yield pytest.param(op, case, name, id=f"{case.id}:{name}")


def _backends(op: str) -> tuple:
    # interpreter time (make test's budget): on the CPU the folded layout's launches are held bitwise equal to
    # the split layout's by tests/contract/test_contract.py (every launch of the contract cases, decode and
    # prefill); the strides are conformed by the launcher both layouts share. On a GPU both run.
    return ("triton-split",) if DEVICE == "cpu" else ("triton-split", "triton-folded")


@pytest.mark.parametrize("op,case,name,backend",
                         [pytest.param(*p.values, b, id=f"{p.id}:{b}") for p in _params() for b in _backends(p.values[0])])
def test_strided_input_equals_contiguous_and_reference(op, case, name, backend):
    base = _fresh(case.args)
    o_ref, w_ref = _contiguous(op, case, backend)
    args = dict(base)
    args[name] = strided_view(args[name])
    o, w = _run(op, args, backend)
    assert torch.equal(o, o_ref), f"{name} as a strided view changed the output of {op}"
    for buf in w_ref:
        assert torch.equal(w[buf], w_ref[buf]), f"{name} as a strided view changed {buf}"
    ref = _contiguous(op, case, "torch-ref")
    err = float((o.double() - ref[0]).norm() / ref[0].norm().clamp_min(1e-30))
    assert err <= case.tol_out, f"output {err:.2e} off float64"
    owned = owned_rows(case)
    if "state_pool" in owned:
        keep = ~owned["state_pool"]
        assert torch.equal(w["state_pool"][keep], case.args["state_pool"][keep]), "rows not owned changed"


def _buffer_views(buf: torch.Tensor):
    """(label, view, dense tiles?) holding buf's values: a larger leading pitch, and strided tiles."""
    pitched = torch.zeros(2 * buf.shape[0], *buf.shape[1:], dtype=buf.dtype)
    pitched[::2] = buf
    yield "pitch-2", pitched[::2], True
    yield "tile-stride-2", strided_view(buf), False


def _written_params():
    for op in ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill"):
        for case in _cases(op):
            for name in written_arguments(op):
                if isinstance(case.args.get(name), torch.Tensor):
                    for label in ("pitch-2", "tile-stride-2"):
                        yield pytest.param(op, case, name, label, id=f"{case.id}:{name}:{label}")


def _on_device(view: torch.Tensor):
    base = view._base.to(DEVICE, copy=True)
    return base, base.as_strided(view.size(), view.stride(), view.storage_offset() - view._base.storage_offset())


@pytest.mark.parametrize("op,case,name,label", list(_written_params()))
def test_strided_written_buffer_is_honoured_or_rejected_for_layout(op, case, name, label):
    view, dense = {lab: (v, d) for lab, v, d in _buffer_views(case.args[name])}[label]
    o_ref, w_ref = _contiguous(op, case, "triton-split")
    args = _fresh(case.args)
    base, args[name] = _on_device(view)
    before = base.cpu().clone()
    if dense or op in PREFILL_OPS:  # honoured: the same bits as the call on dense buffers
        o, w = _run(op, args, "triton-split")
        assert torch.equal(o, o_ref)
        for buf in w_ref:
            assert torch.equal(w[buf], w_ref[buf]), f"{buf} differs with {name} as a {label} view"
    else:  # decode reads dense tiles: rejected in the predicate, before anything is written
        with pytest.raises(NoBackendError) as info:
            getattr(linattn, op)(**args, backend="triton-split")
        assert info.value.decision.verdict("triton-split").reason == Reason.LAYOUT
        assert torch.equal(base.cpu(), before), "a refused call wrote the buffer"
        o = getattr(linattn, op)(**args)  # unforced: a backend that reads strided tiles runs it
        assert linattn.last_decision().chosen == "torch-chunked"
        assert torch.equal(torch.isfinite(o), torch.ones_like(o, dtype=torch.bool))
    # the base's entries outside the view never change
    pos = torch.arange(base.numel()).as_strided(view.size(), view.stride(),
                                                view.storage_offset() - view._base.storage_offset())
    outside = torch.ones(base.numel(), dtype=torch.bool)
    outside[pos.flatten()] = False
    assert torch.equal(base.cpu().flatten()[outside], before.flatten()[outside])
