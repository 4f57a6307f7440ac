"""Test-only speed-ups of Triton's interpreter: each leaves every value a kernel computes and every
check Triton makes as they were, and each is installed only where this Triton has the names it wraps
(:func:`install`; where a release lacks them the suite runs as before). Only the test suite installs
them (tests/conftest.py, under ``TRITON_INTERPRET=1``):

- one patch of ``triton.language`` per launch (:func:`_patch_lang_once_per_launch`);
- no integer-overflow sanitizer whose verdict is dropped (:func:`_overflow_checks_only_where_asserted`);
- numpy dtypes from a table (:func:`_np_dtype_table`).

One patch per launch: under ``TRITON_INTERPRET=1`` Triton's launch (``GridExecutor.__call__``) points
the builtins of the language modules the kernel's module imports (``triton.language`` / its ``core``)
at the interpreter for the whole launch and restores them at its end; then every call of a
``@triton.jit`` helper inside the kernel (``InterpretedFunction.__call__``) runs the same patch again
for the modules the helper's module imports, rebuilding the same wrappers around the same builder, and
never restores it (what the launch had patched its restore puts back; a module only a helper imports
stays patched, as upstream). Our kernels call small helpers in their loops, so that repeated patch was
about 8% of an interpreter-bound file's CPU time (tests/prefill/test_prefill_segments.py on two
workers: 129.6 -> 119.4 s). The patch makes a helper's patch a no-op while a launch has already
patched the language modules that helper sees (``triton.language`` / its ``core``); any other case
runs Triton's own code.
"""

from __future__ import annotations

import inspect
import threading

_STATE = threading.local()


def install() -> bool:
    """Install every patch below that this Triton has the names for; True where any was installed."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    return any([_patch_lang_once_per_launch(interp), _overflow_checks_only_where_asserted(interp),
                _np_dtype_table(interp)])


def _np_dtype_table(interp) -> bool:
    """The interpreter's ``_get_np_dtype`` answered from a table filled by Triton's own function.

    Triton's builds a dict of 19 dtypes on every call, and the interpreter asks it for nearly every
    tensor it makes (27k calls in the kda-L1 segments case: 0.7 of 11.5 s of interpreted launches).
    The answer depends on the scalar dtype alone (a block's is its element's), which ``tl.dtype``
    compares by name; so a plain scalar dtype, or a block of one, is looked up by that name, the entry
    filled by Triton's function on first use. Anything else (pointers, blocks of pointers) goes to
    Triton's function as before.
    """
    get, tl = getattr(interp, "_get_np_dtype", None), getattr(interp, "tl", None)
    if get is None or tl is None or getattr(get, "_linattn", False):
        return False
    plain, block = tl.dtype, tl.block_type
    by_name: dict = {}

    def get_np_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if type(tt_dtype) is block else tt_dtype
        if type(scalar) is not plain:
            return get(tt_dtype)
        got = by_name.get(scalar.name)
        if got is None:
            got = by_name[scalar.name] = get(scalar)
        return got

    get_np_dtype._linattn = True
    interp._get_np_dtype = get_np_dtype
    return True


def _overflow_checks_only_where_asserted(interp) -> bool:
    """Skip the interpreter's integer-overflow sanitizer where its verdict is thrown away.

    Every int32 ``+``, ``-``, ``*`` in a kernel (``sanitize_overflow=True`` by default) runs
    ``TritonSemantic.binary_op_sanitize_overflow_impl``: both operands cast to int64, the op again,
    two compares and an ``and`` against int32's bounds, then ``device_assert`` of the result, which
    returns at once unless the builder's options have ``debug`` (the interpreter's
    ``InterpreterOptions()``: never). So under the interpreter the check builds five tensors per
    integer op and asserts nothing: about 40% of an interpreted launch's time (cProfile of
    tests/prefill/test_prefill_segments.py's kda-L1 case: 8.3 of 20.5 s). Where ``debug`` is off the
    patched method returns before that work (the kernel's values and every assertion are as before);
    where it is on, Triton's own code runs. Only the interpreter's semantic object is patched.
    """
    semantic = getattr(interp, "interpreter_semantic", None)
    sanitize = getattr(type(semantic), "binary_op_sanitize_overflow_impl", None)
    if semantic is None or sanitize is None or "binary_op_sanitize_overflow_impl" in vars(semantic):
        return False

    def sanitize_where_asserted(lhs, rhs, binary_op):
        if not semantic.builder.options.debug:  # device_assert would drop the condition unread
            return None
        return sanitize(semantic, lhs, rhs, binary_op)

    semantic.binary_op_sanitize_overflow_impl = sanitize_where_asserted
    return True


def _patch_lang_once_per_launch(interp) -> bool:
    """Wrap the interpreter's ``_patch_lang`` and ``GridExecutor.__call__`` (module docstring); False
    where this Triton has not got them (nothing changed)."""
    grid_executor = getattr(interp, "GridExecutor", None)
    patch_lang, scope_cls = getattr(interp, "_patch_lang", None), getattr(interp, "_LangPatchScope", None)
    if grid_executor is None or patch_lang is None or scope_cls is None or getattr(patch_lang, "_linattn", False):
        return False
    lang_modules = (interp.tl, interp.tl.core)
    seen: dict = {}  # id(a function's globals) -> (those globals, the language modules among them)

    def langs_of(fn) -> frozenset:
        g = fn.__globals__
        got = seen.get(id(g))
        if got is None or got[0] is not g:  # the dict itself is held: an id is never reused under us
            got = seen[id(g)] = (g, frozenset(id(v) for v in g.values() if inspect.ismodule(v) and v in lang_modules))
        return got[1]

    def once_per_launch(fn):
        done = getattr(_STATE, "langs", None)
        want = langs_of(fn)
        if done is not None and want and want <= done:
            return scope_cls()  # already patched for this launch: nothing to do, nothing to restore
        scope = patch_lang(fn)
        if done is not None:
            done |= want
        return scope

    launch = grid_executor.__call__

    def launch_patched_once(self, *args, **kwargs):
        outer = getattr(_STATE, "langs", None)
        _STATE.langs = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _STATE.langs = outer

    once_per_launch._linattn = True
    interp._patch_lang = once_per_launch
    grid_executor.__call__ = launch_patched_once
    return True
