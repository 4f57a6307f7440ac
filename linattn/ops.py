"""Public ops: validate, choose a backend (explainably), run it.

Each op is also a ``torch.library`` custom op (namespace ``linattn``) with the state pool declared
as mutated and a fake implementation for shapes, so functions calling these ops compile with
``torch.compile(fullgraph=True)``; both are derived from the op's row of the op table
(``OpSpec.signature``: names, types, order, mutated arguments). In eager mode the public functions
call the dispatcher directly (no custom-op hop); under ``torch.compile`` they go through the custom
op. The public functions are typed signatures with docstrings, held to the op table by
``tests/api/test_op_signatures.py``.

Maths and shapes: ``docs/ops.md`` (symbols N, T, H, HV, K, V, P as in flash-linear-attention). Sources:
Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (ICLR 2025); the Kimi Linear report (2025).
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch
import torch.fx
from torch import Tensor

from linattn.dispatch.runtime import fast_path as _fast
from linattn.dispatch.rules.ops_table import OP_TABLE, Arg
from linattn.dispatch.rules.validate import check_options
from linattn.dispatch.runtime.results import final_state_dtype, gate_dtype
from linattn.dispatch.runtime.selection import Dispatcher
from linattn.dispatch.plugin.verdict import NoBackendError


class BackendRunError(RuntimeError):
    """A plugin backend raised while running, or returned a result that breaks the op contract
    (shape, dtype, device, tuple arity; ``dispatch/runtime/results.py``); it is rejected with reason
    ``backend_error`` from now on, so later calls take another backend."""


class GradModeError(RuntimeError):
    """Grad mode is on and a tensor argument requires grad, and no backend records autograd.

    linattn's ops are inference ops: they write the state pool in place and record no graph, so a
    call that autograd would have to track is refused before anything runs, in eager mode, under
    ``torch.compile`` and on every backend (a silent detach would hide that no gradient flows).
    ``decision`` is the dispatcher's trace (None when raised while ``torch.compile`` traces).
    """

    def __init__(self, op: str, inputs: list, decision=None):
        self.op, self.inputs, self.decision = op, list(inputs), decision
        super().__init__(
            f"{op}: grad mode is on and {', '.join(inputs)} require{'s' if len(inputs) == 1 else ''} grad, "
            f"but linattn's ops are inference ops ({_WHY_NO_GRAD[OP_TABLE[op].writes_pool]}; "
            f"no backend that fits this call declares autograd support). Call under "
            f"torch.no_grad() or torch.inference_mode() (e.g. around generate), or pass detached tensors.")

    def __reduce__(self):
        """Pickles as its constructor's arguments (F40: crosses a process boundary as itself)."""
        return type(self), (self.op, self.inputs, self.decision)


_WHY_NO_GRAD = {True: "they write the state pool in place and record no autograd graph",
                False: "they record no autograd graph"}  # by OpSpec.writes_pool


def _grad_inputs(args: dict) -> list:
    if not torch.is_grad_enabled():
        return []
    return [name for name, x in args.items() if isinstance(x, Tensor) and x.requires_grad]


def _traced(op: str, custom, args: dict):
    """The custom op to call while tracing (``torch.compile``, ``FakeTensorMode``), refusing grad as
    eager mode does (F40): the custom op has no autograd formula.

    Under a fake mode alone the refusal is raised here. While Dynamo traces it cannot be: Dynamo
    turns any exception raised in traced code into a graph break, an ``Unsupported`` error under
    ``fullgraph=True``. So the refusal becomes part of the graph instead: the call's tensors are
    detached and its first tensor passes through ``linattn::grad_refused``, which raises the same
    :class:`GradModeError` when the compiled code runs, before the op (which depends on it) and
    whatever follows it; it is marked side-effecting, so it runs even when the op's result is unused.
    """
    names = _grad_inputs(args)
    if not names:
        return custom
    if not torch.compiler.is_dynamo_compiling():
        raise GradModeError(op, names)
    return functools.partial(_refused_call, custom, op, names)


def _refused_call(custom, op: str, names: list, *args):
    args = [x.detach() if isinstance(x, Tensor) else x for x in args]
    first = next(i for i, x in enumerate(args) if isinstance(x, Tensor))
    args[first] = _grad_refused_op(args[first], op, ",".join(names))
    return custom(*args)


