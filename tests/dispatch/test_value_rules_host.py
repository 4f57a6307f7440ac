"""The value rules' host path (dispatch/rules/value_rules.py ``_host_remaining``): on small CPU index
tensors each rule is evaluated in plain Python from one ``.tolist()``; a rule that fails there hands
the call to the torch probes, so a refused call raises exactly the torch rules' error. Here the two
paths are held to the same verdict (accept, or the same error type and message) on random small
inputs: padding, negative slots, repeats, out-of-range slots, empty tensors, NaN/inf gates."""

from __future__ import annotations

import os

import pytest
import torch

from linattn.dispatch.rules import value_rules as vr

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

P, S, T = 6, 5, 3
RULES = (vr._v_cu_seqlens, vr._v_state_indices, vr._v_output_state_indices, vr._v_checkpoints,
         vr._v_intermediate, vr._v_num_accepted, vr._v_decode_log_decay, vr._v_shared_gate_params)
NAN, INF = float("nan"), float("inf")


def _verdict(rules, args, dims, host: bool):
    """The verdict of ``_run_value_rules`` of ``rules`` with the host path on or off."""
    old = vr.HOST_VALUE_RULES
    vr.HOST_VALUE_RULES = host
    try:
        vr._run_value_rules(rules, args, dims)
        return None
    except Exception as e:  # noqa: BLE001 - the type and text are what is compared
        return type(e), str(e)
    finally:
        vr.HOST_VALUE_RULES = old


slots = st.integers(-2, P + 1)
floats = st.sampled_from([0.0, -1.5, 2.0, NAN, INF, -INF])


def _mostly_distinct(draw, n, hi):
    """``n`` distinct slots in -1..hi-1 (so usually valid), then maybe one entry redrawn anywhere."""
    v = draw(st.lists(st.integers(-1, hi - 1), unique=True, min_size=n, max_size=n))
    if n and draw(st.booleans()):
        v[draw(st.integers(0, n - 1))] = draw(st.integers(-2, hi + 1))
    return v


@st.composite
def calls(draw):
    n = draw(st.integers(0, 5))
    dt = draw(st.sampled_from([torch.int32, torch.int64]))
    tensor = lambda v, d=dt: torch.tensor(v, dtype=d)  # noqa: E731
    rows = draw(st.integers(1, 3))
    if rows == 1 and draw(st.booleans()):
        table = [[s] for s in _mostly_distinct(draw, n, P)]
    else:
        table = draw(st.lists(st.lists(slots, min_size=rows, max_size=rows), min_size=n, max_size=n))
    idx = tensor(table).reshape(n, rows)
    if rows == 1 and draw(st.booleans()):
        idx = idx[:, 0]
    args = dict(state_indices=idx, output_state_indices=None, has_initial_state=None, checkpoint_indices=None,
                intermediate_state_indices=None, num_accepted_tokens=None, g=None, A_log=None, dt_bias=None)
    flat = idx.dim() == 1
    if flat and draw(st.booleans()):
        out = _mostly_distinct(draw, n, P)
        if draw(st.booleans()):  # padding on the rows of state_indices' padding, usually
            out = [-1 if s < 0 else (o if o >= 0 else P - 1 - j) for j, (s, o) in enumerate(zip(idx.tolist(), out))]
        args["output_state_indices"] = tensor(out)
        if draw(st.booleans()):
            args["has_initial_state"] = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    if flat and draw(st.booleans()):
        c = draw(st.integers(0, min(2, (P + 2) // max(n, 1))))
        args["checkpoint_indices"] = tensor(_mostly_distinct(draw, n * c, P + 2)).reshape(n, c)
    if draw(st.booleans()):
        args["intermediate_state_indices"] = tensor(draw(st.lists(st.integers(-2, S + 1), min_size=n, max_size=n)))
    if draw(st.booleans()):
        args["num_accepted_tokens"] = tensor(draw(st.lists(st.integers(-1, T + 1), min_size=n, max_size=n)))
    if draw(st.booleans()):  # up to 4 values read to the host, or past HOST_REDUCE_ELEMENTS: one reduction
        size = draw(st.sampled_from([4, vr.HOST_REDUCE_ELEMENTS + 8]))
        args["g"] = torch.tensor(draw(st.lists(floats, min_size=0, max_size=size)),
                                 dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])))
    if draw(st.booleans()):
        gate_dt = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
        args["A_log"] = torch.tensor(draw(st.lists(floats, min_size=1, max_size=3)), dtype=gate_dt)
        args["dt_bias"] = torch.tensor(draw(st.lists(floats, min_size=1, max_size=3)), dtype=gate_dt)
    lens = draw(st.lists(st.integers(-1, 3), min_size=1, max_size=4))
    cu = [draw(st.integers(-1, 1))]
    for x in lens:
        cu.append(cu[-1] + x)
    args["cu_seqlens"] = tensor(cu)
    dims = dict(p=P, s=S, t=draw(st.sampled_from([T, cu[-1]])), writes_pool=draw(st.booleans()),
                device=torch.device("cpu"))
    return args, dims


