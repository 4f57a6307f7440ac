"""One way to launch a ``@triton.jit`` kernel: :func:`launch`, with a fast path.

Every launcher in ``kernels/triton/`` goes through :func:`launch` with the kernel's runtime
arguments positional (in the kernel's parameter order) and its constexprs by keyword.

The fast path. A call through ``kernel[grid](...)`` binds the arguments, computes Triton's
specialization key (dtype and 16-byte alignment of every pointer, ``== 1`` and divisibility by 16
of every integer), looks the compiled kernel up and builds launch metadata: host work of the
order of the kernel launch itself. :func:`launch` does that once per *launch key* and keeps the
:class:`triton.compiler.CompiledKernel` Triton returned; later calls with the same key call the
compiled kernel's launcher directly. The launch key holds every fact Triton specializes on: the
constexprs and launch options, each pointer argument's dtype and alignment class, each integer's
class (:func:`_int_class`: the value 1, else its width and whether it is a multiple of 16, not its
value) and each other scalar's type, so a key hit is exactly a case in which Triton would have
picked the same compiled kernel. The compiled kernels of :func:`launch` are kept in a plain dict of
at most :data:`~linattn.dispatch.lru.COMPILED_LAUNCHES_MAX` entries that drops the entry stored
longest ago when full (first in, first out; not an LRU: the LRU's reordering on every hit costs
about 0.3 us per launch, see ``dispatch/lru.py``).

It touches Triton internals (``CompiledKernel.run``, ``function``, ``packed_metadata``, the launch
hook chains), which change between Triton versions, so it is taken only on the versions in
:data:`FAST_LAUNCH_TRITON_VERSIONS` (the ones it is tested on, compiled on an H200), on a CUDA
device (not ROCm: Triton's HIP backend also specializes each tensor on whether its storage is
under 2 GiB, a fact the launch keys do not hold), outside the interpreter, with no launch hooks or pre-run hooks installed and
``TRITON_DEBUG`` off, and unless ``LINATTN_FAST_LAUNCH=0``. Everywhere else it is the ordinary
launch. :func:`fast_launch_status` says which, and why.

Recorded launches. Inside :func:`recording`, :func:`launch` on that thread records each launch
(:class:`LaunchRecord`) instead of making it; a :class:`LaunchSequence` replays the launches of
one recorded call on a later call's tensors, with every argument that is not one of the call's
tensors (integers, floats, None, constexprs, launch options) kept as recorded. The chunked
prefill (:mod:`.prefill`) records its stages once per call signature and replays them so.

Replay steps. A launch that is not a ``@triton.jit`` kernel's (a compiled CuTe DSL function) goes
through :func:`launch_step` with a :class:`ReplayStep`: outside :func:`recording` the step runs at
once; inside, a :class:`StepRecord` is recorded, and :func:`replay_sequence` makes of such records
a :class:`SteppedSequence` (runs of Triton launches, each a :class:`LaunchSequence`, and the steps
between them, in the recorded order), whose replay maps a step's tensor arguments onto the later
call's sources by the same rules as a Triton launch's. A call of Triton launches only is replayed
by a plain :class:`LaunchSequence`, as before steps existed.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Protocol

import torch

from linattn.dispatch.lru import COMPILED_LAUNCHES_MAX

#: Triton versions whose launcher internals the fast path was written against and tested on.
FAST_LAUNCH_TRITON_VERSIONS = frozenset({"3.6.0"})

_Tensor = torch.Tensor
_compiled: dict = {}  # launch key -> (CompiledKernel, order of the full argument tuple); insertion order
_COMPILED_MAX = COMPILED_LAUNCHES_MAX  # first in, first out beyond it (module docstring)
_status: Optional[tuple[bool, str]] = None
#: When a list: every direct launch appends ``(compiled kernel, grid, device, full arguments)``
#: (``benchmarks/host_overhead.py`` replays them as the bare-launch floor; the contract tests count them).
direct_launch_log: Optional[list] = None
_log_kept: list = []  # buffers whose addresses the entries of _log_kept_for hold (LaunchSequence)
_log_kept_for: Optional[list] = None
_recording = threading.local()  # .records: the list :func:`launch` appends to on this thread, or None
_recordings = 0  # how many recording() blocks are open (any thread): launch() looks no further when 0
_recordings_lock = threading.Lock()


def fast_launch_status() -> tuple[bool, str]:
    """``(enabled, why)``: whether :func:`launch` may take the fast path in this process.

    Decided once per process from the Triton version, the interpreter setting, the device kind
    (CUDA, not ROCm) and ``LINATTN_FAST_LAUNCH``; launch hooks and ``TRITON_DEBUG`` are checked on every call.
    """
    global _status
    if _status is None:
        _status = _decide_status()
    return _status


def _decide_status() -> tuple[bool, str]:
    from linattn.dispatch.env import env_switch

    if not env_switch("LINATTN_FAST_LAUNCH", True):
        return False, "LINATTN_FAST_LAUNCH=0"
    try:
        import triton
    except ImportError:
        return False, "triton is not installed"
    if triton.__version__ not in FAST_LAUNCH_TRITON_VERSIONS:
        return False, (f"triton {triton.__version__} is not among the versions the fast path is tested on "
                       f"({', '.join(sorted(FAST_LAUNCH_TRITON_VERSIONS))}): ordinary launches")
    from linattn.capabilities import interpreter_enabled

    if interpreter_enabled():
        return False, "TRITON_INTERPRET=1: the interpreter runs kernels in Python (ordinary launches)"
    if getattr(torch.version, "hip", None):
        return False, (f"ROCm (torch.version.hip={torch.version.hip}): Triton's HIP backend specializes each "
                       "tensor on whether its storage is under 2 GiB (buffer ops), which the launch keys do "
                       "not hold: ordinary launches")
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch: ordinary launches"
    return True, f"triton {triton.__version__}: compiled kernels are launched directly once their key is known"


def reset_fast_launch() -> None:
    """Forget the cached compiled kernels and re-decide :func:`fast_launch_status` (tests)."""
    global _status
    _compiled.clear()
    _status = None


def _hooks_installed(kernel) -> bool:
    knobs = _knobs or _import_knobs()
    rt = knobs.runtime
    return bool(rt.debug or rt.launch_enter_hook.calls or rt.launch_exit_hook.calls or kernel.pre_run_hooks
                or knobs.compilation.instrumentation_mode)


_knobs = None  # triton.knobs, imported on the first launch


def _import_knobs():
    global _knobs
    from triton import knobs

    _knobs = knobs
    return knobs


def _current_device() -> int:
    """``torch.cuda.current_device()`` without its Python wrapper (CUDA is initialised once a
    kernel has been launched through the ordinary path)."""
    return torch._C._cuda_getDevice()


def _int_class(a: int):
    """What Triton 3.6 specializes an int argument on (``native_specialize_impl``): the value 1 (a
    constant), else its type by range (i32, i64, u64) and whether it is a multiple of 16. One
    compiled kernel serves every int of a class, so a new T or N (a prefill's token and chunk
    counts, a decode batch) reuses the compiled kernel of the last one instead of taking Triton's
    ordinary launch (issue 28)."""
    if a == 1:
        return 1
    return (a & 15 == 0, -2147483648 <= a <= 2147483647, a < 9223372036854775808)


def _launch_key(kernel, args: tuple, constexprs: dict, options: tuple, device: int) -> tuple:
    key = [kernel, device, options]
    append = key.append
    for a in args:
        cls = a.__class__
        if cls is int:  # by what Triton specializes on (1, % 16, width), not the value: _int_class
            append(_int_class(a))
        elif cls is bool:  # typed i1, not as the int of the same value (True == 1 in a tuple)
            append((bool, a))
        elif cls is _Tensor or isinstance(a, _Tensor):
            append(a.dtype)
            append(a.data_ptr() & 15 == 0)
        elif a is None:  # a constexpr None
            append(None)
        elif isinstance(a, int):  # an int subclass: as Triton binds it, its int value
            append(_int_class(int(a)))
        else:  # float (never specialized) and other scalars: by type
            append(cls)
    for item in constexprs.items():
        append(item)
    return tuple(key)


def _same_specialization(new: tuple, old: tuple) -> bool:
    """Whether the scalars ``new`` and ``old`` (as long) are keyed alike by :func:`_launch_key`: the
    same object or two equal ints (most scalars of a new T or N, e.g. strides and the pool's slot
    count) without building a key, the others compared through it."""
    for a, b in zip(new, old):
        if a is b or (a.__class__ is int and b.__class__ is int and (a == b or _int_class(a) == _int_class(b))):
            continue
        if _launch_key(None, (a,), {}, (), 0) != _launch_key(None, (b,), {}, (), 0):
            return False
    return True


def _argument_order(kernel, n_args: int, constexprs: dict) -> Optional[tuple]:
    """Positions of the full argument tuple Triton's launcher takes (all parameters in order):
    an int is an index into ``args``, a 1-tuple a constant. None if a parameter is neither
    given nor defaulted (the ordinary launch then raises Triton's own error)."""
    order, pos = [], 0
    for p in kernel.params:
        if p.name in constexprs:
            order.append((constexprs[p.name],))
        elif pos < n_args and not p.is_constexpr:
            order.append(pos)
            pos += 1
        elif p.has_default:
            order.append((p.default,))
        else:
            return None
    return tuple(order) if pos == n_args else None


def _store_compiled(key: tuple, entry: tuple) -> None:
    """Keep ``entry`` under ``key`` in :data:`_compiled`, dropping the entries stored longest ago
    beyond :data:`_COMPILED_MAX` one at a time (a hit costs a plain dict lookup; module docstring)."""
    _compiled[key] = entry
    while len(_compiled) > _COMPILED_MAX:
        try:
            del _compiled[next(iter(_compiled))]
        except (KeyError, StopIteration, RuntimeError):  # changed by another thread meanwhile
            break


def launch(kernel, grid: tuple, args: tuple, constexprs: dict, *, num_warps: int,
           num_stages: Optional[int] = None) -> None:
    """Launch ``kernel`` on ``grid`` (fast path when :func:`fast_launch_status` allows; module docstring).

    Args:
        kernel: a ``@triton.jit`` function.
        grid: the launch grid, 1 to 3 ints.
        args: the runtime (non-constexpr) arguments, in the kernel's parameter order.
        constexprs: the constexpr arguments by name.
        num_warps, num_stages: Triton launch options (``num_stages=None``: Triton's default).
    """
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    if _recordings and getattr(_recording, "records", None) is not None:
        _recording.records.append(LaunchRecord(kernel, tuple(grid), tuple(args), dict(constexprs), options))
        return
    if not fast_launch_status()[0] or _hooks_installed(kernel):
        kernel[grid](*args, **constexprs, **options)
        return
    device = _current_device()
    key = _launch_key(kernel, args, constexprs, (num_warps, num_stages), device)
    hit = _compiled.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **constexprs, **options)  # ordinary launch; Triton compiles or looks up
        order = _argument_order(kernel, len(args), constexprs)
        if compiled is not None and order is not None and hasattr(compiled, "packed_metadata"):
            _store_compiled(key, (compiled, order))
        return
    compiled, order = hit
    full = [args[i] if i.__class__ is int else i[0] for i in order]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    if direct_launch_log is not None:
        direct_launch_log.append((compiled, (grid[0], g1, g2), device, tuple(full)))
    compiled.run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *full)