@torch.library.custom_op("linattn::grad_refused", mutates_args=())
def _grad_refused_op(x: Tensor, op: str, inputs: str) -> Tensor:
    """Raises ``GradModeError(op, inputs)`` when a compiled graph reaches it (see :func:`_traced`)."""
    raise GradModeError(op, inputs.split(","))


@_grad_refused_op.register_fake
def _(x, op, inputs):
    return torch.empty_like(x)


torch.fx.node.has_side_effect(torch.ops.linattn.grad_refused.default)  # never removed as dead code


def _measure_bucket(bucket, device, *, dispatch):
    """``LINATTN_AUTOTUNE``'s measurement of a bucket (:func:`linattn.tune.measure_bucket`, imported
    when first measuring): installed on the dispatch layer, which imports nothing of this one."""
    from linattn.tune import measure_bucket

    return measure_bucket(bucket, device, dispatch=dispatch)


Dispatcher.measure_bucket = staticmethod(_measure_bucket)


def _call(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool = False):
    """Validate, select and run one call: through its cached call plan when one exists for the
    call's key (``dispatch/runtime/fast_path.py``: the same checks, the derivable ones done once)."""
    if validate.__class__ is not bool or check_finite.__class__ is not bool:  # 1 would meet True's plan below
        check_options(validate, check_finite)
    key = _fast._key(op, args, backend, validate, check_finite, ())  # call_key, one call less
    plan = _fast.lookup(key)
    nargs = None if plan is None else _fast.prepare_hit(plan, args)
    if nargs is None:  # first call with this key (its class's plan, or the full validation), or an overlap
        plan, nargs = _fast.plan_miss(op, args, key, plan is None, backend, validate, check_finite,
                                      _no_backend_error(op))
    if plan.builtin:
        return _fast.run_plan(plan, nargs)
    return _run_plugin(plan, nargs)


def _no_backend_error(op: str):
    def convert(e: NoBackendError, nargs: dict, signature: tuple) -> Exception:
        if dict(signature)["requires_grad"] and _grad_inputs(nargs):  # one refusal, named after the inputs
            return GradModeError(op, _grad_inputs(nargs), e.decision)
        return e
    return convert


def _run_plugin(plan, nargs: dict):
    """A plugin backend's run, its result checked against the op contract before the caller sees it;
    a failure is named and remembered (the backend is rejected from then on), never retried silently.
    A result sharing memory with an argument, or a read-only argument modified, is a wrong result
    (F43). A raise that the call's own inputs explain (a validation rule the call breaks, e.g. with
    ``validate=False``) is the caller's: that refusal is raised and the backend not marked (F33)."""
    from linattn.dispatch.runtime.registry import error_text
    from linattn.dispatch.runtime.results import ResultError, check_result, check_untouched, input_versions
    from linattn.dispatch.runtime.selection import get_registry
    from linattn.dispatch.rules.validate import caller_fault

    op, impl = plan.op, plan.impl
    versions = input_versions(op, nargs)
    try:
        return check_untouched(op, nargs, check_result(op, nargs, _fast.run_plan(plan, nargs)), versions)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        fault = None if isinstance(e, ResultError) else caller_fault(op, nargs)
        if fault is not None:
            raise fault from e
        get_registry().mark_broken(impl.name, e, where=not isinstance(e, ResultError))
        what, detail = ("returned a wrong result", str(e)) if isinstance(e, ResultError) else ("raised", error_text(e))
        written = [n for n in OP_TABLE[op].mutates if isinstance(nargs.get(n), Tensor)]
        partial = (f" The rows of {' and '.join(written)} this call writes may hold its partial writes: rebuild "
                   f"them (e.g. prefill those sequences again) before retrying." if written else "")
        raise BackendRunError(f"backend {impl.name!r} (plugin {impl.plugin!r}) {what} in {op}: {detail}. It is "
                              f"rejected (backend_error) from now on, so later calls take another backend; "
                              f"report it to the plugin's authors.{partial}") from e


def _compiling() -> bool:
    """True while ``torch.compile`` traces or a ``FakeTensorMode`` is active: then the public
    functions go through the custom ops, whose fake implementations give the output shapes."""
    return torch.compiler.is_compiling() or _fake_mode_active()


