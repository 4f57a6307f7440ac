"""Conformance cases, generated from what a backend declares.

A backend declares its capabilities as data (``ops``, ``dtypes``, ``state_dtypes``,
``head_dims_k`` / ``head_dims_v``, ``state_layouts``, ``vendors``; see
:class:`linattn.backends.base.Backend`). From them this module builds four kinds of cases:

- ``accuracy``: every declared dtype, state dtype, layout and prefill mode, head dims at the ends
  of the declared sets (small ones, K != V first, when the backend takes any; the smallest its
  predicates accept when it limits them per op), GVA and plain heads, q/k/v sliced from a fused
  projection and strided gates, varlen prefill with zero-length and length-1 sequences and a
  tail chunk, decode with padding rows, speculative verify, intermediate states and
  ``num_accepted_tokens``, strongly negative gates, a real model's gates (``gates-model``,
  :mod:`linattn.testing.gates`), mild gates after a gate at the floor (fp32,
  F28), ``T = 0``. Each is run through the public op with the backend forced
  and compared with the float64 reference at docs/ops.md's tolerances.
- ``pool``: the pool rules on their own: a real request in slot 0 beside padding rows, a batch of
  nothing but padding, a strided view of a larger pool (slot pitch ``stride(0)``), and, for a
  backend declaring the ``output_state_indices`` feature, separate read and write slots (forks of
  one shared slot, an empty sequence, a sequence in place): only the write slots change; for a
  prefill backend declaring ``checkpoints``, state checkpoints (each against the float64 reference
  after that many tokens, and bitwise against the same backend stopped there).
- ``negative``: what the backend does not declare (a dtype, state dtype, head dim, layout, op or
  vendor) must be rejected by its predicates (``linattn.explain`` with the backend forced:
  nothing chosen, the backend rejected) and, where the inputs can be built here, a forced call
  must raise ``NoBackendError`` before touching anything: never a mis-computation.
- ``contract``: for a backend declaring ``triton_kernels``, the program-id contract of each
  kernel (``linattn.kernels.triton.registry``): every work item visited exactly once, per layout.

Case ids read ``op/kind/variant[details]`` (``gdn_prefill/accuracy/dtype[bfloat16,state=float32,
vk,pool,K32V16,H2HV4]``); xfail files match them with fnmatch patterns.
"""

from __future__ import annotations

from typing import Iterable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict

from linattn.capabilities import PROFILES, DeviceCapabilities
from linattn.dispatch.rules.ops_table import OP_TABLE, OPS
from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.plugin.verdict import Reason

from linattn._namespace import public_dir

__all__ = ["KINDS", "Kind", "INPUT_DTYPES", "STATE_DTYPES", "LAYOUTS", "DEFAULT_HEAD_DIMS", "CANDIDATE_HEAD_DIMS",
           "PROBE_HEAD_DIMS", "PREFILL_LENS", "PREFILL_SLOTS", "PREFILL_P", "FLOOR_GATES", "DECODE_SLOTS", "DECODE_P",
           "UNNORMED",
           "Case", "head_dim_pairs", "base_spec", "problem_of", "checkpoints_written", "generate_cases"]
__dir__ = public_dir(__name__, __all__)

Kind = Literal["accuracy", "pool", "negative", "contract"]
KINDS: tuple[str, ...] = ("accuracy", "pool", "negative", "contract")

#: Input dtypes the validation layer accepts, and pool dtypes (a backend declares a subset).
INPUT_DTYPES = ("float32", "bfloat16", "float16", "float64")
STATE_DTYPES = ("float32", "bfloat16", "float64")
LAYOUTS = ("vk", "kv")
#: Head dims tried when a backend accepts any (K != V first: a transposed pool shows up).
DEFAULT_HEAD_DIMS = ((32, 16), (16, 32))
#: Head dims tried, smallest first, when a backend declares any but limits them in a predicate.
CANDIDATE_HEAD_DIMS = ((32, 16), (16, 32), (64, 32), (32, 64), (128, 64), (64, 128), (64, 64), (128, 128),
                       (256, 128), (128, 256), (256, 256))
#: Head dims tried as "not declared" when a backend declares a set.
PROBE_HEAD_DIMS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 512)

