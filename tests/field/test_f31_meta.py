"""Field case F31: every op called with tensors on the ``meta`` device, and ``--device meta``.

Plain meta tensors hold shapes but no data: every op refuses them with a ``ValueError`` naming the
device, before a backend is chosen (never an internal ``NotImplementedError``). Fake tensors
(``FakeTensorMode``, what ``torch.compile`` traces with) get their output shapes from the ops'
fake implementations. The CLI refuses ``--device meta`` up front: one line, exit code 2, no
traceback.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from typer.testing import CliRunner

import linattn
import linattn.apps.cli as cli
from linattn.dispatch.runtime import fast_path
from linattn.dispatch import Problem, explain, resolve_device

N, T, H, HV, K, V, P, TP = 3, 1, 2, 4, 16, 8, 6, 7
runner = CliRunner()


def _inputs(op: str, device) -> dict:
    """Keyword arguments of one small call of ``op`` with every tensor made on ``device``."""
    z = lambda *s, dtype=torch.float32: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
    idx = lambda *vals: torch.tensor(vals, device=device)  # noqa: E731
    if op in ("gdn_decode", "kda_decode"):
        kda = op == "kda_decode"
        return dict(q=z(N, T, H, K), k=z(N, T, H, K), v=z(N, T, HV, V), a=z(N, T, HV, K) if kda else z(N, T, HV),
                    b=z(N, T, HV), A_log=z(HV), dt_bias=z(HV, K) if kda else z(HV), state_pool=z(P, HV, V, K),
                    state_indices=idx(4, -1, 0))
    if op in ("gdn_prefill", "kda_prefill"):
        kda = op == "kda_prefill"
        return dict(q=z(TP, H, K), k=z(TP, H, K), v=z(TP, HV, V), g=z(TP, HV, K) if kda else z(TP, HV),
                    beta=z(TP, HV), cu_seqlens=idx(0, 3, 7))
    if op in ("gdn_gating", "kda_gating"):
        kda = op == "kda_gating"
        return dict(A_log=z(HV), a=z(5, HV, K) if kda else z(5, HV), b=z(5, HV), dt_bias=z(HV, K) if kda else z(HV))
    return dict(x=z(5, 2 * V), limit=10.0)


OPS = ("gdn_decode", "kda_decode", "gdn_prefill", "kda_prefill", "gdn_gating", "kda_gating", "silu_and_mul_clamp")
#: output shapes of the calls above: decode o [N, T, HV, V]; dense prefill (o [T, HV, V], final
#: [N, HV, V, K]); gating (g, beta); clamp [M, D]
SHAPES = {"gdn_decode": (N, T, HV, V), "kda_decode": (N, T, HV, V),
          "gdn_prefill": ((TP, HV, V), (2, HV, V, K)), "kda_prefill": ((TP, HV, V), (2, HV, V, K)),
          "gdn_gating": ((5, HV), (5, HV)), "kda_gating": ((5, HV, K), (5, HV)), "silu_and_mul_clamp": (5, V)}


def _shapes(out):
    return tuple(tuple(o.shape) for o in out) if isinstance(out, tuple) else tuple(out.shape)


# -- plain meta tensors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_every_op_refuses_meta_tensors_with_a_value_error_naming_the_device(op, monkeypatch):
    def no_selection(*a, **k):
        raise AssertionError("selection was reached with meta tensors")

    monkeypatch.setattr(fast_path, "select", no_selection)
    with pytest.raises(ValueError) as e:
        getattr(linattn, op)(**_inputs(op, "meta"))
    msg = str(e.value)
    assert "meta device" in msg and "no data" in msg  # what was given and why it cannot run
    assert "cpu, cuda" in msg and "torch.compile" in msg  # what is allowed and what to do


@pytest.mark.parametrize("op", OPS)
def test_meta_is_refused_with_validation_off_too(op):
    with pytest.raises(ValueError, match="meta device"):
        getattr(linattn, op)(**_inputs(op, "meta"), validate=False)


def test_meta_mixed_with_cpu_tensors_names_both_devices():
    x = _inputs("gdn_decode", "cpu")
    x["state_pool"] = x["state_pool"].to("meta")
    with pytest.raises(ValueError, match=r"all tensors must be on one device: q is on cpu but state_pool is on meta"):
        linattn.gdn_decode(**x)


@pytest.mark.parametrize("on_meta", ["q", "state_pool"])
def test_the_device_mismatch_suggests_moving_to_the_device_that_holds_data(on_meta):
    x = _inputs("gdn_decode", "cpu")
    x[on_meta] = x[on_meta].to("meta")
    with pytest.raises(ValueError) as e:
        linattn.gdn_decode(**x)
    assert "move them with .to('cpu')" in str(e.value) and ".to('meta')" not in str(e.value)


def test_explain_and_resolve_device_refuse_meta():
    with pytest.raises(ValueError, match="device 'meta' holds shapes but no data"):
        resolve_device("meta")
    with pytest.raises(ValueError, match="meta"):
        explain(Problem(op="gdn_decode", n=4, h=1, hv=2, k=8, v=8), torch.device("meta"))


# -- fake tensors: the ops' fake implementations ----------------------------------------------------------

def _custom_op_args(op: str, named: dict) -> dict:
    """Every argument of ``torch.ops.linattn.<op>``'s schema: ``named`` ones as given, the others a
    neutral value of their type (None, False, the default layout 'vk', ...)."""
    out = {}
    for arg in getattr(torch.ops.linattn, op).default._schema.arguments:
        if arg.name in named:
            out[arg.name] = named[arg.name]
        elif arg.name == "state_layout":
            out[arg.name] = "vk"
        elif arg.name == "use_qk_l2norm":
            out[arg.name] = True
        elif str(arg.type).startswith("Optional"):
            out[arg.name] = None
        elif str(arg.type) == "bool":
            out[arg.name] = False
        elif str(arg.type) == "str":
            out[arg.name] = ""
        elif str(arg.type) == "float":
            out[arg.name] = 1.0 if "softplus_beta" in arg.name else 20.0
        else:
            raise AssertionError(f"{op}: no neutral value for argument {arg.name}: {arg.type}")
    return out


@pytest.mark.parametrize("op", OPS)
def test_under_fake_tensor_mode_the_custom_ops_return_the_output_shapes(op):
    with FakeTensorMode() as mode:
        named = _inputs(op, "cpu")
        out = getattr(torch.ops.linattn, op)(**_custom_op_args(op, named))
    assert all(mode.is_our_fake(t) for t in (out if isinstance(out, tuple) else (out,)))
    assert _shapes(out) == SHAPES[op]


def test_under_fake_tensor_mode_a_pool_mode_prefill_returns_o_and_an_empty_placeholder():
    with FakeTensorMode():
        x = _inputs("gdn_prefill", "cpu")
        x.update(state_pool=torch.zeros(P, HV, V, K), state_indices=torch.tensor([0, 1]))
        o, placeholder = torch.ops.linattn.gdn_prefill(**_custom_op_args("gdn_prefill", x))
    assert tuple(o.shape) == (TP, HV, V) and tuple(placeholder.shape) == (0,)


@pytest.mark.parametrize("op", ["gdn_decode", "gdn_prefill"])
def test_under_fake_tensor_mode_the_public_functions_return_the_output_shapes(op):
    with FakeTensorMode() as mode:
        out = getattr(linattn, op)(**_inputs(op, "cpu"))
    outs = out if isinstance(out, tuple) else (out,)
    assert all(mode.is_our_fake(t) for t in outs)
    assert _shapes(out) == SHAPES[op]


def test_a_fullgraph_compile_of_gating_prefill_decode_and_clamp_traces_with_fakes_and_matches_eager():
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    dec = {k: r(*v.shape) for k, v in _inputs("gdn_decode", "cpu").items() if k not in ("state_pool", "state_indices")}
    pre = {k: r(*v.shape) for k, v in _inputs("gdn_prefill", "cpu").items() if k in ("q", "k", "v")}
    gates = dict(A_log=r(HV) * 0.1, a=r(TP, HV), b=r(TP, HV), dt_bias=r(HV) * 0.1)
    cu, idx, pool0, x = torch.tensor([0, 3, 7]), torch.tensor([4, -1, 0]), r(P, HV, V, K), r(5, 2 * V)

    def step(pool):
        g, beta = linattn.gdn_gating(**gates)
        o_p, final = linattn.gdn_prefill(**pre, g=g, beta=beta, cu_seqlens=cu)
        o_d = linattn.gdn_decode(**dec, state_pool=pool, state_indices=idx, validate=False)
        return o_p.sum() + final.sum() + o_d.sum() + linattn.silu_and_mul_clamp(x, 10.0).sum()

    pool_c, pool_e = pool0.clone(), pool0.clone()
    out_c = torch.compile(step, fullgraph=True, backend="aot_eager")(pool_c)
    out_e = step(pool_e)
    assert torch.equal(out_c, out_e) and torch.equal(pool_c, pool_e)


# -- the CLI ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["demo", "--device", "meta"], ["check", "--device", "meta"],
                                  ["check", "--backend", "torch-ref", "--device", "meta"],
                                  ["bench", "gdn_decode", "--device", "meta"]],
                         ids=["demo", "check", "check-backend", "bench"])
def test_cli_refuses_device_meta_up_front_in_one_line_with_exit_2(args):
    res = runner.invoke(cli.app, args)
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)  # no traceback
    err = res.stderr.strip()
    assert err.startswith("error: --device meta") and "\n" not in err, err
    assert "cpu" in err and "cuda" in err  # what to use instead
    assert res.stdout == ""


@pytest.mark.parametrize("args", [["demo", "--device", "meta", "--json"], ["check", "--device", "meta", "--json"]],
                         ids=["demo", "check"])
def test_cli_refuses_device_meta_as_one_json_document(args):
    res = runner.invoke(cli.app, args)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    doc = json.loads(res.stdout)
    assert doc["error"]["message"].startswith("--device meta") and "no data" in doc["error"]["message"]


@pytest.mark.parametrize("cmd", ["demo", "check"])
def test_cli_refuses_a_string_that_is_no_torch_device_without_a_traceback(cmd):
    res = runner.invoke(cli.app, [cmd, "--device", "bogus"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert "bogus" in res.stderr and "Traceback" not in res.output