#: the key of a :class:`PreparedLaunch`'s compiled kernels under which the rest of its argument
#: tuple after the scalars (constexprs, defaults) is kept, for the launches that share them
_REST = object()


class PreparedLaunch:
    """A launch of one kernel whose grid, constexprs, options and trailing scalar arguments are
    fixed, so that only the leading tensor arguments change from call to call (a launch planned
    from a call's metadata, e.g. :class:`~linattn.kernels.triton.decode.DecodeLaunch`).

    The tensors' dtypes, like the scalars, are those the launch was planned for (a
    ``DecodeLaunch`` is planned per call key, which fixes them); its compiled kernels are keyed by
    the device and whether each pointer is 16-byte aligned (which Triton
    specializes on), the only facts that may still change. The rest of the full argument tuple
    is built once. The conditions of :func:`fast_launch_status` apply as to :func:`launch`.

    Args:
        kernel: a ``@triton.jit`` function whose runtime parameters come first: the tensors, then
            the scalars, then the constexprs.
        grid: the launch grid. constexprs: by name. scalars: the non-tensor runtime arguments.
        num_warps, num_stages: launch options.
    """

    __slots__ = ("kernel", "grid", "constexprs", "scalars", "options", "_compiled", "_tail", "_grid3", "_opts")

    def __init__(self, kernel, grid: tuple, constexprs: dict, scalars: tuple, *, num_warps: int,
                 num_stages: Optional[int] = None):
        self.kernel, self.grid, self.constexprs, self.scalars = kernel, grid, constexprs, scalars
        self.options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
        self._compiled: dict = {}
        self._tail: Optional[tuple] = None  # the full argument tuple after the tensors; None until known
        self._grid3 = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        self._opts = (num_warps, num_stages)

    def with_grid(self, grid: tuple) -> "PreparedLaunch":
        """This launch on another grid (a decode batch of another size): the same kernel, constexprs,
        options and scalars, so it shares this launch's compiled kernels (the grid is no part of
        Triton's specialization)."""
        new = PreparedLaunch.__new__(PreparedLaunch)
        for name in PreparedLaunch.__slots__:
            setattr(new, name, getattr(self, name))
        new.grid, new._grid3 = grid, (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        return new

    def with_scalars(self, scalars: tuple, grid: Optional[tuple] = None) -> "PreparedLaunch":
        """This launch with other trailing scalars (and grid, if given): the same kernel, constexprs
        and options. Where every scalar is of the same Triton specialization as this launch's (an int
        by :func:`_int_class`, any other by its type), it shares this launch's compiled kernels and
        argument order, so its first call launches them directly (a value check of a new T or N,
        issue 28); else it starts without them, as a new launch does."""
        old = self.scalars
        new = self.with_grid(grid if grid is not None else self.grid)
        new.scalars = scalars
        if len(scalars) != len(old):
            new._compiled, new._tail = {}, None
            return new
        if not _same_specialization(scalars, old):
            new._compiled = {}
        if self._tail is not None:  # the positions after the scalars are the constexprs' and defaults'
            new._tail = scalars + self._tail[len(old):]
        return new

    def _full_tail(self, n_tensors: int) -> Optional[tuple]:
        order = _argument_order(self.kernel, n_tensors + len(self.scalars), self.constexprs)
        if order is None or order[:n_tensors + len(self.scalars)] != tuple(range(n_tensors + len(self.scalars))):
            return None
        return self.scalars + tuple(c[0] for c in order[n_tensors + len(self.scalars):])

    def __call__(self, tensors: tuple) -> None:
        if not fast_launch_status()[0] or _hooks_installed(self.kernel):
            self.kernel[self.grid](*tensors, *self.scalars, **self.constexprs, **self.options)
            return
        device = _current_device()
        key = (device, *[(t.data_ptr() & 15) == 0 for t in tensors])  # the dtypes are fixed (class docstring)
        compiled = self._compiled.get(key)
        if compiled is not None and self._tail is None:  # compiled by a launch it shares them with (with_scalars)
            self._tail = self.scalars + self._compiled[_REST]
        if compiled is None:
            if self._tail is None:
                self._tail = self._full_tail(len(tensors))
            # a launch of another plan with the same specialization (e.g. another decode batch size) may
            # have compiled it already: launch()'s cache, keyed by what Triton specializes on
            args = (*tensors, *self.scalars)
            shared = _launch_key(self.kernel, args, self.constexprs, self._opts, device)
            hit = _compiled.get(shared)
            if hit is None or self._tail is None:
                compiled = self.kernel[self.grid](*args, **self.constexprs, **self.options)
                if compiled is not None and self._tail is not None and hasattr(compiled, "packed_metadata"):
                    self._compiled[_REST] = self._tail[len(self.scalars):]
                    self._compiled[key] = compiled
                    order = _argument_order(self.kernel, len(args), self.constexprs)
                    if order is not None:
                        _store_compiled(shared, (compiled, order))
                return
            self._compiled[_REST] = self._tail[len(self.scalars):]
            compiled = self._compiled[key] = hit[0]
        g0, g1, g2 = self._grid3
        if direct_launch_log is not None:
            direct_launch_log.append((compiled, self._grid3, device, (*tensors, *self._tail)))
        compiled.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *tensors, *self._tail)


