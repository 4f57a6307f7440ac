"""CPU benchmarks: linattn's PyTorch prefills against each other and against transformers' own.

Section ``plugin``: the built-in ``torch-chunked``, the example plugin ``cpu-chunked`` and ``torch-ref``.
All run through the public ops (``linattn.gdn_prefill`` / ``linattn.kda_prefill``) with the
backend forced, so validation and dispatch are included, on the same inputs: 4 sequences x 2,048
tokens in one varlen call, bf16 q/k/v, fp32 gates and an fp32 state pool in pool mode (what an
engine's prefill passes). Shapes: GDN at Qwen3-Next (H=16, HV=32, K=V=128), KDA at Kimi-Linear
(H=HV=32, K=V=128). Each repeat runs the backends back to back (alternating the order, on
fresh pool copies), so load from other processes hits all alike; the JSON keeps every time, the
medians and their ratio. It also records the dispatcher's own choice for the problem and the
relative difference between the two outputs and final states (a sanity check; the conformance
suite is the accuracy test).

Section ``targets`` (issue 31): linattn's default (the dispatcher's choice, public ops, fp32) against
transformers' own PyTorch functions (``inspect.unwrap`` of the hub wrappers: what a user without FLA
runs): prefill at 1 x 2,048 and 4 x 512 tokens against ``torch_chunk_gated_delta_rule`` (GDN, H=4,
HV=8, K=V=128) and Kimi-Linear's ``chunk_kimi_delta_attention`` (KDA, H=HV=8: Kimi's function has no
GVA), dense mode, no initial state, final state returned; one decode step (batch 1 and 4, gates
precomputed, fp32 state) against ``torch_recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention``.
Interleaved A/B (alternating which goes first), medians.

Section ``hf_example``: examples/hf_generate.py's CPU run (tiny random Qwen3-Next and Kimi-Linear,
batch 2 x 80 prompt tokens, 8 new tokens, fp32) on transformers' own path and with
``linattn.integrations.transformers.enable``, interleaved.

Section ``hf_bound`` (issue 31's example target, where its time goes): the Qwen3-Next example as
``hf_example`` runs it, five ways interleaved: transformers' own path; ``enable(model)``;
``enable(model, validate=False)``; *routing only*: linattn's routers and routed forwards in place
but each call sent back to transformers' own function (what routing alone costs); *backends direct*:
each call sent straight to torch-chunked's maths (:func:`linattn.backends.torch_chunked._decode`,
:func:`~linattn.backends.torch_chunked.chunked_prefill`) with no validation, dispatch or
``compat.fla`` checks (what the maths alone costs; the example's decode and dense prefill calls
only, any other call takes the full route). The last two patch ``linattn.compat.fla._run`` for the
duration of their timings (private names: a bound measurement, not a way to run linattn).

Writes the ``benchmarks/_results.py`` schema (rows of every section, a ``kind`` each) to
``benchmarks/results/cpu_chunked.json`` (``--out``; ``-`` prints it instead). Several lengths
(``--tokens 64,128,256,512,2048``) show where the chunked forms start to pay (docs/performance.md).

Usage:
    python benchmarks/cpu_chunked.py [--repeats 5] [--threads N] [--ops gdn,kda] [--tokens 2048]
           [--sections plugin,targets,hf_example] [--target-phases prefill,decode] [--label "which machine"]

A section (or targets phase) not run keeps the file's earlier rows of it, marked ``from_commit``.

The plugin section needs the example installed: ``pip install -e examples/linattn-cpu-chunked``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import os
import statistics
import sys
import time
from typing import Optional

import torch

import linattn
from linattn.dispatch import find_op
from linattn.testing.compare import rel_error as _rel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import RESULTS, make_results, write_results  # noqa: E402

SHAPES = {"gdn": dict(model="qwen3-next", H=16, HV=32, K=128, V=128),
          "kda": dict(model="kimi-linear", H=32, HV=32, K=128, V=128)}
BACKENDS = ("torch-chunked", "cpu-chunked", "torch-ref")
SECTIONS = ("plugin", "targets", "hf_example", "hf_bound")
TARGET_PHASES = ("prefill", "decode")


def make_inputs(family: str, n_seq: int, seq_len: int, seed: int = 0) -> dict:
    s = SHAPES[family]
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, K, V = n_seq * seq_len, s["H"], s["HV"], s["K"], s["V"]
    q = torch.randn(T, H, K, generator=gen).to(torch.bfloat16)
    k = torch.randn(T, H, K, generator=gen).to(torch.bfloat16)
    v = torch.randn(T, HV, V, generator=gen).to(torch.bfloat16)
    # gates from the gating op, with Qwen3-Next / Kimi-like parameter scales
    A_log = torch.rand(HV, generator=gen) * 2.0 - 1.0
    if family == "gdn":
        g, beta = linattn.gdn_gating(A_log, torch.randn(T, HV, generator=gen).to(torch.bfloat16),
                                     torch.randn(T, HV, generator=gen).to(torch.bfloat16), torch.zeros(HV))
    else:
        g, beta = linattn.kda_gating(A_log, torch.randn(T, HV, K, generator=gen).to(torch.bfloat16),
                                     torch.randn(T, HV, generator=gen).to(torch.bfloat16), torch.zeros(HV, K),
                                     lower_bound=-5.0)
    cu = torch.arange(n_seq + 1, dtype=torch.int32) * seq_len
    pool = torch.randn(2 * n_seq, HV, V, K, generator=gen) * 0.1
    slots = torch.randperm(2 * n_seq, generator=gen)[:n_seq].to(torch.int32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, pool=pool, slots=slots)


def run_once(family: str, backend: str, x: dict):
    fn = linattn.gdn_prefill if family == "gdn" else linattn.kda_prefill
    pool = x["pool"].clone()
    t0 = time.perf_counter()
    o = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], state_pool=pool, state_indices=x["slots"],
           backend=backend)
    return time.perf_counter() - t0, o, pool


def bench(family: str, n_seq: int, seq_len: int, repeats: int) -> dict:
    x = make_inputs(family, n_seq, seq_len)
    times = {b: [] for b in BACKENDS}
    outs = {}
    for b in BACKENDS:  # warm-up (first-call costs: imports, allocator), also the outputs compared
        _, o, pool = run_once(family, b, x)
        outs[b] = (o, pool[x["slots"].long()])
    for r in range(repeats):
        order = BACKENDS[r % 3:] + BACKENDS[:r % 3]  # each backend first in turn
        for b in order:
            times[b].append(run_once(family, b, x)[0])
        print(f"  {family} repeat {r + 1}/{repeats}: " + ", ".join(f"{b} {times[b][-1]:.3f}s" for b in BACKENDS),
              file=sys.stderr, flush=True)
    med = {b: statistics.median(t) for b, t in times.items()}
    s = SHAPES[family]
    op = find_op(family, "prefill")
    problem = linattn.Problem(op=op, n=n_seq, t=n_seq * seq_len, h=s["H"], hv=s["HV"], k=s["K"],
                              v=s["V"], dtype="bfloat16", state_dtype="float32", mode="pool")
    return {
        "kind": "plugin", "op": op, "model": s["model"], "sequences": n_seq, "tokens_per_sequence": seq_len,
        "shape": {k: s[k] for k in ("H", "HV", "K", "V")}, "dtype": "bfloat16", "state": "float32 pool",
        "seconds": {b: [round(t, 4) for t in ts] for b, ts in times.items()},
        "median_seconds": {b: round(m, 4) for b, m in med.items()},
        "tokens_per_second": {b: round(n_seq * seq_len / m, 1) for b, m in med.items()},
        "speedup_vs_torch_ref": {b: round(med["torch-ref"] / med[b], 3) for b in BACKENDS[:2]},
        "dispatcher_choice": linattn.explain(problem, torch.device("cpu")).chosen,
        "rel_diff_output": {b: _rel(outs[b][0], outs["torch-ref"][0]) for b in BACKENDS[:2]},
        "rel_diff_state": {b: _rel(outs[b][1], outs["torch-ref"][1]) for b in BACKENDS[:2]},
    }


# -- issue 31's targets: linattn's default against transformers' own PyTorch functions -----------------

TARGET_SHAPES = ((1, 2048), (4, 512))  # (sequences, tokens per sequence)
HF_MODULES = {"gdn": "transformers.models.qwen3_next.modeling_qwen3_next",
              "kda": "transformers.models.kimi_linear.modeling_kimi_linear"}
HF_FUNCTIONS = {("gdn", "prefill"): "torch_chunk_gated_delta_rule", ("gdn", "decode"): "torch_recurrent_gated_delta_rule",
                ("kda", "prefill"): "chunk_kimi_delta_attention", ("kda", "decode"): "recurrent_kimi_delta_attention"}


def hf_function(family: str, phase: str):
    """transformers' own PyTorch function (the hub / FLA wrapper's ``__wrapped__``: what a user
    without FLA runs; with FLA importable the wrapper would hand CPU tensors to Triton)."""
    mod = importlib.import_module(HF_MODULES[family])
    return inspect.unwrap(getattr(mod, HF_FUNCTIONS[(family, phase)]))


def _target_inputs(family: str, n_seq: int, seq_len: int, H: int, HV: int, K: int, gen) -> dict:
    T = n_seq * seq_len
    x = dict(q=torch.randn(n_seq, seq_len, H, K, generator=gen), k=torch.randn(n_seq, seq_len, H, K, generator=gen),
             v=torch.randn(n_seq, seq_len, HV, K, generator=gen), beta=torch.rand(n_seq, seq_len, HV, generator=gen))
    A_log = torch.rand(HV, generator=gen) * 2.0 - 1.0
    if family == "gdn":
        x["g"], _ = linattn.gdn_gating(A_log, torch.randn(T, HV, generator=gen), torch.zeros(T, HV), torch.zeros(HV))
    else:
        x["g"], _ = linattn.kda_gating(A_log, torch.randn(T, HV, K, generator=gen), torch.zeros(T, HV),
                                       torch.zeros(HV, K), lower_bound=-5.0)
    x["g"] = x["g"].view(n_seq, seq_len, *x["g"].shape[1:])
    x["cu"] = torch.arange(n_seq + 1, dtype=torch.int32) * seq_len
    return x


def _interleaved(fns: dict, repeats: int, inner: int = 1, setup: Optional[dict] = None) -> dict:
    """Medians of ``repeats`` timings of each function, A/B alternating which goes first; each timing
    is ``inner`` back-to-back calls divided by ``inner``. ``setup[name]()``, where given, runs before each
    of that function's timings, outside them."""
    setup = setup or {}
    for name, f in fns.items():  # warm-up
        setup.get(name, _nothing)()
        f()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            setup.get(name, _nothing)()
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / inner)
    return times


