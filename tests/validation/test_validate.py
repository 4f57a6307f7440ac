"""Tests of the validation layer (dispatch/rules/validate.py): every ops.md rule, defaults, signatures.

Shapes are small and K != V (K=8, V=4) so that a transposed pool can never pass for the right one.
Every rejected call is checked to leave every input tensor (pools included) bitwise unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from linattn.dispatch.plugin.problem import Problem
from linattn.dispatch.rules.validate import validate

N, T, H, HV, K, V, P, S = 3, 2, 2, 4, 8, 4, 6, 5
LENGTHS = (3, 0, 4)  # prefill: a zero-length sequence in the middle
TP = sum(LENGTHS)

CONTRACT = {  # backends/base.py module docstring
    "gdn_gating": {"A_log", "a", "b", "dt_bias", "softplus_beta", "softplus_threshold"},
    "kda_gating": {"A_log", "a", "b", "dt_bias", "lower_bound", "softplus_beta", "softplus_threshold"},
    "gdn_decode": {"q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "state_indices", "scale",
                   "use_qk_l2norm", "state_layout", "intermediate_states", "intermediate_state_indices",
                   "disable_state_update", "num_accepted_tokens", "softplus_beta", "softplus_threshold"},
    "gdn_prefill": {"q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices",
                    "initial_state", "scale", "use_qk_l2norm", "state_layout"},
    "silu_and_mul_clamp": {"x", "limit"},
}
CONTRACT["kda_decode"] = CONTRACT["gdn_decode"] | {"lower_bound"}
CONTRACT["kda_prefill"] = CONTRACT["gdn_prefill"]


# -- valid inputs ----------------------------------------------------------------------------------

def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def decode_args(op="gdn_decode", **over):
    kda = op.startswith("kda")
    args = dict(q=_r(N, T, H, K, dtype=torch.bfloat16), k=_r(N, T, H, K, dtype=torch.bfloat16),
                v=_r(N, T, HV, V, dtype=torch.bfloat16),
                a=_r(N, T, HV, K) if kda else _r(N, T, HV), b=_r(N, T, HV),
                A_log=_r(HV), dt_bias=_r(HV, K) if kda else _r(HV),
                state_pool=_r(P, HV, V, K), state_indices=torch.tensor([2, 0, -1], dtype=torch.int32))
    args.update(over)
    return args


def prefill_args(op="gdn_prefill", mode="pool", lengths=LENGTHS, **over):
    kda = op.startswith("kda")
    t, n = sum(lengths), len(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    args = dict(q=_r(t, H, K), k=_r(t, H, K), v=_r(t, HV, V),
                g=-_r(t, HV, K).abs() if kda else -_r(t, HV).abs(), beta=_r(t, HV).sigmoid(),
                cu_seqlens=cu)
    if mode == "pool":
        args.update(state_pool=_r(P, HV, V, K),
                    state_indices=torch.tensor([4, 0, -1][:n] + [-1] * max(0, n - 3), dtype=torch.int64))
    elif mode == "dense":
        args.update(initial_state=_r(n, HV, V, K))
    args.update(over)
    return args


def gating_args(op="gdn_gating", **over):
    kda = op.startswith("kda")
    args = dict(A_log=_r(HV), a=_r(7, HV, K) if kda else _r(7, HV), b=_r(7, HV),
                dt_bias=_r(HV, K) if kda else _r(HV))
    args.update(over)
    return args


def clamp_args(**over):
    args = dict(x=_r(5, 2 * 6, dtype=torch.bfloat16), limit=10.0)
    args.update(over)
    return args


def args_for(op, **over):
    if op.endswith("_decode"):
        return decode_args(op, **over)
    if op.endswith("_prefill"):
        return prefill_args(op, **over)
    if op.endswith("_gating"):
        return gating_args(op, **over)
    return clamp_args(**over)


# -- helpers ---------------------------------------------------------------------------------------

def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).contiguous().view(torch.uint8)


def raises_untouched(op, args, exc, match, **kw):
    """validate() raises `exc` matching `match`; every input tensor is bitwise unchanged."""
    before = {name: (x, x.clone()) for name, x in args.items()
              if isinstance(x, torch.Tensor) and x.device.type != "meta"}
    snapshot = dict(args)
    with pytest.raises(exc, match=match) as info:
        validate(op, args, **kw)
    assert set(args) == set(snapshot) and all(args[k] is snapshot[k] for k in snapshot)
    for name, (x, copy) in before.items():
        assert torch.equal(_bits(x), _bits(copy)), f"{name} was modified"
    return str(info.value)


# -- normalisation and signatures ------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(CONTRACT))
def test_returns_exactly_the_contract_keys_and_a_buildable_problem(op):
    args = args_for(op)
    out, sig = validate(op, args)
    assert set(out) == CONTRACT[op]
    assert out is not args
    hash(sig)
    problem = Problem(**dict(sig))
    assert problem.op == op


@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_decode_defaults_are_filled(op):
    out, sig = validate(op, decode_args(op))
    assert type(out["scale"]) is float and out["scale"] == K ** -0.5
    assert out["use_qk_l2norm"] is True and out["state_layout"] == "vk"
    assert out["disable_state_update"] is False
    assert out["softplus_beta"] == 1.0 and out["softplus_threshold"] == 20.0
    assert out["intermediate_states"] is None and out["intermediate_state_indices"] is None
    assert out["num_accepted_tokens"] is None
    if op == "kda_decode":
        assert out["lower_bound"] is None


def test_prefill_defaults_are_filled_in_dense_mode_without_state():
    out, sig = validate("gdn_prefill", prefill_args(mode="none"))
    assert out["state_pool"] is None and out["state_indices"] is None and out["initial_state"] is None
    assert out["scale"] == K ** -0.5 and out["use_qk_l2norm"] is True and out["state_layout"] == "vk"
    assert dict(sig)["mode"] == "dense"


def test_gating_and_clamp_defaults_are_filled():
    out, _ = validate("kda_gating", gating_args("kda_gating"))
    assert out["softplus_beta"] == 1.0 and out["softplus_threshold"] == 20.0 and out["lower_bound"] is None
    out, sig = validate("silu_and_mul_clamp", clamp_args(limit=None))
    assert out["limit"] is None and dict(sig)["clamp_limit"] is False


def test_given_scalars_are_normalised_to_python_floats():
    out, _ = validate("gdn_decode", decode_args(scale=1, softplus_beta=2, softplus_threshold=15))
    assert type(out["scale"]) is float and out["scale"] == 1.0
    assert type(out["softplus_beta"]) is float and type(out["softplus_threshold"]) is float
    out, sig = validate("silu_and_mul_clamp", clamp_args(limit=7))
    assert type(out["limit"]) is float and out["limit"] == 7.0 and dict(sig)["clamp_limit"] is True


def test_none_optionals_mean_defaults():
    out, _ = validate("gdn_decode", decode_args(scale=None, use_qk_l2norm=None, state_layout=None,
                                                disable_state_update=None))
    assert out["scale"] == K ** -0.5 and out["use_qk_l2norm"] is True and out["state_layout"] == "vk"


def test_input_dict_and_tensors_are_never_modified():
    args = decode_args(scale=None)
    snapshot = dict(args)
    clones = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    out, _ = validate("gdn_decode", args)
    assert set(args) == set(snapshot) and all(args[k] is snapshot[k] for k in snapshot)
    assert args["scale"] is None and out["scale"] is not None
    for name, copy in clones.items():
        assert torch.equal(_bits(args[name]), _bits(copy))
        assert out[name] is args[name]  # tensors are passed through, never copied


def test_decode_signature_fields():
    args = decode_args("kda_decode", state_layout="kv", state_pool=_r(P, HV, K, V, dtype=torch.bfloat16),
                       lower_bound=-5.0, disable_state_update=True,
                       intermediate_states=_r(S, T, HV, K, V), intermediate_state_indices=torch.tensor([0, 1, 2]),
                       state_indices=torch.tensor([[0, 1], [2, 3], [-1, -1]]),
                       num_accepted_tokens=torch.tensor([1, 2, 0]))
    sig = dict(validate("kda_decode", args)[1])
    assert sig == dict(op="kda_decode", n=N, t=T, h=H, hv=HV, k=K, v=V, d=0, dtype="bfloat16",
                       state_dtype="bfloat16", state_layout="kv", mode="pool", max_seqlen=0,
                       intermediate_states=True, num_accepted_tokens=True, disable_state_update=True,
                       lower_bound=True, clamp_limit=False, state_tiles_contiguous=True, requires_grad=False,
                       precomputed_gates=False, has_initial_state=False, output_state_indices=False,
                       checkpoints=False)


def test_prefill_signature_counts_sequences_and_total_tokens():
    sig = dict(validate("gdn_prefill", prefill_args())[1])
    assert (sig["n"], sig["t"], sig["h"], sig["hv"], sig["k"], sig["v"]) == (len(LENGTHS), TP, H, HV, K, V)
    assert sig["mode"] == "pool" and sig["max_seqlen"] == 0 and sig["dtype"] == "float32"
    sig = dict(validate("kda_prefill", prefill_args("kda_prefill", mode="dense",
                                                     initial_state=_r(3, HV, V, K, dtype=torch.float64)))[1])
    assert sig["mode"] == "dense" and sig["state_dtype"] == "float64"


def test_prefill_max_seqlen_is_known_only_for_one_sequence():
    assert dict(validate("gdn_prefill", prefill_args(mode="none", lengths=(9,)))[1])["max_seqlen"] == 9
    assert dict(validate("gdn_prefill", prefill_args(mode="none", lengths=(2, 9)))[1])["max_seqlen"] == 0


def test_clamp_and_gating_signatures():
    sig = dict(validate("silu_and_mul_clamp", clamp_args(x=_r(0, 2 * 18432, dtype=torch.float16)))[1])
    assert (sig["n"], sig["d"], sig["dtype"], sig["mode"]) == (0, 18432, "float16", "none")
    sig = dict(validate("kda_gating", gating_args("kda_gating", lower_bound=-5.0))[1])
    assert (sig["n"], sig["hv"], sig["k"], sig["mode"], sig["lower_bound"]) == (7, HV, K, "none", True)
    sig = dict(validate("gdn_gating", gating_args(a=_r(2, 3, HV), b=_r(2, 3, HV)))[1])
    assert (sig["n"], sig["hv"], sig["k"]) == (6, HV, 0)


def test_equal_calls_give_equal_signatures():
    assert validate("gdn_decode", decode_args())[1] == validate("gdn_decode", decode_args())[1]


# -- host rules: one case per rule -----------------------------------------------------------------

def _drop(name):
    def f(a):
        a[name] = None
        return a
    return f


def _set(**kv):
    def f(a):
        a.update(kv)
        return a
    return f


BAD = [
    # call surface
    ("gdn_decode", _set(bogus=1), TypeError, "bogus"),
    ("gdn_decode", _drop("q"), TypeError, "'q'"),
    ("gdn_decode", _set(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    # q, k, v ranks, shapes, dtypes, GVA ratio
    ("gdn_decode", _set(q=_r(N, H, K)), ValueError, r"q must be 4-D \[N, T, H, K\]"),
    ("gdn_decode", _set(k=_r(N, T, H, K + 1, dtype=torch.bfloat16)), ValueError, "k must have the shape of q"),
    ("gdn_decode", _set(v=_r(N + 1, T, HV, V, dtype=torch.bfloat16)), ValueError, "v .* leading dims"),
    ("gdn_decode", _set(v=_r(N, T, 3, V, dtype=torch.bfloat16)), ValueError, r"H=2 .*HV=3"),
    ("gdn_decode", _set(q=torch.zeros(N, T, H, K, dtype=torch.int32)), TypeError, "q has dtype torch.int32"),
    ("gdn_decode", _set(k=_r(N, T, H, K, dtype=torch.float16)), TypeError, "q, k and v must share one dtype"),
    ("gdn_prefill", _set(q=_r(1, TP, H, K), k=_r(1, TP, H, K)), ValueError, r"q must be 3-D \[T, H, K\]"),
    # decode gates (GDN and KDA)
    ("gdn_decode", _set(a=_r(N, T, HV, 1)), ValueError, r"a must have shape \[N, T, HV\]"),
    ("gdn_decode", _set(b=_r(N, T, HV + 1)), ValueError, r"b must have shape \[N, T, HV\]"),
    ("kda_decode", _set(a=_r(N, T, HV)), ValueError, r"a must have shape \[N, T, HV, K\]"),
    ("kda_decode", _set(dt_bias=_r(HV)), ValueError, r"dt_bias must have shape \[HV, K\]"),
    ("gdn_decode", _set(A_log=_r(HV, 1)), ValueError, r"A_log must have shape \[HV\]"),
    ("gdn_decode", _set(a=torch.zeros(N, T, HV, dtype=torch.int64)), TypeError, "a has dtype"),
    ("gdn_decode", _set(dt_bias=torch.zeros(HV, dtype=torch.int64)), TypeError, "dt_bias has dtype"),
    # prefill gates: shapes, fp32
    ("gdn_prefill", _set(g=_r(TP, HV, dtype=torch.bfloat16)), TypeError, "g has dtype .*fp32"),
    ("gdn_prefill", _set(beta=_r(TP, HV, 1)), ValueError, r"beta must have shape \[T, HV\]"),
    ("kda_prefill", _set(g=_r(TP, HV)), ValueError, r"g must have shape \[T, HV, K\]"),
    # cu_seqlens
    ("gdn_prefill", _set(cu_seqlens=torch.tensor([0.0, 3.0, 3.0, 7.0])), TypeError, "cu_seqlens has dtype"),
    ("gdn_prefill", _set(cu_seqlens=torch.tensor([[0, 3, 3, 7]], dtype=torch.int32)), ValueError,
     r"cu_seqlens must be 1-D \[N \+ 1\]"),
    ("gdn_prefill", _set(cu_seqlens=torch.zeros(0, dtype=torch.int32)), ValueError, "cu_seqlens must be 1-D"),
    # state pool: rank, dtype, shape, layout
    ("gdn_decode", _set(state_pool=_r(P, HV, V * K)), ValueError, "state_pool must be 4-D"),
    ("gdn_decode", _set(state_pool=_r(P, HV, V, K, dtype=torch.float16)), TypeError, "state_pool has dtype"),
    ("gdn_decode", _set(state_pool=_r(P, HV + 1, V, K)), ValueError, r"state_pool must be \[P, HV, V, K\]"),
    ("gdn_decode", _set(state_pool=_r(P, HV, K, V)), ValueError, "state_layout='kv'"),
    ("gdn_decode", _set(state_layout="kv"), ValueError, "state_layout='vk'"),
    ("gdn_decode", _set(state_layout="VK"), ValueError, "state_layout must be 'vk'"),
    ("gdn_prefill", _set(state_pool=_r(P, HV, K, V)), ValueError, "state_layout='kv'"),
    # state indices
    ("gdn_decode", _set(state_indices=torch.tensor([2.0, 0.0, -1.0])), TypeError, "state_indices has dtype"),
    ("gdn_decode", _set(state_indices=torch.tensor([0, 1, 2, 3])), ValueError, r"state_indices must have shape \[N\]"),
    ("gdn_decode", _set(state_indices=torch.zeros(N, T + 1, dtype=torch.int32)), ValueError,
     r"state_indices must have shape \[N, T\]"),
    ("gdn_prefill", _set(state_indices=torch.tensor([[0, 1, 2]])), ValueError, r"state_indices must have shape \[N\]"),
    # F23 and pool mode XOR dense mode
    ("gdn_decode", _drop("state_indices"), ValueError, "in-place mode without indices"),
    ("gdn_prefill", _drop("state_indices"), ValueError, "in-place mode without indices"),
    ("gdn_prefill", _drop("state_pool"), ValueError, "state_indices was given without state_pool"),
    ("gdn_prefill", _set(initial_state=_r(3, HV, V, K)), ValueError, "state_pool and initial_state"),
    # intermediate states and accepted tokens
    ("gdn_decode", _set(intermediate_states=_r(S, T, HV, V * K), intermediate_state_indices=torch.tensor([0, 1, 2])),
     ValueError, "intermediate_states must be 5-D"),
    ("gdn_decode", _set(intermediate_states=_r(S, T - 1, HV, V, K), intermediate_state_indices=torch.tensor([0, 1, 2])),
     ValueError, "intermediate_states has 1 steps"),
    ("gdn_decode", _set(intermediate_states=_r(S, T, HV, K, V), intermediate_state_indices=torch.tensor([0, 1, 2])),
     ValueError, "state_layout='kv'"),
    ("gdn_decode", _set(intermediate_states=_r(S, T, HV, V, K, dtype=torch.float16),
                        intermediate_state_indices=torch.tensor([0, 1, 2])), TypeError, "intermediate_states has dtype"),
    ("gdn_decode", _set(intermediate_states=_r(S, T, HV, V, K)), ValueError,
     "intermediate_states was given without intermediate_state_indices"),
    ("gdn_decode", _set(intermediate_state_indices=torch.tensor([0, 1, 2])), ValueError,
     "intermediate_state_indices was given without intermediate_states"),
    ("gdn_decode", _set(intermediate_states=_r(S, T, HV, V, K), intermediate_state_indices=torch.tensor([0, 1])),
     ValueError, r"intermediate_state_indices must have shape \[N\]"),
    ("gdn_decode", _set(num_accepted_tokens=torch.tensor([1, 1, 1])), ValueError,
     r"num_accepted_tokens needs a per-token slot table state_indices \[N, T\]"),
    ("gdn_decode", _set(num_accepted_tokens=torch.tensor([1.0, 1.0, 1.0]), state_indices=torch.zeros(N, T, dtype=torch.long)),
     TypeError, "num_accepted_tokens has dtype"),
    ("gdn_decode", _set(num_accepted_tokens=torch.tensor([1, 1]), state_indices=torch.zeros(N, T, dtype=torch.long)),
     ValueError, r"num_accepted_tokens must have shape \[N\]"),
    # writes must not alias (zero strides)
    ("gdn_decode", _set(state_pool=torch.zeros(1, HV, V, K).expand(P, HV, V, K)), ValueError,
     "state_pool is written in place but has stride 0"),
    ("gdn_prefill", _set(state_pool=torch.zeros(P, HV, V, 1).expand(P, HV, V, K)), ValueError,
     "state_pool is written in place but has stride 0"),
    ("gdn_decode", _set(intermediate_states=torch.zeros(1, T, HV, V, K).expand(S, T, HV, V, K),
                        intermediate_state_indices=torch.tensor([0, 1, 2])), ValueError,
     "intermediate_states is written in place but has stride 0"),
    # dense mode initial state
    ("gdn_prefill", _set(state_pool=None, state_indices=None, initial_state=_r(2, HV, V, K)), ValueError,
     "initial_state must be .* N=3"),
    ("kda_prefill", _set(state_pool=None, state_indices=None, initial_state=_r(3, HV, K, V)), ValueError,
     "initial_state .*state_layout='kv'"),
    ("gdn_prefill", _set(state_pool=None, state_indices=None, initial_state=_r(3, HV, V, K).half()), TypeError,
     "initial_state has dtype"),
    # scalars and flags
    ("gdn_decode", _set(scale=0.0), ValueError, "scale must be finite and > 0"),
    ("gdn_decode", _set(scale=-0.1), ValueError, "scale must be finite and > 0"),
    ("gdn_decode", _set(scale=math.inf), ValueError, "scale must be finite and > 0"),
    ("gdn_prefill", _set(scale=math.nan), ValueError, "scale must be finite and > 0"),
    ("gdn_decode", _set(scale=torch.tensor(0.1)), TypeError, "scale must be a Python float"),
    ("gdn_decode", _set(scale=True), TypeError, "scale must be a Python float"),
    ("gdn_decode", _set(use_qk_l2norm=1), TypeError, "use_qk_l2norm must be a bool"),
    ("gdn_decode", _set(disable_state_update="no"), TypeError, "disable_state_update must be a bool"),
    ("gdn_decode", _set(softplus_beta=0.0), ValueError, "softplus_beta must be finite and > 0"),
    ("gdn_gating", _set(softplus_threshold=math.nan), ValueError, "softplus_threshold must be finite and > 0"),
    ("kda_decode", _set(lower_bound=5.0), ValueError, "lower_bound must be None or finite and < 0"),
    ("kda_gating", _set(lower_bound=-math.inf), ValueError, "lower_bound must be None or finite and < 0"),
    # gating op shapes
    ("gdn_gating", _set(b=_r(7, HV + 1)), ValueError, r"b must be \[..., HV\] with a.s leading dims"),
    ("gdn_gating", _set(a=torch.tensor(1.0)), ValueError, "a must be"),
    ("kda_gating", _set(a=_r(HV)), ValueError, r"a must be \[..., HV, K\]"),
    ("kda_gating", _set(dt_bias=_r(HV)), ValueError, r"dt_bias must have shape \[HV, K\]"),
    ("gdn_gating", _set(A_log=_r(HV + 1)), ValueError, r"A_log must have shape \[HV\]"),
    # silu_and_mul_clamp, F05 limit sentinels
    ("silu_and_mul_clamp", _set(x=_r(10)), ValueError, r"x must be 2-D \[M, 2D\]"),
    ("silu_and_mul_clamp", _set(x=_r(4, 7)), ValueError, r"x must be 2-D \[M, 2D\]"),
    ("silu_and_mul_clamp", _set(x=_r(4, 0)), ValueError, r"x must be 2-D \[M, 2D\]"),
    ("silu_and_mul_clamp", _set(x=torch.zeros(4, 8, dtype=torch.int8)), TypeError, "x has dtype"),
    ("silu_and_mul_clamp", _set(limit=0.0), ValueError, "limit must be finite and > 0"),
    ("silu_and_mul_clamp", _set(limit=0), ValueError, "limit must be finite and > 0"),
    ("silu_and_mul_clamp", _set(limit=-10.0), ValueError, "limit must be finite and > 0"),
    ("silu_and_mul_clamp", _set(limit=math.inf), ValueError, "limit must be finite and > 0"),
    ("silu_and_mul_clamp", _set(limit=math.nan), ValueError, "limit must be finite and > 0"),
    ("silu_and_mul_clamp", _set(limit=True), TypeError, "limit must be a Python float"),
    ("silu_and_mul_clamp", _set(limit="10"), TypeError, "limit must be a Python float"),
]


@pytest.mark.parametrize("op, mutate, exc, match", BAD, ids=[f"{c[0]}-{c[3][:40]}" for c in BAD])
def test_host_rule_rejects_bad_input_and_leaves_inputs_untouched(op, mutate, exc, match):
    args = mutate(args_for(op))
    # host rules always run, values or not
    raises_untouched(op, args, exc, match, check_values=False)


def test_unknown_op_is_rejected():
    with pytest.raises(ValueError, match="unknown op 'gdn_decodee'"):
        validate("gdn_decodee", decode_args())


@pytest.mark.parametrize("op, name", [("gdn_decode", "A_log"), ("kda_decode", "state_pool"),
                                      ("gdn_prefill", "cu_seqlens"), ("kda_gating", "b")])
def test_tensors_on_two_devices_are_rejected_naming_both(op, name):
    args = args_for(op)
    args[name] = torch.empty_like(args[name], device="meta")
    msg = raises_untouched(op, args, ValueError, "one device", check_values=False)
    assert "cpu" in msg and "meta" in msg and name in msg


def test_pool_in_the_other_layout_is_rejected_in_both_directions():
    msg = raises_untouched("gdn_decode", decode_args(state_layout="kv"), ValueError, "state_layout")
    assert "'vk' layout" in msg and "K=8, V=4" in msg
    validate("gdn_decode", decode_args(state_layout="kv", state_pool=_r(P, HV, K, V)))


def test_k_equal_v_pool_is_read_in_the_declared_layout():
    args = decode_args(q=_r(N, T, H, V, dtype=torch.bfloat16), k=_r(N, T, H, V, dtype=torch.bfloat16),
                       state_pool=_r(P, HV, V, V), state_layout="kv")
    out, sig = validate("gdn_decode", args)
    assert out["state_layout"] == "kv" and dict(sig)["state_layout"] == "kv"


def test_empty_decode_batch_and_zero_tokens_are_accepted():
    n0 = dict(q=_r(0, T, H, K), k=_r(0, T, H, K), v=_r(0, T, HV, V), a=_r(0, T, HV), b=_r(0, T, HV),
              state_indices=torch.zeros(0, dtype=torch.int32))
    assert dict(validate("gdn_decode", decode_args(**n0))[1])["n"] == 0
    t0 = dict(q=_r(N, 0, H, K), k=_r(N, 0, H, K), v=_r(N, 0, HV, V), a=_r(N, 0, HV), b=_r(N, 0, HV),
              state_indices=torch.zeros(N, 0, dtype=torch.int32))
    assert dict(validate("gdn_decode", decode_args(**t0))[1])["t"] == 0


def test_read_only_broadcast_pool_is_accepted_when_no_state_is_written():
    pool = torch.zeros(1, HV, V, K).expand(P, HV, V, K)
    validate("gdn_decode", decode_args(state_pool=pool, disable_state_update=True))


# -- field cases -----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["gdn_decode", "kda_decode"])
def test_f11_strided_gate_views_are_accepted(op):
    kda = op == "kda_decode"
    ab = _r(N, T, 2 * HV, K) if kda else _r(N, T, 2 * HV)
    a = ab[:, :, 0::2]
    qkv = _r(N, T, 2 * H * K + HV * V, dtype=torch.bfloat16)
    q, k = qkv[..., :H * K].view(N, T, H, K), qkv[..., H * K:2 * H * K].view(N, T, H, K)
    v = qkv[..., 2 * H * K:].view(N, T, HV, V)
    b = _r(N, T, 2 * HV)[:, :, 1::2]
    assert not a.is_contiguous() and not b.is_contiguous() and not q.is_contiguous()
    out, _ = validate(op, decode_args(op, a=a, b=b, q=q, k=k, v=v))
    assert out["a"] is a and out["b"] is b


def test_f11_strided_prefill_gates_are_accepted():
    gb = -_r(TP, 2 * HV).abs()
    validate("gdn_prefill", prefill_args(g=gb[:, 0::2], beta=gb[:, 1::2].sigmoid()))


def test_f05_limit_none_means_no_clamp():
    out, sig = validate("silu_and_mul_clamp", {"x": _r(3, 4)})
    assert out == {"x": out["x"], "limit": None} and dict(sig)["clamp_limit"] is False


@pytest.mark.parametrize("op", ["gdn_decode", "gdn_prefill"])
def test_f23_pool_without_indices_is_a_clear_error(op):
    args = args_for(op)
    del args["state_indices"]
    msg = raises_untouched(op, args, ValueError, "in-place mode without indices")
    assert "state_indices" in msg


def test_f07_slot_zero_is_a_valid_slot():
    validate("gdn_decode", decode_args(state_indices=torch.tensor([0, 1, 2], dtype=torch.int32)))
    validate("gdn_prefill", prefill_args(state_indices=torch.tensor([0, -1, 5])))


def test_negative_indices_are_padding_and_may_repeat():
    validate("gdn_decode", decode_args(state_indices=torch.tensor([-1, -1, -7], dtype=torch.int32)))
    validate("gdn_decode", decode_args(state_indices=torch.tensor([[-1, -1], [3, -1], [-1, -2]])))
    validate("gdn_prefill", prefill_args(state_indices=torch.tensor([-1, -1, -1])))


# -- value rules -----------------------------------------------------------------------------------

def test_slot_out_of_range_names_value_position_and_range():
    args = decode_args(state_indices=torch.tensor([2, P, -1], dtype=torch.int32))
    msg = raises_untouched("gdn_decode", args, ValueError, r"state_indices\[1\] = 6")
    assert f"0..{P - 1}" in msg and "negative values mean padding" in msg


def test_slot_out_of_range_in_a_token_table_names_row_and_column():
    args = decode_args(state_indices=torch.tensor([[0, 1], [2, 3], [4, P + 3]]))
    raises_untouched("gdn_decode", args, ValueError, r"state_indices\[2, 1\] = 9 is out of range")


def test_prefill_slot_out_of_range_is_rejected():
    raises_untouched("kda_prefill", prefill_args("kda_prefill", state_indices=torch.tensor([0, 100, -1])),
                     ValueError, r"state_indices\[1\] = 100")


def test_duplicate_slot_across_sequences_is_rejected_when_writing():
    args = decode_args(state_indices=torch.tensor([3, -1, 3], dtype=torch.int32))
    msg = raises_untouched("gdn_decode", args, ValueError, "slot 3 is named by sequence 0 and sequence 2")
    assert "state_indices" in msg


def test_duplicate_slot_is_allowed_when_the_pool_is_not_written():
    validate("gdn_decode", decode_args(state_indices=torch.tensor([3, 3, 3], dtype=torch.int32),
                                       disable_state_update=True))


def test_prefill_pool_mode_rejects_duplicate_slots():
    args = prefill_args(state_indices=torch.tensor([5, 5, 0]))
    raises_untouched("gdn_prefill", args, ValueError, "slot 5 is named by sequence 0 and sequence 1")


def test_token_table_allows_repeats_within_a_row_but_not_across_rows():
    nat = torch.tensor([2, 1, 0], dtype=torch.int32)
    ok = torch.tensor([[1, 1], [2, 2], [-1, 0]])
    validate("gdn_decode", decode_args(state_indices=ok, num_accepted_tokens=nat))
    bad = torch.tensor([[1, 1], [2, 1], [-1, -1]])
    raises_untouched("gdn_decode", decode_args(state_indices=bad, num_accepted_tokens=nat),
                     ValueError, "slot 1 is named by sequence 0 and sequence 1")


def test_intermediate_state_indices_must_be_below_rows():
    args = decode_args(intermediate_states=_r(S, 2 * T, HV, V, K)[:, :T],
                       intermediate_state_indices=torch.tensor([0, S, -1]))
    msg = raises_untouched("gdn_decode", args, ValueError, r"intermediate_state_indices\[1\] = 5")
    assert f"0..{S - 1}" in msg


def test_intermediate_rows_may_not_be_shared_but_may_be_skipped():
    buf = _r(S, T, HV, V, K)
    validate("gdn_decode", decode_args(intermediate_states=buf, intermediate_state_indices=torch.tensor([-1, 4, -1])))
    raises_untouched("gdn_decode", decode_args(intermediate_states=buf,
                                               intermediate_state_indices=torch.tensor([4, 4, -1])),
                     ValueError, "intermediate_state_indices: slot 4 is named by sequence 0 and sequence 1")


def test_f09_intermediate_view_of_a_longer_buffer_is_accepted():
    buf = _r(S, 8, HV, V, K)
    out, _ = validate("gdn_decode", decode_args(intermediate_states=buf[:, :T], disable_state_update=True,
                                                intermediate_state_indices=torch.tensor([0, 1, 2])))
    assert out["intermediate_states"].stride(0) == 8 * HV * V * K


@pytest.mark.parametrize("bad", [-1, T + 1])
def test_num_accepted_tokens_outside_zero_to_t_is_rejected(bad):
    args = decode_args(state_indices=torch.tensor([[0, 1], [2, 3], [4, 5]]),
                       num_accepted_tokens=torch.tensor([1, bad, 0]))
    msg = raises_untouched("gdn_decode", args, ValueError, rf"num_accepted_tokens\[1\] = {bad}")
    assert f"0..{T}" in msg


def test_num_accepted_tokens_whole_domain_is_accepted():
    table = torch.tensor([[0, 1], [2, 3], [4, 5]])
    for nat in ([0, 0, 0], [T, T, T], [0, 1, T]):
        validate("gdn_decode", decode_args(state_indices=table, num_accepted_tokens=torch.tensor(nat)))


@pytest.mark.parametrize("cu, match", [
    ([1, 3, 3, 7], r"cu_seqlens\[0\] = 1; it must be 0"),
    ([0, 4, 3, 7], r"cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 4"),
    ([0, 3, 3, 6], r"cu_seqlens\[-1\] = 6 must equal the total token count T = 7"),
])
def test_bad_cu_seqlens_is_rejected(cu, match):
    raises_untouched("gdn_prefill", prefill_args(cu_seqlens=torch.tensor(cu, dtype=torch.int64)), ValueError, match)


@pytest.mark.parametrize("lengths", [(0,), (0, 0), (0, 5), (5, 0, 0), (128, 0, 128)])
def test_f19_zero_length_sequences_are_legal(lengths):
    n = len(lengths)
    validate("gdn_prefill", prefill_args(mode="dense", lengths=lengths, initial_state=_r(n, HV, V, K)))
    validate("kda_prefill", prefill_args("kda_prefill", mode="none", lengths=lengths))


VALUE_ONLY = [
    ("gdn_decode", dict(state_indices=torch.tensor([2, P, -1], dtype=torch.int32))),
    ("gdn_decode", dict(state_indices=torch.tensor([1, 1, -1], dtype=torch.int32))),
    ("gdn_decode", dict(intermediate_states=_r(S, T, HV, V, K), intermediate_state_indices=torch.tensor([S, 0, 1]))),
    ("gdn_decode", dict(state_indices=torch.zeros(N, T, dtype=torch.long), num_accepted_tokens=torch.tensor([9, 0, 0]),
                        disable_state_update=True)),
    ("gdn_prefill", dict(cu_seqlens=torch.tensor([0, 9, 3, 1], dtype=torch.int32))),
    ("gdn_prefill", dict(state_indices=torch.tensor([0, 0, 99]))),
]


@pytest.mark.parametrize("op, over", VALUE_ONLY)
def test_value_checks_are_skipped_with_check_values_false(op, over):
    args = args_for(op, **over)
    validate(op, args, check_values=False)
    with pytest.raises(ValueError):
        validate(op, args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for CUDA graph capture")
def test_value_checks_are_skipped_during_cuda_graph_capture():
    args = {k: (v.cuda() if isinstance(v, torch.Tensor) else v)
            for k, v in decode_args(state_indices=torch.tensor([1, 1, -1], dtype=torch.int32)).items()}
    with pytest.raises(ValueError):
        validate("gdn_decode", args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = args["q"] * 2  # keep the captured graph non-empty
        kwargs, _ = validate("gdn_decode", args)  # would raise (and sync) in eager mode
    graph.replay()
    torch.cuda.synchronize()
    assert kwargs["state_indices"] is args["state_indices"] and out.shape == args["q"].shape


def test_a_pool_that_requires_grad_is_rejected_before_anything_runs():
    import torch

    from linattn.dispatch.rules.validate import validate

    N, T, H, HV, K, V, P = 2, 1, 1, 2, 4, 4, 3
    pool = torch.zeros(P, HV, V, K, requires_grad=True)
    args = dict(q=torch.randn(N, T, H, K), k=torch.randn(N, T, H, K), v=torch.randn(N, T, HV, V),
                a=torch.randn(N, T, HV), b=torch.randn(N, T, HV), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV),
                state_pool=pool, state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="requires grad"):
        validate("gdn_decode", args, check_values=False)


def test_gating_shape_mismatch_names_both_tensors_and_the_model_hv():
    import torch

    from linattn.dispatch.rules.validate import validate

    args = dict(A_log=torch.zeros(4), a=torch.zeros(10, 5), b=torch.zeros(10, 4), dt_bias=torch.zeros(4))
    with pytest.raises(ValueError, match=r"a \[10, 5\] and b \[10, 4\].*HV=4"):
        validate("gdn_gating", args, check_values=False)


@pytest.mark.parametrize("option, value", [("validate", "no"), ("validate", None), ("validate", 1), ("check_finite", 0)])
def test_call_options_are_bools_also_after_a_planned_call(option, value):
    """``validate="no"`` would validate and ``None`` skip the checks; ``1`` equals True, so it must not meet the
    plan a True call left (the per-call key holds the option's value): a TypeError each time, nothing written."""
    import linattn

    args = decode_args(q=_r(N, T, H, K), k=_r(N, T, H, K), v=_r(N, T, HV, V))
    linattn.gdn_decode(**args)  # plans the call with validate=True, check_finite=False
    before = args["state_pool"].clone()
    with pytest.raises(TypeError, match=f"{option} must be a bool \\(True or False\\), got {type(value).__name__}"):
        linattn.gdn_decode(**args, **{option: value})
    assert torch.equal(args["state_pool"], before)


@pytest.mark.parametrize("value, named", [(np.bool_(True), "numpy.bool"), (torch.tensor(True), "torch.Tensor")])
def test_a_call_option_of_another_bool_type_is_named_by_its_qualified_type(value, named):
    import linattn

    with pytest.raises(TypeError, match=f"validate must be a bool \\(True or False\\), got {named} "):
        linattn.silu_and_mul_clamp(torch.randn(2, 4), validate=value)