# -- recorded launches -------------------------------------------------------------------------

class NotReplayable(ValueError):
    """A recorded call that a :class:`LaunchSequence` cannot replay (its message says why)."""


class LaunchRecord(NamedTuple):
    """One launch :func:`launch` recorded instead of made (:func:`recording`): the kernel, its grid,
    its runtime arguments in parameter order, its constexprs by name and its launch options
    (``num_warps``, and ``num_stages`` where given)."""

    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    options: dict


@contextlib.contextmanager
def recording():
    """Within the block, :func:`launch` on this thread appends a :class:`LaunchRecord` (and
    :func:`launch_step` a :class:`StepRecord`) to the list it yields and launches nothing (other
    threads launch as usual). Blocks may nest: the inner one records, the outer one resumes after it.

    Example:
        >>> with recording() as records:
        ...     pass  # a launcher's launch() calls land in records
        >>> records
        []
    """
    global _recordings
    outer = getattr(_recording, "records", None)
    _recording.records = records = []
    with _recordings_lock:
        _recordings += 1
    try:
        yield records
    finally:
        with _recordings_lock:
            _recordings -= 1
        _recording.records = outer


def _picker(positions: list) -> Callable[[tuple], tuple]:
    """A function that returns ``tuple(t[i] for i in positions)`` (one C call for two or more)."""
    if len(positions) == 1:
        i = positions[0]
        return lambda t: (t[i],)
    if not positions:
        return lambda t: ()
    return operator.itemgetter(*positions)


