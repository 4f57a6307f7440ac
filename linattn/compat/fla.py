"""flash-linear-attention's public GDN / KDA functions, as a drop-in over linattn's ops.

The four functions below have **fla-core 0.6.0**'s parameter names, order and defaults (checked
against the wheel's source by ``tests/compat/test_fla_signatures.py``), its shapes and return
values, and run through :func:`linattn.gdn_prefill` / :func:`linattn.kda_prefill` (and the
gate-form :func:`linattn.gdn_decode` / :func:`linattn.kda_decode` where that exists), so every call
is chosen and explained by linattn's dispatcher (:func:`linattn.last_decision`)::

    from linattn.compat.fla import chunk_gated_delta_rule      # instead of fla.ops.gated_delta_rule
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

Shapes (FLA's): ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (GVA: ``HV % H == 0``; value head ``hv``
reads q/k head ``hv // (HV // H)``), ``g [B, T, HV]`` (KDA ``[B, T, HV, K]``) log-space decay,
``beta [B, T, HV]``. Varlen: ``B = 1`` and ``cu_seqlens [N + 1]``; without ``cu_seqlens`` the batch
is ``N = B`` sequences of ``T`` tokens. States: ``[N, HV, K, V]`` (linattn's ``state_layout="kv"``),
or ``[N, HV, V, K]`` (``"vk"``) with ``state_v_first=True``.

Returns ``(o [B, T, HV, V], final_state)``: ``o`` in q's dtype (chunk functions) or v's dtype
(recurrent functions), as FLA; ``final_state`` float32 (float64 when the inputs are float64: the
reference mode of the tests) in the input layout, or ``None`` without ``output_final_state``. The
caller's ``initial_state`` is never modified.

Mapping details:

- ``use_qk_l2norm_in_kernel`` (FLA default ``False``) is passed explicitly as linattn's
  ``use_qk_l2norm`` (whose own default is ``True``): the FLA default means *no* normalisation.
- ``scale=None`` is ``K ** -0.5`` in both libraries.
- ``g`` and ``beta`` are cast to float32 (linattn's gate contract; FLA's kernels read them in
  fp32 too); an ``initial_state`` in 16 bits is read as float32 (FLA loads it that way); one
  of another dtype (integer, bool, complex) is a ``TypeError`` in every function.
- ``beta`` may be in ``(0, 2)`` (the negative-eigenvalue form, e.g. OLMo-hybrid's ``2 * sigmoid``):
  it is used as given.
- Errors speak the caller's shapes: every input's shape is checked here in FLA's ``[B, T, ...]``
  vocabulary before the inputs are flattened for linattn's ``[T, ...]`` ops, and a position quoted by
  linattn's value checks is given back as ``name[b, t, ...]``. A ``beta [B, T, HV, 1]`` is refused
  with ``beta.squeeze(-1)`` as the fix (fla-core 0.6.0's ``chunk_kda`` asserts ``[B, T, HV]`` and its
  recurrent kernel reads a 4-d beta per value channel).

In-kernel gating, as fla-core 0.6.0 reads it, in all four functions: with ``use_gate_in_kernel=True``
``g`` is the raw gate input (GDN ``[B, T, HV]``, KDA ``[B, T, HV, K]``, any float dtype), ``A_log``
holds ``HV`` values and ``dt_bias`` (optional, zeros when absent) ``HV`` (KDA ``HV * K``) values, both
read flat as FLA's kernels read them (Kimi-Linear's ``A_log [1, 1, HV, 1]`` and FLA's ``dt_bias
[HV * K]`` fit). The log decay is ``-exp(A_log) * softplus(g + dt_bias)``; KDA with ``lower_bound``
(finite, ``< 0``) takes ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, where ``A_log`` may
be None (``exp(A_log) = 1``, FLA's rule); KDA without ``lower_bound`` and GDN need ``A_log``
(ValueError, FLA's message; FLA's ``fused_recurrent_kda`` would silently take ``exp(A_log) = e``). With
``safe_gate=True`` ``chunk_kda`` asks for ``lower_bound`` in ``[-5, 0)`` as FLA does. The gate is
computed by :func:`linattn.kda_gating` / :func:`linattn.gdn_gating` (one extra op, fp32, before the
prefill or decode; docs/ops.md "Gating"), after every argument has been checked here. ``A_log`` /
``dt_bias`` / ``lower_bound`` without ``use_gate_in_kernel=True`` are a ValueError: FLA ignores them.

Arguments linattn does not implement are refused with ``NotImplementedError`` (FLA feature) or
``TypeError`` (unknown keyword) naming the argument, never ignored: ``use_beta_sigmoid_in_kernel=True``
(and so ``allow_neg_eigval=True``), ``cp_context``, ``chunk_indices``,
``return_intermediate_states=True``, ``use_graph=True`` / ``max_num_seqs``, ``gk`` / ``gv``, a
head-wise ``beta [B, T, HV, V]``, ``head_first``. Compute those betas in PyTorch first (e.g.
``beta = 2 * beta_logits.sigmoid()``).

Accepted because they are pure performance hints whose value does not change the result:
``cu_seqlens_cpu`` (a host copy of ``cu_seqlens``), the ``chunk_size`` keyword (FLA's allowed
values are still checked), ``disable_recompute`` (backward memory only) and ``safe_gate`` (kernel
selection for gates the caller already bounded). The deprecated ``transpose_state_layout`` keyword
is the alias of ``state_v_first``, with FLA's ``DeprecationWarning``.

Autograd: linattn's ops are inference ops; with grad mode on and an input requiring grad they raise
:class:`linattn.GradModeError` before launch (docs/ops-decisions.md, "Autograd"). Train with FLA.

linattn-only settings (backend, validation) are set for a block with :func:`options`, never
through extra keywords (which would break the signatures).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import linattn
from linattn.dispatch.lru import LRUCache
from linattn.dispatch.rules.validate import check_options
from linattn.dispatch.rules.value_rules import requote_token_positions

from linattn._namespace import public_dir

__all__ = ["FLA_VERSION", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
           "fused_recurrent_kda", "chunk_gdn", "fused_recurrent_gdn", "options", "recurrent_route"]
__dir__ = public_dir(__name__, __all__)

#: The fla-core release whose signatures these functions reproduce.
FLA_VERSION = "0.6.0"


# -- linattn-only options -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Options:
    backend: Optional[str] = None
    validate: bool = True
    check_finite: bool = False


_OPTIONS: contextvars.ContextVar[_Options] = contextvars.ContextVar("linattn_compat_fla_options",
                                                                   default=_Options())  # noqa: B039 - frozen


@contextlib.contextmanager
def options(*, backend: Optional[str] = None, validate: bool = True, check_finite: bool = False):
    """linattn settings for the FLA-compatible calls made inside the block (per thread / task).

    Args:
        backend: force a linattn backend by name (e.g. ``"torch-ref"``); None lets the dispatcher
            choose.
        validate: linattn's value checks (they sync with the device); see :func:`linattn.gdn_prefill`.
        check_finite: refuse NaN / inf inputs (one more sync).
    Example:
        >>> import linattn.compat.fla as fla
        >>> with fla.options(backend="torch-ref"):
        ...     pass
    Raises:
        TypeError: ``validate`` or ``check_finite`` is not a bool (on entering the block).
    """
    check_options(validate, check_finite)
    token = _OPTIONS.set(_Options(backend, validate, check_finite))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


# -- argument checks -------------------------------------------------------------------------------------

def _unsupported(func: str, arg: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"linattn.compat.fla.{func}: {arg} is not implemented by linattn ({why}); it is refused rather "
        f"than ignored. Compute it in PyTorch before the call, or call flash-linear-attention itself.")


def _common_kwargs(func: str, state_v_first: bool, kwargs: dict, *, chunk_sizes: Optional[tuple] = None) -> bool:
    """Consume FLA's known keywords; refuse the rest. Returns the effective ``state_v_first``."""
    if not kwargs:
        return state_v_first
    kwargs = dict(kwargs)
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    if "head_first" in kwargs:
        raise TypeError(f"linattn.compat.fla.{func}: head_first was removed from flash-linear-attention; "
                        f"inputs must be [B, T, H, ...].")
    if chunk_sizes is not None and "chunk_size" in kwargs:
        cs = kwargs.pop("chunk_size")
        if cs not in chunk_sizes:
            raise ValueError(f"`chunk_size` must be one of {chunk_sizes} for {func}, got {cs}.")
    if kwargs:
        raise TypeError(f"linattn.compat.fla.{func}() got unexpected keyword argument(s) "
                        f"{', '.join(repr(k) for k in kwargs)}; linattn refuses arguments it does not "
                        f"implement rather than ignoring them.")
    return state_v_first


