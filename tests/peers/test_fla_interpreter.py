"""The ``fla`` peer's decode with FLA's own kernels (fla-core 0.6), run by Triton's interpreter on the
CPU, against torch-ref: the translation's argument conventions proven on the real functions, not
only on the stand-ins of ``peer_fakes.py`` (whose parameter lists ``test_fla_translation.py``
compares with FLA's). Tiny shapes (K = V = 16), both families, both state layouts, the one-call
path and the one-call-per-token path (intermediate states). About 10 s, in a subprocess
(``TRITON_INTERPRET=1`` must be set before Triton is imported). Skipped where fla-core is not
installed (CI: ``pyproject.toml`` says why); ``benchmarks/peers_device.sh`` runs it.

Prefill is not here: FLA 0.6's chunk kernels do not run in Triton 3.6's interpreter as shipped
(``chunk_delta_h.py`` calls ``.to`` on a Python loop index: AttributeError) and the interpreter's
bf16 ``tl.dot`` gives garbage (FLA's own chunked GDN against its own recurrent one: relative error
1e11 in bf16, 6e-4 in fp16, 3e-7 in fp32). With that one line patched in a scratch copy, the
backend's fp16 prefill matched torch-ref (o 6e-4, pool 3e-4; gdn/kda x vk/kv, padding and an empty
sequence, rows not owned bitwise unchanged), but that is not a test; prefill is proven on the GPU
(``tests/gpu/test_peers_gpu.py``, ``linattn check --backend fla``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from linattn.backends import peer


def test_fla_decode_in_the_triton_interpreter_matches_the_reference():
    if not peer.installed("fla") or not peer.installed("triton"):
        pytest.skip("fla-core (and triton) not installed (pip install 'linattn[peers]')")
    # no GPU in the child: FLA then places nothing on one, and the interpreter runs the CPU tensors
    env = {**os.environ, "TRITON_INTERPRET": "1", "FLA_DISABLE_BACKEND_DISPATCH": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("ok ") == 8, run.stdout


def main() -> None:
    import torch

    from linattn.backends.fla import FLABackend
    from linattn.backends.torch_ref import gdn_decode_ref, kda_decode_ref
    from linattn.dispatch.plugin.calls import make_call
    from linattn.testing.compare import rel_error_exact_zero as _rel

    N, H, HV, K, V, P = 3, 1, 2, 16, 16, 6
    for family in ("gdn", "kda"):
        for layout in ("vk", "kv"):
            for T, inter in ((2, False), (2, True)):
                gen = torch.Generator().manual_seed(0)
                r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
                kd = (K,) if family == "kda" else ()
                d = dict(q=r(N, T, H, K).bfloat16(), k=r(N, T, H, K).bfloat16(), v=r(N, T, HV, V).bfloat16(),
                         a=r(N, T, HV, *kd), b=r(N, T, HV), A_log=r(HV), dt_bias=r(HV, *kd))
                pool = 0.1 * r(P, HV, K, V)
                slots = torch.tensor([4, -1, 1])
                mine, ref_pool = pool.clone(), pool.clone()
                extra = dict(lower_bound=None) if family == "kda" else {}
                buf = dict(mine=torch.zeros(N, T, HV, K, V), ref=torch.zeros(N, T, HV, K, V))
                if inter:
                    extra.update(intermediate_state_indices=torch.tensor([2, -1, 0]))
                call = make_call(f"{family}_decode", dict(
                    **d, state_pool=mine, state_indices=slots, scale=K ** -0.5, use_qk_l2norm=True,
                    state_layout=layout, **extra, **({"intermediate_states": buf["mine"]} if inter else {})))
                o = FLABackend().decode(call)
                ref = gdn_decode_ref if family == "gdn" else kda_decode_ref
                o_ref = ref(**d, state_pool=ref_pool, state_indices=slots, scale=K ** -0.5, use_qk_l2norm=True,
                            state_layout=layout, **extra, **({"intermediate_states": buf["ref"]} if inter else {}))
                case = f"{family} {layout} T={T} {'per token' if inter else 'one call'}"
                assert _rel(o, o_ref) < 1e-2, (case, "o", _rel(o, o_ref))  # bf16 outputs: a few ulps
                assert _rel(mine, ref_pool) < 1e-5, (case, "pool", _rel(mine, ref_pool))
                assert torch.equal(mine[[0, 2, 3, 5]], pool[[0, 2, 3, 5]]), case  # not owned: same bits
                assert bool(o[1].eq(0).all()), case  # the padding row
                if inter:
                    assert _rel(buf["mine"], buf["ref"]) < 1e-5, (case, "intermediate", _rel(buf["mine"], buf["ref"]))
                print("ok", case, f"o {_rel(o, o_ref):.1e} pool {_rel(mine, ref_pool):.1e}", flush=True)


if __name__ == "__main__":
    main()