def _nothing() -> None:
    pass


def bench_target_prefill(family: str, n_seq: int, seq_len: int, repeats: int) -> dict:
    """linattn's default prefill (dense, no initial state, final state returned) against
    transformers' chunked function on the same fp32 inputs. GDN at H=4, HV=8; KDA at H=HV=8 (Kimi's
    function has no GVA), K=V=128."""
    H, HV, K = (4, 8, 128) if family == "gdn" else (8, 8, 128)
    x = _target_inputs(family, n_seq, seq_len, H, HV, K, torch.Generator().manual_seed(0))
    op = linattn.gdn_prefill if family == "gdn" else linattn.kda_prefill
    flat = {k: x[k].flatten(0, 1) for k in ("q", "k", "v", "g", "beta")}
    hf = hf_function(family, "prefill")
    fns = {"linattn": lambda: op(flat["q"], flat["k"], flat["v"], flat["g"], flat["beta"], x["cu"]),
           "transformers": lambda: hf(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=None,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)}
    times = _interleaved(fns, repeats)
    o_lin, ht_lin = fns["linattn"]()
    chosen = linattn.last_decision(op.__name__).chosen
    o_hf, ht_hf = fns["transformers"]()
    return _target_row(family, "prefill", n_seq, seq_len, (H, HV, K), times, chosen, HF_FUNCTIONS[(family, "prefill")],
                       _rel(o_lin.view_as(o_hf), o_hf), _rel(ht_lin.transpose(-1, -2), ht_hf))


