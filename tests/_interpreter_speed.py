"""Test-only speed-ups of Triton's interpreter: each leaves every value a kernel computes and every
check Triton makes as they were, and each is installed only where this Triton has the names it wraps
(:func:`install`; where a release lacks them the suite runs as before). Only the test suite installs
them (tests/conftest.py, under ``TRITON_INTERPRET=1``):

- one patch of ``triton.language`` per launch (:func:`_patch_lang_once_per_launch`);
- no integer-overflow sanitizer whose verdict is dropped (:func:`_overflow_checks_only_where_asserted`;
  effective under Triton 3.9, the main venv's: 3.6's launch gives each builtin its own semantic object,
  which this patch does not reach, so there the sanitizer runs as upstream, at no cost to correctness);
- numpy dtypes from a table (:func:`_np_dtype_table`);
- the per-shape parts of ``tl.tensor`` and ``tl.block_type`` computed once per shape (:func:`_shape_types_shared`;
  these classes are Triton's compiler's too, so the test process's sm_90 and AMD builds use them: equal
  values, and the sm_90 digests of the builds would show any change).

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

import hashlib
import inspect
import math
import threading

_STATE = threading.local()


def install() -> bool:
    """Install every patch below that this Triton has the names for; True where any was installed."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    return any([_patch_lang_once_per_launch(interp), _overflow_checks_only_where_asserted(interp),
                _np_dtype_table(interp), _shape_types_shared()])


#: sha256 (first 16 hex digits) of the source of each Triton function :func:`_shape_types_shared` either
#: replaces or copies the behaviour of; the same text in Triton 3.6 and 3.9. Another text: nothing installed.
_SHAPE_SOURCES = {
    "tensor.__init__": "d9b043b5c9897657",
    "block_type.__init__": "403f4b016ec5c2c3",
    "tuple.__init__": "404706e1c76b6342",
    "_type_for_tuple_values": "75a38abb5a89dee1",
    "tuple.__str__": "f0057a4d27701921",
    "validate_block_shape": "1ec5cac3579a1832",
    "_unwrap_shape": "7aef1215dd40c279",
}


def _shape_types_shared() -> bool:
    """``tl.tensor`` and ``tl.block_type`` construction with the per-shape parts computed once per shape.

    Every value the interpreter makes is a ``tl.tensor``, most with a ``tl.block_type``, and both hold
    their shape as a ``tl.tuple`` (core.py's ``tuple`` is Triton's class) whose ``tuple_type`` (one
    ``constexpr_type`` per dimension) is built anew each time; a block type also unwraps its shape
    through ``_unwrap_shape``, checks it (``validate_block_shape``: powers of two, the numel limit) and
    formats its name. Under cProfile that was 40 + 46 of 245 s of interpreted launches
    (tests/prefill/test_prefill_interp.py and tests/fuzz/test_fuzz_valid.py: 1.8M tensors, 1.1M block
    types); the kda segments case's call runs ~20% faster without it (the same bits out).

    Here each sets the same attributes to equal values in Triton's order, except that what depends
    on the shape alone comes from a table keyed by the dimensions: the ``tuple_type`` (equal by value;
    none is mutated: a tuple's ``_setitem`` assigns a new one), and a block type's numel and the shape's
    text in its name. A block type takes the table only for a ``list`` or ``tl.tuple`` of plain
    ``int`` dimensions, at least one (``_unwrap_shape`` returns those as they are); any other shape, an
    empty one included (Triton's ``TypeError``), goes to Triton's ``__init__``. A shape
    ``validate_block_shape`` refuses raises as before and enters no table. ``base_value`` has no
    ``__init__`` (a tensor's ``super().__init__()`` is object's). Installed only where each Triton
    function involved has the source :data:`_SHAPE_SOURCES` records (3.6, 3.9).
    """
    try:
        from triton.language import core
        funcs = {"tensor.__init__": core.tensor.__init__, "block_type.__init__": core.block_type.__init__,
                 "tuple.__init__": core.tuple.__init__, "_type_for_tuple_values": core._type_for_tuple_values,
                 "tuple.__str__": core.tuple.__str__, "validate_block_shape": core.validate_block_shape,
                 "_unwrap_shape": core._unwrap_shape}
        digests = {name: hashlib.sha256(inspect.getsource(f).encode()).hexdigest()[:16] for name, f in funcs.items()}
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if digests != _SHAPE_SOURCES or "__init__" in vars(core.base_value):
        return False
    tl_tuple, tuple_type, constexpr = core.tuple, core.tuple_type, core.constexpr
    block_init = core.block_type.__init__
    shape_types: dict = {}  # dims -> the tuple_type of a tensor's shape (constexpr dims)
    block_shapes: dict = {}  # dims -> (the tuple_type of a block type's shape (int dims), numel, shape text)

    def tensor_init(self, handle, type):  # noqa: A002 - Triton's parameter name
        self.handle = handle
        self.shape = shape = type.shape if type.is_block() else ()
        self.numel = constexpr(math.prod(shape))
        self.type = type
        self.dtype = type.scalar
        dims = [constexpr(s) for s in shape]
        key = tuple(d.value for d in dims)
        shape_type = shape_types.get(key)
        if shape_type is None:
            shape_type = shape_types[key] = tuple_type([d.type for d in dims])
        self.shape = tl_tuple(dims, shape_type)

    def block_type_init(self, element_ty, shape):
        kind = type(shape)
        if kind is list or kind is tl_tuple:
            dims = [d for d in shape]
            if dims and all(type(d) is int for d in dims):
                key = tuple(dims)
                known = block_shapes.get(key)
                if known is None:
                    first = tl_tuple(dims)
                    known = block_shapes[key] = (first.type, core.validate_block_shape(first), str(first))
                self.element_ty = element_ty
                self.shape = tl_tuple(dims, known[0])
                self.numel = known[1]
                self.name = f"<{known[2]}, {self.element_ty}>"
                return
        block_init(self, element_ty, shape)

    core.tensor.__init__ = tensor_init
    core.block_type.__init__ = block_type_init
    return True


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