def _hooks_installed_any(kernels: tuple) -> bool:
    """:func:`_hooks_installed` for several kernels, the process-wide knobs read once."""
    knobs = _knobs or _import_knobs()
    rt = knobs.runtime
    if rt.debug or rt.launch_enter_hook.calls or rt.launch_exit_hook.calls or knobs.compilation.instrumentation_mode:
        return True
    for k in kernels:  # a loop, not any() over a generator: about 1 us less per replayed prefill
        if k.pre_run_hooks:
            return True
    return False


def _keep_while_logged(buffer) -> None:
    """Keep ``buffer`` alive as long as :data:`direct_launch_log` is the list whose entries point into it."""
    global _log_kept_for
    if _log_kept_for is not direct_launch_log:
        _log_kept.clear()
        _log_kept_for = direct_launch_log
    _log_kept.append(buffer)


def _source_position(a, where: dict, const: Callable[[object], int]) -> int:
    """Where a recorded argument ``a`` comes from on replay: the position of one of the call's
    tensors (``where``: id -> position), or, for a tensor holding no element and for every other
    value, the position ``const(a)`` gives it among the kept constants.

    Raises:
        NotReplayable: ``a`` is a tensor with elements (or a ``meta`` stand-in) that is none of the sources.
    """
    if isinstance(a, _Tensor):
        i = where.get(id(a))
        if i is not None:
            return i
        if a.numel() or a.device.type == "meta":
            raise NotReplayable(f"a launch argument of shape {tuple(a.shape)} is none of the call's tensors")
    return const(a)