def bench_target_decode(family: str, batch: int, repeats: int) -> dict:
    """One decode step (T = 1, gates precomputed as transformers' function takes them, fp32 state):
    linattn's default decode over a pool (in place) against transformers' recurrent function
    (dense state in, new state out). Shapes as :func:`bench_target_prefill`."""
    H, HV, K = (4, 8, 128) if family == "gdn" else (8, 8, 128)
    gen = torch.Generator().manual_seed(1)
    x = _target_inputs(family, batch, 1, H, HV, K, gen)
    state = torch.randn(batch, HV, K, K, generator=gen) * 0.1  # [B, HV, K, V] (transformers' layout)
    pool = state.transpose(-1, -2).contiguous()  # linattn's "vk" pool [B, HV, V, K]
    slots = torch.arange(batch, dtype=torch.int32)
    op = linattn.gdn_decode if family == "gdn" else linattn.kda_decode
    hf = hf_function(family, "decode")
    fns = {"linattn": lambda: op(x["q"], x["k"], x["v"], None, None, None, None, pool, slots, g=x["g"], beta=x["beta"]),
           "torch-chunked": lambda: op(x["q"], x["k"], x["v"], None, None, None, None, pool, slots, g=x["g"],
                                       beta=x["beta"], backend="torch-chunked"),
           # the same without the value rules (validate=False): what the op layer costs beyond them
           "torch-chunked validate=False": lambda: op(x["q"], x["k"], x["v"], None, None, None, None, pool, slots,
                                                      g=x["g"], beta=x["beta"], backend="torch-chunked", validate=False),
           # the float64-exact oracle, the CPU decode default before torch-chunked's step (f537d4f)
           "torch-ref": lambda: op(x["q"], x["k"], x["v"], None, None, None, None, pool, slots, g=x["g"],
                                   beta=x["beta"], backend="torch-ref"),
           "transformers": lambda: hf(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=state,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)}
    times = _interleaved(fns, repeats, inner=20)
    fns["linattn"]()
    chosen = linattn.last_decision(op.__name__).chosen
    return _target_row(family, "decode", batch, 1, (H, HV, K), times, chosen, HF_FUNCTIONS[(family, "decode")])


