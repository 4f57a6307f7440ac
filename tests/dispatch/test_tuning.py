"""Selection by measurement (dispatch/plugin/tuning.py, apps/tune.py): the tuned table is written,
loaded and keyed; a table of other versions is ignored with one INFO line; inside a bucket the
table ranks, outside it the static rank does; explain shows the times and the table's origin;
LINATTN_AUTOTUNE measures a missing bucket on the first eager call and never during capture.

On the CPU, with the built-in backends only (torch-ref, torch-chunked run here) and tiny shapes,
so each test takes well under a second. Capture is simulated by patching
``selection.stream_capturing``, as tests/dispatch/test_self_check.py does.
"""

import json
import logging

import pytest
import torch
from typer.testing import CliRunner

import linattn
from linattn import tune as measuring
from linattn.apps import cli, tune
from linattn.dispatch import Problem, clear_cache, dispatcher, explain
from linattn.dispatch.runtime import selection
from linattn.dispatch.plugin import tuning as tuning_mod
from linattn.dispatch.plugin.tuning import Entry, TuneTable, bucket_of, current_key, table_path, write

CPU = torch.device("cpu")
SHAPE = dict(h=1, hv=1, k=8, v=8)


@pytest.fixture
def tuned(fresh_registry, tuned):
    """tests/conftest.py's ``tuned`` (tables on, in an empty folder of this test's; autotuning off)
    with the built-ins only."""
    return tuned


def _caps():
    return selection.resolve_device(CPU)


def _prefill(n: int, t: int) -> Problem:
    return Problem(op="gdn_prefill", n=n, t=t, max_seqlen=t if n == 1 else 0, **SHAPE)  # as validation derives it


def _write_table(entries, key=None):
    key = key or current_key(_caps())
    write(TuneTable(key=key, made="2026-01-01T00:00:00+00:00", command="test", entries=entries), table_path(key))
    clear_cache()  # the dispatcher reads tables again


def _run_prefill(n: int, t: int):
    args = measuring.inputs(_prefill(n, t), CPU)
    pool = args["state_pool"].clone()
    linattn.gdn_prefill(**args)
    owned = set(args["state_indices"].tolist())
    untouched = [r for r in range(pool.shape[0]) if r not in owned]
    assert torch.equal(args["state_pool"][untouched], pool[untouched])  # rows the call does not own
    return linattn.last_decision("gdn_prefill")


def test_tune_writes_a_table_keyed_by_device_and_versions_and_the_dispatcher_loads_it(tuned):
    buckets = tune.parse_buckets("gdn_decode:1,gdn_prefill:2x64", (1, 1, 8, 8), "bfloat16", "float32")
    path = tune.save(tune.run(buckets, CPU, repeats=1), CPU, "linattn tune --test")
    key = current_key(_caps())
    assert path == str(table_path(key)) and path.startswith(str(tuned))
    table = TuneTable.model_validate_json(open(path).read())
    assert table.key == key and {"torch", "triton", "linattn", "fla-core", "flashinfer-python"} <= set(table.key.versions)
    assert table.key.versions["torch"] == torch.__version__ and table.key.device == _caps().name
    assert [e.bucket for e in table.entries] == buckets
    for e in table.entries:  # both CPU backends ran and were timed
        assert set(e.times_ms) == {"torch-ref", "torch-chunked"} and all(ms > 0 for ms in e.times_ms.values())
        assert e.failed == {}
    loaded = dispatcher().tuning.table_for(_caps())
    assert loaded.origin == "user" and loaded.table == table


