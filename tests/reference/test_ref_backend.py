"""TorchRefBackend: declared capabilities, ranking, the op-method keyword contract, compute dtype."""

import inspect
import re

import pytest
import torch

from linattn.backends import base
from linattn.backends.torch_ref import (TorchRefBackend, gdn_decode_ref, gdn_gating_ref,
                                        gdn_prefill_ref, kda_decode_ref, kda_gating_ref,
                                        kda_prefill_ref, silu_and_mul_clamp_ref)
from linattn.capabilities import profile
from linattn.dispatch.plugin.problem import OPS, Problem

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16


def contract() -> dict[str, list[str]]:
    """The op methods' keyword arguments as backends/base.py's module docstring lists them."""
    found = dict(re.findall(r"``(\w+)\((.*?)\) ->", base.__doc__, flags=re.S))
    out = {}
    for op, args in found.items():
        names = []
        for arg in (a.strip() for a in args.replace("\n", " ").split(",")):
            m = re.fullmatch(r"<as (\w+)>", arg)
            names += out[m.group(1)] if m else [arg]
        out[op] = names
    return out


def same_bits(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and \
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def test_declared_capabilities():
    b = TorchRefBackend
    assert b.name == "torch-ref" and b.summary
    assert b.ops == frozenset(OPS)
    assert b.vendors == base.ALL_VENDORS
    assert b.dtypes == frozenset({"float32", "bfloat16", "float16", "float64"})
    assert b.state_dtypes == frozenset({"float32", "bfloat16", "float64"})
    assert b.state_layouts == frozenset({"vk", "kv"}) and b.requires == ()


@pytest.mark.parametrize("name,rank", [("cpu", 10), ("sm90", 1000), ("sm100", 1000), ("mi300x", 1000)])
def test_rank_is_last_resort_on_gpus_and_the_default_on_cpu(name, rank):
    p = Problem(op="gdn_decode", n=64, t=1, h=16, hv=32, k=128, v=128)
    assert TorchRefBackend().rank(p, profile(name)) == rank


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_every_predicate_accepts_every_op_on_cpu(op, layout):
    backend = TorchRefBackend()
    p = Problem(op=op, n=3, t=2, h=2, hv=4, k=32, v=16, d=7, dtype="float16", state_dtype="float64",
                state_layout=layout)
    checks = [pred(p, profile("cpu")) for pred in backend.predicates()]
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


def test_float16_state_is_rejected_with_a_reason():
    p = Problem(op="gdn_decode", n=3, h=2, hv=4, k=32, v=16, state_dtype="float16")
    check = TorchRefBackend().supports_dtype(p, profile("cpu"))
    assert not check.ok and "float16" in check.message


@pytest.mark.parametrize("op", OPS)
def test_op_methods_take_exactly_the_contracts_keywords(op):
    wanted = contract()[op]
    params = inspect.signature(getattr(TorchRefBackend, op)).parameters
    names = [n for n, p in params.items() if n != "self"]
    assert sorted(names) == sorted(wanted)
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)


def op_kwargs(op, dtype):
    """A complete keyword set for one call of ``op`` (every contract keyword named)."""
    N, T, H, HV, K, V, P = 3, 2, 1, 2, 8, 4, 5
    kda = op.startswith("kda")
    if op == "silu_and_mul_clamp":
        return dict(x=torch.randn(4, 14).to(dtype), limit=3.0)
    if op.endswith("gating"):
        kw = dict(A_log=torch.randn(HV).to(dtype), a=torch.randn(T, HV, *([K] if kda else [])).to(dtype),
                  b=torch.randn(T, HV).to(dtype), dt_bias=torch.randn(HV, *([K] if kda else [])).to(dtype),
                  softplus_beta=1.5, softplus_threshold=15.0)
        return dict(kw, lower_bound=-4.0) if kda else kw
    state = F64 if dtype == F64 else F32
    if op.endswith("decode"):
        kw = dict(q=torch.randn(N, T, H, K).to(dtype), k=torch.randn(N, T, H, K).to(dtype),
                  v=torch.randn(N, T, HV, V).to(dtype), a=torch.randn(N, T, HV, *([K] if kda else [])),
                  b=torch.randn(N, T, HV), A_log=torch.randn(HV), dt_bias=torch.randn(HV, *([K] if kda else [])),
                  state_pool=torch.randn(P, HV, K, V).to(state), state_indices=torch.arange(N * T).view(N, T) % P,
                  scale=0.3, use_qk_l2norm=True, state_layout="kv",
                  intermediate_states=torch.zeros(N, T, HV, K, V, dtype=state),
                  intermediate_state_indices=torch.tensor([2, -1, 0]), disable_state_update=True,
                  num_accepted_tokens=torch.tensor([1, 2, 0]), softplus_beta=1.0, softplus_threshold=20.0,
                  g=None, beta=None, has_initial_state=None, output_state_indices=None)
        return dict(kw, lower_bound=None) if kda else kw
    Tt = 7
    return dict(q=torch.randn(Tt, H, K).to(dtype), k=torch.randn(Tt, H, K).to(dtype),
                v=torch.randn(Tt, HV, V).to(dtype),
                g=-torch.rand(Tt, HV, *([K] if kda else [])), beta=torch.rand(Tt, HV),
                cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32), state_pool=torch.randn(P, HV, V, K).to(state),
                state_indices=torch.tensor([4, 1]), initial_state=None, scale=0.5, use_qk_l2norm=False,
                state_layout="vk", has_initial_state=None, output_state_indices=None, checkpoint_every=None,
                checkpoint_indices=None)


REFS = {"gdn_gating": gdn_gating_ref, "kda_gating": kda_gating_ref, "gdn_decode": gdn_decode_ref,
        "kda_decode": kda_decode_ref, "gdn_prefill": gdn_prefill_ref, "kda_prefill": kda_prefill_ref,
        "silu_and_mul_clamp": silu_and_mul_clamp_ref}


def clone_tensors(kw):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def flat(result):
    return [r for r in (result if isinstance(result, tuple) else (result,)) if r is not None]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype,cd", [(BF16, F32), (F32, F32), (F64, F64)])
def test_run_calls_the_reference_in_the_right_compute_dtype(op, dtype, cd):
    kw = op_kwargs(op, dtype)
    assert sorted(kw) == sorted(contract()[op])
    kw_backend, kw_ref = clone_tensors(kw), clone_tensors(kw)
    got = TorchRefBackend().run(op, **kw_backend)
    want = REFS[op](**kw_ref, compute_dtype=cd)
    for x, y in zip(flat(got), flat(want), strict=True):
        assert same_bits(x, y)
    for name in kw:  # pools and buffers end up the same too
        if isinstance(kw[name], torch.Tensor):
            assert same_bits(kw_backend[name], kw_ref[name]), name
    if "state_pool" in kw:  # rows that no index names are untouched
        named = set(kw["state_indices"].flatten().tolist())
        for p in range(kw["state_pool"].shape[0]):
            if p not in named:
                assert same_bits(kw_backend["state_pool"][p], kw["state_pool"][p])


def test_float64_inputs_are_not_computed_in_float32():
    kw = op_kwargs("gdn_prefill", F64)
    got, _ = TorchRefBackend().gdn_prefill(**clone_tensors(kw))
    in_fp32, _ = gdn_prefill_ref(**clone_tensors(kw), compute_dtype=F32)
    assert got.dtype == F64 and not torch.equal(got, in_fp32)