try:
    _get_dispatch_mode, _FAKE = torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FAKE
except AttributeError:  # a torch without the dispatch-mode query: no fake routing
    _get_dispatch_mode = _FAKE = None


def _fake_mode_active() -> bool:
    return _get_dispatch_mode is not None and _get_dispatch_mode(_FAKE) is not None

# -- results and fakes -------------------------------------------------------------------------------
# F39: every op's fake gives its real output's shape, dtype, device and strides (contiguous). The
# dtypes come from dispatch/runtime/results.py (gate_dtype, final_state_dtype), read by both sides; the
# real side casts a backend's gates or final state to them (a no-op on the built-in backends,
# except Triton's fp32 gates when only b or A_log is fp64), so the two cannot drift. Each takes the
# op's arguments by name (``args``).


def _as_declared(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as the op declares it: ``dtype``, contiguous (no copy when it already is)."""
    return x if x.dtype == dtype and x.is_contiguous() else x.to(dtype).contiguous()


def _gates_as_declared(g: Tensor, beta: Tensor, *inputs: Tensor) -> tuple[Tensor, Tensor]:
    dtype = gate_dtype(*inputs)
    return _as_declared(g, dtype), _as_declared(beta, dtype)


def _gating_result(out: tuple, args: dict) -> tuple[Tensor, Tensor]:
    g, beta = out
    return _gates_as_declared(g, beta, args["A_log"], args["a"], args["b"], args["dt_bias"])


def _gating_fake(args: dict) -> tuple[Tensor, Tensor]:
    a, b = args["a"], args["b"]
    dtype = gate_dtype(args["A_log"], a, b, args["dt_bias"])
    return a.new_empty(a.shape, dtype=dtype), b.new_empty(b.shape, dtype=dtype)


def _decode_fake(args: dict) -> Tensor:
    q, v = args["q"], args["v"]
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2], v.shape[3]))


def _prefill_result(out: tuple, args: dict) -> tuple[Tensor, Tensor]:
    """The custom op's two tensors: ``(o, final_state)``, the second empty in pool mode (custom-op
    outputs cannot be None)."""
    o, final = out
    q = args["q"]
    if final is None:  # pool mode
        return o, q.new_empty((0,), dtype=torch.float32)
    return o, _as_declared(final, final_state_dtype(q, args["initial_state"]))


def _prefill_output(out: tuple, args: dict):
    """The eager prefill's return: ``o`` in pool mode, ``(o, final_state)`` in dense mode."""
    if args["state_pool"] is not None:
        return out[0]
    return _prefill_result(out, args)


def _prefill_fake(args: dict) -> tuple[Tensor, Tensor]:
    q, v, cu_seqlens, initial_state = args["q"], args["v"], args["cu_seqlens"], args["initial_state"]
    o = q.new_empty((q.shape[0], v.shape[1], v.shape[2]))
    if args["state_pool"] is not None:
        return o, q.new_empty((0,), dtype=torch.float32)
    N, HV, K, V = cu_seqlens.shape[0] - 1, v.shape[1], q.shape[2], v.shape[2]
    shape = (N, HV, V, K) if args["state_layout"] == "vk" else (N, HV, K, V)
    return o, q.new_empty(shape, dtype=final_state_dtype(q, initial_state))


def _clamp_fake(args: dict) -> Tensor:
    x = args["x"]
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def _as_is(out, args: dict):
    return out


# -- the custom ops, derived from the op table -------------------------------------------------------
# linattn::<op> takes OpSpec.signature's parameters in order: the first release's arguments, backend /
# validate / check_finite, the second release's (default None). Types from Arg.annotation, the mutated
# arguments from Arg.mutated; the implementation is _call and the method's result function, the fake
# the method's fake.

#: per backend method: (the custom op's return type, result function, fake)
_BY_METHOD = {"gating": (tuple[Tensor, Tensor], _gating_result, _gating_fake),
              "decode": (Tensor, _as_is, _decode_fake),
              "prefill": (tuple[Tensor, Tensor], _prefill_result, _prefill_fake),
              "clamp": (Tensor, _as_is, _clamp_fake)}
_OPTION_TYPES = {"backend": str, "validate": bool, "check_finite": bool}  # the custom op's: backend "" = none