# Prefill: zero-length sequences first and inside, length 1, one chunk + tail, two chunks + tail,
# and a padding sequence (slot -1) that has tokens. Slots: 0 used, P - 1 never (catches -1 read
# as "the last row"), zero-length sequences own slots too.
PREFILL_LENS = (0, 1, 70, 0, 131, 5)
PREFILL_SLOTS = (3, 0, 7, 1, 5, -1)
PREFILL_P = 9
# F28, fp32 prefill: mild gates (-0.05) and one token in FLOOR_EVERY at the gating floor (-1000),
# the first at FLOOR_FIRST so that every chunk of the sequence, the tail chunk too, has one. One
# sequence of 300 tokens and one head keeps the case quick in the Triton interpreter.
FLOOR_GATES = dict(lens=(300,), slots=(2,), p=4, h=1, hv=1, gates="floor", dtype="float32",
                   state_dtype="float32")
FLOOR_EVERY, FLOOR_FIRST, FLOOR_MILD = 50, 10, -0.05
# Decode: N = 5 rows, two of them padding (-1 and -2: every negative slot is padding, not only -1), slot 0
# used, slot P - 1 untouched.
DECODE_SLOTS = (4, -1, 0, 6, -2)
DECODE_P = 8
#: The norm of q and k rows in the ``no-l2norm`` cases (below 1: the delta rule stays contractive).
UNNORMED = 0.7