def _target_row(family, phase, n_seq, seq_len, shape, times, chosen, hf_name, rel_o=None, rel_state=None) -> dict:
    med = {b: statistics.median(t) for b, t in times.items()}
    row = {"kind": "target", "op": f"{family}_{phase}", "sequences": n_seq, "tokens_per_sequence": seq_len,
           "shape": dict(zip(("H", "HV", "K", "V"), (*shape, shape[2]))), "dtype": "float32",
           "baseline": f"transformers {hf_name} (PyTorch)", "linattn_backend": chosen,
           "seconds": {b: [round(s, 6) for s in t] for b, t in times.items()},
           "median_seconds": {b: round(m, 6) for b, m in med.items()},
           "speedup_vs_transformers": {b: round(med["transformers"] / m, 3) for b, m in med.items() if b != "transformers"},
           "target": ">= 2x" if phase == "prefill" else ">= 1x (no slower)"}
    if rel_o is not None:
        row.update(rel_diff_output=rel_o, rel_diff_state=rel_state)
    return row


def _own_functions(family: str) -> None:
    """transformers' own torch functions in the family's modeling module (each wrapper's ``__wrapped__``, as
    tests/field/test_f35) put in place of their hub / FLA wrappers there (a wrapper without ``__wrapped__``
    is left: it falls back to the torch function itself)."""
    mod = importlib.import_module(HF_MODULES[family])
    for name, fn in list(vars(mod).items()):
        inner = inspect.unwrap(fn) if callable(fn) and hasattr(fn, "__wrapped__") else fn
        if inner is not fn and getattr(inner, "__module__", None) == mod.__name__:
            setattr(mod, name, _only_own_kwargs(inner))


