"""examples/hf_generate.py's arguments on the CPU: an unknown backend, a device that is not present and a
backend that cannot run on the device are each one argparse error line (exit 2) before any model is built."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import linattn.integrations.transformers as lt  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "hf_generate.py"


@pytest.fixture
def example(monkeypatch):
    spec = importlib.util.spec_from_file_location("hf_generate_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(lt, "tiny_random_model", lambda *a, **k: pytest.fail("built a model despite a bad argument"))
    return mod


def usage_error(example, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        example.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv,needle", [
    (["--backend", "bogus"], "argument --backend: invalid choice: 'bogus'"),
    (["--device", "cuda:99"], "argument --device: device 'cuda:99'"),
    (["--device", "meta"], "argument --device: device 'meta' holds shapes but no data"),
    (["--device", "xyz"], "argument --device: 'xyz' is not a torch device string"),
    (["--backend", "cutedsl"], "error: --backend cutedsl cannot run kda_prefill on cpu: device_type='cpu'"),
    (["--backend", "cutedsl", "--model", "qwen3-next"], "error: --backend cutedsl cannot run gdn_prefill on cpu"),
])
def test_a_bad_argument_is_one_error_line_before_any_model_is_built(argv, needle, example, capsys):
    assert needle in usage_error(example, argv, capsys)


def test_a_backend_that_can_run_on_the_device_is_accepted(example):
    args = example.parse_args(["--backend", "torch-chunked", "--model", "qwen3-next"])
    assert (args.backend, args.device) == ("torch-chunked", torch.device("cpu"))


def test_triton_on_a_cpu_without_the_interpreter_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: triton-split can run")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONSAFEPATH": "1"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--backend", "triton-split"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "error: --backend triton-split cannot run kda_prefill on cpu: vendor='cpu' without the Triton interpreter" in res.stderr


def test_the_layers_the_check_asks_about_are_the_tiny_models(example):
    assert set(example.LINEAR_LAYERS) == set(lt.TINY_MODELS)
    for name, (family, h, hv) in example.LINEAR_LAYERS.items():
        cfg = lt.TINY_MODELS[name][2]
        assert (family == "kda") == (name == "kimi-linear")
        assert (h, hv) == (cfg.get("linear_num_key_heads", cfg.get("linear_num_heads")),
                           cfg.get("linear_num_value_heads", cfg.get("linear_num_heads")))
        assert {cfg.get(k) for k in ("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim")} - {None} == {64}