class Case(BaseModel):
    """One conformance case: what to run and what it checks.

    Fields:
        id: stable id, ``op/kind/variant[details]`` (xfail patterns match it).
        op: the op (one of ``linattn.dispatch.OPS``).
        kind: ``accuracy``, ``pool``, ``negative`` or ``contract``.
        backend: the backend under test.
        spec: the parameters (shapes, dtypes, layout, mode, gates, slots, ...) the executor reads.
        what: one line saying what the case pins down.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    op: str
    kind: Kind
    backend: str
    spec: dict
    what: str


def _declared(values: Optional[Iterable[str]], universe: Sequence[str]) -> list[str]:
    return [x for x in universe if values is not None and x in values]


def _preferred(options: Sequence[str], first: str) -> str:
    return first if first in options else options[0]


def head_dim_pairs(backend, op: Optional[str] = None, caps: Optional[DeviceCapabilities] = None) -> list[tuple[int, int]]:
    """(K, V) pairs to test ``op`` with: the ends of the declared sets (K != V first).

    A backend that declares any head dim (``head_dims_k = head_dims_v = None``) may still limit
    them per op in a predicate (a ``shape`` rejection). Given ``op`` and the device ``caps``, the
    small candidates (:data:`CANDIDATE_HEAD_DIMS`) are put through its predicates and the first
    two it accepts are used, K != V first; with no ``caps``, or none accepted, two small pairs.

    Example:
        >>> from linattn.backends.base import Backend
        >>> head_dim_pairs(Backend)
        [(32, 16), (16, 32)]
    """
    ks, vs = backend.head_dims_k, backend.head_dims_v
    if ks is None and vs is None:
        if op is None or caps is None:
            return list(DEFAULT_HEAD_DIMS)
        ok = [kv for kv in CANDIDATE_HEAD_DIMS if _shape_accepted(backend, op, kv, caps)]
        ok.sort(key=lambda kv: kv[0] == kv[1])  # stable: K != V first
        return ok[:2] or list(DEFAULT_HEAD_DIMS)
    kc = (min(ks), max(ks)) if ks else (32, 16)
    vc = (min(vs), max(vs)) if vs else (16, 32)
    pairs: list[tuple[int, int]] = []
    for pair in ((kc[0], vc[0]), (kc[-1], vc[-1]), (kc[0], vc[-1]), (kc[-1], vc[0])):
        if pair not in pairs:
            pairs.append(pair)
    pairs.sort(key=lambda kv: kv[0] == kv[1])  # stable: K != V first
    return pairs[:3]


def _shape_accepted(backend, op: str, kv: tuple[int, int], caps: DeviceCapabilities) -> bool:
    """No predicate rejects ``op`` at head dims ``kv`` for a shape reason (other reasons, e.g. the
    device, are not about the head dims; a predicate that raises counts as a rejection)."""
    spec = {**base_spec(op, backend, [kv]), "k": kv[0], "v": kv[1]}
    problem = problem_of(op, spec)
    try:
        for pred in backend.predicates():
            check = pred(problem, caps)
            if not check.ok and check.reason == Reason.SHAPE:
                return False
    except Exception:  # noqa: BLE001 - the suite reports predicates that raise elsewhere
        return False
    return True


def _label(op: str, s: dict) -> str:
    spec = OP_TABLE[op]
    if spec.method == "clamp":
        return f"{s['dtype']},M{s['m']}D{s['d']},limit={s['limit']}"
    if spec.method == "gating":
        return f"{s['dtype']},HV{s['hv']}" + (f"K{s['k']}" if spec.per_channel_gates else "")
    parts = [s["dtype"], f"state={s['state_dtype']}", s["layout"], s["mode"], f"K{s['k']}V{s['v']}",
             f"H{s['h']}HV{s['hv']}"]
    if "t" in s:
        parts.insert(4, f"N{s['n']}T{s['t']}")
    return ",".join(parts)


class _Builder:
    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name
        self.cases: list[Case] = []
        self.seen: set[str] = set()

    def add(self, op: str, kind: str, variant: str, spec: dict, what: str, label: Optional[str] = None) -> None:
        cid = f"{op}/{kind}/{variant}[{label if label is not None else _label(op, spec)}]"
        if cid in self.seen:
            return
        self.seen.add(cid)
        self.cases.append(Case(id=cid, op=op, kind=kind, backend=self.name, spec=dict(spec), what=what))


def _declared_sets(b) -> dict:
    return dict(D=_declared(b.dtypes, INPUT_DTYPES), SD=_declared(b.state_dtypes, STATE_DTYPES),
                L=_declared(b.state_layouts, LAYOUTS))


def base_spec(op: str, backend, pairs=None) -> dict:
    """The base accuracy spec of ``op`` for ``backend``: its preferred declared dtype (float32),
    state dtype (float32) and layout ("vk") and its first head-dim pair; float32 / "vk" where it
    declares none. The other cases vary one or two fields of it."""
    pairs = pairs or head_dim_pairs(backend)
    sets = _declared_sets(backend)
    dtype = _preferred(sets["D"], "float32") if sets["D"] else "float32"
    k, v = pairs[0]
    method = OP_TABLE[op].method
    if method == "clamp":
        return dict(m=5, d=7, limit=10.0, dtype=dtype)
    if method == "gating":
        return dict(lead=(3, 2), hv=4, k=16, dtype=dtype, gates="normal")
    state = dict(h=2, hv=4, k=k, v=v, dtype=dtype,
                 state_dtype=_preferred(sets["SD"], "float32") if sets["SD"] else "float32",
                 layout=_preferred(sets["L"], "vk") if sets["L"] else "vk", mode="pool", gates="normal",
                 index_dtype="int32")
    if method == "prefill":
        return dict(lens=PREFILL_LENS, slots=PREFILL_SLOTS, p=PREFILL_P, **state)
    return dict(n=len(DECODE_SLOTS), t=1, slots=DECODE_SLOTS, p=DECODE_P, **state)


def problem_of(op: str, spec: dict) -> Problem:
    """The :class:`Problem` (what the dispatcher sees) of a case spec.

    Example:
        >>> from linattn.backends.base import Backend
        >>> problem_of("gdn_decode", base_spec("gdn_decode", Backend)).brief()
        'N=5 T=1 H=2 HV=4 K=32 V=16 float32 state=float32/vk mode=pool'
    """
    s, row = spec, OP_TABLE[op]
    if row.method == "clamp":
        return Problem(op=op, n=s["m"], d=s["d"], dtype=s["dtype"], mode="none", clamp_limit=s["limit"] is not None)
    if row.method == "gating":
        n = 1
        for x in s["lead"]:
            n *= x
        return Problem(op=op, n=n, hv=s["hv"], k=s["k"] if row.per_channel_gates else 0, dtype=s["dtype"],
                       mode="none", lower_bound=s.get("lower_bound") is not None)
    common = dict(op=op, h=s["h"], hv=s["hv"], k=s["k"], v=s["v"], dtype=s["dtype"], state_layout=s["layout"])
    if row.method == "prefill":
        lens = s["lens"]
        return Problem(n=len(lens), t=sum(lens), mode="pool" if s["mode"] == "pool" else "dense",
                       state_dtype="float32" if s["mode"] == "dense-zero" else s["state_dtype"],
                       max_seqlen=sum(lens) if len(lens) == 1 else 0, output_state_indices="out_slots" in s,
                       checkpoints="marks" in s, has_initial_state="fresh" in s, **common)
    return Problem(n=s["n"], t=s["t"], state_dtype=s["state_dtype"], mode="pool",
                   intermediate_states="intermediate" in s, num_accepted_tokens="num_accepted" in s,
                   disable_state_update=bool(s.get("disable_state_update")),
                   lower_bound=s.get("lower_bound") is not None, output_state_indices="out_slots" in s,
                   has_initial_state="fresh" in s, precomputed_gates=bool(s.get("gate_form")), **common)


def _common_state_cases(B: _Builder, op: str, base: dict, sets: dict, pairs) -> None:
    for dt in sets["D"]:
        B.add(op, "accuracy", "dtype", {**base, "dtype": dt}, f"declared input dtype {dt}")
    for sd in (x for x in sets["SD"] if x != base["state_dtype"]):
        B.add(op, "accuracy", "state-dtype", {**base, "state_dtype": sd}, f"declared state dtype {sd} (preserved)")
    for lay in (x for x in sets["L"] if x != base["layout"]):
        B.add(op, "accuracy", "layout", {**base, "layout": lay}, f"pool layout {lay!r} read and written as declared")
    for k, v in pairs[1:]:
        B.add(op, "accuracy", "head-dims", {**base, "k": k, "v": v}, f"head dims K={k}, V={v}")
    B.add(op, "accuracy", "mha", {**base, "h": base["hv"]}, "H == HV (no GVA)")
    B.add(op, "accuracy", "gates-strong", {**base, "gates": "strong"},
          "strongly negative gates (g = -20 per token) stay finite and match")
    B.add(op, "accuracy", "gates-model", {**base, "gates": "model"},
          "a real model's gates (Qwen3-Next / Kimi-Linear initialisation, linattn.testing.gates), every second "
          "head a strong-decay head (KDA: channel blocks off stage 1's fast path) match")
    B.add(op, "accuracy", "scale", {**base, "scale": 0.5}, "a query scale other than K ** -0.5 (scale=0.5)")
    B.add(op, "accuracy", "no-l2norm", {**base, "l2norm": False},
          f"use_qk_l2norm=False: q and k rows of norm {UNNORMED} read as given (normalising them again is off)")
    B.add(op, "accuracy", "strided-inputs", {**base, "strided": True},
          "q, k, v sliced from one fused projection, gates as strided views (F11): read through their strides")
    phase = OP_TABLE[op].phase
    B.add(op, "pool", "slot0-padding", {**base, **_SLOT0[phase]},
          "slot 0 is a real request; padding gives zero output and leaves the pool alone (F07)")
    B.add(op, "pool", "all-padding", {**base, **_ALL_PADDING[phase]},
          "a call of nothing but padding leaves the whole pool bitwise unchanged")
    B.add(op, "pool", "strided-view", {**base, "pool_view": "strided"},
          "a strided view of a larger pool (slot pitch stride(0)); rows outside the view untouched")
    if "has_initial_state" in _features(B.backend, op):
        B.add(op, "pool", "fresh", {**base, "fresh": _FRESH[phase]},
              "has_initial_state: a fresh sequence starts from a zero state without reading its slot (NaN there "
              "before the call) and its final state is written there as usual")
    if "output_state_indices" in _features(B.backend, op):
        B.add(op, "pool", "separate-slots", {**base, **_SEPARATE[phase]},
              "output_state_indices: states read from state_indices, written to other slots (two forks of one "
              "shared slot, a sequence in place); the read slots and every unwritten row bitwise unchanged")
    if phase == "prefill" and "checkpoints" in _features(B.backend, op):
        B.add(op, "pool", "checkpoints", {**base, **_CHECKPOINTS},
              "checkpoint_every=64: each checkpoint is the float64 reference state after that many tokens and "
              "bitwise the same backend's prefill stopped there; one at exactly a length is the final state; "
              "slots past a length, an empty sequence's and padding's are not written")


def _features(backend, op: str) -> frozenset:
    """The call features ``backend`` declares for ``op`` (``Backend.declared_features``: a subclass
    that rewrote the op method without declaring them has none)."""
    declared = getattr(backend, "declared_features", None)
    try:
        return frozenset(declared(op)) if declared is not None else frozenset(getattr(backend, "features", ()))
    except TypeError:  # a class rather than an instance
        return frozenset(getattr(backend, "features", ()))


_SLOT0 = {"prefill": dict(lens=(3, 70, 5, 0), slots=(0, -1, 2, -3), p=6),
          "decode": dict(n=4, slots=(0, -1, 2, -7), p=6)}
#: any negative slot is padding (-1, -2, the int32 minimum): none of them reads or writes a row
_ALL_PADDING = {"prefill": dict(lens=(4, 9), slots=(-1, -2), p=4),
                "decode": dict(n=3, slots=(-1, -2, -2 ** 31), p=4)}
#: has_initial_state per sequence / row (False: fresh, its slot holds NaN before the call and must not be
#: read): prefill's fresh ones a one-token sequence, an empty one (its final state, zero, is still written), a
#: long one and a padding sequence; decode's rows of slots -1, 0 and 6 (a padding row and two real ones)
_FRESH = {"prefill": (True, False, True, False, False, False), "decode": (True, False, False, False, True)}
#: the softplus case of the gating ops and the raw-gate decode
_SOFTPLUS = dict(softplus_beta=2.0, softplus_threshold=1.0)
_SOFTPLUS_WHAT = "softplus_beta=2, softplus_threshold=1 (the raw gates' softplus sharper, linear above 1)"
#: read slots and write slots: slot 3 (prefill) / 4 (decode) read by two sequences (one of them empty
#: in prefill: its initial state is copied), one sequence in place (7 / 6), padding, slot P - 1 unused
_SEPARATE = {"prefill": dict(slots=(3, 3, 7, 1, 5, -1), out_slots=(2, 4, 7, 6, 0, -1)),
             "decode": dict(t=2, slots=(4, -1, 4, 6, -1), out_slots=(1, -1, 5, 6, -1))}
#: checkpoints every 64 tokens: sequence 0 (130 tokens) writes slots 4 and 5, not 6 (192 > 130);
#: sequence 1 (64) writes 7, its final state; the empty sequence (8) and padding (9) write nothing;
#: sequence 4 (70) writes 10; slot 11 unused
_CHECKPOINTS = dict(lens=(130, 64, 0, 3, 70), slots=(0, 1, 2, -1, 3), p=12, checkpoint_every=64,
                    marks=((4, 5, 6), (7, -1, -1), (8, -1, -1), (9, -1, -1), (10, -1, -1)))


def checkpoints_written(s: dict) -> list:
    """``[(sequence, tokens, slot)]``: the checkpoints a case's call writes (``marks``, ``lens``)."""
    every, out = s.get("checkpoint_every", 0), []
    for n, row in enumerate(s.get("marks", ())):
        for j, slot in enumerate(row):
            if slot >= 0 and s["slots"][n] >= 0 and (j + 1) * every <= s["lens"][n]:
                out.append((n, (j + 1) * every, slot))
    return out