def _example(model_name: str, batch: int, prompt_len: int, new_tokens: int) -> tuple:
    """``(model, run)``: examples/hf_generate.py's tiny model and its work (``model(ids)``, then a greedy
    ``generate`` of ``new_tokens``; returns the tokens)."""
    import linattn.integrations.transformers as lt

    model = lt.tiny_random_model(model_name)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(1))

    def run():
        with torch.no_grad():
            model(ids)
            return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return model, run


def bench_hf_example(model_name: str, repeats: int, batch: int = 2, prompt_len: int = 80, new_tokens: int = 8) -> dict:
    """examples/hf_generate.py's CPU run (tiny random model, fp32, greedy prefill + generate) on
    transformers' own PyTorch path and with ``linattn.integrations.transformers.enable``, alternating."""
    import linattn.integrations.transformers as lt

    _own_functions("kda" if model_name == "kimi-linear" else "gdn")
    model, run = _example(model_name, batch, prompt_len, new_tokens)

    def plain():
        lt.disable(model)
        return run()

    def routed():
        lt.enable(model)
        return run()

    # the example enables once: enable() / disable() run before each timing, outside it
    times = _interleaved({"linattn": run, "transformers": run}, repeats,
                         setup={"linattn": lambda: lt.enable(model), "transformers": lambda: lt.disable(model)})
    same = torch.equal(routed(), plain())
    med = {b: statistics.median(t) for b, t in times.items()}
    return {"kind": "hf_example", "model": model_name, "batch": batch, "prompt_tokens": prompt_len,
            "new_tokens": new_tokens, "dtype": "float32",
            "seconds": {b: [round(s, 4) for s in t] for b, t in times.items()},
            "median_seconds": {b: round(m, 4) for b, m in med.items()},
            "speedup_vs_transformers": round(med["transformers"] / med["linattn"], 3), "tokens_identical": same}


def _direct_route(family, q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                  state_v_first, cu_seqlens, recurrent, gate=None, **_):
    """``hf_bound``'s *backends direct* route for one ``compat.fla`` call, or None (the full route runs it):
    a GDN decode from an initial state, or a dense GDN prefill from none, with torch-chunked's maths
    called as the dispatcher would run it after validation (the example's calls: fp32, q / k l2norm)."""
    from linattn.backends import torch_chunked as tc

    if family != "gdn" or gate is not None or not use_qk_l2norm_in_kernel or q.dtype != torch.float32 or \
            cu_seqlens is not None:
        return None
    B, T, _, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    if recurrent and initial_state is not None and T == 1:
        pool = initial_state.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        o = tc._decode(False, q, k, v, (g, beta), pool, torch.arange(B), None, scale, True, state_v_first, True)
        return o, (pool if output_final_state else None)
    if not recurrent and initial_state is None:
        def flat(x):
            return x.reshape(B * T, *x.shape[2:])
        o, final = tc.chunked_prefill(flat(q), flat(k), flat(v), flat(g), flat(beta), torch.arange(B + 1) * T,
                                      scale=scale, use_qk_l2norm=True, state_layout="vk" if state_v_first else "kv")
        return o.reshape(B, T, *o.shape[1:]), (final if output_final_state else None)
    return None


