"""Seeded inputs for the chunked PyTorch prefills' tests (the built-in ``torch-chunked``,
tests/prefill/test_torch_chunked.py, and the example plugin, tests/plugins/test_cpu_chunked.py), in
every gate regime their code distinguishes, and the relative error they are held to."""

import itertools

import torch

from linattn.testing.compare import rel_error_exact_zero as rel  # noqa: F401 - the error the tests import from here


def chunked_inputs(kda, lens, gates, H=2, HV=4, K=32, V=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q, k = (torch.randn(T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(T, HV, V, generator=gen).to(dtype)
    shape = (T, HV, K) if kda else (T, HV)
    g = {"moderate": -torch.rand(shape, generator=gen) * 0.5,
         "strong": torch.full(shape, -20.0),  # e^-60 and beyond inside every KDA chunk: the blocked path
         "floor": torch.full(shape, -1000.0),
         # fast decay in the first 100 tokens, slow after: steep and mild KDA blocks side by side,
         # some diagonal 16-row blocks factorised, others summed pairwise
         "mixed": -torch.rand(shape, generator=gen) * torch.where(torch.arange(T) < 100, 8.0, 0.05).view(
             T, *([1] * (len(shape) - 1))),
         # a floor gate, then mild ones (F28): the two-float cumulative sums
         "floor-then-mild": torch.where(torch.arange(T) % 64 == 3, -1000.0, -0.01).view(
             T, *([1] * (len(shape) - 1))).expand(shape).clone()}[gates]
    beta = torch.rand(T, HV, generator=gen)
    cu = torch.tensor([0, *itertools.accumulate(lens)])
    return q, k, v, g, beta, cu
