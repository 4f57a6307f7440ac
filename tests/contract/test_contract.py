"""The program-id contract of every Triton kernel, for every launch layout.

For each kernel in ``kernels/triton/registry.py`` and each of its layouts, on the same inputs:

1. the launch the launcher makes is recorded, and the probe kernel (same ``decode_pid`` helper,
   same grid, same constexprs) proves that every work item is visited exactly once;
2. outputs and written states are bitwise equal across layouts (planned for one device, each layout
   with its own grid limits only: ``layout_caps.py``);
3. both are within ops.md's tolerance of the float64 reference (``backends/torch_ref.py``);
4. pool rows and intermediate entries the call does not own are bitwise unchanged.

Kernels outside the planner (``layouts=()``, the chunked prefill's tables, intra and output stages) run
inside the launcher of their op's planned kernel: they are checked to launch once per call with
the same grid in every layout, and their results are covered by points 2-4.

CPU: the Triton interpreter at small shapes. GPU: the same cases compiled (``pytest tests/contract``
on the H200); real shapes are in ``tests/gpu/test_decode_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from linattn.capabilities import GridLimits, profile
from linattn.kernels.grid import GridPlan
from linattn.testing.compare import rel_error_exact_zero as _rel

from contract_cases import CASES, PREFILL_OPS, Case, owned_rows, run_launcher, run_reference
from layout_caps import device_caps, layout_caps

registry = pytest.importorskip("linattn.kernels.triton.registry")
_launch_mod = pytest.importorskip("linattn.kernels.triton.launch")

PLANNED = [e for e in registry.KERNELS if e.layouts and e.op != "probe"]
#: Unplanned kernels, by the ops whose launcher runs them (the chunked prefill's tables, stages 1 and 3).
#: Kernels the dispatcher or a backend launches, not an op's launcher (so no contract case runs them),
#: each with the test that holds it to its oracle.
DISPATCHER_KERNELS = {"decode_value_flags": "tests/dispatch/test_fused_value_checks.py (against the torch value rules)",
                      "prefill_value_flags": "tests/dispatch/test_fused_value_checks.py (against the torch value rules)",
                      "fork_slots": "tests/ops/test_separate_slots.py (bitwise against the in-place call on a copy)"}
UNPLANNED = {e.load_kernel(): e for e in registry.KERNELS if not e.layouts and e.name not in DISPATCHER_KERNELS}
UNPLANNED_OPS = {"chunk_tables": PREFILL_OPS, "chunk_intra": PREFILL_OPS, "chunk_output": PREFILL_OPS,
                 "chunk_kda_system": ("kda_prefill",),
                 "chunk_output_grouped": ("gdn_prefill",), "chunk_gdn_gates": ("gdn_prefill",),
                 "segment_tables": PREFILL_OPS, "chunk_gdn_fused_prep": ("gdn_prefill",),
                 "chunk_kda_fused_prep": ("kda_prefill",)}
#: Planned kernels that only the segment-parallel state pass launches (both prefill ops'
#: segmented cases run them: ``launch={"segment_chunks": L}``)
SEGMENT_KERNELS = {"prefill_segment_combine"}
#: Planned kernels that only the fused prefill launches (its cases: ``launch={"fused": True}``), and the
#: unplanned kernels it launches besides them
FUSED_KERNELS = {"gdn_prefill_fused", "kda_prefill_fused"}
FUSED_UNPLANNED = {"chunk_tables", "chunk_gdn_fused_prep", "chunk_kda_fused_prep"}


def _fused(case: Case) -> bool:
    return bool(case.launch.get("fused"))


def _segmented(case: Case) -> bool:
    return bool(case.launch.get("segment_chunks"))


def _cases_of(e) -> list:
    if e.name in SEGMENT_KERNELS:
        return [c for op in PREFILL_OPS for c in CASES[op] if _segmented(c)]
    return [c for c in CASES.get(e.op, []) if c.op == e.op and _fused(c) == (e.name in FUSED_KERNELS)]


PARAMS = [pytest.param(e, c, id=f"{e.name}:{c.id}") for e in PLANNED for c in _cases_of(e)]


class Recorder:
    """Records each launch of a jit kernel (grid and constexprs) and runs it."""

    def __init__(self, kernel, monkeypatch, planned: bool = True):
        self.launches = []
        orig = kernel.run
        keys = ("LAYOUT", "AX_SEQ", "AX_HEAD", "AX_BLK") if planned else ()

        def run(*args, grid, warmup, **kwargs):
            self.launches.append((tuple(grid), {k: kwargs[k] for k in keys}, kwargs))
            return orig(*args, grid=grid, warmup=warmup, **kwargs)

        monkeypatch.setattr(kernel, "run", run)
        # The fast launch path calls a compiled kernel of the same specialization directly, past
        # kernel.run (issue 28: one compiled kernel serves every int of a class), so a recorded case
        # would miss launches that an earlier case compiled: every launch goes through kernel.run here.
        monkeypatch.setattr(_launch_mod, "_status", (False, "contract test: launches recorded through kernel.run"))


def _work_counts(case: Case, launch_kwargs: dict) -> tuple[int, int, int]:
    if case.op == "silu_and_mul_clamp":
        M, D2 = case.args["x"].shape
        return M, 1, -(-(D2 // 2) // launch_kwargs["BD"])
    if case.op in PREFILL_OPS:  # q is [T, H, K]: the sequences are cu_seqlens' intervals
        N, HV, V = case.args["cu_seqlens"].numel() - 1, case.args["v"].shape[1], case.args["v"].shape[2]
        segment = launch_kwargs.get("SEGMENT", 0)
        if segment:  # the state kernel on the segments: NT_max // L + N of them; the summary on V + K columns
            T, K = case.args["q"].shape[0], case.args["q"].shape[2]
            L = case.launch["segment_chunks"]
            L += L % 2 if _prefill_plan(case)[1].every_second_state else 0  # as prefill.plan_segments rounds it
            N = (T // 64 + N) // L + N
            V += K if segment == 1 else 0
        return N, HV, -(-V // launch_kwargs["BV"])
    N, HV, V = case.args["q"].shape[0], case.args["v"].shape[2], case.args["v"].shape[3]
    return N, HV, -(-V // launch_kwargs["BV"])


def _prefill_plan(case: Case):
    """The case's pinned prefill configuration and the stage options the launcher resolves from it
    (``prefill.prefill_config``, ``prefill.stage_options``)."""
    from linattn.kernels.triton.prefill import prefill_config, stage_options

    q, v = case.args["q"], case.args["v"]
    family = case.op.split("_")[0]
    cfg = prefill_config(family, q.shape[2], v.shape[2], q.dtype)
    return cfg, stage_options(family, v.shape[1] // q.shape[1], cfg)


def _output_kernel(case: Case) -> str | None:
    """The registry name of the prefill's output kernel (stage 3) for the case: None where the
    state kernel writes the output itself (pinned ``state.writes_output``: KDA on the bf16 path at
    K <= 128), ``chunk_output_grouped`` for GDN where the pinned ``output.grouped_at`` holds the case's
    GVA group size (bf16, GROUP = 2), else ``chunk_output``."""
    cfg, opt = _prefill_plan(case)
    if cfg.state.writes_output:
        return None
    return "chunk_output_grouped" if opt.grouped_output else "chunk_output"


def _gdn_hoist(case: Case) -> bool:
    """Whether the case's GDN prefill forms the state loop's gate factors in their own launch
    (``chunk_gdn_gates``: pinned ``gdn.gates_kernel``, GDN's bf16 path)."""
    return _prefill_plan(case)[1].gates_kernel


def _run_all_layouts(entry, case, device, monkeypatch):
    from linattn.kernels.triton.probe import probe_visits

    rec = Recorder(entry.load_kernel(), monkeypatch)
    others = {e.name: Recorder(k, monkeypatch, planned=False) for k, e in UNPLANNED.items()
              if case.op in UNPLANNED_OPS.get(e.name, ())}
    results = {}
    for layout in entry.layouts:
        before = len(rec.launches)
        # the running device's capabilities, the layout's grid limits (layout_caps.py says why only those)
        results[layout] = run_launcher(case, layout, layout_caps(layout, device_caps(device)), device)
        launches = rec.launches[before:]
        if case.op == "silu_and_mul_clamp" and case.args["x"].shape[0] == 0:
            assert launches == [], "M = 0 must launch nothing"
            continue
        # the segment-parallel pass launches the state kernel twice (summary, rerun; SEGMENT = 1, 2)
        want = 2 if _segmented(case) and entry.name not in SEGMENT_KERNELS else 1
        assert len(launches) == want, f"{layout}: expected {want} launch(es), got {len(launches)}"
        for grid, cx, kw in launches:
            assert cx["LAYOUT"] == layout
            n_seq, n_heads, n_blocks = _work_counts(case, kw)
            plan = GridPlan(grid=grid, layout=layout, axes=("?", "?", "?"), n_seq=n_seq, n_heads=n_heads,
                            n_blocks=n_blocks, constexprs=cx)
            counts, overflow = probe_visits(plan, device)
            assert overflow == 0, f"{layout}: {overflow} programs decoded a work item outside the work"
            assert bool((counts == 1).all()), \
                f"{layout}: work items not visited exactly once: {counts.flatten().tolist()}"
    for name, r in others.items():  # outside the planner: once per call, the same grid in every layout
        grids = [g for g, _, _ in r.launches]
        if _fused(case) != (name in FUSED_UNPLANNED) and name != "chunk_tables":
            assert grids == [], f"{name}: not a kernel of this case's path (fused: {_fused(case)}), yet it launched: {grids}"
            continue
        if name in ("chunk_output", "chunk_output_grouped") and name != _output_kernel(case):
            assert grids == [], f"{name}: another kernel writes this case's output, yet it launched: {grids}"
            continue
        if name == "segment_tables" and not _segmented(case):
            assert grids == [], f"{name}: launched without segments: {grids}"
            continue
        if name == "chunk_gdn_gates" and not _gdn_hoist(case):
            assert grids == [], f"{name}: the state loop scans its own gates in this case, yet it launched: {grids}"
            continue
        assert len(grids) == len(entry.layouts) and len(set(grids)) == 1, f"{name}: launches {grids}"
    return results


@pytest.mark.interpreter
@pytest.mark.parametrize("entry,case", PARAMS)
def test_layouts_visit_once_agree_bitwise_and_match_the_float64_reference(entry, case, device, monkeypatch):
    results = _run_all_layouts(entry, case, device, monkeypatch)
    first, *others = entry.layouts
    for layout in others:
        for name, val in results[first].items():
            assert torch.equal(val, results[layout][name]), f"{name}: {first} and {layout} differ"

    ref = run_reference(case)
    owned = owned_rows(case)
    for layout in entry.layouts:
        res = results[layout]
        out_name = "out" if case.op == "silu_and_mul_clamp" else "o"
        out = res[out_name]
        assert out.dtype == case.args["x" if case.op == "silu_and_mul_clamp" else "q"].dtype
        assert torch.isfinite(out).all()
        if out.numel():
            assert _rel(out, ref[out_name]) <= case.tol_out, f"{layout}: output error {_rel(out, ref[out_name]):.2e}"
        for name, mask in owned.items():
            orig = case.args[name]._base if case.args[name]._base is not None else case.args[name]
            got, want = res[name], ref[name]
            assert got.dtype == orig.dtype, f"{name} dtype changed"
            assert torch.equal(got[~mask], orig[~mask]), f"{layout}: {name} rows not owned by the call changed"
            if mask.any():
                assert torch.isfinite(got[mask]).all()
                err = _rel(got[mask], want[mask])
                assert err <= case.tol_state, f"{layout}: {name} error {err:.2e}"
        if case.op != "silu_and_mul_clamp":
            pad = _padding_rows(case)
            assert bool((out[pad] == 0).all()), "padding rows must give zero output"


def _padding_rows(case: Case) -> torch.Tensor:
    idx = case.args["state_indices"].long()
    if case.op in PREFILL_OPS:  # output rows are tokens: those of sequences on a negative index
        cu = case.args["cu_seqlens"].long()
        return torch.repeat_interleave(idx < 0, cu[1:] - cu[:-1])
    if idx.dim() == 1:
        return idx < 0
    na = case.args["num_accepted_tokens"]
    col = (na.long() - 1).clamp(min=0) if na is not None else torch.zeros(idx.shape[0], dtype=torch.long)
    return idx.gather(1, col[:, None]).squeeze(1) < 0


def test_every_registry_kernel_has_contract_cases():
    missing = [e.name for e in registry.KERNELS if e.layouts and e.op != "probe" and not CASES.get(e.op)]
    assert not missing, f"kernels without contract cases in tests/contract/contract_cases.py: {missing}"
    for e in registry.KERNELS:
        assert set(e.layouts) <= {"split", "folded"}, f"{e.name}: unknown layout in {e.layouts}"
        if not e.layouts:
            assert e.why_unplanned, f"{e.name}: a kernel outside the planner must say why"
            if e.name in DISPATCHER_KERNELS:
                continue
            ops = UNPLANNED_OPS.get(e.name, ())
            assert e.op in ops and all(CASES.get(op) for op in ops), \
                f"{e.name}: name the ops whose contract cases run it in UNPLANNED_OPS"


@pytest.mark.interpreter
@pytest.mark.parametrize("op", ["gdn_decode", "silu_and_mul_clamp", "gdn_prefill"])
def test_split_decodes_every_axis_order_the_planner_may_choose(op, device, monkeypatch):
    """Tight per-axis limits force the planner off its preferred placement (value blocks on x,
    sequences on z): the kernel must decode the other axes to the same work items (bitwise)."""
    case = CASES[op][0]
    entry = next(e for e in registry.KERNELS if e.op == op and e.layouts)
    rec = Recorder(entry.load_kernel(), monkeypatch)
    canonical = run_launcher(case, "split", profile("sm90"), device)
    tight = profile("sm90").model_copy(update={"grid": GridLimits(x=8, y=8, z=2, source="test: tiny limits")})
    permuted = run_launcher(case, "split", tight, device)
    (g0, c0, _), (g1, c1, _) = rec.launches
    assert c0["AX_SEQ"] == 2 and c1["AX_SEQ"] == 0 and g1[2] <= 2, "the limits must move sequences to x"
    for name in canonical:
        assert torch.equal(canonical[name], permuted[name]), name
