"""Every Triton kernel of linattn, its launch layouts and its launcher: the contract test's list.

``tests/contract`` parametrises over :data:`KERNELS` (each kernel, each layout, the same inputs:
exactly-once visits, bitwise agreement across layouts, the float64 reference) and checks that
every ``@triton.jit`` function defined in ``kernels/triton/`` is either a kernel listed here or
a device helper listed in :data:`HELPERS`. So a new kernel cannot be added without entering the
contract test.

To add a kernel: write it on :func:`~linattn.kernels.triton._pid.decode_pid` with a grid from
:func:`~linattn.kernels.grid.plan_grid`, add a :class:`KernelEntry` here and contract cases for
its op in ``tests/contract/contract_cases.py``. Kernels whose grid is not planned (e.g. the chunked
prefill's intra-chunk stage, one program per chunk) are entered with ``layouts=()`` and a
``why_unplanned`` text; the contract test checks that they are explained, that their op has cases
(they run inside the launcher of a planned kernel of the same op) and that every layout of that
launcher gives them the same grid.

The chunked prefill (``kernels/triton/prefill/``) is three to five launches after the one that builds
its chunk index tables (:mod:`.chunk_tables`), one launch function per stage, beside its kernels
(``chunk_tables.launch_tables``, ``chunk_intra.launch_intra``, ``chunk_state.launch_gates``,
``chunk_state.launch_state``, ``chunk_output.launch_output``; the docstring of the ``prefill``
package lists them): only its state stage
(:mod:`.chunk_state`, one program per value block x sequence x value head) is planned, and it is
entered once per op (``gdn_prefill_state``, ``kda_prefill_state``: same source, ``KDA`` constexpr).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

KERNEL_PACKAGE = "linattn.kernels.triton"


@dataclass(frozen=True)
class KernelEntry:
    """One launchable Triton kernel.

    Fields:
        name: the registry name (usually the op it implements).
        kernel: ``"module:attribute"`` of the ``@triton.jit`` function.
        op: the op whose contract cases exercise it (``tests/contract/contract_cases.py``).
        layouts: the layouts its launcher takes (``split``, ``folded``); ``()`` = grid not planned.
        launcher: ``"module:function"`` of the host function that plans the grid and launches.
        why_unplanned: for ``layouts=()``, why the grid does not go through the planner.
    """

    name: str
    kernel: str
    op: str
    layouts: tuple[str, ...]
    launcher: str
    why_unplanned: str = ""
    notes: str = field(default="", compare=False)

    def load_kernel(self):
        mod, _, attr = self.kernel.partition(":")
        return getattr(importlib.import_module(mod), attr)

    def load_launcher(self):
        mod, _, attr = self.launcher.partition(":")
        return getattr(importlib.import_module(mod), attr)


KERNELS: tuple[KernelEntry, ...] = (
    KernelEntry(
        name="gdn_decode", op="gdn_decode", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.decode:_recurrent_decode_kernel",
        launcher=f"{KERNEL_PACKAGE}.decode:recurrent_decode",
        notes="GATE='gdn'",
    ),
    KernelEntry(
        name="kda_decode", op="kda_decode", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.decode:_recurrent_decode_kernel",
        launcher=f"{KERNEL_PACKAGE}.decode:recurrent_decode",
        notes="GATE='kda' (same source as gdn_decode)",
    ),
    KernelEntry(
        name="silu_and_mul_clamp", op="silu_and_mul_clamp", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.silu_clamp:_silu_and_mul_clamp_kernel",
        launcher=f"{KERNEL_PACKAGE}.silu_clamp:silu_and_mul_clamp",
    ),
    KernelEntry(
        name="probe", op="probe", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.probe:_probe_kernel",
        launcher=f"{KERNEL_PACKAGE}.probe:probe_visits",
        notes="records the work item each program decodes; the contract's own instrument",
    ),
    KernelEntry(
        name="gdn_prefill_state", op="gdn_prefill", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.chunk_state:chunk_state_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        notes=("KDA=False; stage 2 of the chunked prefill, reads and writes the pool in place; on GDN's bf16 "
               "path with the gates kernel's factors (HOIST) and, at GVA group size 2, U formed here (UTM) "
               "and every second chunk's state stored (HSTEP=2): prefill.stage_options, prefill.GdnStageSplit"),
    ),
    KernelEntry(
        name="kda_prefill_state", op="kda_prefill", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.chunk_state:chunk_state_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        notes=("KDA=True (same source as gdn_prefill_state); on the bf16 path at K <= 128 it also "
               "writes the output (FUSE_O; prefill.StateConfig.writes_output)"),
    ),
    KernelEntry(
        name="gdn_prefill_fused", op="gdn_prefill", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.chunk_fused:chunk_gdn_fused_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        notes=("the fused GDN prefill (issue 27): one program per (value block, sequence, value head) walks "
               "the chunks with the state in registers, reads h0 from and writes the final state to the pool "
               "in place; in place of stages 1-4 where prefill.plan_fused chooses it; run by the fused "
               "contract cases (launch={'fused': True})"),
    ),
    KernelEntry(
        name="kda_prefill_fused", op="kda_prefill", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.chunk_fused_kda:chunk_kda_fused_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        notes=("the fused KDA prefill (issue 27 step 2): as gdn_prefill_fused, with the per-channel decays "
               "formed from the raw gates in the loop; in place of the system, intra and state stages where "
               "prefill.plan_fused chooses it (prefill.FUSED_KDA_DEFAULT); run by the fused contract cases "
               "(launch={'fused': True})"),
    ),
    KernelEntry(
        name="prefill_segment_combine", op="gdn_prefill", layouts=("split", "folded"),
        kernel=f"{KERNEL_PACKAGE}.chunk_state:chunk_segment_combine_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        notes=("the segment-parallel state pass's sequential combine (both families; between the "
               "state kernel's summary pass, SEGMENT=1, and its rerun, SEGMENT=2): reads h0 from and "
               "writes the final state to the pool in place; run by the segmented contract cases"),
    ),
    KernelEntry(
        name="chunk_tables", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_tables:chunk_tables_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (cdiv(T // 64 + N, 128),) on axis x: one program per 128 chunks, each "
                       "scanning cu_seqlens itself (no N * HV axis and no head axis at all), so no "
                       "device limit is at stake and there is nothing to plan; chunks past the "
                       "bound are masked off"),
        notes=("stage 0 of the chunked prefill (both families): the chunk index tables chunk_off, "
               "chunk_seq, chunk_start from cu_seqlens in one launch, no host sync (past "
               "prefill.TABLES_TRITON_MAX_N sequences: torch ops, prefill.chunk_tables)"),
    ),
    KernelEntry(
        name="segment_tables", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_tables:segment_tables_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (1,): one program scans the sequences' chunk counts and then the segments in "
                       "blocks (the segment-parallel pass runs where the state grid is small, so N is small), "
                       "so there is no work-item axis to plan"),
        notes=("the segment-parallel state pass's tables (seg_cu, seg_chunk_off, seg_first, seg_slot) "
               "from cu_seqlens and chunk_off in one launch; bitwise prefill.segment_tables_torch"),
    ),
    KernelEntry(
        name="chunk_intra", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_intra:chunk_intra_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("persistent grid (min(items, sm_count * c),) on axis x (c: prefill.IntraConfig.ctas_per_sm, "
                       "or tm_ctas_per_sm where GDN's stage 1 writes Tm diag(beta)): each program loops over "
                       "the (chunk, value head) items p, p + P, ... of the (T // 64 + N) * HV items, so "
                       "no axis carries N * HV, no device limit is at stake and there is nothing to "
                       "plan; items past the real chunk count do nothing"),
        notes="stage 1 of the chunked prefill; also run by the kda_prefill cases (KDA=True)",
    ),
    KernelEntry(
        name="chunk_gdn_fused_prep", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_fused:chunk_gdn_fused_prep_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("persistent grid (min(items, sm_count * c),) on axis x (c: FusedConfig.prep_ctas_per_sm), "
                       "each program looping over the (chunk, key head) items p, p + P, ... (FusedConfig.prep_shared_keys; "
                       "else (chunk, value head)) as chunk_intra, "
                       "so no axis carries N * HV and there is nothing to plan; items past the real chunk "
                       "count do nothing"),
        notes="the fused GDN prefill's state-independent part: Tm diag(beta), Aqk and the norms (O(C^2) per chunk)",
    ),
    KernelEntry(
        name="chunk_kda_fused_prep", op="kda_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_fused_kda:chunk_kda_fused_prep_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("persistent grid (min(items, sm_count * c),) on axis x (c: FusedConfig.prep_ctas_per_sm), "
                       "each program looping over the (chunk, key head) items p, p + P, ... (FusedConfig.prep_shared_keys; "
                       "else (chunk, value head)) as chunk_intra, "
                       "so no axis carries N * HV and there is nothing to plan; items past the real chunk "
                       "count do nothing"),
        notes=("the fused KDA prefill's state-independent part: Tm diag(beta), Aqk (chunk_kda_system's "
               "channel-block products, fast or level path) and the norms (O(C^2) per chunk)"),
    ),
    KernelEntry(
        name="chunk_kda_system", op="kda_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_intra:chunk_kda_system_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (T // 64 + N, HV): one program per (chunk, value head), chunks on axis x "
                       "(up to 2**31 - 1) and no N * HV axis, so no device limit is at stake and "
                       "there is nothing to plan; programs past the real chunk count return at once"),
        notes="stage 1a of KDA's chunked prefill: A, Aqk and the later stages' operands",
    ),
    KernelEntry(
        name="chunk_output", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_output:chunk_output_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (T // 64 + N, HV, V // 64): one program per (chunk, value head, value "
                       "block), chunks on axis x (up to 2**31 - 1) and no N * HV axis, so no device "
                       "limit is at stake and there is nothing to plan; programs past the real "
                       "chunk count return at once"),
        notes=("stage 3 of the chunked prefill; KDA (KDA=True) only for fp32 inputs, K = 256 or a "
               "replacement state kernel: otherwise KDA's state kernel writes the output itself; "
               "GDN except bf16 at GVA group size 2 (chunk_output_grouped)"),
    ),
    KernelEntry(
        name="chunk_output_grouped", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_output:chunk_output_grouped_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (T // 64 + N, H, V // 64): one program per (chunk, key head, value "
                       "block), chunks on axis x (up to 2**31 - 1) and no N * H axis, so no device "
                       "limit is at stake and there is nothing to plan; programs past the real "
                       "chunk count return at once"),
        notes=("stage 3 of GDN's chunked prefill on bf16 inputs at GVA group size 2: one q k^T per key head; "
               "HALF: rebuilds every second chunk's state share from the chunk before"),
    ),
    KernelEntry(
        name="chunk_gdn_gates", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.chunk_state:chunk_gdn_gates_kernel",
        launcher=f"{KERNEL_PACKAGE}.prefill:chunk_prefill",
        why_unplanned=("grid (T // 64 + N, cdiv(HV, 32)): one program per (chunk, block of 32 value "
                       "heads), chunks on axis x (up to 2**31 - 1) and no N * HV axis, so no device "
                       "limit is at stake and there is nothing to plan; programs past the real "
                       "chunk count return at once"),
        notes=("between stages 1 and 2 of GDN's chunked prefill: the state loop's per-row key "
               "factor rk exp(G_C - G) and per-chunk exp(G_C)"),
    ),
    KernelEntry(
        name="decode_value_flags", op="gdn_decode", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.value_checks:decode_value_flags_kernel",
        launcher=f"{KERNEL_PACKAGE}.value_checks:DecodeValueCheck",
        why_unplanned=("grid (1,): one program reads a decode call's index and gate-parameter arrays "
                       "(bounded by value_checks.MAX_PAIRWISE / MAX_ELEMENTS) and writes one int32 of "
                       "flags, so there is no work-item axis to plan; launched by the dispatcher's value "
                       "checks (dispatch/rules/value_rules.py fused_value_check), not by the decode launcher"),
        notes=("both decode ops' value rules in one launch; held against the torch rules by "
               "tests/dispatch/test_fused_value_checks.py"),
    ),
    KernelEntry(
        name="prefill_value_flags", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.value_checks:prefill_value_flags_kernel",
        launcher=f"{KERNEL_PACKAGE}.value_checks:PrefillValueCheck",
        why_unplanned=("grid (G,), G <= value_checks.MAX_PROGRAMS: program p reads blocks p, p + G, ... of a "
                       "prefill call's cu_seqlens, state_indices and g and writes its own int32 of flags, a "
                       "1-D stream far below any grid limit, so there is nothing to plan; launched by the "
                       "dispatcher's value checks (dispatch/rules/value_rules.py fused_value_check), not by the "
                       "prefill launcher"),
        notes=("both prefill ops' value rules in one launch; held against the torch rules by "
               "tests/dispatch/test_fused_value_checks.py"),
    ),
    KernelEntry(
        name="fork_slots", op="gdn_prefill", layouts=(),
        kernel=f"{KERNEL_PACKAGE}.fork_slots:_fork_slots_kernel",
        launcher=f"{KERNEL_PACKAGE}.fork_slots:fork_slots",
        why_unplanned=("grid (N, HV): the sequences on axis x (up to 2^31 - 1) and the value heads on axis y (a "
                       "model's HV, far below 65,535), one program per (sequence, head) copying a state row, so "
                       "nothing to plan; launched by the prefill launchers only for calls with "
                       "output_state_indices (kernels/triton/prefill/run.py forked)"),
        notes=("separate read and write slots: each read row copied into its write row before the prefill runs "
               "in place on the write slots; held bitwise by tests/ops/test_separate_slots.py"),
    ),
)

#: ``@triton.jit`` functions that are called from kernels, never launched: ``"module:attribute"``.
HELPERS: frozenset[str] = frozenset({
    f"{KERNEL_PACKAGE}._pid:decode_pid",
    f"{KERNEL_PACKAGE}._pid:chunk_span",
    f"{KERNEL_PACKAGE}.decode:_log1p_exp_neg",
    f"{KERNEL_PACKAGE}.decode:_softplus",
    f"{KERNEL_PACKAGE}.decode:_tile",
    f"{KERNEL_PACKAGE}.decode:_decode_rows",
    f"{KERNEL_PACKAGE}.chunk_intra:_ld",
    f"{KERNEL_PACKAGE}.chunk_intra:_st",
    f"{KERNEL_PACKAGE}.chunk_intra:_norms",
    f"{KERNEL_PACKAGE}.chunk_intra:_kda_level",
    f"{KERNEL_PACKAGE}.chunk_intra:_blk_ld",
    f"{KERNEL_PACKAGE}.chunk_intra:_blk_st",
    f"{KERNEL_PACKAGE}.chunk_intra:_gdn_system",
    f"{KERNEL_PACKAGE}.chunk_intra:_solve",
    f"{KERNEL_PACKAGE}.chunk_intra:_diag_inv",
    f"{KERNEL_PACKAGE}.chunk_intra:_half_ld",
    f"{KERNEL_PACKAGE}.chunk_intra:_intra_chunk",
    f"{KERNEL_PACKAGE}.chunk_intra:_mm",
    f"{KERNEL_PACKAGE}.chunk_state:_gate_factors",
    f"{KERNEL_PACKAGE}.chunk_state:pool_slot",
    f"{KERNEL_PACKAGE}.chunk_state:store_checkpoint",
    f"{KERNEL_PACKAGE}.chunk_fused:_rnorm",
    f"{KERNEL_PACKAGE}.chunk_fused:_chunk_scale",
    f"{KERNEL_PACKAGE}.chunk_fused:_prep_chunk",
    f"{KERNEL_PACKAGE}.chunk_fused:_decay_diffs",
    f"{KERNEL_PACKAGE}.chunk_fused:store_tmb",
    f"{KERNEL_PACKAGE}.chunk_fused:walk_start",
    f"{KERNEL_PACKAGE}.chunk_fused:walk_end",
    f"{KERNEL_PACKAGE}.chunk_fused:chunk_tiles",
    f"{KERNEL_PACKAGE}.chunk_fused:chunk_tiles_t",
    f"{KERNEL_PACKAGE}.chunk_fused:_state_offsets",
    f"{KERNEL_PACKAGE}.chunk_fused_kda:_kda_prep_chunk",
    f"{KERNEL_PACKAGE}.chunk_intra:kda_block_products",
    f"{KERNEL_PACKAGE}.chunk_intra:kda_store_system",
    f"{KERNEL_PACKAGE}._gates:cum_gates",
    f"{KERNEL_PACKAGE}.chunk_state:_combine_rows",
    f"{KERNEL_PACKAGE}.chunk_output:_scaled",
    f"{KERNEL_PACKAGE}.chunk_output:_gdn_q_pass",
    f"{KERNEL_PACKAGE}.decode:_l2norm",
    f"{KERNEL_PACKAGE}.decode:_l2norm_scaled",
    f"{KERNEL_PACKAGE}.decode:_log2_decay",
    f"{KERNEL_PACKAGE}._l2norm:_shift",
    f"{KERNEL_PACKAGE}._l2norm:pow2_scale",
    f"{KERNEL_PACKAGE}._l2norm:inv_pow2_scale",
    f"{KERNEL_PACKAGE}._l2norm:chunk_row_max",
    f"{KERNEL_PACKAGE}._gates:cumsum2",
    f"{KERNEL_PACKAGE}.chunk_tables:_imax",
    f"{KERNEL_PACKAGE}.value_checks:_outside",
    f"{KERNEL_PACKAGE}.value_checks:_shared_slot",
    f"{KERNEL_PACKAGE}.value_checks:_flagged",
    f"{KERNEL_PACKAGE}.value_checks:_decreasing",
})


def kernel_modules() -> list[str]:
    """Every module in ``kernels/triton/`` (by file, so a new file is found without an import)."""
    import pkgutil

    pkg = importlib.import_module(KERNEL_PACKAGE)
    return sorted(f"{KERNEL_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__))


def jit_functions(module: str) -> list[str]:
    """``"module:attribute"`` of every ``@triton.jit`` function defined in ``module``.

    Works compiled and under ``TRITON_INTERPRET=1`` (where ``triton.jit`` builds interpreted
    functions). Functions imported from another module are attributed to their own module.
    """
    from triton.runtime.jit import JITFunction

    kinds: tuple[type, ...] = (JITFunction,)
    try:
        from triton.runtime.interpreter import InterpretedFunction

        kinds = kinds + (InterpretedFunction,)
    except ImportError:  # pragma: no cover - older triton
        pass
    mod = importlib.import_module(module)
    out = []
    for attr, obj in vars(mod).items():
        if isinstance(obj, kinds):
            fn = getattr(obj, "fn", None)
            if getattr(fn, "__module__", module) == module:
                out.append(f"{module}:{attr}")
    return out


def jit_decorated_names(module: str) -> list[str]:
    """Names of functions decorated ``@triton.jit`` in ``module``'s source (a cross-check that
    also sees kernels hidden from module attributes, e.g. defined inside a function)."""
    import ast
    import inspect

    src = inspect.getsource(importlib.import_module(module))
    names = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if ast.unparse(target) in ("triton.jit", "jit", "tl.jit"):
                    names.append(f"{module}:{node.name}")
    return names


# -- compile checks without a GPU ------------------------------------------------------------

_OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "debug")


class Launch:
    """One captured launch: the jit function, its grid, bound arguments and compile options."""

    def __init__(self, fn, grid, arguments: dict, options: dict):
        self.fn, self.grid, self.arguments, self.options = fn, grid, arguments, options

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


class capture_launches:
    """Context manager: launches of compiled (non-interpreted) jit functions are recorded, not run.

    Lets CI build every kernel variant for a GPU target on a machine without one (the launchers
    run on CPU tensors up to the launch, which is captured).
    """

    def __enter__(self) -> list[Launch]:
        from triton.runtime.jit import JITFunction

        self._orig = JITFunction.run
        self.launches: list[Launch] = []
        launches = self.launches

        def run(fn, *args, grid, warmup, **kwargs):
            options = {k: kwargs.pop(k) for k in list(kwargs) if k in _OPTION_KEYS}
            bound = fn.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            launches.append(Launch(fn, grid, dict(bound.arguments), options))
            return None

        JITFunction.run = run
        return launches

    def __exit__(self, *exc):
        from triton.runtime.jit import JITFunction

        JITFunction.run = self._orig
        return False


def compile_inputs(launch: Launch) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of a captured launch, specialized as Triton's own binder
    does (types, constexprs, 16-divisibility), for ``triton.compiler.ASTSource``."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    fn = launch.fn
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        val = launch.arguments[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = val
            continue
        ty, spec = native_specialize_impl(BaseBackend, val, False, True, True)
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = spec
        elif isinstance(spec, str) and "D" in spec:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def compile_launch(launch: Launch, arch: int = 90, warp_size: int = 32):
    """Compile a captured launch for ``cuda:<arch>`` (no GPU needed); returns the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(launch.fn, *compile_inputs(launch))
    return triton.compile(src, target=GPUTarget("cuda", arch, warp_size), options=dict(launch.options))