class _ReplayedLaunch(NamedTuple):
    """One launch of a :class:`LaunchSequence`: a :class:`LaunchRecord` without its arguments."""

    kernel: object
    grid: tuple
    constexprs: dict
    options: dict
    n_args: int


class LaunchSequence:
    """The launches of one recorded call (:func:`recording`), replayed on a later call's tensors.

    A recorded tensor argument must be one of ``sources`` (by identity), and is then taken from the
    same position of the later call's sources; or it must hold no element (nothing is read through
    it), and is then kept as recorded, as is every other argument (integers, floats, None), the
    constexprs and the launch options. So the later call's kernels, integer arguments and
    constexprs are the recorded ones: equal only where the later call's signature (dtypes, shapes,
    strides, scalars) is the recorded call's, which the caller keys on.

    Launches: the conditions of :func:`fast_launch_status` as in :func:`launch`. Fast, and once the
    compiled kernels of the call's ``key`` are known, each kernel's launcher is called directly with
    the argument tuple picked from the sources; else every launch is Triton's ordinary
    ``kernel[grid](...)``, whose compiled kernels are kept under ``(device, key)``.

    Args:
        records: the recorded launches of one call, in order.
        sources: the tensors that call launched on, in a fixed order (None where absent).
    Raises:
        NotReplayable: a recorded tensor argument is neither among ``sources`` nor empty (a tensor
            the launcher made itself, which a replay would not make), or one tensor is at two
            positions of ``sources`` (a later call may pass two there).
    """

    __slots__ = ("launches", "kernels", "_n", "_consts", "_positions", "_args", "_full", "_grids", "_compiled")

    def __init__(self, records: list, sources: tuple):
        tensors = [s for s in sources if isinstance(s, _Tensor)]
        if len({id(t) for t in tensors}) != len(tensors):
            raise NotReplayable("one tensor at two source positions: a replay could not tell them apart")
        where = {id(s): i for i, s in enumerate(sources) if isinstance(s, _Tensor)}
        self._n, self._consts = len(sources), ()
        self._positions = tuple([_source_position(a, where, self._const) for a in r.args] for r in records)
        #: per launch ``(kernel, grid, constexprs, options, number of runtime arguments)``: the records
        #: without their arguments, so that the recorded call's tensors are not kept alive
        self.launches = tuple(_ReplayedLaunch(r.kernel, r.grid, r.constexprs, r.options, len(r.args))
                              for r in records)
        self.kernels = tuple(r.kernel for r in records)
        self._args = tuple(_picker(p) for p in self._positions)
        self._full: Optional[tuple] = None  # the launchers' argument pickers, made on the first direct launch
        self._grids = tuple((g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)
                            for g in (r.grid for r in records))
        self._compiled: dict = {}

    def _const(self, x) -> int:
        """The source position of a constant argument (after the per-call sources)."""
        self._consts += (x,)
        return self._n + len(self._consts) - 1

    def _full_pickers(self) -> Optional[tuple]:
        """Per launch, the picker of the full argument tuple the compiled kernel's launcher takes
        (every parameter in order, the constexprs included); None where a kernel's parameters do
        not match its recorded arguments (its launches stay ordinary)."""
        if self._full is None:
            full, consts = [], list(self._consts)  # the constants are kept only if every launch matches

            def const(x) -> int:
                consts.append(x)
                return self._n + len(consts) - 1
            for r, positions in zip(self.launches, self._positions):
                order = _argument_order(r.kernel, r.n_args, r.constexprs)
                if order is None:
                    return None
                full.append(_picker([positions[o] if o.__class__ is int else const(o[0]) for o in order]))
            self._consts = tuple(consts)  # before _full: a reader that sees _full sees these
            self._full = tuple(full)
        return self._full

    def __call__(self, key: tuple, sources: tuple, views: Optional[Callable[[], tuple]] = None,
                 keep=None) -> None:
        """Launch on ``sources`` (in the constructor's order).

        Args:
            key: the facts of the sources Triton specializes on besides the recorded ones: the
                16-byte alignment of each tensor's address (the caller's job).
            sources: the tensors, or, for the direct launch, a buffer's address (an int) in place
                of a tensor the caller allocated itself (its device is known).
            views: where ``sources`` holds addresses: returns them with the tensors instead, for
                Triton's ordinary launch (which types an argument by its dtype).
            keep: what must stay alive while :data:`direct_launch_log` holds the addresses.
        """
        fast = fast_launch_status()[0] and not _hooks_installed_any(self.kernels)
        if fast:
            device = _current_device()
            compiled = self._compiled.get((device, key))
            if compiled is None:
                compiled = self._shared((views() if views is not None else sources) + self._consts, device)
                if compiled is not None:
                    self._compiled[(device, key)] = compiled
            if compiled is not None:
                self._direct(compiled, sources + self._consts, device, keep)
                return
        tensors = (views() if views is not None else sources) + self._consts
        got = self._ordinary(tensors)
        if fast and all(hasattr(c, "packed_metadata") for c in got) and self._full_pickers() is not None:
            self._compiled[(device, key)] = tuple(got)
            self._share(got, tensors, device)

    def _share(self, compiled: list, sources: tuple, device: int) -> None:
        """Keep the compiled kernels of an ordinary replay in :func:`launch`'s cache too (for
        :meth:`_shared` of other sequences and for :func:`launch`)."""
        for ck, r, args in zip(compiled, self.launches, self._args):
            picked = args(sources)
            order = _argument_order(r.kernel, len(picked), r.constexprs)
            if order is not None:
                options = (r.options["num_warps"], r.options.get("num_stages"))
                _store_compiled(_launch_key(r.kernel, picked, r.constexprs, options, device), (ck, order))

    def _shared(self, sources: tuple, device: int) -> Optional[tuple]:
        """The compiled kernel of every launch from :func:`launch`'s cache, keyed by what Triton
        specializes on (so a sequence recorded for a new prefill bucket launches directly the kernels
        an earlier call compiled, issue 28), or None where one is not there (the ordinary launch then
        compiles or finds it). ``sources``: the tensors (not addresses) and the constants."""
        if self._full_pickers() is None:
            return None
        got = []
        for r, args in zip(self.launches, self._args):
            options = (r.options["num_warps"], r.options.get("num_stages"))
            hit = _compiled.get(_launch_key(r.kernel, args(sources), r.constexprs, options, device))
            if hit is None:
                return None
            got.append(hit[0])
        return tuple(got)

    def _ordinary(self, sources: tuple) -> list:
        out = []
        for r, args in zip(self.launches, self._args):
            out.append(r.kernel[r.grid](*args(sources), **r.constexprs, **r.options))
        return out

    def _direct(self, compiled: tuple, sources: tuple, device: int, keep) -> None:
        stream = torch._C._cuda_getCurrentRawStream(device)
        log = direct_launch_log
        for ck, grid, full in zip(compiled, self._grids, self._full):
            args = full(sources)
            if log is not None:
                log.append((ck, grid, device, args))
            ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, None, None, None, *args)
        if log is not None and keep is not None:
            _keep_while_logged(keep)


