"""benchmarks/cpu_chunked.py's arguments on the CPU: each malformed value is an argparse error (exit 2, one line
naming the argument) before anything is measured or written; every argument has help text; a run that measures
no row writes nothing."""

import pytest


@pytest.fixture
def bench(load_benchmark, monkeypatch):
    mod = load_benchmark("cpu_chunked", "cpu_chunked_bench_under_test")

    def no_measuring(*a, **kw):
        raise AssertionError("measured despite a bad argument")

    for name in ("bench", "bench_target_prefill", "bench_target_decode", "bench_hf_example", "bench_hf_bound", "write_results"):
        monkeypatch.setattr(mod, name, no_measuring)
    return mod


@pytest.mark.parametrize("argv,needle", [
    (["--sections", "foo"], "argument --sections: 'foo': expected a comma list of plugin, targets, hf_example, hf_bound"),
    (["--sections", ""], "argument --sections: ''"),
    (["--sections", "targets,targets"], "argument --sections: 'targets,targets': a name is repeated"),
    (["--ops", "foo"], "argument --ops: 'foo': expected a comma list of gdn, kda"),
    (["--target-phases", "foo"], "argument --target-phases: 'foo': expected a comma list of prefill, decode"),
    (["--repeats", "0"], "argument --repeats: '0': expected a positive integer"),
    (["--repeats", "x"], "argument --repeats: 'x': expected a positive integer"),
    (["--tokens", "abc"], "argument --tokens: 'abc': expected a positive integer"),
    (["--tokens", "64,0"], "argument --tokens: '0': expected a positive integer"),
    (["--sequences", "0"], "argument --sequences: '0': expected a positive integer"),
    (["--threads", "-2"], "argument --threads: '-2': expected a positive integer"),
])
def test_a_malformed_argument_is_an_argparse_error(argv, needle, bench, usage_error, tmp_path):
    out = tmp_path / "r.json"
    err = usage_error(bench.main, argv + ["--out", str(out)])
    assert needle in err
    assert "Traceback" not in err
    assert not out.exists()


def test_every_argument_has_help(bench):
    actions = [a for a in bench.build_parser()._actions if a.dest != "help"]
    assert actions
    assert [a.dest for a in actions if not a.help] == []


def test_well_formed_arguments_parse_to_lists(bench):
    args = bench.build_parser().parse_args(["--ops", "kda", "--tokens", "64,128", "--sections", "targets,plugin",
                                            "--target-phases", "decode", "--threads", "2"])
    assert (args.ops, args.tokens, args.sections, args.target_phases, args.threads) == (
        ["kda"], [64, 128], ["targets", "plugin"], ["decode"], 2)
    defaults = bench.build_parser().parse_args([])
    assert (defaults.ops, defaults.tokens, defaults.repeats) == (["gdn", "kda"], [2048], 5)


def test_nothing_measured_writes_nothing(bench, monkeypatch, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("{}")
    monkeypatch.setattr(bench, "measure", lambda args: [])
    with pytest.raises(SystemExit) as e:
        bench.main(["--sections", "targets", "--out", str(out)])
    assert "nothing was measured" in str(e.value.code)
    assert out.read_text() == "{}"