#: Examples per run: 600 in make test (the same ones every run: derandomize; ~5 s of a worker), ten times
#: as many with LINATTN_FUZZ_PROFILE=long (tests/fuzz/fuzz_support.py's profiles).
EXAMPLES = 6000 if os.environ.get("LINATTN_FUZZ_PROFILE") == "long" else 600


@hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@hypothesis.given(call=calls())
def test_host_and_torch_rules_agree(call):
    args, dims = call
    for rules in (RULES, *((r,) for r in RULES)):  # each rule alone too: the others do not mask it
        torch_verdict = _verdict(rules, args, dims, host=False)
        assert _verdict(rules, args, dims, host=True) == torch_verdict, rules
        # a call plan's rules (the ones left for its None arguments) give the same verdict, either way
        live = vr.live_rules(rules, args, dims)
        assert _verdict(live, args, dims, host=True) == torch_verdict == _verdict(live, args, dims, host=False), rules
        if torch_verdict is None:  # an accepted call: the host path decided every rule, no torch probe ran
            assert vr._host_remaining(rules, args, dims) == ()


def _decode_call(n=4, **over):
    args = dict(state_indices=torch.arange(n, dtype=torch.int32), output_state_indices=None,
                has_initial_state=None, intermediate_state_indices=None, num_accepted_tokens=None, g=None,
                A_log=torch.zeros(32), dt_bias=torch.zeros(32))
    args.update(over)
    return args, dict(p=8, s=8, t=1, writes_pool=True, device=torch.device("cpu"))


DECODE = (vr._v_state_indices, vr._v_output_state_indices, vr._v_intermediate, vr._v_num_accepted,
          vr._v_shared_gate_params, vr._v_decode_log_decay)


def test_a_small_cpu_decode_runs_no_torch_probe():
    args, dims = _decode_call()
    assert vr._host_remaining(DECODE, args, dims) == ()


def test_a_failing_host_form_hands_every_rule_to_the_torch_probes():
    args, dims = _decode_call(state_indices=torch.tensor([0, 1, 1, 2], dtype=torch.int32))
    assert vr._host_remaining(DECODE, args, dims) == DECODE
    with pytest.raises(ValueError, match="write race"):
        vr._run_value_rules(DECODE, args, dims)


def test_large_or_non_cpu_tensors_keep_their_torch_probes():
    n = vr.HOST_MAX_ELEMENTS + 1
    args, dims = _decode_call(n=n)
    dims["p"] = n
    assert vr._host_remaining(DECODE, args, dims) == (vr._v_state_indices,)  # the gate parameters: host
    args, dims = _decode_call(A_log=torch.zeros(vr.HOST_MAX_ELEMENTS + 1))
    assert vr._host_remaining(DECODE, args, dims) == (vr._v_shared_gate_params,)
    args, dims = _decode_call()
    dims["device"] = torch.device("cuda", 0)  # a GPU call: no new host reads, every rule stays torch
    assert vr._host_remaining(DECODE, args, dims) == DECODE