# -- launch options ------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchOptions:
    """Triton launch options of one kernel: warps, software-pipelining stages and an optional
    register cap per thread (None: the compiler's choice)."""

    num_warps: int
    num_stages: int
    maxnreg: Optional[int] = None

    def __post_init__(self):
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"num_warps must be a power of two up to 16 and num_stages >= 1; got {self}")


def launch_with(kernel, grid: tuple, args: tuple, constexprs: dict, opts: LaunchOptions) -> None:
    """:func:`launch` with ``opts``. A register cap goes among the keywords, which Triton
    takes as a compile option (:func:`launch` has no ``maxnreg`` option of its own)."""
    if opts.maxnreg is not None:
        constexprs = {**constexprs, "maxnreg": opts.maxnreg}
    launch(kernel, grid, args, constexprs, num_warps=opts.num_warps, num_stages=opts.num_stages)


# -- replay steps: launches that are not Triton's ----------------------------------------------

class ReplayStep(Protocol):
    """A launch that is not a ``@triton.jit`` kernel's (e.g. a compiled CuTe DSL function, see
    :class:`linattn.kernels.cutedsl.fused_walk.WalkStep`), made through :func:`launch_step` so that a
    recorded call replays it (:class:`SteppedSequence`).

    Everything the step's host side decides (the compiled function, its scalar arguments) is fixed
    when the step is made; a call gives only its arguments, in the order the step was launched with,
    each one of the recorded call's tensors taken from the later call (or a constant kept as
    recorded). A tensor argument may come as its address (an ``int``) where the replaying caller
    carved it from a workspace of its own (:class:`~linattn.kernels.triton.prefill.PrefillLaunch`'s
    buffers); the step launches on the current stream of its device, as Triton's launches do.
    """

    def __call__(self, args: tuple) -> None: ...


