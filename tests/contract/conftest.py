"""Contract tests run the Triton kernels: compiled on a GPU, in the interpreter on a CPU.

``TRITON_INTERPRET=1`` must be set before anything imports triton. The suite's root conftest
already does so on machines without CUDA; this file does it too, so the folder also works on its
own (``pytest tests/contract``). If another test module imported triton before the variable was
set, the kernels would try to compile for a GPU: run the contract tests in their own process then.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the contract runs on: the GPU when there is one, else the CPU interpreter."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    import sys

    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; run tests/contract in its own process")
    return torch.device("cpu")
