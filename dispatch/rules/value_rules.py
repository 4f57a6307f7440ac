"""Value rules of the validation layer: checks that read index and gate values on the device.

Each rule is ``rule(args, dims) -> list of probes``; a probe is a 0-d "bad" flag computed on the
device plus a zero-argument function that explains the failure by raising ``ValueError``.
:func:`_run_value_rules` brings every flag to the host in a single sync, and only a failing rule pays
for its diagnosis. Rules cover slot ranges, write-race duplicates, ``num_accepted_tokens``,
``cu_seqlens`` contents and the sign of prefill log decays (docs/ops.md).

On the CPU, where each torch op costs microseconds of host time, a rule whose tensors are CPU
tensors of at most :data:`HOST_MAX_ELEMENTS` elements is evaluated in plain Python from one
``.tolist()`` each (:func:`_host_remaining`); a rule that fails there sends every rule to the torch
probes, so the error raised (type, text, rule order) is always theirs. CUDA calls never take it
(no new syncs).

On a GPU each flag is a few torch ops, each a kernel launch. So on CUDA (unless
``LINATTN_FUSED_VALUE_CHECKS=0``: see :data:`FUSED_VALUE_CHECKS`), a cached call plan
(``dispatch/runtime/fast_path.py``) runs the decode rules, or the prefill rules (``gdn_prefill``,
``kda_prefill``), instead as one Triton kernel that computes every flag (``kernels/triton/value_checks.py``) and one sync
(:func:`fused_value_check`); a set flag runs the torch rules, so the error raised is always theirs.
The kernel is a hook the Triton backends provide (:class:`ValueCheckHook`, held by the registry):
this module imports no kernel.
The choice is made when a call plan is made: changing the variable takes effect for new call keys
(or after ``fast_path.clear()``).
"""

from __future__ import annotations

import math
import re
from typing import Callable

import torch

from ..env import env_switch
from .host_rules import Dims

Probe = tuple  # (0-d bool tensor: "this rule is violated", zero-arg function that raises)
ValueRule = Callable[[dict, Dims], list]


# -- message helpers -----------------------------------------------------------------------------