def _prefill_cases(B: _Builder, op: str, pairs) -> None:
    sets = _declared_sets(B.backend)
    if not all(sets.values()):
        return
    base = base_spec(op, B.backend, pairs)
    _common_state_cases(B, op, base, sets, pairs)
    for lay in sets["L"]:
        B.add(op, "accuracy", "dense", {**base, "mode": "dense", "layout": lay, "index_dtype": "int64"},
              f"dense mode with an initial state ({lay}): a new final state is returned")
    B.add(op, "accuracy", "dense-zero", {**base, "mode": "dense-zero"}, "dense mode without an initial state")
    B.add(op, "accuracy", "gates-zero", {**base, "gates": "zero"}, "g = 0 (no decay)")
    if "float32" in sets["D"] and "float32" in sets["SD"]:
        for mode in ("pool", "dense"):
            B.add(op, "accuracy", "gates-floor", {**base, **FLOOR_GATES, "mode": mode},
                  f"F28: fp32, mild gates after gates at the floor (-1000), {mode} mode: 1e-5 of float64 "
                  "(a plain fp32 cumulative gate near -1000 rounds every later decay; carry it as two floats)")
    B.add(op, "accuracy", "short-and-long", {**base, "lens": (1, 1, 1, 517), "slots": (2, 0, 4, 1), "p": 6},
          "decodes pushed through the chunked path beside a 517-token sequence (F12)")
    B.add(op, "accuracy", "empty", {**base, "lens": (0, 0), "slots": (1, -1), "p": 3},
          "T = 0: nothing runs, the pool is untouched")


