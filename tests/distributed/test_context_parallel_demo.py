"""``linattn demo --context-parallel N``: two spawned gloo ranks at a tiny shape, through the CLI."""

import json

from typer.testing import CliRunner

import linattn.apps.cli as cli


def test_demo_context_parallel_prints_per_rank_times_and_agrees_with_one_rank():
    res = CliRunner().invoke(cli.app, ["demo", "--context-parallel", "2", "--cp-tokens", "150", "--shape", "1,2,8,8",
                                       "--model", "kimi-linear", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["ranks"] == 2 and rep["rank_tokens"] == [75, 75] and rep["process_group"] == "gloo"
    assert len(rep["rank_seconds"]) == 2 and all(s > 0 for s in rep["rank_seconds"]) and rep["one_rank_seconds"] > 0
    # fp32 state, bf16 inputs computed in fp32 on both sides: the fp32 state agrees far inside 1e-4; the
    # output is bf16, where an fp32 difference of 1e-7 (the ranks' other chunk boundaries) can flip a
    # rounding: a flip is one bf16 unit (2**-8 relative), more than that is a real difference
    assert rep["rel_diff_state"] < 1e-4 and rep["rel_diff_output"] < 2**-8 and rep["passed"]


def test_demo_context_parallel_refuses_zero_ranks_as_a_usage_error():
    # refused while parsing, like every count option: the option's name and its bound in the message
    res = CliRunner(env={"COLUMNS": "200"}).invoke(cli.app, ["demo", "--context-parallel", "0"])
    assert res.exit_code == 2 and "'--context-parallel'" in res.output and "greater than or equal to 1" in res.output


def test_demo_context_parallel_refuses_the_request_stream_options():
    for extra in (["--device", "cuda"], ["--requests", "5"], ["--steps", "3"]):
        res = CliRunner().invoke(cli.app, ["demo", "--context-parallel", "2", *extra])
        assert res.exit_code == 2 and extra[0] in res.output and "request-stream demo" in res.output, res.output



def test_spawn_ranks_old_import_path_is_a_deprecated_alias_of_the_new_one():
    import warnings

    import pytest

    import linattn.context_parallel as cp
    from linattn.testing.spawn import spawn_ranks

    with pytest.warns(DeprecationWarning, match=r"moved to linattn\.testing\.spawn\.spawn_ranks") as seen:
        from linattn.context_parallel import spawn_ranks as old  # what field reproducers write
    assert old is spawn_ranks
    assert seen[0].filename == __file__  # the warning points at the importing line, not at linattn
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning):
            cp.spawn_ranks  # noqa: B018 - the attribute too
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        cp.no_such_name  # noqa: B018