@pytest.mark.parametrize("bad", [None, 0.5, NAN, INF], ids=["ok", "positive", "nan", "inf"])
def test_a_large_cpu_log_decay_is_decided_by_one_reduction_with_the_torch_verdict(bad):
    """A KDA decode's or a prefill's g (more than HOST_REDUCE_ELEMENTS values, here 1,024, past
    HOST_MAX_ELEMENTS too) runs no torch probe on the CPU: its maximum decides, NaN included; a refused
    one raises the torch rule's error."""
    g = -torch.rand(1, 1, 8, 128, generator=torch.Generator().manual_seed(0))
    if bad is not None:
        g[0, 0, 5, 77] = bad
    args, dims = _decode_call(g=g, A_log=None, dt_bias=None)
    verdict = _verdict(DECODE, args, dims, host=True)
    assert verdict == _verdict(DECODE, args, dims, host=False)
    if bad is None:
        assert verdict is None and vr._host_remaining(DECODE, args, dims) == ()
    else:
        assert verdict[0] is ValueError and "g[0, 0, 5, 77]" in verdict[1]


def test_a_cpu_decode_call_refuses_with_the_torch_message():
    import linattn

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = dict(q=r(2, 1, 1, 8), k=r(2, 1, 1, 8), v=r(2, 1, 2, 8), a=r(2, 1, 2), b=r(2, 1, 2), A_log=r(2),
             dt_bias=r(2), state_pool=r(4, 2, 8, 8), state_indices=torch.tensor([1, 7], dtype=torch.int32))
    messages = []
    for host in (True, False):
        pool = x["state_pool"].clone()
        old = vr.HOST_VALUE_RULES
        vr.HOST_VALUE_RULES = host
        try:
            with pytest.raises(ValueError) as e:
                linattn.gdn_decode(**{**x, "state_pool": pool})
        finally:
            vr.HOST_VALUE_RULES = old
        assert torch.equal(pool, x["state_pool"])  # refused before launch: no pool row written
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "out of range" in messages[0]


def test_a_rule_whose_argument_is_none_probes_nothing_and_is_left_out_on_the_cpu():
    """live_rules drops a rule only where it has nothing to check: its argument (value_rules._NEEDS) is
    None, so the rule gives no probe and its host form passes, whatever the others hold."""
    args, dims = _decode_call(n=3, state_indices=torch.tensor([0, 0, 9], dtype=torch.int32), g=torch.tensor([1.0]),
                              A_log=torch.tensor([NAN]), dt_bias=torch.tensor([INF]))
    for rule, name in vr._NEEDS.items():
        bare = {**args, "checkpoint_indices": None, name: None}
        assert rule(bare, dims) == [] and vr._HOST_FORMS[rule](bare, dims) is True, name
        assert rule not in vr.live_rules((rule,), bare, dims)
    kept = vr.live_rules(DECODE, args, dims)  # the gate-form decode: the slots, g and the gate parameters
    assert kept == (vr._v_state_indices, vr._v_shared_gate_params, vr._v_decode_log_decay)
    dims["device"] = torch.device("cuda", 0)  # a GPU call's plan keeps every rule (the fused check's set)
    assert vr.live_rules(DECODE, args, dims) == DECODE


def test_a_cpu_decode_plan_keeps_the_rules_its_arguments_need():
    import linattn
    from linattn.dispatch.runtime import fast_path

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    pool, slots = r(4, 2, 8, 8), torch.tensor([2, 0], dtype=torch.int32)
    x = dict(q=r(2, 1, 1, 8), k=r(2, 1, 1, 8), v=r(2, 1, 2, 8), g=-torch.rand(2, 1, 2, generator=g),
             beta=torch.rand(2, 1, 2, generator=g))
    fast_path.clear()
    linattn.gdn_decode(**x, state_pool=pool, state_indices=slots, backend="torch-chunked")
    (plan,) = fast_path._plans.values()
    assert plan.rules == (vr._v_state_indices, vr._v_decode_log_decay)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"g\[1, 0, 1\] = 0.5: g is a log-space decay"):
        linattn.gdn_decode(**{**x, "g": torch.tensor([[[-1.0, -1.0]], [[-1.0, 0.5]]])}, state_pool=pool,
                           state_indices=slots, backend="torch-chunked")
    with pytest.raises(ValueError, match="write race"):
        linattn.gdn_decode(**x, state_pool=pool, state_indices=torch.tensor([2, 2], dtype=torch.int32),
                           backend="torch-chunked")
    assert torch.equal(pool, before)  # refused before anything is written