def _parameter(a: Arg) -> inspect.Parameter:
    return inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             annotation=_OPTION_TYPES.get(a.name) or a.annotation,
                             default=None if a.since > 1 else inspect.Parameter.empty)


def _custom_op(op: str):
    """``torch.ops.linattn.<op>`` from its row of the op table (see above)."""
    spec = OP_TABLE[op]
    returns, result, fake = _BY_METHOD[spec.method]
    names = tuple(a.name for a in spec.signature)

    def impl(*values):
        args = dict(zip(names, values))
        backend, validate, check_finite = args.pop("backend"), args.pop("validate"), args.pop("check_finite")
        return result(_call(op, args, backend, validate, check_finite), args)

    impl.__name__ = impl.__qualname__ = f"_{op}_impl"
    impl.__signature__ = inspect.Signature([_parameter(a) for a in spec.signature], return_annotation=returns)
    custom = torch.library.custom_op(f"linattn::{op}", mutates_args=spec.mutates)(impl)
    custom.register_fake(lambda *values: fake(dict(zip(names, values))))
    return custom


_CUSTOM_OPS = {op: _custom_op(op) for op in OP_TABLE}


def _traced_call(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool):
    """A call through the custom op (while ``torch.compile`` traces or a ``FakeTensorMode`` is active:
    :func:`_compiling`), its arguments in the op's signature order; grad refused as in eager mode."""
    spec = OP_TABLE[op]
    fn = _traced(op, _CUSTOM_OPS[op], args)
    return fn(*(args[a.name] for a in spec.args if a.since == 1), backend or "", validate, check_finite,
              *(args[a.name] for a in spec.args if a.since > 1))


# -- gating ------------------------------------------------------------------------------------------


def gdn_gating(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, *, softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0, backend: Optional[str] = None, validate: bool = True,
               check_finite: bool = False):
    """GDN gates: ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (docs/ops.md "Gating").

    Args:
        A_log: ``[HV]`` fp32. a, b: ``[..., HV]`` (any float dtype). dt_bias: ``[HV]``.
        softplus_beta, softplus_threshold: softplus parameters (1.0, 20.0).
        backend: force a backend by name. validate: run the value checks.
        check_finite: refuse NaN / inf inputs before computing (one device sync).
    Returns:
        ``(g, beta)``: fp32 (fp64 when any input is fp64: the oracle mode; ``dispatch/runtime/results.py``
        ``gate_dtype``), contiguous, shapes of ``a`` and ``b``; ``g <= 0`` is a log-space decay.
    Raises:
        ValueError / TypeError: bad shapes, dtypes or devices (before anything runs).
    Example:
        >>> import torch, linattn
        >>> g, beta = linattn.gdn_gating(torch.zeros(4), torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(4))
        >>> round(float(beta[0, 0]), 2)
        0.5
    """
    args = dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, softplus_beta=softplus_beta,
                softplus_threshold=softplus_threshold)
    if _compiling():
        return _traced_call("gdn_gating", args, backend, validate, check_finite)
    return _gating_result(_call("gdn_gating", args, backend or "", validate, check_finite), args)


def kda_gating(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, *, lower_bound: Optional[float] = None,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0, backend: Optional[str] = None,
               validate: bool = True, check_finite: bool = False):
    """KDA gates, one per key channel (docs/ops.md "Gating"; Kimi Linear report).

    Args:
        A_log: ``[HV]`` fp32. a: ``[..., HV, K]``. b: ``[..., HV]``. dt_bias: ``[HV, K]``.
        lower_bound: None for ``g = -exp(A_log) * softplus(a + dt_bias)``; a negative float (e.g.
            -5.0) for the bounded gate ``g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``.
    Returns:
        ``(g [..., HV, K], beta [..., HV])``, fp32 (fp64 when any input is fp64), contiguous.
    Raises:
        ValueError / TypeError: bad inputs.
    Example:
        >>> import torch, linattn
        >>> g, beta = linattn.kda_gating(torch.zeros(2), torch.zeros(3, 2, 8), torch.zeros(3, 2), torch.zeros(2, 8))
        >>> tuple(g.shape)
        (3, 2, 8)
    """
    args = dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, lower_bound=lower_bound, softplus_beta=softplus_beta,
                softplus_threshold=softplus_threshold)
    if _compiling():
        return _traced_call("kda_gating", args, backend, validate, check_finite)
    return _gating_result(_call("kda_gating", args, backend or "", validate, check_finite), args)