def _decode_cases(B: _Builder, op: str, pairs) -> None:
    sets = _declared_sets(B.backend)
    if not all(sets.values()):
        return
    base = base_spec(op, B.backend, pairs)
    _common_state_cases(B, op, base, sets, pairs)
    B.add(op, "accuracy", "verify", {**base, "t": 3, "index_dtype": "int64"},
          "speculative verify: T = 3 tokens of one sequence in order")
    B.add(op, "accuracy", "intermediate", {**base, "t": 3, "intermediate": (2, -1, 0, 5, -1), "s": 6},
          "intermediate states written per token into a view of a longer buffer (F09)")
    B.add(op, "accuracy", "verify-only", {**base, "t": 3, "intermediate": (2, -1, 0, 5, -1), "s": 6,
                                          "disable_state_update": True},
          "disable_state_update: the pool is only read")
    B.add(op, "accuracy", "accepted-tokens",
          {**base, "t": 3, "p": 10, "table": ((4, 1, 2), (-1, -1, -1), (0, 3, 3), (6, 5, 7), (-1, -1, -1)),
           "num_accepted": (2, 0, 3, 1, 0)},
          "per-token slot table with num_accepted_tokens over 0..T")
    B.add(op, "accuracy", "softplus", {**base, **_SOFTPLUS}, _SOFTPLUS_WHAT)
    if OP_TABLE[op].takes("lower_bound"):
        B.add(op, "accuracy", "lower-bound", {**base, "lower_bound": -5.0}, "KDA bounded gate (lower_bound=-5)")
    if "precomputed_gates" in _features(B.backend, op):
        B.add(op, "accuracy", "gate-form", {**base, "gate_form": True},
              "precomputed gates: g and beta (the gating op's outputs) in place of a, b, A_log, dt_bias")
        B.add(op, "accuracy", "gate-form-t3", {**base, "gate_form": True, "t": 3, "index_dtype": "int64"},
              "precomputed gates over T = 3 tokens of one sequence")