class StepRecord(NamedTuple):
    """One :class:`ReplayStep` :func:`launch_step` recorded instead of ran: the step and its arguments."""

    step: ReplayStep
    args: tuple


def launch_step(step: ReplayStep, args: tuple) -> None:
    """Run ``step`` on ``args``, or, inside :func:`recording` on this thread, record it
    (:class:`StepRecord`) and run nothing.

    Example:
        >>> with recording() as records:
        ...     launch_step(print, ("not run",))
        >>> records[0].args
        ('not run',)
    """
    if _recordings and getattr(_recording, "records", None) is not None:
        _recording.records.append(StepRecord(step, tuple(args)))
        return
    step(tuple(args))


def replay_sequence(records: list, sources: tuple):
    """What replays ``records`` on later calls' ``sources``: a :class:`LaunchSequence` where every
    record is a Triton launch (the host path measured in ``benchmarks/host_overhead*.py``, unchanged),
    else a :class:`SteppedSequence`. Raises :class:`NotReplayable` as they do."""
    if all(r.__class__ is LaunchRecord for r in records):
        return LaunchSequence(records, sources)
    return SteppedSequence(records, sources)


class _Step:
    """A :class:`StepRecord` of a :class:`SteppedSequence`: the step and the picker of its arguments."""

    __slots__ = ("step", "pick", "consts")

    def __init__(self, record: StepRecord, where: dict, n: int):
        consts: list = []

        def const(x) -> int:
            consts.append(x)
            return n + len(consts) - 1
        self.step = record.step
        self.pick = _picker([_source_position(a, where, const) for a in record.args])
        self.consts = tuple(consts)

    def __call__(self, key: tuple, sources: tuple, views, keep) -> None:
        self.step(self.pick(sources + self.consts))


