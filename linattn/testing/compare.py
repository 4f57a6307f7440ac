"""One comparison with the float64 reference: the relative error, the tolerance table, one checker.

Every place that holds a backend's results against ``linattn.backends.torch_ref`` run in float64
uses this module: the first-call self-check (``dispatch/runtime/self_check.py``), the conformance suite's
executor (:mod:`linattn.testing.execute`), the CuTe DSL sign-off checks
(``kernels/cutedsl/selfcheck.py``) and ``linattn demo``. The measure is the relative Frobenius error
``||x - ref|| / ||ref||`` (docs/ops.md "Tolerances"); the bounds are :data:`TOLERANCES`.

It imports torch (and linattn._namespace, standard library only), so ``dispatch/`` can import it without a cycle and ``import linattn`` does
not grow.

Example:
    >>> c = Comparison()
    >>> round(c.close("o", torch.ones(4) * 1.001, torch.ones(4), tolerances("bfloat16")[0]), 6)
    0.001
    >>> c.ok, c.summary()
    (True, 'o 1.0e-03')
"""

from __future__ import annotations

from typing import Optional

import torch

from linattn._namespace import public_dir

__all__ = ["DTYPES", "FULL_PRECISION", "TOLERANCES", "Comparison", "precision_of", "rel_error", "rel_error_exact_zero", "tolerance_for",
           "tolerances"]
__dir__ = public_dir(__name__, __all__)

#: The dtype names of a ``Problem`` / conformance case, as torch dtypes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
#: Input and state dtypes held to the fp32 bounds.
FULL_PRECISION = ("float32", "float64")

#: ``(phase, precision) -> (output, state)`` relative bounds against float64 (docs/ops.md
#: "Tolerances"). ``phase`` is the op table's (``OpSpec.phase``: ``decode``, ``prefill``,
#: ``gating``, ``mlp``), plus ``prefill_state_stage``: the CuTe DSL prefill's chunk-state stage
#: alone (its GEMM operands are bf16, so its chunk states, ``vn`` and final states are held to the
#: output bound; ``kernels/cutedsl/selfcheck.py``). ``precision`` is :func:`precision_of`'s.
#: ``state`` is None where the op writes no state. The gating ops compute and return fp32 (fp64 in
#: oracle mode) from any input dtype, hence one bound for both precisions.
TOLERANCES: dict[tuple[str, str], tuple[float, Optional[float]]] = {
    ("decode", "full"): (1e-5, 1e-5),
    ("decode", "16-bit"): (2e-2, 1e-2),
    ("prefill", "full"): (1e-5, 1e-5),
    ("prefill", "16-bit"): (2e-2, 1e-2),
    ("prefill_state_stage", "16-bit"): (2e-2, 2e-2),
    ("gating", "full"): (1e-5, None),
    ("gating", "16-bit"): (1e-5, None),
    ("mlp", "full"): (1e-5, None),
    ("mlp", "16-bit"): (1e-2, None),
}
_STATEFUL = ("decode", "prefill", "prefill_state_stage")


def precision_of(dtype: str, state_dtype: str = "float32", phase: str = "decode") -> str:
    """``"full"`` when the inputs (and, for an op with a state, the state) are fp32 or float64,
    else ``"16-bit"``.

    Example:
        >>> precision_of("float32", "bfloat16"), precision_of("float32", "bfloat16", "mlp")
        ('16-bit', 'full')
    """
    full = dtype in FULL_PRECISION and (phase not in _STATEFUL or state_dtype in FULL_PRECISION)
    return "full" if full else "16-bit"


def tolerances(dtype: str, state_dtype: str = "float32", phase: str = "decode") -> tuple[float, Optional[float]]:
    """``(output, state)`` relative bounds against the float64 reference (:data:`TOLERANCES`).

    Args:
        dtype: the q/k/v (or gating / clamp input) dtype name, ``"float32"``, ``"bfloat16"``, ...
        state_dtype: the state dtype name (read for ``decode`` / ``prefill`` only).
        phase: the op table's phase, or ``prefill_state_stage``.
    Raises:
        KeyError: a phase and precision the table has no bound for.
    Example:
        >>> tolerances("float32"), tolerances("bfloat16"), tolerances("bfloat16", phase="mlp")
        ((1e-05, 1e-05), (0.02, 0.01), (0.01, None))
    """
    return TOLERANCES[(phase, precision_of(dtype, state_dtype, phase))]