def _gating_cases(B: _Builder, op: str) -> None:
    D = _declared(B.backend.dtypes, INPUT_DTYPES)
    if not D:
        return
    base = base_spec(op, B.backend)
    for dt in D:
        B.add(op, "accuracy", "dtype", {**base, "dtype": dt}, f"declared input dtype {dt}")
    B.add(op, "accuracy", "extreme", {**base, "gates": "extreme"},
          "F18: no NaN or inf for A_log=100 / a=-200, a=+100, A_log=100 / a=1")
    B.add(op, "accuracy", "softplus", {**base, **_SOFTPLUS}, _SOFTPLUS_WHAT)
    if OP_TABLE[op].takes("lower_bound"):
        B.add(op, "accuracy", "lower-bound", {**base, "lower_bound": -5.0}, "bounded gate (lower_bound=-5)")


def _silu_cases(B: _Builder, op: str) -> None:
    D = _declared(B.backend.dtypes, INPUT_DTYPES)
    if not D:
        return
    base = base_spec(op, B.backend)
    for dt in D:
        B.add(op, "accuracy", "dtype", {**base, "dtype": dt}, f"declared dtype {dt}, inputs beyond ±10")
    B.add(op, "accuracy", "no-limit", {**base, "d": 64, "limit": None}, "limit=None: plain silu(gate) * up")
    B.add(op, "accuracy", "wide", {**base, "m": 3, "d": 1000}, "D = 1000, not a power of two (F04)")
    B.add(op, "accuracy", "empty", {**base, "m": 0, "d": 16}, "M = 0 returns an empty tensor (F03)")