# -- decode ------------------------------------------------------------------------------------------


def _require_pool(op: str, state_pool: Optional[Tensor], state_indices: Optional[Tensor]) -> None:
    """Decode's gate arguments may be left out (the precomputed-gate form), but not the pool and its
    slots: they keep their positions after the four gates, so they default to None and are required here."""
    missing = [n for n, x in (("state_pool", state_pool), ("state_indices", state_indices)) if x is None]
    if missing:
        raise TypeError(f"{op}() missing the required argument{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(m) for m in missing)}: decode reads and writes the state pool at the "
                        f"slots given (e.g. {op}(q, k, v, g=g, beta=beta, state_pool=pool, state_indices=slots)).")


def gdn_decode(q: Tensor, k: Tensor, v: Tensor, a: Optional[Tensor] = None, b: Optional[Tensor] = None,
               A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
               state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None, *, scale: Optional[float] = None,
               use_qk_l2norm: bool = True, state_layout: str = "vk", intermediate_states: Optional[Tensor] = None,
               intermediate_state_indices: Optional[Tensor] = None, disable_state_update: bool = False,
               num_accepted_tokens: Optional[Tensor] = None, softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0, backend: Optional[str] = None, validate: bool = True,
               check_finite: bool = False, g: Optional[Tensor] = None, beta: Optional[Tensor] = None,
               has_initial_state: Optional[Tensor] = None, output_state_indices: Optional[Tensor] = None) -> Tensor:
    """Gated DeltaNet decode over a state pool, in place (docs/ops.md "Ops"; Yang et al., ICLR 2025).

    Args:
        q, k: ``[N, T, H, K]`` bf16/fp16/fp32. v: ``[N, T, HV, V]`` (``HV % H == 0``, GVA).
        a, b: ``[N, T, HV]`` raw gate inputs; A_log, dt_bias: ``[HV]`` (gating fused, fp32 inside).
            All four None (the default; leave them out) for the precomputed-gate form (``g=``,
            ``beta=``, below), e.g. ``gdn_decode(q, k, v, g=g, beta=beta, state_pool=pool,
            state_indices=slots)``.
        state_pool: ``[P, HV, V, K]`` (``state_layout="vk"``) or ``[P, HV, K, V]`` (``"kv"``), fp32 or
            bf16; updated in place at the rows named by ``state_indices``; slot pitch ``stride(0)``.
        state_indices: ``[N]`` int32/int64 slots (negative = padding: zero output, pool untouched),
            or ``[N, T]`` per-token slots for speculative verify (state after token t stored there).
        scale: query scale (default ``K ** -0.5``, must be > 0). use_qk_l2norm: L2-normalise q, k.
        intermediate_states: optional ``[S, steps >= T, HV, V, K]`` receiving the state after every
            token at row ``intermediate_state_indices[n]`` (negative = skip); pitch from ``stride(0)``.
        disable_state_update: leave the pool untouched (verify only).
        num_accepted_tokens: ``[N]`` in ``0..T`` with an ``[N, T]`` table: the state is loaded from the
            slot of token ``num_accepted_tokens[n] - 1``; 0 starts from a zero state.
        backend: force a backend. validate: run checks that sync with the device (index range,
            duplicate slots, finite ``A_log`` / ``dt_bias``); skipped automatically during
            CUDA-graph capture.
        check_finite: also refuse NaN / inf in any input the op reads, in the same single sync
            (refused during CUDA-graph capture). Without it a non-finite per-sequence input (q, k,
            v, a, b) reaches only that sequence's outputs and slot (docs/ops-decisions.md).
        g, beta: decode from precomputed gates (FLA's and transformers' form), with a, b, A_log,
            dt_bias left out (or None): ``g`` fp32 ``[N, T, HV]`` log decay (floored at -1000; ``g > 0``
            or NaN refused when ``validate``), ``beta`` fp32 ``[N, T, HV]`` already sigmoided (not
            range-checked: OLMo passes (0, 2)). Exactly one gate form; softplus_beta / threshold
            must stay at their defaults then. Everything else (pool, padding, table, verify,
            layouts) is unchanged; equals the raw form fed :func:`gdn_gating`'s outputs.
        has_initial_state: optional ``[N]`` bool (None = all True): False starts that row from a
            zero state without reading its slot (stale or NaN contents are irrelevant); its states
            are stored as usual. A negative index stays padding. vLLM's name for the same mask.
        output_state_indices: optional ``[N]`` int32/int64 write slots, with ``state_indices [N]``
            (None = write where read): row n's state is read from ``state_indices[n]`` and its
            final state written to ``output_state_indices[n]``; only the written slots change (a
            shared prefix's slot stays intact, so speculative branches can fork from it). Padding
            (negative) on the same rows as ``state_indices``. ``ValueError`` with an ``[N, T]`` table
            (its columns are the write slots), with ``disable_state_update=True``, for a slot written
            by two rows, and for a slot one row reads and another writes (rows run in parallel).
    Returns:
        ``o [N, T, HV, V]`` in q's dtype.
    Raises:
        ValueError / TypeError: bad inputs, before any kernel launch. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> N, H, HV, K, V, P = 2, 1, 2, 8, 8, 4
        >>> pool = torch.zeros(P, HV, V, K)
        >>> o = linattn.gdn_decode(torch.randn(N, 1, H, K), torch.randn(N, 1, H, K), torch.randn(N, 1, HV, V),
        ...     torch.zeros(N, 1, HV), torch.zeros(N, 1, HV), torch.zeros(HV), torch.zeros(HV), pool,
        ...     torch.tensor([3, -1]))
        >>> tuple(o.shape), bool(o[1].abs().sum() == 0)
        ((2, 1, 2, 8), True)
    """
    _require_pool("gdn_decode", state_pool, state_indices)
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool,
                state_indices=state_indices, scale=scale, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                intermediate_states=intermediate_states, intermediate_state_indices=intermediate_state_indices,
                disable_state_update=disable_state_update, num_accepted_tokens=num_accepted_tokens,
                softplus_beta=softplus_beta, softplus_threshold=softplus_threshold, g=g, beta=beta,
                has_initial_state=has_initial_state, output_state_indices=output_state_indices)
    if _compiling():
        return _traced_call("gdn_decode", args, backend, validate, check_finite)
    return _call("gdn_decode", args, backend or "", validate, check_finite)


