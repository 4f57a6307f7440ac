"""Tiny random Hugging Face models through linattn, through transformers' default path, against an fp32 reference.

For each tiny random model of ``linattn.integrations.transformers.TINY_MODELS`` that the installed
transformers has (Qwen3-Next, Qwen3.5, Kimi-Linear, OLMo-hybrid; the others get a row with
``"skipped"``) and each dtype (float32, bfloat16), the same weights (one seed) run three ways:

- ``reference``: float32, transformers' own PyTorch implementation of the linear attention (and of
  the causal conv), forced even where fla-core / causal-conv1d are installed (see
  :func:`torch_reference_path`); computed once per model;
- ``default``: the model cast to the dtype, transformers' default path: FLA's kernels where fla-core
  is importable, else its PyTorch fallback (each row says which: ``functions`` / ``kernels``);
- ``linattn``: the same cast model after ``linattn.integrations.transformers.enable(model)``.

Measured against the reference, under ``torch.inference_mode()``: prefill logits of 2 prompts x
``--prompt-len`` tokens (and 1 x ``--long-len`` on cuda), as max abs error and that error over the
reference's max abs logit; greedy generation of ``--new-tokens`` tokens for batch 1 and batch 2:
fraction of new tokens equal to the reference's and the first index where any row differs. linattn
rows also give the backend ``linattn.last_decision()`` names after each prefill and generation,
the number of linattn kernel calls, and their logits' and tokens' agreement with the default path
(``vs_default``). A run that raises is recorded with ``"error"`` and the others go on (exit code 1).

Usage::

    python benchmarks/hf_models.py                        # cuda; writes benchmarks/results/hf_models_h200.json
    python benchmarks/hf_models.py --device cpu           # smoke run, prints only (add --out FILE to keep it)
    python benchmarks/hf_models.py --models kimi-linear --dtypes bfloat16 --device cpu --prompt-len 80

The file is in the schema of ``benchmarks/_results.py`` (command, commit, device, toolchain, rows,
notes; ``$LINATTN_RESULTS_DIR`` redirects the default folder, ``$LINATTN_COMMIT`` names the commit
where the tree has no ``.git``). Rows: one per (model, dtype, path); ``path`` "reference" once per
model; a model the installed transformers lacks gets rows with ``"skipped"``. Needs torch,
transformers and linattn; fla-core, causal-conv1d and triton are optional.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import inspect
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

import linattn
import linattn.integrations.transformers as lt

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import _results  # benchmarks/_results.py: the schema of benchmarks/results/ (pydantic, as linattn needs)
except ImportError:  # an older tree without it: the same six keys are written unchecked
    _results = None

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# -- environment -------------------------------------------------------------------------------------------

def _commit() -> str:
    if _results is not None:
        return _results.current_commit()
    try:
        done = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], check=False, cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
        head = done.stdout.strip() if done.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):  # the device copy of the tree may have no git or no .git
        head = ""
    return head or os.environ.get("LINATTN_COMMIT") or "unknown (no .git here; pass LINATTN_COMMIT)"


def _device(args) -> dict:
    if not args.device.startswith("cuda"):
        if _results is not None and not torch.cuda.is_available():
            return _results.device_info()
        return {"name": platform.processor() or platform.machine() or "cpu", "kind": "cpu",
                "torch_threads": torch.get_num_threads()}
    if _results is not None:
        return _results.device_info()
    return {"name": torch.cuda.get_device_name(torch.device(args.device)), "kind": "cuda"}


def _dist_version(*names):
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def toolchain() -> dict:
    import transformers

    try:
        import fla  # noqa: F401
        fla_import = "ok"
    except Exception as e:  # noqa: BLE001 - absent, or present but not importable here
        fla_import = f"{type(e).__name__}: {e}"
    base = _results.toolchain_info() if _results is not None else {}
    return {
        **base,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _dist_version("triton", "pytorch-triton"),
        "transformers": transformers.__version__,
        "fla-core": _dist_version("fla-core", "flash-linear-attention"),
        "fla_import": fla_import,
        "causal-conv1d": _dist_version("causal-conv1d", "causal_conv1d"),
        "kernels": _dist_version("kernels"),
        "linattn": getattr(linattn, "__version__", None),
        "linattn_path": str(Path(linattn.__file__).parent),
    }


# -- what transformers' kernel functions are bound to ------------------------------------------------------

def _closure(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def _fallback_wrapper(obj):
    """The transformers wrapper (from ``use_kernel_func_from_hub_with_fallback``) behind a module
    global, through linattn's router and any ``functools.wraps`` layers; None if there is none.
    That wrapper closes over ``torch_function`` (transformers' own def) and ``implementation``
    (what it calls: the same function, or e.g. FLA's where that package imported)."""
    for _ in range(8):
        if isinstance(obj, lt._Router):
            obj = obj.original
            continue
        if {"torch_function", "implementation"} <= set(_closure(obj)):
            return obj
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return None
    return None


def kernel_globals(model) -> list:
    """[(module, global name)] of the kernel functions with a torch fallback that the forward of any
    layer of ``model`` names (the gated-delta-rule / KDA functions and the causal conv)."""
    found = {}
    for layer in model.modules():
        fwd = next((k.__dict__["forward"] for k in type(layer).__mro__ if "forward" in k.__dict__), None)
        fn = inspect.unwrap(fwd) if fwd is not None else None
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if fn is None or module is None or not hasattr(fn, "__code__"):
            continue
        for name in fn.__code__.co_names:
            if name in vars(module) and _fallback_wrapper(vars(module)[name]) is not None:
                found[(module.__name__, name)] = module
    return [(module, name) for (_, name), module in sorted(found.items())]


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def bound_functions(model) -> dict:
    """{global name: (kind, what it calls)} right now; kind is "linattn" (routed by enable),
    "fla", "torch" (transformers' own PyTorch def) or the top-level package of another kernel."""
    out = {}
    for module, name in kernel_globals(model):
        obj = vars(module)[name]
        wrapper = _fallback_wrapper(obj)
        cl = _closure(wrapper)
        impl, torch_fn = cl["implementation"], cl["torch_function"]
        if isinstance(obj, lt._Router) and obj.users > 0:
            out[name] = ("linattn", _qualname(obj.target))
        elif impl is torch_fn:
            out[name] = ("torch", _qualname(torch_fn))
        else:
            top = (getattr(impl, "__module__", None) or "?").split(".")[0]
            out[name] = ("fla" if top == "fla" else top, _qualname(impl))
    return out


def kernels_summary(functions: dict) -> str:
    """The kind(s) of the linear-attention functions (not the conv), e.g. "fla" or "torch"."""
    kinds = sorted({kind for name, (kind, _) in functions.items() if name in lt.FUNCTIONS})
    return "+".join(kinds) or "none"


@contextlib.contextmanager
def torch_reference_path(model):
    """Run ``model`` on transformers' own PyTorch kernels, whatever is installed.

    How: the layers' forwards call module-level globals of their modeling file
    (``torch_chunk_gated_delta_rule``, ``chunk_kimi_delta_attention``, ``causal_conv1d_fn``, ...),
    looked up at call time, so a per-layer attribute would not be seen. Each global is a wrapper
    made by transformers' ``use_kernel_func_from_hub_with_fallback`` that calls FLA's (or
    causal-conv1d's) function when that package imported and keeps transformers' own torch def in
    its closure as ``torch_function``. For the duration of this context each such global is set to
    a shim calling that torch def (keywords it does not take are dropped, as the wrapper does), and
    put back afterwards. The module globals are shared, so only the reference runs inside it, with
    no model enabled for linattn (a linattn router there is refused). Yields {global name: the torch
    def it now calls}."""
    swaps, functions = [], {}
    try:
        for module, name in kernel_globals(model):
            obj = vars(module)[name]
            if isinstance(obj, lt._Router):
                raise RuntimeError(f"{module.__name__}.{name} is routed to linattn; disable the model first")
            torch_fn = _closure(_fallback_wrapper(obj))["torch_function"]
            if getattr(torch_fn, "__module__", None) != module.__name__:
                raise RuntimeError(f"{module.__name__}.{name}: its fallback {_qualname(torch_fn)} is not "
                                   f"transformers' own def")
            swaps.append((module, name, obj))
            setattr(module, name, _torch_shim(torch_fn))
            functions[name] = _qualname(torch_fn)
        yield functions
    finally:
        for module, name, obj in reversed(swaps):
            setattr(module, name, obj)


def _torch_shim(torch_fn):
    params = inspect.signature(torch_fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return torch_fn
    return lambda *args, **kwargs: torch_fn(*args, **{k: v for k, v in kwargs.items() if k in params})


@contextlib.contextmanager
def count_linattn_calls(model):
    """{global name: calls} that reached linattn through the enabled model's routers."""
    counts, saved = {}, []
    for module, name in kernel_globals(model):
        router = vars(module)[name]
        if isinstance(router, lt._Router):
            counts[name] = 0

            def counted(*args, _inner=router.target, _name=name, **kwargs):
                counts[_name] += 1
                return _inner(*args, **kwargs)

            saved.append((router, router.target))
            router.target = counted
    try:
        yield counts
    finally:
        for router, target in saved:
            router.target = target


# -- the runs ----------------------------------------------------------------------------------------------

def make_inputs(vocab: int, args) -> dict:
    """{case: token ids}: prefill cases "BxT" and the generation prompts "gen_b1" / "gen_b2"."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, vocab, (2, args.prompt_len), generator=gen).to(args.device)
    cases = {f"2x{args.prompt_len}": ids}
    if args.long_len:
        cases[f"1x{args.long_len}"] = torch.randint(3, vocab, (1, args.long_len), generator=gen).to(args.device)
    cases["gen_b1"], cases["gen_b2"] = ids[:1], ids
    return cases


def _decision():
    d = linattn.last_decision()
    return None if d is None else {"op": d.op, "chosen": d.chosen}


def run_once(model, inputs: dict, args, *, decisions: bool) -> dict:
    """Prefill logits (fp32) of each prefill case and greedy new tokens of each generation case;
    with ``decisions``, linattn's last decision after each (the last linear-attention call)."""
    out = {"logits": {}, "tokens": {}, "decisions": {}}
    with torch.inference_mode():
        for case, ids in inputs.items():
            if case.startswith("gen_"):
                seq = model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                     do_sample=False, pad_token_id=0)
                out["tokens"][case] = seq[:, ids.shape[1]:].cpu()
            else:
                out["logits"][case] = model(ids).logits.float()
            if decisions:
                out["decisions"][case] = _decision()
    return out


def compare(got: dict, ref: dict, default: dict | None = None) -> dict:
    prefill = {}
    for case, ref_logits in ref["logits"].items():
        err = float((got["logits"][case] - ref_logits).abs().max())
        scale = float(ref_logits.abs().max())
        prefill[case] = {"max_abs_err": err, "rel_err": err / scale, "ref_max_abs_logit": scale,
                         "finite": bool(torch.isfinite(got["logits"][case]).all())}
        if default is not None:
            prefill[case]["vs_default_rel_err"] = float((got["logits"][case] - default["logits"][case]).abs().max()
                                                        / default["logits"][case].abs().max())
        if case in got["decisions"]:
            prefill[case]["decision"] = got["decisions"][case]
    generate = {}
    for case, ref_tokens in ref["tokens"].items():
        generate[case[4:]] = _token_match(got["tokens"][case], ref_tokens)
        if default is not None:
            generate[case[4:]]["vs_default"] = _token_match(got["tokens"][case], default["tokens"][case])
        if case in got["decisions"]:
            generate[case[4:]]["decision"] = got["decisions"][case]
    return {"prefill": prefill, "generate": generate}


def _token_match(tokens: torch.Tensor, ref: torch.Tensor) -> dict:
    same = tokens == ref
    differ = (~same).any(dim=0).nonzero()
    return {"match": float(same.float().mean()), "first_divergence": int(differ[0]) if len(differ) else None,
            "new_tokens": int(tokens.shape[1])}


def run_path(model, path: str, inputs: dict, ref: dict, default: dict | None, args) -> tuple:
    """One (dtype, path) row's measurements; returns (row fields, raw outputs or None)."""
    t0 = time.perf_counter()
    row, raw = {}, None
    try:
        if path == "linattn":
            lt.enable(model, backend=args.backend)
        functions = bound_functions(model)
        row["kernels"], row["functions"] = kernels_summary(functions), {k: v[1] for k, v in functions.items()}
        with count_linattn_calls(model) as calls:
            raw = run_once(model, inputs, args, decisions=path == "linattn")
        if path == "linattn":
            row["linattn_calls"] = dict(calls)
        row.update(compare(raw, ref, default if path == "linattn" else None))
    except Exception as e:  # noqa: BLE001 - one failing run is recorded, the others go on
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        lt.disable(model)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row, raw


def run_model(name: str, args) -> list:
    """All rows of one tiny model: its reference row, then (dtype, path) rows."""
    base = {"model": name}
    try:
        ref_model = lt.tiny_random_model(name, device=args.device, dtype=torch.float32, seed=args.seed)
    except ImportError as e:
        return [dict(base, dtype=d, path=p, skipped=str(e)) for d in args.dtypes for p in ("default", "linattn")]
    base["arch"] = type(ref_model).__name__
    inputs = make_inputs(ref_model.config.vocab_size, args)
    t0 = time.perf_counter()
    try:
        with torch_reference_path(ref_model) as functions:
            ref = run_once(ref_model, inputs, args, decisions=False)
    except Exception as e:  # noqa: BLE001 - without a reference this model has nothing to compare; the others go on
        traceback.print_exc()
        return [dict(base, dtype="float32", path="reference", error=f"{type(e).__name__}: {e}"[:2000])]
    rows = [dict(base, dtype="float32", path="reference", kernels="torch", functions=functions,
                 wall_s=round(time.perf_counter() - t0, 2))]
    for dname in args.dtypes:
        model = copy.deepcopy(ref_model).to(DTYPES[dname])
        default = None
        for path in ("default", "linattn"):
            print(f"[hf_models] {name} {dname} {path}", flush=True)
            row, raw = run_path(model, path, inputs, ref, default, args)
            default = raw if path == "default" else default
            rows.append(dict(base, dtype=dname, path=path, **row))
        del model
    return rows


# -- output ------------------------------------------------------------------------------------------------

def _fmt(x, spec=".1e") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list, args) -> None:
    cases = [c for c in (f"2x{args.prompt_len}", f"1x{args.long_len}" if args.long_len else None) if c]
    head = ["model", "dtype", "path", "kernels", *(f"rel {c}" for c in cases), f"vs default {cases[0]}",
            "gen b1 match/div", "gen b2 match/div", "linattn prefill / decode"]
    lines = [head]
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append([r["model"], r["dtype"], r["path"], "skipped: " + r["skipped"] if "skipped" in r
                          else "ERROR: " + r["error"][:60]])
            continue
        line = [r["model"], r["dtype"], r["path"], r["kernels"]]
        line += ["0 (ref)" if r["path"] == "reference" else _fmt(r["prefill"][c]["rel_err"]) for c in cases]
        line.append(_fmt(r.get("prefill", {}).get(cases[0], {}).get("vs_default_rel_err")))
        for b in ("b1", "b2"):
            g = r.get("generate", {}).get(b)
            line.append("ref" if g is None else f"{g['match']:.2f}/{_fmt(g['first_divergence'], 'd')}")
        dec = (r.get("prefill", {}).get(cases[0], {}).get("decision"),
               r.get("generate", {}).get("b2", {}).get("decision"))
        line.append(" / ".join(d["chosen"] if d else "-" for d in dec) if r["path"] == "linattn" else "")
        lines.append(line)
    widths = [max(len(str(ln[i])) for ln in lines if i < len(ln) and len(ln) == len(head)) for i in range(len(head))]
    for ln in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(ln, widths)) if len(ln) == len(head) else "  ".join(ln))