def bench_hf_bound(repeats: int, batch: int = 2, prompt_len: int = 80, new_tokens: int = 8) -> dict:
    """The ``hf_bound`` section (module docstring): the Qwen3-Next example five ways, interleaved."""
    import linattn.compat.fla as fla
    import linattn.integrations.transformers as lt

    _own_functions("gdn")
    full_route = fla._run
    hf = {phase: hf_function("gdn", phase) for phase in ("prefill", "decode")}  # the example's family only

    def routing_only(func, family, q, k, v, g, beta, *, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                     recurrent, **_):
        fn = hf["decode" if recurrent else "prefill"]
        return fn(q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    def direct(func, family, *args, **kw):
        got = _direct_route(family, *args, **kw)
        return got if got is not None else full_route(func, family, *args, **kw)

    model, run = _example("qwen3-next", batch, prompt_len, new_tokens)

    def setup(route, **options):
        def apply():
            lt.disable(model)
            fla._run = route
            if options.get("enable", True):
                lt.enable(model, validate=options.get("validate", True))
        return apply

    ways = {"transformers": setup(full_route, enable=False), "linattn": setup(full_route),
            "linattn validate=False": setup(full_route, validate=False), "routing only": setup(routing_only),
            "backends direct": setup(direct)}
    try:
        times = _interleaved({w: run for w in ways}, repeats, setup=ways)
        tokens = {}
        for w, apply in ways.items():
            apply()
            tokens[w] = run()
    finally:
        lt.disable(model)
        fla._run = full_route
    med = {w: statistics.median(t) for w, t in times.items()}
    return {"kind": "hf_bound", "model": "qwen3-next", "batch": batch, "prompt_tokens": prompt_len,
            "new_tokens": new_tokens, "dtype": "float32",
            "seconds": {w: [round(s, 4) for s in t] for w, t in times.items()},
            "median_seconds": {w: round(m, 4) for w, m in med.items()},
            "speedup_vs_transformers": {w: round(med["transformers"] / m, 3) for w, m in med.items() if w != "transformers"},
            "tokens_identical": {w: torch.equal(t, tokens["transformers"]) for w, t in tokens.items() if w != "transformers"}}


def _only_own_kwargs(fn):
    """``fn`` called with the keywords it names only (the hub wrapper took FLA's extra ones)."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn
    return functools.wraps(fn)(lambda *a, **kw: fn(*a, **{k: v for k, v in kw.items() if k in params}))


def _kept_rows(path: str, keep) -> list:
    """The rows of an earlier run in ``path`` that ``keep(row)`` selects (a section or phase not re-run),
    each marked with its commit (``from_commit``, kept if it had one)."""
    if path == "-" or not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    machine = next((n for n in doc.get("notes", []) if n.startswith("machine:")), None)
    return [{"from_commit": doc["commit"], "from_machine": machine, "measured_by": f"{doc['command']} @ {doc['commit']}",
             **r, "kind": r.get("kind", "plugin")} for r in doc["rows"] if keep(r)]


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return n


def positive_ints(text: str) -> list:
    """An argparse type: a comma list of positive integers."""
    return [positive_int(t) for t in text.split(",")]


def comma_choices(*choices: str):
    """An argparse type: a comma list of names, each one of ``choices``, none repeated."""
    def parse(text: str) -> list:
        items = text.split(",")
        bad = [i for i in items if i not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r}: expected a comma list of {', '.join(choices)}")
        if len(set(items)) < len(items):
            raise argparse.ArgumentTypeError(f"{text!r}: a name is repeated")
        return items
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=positive_int, default=5, help="timed repeats of each measurement (default 5)")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--ops", type=comma_choices(*SHAPES), default="gdn,kda",
                    help="the families measured, a comma list of gdn, kda (default: both)")
    ap.add_argument("--sequences", type=positive_int, default=4,
                    help="sequences in the plugin section's varlen call (default 4)")
    ap.add_argument("--tokens", type=positive_ints, default="2048",
                    help="tokens per sequence in the plugin section (a comma list: one row each)")
    ap.add_argument("--out", default=str(RESULTS / "cpu_chunked.json"), help="results file ('-': print it)")
    ap.add_argument("--sections", type=comma_choices(*SECTIONS), default=",".join(SECTIONS),
                    help="the sections run, a comma list of " + ", ".join(SECTIONS) + " (default: all); the file's rows "
                    "of a section not run are kept")
    ap.add_argument("--label", default="", help="a note stored with the run (e.g. which machine)")
    ap.add_argument("--target-phases", type=comma_choices(*TARGET_PHASES), default=",".join(TARGET_PHASES),
                    help="the targets section's phases, a comma list of prefill, decode; the file's rows of a phase not "
                    "run are kept")
    return ap


def measure(args: argparse.Namespace) -> list:
    """The rows of the sections ``args`` asks for."""
    results = []
    if "plugin" in args.sections:
        results += [bench(f, args.sequences, t, args.repeats) for f in args.ops for t in args.tokens]
    if "targets" in args.sections:
        for f in args.ops:
            phases = args.target_phases
            rows = [bench_target_prefill(f, n, t, args.repeats) for n, t in TARGET_SHAPES] if "prefill" in phases else []
            rows += [bench_target_decode(f, b, args.repeats) for b in (1, 4)] if "decode" in phases else []
            print(f"  targets {f}: " + ", ".join(f"{r['op']} {r['sequences']}x{r['tokens_per_sequence']} "
                                                 f"{r['speedup_vs_transformers']}" for r in rows),
                  file=sys.stderr, flush=True)
            results += rows
    if "hf_example" in args.sections:
        results += [bench_hf_example(m, args.repeats) for m in ("qwen3-next", "kimi-linear")]
    if "hf_bound" in args.sections:
        results.append(bench_hf_bound(args.repeats))
    return results


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = args.sections
    if "plugin" in sections and "cpu-chunked" not in linattn.list_backends():
        sys.exit("cpu-chunked is not installed: pip install -e examples/linattn-cpu-chunked")
    load0 = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = measure(args)
    if not results:
        sys.exit("nothing was measured: no results written")
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    kept = _kept_rows(args.out, lambda r: r.get("kind", "plugin") == "plugin") if "plugin" not in sections else []
    ran = {(f, p) for f in args.ops for p in args.target_phases} if "targets" in sections else set()
    kept_targets = _kept_rows(args.out, lambda r: r.get("kind") == "target" and tuple(r["op"].split("_")) not in ran)
    kept_hf = [r for kind in ("hf_example", "hf_bound") if kind not in sections
               for r in _kept_rows(args.out, lambda r, kind=kind: r.get("kind") == kind)]
    results = kept + kept_targets + results + kept_hf
    notes = ["kind=plugin: torch-chunked, the example plugin cpu-chunked and torch-ref through the public ops "
             f"(validation and dispatch included), {args.sequences} sequences of {','.join(map(str, args.tokens))} tokens (one row per "
             "length) in one varlen call, bf16 q/k/v, fp32 pool; each repeat runs all back to back, each first in "
             "turn; seconds = every repeat.",
             "kind=target: linattn's default (the dispatcher's choice, recorded) against transformers' own PyTorch "
             "functions (unwrapped from the hub/FLA wrappers), fp32, interleaved A/B with alternating order, "
             "medians; decode rows time 20 back-to-back steps per repeat. kind=hf_example: examples/hf_generate.py's "
             "CPU run with and without linattn.integrations.transformers.enable, interleaved; enable() / disable() run "
             "before each timing, outside it (the example enables once). kind=hf_bound: the Qwen3-Next example five ways "
             "interleaved (module docstring): what routing alone and torch-chunked's maths alone cost.",
             f"machine: {args.label or '(no --label)'}; shared with other jobs: load average at the start {load0}, "
             f"at the end {load}."]
    if kept:
        notes.append(f"The kind=plugin rows were not re-run (--sections {','.join(args.sections)}): kept from the file's earlier "
                     f"run, commit {kept[0]['from_commit']}, whose rows compared cpu-chunked and torch-ref only.")
    if kept_targets or kept_hf:
        notes.append("Rows with from_commit were not re-run (--sections / --target-phases): kept from the file's "
                     "earlier run of that commit, with its machine and load; measured_by names that run's command and commit.")
    if args.out == "-":
        print(json.dumps(make_results(results, notes).model_dump(), indent=1))
    else:
        write_results(args.out, results, notes)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