def kda_decode(q: Tensor, k: Tensor, v: Tensor, a: Optional[Tensor] = None, b: Optional[Tensor] = None,
               A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
               state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None, *, scale: Optional[float] = None,
               use_qk_l2norm: bool = True, state_layout: str = "vk", intermediate_states: Optional[Tensor] = None,
               intermediate_state_indices: Optional[Tensor] = None, disable_state_update: bool = False,
               num_accepted_tokens: Optional[Tensor] = None, lower_bound: Optional[float] = None,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0, backend: Optional[str] = None,
               validate: bool = True, check_finite: bool = False, g: Optional[Tensor] = None,
               beta: Optional[Tensor] = None, has_initial_state: Optional[Tensor] = None,
               output_state_indices: Optional[Tensor] = None) -> Tensor:
    """Kimi Delta Attention decode over a state pool, in place (docs/ops.md; Kimi Linear report, 2025).

    As :func:`gdn_decode`, with per-key-channel gates: ``a [N, T, HV, K]``, ``dt_bias [HV, K]``,
    ``A_log [HV]``, and ``lower_bound`` (None, or e.g. -5.0 for the bounded gate). The
    precomputed-gate form takes ``g [N, T, HV, K]`` and ``beta [N, T, HV]`` fp32 (a ``lower_bound`` is
    refused there: apply it in :func:`kda_gating`); ``has_initial_state`` and ``output_state_indices``
    as in :func:`gdn_decode`.

    Returns:
        ``o [N, T, HV, V]`` in q's dtype.
    Raises:
        ValueError / TypeError: bad inputs, before any kernel launch. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> pool = torch.zeros(2, 1, 4, 4)
        >>> o = linattn.kda_decode(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4),
        ...     torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1), torch.zeros(1), torch.zeros(1, 4), pool,
        ...     torch.tensor([0]))
        >>> bool(pool[1].abs().sum() == 0)
        True
    """
    _require_pool("kda_decode", state_pool, state_indices)
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool,
                state_indices=state_indices, scale=scale, use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                intermediate_states=intermediate_states, intermediate_state_indices=intermediate_state_indices,
                disable_state_update=disable_state_update, num_accepted_tokens=num_accepted_tokens,
                lower_bound=lower_bound,
                softplus_beta=softplus_beta, softplus_threshold=softplus_threshold, g=g, beta=beta,
                has_initial_state=has_initial_state, output_state_indices=output_state_indices)
    if _compiling():
        return _traced_call("kda_decode", args, backend, validate, check_finite)
    return _call("kda_decode", args, backend or "", validate, check_finite)