@dataclass(frozen=True)
class _GateInKernel:
    """FLA's ``use_gate_in_kernel=True``: ``g`` is the raw gate input, the log decay is computed here."""
    A_log: Optional[torch.Tensor]
    dt_bias: Optional[torch.Tensor]
    lower_bound: Optional[float]


def _gate_in_kernel(func: str, family: str, use_gate_in_kernel: bool, A_log, dt_bias, lower_bound=None,
                    safe_gate: bool = False) -> Optional[_GateInKernel]:
    """FLA 0.6's rules for the in-kernel gate's arguments (shapes are checked with the inputs', in
    :func:`_check_gate_params`). Without ``use_gate_in_kernel`` FLA ignores ``A_log`` / ``dt_bias`` /
    ``lower_bound``; linattn refuses them (ValueError) rather than ignore them."""
    if not use_gate_in_kernel and A_log is None and dt_bias is None and lower_bound is None:
        return None
    given = [n for n, x in (("A_log", A_log), ("dt_bias", dt_bias), ("lower_bound", lower_bound)) if x is not None]
    if not use_gate_in_kernel:
        if given:
            raise ValueError(f"linattn.compat.fla.{func}: {', '.join(given)} given with use_gate_in_kernel=False: "
                             f"flash-linear-attention reads {'them' if len(given) > 1 else 'it'} only with "
                             f"use_gate_in_kernel=True (g then being the raw gate input) and would ignore "
                             f"{'them' if len(given) > 1 else 'it'} here; pass use_gate_in_kernel=True with the raw "
                             f"input as g, or drop {', '.join(given)}.")
        return None
    if A_log is None and (family == "gdn" or lower_bound is None):
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`"
                         + (" and `lower_bound` is not set." if family == "kda" else "."))
    if lower_bound is not None:
        if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)):
            raise TypeError(f"linattn.compat.fla.{func}: lower_bound must be a float (e.g. -5.0), got "
                            f"{type(lower_bound).__name__}.")
        if not (math.isfinite(lower_bound) and lower_bound < 0):
            raise ValueError(f"linattn.compat.fla.{func}: lower_bound must be finite and < 0 (the gate is "
                             f"lower_bound * sigmoid(...), a log decay in [lower_bound, 0)), got {lower_bound}.")
    if safe_gate and lower_bound is None:
        raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
    if safe_gate and not (-5 <= lower_bound < 0):
        raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    return _GateInKernel(A_log, dt_bias, None if lower_bound is None else float(lower_bound))


def _check_gate_params(func: str, family: str, gate: _GateInKernel, g: torch.Tensor, HV: int, K: int) -> None:
    """``A_log`` holds ``HV`` values and ``dt_bias`` ``HV`` (KDA ``HV * K``), read flat as FLA's kernels
    read them (so Kimi-Linear's ``A_log [1, 1, HV, 1]`` and FLA's ``dt_bias [HV * K]`` both fit): real
    floats on ``g``'s device."""
    want = {"A_log": HV, "dt_bias": HV * K if family == "kda" else HV}
    for name, x in (("A_log", gate.A_log), ("dt_bias", gate.dt_bias)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.is_complex():
            raise TypeError(f"linattn.compat.fla.{func}: {name} must be a floating-point tensor, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}.")
        if x.numel() != want[name]:
            shape = "[HV]" if want[name] == HV else "[HV * K] (or [HV, K])"
            raise ValueError(f"linattn.compat.fla.{func}: {name} must hold {shape} = {want[name]} values "
                             f"(HV={HV} from v{', K=' + str(K) + ' from q' if shape != '[HV]' else ''}), got shape "
                             f"{list(x.shape)}; pass the layer's own parameter.")
        if x.device != g.device:
            raise ValueError(f"linattn.compat.fla.{func}: {name} is on {x.device} but g is on {g.device}; "
                             f"move it with {name}.to(g.device).")


#: the options :func:`_run_with_options` sets, per (backend, validate) (frozen, so shared)
_OPTION_SETS = LRUCache(64)


def _run_with_options(fn, backend: Optional[str], validate: bool, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` with :func:`options`' settings ``backend`` and ``validate`` (the same
    context variable, set and reset around the call without a generator: the transformers router's
    per-call path, ``linattn/integrations/transformers.py``)."""
    opts = _OPTION_SETS.get((backend, validate))
    if opts is None:
        opts = _Options(backend, validate)
        _OPTION_SETS.put((backend, validate), opts)
    token = _OPTIONS.set(opts)
    try:
        return fn(*args, **kwargs)
    finally:
        _OPTIONS.reset(token)


def _log_decay(gate: _GateInKernel, family: str, g: torch.Tensor, HV: int, K: int, opts: "_Options") -> torch.Tensor:
    """The log decay from the raw gate input ``g`` through :func:`linattn.gdn_gating` /
    :func:`linattn.kda_gating` (docs/ops.md "Gating"; FLA 0.6's ``-exp(A_log) * softplus(g + dt_bias)``,
    or ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, ``A_log = None`` meaning ``exp(A_log) = 1``)."""
    pdt = torch.float64 if g.dtype == torch.float64 else torch.float32
    chan = (HV, K) if family == "kda" else (HV,)
    A_log = g.new_zeros(HV, dtype=pdt) if gate.A_log is None else gate.A_log.reshape(HV).to(pdt)
    dt_bias = g.new_zeros(chan, dtype=pdt) if gate.dt_bias is None else gate.dt_bias.reshape(chan).to(pdt)
    b = g.new_zeros((), dtype=pdt).expand(g.shape[:3])  # the gating's beta is not used: beta comes ready
    kw = dict(validate=opts.validate, check_finite=opts.check_finite)
    if family == "gdn":
        return linattn.gdn_gating(A_log, g, b, dt_bias, **kw)[0]
    return linattn.kda_gating(A_log, g, b, dt_bias, lower_bound=gate.lower_bound, **kw)[0]


def _beta_flags(func: str, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> None:
    if use_beta_sigmoid_in_kernel:
        raise _unsupported(func, "use_beta_sigmoid_in_kernel=True" + (" (with allow_neg_eigval=True)"
                                                                      if allow_neg_eigval else ""),
                           "pass beta = sigmoid(logits), or 2 * sigmoid(logits) for negative eigenvalues; "
                           "beta in (0, 2) is accepted")
    if allow_neg_eigval:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")


def _has_param(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


#: Whether linattn's decode ops take precomputed gates (``g=``/``beta=``) and ``has_initial_state``.
_DECODE_GATE_FORM = {"gdn": _has_param(linattn.gdn_decode, "g"), "kda": _has_param(linattn.kda_decode, "g")}
_DECODE_HAS_INIT = {"gdn": _has_param(linattn.gdn_decode, "has_initial_state"),
                    "kda": _has_param(linattn.kda_decode, "has_initial_state")}


def recurrent_route(family: str) -> str:
    """How ``fused_recurrent_*`` runs for ``family`` ("gdn" / "kda") in this build: ``"decode"``
    (linattn's gate-form decode op, for equal-length batches) or ``"prefill"`` (the chunked prefill
    op in dense mode, which computes the same recurrence)."""
    return "decode" if _DECODE_GATE_FORM[family] else "prefill"


# -- the common route --------------------------------------------------------------------------------------

def _gate_dtype(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


def _shape_error(func: str, name: str, want: str, dims: tuple, got: torch.Tensor, hint: str) -> ValueError:
    return ValueError(f"linattn.compat.fla.{func}: {name} must be {want} = {list(dims)}, got "
                      f"{list(got.shape)}; {hint}")


def _require_tensors(func: str, **named) -> None:
    """Each of ``named`` is a tensor: a TypeError naming the first that is not (None: a required argument)."""
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"linattn.compat.fla.{func}: {name} must be a torch.Tensor, got {type(x).__name__}"
                            + ("; it is required (flash-linear-attention's signature has no default for it)."
                               if x is None else "."))


def _check_shapes(func: str, family: str, q, k, v, g, beta, initial_state, cu_seqlens,
                  state_v_first: bool) -> tuple[int, int, int]:
    """Every input's shape against the caller's own ``[B, T, ...]`` vocabulary (F47), before anything
    is flattened for linattn's ``[T, ...]`` ops. Returns ``(B, T, N)``."""
    _require_tensors(func, g=g, beta=beta)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"linattn.compat.fla.{func}: {name} must be a [B, T, H, D] tensor, got {list(x.shape)}.")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same number of heads, but got q.shape[2]={q.shape[2]} "
                         f"and k.shape[2]={k.shape[2]}")
    (B, T, H, K), HV, V = q.shape, v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H}), "
                         f"but got HV % H = {HV % H}")
    if k.shape != q.shape:
        raise _shape_error(func, "k", "[B, T, H, K] (q's shape)", q.shape, k, "pass q and k of one shape.")
    if v.shape[:2] != q.shape[:2]:
        raise _shape_error(func, "v", "[B, T, HV, V] (q's B and T)", (B, T, HV, V), v,
                           "v needs one row per token of q.")
    gdims, gwant = ((B, T, HV, K), "[B, T, HV, K]") if family == "kda" else ((B, T, HV), "[B, T, HV]")
    if g.shape != gdims:
        raise _shape_error(func, "g", gwant, gdims, g, "one log decay per token and value head"
                           + (" and key channel." if family == "kda" else "."))
    if beta.shape != (B, T, HV):
        squeeze = beta.shape == (B, T, HV, 1)
        raise _shape_error(func, "beta", "[B, T, HV]", (B, T, HV), beta,
                           "pass beta.squeeze(-1): flash-linear-attention reads a 4-d beta as one value "
                           "per value channel, not per head." if squeeze else "one beta per token and value head.")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`. "
                         f"Please flatten variable-length inputs before processing.")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is not None:
        if initial_state.shape[0] != N:
            raise ValueError(f"The number of initial states is expected to be equal to the number of input "
                             f"sequences, i.e., {N} rather than {initial_state.shape[0]}.")
        sdims = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if initial_state.shape != sdims:
            raise _shape_error(func, "initial_state", f"[N, HV, {'V, K' if state_v_first else 'K, V'}] "
                               f"(state_v_first={state_v_first})", sdims, initial_state,
                               "N sequences, v's heads HV, q's K and v's V.")
    return B, T, N


class _in_caller_shapes:  # noqa: N801 (a context manager, named as one)
    """Re-raise linattn's ValueError / TypeError in the caller's terms, named after the compat function
    (``linattn.compat.fla.<func>: ...``, on every route): a flattened position ``name[b * T + t, ...]``
    becomes ``name[b, t, ...]`` and the pool the recurrent route builds from ``initial_state`` is named so.
    (A class rather than a generator: entered on every call.)"""

    __slots__ = ("func", "T", "flattened")

    def __init__(self, func: str, T: int, flattened: bool):
        self.func, self.T, self.flattened = func, T, flattened

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        if err is None or type(err) not in (ValueError, TypeError):
            return False
        msg, T = str(err), max(self.T, 1)
        if self.flattened:
            msg = requote_token_positions(msg, lambda t: f"{t // T}, {t % T}")
            msg = msg.replace("(q.shape[0])", "(B * T of q [B, T, H, K])")  # the op's packed q is the caller's [B, T]
        msg = msg.replace("state_pool", "initial_state")
        if msg.startswith("linattn.compat.fla."):
            return False
        raise type(err)(f"linattn.compat.fla.{self.func}: {msg}") from err


def _require_float_state(func: str, initial_state: torch.Tensor) -> None:
    """Every function's rule: an ``initial_state`` holds real floats (no integer, bool or complex
    tensor is silently converted); TypeError otherwise."""
    if not initial_state.dtype.is_floating_point:
        raise TypeError(f"{func}: initial_state must be a floating-point tensor (float32 as flash-linear-attention "
                        f"keeps states; 16-bit floats are read as float32), got {initial_state.dtype}; convert it "
                        "with initial_state.float() if its values are meant as states.")


#: ``arange(N) * step`` int64 CPU tensors, per (N, step): the recurrent route's slots into its own pool
#: (step 1) and the dense prefill's ``cu_seqlens`` (step T); read only
_CPU_SLOTS = LRUCache(64)


def _slots(N: int, like: torch.Tensor, step: int = 1) -> torch.Tensor:
    """``0, step, .., (N - 1) step`` (int64) on ``like``'s device: slots ``0..N-1`` of the recurrent route's
    pool, or the ``cu_seqlens`` of ``N - 1`` sequences of ``step`` tokens. On the CPU one kept tensor per
    ``(N, step)`` (no operation per call; the ops only read it), made again if anything wrote into it
    (its version counter moved: a plugin that wrote into an index tensor is refused, F43, and must not
    leave later calls a changed one; a write through a raw pointer is not seen). A new one each call on
    another device (a kept one could be read on another stream before the stream that wrote it has run),
    for a tensor subclass (a fake tensor while tracing) and under a dispatch mode (FakeTensorMode)."""
    device = like.device
    if device.type != "cpu" or type(like) is not torch.Tensor or _get_current_dispatch_mode() is not None:
        return torch.arange(N, device=device, dtype=torch.int64) * step
    idx = _CPU_SLOTS.get((N, step))
    if idx is None or idx._version != 0:
        with torch.inference_mode(False):  # a normal tensor, whichever mode its first call ran in
            idx = torch.arange(N, dtype=torch.int64) * step
        _CPU_SLOTS.put((N, step), idx)
    return idx


def _run(func: str, family: str, q, k, v, g, beta, *, scale, initial_state, output_final_state: bool,
         use_qk_l2norm_in_kernel: bool, state_v_first: bool, cu_seqlens, recurrent: bool,
         out_dtype: torch.dtype, gate: Optional[_GateInKernel] = None):
    B, T, N = _check_shapes(func, family, q, k, v, g, beta, initial_state, cu_seqlens, state_v_first)
    HV = v.shape[2]
    if gate is not None:
        _check_gate_params(func, family, gate, g, HV, q.shape[3])
    g, beta = _gate_dtype(g), _gate_dtype(beta)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.float64):
        _require_float_state(func, initial_state)
        initial_state = initial_state.to(torch.float32)
    layout = "vk" if state_v_first else "kv"
    opts = _OPTIONS.get()
    if gate is not None:  # the raw gate input becomes the log decay (linattn's gating op) before the prefill
        with _in_caller_shapes(func, T, flattened=False):
            g = _log_decay(gate, family, g, HV, q.shape[3], opts)
    common = dict(scale=scale, use_qk_l2norm=bool(use_qk_l2norm_in_kernel), state_layout=layout,
                  backend=opts.backend, validate=opts.validate, check_finite=opts.check_finite)

    if recurrent and cu_seqlens is None and _DECODE_GATE_FORM[family]:
        decode = linattn.gdn_decode if family == "gdn" else linattn.kda_decode
        K, V = q.shape[3], v.shape[3]
        sdtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        extra = {}
        if initial_state is not None:
            pool = initial_state.to(sdtype, memory_format=torch.contiguous_format, copy=True)  # one copy, FLA's own kept
        elif _DECODE_HAS_INIT[family] and T > 0:  # fresh sequences: no zeroing pass; every slot is written
            pool = q.new_empty(shape, dtype=sdtype)
            extra["has_initial_state"] = torch.zeros(N, dtype=torch.bool, device=q.device)
        else:  # T = 0 stores nothing (docs/ops.md): the final state is the zero state it starts from
            pool = q.new_zeros(shape, dtype=sdtype)
        with _in_caller_shapes(func, T, flattened=False):
            o = decode(q, k, v, None, None, None, None, pool, _slots(N, q), g=g, beta=beta, **extra, **common)
        final = pool if output_final_state else None
        return (o if o.dtype == out_dtype else o.to(out_dtype)), final

    prefill = linattn.gdn_prefill if family == "gdn" else linattn.kda_prefill
    if cu_seqlens is None:
        cu = _slots(B + 1, q, T)
    else:
        cu = cu_seqlens

    def flat(x):
        return x.reshape(B * T, *x.shape[2:])

    with _in_caller_shapes(func, T, flattened=True):
        o, final = prefill(flat(q), flat(k), flat(v), flat(g), flat(beta), cu, initial_state=initial_state,
                           **common)
    o = o.reshape(B, T, *o.shape[1:])
    if o.dtype != out_dtype:
        o = o.to(out_dtype)
    if not output_final_state:
        return o, None
    if final.dtype not in (torch.float32, torch.float64):
        final = final.to(torch.float32)
    return o, final


# -- the four functions -----------------------------------------------------------------------------------

def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    **kwargs,
):
    """Gated DeltaNet chunked prefill, FLA 0.6.0's signature, run by :func:`linattn.gdn_prefill`.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]`` (GVA when ``HV > H``).
        g: ``[B, T, HV]`` log-space decay (``<= 0``). beta: ``[B, T, HV]``, post-sigmoid (``(0, 2)`` ok).
        scale: query scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``) or None (zeros).
        output_final_state: also return the final state (float32, same layout).
        use_qk_l2norm_in_kernel: L2-normalise q and k (FLA's default False is kept).
        state_v_first: states are ``[N, HV, V, K]`` (linattn's ``"vk"``).
        cu_seqlens: ``[N + 1]`` prefix sums of the lengths (then ``B == 1``).
        cu_seqlens_cpu: host copy of ``cu_seqlens``: accepted, a performance hint only.
        use_beta_sigmoid_in_kernel, allow_neg_eigval, chunk_indices, cp_context, ``head_first``:
            refused (module docstring).
        **kwargs: ``use_gate_in_kernel`` (then ``g`` is the raw gate input), ``A_log`` (``[HV]``,
            required with it), ``dt_bias`` (``[HV]`` or None): FLA's in-kernel gate (module
            docstring); ``chunk_size`` (16, 32 or 64; a hint), ``transpose_state_layout`` (deprecated alias).
    Raises:
        ValueError / TypeError: bad shapes, dtypes or gate arguments, before anything runs.
    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``.
    """
    f = "chunk_gated_delta_rule"
    _require_tensors(f, q=q, k=k, v=v)
    gate = _gate_in_kernel(f, "gdn", bool(kwargs.pop("use_gate_in_kernel", False)), kwargs.pop("A_log", None),
                           kwargs.pop("dt_bias", None))
    state_v_first = _common_kwargs(f, state_v_first, kwargs, chunk_sizes=(16, 32, 64))
    _beta_flags(f, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if cp_context is not None:
        raise _unsupported(f, "cp_context", "context parallelism across devices")
    if chunk_indices is not None:
        raise _unsupported(f, "chunk_indices", "linattn derives its own chunking from cu_seqlens")
    if cu_seqlens_cpu is not None and cu_seqlens is None:
        raise ValueError(f"{f}: cu_seqlens_cpu was given without cu_seqlens; pass both or neither.")
    return _run(f, "gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                state_v_first=state_v_first, cu_seqlens=cu_seqlens, recurrent=False, out_dtype=v.dtype, gate=gate)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet token-by-token recurrence (decode, or short prefill), FLA 0.6.0's signature.

    Runs linattn's gate-form :func:`linattn.gdn_decode` for an equal-length batch where that op
    exists, else :func:`linattn.gdn_prefill` in dense mode (the same recurrence); see
    :func:`recurrent_route`.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``.
        g: ``[B, T, HV]`` log decay, or None (no decay); the raw gate input with ``use_gate_in_kernel``.
            beta: ``[B, T, HV]`` or None (ones).
        use_gate_in_kernel, A_log ``[HV]``, dt_bias ``[HV]``: FLA's in-kernel gate (module docstring).
        gk, gv, use_beta_sigmoid_in_kernel, allow_neg_eigval: refused (module docstring); so is a
            head-wise ``beta [B, T, HV, V]``.
        scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens:
            as :func:`chunk_gated_delta_rule`.
        **kwargs: ``transpose_state_layout`` (deprecated alias); anything else is refused.
    Returns:
        ``(o [B, T, HV, V] in v's dtype, final_state [N, HV, K, V] float32 or None)``.
    """
    f = "fused_recurrent_gated_delta_rule"
    _require_tensors(f, q=q, k=k, v=v)
    state_v_first = _common_kwargs(f, state_v_first, kwargs)
    if gk is not None:
        hint = ("; a tensor of beta's shape [B, T, HV] came in gk's place: FLA's order is (q, k, v, g, gk, gv, beta), "
                "so pass beta=beta" if beta is None and gk.dim() == 3 and gk.shape == v.shape[:3] else "")
        raise _unsupported(f, "gk", "per-key-channel decay in the GDN recurrence; use chunk_kda / "
                           "fused_recurrent_kda for a [B, T, HV, K] decay" + hint)
    if gv is not None:
        raise _unsupported(f, "gv", "per-value-channel decay")
    gate = _gate_in_kernel(f, "gdn", use_gate_in_kernel, A_log, dt_bias)
    _beta_flags(f, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if beta is not None and beta.shape == v.shape:
        raise _unsupported(f, "a head-wise beta [B, T, HV, V]", "beta is one scalar per token and head")
    if g is None:
        if gate is not None:
            raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
        g = q.new_zeros(v.shape[:3], dtype=torch.float32)
    if beta is None:
        beta = q.new_ones(v.shape[:3], dtype=torch.float32)
    return _run(f, "gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                state_v_first=state_v_first, cu_seqlens=cu_seqlens, recurrent=True, out_dtype=v.dtype, gate=gate)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    """Kimi Delta Attention chunked prefill, FLA 0.6.0's signature, run by :func:`linattn.kda_prefill`.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``.
        g: ``[B, T, HV, K]`` log-space decay per key channel; with ``use_gate_in_kernel=True`` the raw
            gate input, the decay then computed from it, ``A_log`` and ``dt_bias`` (keywords; ``[HV]``
            and ``[HV * K]``) and ``lower_bound`` as FLA 0.6 does (module docstring).
        beta: ``[B, T, HV]``.
        initial_state: float32 (as FLA asserts; float64 also accepted) ``[N, HV, K, V]`` or
            ``[N, HV, V, K]`` with ``state_v_first``.
        safe_gate, disable_recompute, cu_seqlens_cpu: accepted performance hints (module docstring);
            with ``use_gate_in_kernel``, ``safe_gate`` asks for ``lower_bound`` in ``[-5, 0)``.
        lower_bound: the bounded gate's floor (with ``use_gate_in_kernel`` only).
        use_beta_sigmoid_in_kernel, allow_neg_eigval, return_intermediate_states, cp_context, use_graph,
            max_num_seqs: refused.
        **kwargs: ``chunk_size`` (32 or 64; a hint), ``transpose_state_layout``.
        Others: as :func:`chunk_gated_delta_rule`.
    Returns:
        ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``.
    """
    f = "chunk_kda"
    _require_tensors(f, q=q, k=k, v=v)
    gate = _gate_in_kernel(f, "kda", use_gate_in_kernel, kwargs.pop("A_log", None), kwargs.pop("dt_bias", None),
                           lower_bound, safe_gate)
    state_v_first = _common_kwargs(f, state_v_first, kwargs, chunk_sizes=(32, 64))
    _beta_flags(f, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if return_intermediate_states:
        raise _unsupported(f, "return_intermediate_states=True", "per-chunk states are not returned")
    if cp_context is not None:
        raise _unsupported(f, "cp_context", "context parallelism across devices")
    if use_graph:
        raise _unsupported(f, "use_graph=True", "FLA's fixed-shape graph chunk list")
    if max_num_seqs is not None:
        raise _unsupported(f, "max_num_seqs", "it belongs to use_graph=True")
    if cu_seqlens_cpu is not None and cu_seqlens is None:
        raise ValueError(f"{f}: cu_seqlens_cpu was given without cu_seqlens; pass both or neither.")
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.float64):
        _require_float_state(f, initial_state)
        raise TypeError(f"{f}: initial_state must be in float32 (flash-linear-attention asserts it), got "
                        f"{initial_state.dtype}.")
    return _run(f, "kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                state_v_first=state_v_first, cu_seqlens=cu_seqlens, recurrent=False, out_dtype=v.dtype, gate=gate)


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi Delta Attention token-by-token recurrence, FLA 0.6.0's signature (route as
    :func:`fused_recurrent_gated_delta_rule`).

    Args:
        g: ``[B, T, HV, K]`` log decay (the raw gate input with ``use_gate_in_kernel``). beta: ``[B, T, HV]``.
        A_log ``[HV]``, dt_bias ``[HV * K]``, use_gate_in_kernel, lower_bound: FLA's in-kernel gate, as
            :func:`chunk_kda`.
        use_beta_sigmoid_in_kernel, allow_neg_eigval: refused; so is a head-wise ``beta [B, T, HV, V]``.
        Others: as :func:`chunk_kda`.
    Returns:
        ``(o [B, T, HV, V] in v's dtype, final_state [N, HV, K, V] float32 or None)``.
    """
    f = "fused_recurrent_kda"
    _require_tensors(f, q=q, k=k, v=v)
    state_v_first = _common_kwargs(f, state_v_first, kwargs)
    gate = _gate_in_kernel(f, "kda", use_gate_in_kernel, A_log, dt_bias, lower_bound)
    _beta_flags(f, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if beta is not None and beta.shape == v.shape:
        raise _unsupported(f, "a head-wise beta [B, T, HV, V]", "beta is one scalar per token and head")
    return _run(f, "kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                state_v_first=state_v_first, cu_seqlens=cu_seqlens, recurrent=True, out_dtype=v.dtype, gate=gate)


# FLA's aliases
chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