class SteppedSequence:
    """The launches of a recorded call that holds :class:`ReplayStep` launches: each run of Triton
    launches between steps replayed by a :class:`LaunchSequence` (its compiled kernels, direct
    launch and ordinary fallback as there), each step called on its arguments picked from the later
    call's sources, in the recorded order. The step gets the sources as given (tensors, or the
    workspace addresses of a direct replay), not ``views``.

    Args and Raises: as :class:`LaunchSequence` (a step's argument is checked like a launch's).
    """

    __slots__ = ("parts", "launches", "kernels", "steps")

    def __init__(self, records: list, sources: tuple):
        tensors = [s for s in sources if isinstance(s, _Tensor)]
        if len({id(t) for t in tensors}) != len(tensors):
            raise NotReplayable("one tensor at two source positions: a replay could not tell them apart")
        where = {id(s): i for i, s in enumerate(sources) if isinstance(s, _Tensor)}
        parts, run = [], []
        for r in records:
            if r.__class__ is StepRecord:
                if run:
                    parts.append(LaunchSequence(run, sources))
                    run = []
                parts.append(_Step(r, where, len(sources)))
            else:
                run.append(r)
        if run:
            parts.append(LaunchSequence(run, sources))
        self.parts = tuple(parts)
        #: the Triton launches (as :attr:`LaunchSequence.launches`) and the steps, each in recorded order
        self.launches = tuple(x for p in parts if isinstance(p, LaunchSequence) for x in p.launches)
        self.kernels = tuple(x for p in parts if isinstance(p, LaunchSequence) for x in p.kernels)
        self.steps = tuple(p.step for p in parts if isinstance(p, _Step))

    def __call__(self, key: tuple, sources: tuple, views: Optional[Callable[[], tuple]] = None,
                 keep=None) -> None:
        """Launch on ``sources``; the arguments as :meth:`LaunchSequence.__call__`'s."""
        for part in self.parts:
            part(key, sources, views, keep)
