"""The option grid of F39: every op of the op table, its dtypes and options, as small calls.

Shared by ``tests/field/test_f39_fakes.py`` (the whole grid) and ``tests/fuzz/test_fuzz_meta.py``
(random problems). A case is ``(op, kwargs)``; :func:`meta_of` gives an output's shape, dtype,
device and strides, and :func:`compare_fake` runs a call for real and under ``FakeTensorMode`` and
returns the differences (an empty list when the fake equals the real output). Also the F40
comparison of an exception with its unpickled copy, :func:`assert_same_exception`.
"""

from __future__ import annotations

import itertools

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import linattn
from linattn.dispatch.rules.ops_table import OP_TABLE

N, H, HV, K, V, P = 3, 1, 2, 8, 4, 6
LENS = (2, 0, 3)  # prefill: a zero-length sequence inside
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _r(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def gating_case(op: str, dtype: str, alog_dtype: str = "float32", lead=(5,), transposed: bool = False,
                lower_bound=None, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    kda = OP_TABLE[op].per_channel_gates
    dt = DTYPES[dtype]
    a = _r(gen, *lead, HV, *((K,) if kda else ()), dtype=dt)
    b = _r(gen, *lead, HV, dtype=dt)
    if transposed and len(lead) == 2:  # non-contiguous views of the same values
        a = a.transpose(0, 1).contiguous().transpose(0, 1)
        b = b.transpose(0, 1).contiguous().transpose(0, 1)
    args = dict(A_log=_r(gen, HV, dtype=DTYPES[alog_dtype]) * 0.5, a=a, b=b,
                dt_bias=_r(gen, HV, *((K,) if kda else ())) * 0.5)
    if lower_bound is not None:
        args["lower_bound"] = lower_bound
    return op, args


def decode_case(op: str, dtype: str, state_dtype: str = "float32", layout: str = "vk", variant: str = "plain",
                gate_form: str = "raw", seed: int = 0) -> tuple:
    """variant: plain (T = 1), verify ([N, T] table, T = 3), intermediate (T = 3 with intermediate
    states), accepted (table + num_accepted_tokens), verify-only (disable_state_update), his
    (has_initial_state)."""
    gen = torch.Generator().manual_seed(seed)
    kda = OP_TABLE[op].per_channel_gates
    T = 1 if variant in ("plain", "his") else 3
    dt, sdt = DTYPES[dtype], DTYPES[state_dtype]
    gshape = (N, T, HV, *((K,) if kda else ()))
    args = dict(q=_r(gen, N, T, H, K, dtype=dt), k=_r(gen, N, T, H, K, dtype=dt), v=_r(gen, N, T, HV, V, dtype=dt))
    if gate_form == "raw":
        args.update(a=_r(gen, *gshape, dtype=dt), b=_r(gen, N, T, HV, dtype=dt), A_log=_r(gen, HV) * 0.5,
                    dt_bias=_r(gen, HV, *((K,) if kda else ())) * 0.5)
    else:
        args.update(a=None, b=None, A_log=None, dt_bias=None, g=-torch.rand(*gshape, generator=gen),
                    beta=torch.rand(N, T, HV, generator=gen))
    state = (HV, V, K) if layout == "vk" else (HV, K, V)
    args.update(state_pool=_r(gen, P, *state, dtype=sdt), state_layout=layout, state_indices=torch.tensor([4, -1, 0]))
    if variant in ("verify", "accepted", "verify-only"):
        args["state_indices"] = torch.tensor([[4, 5, 1], [-1, -1, -1], [0, 2, 3]])
    if variant == "accepted":
        args["num_accepted_tokens"] = torch.tensor([2, 0, 3])
    if variant == "verify-only":
        args["disable_state_update"] = True
    if variant == "intermediate":
        args["intermediate_states"] = _r(gen, 4, T + 1, *state, dtype=sdt)[:, :T]
        args["intermediate_state_indices"] = torch.tensor([1, -1, 3])
    if variant == "his":
        args["has_initial_state"] = torch.tensor([False, True, True])
    return op, args


def prefill_case(op: str, dtype: str, mode: str = "pool", state_dtype: str = "float32", layout: str = "vk",
                 his: bool = False, seed: int = 0) -> tuple:
    """mode: pool, dense (no initial state) or dense_h0 (an initial state in ``state_dtype``)."""
    gen = torch.Generator().manual_seed(seed)
    kda = OP_TABLE[op].per_channel_gates
    T, dt = sum(LENS), DTYPES[dtype]
    args = dict(q=_r(gen, T, H, K, dtype=dt), k=_r(gen, T, H, K, dtype=dt), v=_r(gen, T, HV, V, dtype=dt),
                g=-torch.rand(T, HV, *((K,) if kda else ()), generator=gen), beta=torch.rand(T, HV, generator=gen),
                cu_seqlens=torch.tensor([0, *itertools.accumulate(LENS)]), state_layout=layout)
    state = (HV, V, K) if layout == "vk" else (HV, K, V)
    if mode == "pool":
        args.update(state_pool=_r(gen, P, *state, dtype=DTYPES[state_dtype]), state_indices=torch.tensor([5, 0, -1]))
        if his:
            args["has_initial_state"] = torch.tensor([False, True, True])
    elif mode == "dense_h0":
        args["initial_state"] = _r(gen, len(LENS), *state, dtype=DTYPES[state_dtype])
    return op, args


def clamp_case(dtype: str, limit=None, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return "silu_and_mul_clamp", dict(x=_r(gen, 5, 2 * V, dtype=DTYPES[dtype]) * 8.0, limit=limit)


def grid() -> list:
    """Every (op, kwargs) of the grid: each op of the op table in float32, float64 and bfloat16
    where accepted, with its modes and options."""
    cases = []
    for op, spec in OP_TABLE.items():
        m = spec.method
        if m == "gating":
            for dt, adt in itertools.product(DTYPES, ("float32", "float64")):
                cases.append(gating_case(op, dt, adt))
            cases.append(gating_case(op, "float64", lead=(2, 3), transposed=True))
            cases.append(gating_case(op, "float32", lead=(0,)))
            if spec.per_channel_gates:
                cases.append(gating_case(op, "float64", lower_bound=-5.0))
        elif m == "decode":
            for dt in DTYPES:
                for var in ("plain", "verify", "intermediate", "accepted", "verify-only", "his"):
                    cases.append(decode_case(op, dt, variant=var))
                cases.append(decode_case(op, dt, gate_form="pre"))
            cases += [decode_case(op, "float32", state_dtype=s) for s in ("bfloat16", "float64")]
            cases.append(decode_case(op, "float64", state_dtype="float64", layout="kv", variant="intermediate"))
        elif m == "prefill":
            for dt, layout in itertools.product(DTYPES, ("vk", "kv")):
                cases.append(prefill_case(op, dt, "pool", layout=layout))
                cases.append(prefill_case(op, dt, "dense", layout=layout))
                for sdt in ("float32", "float64", "bfloat16"):
                    cases.append(prefill_case(op, dt, "dense_h0", state_dtype=sdt, layout=layout))
            cases.append(prefill_case(op, "float64", "pool", state_dtype="float64", his=True))
        else:
            cases += [clamp_case(dt, limit) for dt in DTYPES for limit in (None, 10.0)]
    return cases


def case_id(case: tuple) -> str:
    op, args = case
    parts = [op]
    for name, x in args.items():
        if isinstance(x, torch.Tensor):
            parts.append(f"{name}={str(x.dtype)[6:]}{list(x.shape)}{'' if x.is_contiguous() else 'T'}")
        elif x is not None and name != "state_layout":
            parts.append(f"{name}={x}")
    parts.append(args.get("state_layout", ""))
    return ",".join(p for p in parts if p)


def meta_of(out) -> list:
    """[(shape, dtype, device type, strides)] of a tensor or a tuple of tensors."""
    items = out if isinstance(out, tuple) else (out,)
    return [(tuple(x.shape), x.dtype, x.device.type, tuple(x.stride())) for x in items]


def _fresh(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def compare_fake(op: str, args: dict, backend=None) -> list:
    """Run ``op`` for real (on copies: the pool stays as given) and under ``FakeTensorMode``;
    return a list of differences in (shape, dtype, device, strides), empty when they agree."""
    fn = getattr(linattn, op)
    with torch.no_grad():
        real = meta_of(fn(**{k: _fresh(x) for k, x in args.items()}, backend=backend))
        with FakeTensorMode() as mode:
            fargs = {k: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for k, x in args.items()}
            fake = meta_of(fn(**fargs, backend=backend))
    if len(real) != len(fake):
        return [f"{len(real)} outputs for real, {len(fake)} fake"]
    return [f"output {i}: real {r}, fake {f}" for i, (r, f) in enumerate(zip(real, fake)) if r != f]


def assert_same_exception(got: BaseException, want: BaseException) -> None:
    """F40: ``got`` (e.g. unpickled) is ``want``'s type with the same message, args and attributes."""
    assert type(got) is type(want)
    assert str(got) == str(want)
    assert got.args == want.args
    assert got.__dict__.keys() == want.__dict__.keys()
    for k, v in want.__dict__.items():
        assert getattr(got, k) == v, k
