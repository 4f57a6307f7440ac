"""benchmarks/decode_gluon.py (an experiment: the bf16-pool decode step in Gluon) on the CPU: its arguments are
checked before anything needs a GPU, and its kernel builds for sm_90 with every vector in a slice of the state
tile's layout (no layout conversion in its TTGIR: the experiment's premise). What it computes and how fast is
for the H200 (the script compares it with the pinned Triton decode and the float64 reference)."""

import pytest


@pytest.mark.parametrize("argv,needle", [
    (["--ns", "foo"], "argument --ns: 'foo': distinct integers in 1..65535"),
    (["--ns", "0"], "argument --ns: '0'"),
    (["--ns", "256,256"], "argument --ns: '256,256'"),
    (["--ns", "100000"], "argument --ns: '100000'"),
    (["--families", "gla"], "argument --families: 'gla': gdn, kda or gdn,kda"),
    (["--families", "gdn,gdn"], "argument --families: 'gdn,gdn'"),
])
def test_a_malformed_argument_is_an_argparse_error(argv, needle, usage_error, load_benchmark):
    bench = load_benchmark("decode_gluon", "decode_gluon_bench_under_test")
    assert needle in usage_error(bench.main, argv)


@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_the_kernel_builds_for_sm90_without_layout_conversions(gate, load_benchmark):
    bench = load_benchmark("decode_gluon", "decode_gluon_bench_under_test")
    ttgir = bench.build_sm90(gate).asm["ttgir"]
    assert "tt.func" in ttgir and "tt.store" in ttgir
    assert "convert_layout" not in ttgir
