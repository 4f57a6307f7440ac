"""Greedy generation with a tiny random Hugging Face model, with and without linattn.

    python examples/hf_generate.py --model kimi-linear            # CPU, a few seconds
    python examples/hf_generate.py --model qwen3-next --device cuda --dtype bfloat16

The model is built from transformers' own config class with random weights (nothing is
downloaded). The script generates once on transformers' own path and once after
``linattn.integrations.transformers.enable(model)``, then prints linattn's backend decisions, the
prefill logits' difference and whether the tokens are identical. Needs ``pip install
'linattn[transformers]'``.
"""

from __future__ import annotations

import argparse
import time

import torch

import linattn
import linattn.integrations.transformers as lt
from linattn.dispatch.rules.ops_table import find_op


#: each tiny model's linear-attention layers (lt.TINY_MODELS): the family of ops they call, key heads, value heads
#: (head dims 64)
LINEAR_LAYERS = {"qwen3-next": ("gdn", 1, 2), "qwen3.5": ("gdn", 1, 2), "kimi-linear": ("kda", 2, 2),
                 "olmo-hybrid": ("gdn", 2, 2)}


def device_arg(text: str) -> torch.device:
    """An argparse type: a torch device string naming a device that is present (linattn probes it)."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device string ('cpu', 'cuda', 'cuda:1')") from None
    try:
        linattn.device_capabilities(dev)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).split("; ")[0]) from None
    return dev


def backend_refusal(args: argparse.Namespace) -> str:
    """Why the forced ``--backend`` cannot run the model's prefill or decode on ``--device`` (linattn's
    own verdict), or "" when it can (or none is forced)."""
    if args.backend is None:
        return ""
    family, h, hv = LINEAR_LAYERS[args.model]
    for phase, t in (("prefill", args.batch * args.prompt_len), ("decode", args.batch)):
        problem = linattn.Problem(op=find_op(family, phase), n=args.batch, t=t, h=h, hv=hv,
                                  k=64, v=64, dtype=args.dtype)
        decision = linattn.explain(problem, args.device, backend=args.backend)
        if decision.chosen is None:
            return f"{args.backend} cannot run {problem.op} on {args.device}: {decision.verdict(args.backend).message}"
    return ""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kimi-linear", choices=sorted(lt.TINY_MODELS))
    ap.add_argument("--device", type=device_arg, default="cpu", help="a torch device that is present (default cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompt-len", type=int, default=80, help="tokens per prompt (> 64: more than one chunk)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--backend", default=None, choices=sorted(linattn.list_backends()),
                    help="force a linattn backend (default: the dispatcher chooses)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("prompt_len", "batch", "new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    why = backend_refusal(args)
    if why:
        ap.error(f"--backend {why}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    model = lt.tiny_random_model(args.model, device=args.device, dtype=dtype, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.prompt_len), generator=gen).to(args.device)

    def run():
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = model(ids).logits.float()
            out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        return logits, out, time.perf_counter() - t0

    ref_logits, ref_out, t_ref = run()
    lt.enable(model, backend=args.backend)
    logits, out, t_lin = run()
    decisions = {}  # the decisions of a prefill and a decode call
    with torch.no_grad():
        model(ids)
        decisions["prefill"] = linattn.last_decision()
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
        decisions["decode"] = linattn.last_decision()
    lt.disable(model)

    print(f"model: tiny random {args.model} ({type(model).__name__}), {args.device}, {args.dtype}, "
          f"batch {args.batch} x {args.prompt_len} prompt tokens, {args.new_tokens} new tokens")
    for what, d in decisions.items():
        runners = ", ".join(d.runners_up) if getattr(d, "runners_up", None) else "none"
        print(f"linattn {what}: {d.op} -> {d.chosen} (runners-up: {runners})")
    rel = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
    same = torch.equal(out, ref_out)
    print(f"prefill logits max rel diff vs transformers' own path: {rel:.2e}")
    print(f"generated tokens identical to transformers' own path: {same}")
    print(f"time: transformers {t_ref:.2f} s, linattn {t_lin:.2f} s (first calls include warm-up)")
    print("new tokens (linattn):", out[:, args.prompt_len:].tolist())
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