def tolerance_for(p) -> tuple[float, Optional[float]]:
    """:func:`tolerances` of a ``linattn.dispatch.Problem`` (its ``dtype``, ``state_dtype``, ``phase``)."""
    return tolerances(p.dtype, p.state_dtype, p.phase)


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in float64, on the reference's device (``||x - ref||`` when the
    reference is zero; 0 for an empty reference).

    Example:
        >>> round(rel_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.5])), 4)
        0.0925
    """
    if ref.numel() == 0:
        return 0.0
    ref = ref.detach().to(torch.float64)
    x = x.detach().to(ref.device, torch.float64)
    den = float(ref.norm())
    num = float((x - ref).norm())
    return num / den if den > 0 else num


def rel_error_exact_zero(x: torch.Tensor, ref: torch.Tensor) -> float:
    """:func:`rel_error`, except that an all-zero reference demands exact zeros: ``inf`` when ``x``
    holds anything else there (the tests' form: a row that must stay zero, e.g. a padding row's output
    or a fresh state, is not allowed a small absolute error).

    Example:
        >>> rel_error_exact_zero(torch.tensor([1e-9, 0.0]), torch.zeros(2))
        inf
        >>> rel_error_exact_zero(torch.zeros(2), torch.zeros(2))
        0.0
    """
    if ref.numel() and not bool(ref.detach().ne(0).any()):
        return 0.0 if not bool(x.detach().to(ref.device).ne(0).any()) else float("inf")
    return rel_error(x, ref)


class Comparison:
    """Named results held against the reference; collects every failed check and every measured error.

    ``failures`` lists messages (``"o: relative error 3.1e-02 > tolerance 2e-02"``, ...), in the
    order the checks ran; ``errors`` maps a name to its relative error; :attr:`worst` names the one
    closest to (or furthest past) its bound. A relative error equal to its bound passes.
    """

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.errors: dict[str, float] = {}
        self.bounds: dict[str, float] = {}

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, message: str) -> None:
        """Record a failed check the methods below do not cover."""
        self.failures.append(message)

    def close(self, name: str, x: torch.Tensor, ref: torch.Tensor, tol: float) -> Optional[float]:
        """``x`` within ``tol`` relative error of ``ref`` (same shape, finite). Returns the error
        (None when the shape differs or ``x`` is not finite, each a failure)."""
        if tuple(x.shape) != tuple(ref.shape):
            self.fail(f"{name}: shape {tuple(x.shape)}, reference {tuple(ref.shape)}")
            return None
        if not bool(torch.isfinite(x.detach().to(torch.float64)).all()):
            self.fail(f"{name}: not finite (NaN or inf)")
            return None
        err = rel_error(x, ref)
        self.errors[name], self.bounds[name] = err, tol
        if not err <= tol:
            self.fail(f"{name}: relative error {err:.2e} > tolerance {tol:.0e}")
        return err

    def zero(self, name: str, x: torch.Tensor, what: str, rows: Optional[list[int]] = None) -> None:
        """``x`` (its ``rows`` when given, and named in the message) exactly zero."""
        if rows is not None and not rows:
            return
        sel = (x.detach() if rows is None else x.detach()[rows]).to("cpu", torch.float64)
        if sel.numel() and bool((sel != 0).any()):
            named = "" if rows is None else f" {rows}"
            self.fail(f"{name}: {what}{named} must be exactly zero (max |x| = {float(sel.abs().max()):.3g})")

    def bitwise(self, name: str, x: torch.Tensor, want: torch.Tensor, what: str) -> None:
        """``x`` bitwise equal to ``want``."""
        if not torch.equal(x.detach().cpu(), want.detach().cpu()):
            self.fail(f"{name}: not bitwise equal to {what}")

    def dtype(self, name: str, x: torch.Tensor, want: torch.dtype) -> None:
        """``x`` of dtype ``want``."""
        if x.dtype != want:
            self.fail(f"{name}: dtype {x.dtype}, expected {want}")

    def untouched(self, name: str, after: torch.Tensor, before: torch.Tensor, owned: set[int], what: str) -> None:
        """Every row of ``after`` outside ``owned`` bitwise equal to ``before`` (a CPU copy)."""
        after = after.detach().cpu()
        changed = [i for i in range(before.shape[0]) if i not in owned and not torch.equal(after[i], before[i])]
        if changed:
            self.fail(f"{name}: {what} {changed} changed but are not owned by the call "
                      f"(rows owned: {sorted(owned)}); they must stay bitwise unchanged")

    def inputs_unchanged(self, args: dict, snapshots: dict) -> None:
        """Every snapshotted input (name -> CPU copy) bitwise as it was."""
        for key, before in snapshots.items():
            if not torch.equal(args[key].detach().cpu(), before):
                self.fail(f"input {key} was modified in place; inputs must never be written")

    @property
    def worst(self) -> Optional[tuple[str, float, float]]:
        """``(name, error, bound)`` of the compared tensor with the largest error relative to its
        bound (the first on a tie), or None when nothing was compared."""
        if not self.errors:
            return None
        name = max(self.errors, key=lambda n: self.errors[n] / self.bounds[n] if self.bounds[n] > 0 else float("inf"))
        return name, self.errors[name], self.bounds[name]

    def message(self) -> str:
        """Every failure, joined by ``"; "`` (empty when all passed)."""
        return "; ".join(self.failures)

    def summary(self) -> str:
        """The measured errors, ``"o 1.2e-06, state 3.0e-07"`` (``"passed"`` when none)."""
        return ", ".join(f"{k} {v:.1e}" for k, v in self.errors.items()) or "passed"