def notes(args) -> list:
    return [
        ("What: tiny random HF models in bf16 and fp32, linattn.integrations.transformers.enable against "
         "transformers' default path (FLA where installed) and against an fp32 torch reference of the same weights."),
        (f"Settings: prompts 2 x {args.prompt_len} tokens" + (f" and 1 x {args.long_len}" if args.long_len else "")
         + f", {args.new_tokens} new tokens, seed {args.seed}, dtypes {', '.join(args.dtypes)}, "
         f"linattn backend {args.backend or 'auto (the dispatcher chooses)'}, device {args.device}."),
        ("Models: linattn.integrations.transformers.tiny_random_model (4 layers: 3 linear attention + 1 full "
         f"attention, head dims 64, vocab 256), random weights from seed {args.seed}; nothing downloaded."),
        ("reference: the fp32 weights on transformers' own PyTorch functions (module globals swapped to the "
         "torch defs kept in transformers' fallback wrappers, for the reference runs only); TF32 off for the "
         "whole run (cuBLAS and cuDNN), so fp32 rows compare fp32 arithmetic."),
        ("default / linattn: a deep copy of the reference model cast with .to(dtype); default = transformers' "
         "own dispatch (FLA where fla-core imports, else its torch fallback: see each row's 'kernels' and "
         "'functions'); linattn = after enable(model) (the causal conv stays on transformers' path)."),
        ("rel_err = max |logits - ref| / max |ref|; vs_default (linattn rows): the same against the default "
         "path's logits / tokens in that dtype. generate: greedy, min_new_tokens = max_new_tokens (no early "
         "EOS); match = fraction of new tokens equal to the reference's; first_divergence = first new-token "
         "index where any row differs (null: identical). The greedy argmax of a random model is fragile (its "
         "logits are close together: see ref_max_abs_logit), so bf16 runs can leave the fp32 reference's "
         "tokens on both paths; vs_default tells linattn's own share."),
        ("linattn decisions: linattn.last_decision() after each prefill / generation (the last linear-attention "
         "call: a prefill op after a prefill, the decode route after a generation). wall_s includes JIT "
         "compiles and warm-up: not a speed measurement."),
    ]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default=",".join(lt.TINY_MODELS), help="comma-separated TINY_MODELS names")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompt-len", type=int, default=200, help="tokens per prompt of the 2-prompt batch (> 64)")
    ap.add_argument("--long-len", type=int, default=None, help="one long prompt (default 1000 on cuda, none on cpu)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default=None, help="force a linattn backend (default: the dispatcher chooses)")
    ap.add_argument("--out", default=None, help="JSON file (default on cuda: benchmarks/results/hf_models_<gpu>.json, "
                    "e.g. _h200; on cpu: print only)")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for m in args.models:
        if m not in lt.TINY_MODELS:
            ap.error(f"unknown model {m!r}; known: {', '.join(lt.TINY_MODELS)}")
    for d in args.dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; known: {', '.join(DTYPES)}")
    cuda = args.device.startswith("cuda")
    if args.long_len is None:
        args.long_len = 1000 if cuda else 0
    if args.out is None and cuda:  # the canonical file; $LINATTN_RESULTS_DIR redirects it (device wrappers)
        args.out = str(_results.results_path("hf_models") if _results is not None
                       else ROOT / "benchmarks/results/hf_models_h200.json")
    return args


def results_doc(rows: list, args, argv) -> dict:
    """The results file: command, commit, device, toolchain, rows, notes (checked by
    ``benchmarks/_results.py``'s schema where that file is there)."""
    command = " ".join(["python", os.path.relpath(__file__, ROOT),
                        *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    doc = {"command": command, "commit": _commit(), "device": _device(args), "toolchain": toolchain(),
           "rows": rows, "notes": [*notes(args), f"written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC"]}
    return _results.Results(**doc).model_dump() if _results is not None else doc


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = [row for name in args.models for row in run_model(name, args)]
    doc = results_doc(rows, args, argv)
    print_table(rows, args)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"[hf_models] wrote {out}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
