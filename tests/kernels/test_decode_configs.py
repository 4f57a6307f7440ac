"""The decode launch configuration per state pool dtype (``decode.PINNED``, ``DecodeConfig``; issue 32
item 5) and the kernel's variants: ``BLOCKS`` (several value blocks per program, the next tile's load
issued ahead of the current tile's update) and ``STATE_VEC`` (the key offsets written in runs of
``STATE_VEC``, which changes the compiled tile layout, not the elements touched).

``BLOCKS > 1`` runs the same instructions per tile as one tile per program; in the interpreter
(no layouts) ``STATE_VEC`` does too; so output and pool must equal the one-tile launch's bitwise, on fp32 and bf16 pools, both state layouts, padding rows,
``has_initial_state``, separate write slots and the per-token (speculative) form; pool rows the
call does not own stay bitwise unchanged. Interpreter, small shapes (K = V = 16, BV = 4)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from linattn.capabilities import interpreter_enabled, probe  # noqa: E402
from linattn.kernels.triton import decode as dm  # noqa: E402

H, HV, K, V, P = 1, 2, 16, 16, 9
interp = pytest.mark.skipif(not interpreter_enabled(), reason="runs kernels in the interpreter (TRITON_INTERPRET=1)")


def _call(gate: str, pool_dtype: torch.dtype, layout: str, feature: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    T = 3 if feature == "per_token" else 1
    N, kda = 3, gate == "kda"
    shape = (P, HV, V, K) if layout == "vk" else (P, HV, K, V)
    d = dict(q=r(N, T, H, K), k=r(N, T, H, K), v=r(N, T, HV, V), a=r(N, T, HV, *((K,) if kda else ())),
             b=r(N, T, HV), A_log=r(HV) * 0.5, dt_bias=r(HV, *((K,) if kda else ())) * 0.5,
             state_pool=(r(*shape) * 0.3).to(pool_dtype), state_indices=torch.tensor([5, -1, 0], dtype=torch.int32),
             scale=K ** -0.5, state_layout=layout)
    if feature == "has_init":
        d["has_initial_state"] = torch.tensor([False, True, True])
    elif feature == "out_slots":
        d["output_state_indices"] = torch.tensor([7, 3, -1], dtype=torch.int32)
    elif feature == "per_token":
        d["state_indices"] = torch.tensor([[1, 2, 3], [-1, 4, 6], [0, 8, -1]], dtype=torch.int32)
        d["num_accepted_tokens"] = torch.tensor([2, 1, 3], dtype=torch.int32)
    return d


def _written(d: dict) -> set:
    """The pool slots a call may write (every other slot must keep its bits)."""
    idx = d.get("output_state_indices", d["state_indices"])
    return {int(s) for s in idx.flatten() if int(s) >= 0}


def _run(d: dict, gate: str, config) -> tuple[torch.Tensor, torch.Tensor]:
    pool = d["state_pool"].clone()
    o = dm.recurrent_decode(gate=gate, caps=probe(torch.device("cpu")), layout="split", config=config,
                            **dict(d, state_pool=pool))
    return o, pool


@interp
@pytest.mark.parametrize("gate", ["gdn", "kda"])
@pytest.mark.parametrize("pool_dtype,layout,feature", [
    (torch.bfloat16, "vk", "plain"), (torch.float32, "kv", "plain"), (torch.bfloat16, "kv", "has_init"),
    (torch.bfloat16, "vk", "out_slots"), (torch.float32, "vk", "per_token")])
def test_the_kernel_variants_give_the_bits_of_one_block_per_program(gate, pool_dtype, layout, feature):
    d = _call(gate, pool_dtype, layout, feature)
    o1, pool1 = _run(d, gate, dm.DecodeConfig(4, 1))
    assert not torch.equal(pool1, d["state_pool"]), "the call wrote nothing: the comparison would prove nothing"
    # blocks=3: V = 16 is not a multiple of 3 x 4 rows (the last program's last tiles are masked)
    for cfg in (dm.DecodeConfig(4, 1, blocks=2), dm.DecodeConfig(4, 1, blocks=3), dm.DecodeConfig(4, 1, state_vec=4),
                dm.DecodeConfig(4, 1, blocks=2, state_vec=2), dm.DecodeConfig(4, 1, l2norm_one_pass=True)):
        o, pool = _run(d, gate, cfg)
        assert torch.equal(o, o1), f"{cfg}: output differs"
        assert torch.equal(pool, pool1), f"{cfg}: pool differs"
        for slot in set(range(P)) - _written(d):
            assert torch.equal(pool[slot], d["state_pool"][slot]), f"unowned slot {slot} changed"


@interp
@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_one_pass_l2norm_gives_the_bits_of_two_passes_on_huge_and_ordinary_rows(gate):
    """``l2norm_one_pass`` (the sum of squares first, the max pass only past ``SS_LIMIT``) on rows of both
    kinds: an element of 2**70 (F44's overflow: the scaled branch), inf and nan (an inf / nan sum: the
    scaled branch too), and ordinary rows (the plain formula): the bits of the two-pass build."""
    d = _call(gate, torch.bfloat16, "vk", "plain", seed=1)
    d["q"][0, 0, 0, 3] = 2.0 ** 70  # its square overflows fp32: only the scaled branch gives a finite norm
    d["k"][2, 0, 0, 1] = -(2.0 ** 33)
    o1, pool1 = _run(d, gate, dm.DecodeConfig(4, 1))
    assert torch.isfinite(o1).all() and o1.abs().max() > 0, "the huge rows must stay finite and nonzero"
    o, pool = _run(d, gate, dm.DecodeConfig(4, 1, l2norm_one_pass=True))
    assert torch.equal(o, o1) and torch.equal(pool, pool1)
    caps = probe(torch.device("cpu"))
    launch = lambda cfg: dm.DecodeLaunch(gate=gate, caps=caps, layout="split", config=cfg, **d)  # noqa: E731
    assert launch(dm.DecodeConfig(4, 1, l2norm_one_pass=True)).constexprs["L2NORM_ONE_PASS"] is True  # the flag reaches the build
    assert "L2NORM_ONE_PASS" not in launch(dm.DecodeConfig(4, 1)).constexprs  # the two-pass builds keep their constexprs
    d["k"][0, 0, 0, 2] = float("inf")
    d["q"][2, 0, 0, 0] = float("nan")
    o1, pool1 = _run(d, gate, dm.DecodeConfig(4, 1))
    o, pool = _run(d, gate, dm.DecodeConfig(4, 1, l2norm_one_pass=True))
    assert torch.equal(o.isnan(), o1.isnan()) and torch.equal(pool.isnan(), pool1.isnan())
    assert torch.equal(o.nan_to_num(), o1.nan_to_num()) and torch.equal(pool.nan_to_num(), pool1.nan_to_num())


@interp
@pytest.mark.parametrize("gate", ["gdn", "kda"])
@pytest.mark.parametrize("softplus_beta,softplus_threshold", [(1.0, 20.0), (1.5, 4.0), (1.0, 200.0)])
def test_decay_exp2_is_the_log1p_form_within_its_bound_and_keeps_its_edge_rules(gate, softplus_beta, softplus_threshold):
    """``decay_exp2`` (``exp(g)`` as ``exp2`` of a ``log2``; :func:`decode._log2_decay`) against the log1p form:
    ordinary gates and gates past the threshold within 1e-6 relative on outputs and states (fp32 pool;
    the bound of the docstring, ``exp(A_log) 2^-24 / beta`` per step, is far below it); with a threshold of
    200, ``beta x`` of about 95 (``e^(beta x)`` past fp32's range below the threshold: no overflow to a
    decay of 0); the edge rules the same bits: ``x = -80`` (a decay of 1 in both), ``A_log = -inf`` with
    ``x = inf`` (``inf * 0`` reads as 0: a decay of 1); a NaN ``a`` is the floor, a decay of exactly 0
    (the bits of ``a = +inf``, whose decay is 0 in both forms). The flag reaches the build; other builds
    keep their constexprs. Also the float64 reference, within ops.md's fp32 decode tolerance."""
    from linattn.backends.torch_ref import gdn_decode_ref, kda_decode_ref
    from linattn.testing.compare import rel_error

    d = _call(gate, torch.float32, "vk", "plain", seed=2)
    d.update(softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    d["a"] = d["a"] * 4.0  # past the threshold (4 / 1.5) for some heads and channels at beta 1.5
    if softplus_threshold > 100:
        d["a"] = d["a"].clamp(min=0.0) + 95.0  # e^(beta x) overflows fp32 below the threshold
        d["A_log"] = d["A_log"] - 7.0  # decays of about 0.9: a wrong decay of 0 shows
    o1, pool1 = _run(d, gate, dm.DecodeConfig(4, 1))
    o, pool = _run(d, gate, dm.DecodeConfig(4, 1, decay_exp2=True))
    assert not torch.equal(pool, d["state_pool"])
    assert rel_error(o, o1) < 1e-6 and rel_error(pool, pool1) < 1e-6, (rel_error(o, o1), rel_error(pool, pool1))
    for slot in set(range(P)) - _written(d):
        assert torch.equal(pool[slot], d["state_pool"][slot]), f"unowned slot {slot} changed"
    ref = gdn_decode_ref if gate == "gdn" else kda_decode_ref
    p64 = d["state_pool"].double()
    o64 = ref(**{n: d[n].double() for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")}, state_pool=p64,
              state_indices=d["state_indices"], scale=d["scale"], softplus_beta=softplus_beta,
              softplus_threshold=softplus_threshold, compute_dtype=torch.float64)
    assert rel_error(o.double(), o64) < 1e-5 and rel_error(pool.double(), p64) < 1e-5
    # the edge rules: sequence 0 at x = -80, sequence 2's value head 1 at A_log = -inf with x = inf, then NaN
    e = dict(d, a=d["a"].clone(), A_log=d["A_log"].clone(), dt_bias=torch.zeros_like(d["dt_bias"]))
    e["a"][0] = -80.0
    e["A_log"][1] = float("-inf")
    e["a"][2, :, 1] = float("inf")
    e["a"][2, :, 0] = float("inf")
    o1, pool1 = _run(e, gate, dm.DecodeConfig(4, 1))
    o, pool = _run(e, gate, dm.DecodeConfig(4, 1, decay_exp2=True))
    assert torch.isfinite(pool1[5]).all() and torch.isfinite(pool1[0]).all()
    for x, y in ((o[0], o1[0]), (pool[5], pool1[5]), (o[2], o1[2]), (pool[0], pool1[0])):
        assert torch.equal(x, y)
    e["a"][2, :, 0] = float("nan")  # the floor: the bits of a = +inf (a decay of 0), in the exp2 form
    o_nan, pool_nan = _run(e, gate, dm.DecodeConfig(4, 1, decay_exp2=True))
    assert torch.equal(o_nan[2], o[2]) and torch.equal(pool_nan[0], pool[0])
    caps = probe(torch.device("cpu"))
    launch = lambda cfg: dm.DecodeLaunch(gate=gate, caps=caps, layout="split", config=cfg, **d)  # noqa: E731
    assert launch(dm.DecodeConfig(4, 1, decay_exp2=True)).constexprs["DECAY_EXP2"] is True
    assert "DECAY_EXP2" not in launch(dm.DecodeConfig(4, 1)).constexprs


@interp
def test_blocks_variant_can_fail():
    """The comparison above sees a wrong tile walk: tiles of half the rows on the same grid leave
    rows of the pool unwritten."""
    d = _call("gdn", torch.bfloat16, "vk", "plain")
    _, pool1 = _run(d, "gdn", dm.DecodeConfig(4, 1))
    launch = dm.DecodeLaunch(gate="gdn", caps=probe(torch.device("cpu")), layout="split",
                             config=dm.DecodeConfig(4, 1, blocks=2), **d)
    launch.launch.constexprs["BV"] = 2  # the same grid, tiles of half the rows: some rows untouched
    pool = d["state_pool"].clone()
    launch(dict(d, state_pool=pool))  # (its output's unwritten rows are uninitialised memory: not compared)
    assert not torch.equal(pool, pool1)


def test_the_launch_config_is_chosen_by_the_pool_dtype(monkeypatch):
    """A bf16 row of ``PINNED`` reaches bf16-pool launches only (BV, warps, stages, register cap,
    ``BLOCKS``); fp32 pools keep theirs, and their constexprs carry no ``BLOCKS`` / ``maxnreg``."""
    key = ("gdn", K, V, "small")
    monkeypatch.setitem(dm.PINNED, (*key, "fp32"), dm.DecodeConfig(8, 1))
    monkeypatch.setitem(dm.PINNED, (*key, "bf16"), dm.DecodeConfig(4, 2, num_stages=1, maxnreg=64, blocks=2, state_vec=4))
    dm._config.cache_clear()
    try:
        caps = probe(torch.device("cpu"))
        f32 = dm.DecodeLaunch(gate="gdn", caps=caps, layout="split", **_call("gdn", torch.float32, "vk", "plain"))
        b16 = dm.DecodeLaunch(gate="gdn", caps=caps, layout="split", **_call("gdn", torch.bfloat16, "vk", "plain"))
        assert dm.decode_config(K, V, 3, gate="gdn", state_dtype=torch.bfloat16) == (16, 4, 2)
    finally:
        dm._config.cache_clear()
    assert f32.constexprs["BV"] == 8 and f32.num_warps == 1 and f32.blocks == 2
    assert not {"BLOCKS", "STATE_VEC", "maxnreg"} & set(f32.constexprs)
    assert f32.launch.options == {"num_warps": 1}
    assert (b16.constexprs["BV"], b16.constexprs["BLOCKS"], b16.constexprs["STATE_VEC"], b16.constexprs["maxnreg"]) == (4, 2, 4, 64)
    assert b16.blocks == 2 and b16.grid[b16.grid_constexprs["AX_BLK"]] == 2
    assert b16.launch.options == {"num_warps": 2, "num_stages": 1}
    assert b16.with_rows(4) is not None  # same class (pool dtype and batch class): the launch is shared


def test_a_config_of_no_rows_is_refused_before_launch():
    for bad in (dm.DecodeConfig(4, 1, blocks=0), dm.DecodeConfig(0, 1), dm.DecodeConfig(4, 1, state_vec=-1)):
        with pytest.raises(ValueError, match="block_v and blocks must be >= 1"):
            dm.DecodeLaunch(gate="gdn", caps=probe(torch.device("cpu")), layout="split", config=bad,
                            **_call("gdn", torch.float32, "vk", "plain"))


def test_the_backend_plans_the_pool_dtypes_grid(monkeypatch):
    """The Triton backend's grid check (``_work``) counts the programs the launch makes: the pool
    dtype's pinned BV (bf16, batch class large: BV 16) times its ``blocks``, not fp32's BV."""
    from linattn.backends.triton import TritonBackend
    from linattn.dispatch.plugin.problem import Problem

    def work(n, state_dtype):
        return TritonBackend._work(Problem(op="gdn_decode", n=n, h=16, hv=32, k=128, v=128, state_dtype=state_dtype))

    dm._config.cache_clear()
    try:
        assert work(64, "float32") == (64, 32, 128 // dm.PINNED[("gdn", 128, 128, "large", "fp32")].block_v)
        assert work(64, "bfloat16") == (64, 32, 128 // dm.PINNED[("gdn", 128, 128, "large", "bf16")].block_v)
        assert dm.PINNED[("gdn", 128, 128, "large", "bf16")] == dm.DecodeConfig(16, 1, l2norm_one_pass=True, decay_exp2=True)
        monkeypatch.setitem(dm.PINNED, ("gdn", 128, 128, "large", "bf16"), dm.DecodeConfig(8, 1, blocks=4))
        dm._config.cache_clear()
        assert work(64, "bfloat16") == (64, 32, 4)  # 128 rows / (BV 8 x 4 blocks)
        assert work(64, "float32") == (64, 32, 16)
    finally:
        dm._config.cache_clear()