# -- prefill -----------------------------------------------------------------------------------------


def _run_prefill(op: str, args: dict, backend: Optional[str], validate: bool, check_finite: bool):
    """A prefill op's call from its public function: traced under torch.compile, else dispatched; pool
    mode returns ``o``, dense mode ``(o, final_state)``."""
    if _compiling():
        o, final = _traced_call(op, args, backend, validate, check_finite)
        return o if args["state_pool"] is not None else (o, final)
    return _prefill_output(_call(op, args, backend or "", validate, check_finite), args)


def gdn_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                initial_state: Optional[Tensor] = None, scale: Optional[float] = None, use_qk_l2norm: bool = True,
                state_layout: str = "vk", backend: Optional[str] = None, validate: bool = True,
                check_finite: bool = False, has_initial_state: Optional[Tensor] = None,
                output_state_indices: Optional[Tensor] = None, checkpoint_every: Optional[int] = None,
                checkpoint_indices: Optional[Tensor] = None):
    """Gated DeltaNet chunked prefill over varlen sequences (docs/ops.md; Yang et al., ICLR 2025 / NeurIPS 2024).

    Args:
        q, k: ``[T, H, K]``. v: ``[T, HV, V]``. g, beta: ``[T, HV]`` fp32 from :func:`gdn_gating`.
        cu_seqlens: ``[N+1]`` int32/int64 prefix sums of sequence lengths (zero lengths legal).
        state_pool, state_indices: **pool mode**: h0 read from ``state_pool[state_indices[n]]`` and the
            final state written back to that row in place. A negative index makes that sequence
            padding: zero output for its tokens, the pool neither read nor written.
        initial_state: **dense mode** (no pool): ``[N, HV, V, K]`` (``"vk"``) or None for zeros.
        has_initial_state: pool mode only, optional ``[N]`` bool (None = all True): False starts that
            sequence from a zero state without reading its slot (whatever it holds, NaN included)
            and writes its final state there; fused in the kernels (no zeroing pass). Dense mode:
            ``ValueError`` (pass initial_state).
        output_state_indices: pool mode only, optional ``[N]`` int32/int64 write slots (None = write
            where read): h0 is read from ``state_indices[n]`` and the final state written to
            ``output_state_indices[n]``; the read slot keeps its bits when the two differ (a shared
            prefix's slot stays intact). Padding on the same rows as ``state_indices``; a slot
            written by two sequences, or read by one and written by another, is a ``ValueError``
            (several sequences may read one slot).
        checkpoint_every, checkpoint_indices: pool mode only, both or neither (prefix caching;
            docs/ops.md "State checkpoints"). ``checkpoint_every``: tokens between checkpoints, a
            positive multiple of the chunk (64). ``checkpoint_indices``: ``[N, max_checkpoints]``
            int32/int64 on the pool's device, ``-1`` = no checkpoint. Sequence ``n``'s state after
            ``(j + 1) * checkpoint_every`` of its tokens (from its initial state: the slot read, or
            zeros where ``has_initial_state`` is False) is written, in the pool's dtype and layout,
            to slot ``checkpoint_indices[n, j]`` when the sequence has that many tokens; a
            checkpoint at exactly its length is written and equals its final state; a checkpoint
            past its length is not written (the slot keeps its bits), nor are a padding sequence's.
            ``ValueError`` before any launch for: one given without the other, dense mode,
            ``checkpoint_every`` not a positive multiple of 64, a shape other than ``[N, *]``, a slot
            out of range, a slot written twice in the call (checkpoints and final-state write slots
            together), and a checkpoint slot that any sequence reads (``state_indices``).
            Backends that do not declare the ``checkpoints`` feature are not chosen (reason
            ``feature``): today torch-ref and torch-chunked run it.
        scale, use_qk_l2norm, state_layout, backend, validate, check_finite: as in :func:`gdn_decode`
            (NaN in ``g``, or ``g > 0``, is always refused when ``validate``: g is a log decay).
    Returns:
        pool mode: ``o [T, HV, V]``; dense mode: ``(o, final_state [N, HV, V, K])``.
    Raises:
        ValueError / TypeError: bad inputs (before any launch). NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> T, H, K, V = 5, 1, 8, 8
        >>> g, beta = linattn.gdn_gating(torch.zeros(1), torch.zeros(T, 1), torch.zeros(T, 1), torch.zeros(1))
        >>> o, ht = linattn.gdn_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V), g, beta,
        ...     torch.tensor([0, 2, 5]))
        >>> tuple(ht.shape)
        (2, 1, 8, 8)
    """
    args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                state_indices=state_indices, initial_state=initial_state, scale=scale,
                use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices)
    return _run_prefill("gdn_prefill", args, backend, validate, check_finite)