def _position(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def _pos_str(name: str, pos: tuple) -> str:
    return f"{name}[{', '.join(str(i) for i in pos)}]"


#: A position in a per-token input as the rules quote it (:func:`_pos_str`): ``g[7, 1]``, token first.
TOKEN_POSITION = re.compile(r"\b(q|k|v|g|beta)\[(\d+)((?:, \d+)*)\]")


def requote_token_positions(msg: str, token: Callable[[int], str]) -> str:
    """``msg`` with the token index of every :data:`TOKEN_POSITION` written as ``token(index)`` (the dims
    after it kept): the caller's numbering of a position the rules quoted in the op's packed ``[T, ...]``
    (``linattn.compat.fla``: ``[b, t]``; context parallelism: the global token)."""
    return TOKEN_POSITION.sub(lambda m: f"{m[1]}[{token(int(m[2]))}{m[3]}]", msg)


# -- probes shared by the rules ------------------------------------------------------------------

def _range_probe(idx: torch.Tensor, name: str, bound: int, what: str, source: str) -> list:
    """Entries must be < bound (negative entries mean padding / skip and are always legal)."""
    if idx.numel() == 0:
        return []
    bad = idx >= bound

    def explain():
        pos = _position(bad)
        raise ValueError(f"{_pos_str(name, pos)} = {int(idx[pos])} is out of range: valid {what} are "
                         f"0..{bound - 1} ({source} = {bound}); negative values mean padding (row "
                         f"skipped). Fix the index or allocate a larger buffer.")
    return [(bad.any(), explain)]


def _repeats(slots: torch.Tensor) -> torch.Tensor:
    """0-dim bool: a valid slot (``>= 0``) appears twice in ``slots`` (any shape; negative entries
    never count). One sort on the device, no sync."""
    keyed = slots.flatten().sort().values
    return ((keyed[1:] == keyed[:-1]) & (keyed[1:] >= 0)).any()


def _duplicate_probe(idx: torch.Tensor, name: str) -> list:
    """No valid slot may be named by two sequences (rows); a row may repeat its own slot."""
    table = idx if idx.dim() == 2 else idx.unsqueeze(1)
    if table.shape[0] < 2 or table.shape[1] == 0:
        return []
    if table.shape[1] == 1:
        flag = _repeats(idx)
    else:  # drop a row's repeats of its own slots, then look for a slot shared by two rows
        rows = table.sort(dim=1).values
        fresh = torch.ones_like(rows, dtype=torch.bool)
        fresh[:, 1:] = rows[:, 1:] != rows[:, :-1]
        flag = _repeats(torch.where(fresh & (rows >= 0), rows, -1))

    def explain():
        owner: dict[int, int] = {}
        for n, row in enumerate(table.cpu().tolist()):
            for slot in sorted({s for s in row if s >= 0}):
                if slot in owner:
                    raise ValueError(f"{name}: slot {slot} is named by sequence {owner[slot]} and "
                                     f"sequence {n}, and this call writes it (a write race); give each "
                                     f"sequence its own slot (or -1 for padding).")
                owner[slot] = n
        raise ValueError(f"{name}: a slot is named by two sequences (write race).")  # pragma: no cover
    return [(flag, explain)]


# -- the rules, one per argument group -----------------------------------------------------------

def _v_state_indices(args: dict, dims: Dims) -> list:
    idx = args["state_indices"]
    if idx is None:
        return []
    probes = _range_probe(idx, "state_indices", dims["p"], "slots", "state_pool.shape[0]")
    if dims["writes_pool"] and args.get("output_state_indices") is None:  # else only the written slots race
        probes += _duplicate_probe(idx, "state_indices")
    return probes


def _v_output_state_indices(args: dict, dims: Dims) -> list:
    """Separate write slots (docs/ops.md "Separate read and write slots"): in range, padding on the
    same rows as ``state_indices``, no slot written by two sequences, and no slot read by one
    sequence and written by another (the kernels run sequences in parallel, so that read could see
    either state). A sequence may read and write one slot; a sequence that ``has_initial_state``
    marks fresh reads nothing, so its read slot does not count."""
    out = args.get("output_state_indices")
    if out is None or out.numel() == 0:
        return []
    src = args["state_indices"]
    probes = _range_probe(out, "output_state_indices", dims["p"], "slots", "state_pool.shape[0]")
    mixed = (src < 0) != (out < 0)

    def explain_mixed():
        n = _position(mixed)[0]
        raise ValueError(f"sequence {n}: state_indices[{n}] = {int(src[n])} and output_state_indices[{n}] = "
                         f"{int(out[n])}; padding (a negative index) must be on the same rows of both. To "
                         f"start a sequence from zeros and write a slot, pass a read slot with "
                         f"has_initial_state False (its slot is not read).")
    probes.append((mixed.any(), explain_mixed))
    probes += _duplicate_probe(out, "output_state_indices")
    reads = src if args.get("has_initial_state") is None else torch.where(args["has_initial_state"], src, -1)
    # contiguous: torch.searchsorted warns (UserWarning, once per process) on a strided state_indices view
    crossed = _read_written_elsewhere(reads.to(torch.int64).contiguous(), out.to(torch.int64))

    def explain_crossed():
        i = _position(crossed)[0]
        slot = int(reads[i])
        j = next(j for j, s in enumerate(out.tolist()) if s == slot and j != i)
        raise ValueError(f"slot {slot} is read by sequence {i} (state_indices[{i}]) and written by sequence "
                         f"{j} (output_state_indices[{j}]); sequences run in parallel, so the read could see "
                         f"the old or the new state. Give sequence {j} another write slot (or copy slot "
                         f"{slot} first); a sequence may read and write its own slot.")
    probes.append((crossed.any(), explain_crossed))
    return probes


def _v_checkpoints(args: dict, dims: Dims) -> list:
    """Checkpoint slots (docs/ops.md "State checkpoints"): in range (negative = no checkpoint), no slot
    written twice in the call (the checkpoints of every sequence and the final-state write slots,
    ``output_state_indices`` or else ``state_indices``, together), and none of them a slot that any
    sequence reads (``state_indices``): checkpoints are written while sequences run, in parallel."""
    table = args.get("checkpoint_indices")
    if table is None or table.numel() == 0:
        return []
    probes = _range_probe(table, "checkpoint_indices", dims["p"], "slots", "state_pool.shape[0]")
    reads = args["state_indices"].to(torch.int64).contiguous()
    out = args.get("output_state_indices")
    finals = reads if out is None else out.to(torch.int64)
    marks = table.to(torch.int64).flatten()
    twice = _repeats(torch.cat([marks, finals]))

    def explain_twice():
        owner: dict[int, str] = {}
        named = [(s, f"checkpoint_indices[{i // table.shape[1]}, {i % table.shape[1]}]")
                 for i, s in enumerate(marks.tolist())]
        named += [(s, f"{'state_indices' if out is None else 'output_state_indices'}[{n}] (a final state)")
                  for n, s in enumerate(finals.tolist())]
        for slot, where in named:
            if slot < 0:
                continue
            if slot in owner:
                raise ValueError(f"slot {slot} is written twice in this call: by {owner[slot]} and by {where}; "
                                 f"each checkpoint and each final state needs a slot of its own (-1 = no "
                                 f"checkpoint).")
            owner[slot] = where
        raise ValueError("checkpoint_indices: a slot is written twice in this call.")  # pragma: no cover
    probes.append((twice, explain_twice))
    read = _read_written_elsewhere(reads, marks, own=False)

    def explain_read():
        n = _position(read)[0]
        slot = int(reads[n])
        i = marks.tolist().index(slot)
        raise ValueError(f"slot {slot} is read by sequence {n} (state_indices[{n}]) and is also a checkpoint slot "
                         f"(checkpoint_indices[{i // table.shape[1]}, {i % table.shape[1]}]); sequences run in "
                         f"parallel, so the read could see the checkpoint. Checkpoint slots must be slots no "
                         f"sequence reads.")
    probes.append((read.any(), explain_read))
    return probes


def _read_written_elsewhere(reads: torch.Tensor, writes: torch.Tensor, own: bool = True) -> torch.Tensor:
    """``[N]`` bool: sequence ``i`` reads a slot (``reads[i] >= 0``) that another sequence writes
    (``own=False``: that any entry of ``writes`` names, whatever its position). Sort and binary search
    on the device (no sync, O(N log N)); with duplicate write slots (a separate rule) the writer found
    is one of them."""
    order = writes.sort()
    pos = torch.searchsorted(order.values, reads).clamp(max=writes.numel() - 1)
    found = order.values[pos] == reads
    writer = order.indices[pos]
    if not own:
        return found & (reads >= 0)
    rows = torch.arange(reads.numel(), device=reads.device)
    return found & (reads >= 0) & (writer != rows)


def _v_intermediate(args: dict, dims: Dims) -> list:
    idx = args["intermediate_state_indices"]
    if idx is None:
        return []
    return (_range_probe(idx, "intermediate_state_indices", dims["s"], "rows",
                          "intermediate_states.shape[0]")
            + _duplicate_probe(idx, "intermediate_state_indices"))


def _v_num_accepted(args: dict, dims: Dims) -> list:
    nat = args["num_accepted_tokens"]
    if nat is None or nat.numel() == 0:
        return []
    t = dims["t"]
    bad = (nat < 0) | (nat > t)

    def explain():
        pos = _position(bad)
        raise ValueError(f"{_pos_str('num_accepted_tokens', pos)} = {int(nat[pos])} is outside 0..{t} "
                         f"(T={t} tokens per sequence); pass a count of accepted tokens in 0..T.")
    return [(bad.any(), explain)]


def _v_cu_seqlens(args: dict, dims: Dims) -> list:
    cu, t = args["cu_seqlens"], dims["t"]
    drop = cu[1:] < cu[:-1]

    def start():
        raise ValueError(f"cu_seqlens[0] = {int(cu[0])}; it must be 0 (prefix sums of the sequence "
                         f"lengths). Prepend a 0.")

    def order():
        i = _position(drop)[0]
        raise ValueError(f"cu_seqlens must be non-decreasing, but cu_seqlens[{i + 1}] = {int(cu[i + 1])} "
                         f"< cu_seqlens[{i}] = {int(cu[i])}; pass prefix sums of non-negative lengths.")

    def end():
        raise ValueError(f"cu_seqlens[-1] = {int(cu[-1])} must equal the total token count T = {t} "
                         f"(q.shape[0]); check that cu_seqlens matches q, k and v.")
    return [(cu[0] != 0, start), (drop.any(), order), (cu[-1] != t, end)]


def _v_log_decay(args: dict, dims: Dims) -> list:
    """Prefill gates are log decays (docs/ops.md): ``g <= 0`` and not NaN (a positive g grows the state)."""
    g = args["g"]
    if g.numel() == 0:
        return []
    bad = ~(g <= 0)  # also true for NaN

    def explain():
        pos = _position(bad)
        raise ValueError(f"{_pos_str('g', pos)} = {float(g[pos])}: g is a log-space decay and must be <= 0 "
                         f"(and not NaN); compute it with gdn_gating / kda_gating (g = -exp(A_log) * softplus)")
    return [(bad.any(), explain)]


def _v_decode_log_decay(args: dict, dims: Dims) -> list:
    """Decode's precomputed ``g`` (gate form) is a log decay like prefill's: ``g <= 0``, not NaN.
    ``beta`` is not range-checked (OLMo's configuration passes beta in (0, 2))."""
    return [] if args.get("g") is None else _v_log_decay(args, dims)


def _finite_probe(x: torch.Tensor, name: str, why: str) -> list:
    if x.numel() == 0 or not x.is_floating_point():
        return []
    bad = ~torch.isfinite(x)

    def explain():
        pos = _position(bad)
        raise ValueError(f"{_pos_str(name, pos)} = {float(x[pos])} is not finite; {why}")
    return [(bad.any(), explain)]


def _v_shared_gate_params(args: dict, dims: Dims) -> list:
    """Decode's per-head ``A_log`` and ``dt_bias`` are shared by every sequence: a NaN or inf there
    would poison every row's slot, so they are always checked (they are tiny)."""
    if args.get("A_log") is None:  # the precomputed-gate form: no shared gate parameters
        return []
    why = ("A_log and dt_bias are shared by every sequence of the call, so a non-finite value would "
           "poison every slot it updates; fix the model's parameters (they are never refused per row)")
    return _finite_probe(args["A_log"], "A_log", why) + _finite_probe(args["dt_bias"], "dt_bias", why)


def _v_finite_inputs(written: tuple) -> ValueRule:
    """The ``check_finite=True`` rule: every floating-point tensor the op reads (not the buffers it
    writes, whose unused rows may hold anything) is finite."""

    def rule(args: dict, dims: Dims) -> list:
        why = ("check_finite=True refuses non-finite inputs before launch; without it a non-finite "
               "per-sequence input only reaches that sequence's outputs and slot (docs/ops-decisions.md)")
        probes = []
        for name, x in args.items():
            if name not in written and isinstance(x, torch.Tensor):
                probes += _finite_probe(x, name, why)
        return probes
    return rule


# -- the same rules on the host, for small CPU tensors -------------------------------------------

#: Largest tensor (elements) the host path reads with one ``.tolist()``; a rule reading a larger one,
#: or a tensor not on the CPU, keeps its torch probes. The state-slot rule's host form costs as much
#: as its torch probes at about 1,024 slots and a third of them at 256 (a [64, 4] table: also a third;
#: benchmarks/value_rules_host.py, docs/performance.md), so 256 keeps a margin for the loaded host.
HOST_MAX_ELEMENTS = 256
#: False: every rule runs as torch probes (tests compare the fused kernel with them).
HOST_VALUE_RULES = True


class _Defer(Exception):
    """The host path cannot read this tensor (not on the CPU, too large, an unexpected shape)."""


def _host(x, flat: bool = False):
    """``x``'s values as Python numbers (nested lists; ``flat``: one list), or None for None."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu" or x.numel() > HOST_MAX_ELEMENTS:
        raise _Defer
    return x.flatten().tolist() if flat else x.tolist()


def _host_1d(x):
    if x is not None and x.dim() != 1:
        raise _Defer
    return _host(x)


def _h_shared(table) -> bool:
    """A valid slot (>= 0) named by two rows of ``table`` (``_duplicate_probe``'s rule)."""
    if not table or not isinstance(table[0], list):  # one slot a row
        return _h_repeats(table)
    seen: set = set()
    for row in table:
        row = {s for s in (row if isinstance(row, list) else [row]) if s >= 0}
        if seen & row:
            return True
        seen |= row
    return False


def _h_repeats(values) -> bool:
    valid = [s for s in values if s >= 0]
    return len(set(valid)) != len(valid)


def _h_state_indices(args: dict, dims: Dims) -> bool:
    idx = args["state_indices"]
    if idx is None:
        return True
    v = _host(idx)
    if max(v if idx.dim() == 1 else _host(idx, flat=True), default=-1) >= dims["p"]:  # one read for [N]
        return False
    return not (dims["writes_pool"] and args.get("output_state_indices") is None and _h_shared(v))


def _h_output_state_indices(args: dict, dims: Dims) -> bool:
    out = _host_1d(args.get("output_state_indices"))
    if not out:
        return True
    src, init = _host_1d(args["state_indices"]), _host_1d(args.get("has_initial_state"))
    if len(src) != len(out) or (init is not None and len(init) != len(out)):
        raise _Defer
    if max(out) >= dims["p"] or any((s < 0) != (o < 0) for s, o in zip(src, out)) or _h_shared(out):
        return False
    reads = src if init is None else [s if i else -1 for s, i in zip(src, init)]
    writer = {o: j for j, o in enumerate(out)}  # no repeats here (checked above)
    return not any(r >= 0 and writer.get(r, i) != i for i, r in enumerate(reads))


def _h_checkpoints(args: dict, dims: Dims) -> bool:
    table = args.get("checkpoint_indices")
    if table is None or table.numel() == 0:
        return True
    marks = _host(table, flat=True)
    reads = _host_1d(args["state_indices"])
    out = _host_1d(args.get("output_state_indices"))
    if max(marks) >= dims["p"] or _h_repeats(marks + (reads if out is None else out)):
        return False
    return not set(marks) & {r for r in reads if r >= 0}


def _h_intermediate(args: dict, dims: Dims) -> bool:
    idx = args["intermediate_state_indices"]
    if idx is None:
        return True
    return max(_host(idx, flat=True), default=-1) < dims["s"] and not _h_shared(_host(idx))


def _h_num_accepted(args: dict, dims: Dims) -> bool:
    nat = args["num_accepted_tokens"]
    return nat is None or all(0 <= n <= dims["t"] for n in _host(nat, flat=True))


def _h_cu_seqlens(args: dict, dims: Dims) -> bool:
    cu = _host_1d(args["cu_seqlens"])
    if not cu:
        raise _Defer
    return cu[0] == 0 and cu[-1] == dims["t"] and all(a <= b for a, b in zip(cu, cu[1:]))


#: A CPU float tensor of more elements than this is checked by one reduction (:func:`_h_log_decay`)
#: rather than read to the host element by element.
HOST_REDUCE_ELEMENTS = 32


def _h_log_decay(args: dict, dims: Dims) -> bool:
    """``g <= 0`` and not NaN: a small ``g`` read to the host; a larger CPU one (any size: a KDA
    decode's ``[N, 1, HV, K]``, a prefill's ``[T, HV]``) by its maximum, one reduction and one read
    instead of the torch rule's three operations (``max`` propagates NaN, and ``NaN <= 0`` is False,
    as in the torch rule)."""
    g = args["g"]
    if isinstance(g, torch.Tensor) and g.device.type == "cpu" and g.is_floating_point() and g.numel() > HOST_REDUCE_ELEMENTS:
        return g.max().item() <= 0
    return all(x <= 0 for x in _host(g, flat=True))  # False for NaN, as the torch rule


def _h_decode_log_decay(args: dict, dims: Dims) -> bool:
    return args.get("g") is None or _h_log_decay(args, dims)


def _h_finite(x) -> bool:
    return not x.is_floating_point() or all(map(math.isfinite, _host(x, flat=True)))


def _h_shared_gate_params(args: dict, dims: Dims) -> bool:
    return args.get("A_log") is None or (_h_finite(args["A_log"]) and _h_finite(args["dt_bias"]))


#: rule -> its host form: True when the rule passes; False when the torch rules must run (they
#: raise); :class:`_Defer` (or any error) when the host cannot read the values.
_HOST_FORMS = {_v_state_indices: _h_state_indices, _v_output_state_indices: _h_output_state_indices,
               _v_checkpoints: _h_checkpoints, _v_intermediate: _h_intermediate,
               _v_num_accepted: _h_num_accepted, _v_cu_seqlens: _h_cu_seqlens, _v_log_decay: _h_log_decay,
               _v_decode_log_decay: _h_decode_log_decay, _v_shared_gate_params: _h_shared_gate_params}


def _host_remaining(rules: tuple, args: dict, dims: Dims):
    """The rules still to run as torch probes after the host path: ``rules`` less those whose host
    form passed; all of ``rules`` as soon as one host form fails (the torch rules then raise the
    first failure in rule order, with its message). CUDA devices keep every rule (no new syncs)."""
    dev = dims.get("device")
    if not HOST_VALUE_RULES or (dev is not None and dev.type != "cpu"):
        return rules
    left = []
    for rule in rules:
        form = _HOST_FORMS.get(rule)
        if form is None:
            left.append(rule)
            continue
        try:
            ok = form(args, dims)
        except Exception:  # _Defer, or values the host form does not expect: the torch probes decide
            left.append(rule)
            continue
        if not ok:
            return rules
    return tuple(left)


#: rule -> the argument without which it probes nothing: the rule returns no probe (and its host form
#: passes) when that argument is None, whatever the other arguments hold (each rule's first lines).
_NEEDS = {_v_state_indices: "state_indices", _v_output_state_indices: "output_state_indices",
          _v_checkpoints: "checkpoint_indices", _v_intermediate: "intermediate_state_indices",
          _v_num_accepted: "num_accepted_tokens", _v_decode_log_decay: "g", _v_shared_gate_params: "A_log"}


def live_rules(rules: tuple, args: dict, dims: Dims) -> tuple:
    """``rules`` less those that probe nothing for a call with ``args``' None arguments (:data:`_NEEDS`),
    on the CPU (where each rule is Python run per call); a call plan keeps them for every later call with
    its key, which holds which arguments are None. Other devices keep every rule (the fused check is
    planned from the whole set, as before)."""
    dev = dims.get("device")
    if dev is None or dev.type != "cpu":
        return rules
    return tuple(r for r in rules if r not in _NEEDS or args.get(_NEEDS[r]) is not None)


# -- the single sync -----------------------------------------------------------------------------

def _run_value_rules(rules: tuple, args: dict, dims: Dims, refuse_in_capture: str | None = None) -> None:
    """Run ``rules`` and raise the first failure in rule order, with one device->host sync.

    Inside CUDA graph capture no sync is allowed: the rules are skipped, unless
    ``refuse_in_capture`` names an option the caller asked for explicitly (``check_finite=True``),
    which is then refused with a ``ValueError``.
    """
    dev = dims.get("device")
    if dev is not None and dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        if refuse_in_capture:
            raise ValueError(f"{refuse_in_capture} needs a device->host sync, which CUDA-graph capture "
                             f"forbids; check the inputs in an eager call before capture, or drop "
                             f"{refuse_in_capture} for captured calls.")
        return  # no sync inside CUDA graph capture
    probes = []
    for rule in _host_remaining(rules, args, dims):
        probes += rule(args, dims)
    if not probes:
        return
    if len(probes) == 1:
        flags = [bool(probes[0][0])]  # the single device->host sync
    else:
        flags = torch.stack([p[0].reshape(()) for p in probes]).tolist()  # the single device->host sync
    for bad, probe in zip(flags, probes):
        if bad:
            probe[1]()



# -- the decode or prefill rules in one launch ---------------------------------------------------

#: The rules a fused check may compute in one kernel: the decode rules (:data:`FUSABLE_DECODE`), and
#: the prefill rules (``gdn_prefill``, ``kda_prefill``: the only other ops with value rules,
#: ``dispatch/rules/ops_table.py``; :data:`FUSABLE_PREFILL`, every set of them holding
#: :data:`PREFILL_RULE`). A call with any other rule (``check_finite``'s) keeps the torch rules, and
#: so does a call with ``output_state_indices`` (its rule is listed so that the calls without it keep
#: the kernel; the hook declines the calls with it). The hook that plans the kernel
#: (:class:`ValueCheckHook`) reads these.
FUSABLE_DECODE = frozenset({_v_state_indices, _v_output_state_indices, _v_intermediate, _v_num_accepted,
                            _v_shared_gate_params, _v_decode_log_decay})
FUSABLE_PREFILL = frozenset({_v_cu_seqlens, _v_state_indices, _v_output_state_indices, _v_checkpoints,
                             _v_log_decay})
PREFILL_RULE = _v_cu_seqlens
#: None: the fused kernel runs where the value-check hook says it can (the Triton backends' hook,
#: ``backends/triton.py``: where the direct Triton launch runs, ``kernels/triton/launch.py``
#: ``fast_launch_status``: CUDA, a tested Triton, no interpreter), unless
#: ``LINATTN_FUSED_VALUE_CHECKS=0`` opts out (its refusals are held against the torch rules on the
#: H200 by tests/gpu/test_value_checks_gpu.py). True / False: always / never (tests run it in the
#: Triton interpreter on the CPU).
FUSED_VALUE_CHECKS: bool | None = None


class ValueCheckHook:
    """What a backend provides to run the value rules as one kernel launch (``Backend.value_check_hook``;
    linattn's Triton backends provide one, ``backends/triton.py`` ``TritonValueChecks``). The registry
    holds the one its built-in backends provide (``Registry.value_check_hook``); this module reaches it
    through :data:`hook_source` and imports neither the dispatch runtime nor ``kernels/``.

    The methods below are the interface (a hook need not derive from this class)."""

    def available(self) -> bool:
        """Whether the kernel can run on the CUDA device of the call (asked unless
        :data:`FUSED_VALUE_CHECKS` decides)."""
        return False

    def plan(self, rules: frozenset, args: dict, dims: Dims, like=None):
        """The planned check for ``rules`` (a callable ``check(args) -> truthy on a bad value``), or
        None where the kernel does not apply (rules outside :data:`FUSABLE_DECODE` /
        :data:`FUSABLE_PREFILL`, separate write slots, a call outside the kernel's limits); ``like``:
        the planned check of another length of the call's class, its launch derived from. May raise
        ``ImportError`` (no Triton): the torch rules stay."""
        return None


#: A callable returning the registry's value-check hook (or None), installed by the dispatch runtime
#: (``dispatch/runtime/selection.py``: the process dispatcher's registry, loaded on first use).
hook_source: Callable[[], object] | None = None


def _value_check_hook():
    source = hook_source
    return None if source is None else source()


def _fusable_device(dev) -> bool:
    if FUSED_VALUE_CHECKS is not None:
        return FUSED_VALUE_CHECKS
    if dev is None or dev.type != "cuda" or not env_switch("LINATTN_FUSED_VALUE_CHECKS", True):
        return False
    hook = _value_check_hook()
    return hook is not None and bool(hook.available())


class _FusedCheck:
    """The value rules of one call key as one kernel launch and one sync; on a failed check the
    torch rules run, so the error (its rule order and message) is theirs. ``hook``: the value-check
    hook that planned ``check`` (a new length of the class plans with it again)."""

    __slots__ = ("check", "rules", "dims", "cuda", "hook")

    def __init__(self, check, rules: tuple, dims: Dims, hook):
        self.check, self.rules, self.dims, self.hook = check, rules, dims, hook
        self.cuda = dims["device"].type == "cuda"

    def __call__(self, args: dict) -> None:
        if self.cuda and torch.cuda.is_current_stream_capturing():
            return  # no sync inside CUDA graph capture (as _run_value_rules)
        if self.check(args):
            _run_value_rules(self.rules, args, self.dims)


def fused_value_check(rules: tuple, args: dict, dims: Dims, like=None):
    """``rules`` for calls with the metadata of ``args`` as one kernel launch (a callable
    ``check(args)`` that raises as :func:`_run_value_rules` does), or None where the torch rules
    stay: another rule among them, a device without the kernel (no value-check hook registered, or
    the hook not available there), or a call outside the kernel's limits (the hook's ``plan``: the
    Triton backends' reads ``value_checks.plan_decode_value_check``, ``plan_prefill_value_check``).

    Args:
        rules: the value rules of the call (``validate.value_rules_of``): decode's or prefill's.
        args: the call's normalised arguments (``validate_call``); only metadata is read (shapes,
            strides, which optional tensors are given), no values, no sync.
        dims: the facts the host rules derived (``p``, ``t``, ``writes_pool``, ``device``, ...).
        like: the check this returned for another length of the call's class (a decode batch N or
            prefill length T of one class plan, ``dispatch/runtime/fast_path.py``), or None: the new check's
            launch is derived from its (its compiled kernel where the lengths' int specialization is
            the same), instead of a launch planned and looked up afresh. The result is the same check.

    Returns:
        A callable ``check(args)``: one launch and one device->host sync; it raises the torch
        rules' ``ValueError`` on a bad value (nothing is written before), and returns None otherwise.
        Or None (the caller runs :func:`_run_value_rules`).
    """
    if not rules or not _fusable_device(dims.get("device")):
        return None
    if isinstance(like, _FusedCheck):
        hook, like = like.hook, like.check
    else:
        hook, like = _value_check_hook(), None
        if hook is None:
            return None
    try:
        check = hook.plan(frozenset(rules), args, dims, like)  # None for rules neither kernel computes
    except ImportError:  # no Triton
        return None
    return None if check is None else _FusedCheck(check, rules, dims, hook)
