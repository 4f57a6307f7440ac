"""benchmarks/fused_prefill.py's arguments on the CPU: each malformed value is an argparse error (exit 2, one
line naming the argument) before anything needs a GPU; well-formed ones reach the GPU check."""

import pytest


@pytest.mark.parametrize("argv,needle", [
    (["--shapes", "foo"], "argument --shapes: 'foo': expected NxL@H/HV"),
    (["--shapes", "16x4096"], "argument --shapes: '16x4096'"),
    (["--shapes", "0x4096@16/32"], "argument --shapes: '0x4096@16/32'"),
    (["--shapes", "16x4096@16/33"], "HV a multiple of H"),
    (["--regs", "abc"], "argument --regs: 'abc': expected prep/walk"),
    (["--regs", "100/200"], "argument --regs: '100/200'"),
    (["--regs", "112/192:dma"], "argument --regs: '112/192:dma': expected prep/walk[:tma|:cpasync]"),
    (["--regs", "112/192 :tma"], "argument --regs: '112/192 :tma': expected prep/walk"),
    (["--regs", " 112/192"], "argument --regs: ' 112/192': expected prep/walk"),
    (["--regs", "112/192,112/192"], "a build named twice"),
    (["--ablate", "x:nonsense"], "argument --ablate: 'x:nonsense'"),
])
def test_a_malformed_argument_is_an_argparse_error(argv, needle, usage_error, load_benchmark):
    bench = load_benchmark("fused_prefill", "fused_prefill_bench_under_test")
    assert needle in usage_error(bench.main, argv)


def test_well_formed_arguments_reach_the_gpu_check(monkeypatch, usage_error, load_benchmark):
    bench = load_benchmark("fused_prefill", "fused_prefill_bench_under_test")
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    err = usage_error(bench.main, ["--shapes", "16x4096@16/32,8x1024@16/32", "--regs", "112/192,120/192:cpasync,104/200:tma",
                                   "--ablate", "x,x:solve"])
    assert "needs a CUDA GPU of compute capability 9.x" in err