def test_a_table_of_other_versions_is_ignored_with_one_info_line(tuned, caplog):
    key = current_key(_caps())
    stale = key.model_copy(update={"versions": {**key.versions, "torch": "0.0.1"}})
    _write_table([Entry(bucket=bucket_of(_prefill(2, 128)), times_ms={"torch-ref": 1.0, "torch-chunked": 9.0})], stale)
    with caplog.at_level(logging.INFO, logger="linattn"):
        d1 = explain(_prefill(2, 128), "cpu")
        d2 = _run_prefill(2, 128)
        explain(_prefill(2, 128), "cpu")
    lines = [r.getMessage() for r in caplog.records if "tuned table" in r.getMessage()]
    assert len(lines) == 1 and "ignored" in lines[0] and f"torch: 0.0.1 != {torch.__version__}" in lines[0]
    assert d1.tuning is None and d2.tuning is None
    assert d1.chosen == d2.chosen == "torch-chunked"  # the static rank


def test_explain_says_why_a_table_file_on_disk_is_not_used(tuned, monkeypatch):
    """A stale, a truncated or a malformed table and LINATTN_TUNED=0 are named in `explain`, not
    reported as "no tuned table"."""
    key = current_key(_caps())
    stale = key.model_copy(update={"versions": {**key.versions, "torch": "0.0.1"}})
    _write_table([Entry(bucket=bucket_of(_prefill(2, 128)), times_ms={"torch-ref": 1.0})], stale)
    path = table_path(key)
    full = path.read_text()

    def line() -> str:
        clear_cache()
        res = CliRunner().invoke(cli.app, ["explain", "gdn_decode"], env={"COLUMNS": "400"})
        assert res.exit_code == 0
        return next(ln for ln in res.stdout.splitlines() if ln.startswith("tuning"))

    assert "no tuned table in force" in line() and f"torch: 0.0.1 != {torch.__version__}" in line() and str(path) in line()
    path.write_text(full[: len(full) // 2])  # cut short
    assert "Invalid JSON" in line()
    path.write_text(full.replace('"format": 1', '"format": 99'))
    assert "format: Input should be 1" in line()
    monkeypatch.setenv("LINATTN_TUNED", "0")
    assert "LINATTN_TUNED=0 turns tables off" in line()
    monkeypatch.setenv("LINATTN_TUNED", "1")
    path.unlink()
    assert "no tuned table for this device" in line()
    assert tuning_mod.ignored(linattn.capabilities.profile("cpu")) == []  # a profile reads no table
    prof = CliRunner().invoke(cli.app, ["explain", "gdn_prefill", "--profile", "sm90"], env={"COLUMNS": "400"})
    assert prof.exit_code == 0 and "a profile (sm90) reads no tuned table" in prof.stdout


def test_inside_a_bucket_the_table_ranks_and_outside_it_the_static_rank(tuned):
    assert explain(_prefill(2, 128), "cpu").chosen == "torch-chunked"  # static: what the table must overturn
    _write_table([Entry(bucket=bucket_of(_prefill(2, 128)), times_ms={"torch-ref": 1.0, "torch-chunked": 9.0})])
    inside = [_run_prefill(2, 128), _run_prefill(2, 160), _run_prefill(3, 255)]  # one bucket: T~2^7, N~2^1
    assert [d.chosen for d in inside] == ["torch-ref"] * 3
    assert all(d.tuning.measured and d.verdict("torch-ref").measured_ms == 1.0 for d in inside)
    outside = [_run_prefill(2, 256), _run_prefill(4, 128)]  # T~2^8; N~2^2
    assert [d.chosen for d in outside] == ["torch-chunked"] * 2
    assert all(not d.tuning.measured and d.verdict("torch-ref").measured_ms is None for d in outside)
    # the bucket is part of the decision cache's shape class: one entry per bucket, not per call
    buckets = [dict(e.signature[1]).get("tuning") for e in dispatcher().cached_decisions()
               if e.decision.problem.op == "gdn_prefill"]
    assert sorted(buckets) == [(7, 1), (7, 2), (8, 1)]


def test_an_accepted_backend_the_table_did_not_time_runs_after_the_timed_ones(tuned):
    # torch-chunked failed in the measurement: it is not ranked by the table, so torch-ref runs
    _write_table([Entry(bucket=bucket_of(_prefill(2, 128)), times_ms={"torch-ref": 50.0},
                        failed={"torch-chunked": "RuntimeError: boom"})])
    d = explain(_prefill(2, 128), "cpu")
    assert d.chosen == "torch-ref" and d.verdict("torch-chunked").measured_ms is None
    assert d.tuning.failed == {"torch-chunked": "RuntimeError: boom"}


def test_a_backend_that_raises_while_timed_is_recorded_as_failed(tuned, monkeypatch):
    timed = measuring.time_call

    def fail_chunked(fn, device, repeats, best_ms=None):
        if fn.keywords["backend"] == "torch-chunked":
            raise RuntimeError("out of memory (simulated)")
        return timed(fn, device, repeats, best_ms)

    monkeypatch.setattr(measuring, "time_call", fail_chunked)
    e = measuring.measure_bucket(bucket_of(_prefill(2, 64)), CPU, repeats=1)
    assert set(e.times_ms) == {"torch-ref"} and e.failed == {"torch-chunked": "RuntimeError: out of memory (simulated)"}


def test_explain_shows_the_measured_times_and_the_tables_origin(tuned):
    p = Problem(op="gdn_decode", n=1, h=16, hv=32, k=128, v=128)  # the CLI's default qwen3-next decode
    _write_table([Entry(bucket=bucket_of(p), times_ms={"torch-ref": 2.5, "torch-chunked": 0.5})])
    d = explain(p, "cpu")
    assert d.chosen == "torch-chunked" and d.verdict("torch-chunked").measured_ms == 0.5
    assert d.tuning.origin == "user" and d.tuning.path == str(table_path(current_key(_caps())))
    assert "torch-chunked (measured 0.5 ms)" in d.summary() and "torch-ref=rank 10 2.5 ms" in d.summary()
    res = CliRunner().invoke(cli.app, ["explain", "gdn_decode", "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["chosen"] == "torch-chunked"
    assert doc["tuning"]["origin"] == "user" and doc["tuning"]["times_ms"] == {"torch-ref": 2.5, "torch-chunked": 0.5}
    # whole cells whatever COLUMNS the run left set (a piped table honours it: 80 wraps the column names)
    text = CliRunner().invoke(cli.app, ["explain", "gdn_decode"], env={"COLUMNS": "400"}).stdout
    assert "measured ms" in text and "user table" in text and "2.5" in text
    # a profile has no table: static ranks, said so
    assert explain(p, "cpu").tuning is not None and linattn.explain(p, linattn.capabilities.profile("cpu")).tuning is None


def test_the_shipped_table_is_read_when_the_user_has_none(tuned, tmp_path, monkeypatch):
    p = _prefill(2, 128)
    shipped = tmp_path / "shipped" / "x.json"
    key = current_key(_caps())
    write(TuneTable(key=key, made="m", entries=[Entry(bucket=bucket_of(p), times_ms={"torch-ref": 1.0})]), shipped)
    monkeypatch.setattr(tuning_mod, "shipped_path", lambda arch: shipped)
    clear_cache()
    assert explain(p, "cpu").tuning.origin == "shipped" and explain(p, "cpu").chosen == "torch-ref"
    _write_table([Entry(bucket=bucket_of(p), times_ms={"torch-chunked": 1.0, "torch-ref": 3.0})])
    d = explain(p, "cpu")
    assert d.tuning.origin == "user" and d.chosen == "torch-chunked"
    monkeypatch.setattr(tuning_mod, "shipped_path", lambda arch: None)  # none ships (this CPU's arch): no table
    (tuned / table_path(key).name).unlink()
    clear_cache()
    assert explain(p, "cpu").tuning is None


def test_autotune_measures_a_missing_bucket_on_its_first_eager_call(tuned, monkeypatch):
    monkeypatch.setenv("LINATTN_AUTOTUNE", "1")
    clear_cache()  # read with the tables
    calls = []
    measure = measuring.measure_bucket
    monkeypatch.setattr(measuring, "measure_bucket", lambda b, d, **kw: calls.append(b) or measure(b, d, repeats=1))
    d = _run_prefill(2, 64)
    assert calls == [bucket_of(_prefill(2, 64))]
    assert d.tuning is not None and d.tuning.measured and set(d.tuning.times_ms) == {"torch-ref", "torch-chunked"}
    assert d.chosen == min(d.tuning.times_ms, key=d.tuning.times_ms.get)
    table = TuneTable.model_validate_json(table_path(current_key(_caps())).read_text())
    assert [e.bucket for e in table.entries] == calls and "LINATTN_AUTOTUNE" in table.command
    _run_prefill(2, 100)  # the same bucket: measured already
    _run_prefill(4, 64)  # another bucket: measured on its first call
    assert calls == [bucket_of(_prefill(2, 64)), bucket_of(_prefill(4, 64))]


def test_autotune_never_measures_during_capture(tuned, monkeypatch):
    monkeypatch.setenv("LINATTN_AUTOTUNE", "1")
    clear_cache()
    monkeypatch.setattr(measuring, "measure_bucket", lambda *a, **kw: pytest.fail("measured during capture"))
    monkeypatch.setattr(selection, "stream_capturing", lambda device: True)
    args = measuring.inputs(Problem(op="gdn_decode", n=2, **SHAPE), CPU)
    linattn.gdn_decode(**args, validate=False)
    d = linattn.last_decision("gdn_decode")
    assert d.capturing and d.chosen == "torch-ref" and d.tuning is None
    assert not table_path(current_key(_caps())).exists()
    with pytest.raises(RuntimeError, match="capture"):
        dispatcher().autotune(d.problem, CPU)


def test_tune_cli_end_to_end_on_the_cpu(tuned):
    res = CliRunner().invoke(cli.app, ["tune", "--device", "cpu", "--buckets", "gdn_decode:2,kda_prefill:1x32",
                                       "--shape", "1,1,8,8", "--repeats", "1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["measured"] == 2 and doc["path"] == str(table_path(current_key(_caps())))
    assert [e["bucket"]["op"] for e in doc["entries"]] == ["gdn_decode", "kda_prefill"]
    assert all(set(e["times_ms"]) == {"torch-ref", "torch-chunked"} for e in doc["entries"])
    d = explain(Problem(op="gdn_decode", n=3, **SHAPE), "cpu")  # N=3 is N=2's bucket
    assert d.tuning.measured and d.chosen == min(d.tuning.times_ms, key=d.tuning.times_ms.get)


@pytest.mark.parametrize("spec", ["gdn_prefill:16", "gdn_decode:0", "gdn_gating:4", "gdn_decode:1x2x3", "nope:1"])
def test_tune_cli_refuses_a_malformed_bucket(tuned, spec):
    res = CliRunner().invoke(cli.app, ["tune", "--device", "cpu", "--buckets", spec])
    assert res.exit_code == 2 and "--buckets item" in res.output


def test_tune_cli_refuses_quick_with_buckets(tuned):
    res = CliRunner().invoke(cli.app, ["tune", "--device", "cpu", "--quick", "--buckets", "gdn_decode:1"])
    assert res.exit_code == 2 and "--quick and --buckets" in res.output  # was: --quick silently ignored


def test_tune_cli_refuses_a_folder_it_cannot_write_before_measuring(tuned, monkeypatch):
    """An unwritable LINATTN_TUNE_DIR or --out is a usage error up front (it was a warning per bucket
    and exit 0 naming a file never written; --out a traceback after the first bucket)."""
    blocker = tuned / "a-file"
    blocker.write_text("")
    measured = []
    monkeypatch.setattr(tune, "run", lambda *a, **k: measured.append(1) or [])
    args = ["tune", "--device", "cpu", "--buckets", "gdn_decode:1", "--shape", "1,1,8,8", "--repeats", "1"]
    res = CliRunner().invoke(cli.app, [*args, "--out", str(blocker / "t.json")])
    assert res.exit_code == 2 and "cannot be created" in res.output and "nothing was measured" in res.output
    monkeypatch.setenv("LINATTN_TUNE_DIR", str(blocker / "sub"))
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 2 and "tuned-table folder" in res.output and "LINATTN_TUNE_DIR" in res.output
    assert measured == []


def test_tune_cli_refuses_an_existing_folder_that_takes_no_file_before_measuring(tuned, monkeypatch):
    """/proc exists and passes os.access for root, yet takes no new file: the check probes for real."""
    measured = []
    monkeypatch.setattr(tune, "run", lambda *a, **k: measured.append(1) or [])
    args = ["tune", "--device", "cpu", "--buckets", "gdn_decode:1", "--shape", "1,1,8,8", "--repeats", "1"]
    res = CliRunner().invoke(cli.app, [*args, "--out", "/proc/linattn-t.json"])
    assert res.exit_code == 2 and "--out /proc/linattn-t.json is not writable" in res.output, res.output
    assert "nothing was measured" in res.output and measured == []


def test_a_table_written_in_the_process_replaces_the_decisions_and_call_plans_made_before_it(tuned):
    assert _run_prefill(2, 128).chosen == "torch-chunked"  # decided, and the call's plan kept
    entry = Entry(bucket=bucket_of(_prefill(2, 128)), times_ms={"torch-ref": 1.0, "torch-chunked": 9.0})
    tune.save([entry], CPU, "linattn tune --test")
    assert _run_prefill(2, 128).chosen == "torch-ref"  # the same call: not the plan made before the table


def test_the_default_cuda_buckets_are_the_benchmark_shapes_of_both_families():
    got = {(b.op, 1 << b.log2_seqs, 1 << b.log2_tokens, b.h, b.hv) for b in tune.default_buckets("cuda")}
    decode = {(op, n, 1, h, hv) for op, h, hv in (("gdn_decode", 16, 32), ("kda_decode", 32, 32))
              for n in (1, 8, 32, 64, 256, 1024, 4096)}  # benchmarks/dispatch_choice.py's DECODE_N and 32
    prefill = {(op, n, t, h, hv) for op, h, hv in (("gdn_prefill", 16, 32), ("kda_prefill", 32, 32))  # its prefill
               for n, t in ((16, 65536), (64, 65536), (256, 65536), (1, 8192), (1, 32768), (1, 65536))}
    assert got == decode | prefill
    assert {b.op for b in tune.default_buckets("cuda", quick=True)} == set(tuning_mod.TUNED_OPS)
    assert len(tune.default_buckets("cuda", quick=True)) < len(got)


@pytest.mark.parametrize("var", ["LINATTN_TUNED", "LINATTN_AUTOTUNE"])
def test_a_malformed_tuning_switch_is_a_config_error(tuned, monkeypatch, var):
    from linattn.dispatch import ConfigError

    monkeypatch.setenv(var, "sometimes")
    clear_cache()
    with pytest.raises(ConfigError, match=var):  # a decision reads both
        args = measuring.inputs(_prefill(2, 128), CPU)
        linattn.gdn_prefill(**args)


def test_a_tune_run_cut_short_keeps_the_buckets_it_measured(tuned, monkeypatch):
    measure = measuring.measure_bucket
    seen = []

    def cut_after_one(b, device, **kw):
        if seen:
            raise KeyboardInterrupt  # the device call's time cap, say
        seen.append(b)
        return measure(b, device, **kw)

    monkeypatch.setattr(measuring, "measure_bucket", cut_after_one)
    res = CliRunner().invoke(cli.app, ["tune", "--device", "cpu", "--buckets", "gdn_decode:1,gdn_decode:4",
                                       "--shape", "1,1,8,8", "--repeats", "1"])
    assert res.exit_code != 0
    table = TuneTable.model_validate_json(table_path(current_key(_caps())).read_text())
    assert [e.bucket for e in table.entries] == seen and set(table.entries[0].times_ms) == {"torch-ref", "torch-chunked"}


def test_tables_off_keep_the_users_other_buckets_and_autotune_nothing(tuned, monkeypatch):
    """``LINATTN_TUNED=0`` reads no table, so ``linattn tune`` then starts from the user's file on disk
    (its other buckets kept, not replaced by the new ones alone), and ``LINATTN_AUTOTUNE=1`` measures
    nothing (no decision could read the measurement)."""
    first = tune.parse_buckets("gdn_decode:1,gdn_decode:4", (1, 1, 8, 8), "bfloat16", "float32")
    tune.save(tune.run(first, CPU, repeats=1), CPU, "linattn tune --test")
    monkeypatch.setenv("LINATTN_TUNED", "0")
    clear_cache()
    second = tune.parse_buckets("gdn_decode:16", (1, 1, 8, 8), "bfloat16", "float32")
    tune.save(tune.run(second, CPU, repeats=1), CPU, "linattn tune --test")
    table = TuneTable.model_validate_json(table_path(current_key(_caps())).read_text())
    assert [e.bucket for e in table.entries] == first + second
    assert explain(Problem(op="gdn_decode", n=16, **SHAPE), "cpu").tuning is None  # tables off: static ranks
    monkeypatch.setenv("LINATTN_AUTOTUNE", "1")
    clear_cache()
    monkeypatch.setattr(measuring, "measure_bucket", lambda *a, **kw: pytest.fail("measured with tables off"))
    assert _run_prefill(2, 64).tuning is None


def test_an_autotune_measurement_that_raises_leaves_the_call_to_the_static_ranks(tuned, monkeypatch, caplog):
    """LINATTN_AUTOTUNE's measurement allocates its own inputs (a pool of 2N slots): where that raises
    (out of device memory in an engine, say) the user's call still runs, decided by the static ranks,
    with one WARNING; the bucket is not tried again in the process (until clear_cache)."""
    monkeypatch.setenv("LINATTN_AUTOTUNE", "1")
    clear_cache()
    make_inputs, tries = measuring.inputs, []

    def no_memory(*a, **kw):
        tries.append(a)
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(measuring, "inputs", no_memory)
    with caplog.at_level(logging.WARNING, logger="linattn"):
        decisions = []
        for t in (128, 192):  # one bucket: T~2^7, N~2^1
            args = make_inputs(_prefill(2, t), CPU)
            pool = args["state_pool"].clone()
            linattn.gdn_prefill(**args)
            others = [r for r in range(pool.shape[0]) if r not in set(args["state_indices"].tolist())]
            assert torch.equal(args["state_pool"][others], pool[others])  # rows the call does not own
            decisions.append(linattn.last_decision("gdn_prefill"))
            dispatcher()._forget_decisions()  # the next call decides again (the tuning state is kept)
    assert [d.chosen for d in decisions] == ["torch-chunked"] * 2  # the static rank
    assert all(d.tuning is None for d in decisions) and len(tries) == 1  # not retried in the bucket
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "could not measure" in r.getMessage()]
    assert len(warned) == 1 and "OutOfMemoryError" in warned[0]


def test_every_shipped_table_parses_is_named_by_its_arch_and_names_known_backends():
    from importlib import resources

    from linattn.backends import builtin
    from linattn.dispatch.runtime.registry import load_object

    folder = resources.files("linattn") / "tuned"
    shipped = sorted(p for p in folder.iterdir() if p.name.endswith(".json"))
    assert shipped, "linattn/tuned/ ships no table (sm_90.json expected)"
    known = {load_object(spec).name for spec in (*builtin.BUILTIN, *(s for _, s in builtin.PEERS))}
    for path in shipped:
        table = TuneTable.model_validate_json(path.read_text())
        arch = path.name.removesuffix(".json")
        assert table.key.arch == arch and str(tuning_mod.shipped_path(arch)) == str(path)
        assert table.entries and len({e.bucket for e in table.entries}) == len(table.entries), "one entry per bucket"
        for e in table.entries:
            assert e.times_ms and set(e.times_ms) <= known, (e.shape, set(e.times_ms) - known)
            assert e.bucket == bucket_of(e.bucket.problem())