def kda_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, *,
                state_pool: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                initial_state: Optional[Tensor] = None, scale: Optional[float] = None, use_qk_l2norm: bool = True,
                state_layout: str = "vk", backend: Optional[str] = None, validate: bool = True,
                check_finite: bool = False, has_initial_state: Optional[Tensor] = None,
                output_state_indices: Optional[Tensor] = None, checkpoint_every: Optional[int] = None,
                checkpoint_indices: Optional[Tensor] = None):
    """Kimi Delta Attention chunked prefill: as :func:`gdn_prefill` with ``g [T, HV, K]`` (per key channel),
    ``has_initial_state``, ``output_state_indices`` and the state checkpoints (``checkpoint_every``,
    ``checkpoint_indices``) included.

    Returns:
        pool mode: ``o [T, HV, V]``; dense mode: ``(o, final_state)``.
    Raises:
        ValueError / TypeError: bad inputs. NoBackendError: no backend fits.
    Example:
        >>> import torch, linattn
        >>> T, H, K, V = 3, 1, 4, 4
        >>> o, ht = linattn.kda_prefill(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V),
        ...     -torch.rand(T, H, K), torch.rand(T, H), torch.tensor([0, 3]))
        >>> tuple(o.shape)
        (3, 1, 4)
    """
    args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state_pool=state_pool,
                state_indices=state_indices, initial_state=initial_state, scale=scale,
                use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                has_initial_state=has_initial_state, output_state_indices=output_state_indices,
                checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices)
    return _run_prefill("kda_prefill", args, backend, validate, check_finite)


# -- SwiGLU clamp ------------------------------------------------------------------------------------


def silu_and_mul_clamp(x: Tensor, limit: Optional[float] = None, *, backend: Optional[str] = None,
                       validate: bool = True, check_finite: bool = False) -> Tensor:
    """SwiGLU with a clamp: ``silu(min(gate, L)) * clamp(up, -L, L)`` (docs/ops.md; DeepSeek-V4-class MoE).

    Args:
        x: ``[M, 2D]`` = gate ‖ up, bf16/fp16/fp32; any ``M >= 0``, any ``D >= 1``.
        limit: None (plain ``silu(gate) * up``, bitwise) or a finite float > 0.
        backend: force a backend. validate: unused (no value checks). check_finite: refuse NaN / inf
            in ``x`` before computing (one device sync).
    Returns:
        ``[M, D]`` in x's dtype (``M = 0``: an empty tensor, nothing launched).
    Raises:
        ValueError: limit 0, negative, inf or NaN; odd last dim. TypeError: non-float x.
    Example:
        >>> import torch, linattn
        >>> linattn.silu_and_mul_clamp(torch.tensor([[100.0, -100.0]]), 10.0)
        tensor([[-99.9955]])
    """
    args = dict(x=x, limit=limit)
    if _compiling():
        return _traced_call("silu_and_mul_clamp", args, backend, validate, check_finite)
    return _call("silu_and_mul_clamp", args, backend or "", validate, check_finite)