def _negative_cases(B: _Builder, ops: Sequence[str], pairs: dict) -> None:
    b = B.backend
    for op in ops:
        if op not in b.ops:
            B.add(op, "negative", "op", dict(inputs=base_spec(op, b, pairs[op]), expect="op"),
                  f"{op} is not declared: the backend must reject it", label="undeclared")
            continue
        base = base_spec(op, b, pairs[op])
        for dt in INPUT_DTYPES:
            if dt not in b.dtypes:
                B.add(op, "negative", "dtype", dict(inputs={**base, "dtype": dt}, expect="dtype", run=True),
                      f"dtype {dt} is not declared: rejected, never computed", label=dt)
        if not OP_TABLE[op].has_state:
            continue
        for sd in STATE_DTYPES:
            if sd not in b.state_dtypes:
                B.add(op, "negative", "state-dtype", dict(inputs={**base, "state_dtype": sd}, expect="dtype", run=True),
                      f"state dtype {sd} is not declared: rejected", label=sd)
        for lay in LAYOUTS:
            if lay not in b.state_layouts:
                B.add(op, "negative", "layout", dict(inputs={**base, "layout": lay}, expect="layout", run=True),
                      f"state layout {lay!r} is not declared: rejected, never misread", label=lay)
        for field, declared in (("k", b.head_dims_k), ("v", b.head_dims_v)):
            if declared is None:
                continue
            for dim in _undeclared_dims(declared):
                B.add(op, "negative", "head-dim", dict(inputs={**base, field: dim}, expect="shape", run=True),
                      f"head dim {field.upper()}={dim} is not declared: rejected", label=f"{field.upper()}{dim}")
    first = next((op for op in ops if op in b.ops), None)
    if first is not None:
        vendors_seen: set[str] = set()
        for prof, pcaps in PROFILES.items():  # one profile per vendor the backend does not declare
            if pcaps.vendor not in b.vendors and pcaps.vendor not in vendors_seen:
                vendors_seen.add(pcaps.vendor)
                B.add(first, "negative", "vendor", dict(inputs=base_spec(first, b, pairs[first]), device=prof,
                                                         expect="device"),
                      f"vendor {pcaps.vendor!r} (profile {prof}) is not declared: rejected", label=prof)


def _undeclared_dims(declared) -> list[int]:
    """Up to two head dims outside a declared set: the nearest below its minimum and above its
    maximum (or one in a gap)."""
    outside = [d for d in PROBE_HEAD_DIMS if d not in declared]
    below = [d for d in outside if d < min(declared)]
    above = [d for d in outside if d > max(declared)]
    picks = ([max(below)] if below else []) + ([min(above)] if above else [])
    return picks or outside[:1]


def _contract_cases(B: _Builder) -> None:
    for entry in B.backend.triton_kernels or ():
        name = entry if isinstance(entry, str) else getattr(entry, "name", str(entry))
        B.add("contract", "contract", "program-id", dict(kernel=name),
              f"Triton kernel {name}: every work item visited exactly once in each launch layout", label=name)


def generate_cases(backend, ops: Optional[Iterable[str]] = None, kinds: Optional[Iterable[str]] = None,
                   caps: Optional[DeviceCapabilities] = None) -> list[Case]:
    """All conformance cases for ``backend`` (an instance or class of a linattn ``Backend``).

    Args:
        backend: the backend under test; its declared ``ops``, ``dtypes``, ``state_dtypes``,
            ``head_dims_k``/``head_dims_v``, ``state_layouts``, ``vendors`` (and optional
            ``triton_kernels``) drive the generation.
        ops: restrict to these ops (default: every op; undeclared ops give negative cases only).
        kinds: restrict to these kinds (``accuracy``, ``pool``, ``negative``, ``contract``).
        caps: the device the cases will run on; lets :func:`head_dim_pairs` find head dims a
            backend accepts per op when it declares any but limits them in a predicate.
    Returns:
        The cases, in a stable order (ids are unique).
    Raises:
        ValueError: an unknown op or kind.
    Example:
        >>> from linattn.backends.torch_ref import TorchRefBackend
        >>> ids = [c.id for c in generate_cases(TorchRefBackend(), ops=["gdn_prefill"])]
        >>> "gdn_prefill/pool/slot0-padding[float32,state=float32,vk,pool,K32V16,H2HV4]" in ids
        True
    """
    ops = list(OPS) if ops is None else list(ops)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    kinds = set(KINDS if kinds is None else kinds)
    if kinds - set(KINDS):
        raise ValueError(f"unknown case kinds {sorted(kinds - set(KINDS))}; kinds: {', '.join(KINDS)}")
    B = _Builder(backend)
    pairs = {op: head_dim_pairs(backend, op, caps) if OP_TABLE[op].has_state else head_dim_pairs(backend)
             for op in ops}
    for op in ops:
        if op not in backend.ops:
            continue
        method = OP_TABLE[op].method
        if method == "prefill":
            _prefill_cases(B, op, pairs[op])
        elif method == "decode":
            _decode_cases(B, op, pairs[op])
        elif method == "gating":
            _gating_cases(B, op)
        else:
            _silu_cases(B, op)
    _negative_cases(B, ops, pairs)
    _contract_cases(B)
    return [c for c in B.cases if c.kind in kinds and (c.op in ops or c.kind == "contract")]
