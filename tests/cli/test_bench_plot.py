"""Bench plots on the CPU: a PNG from a small bench run, and from results files old and new (no GPU)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import linattn.apps.cli as cli
from linattn.apps import bench_plot as BP

pytest.importorskip("matplotlib")

runner = CliRunner()
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = ("--repeats", "2", "--warmup", "1", "--copy-mib", "4", "--shape", "2,4,16,16")

#: A results file in the common schema (the shape of benchmarks/results/decode_h200.json's rows).
COMMON_DECODE = {
    "command": "python3 benchmarks/decode.py", "commit": "abc1234",
    "device": {"name": "NVIDIA H200", "kind": "cuda"}, "toolchain": {"torch": "2.11"}, "notes": [],
    "rows": [
        {"kind": "copy", "bytes": 8 << 30, "TBps": 4.0},
        {"kind": "decode", "op": "gdn_decode", "N": 256, "ours_TBps": 3.5, "fla_TBps": 3.6, "ours_us": 9.0},
        {"kind": "decode", "op": "gdn_decode", "N": 1, "ours_TBps": 1.5, "fla_TBps": 1.4},
        {"kind": "decode", "op": "kda_decode", "N": 1, "ours_TBps": 1.6, "fla_TBps": 1.0},
        {"kind": "latency_n1", "op": "gdn_decode", "path": "graph_replay", "us": 4.9},
    ],
}
#: The same numbers as written before the common schema (run_N.benchmark).
LEGACY_DECODE = {
    "what": "decode evidence", "device": "NVIDIA H200",
    "run_1": {"command": "first"},
    "run_2": {"benchmark": {"copy_TBps": 4.0, "decode": [
        {"op": "gdn_decode", "N": 1, "ours_TBps": 1.5, "fla_TBps": 1.4},
        {"op": "gdn_decode", "N": 256, "ours_TBps": 3.5, "fla_TBps": 3.6}]}},
}
LEGACY_PREFILL = {
    "what": "prefill summary",
    "gdn": {"results": [{"shape": "16x4096", "linattn_pool_mtok_s": 19.8, "fla_mtok_s": 17.1,
                         "fla_gather_scatter_mtok_s": 16.8, "speedup_vs_fla": 1.15}]},
    "kda": {"results": [{"shape": "16x4096", "linattn_pool_mtok_s": 10.2, "fla_mtok_s": 8.9}]},
}
COMMON_PREFILL = {"command": "prefill", "commit": "3b89084", "device": {"name": "NVIDIA H200"}, "notes": [],
                  "rows": [{"family": "gdn", "shape": "16x4096", "linattn_pool_mtok_s": 19.8, "fla_mtok_s": 17.1},
                           {"family": "gdn", "shape": "256x256", "linattn_pool_mtok_s": 17.8, "fla_mtok_s": 15.4}]}


def assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0.01  # drawn, not blank


@pytest.mark.parametrize("doc", [COMMON_DECODE, LEGACY_DECODE], ids=["common", "legacy"])
def test_decode_results_give_gbps_over_n_against_the_copy_ceiling_and_fla(doc):
    d = BP.plot_data(doc, "gdn_decode")
    assert d.unit == "GB/s" and d.ceiling == pytest.approx(4000.0)
    assert d.series == {"linattn": [(1, pytest.approx(1500.0)), (256, pytest.approx(3500.0))],
                        BP.FLA: [(1, pytest.approx(1400.0)), (256, pytest.approx(3600.0))]}


@pytest.mark.parametrize("doc", [COMMON_PREFILL, LEGACY_PREFILL], ids=["common", "legacy"])
def test_prefill_results_give_mtok_per_shape_against_fla(doc):
    d = BP.plot_data(doc, "gdn_prefill")
    assert d.unit == "Mtok/s" and d.ceiling is None
    assert d.series["linattn (pool)"][0] == ("16x4096", 19.8) and d.series[BP.FLA][0] == ("16x4096", 17.1)
    assert not any("speedup" in name for name in d.series)


def test_a_results_file_without_the_op_is_refused_naming_what_it_holds():
    with pytest.raises(BP.PlotError, match="no gdn_prefill rates.*gdn_decode, kda_decode"):
        BP.plot_data(COMMON_DECODE, "gdn_prefill")
    with pytest.raises(BP.PlotError, match="name the one to plot"):
        BP.plot_data(COMMON_DECODE)


@pytest.mark.parametrize("doc, op", [(COMMON_DECODE, "kda_decode"), (LEGACY_DECODE, "gdn_decode"),
                                     (COMMON_PREFILL, "gdn_prefill"), (LEGACY_PREFILL, "kda_prefill")])
def test_render_png_writes_a_drawn_png(tmp_path, doc, op):
    out = BP.render_png(BP.plot_data(doc, op), tmp_path / "sub" / "plot.png")
    assert_png(out)


@pytest.mark.parametrize("name, op", [("decode_h200.json", "gdn_decode"), ("decode_h200.json", "kda_decode"),
                                      ("prefill_h200.json", "gdn_prefill"), ("prefill_h200.json", "kda_prefill")])
def test_the_committed_h200_results_plot(tmp_path, name, op):
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    d = BP.load_plot_data(path, op)
    assert any(s.startswith("linattn") for s in d.series) and BP.FLA in d.series
    assert (d.ceiling or 0) > 0 if op.endswith("_decode") else d.ceiling is None
    assert_png(BP.render_png(d, tmp_path / f"{op}.png"))


# -- the CLI -------------------------------------------------------------------------------------------

def test_bench_plot_of_a_cpu_run_shows_each_timed_backend_and_the_copy_ceiling(nvidia_only_registry, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--batch", "1", "--batch", "4", *FAST, "--out", str(out),
                                  "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert_png(png)
    doc = json.loads(out.read_text())
    d = BP.plot_data(doc)
    ok = {r["backend"] for r in doc["rows"] if r["status"] == "ok"}
    assert set(d.series) == ok and d.ceiling == doc["copy_bandwidth"]["GBps"]
    assert all([x for x, _ in pts] == [1, 4] for pts in d.series.values())


def test_bench_from_plots_an_existing_results_file_without_measuring(tmp_path, monkeypatch):
    from linattn.apps import bench as B

    monkeypatch.setattr(B, "run_bench", lambda *a, **k: pytest.fail("--from measured"))
    src, png = tmp_path / "results.json", tmp_path / "plot.png"
    src.write_text(json.dumps(COMMON_DECODE))
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(src), "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plot"] == str(png) and set(doc["series"]) == {"linattn", BP.FLA}
    assert_png(png)


@pytest.mark.parametrize("extra, needle", [
    ((), "give --plot PATH"),
    (("--plot", "{tmp}/x.png", "--batch", "4"), "--batch does not apply"),
    (("--plot", "{tmp}/x.png", "--backend", "torch-ref", "--device", "cpu"), "--backend, --device do not apply"),
])
def test_bench_from_refuses_what_does_not_apply(tmp_path, extra, needle):
    """(The PNG path in the test's own folder: two workers probing one relative x.png in the shared
    working directory raced, one removing the other's probe file.)"""
    src = tmp_path / "results.json"
    src.write_text(json.dumps(COMMON_DECODE))
    extra = tuple(x.format(tmp=tmp_path) for x in extra)
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(src), *extra, "--json"])
    assert res.exit_code == 2 and needle in json.loads(res.stdout)["error"]["message"]


def test_bench_from_a_file_without_the_op_or_a_missing_file_exits_2(tmp_path):
    src = tmp_path / "results.json"
    src.write_text(json.dumps(COMMON_DECODE))
    res = runner.invoke(cli.app, ["bench", "kda_prefill", "--from", str(src), "--plot", str(tmp_path / "p.png"),
                                  "--json"])
    assert res.exit_code == 2 and "gdn_decode, kda_decode" in json.loads(res.stdout)["error"]["message"]
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(tmp_path / "none.json"), "--plot", "p.png",
                                  "--json"])
    assert res.exit_code == 2 and "cannot read results" in json.loads(res.stdout)["error"]["message"]


def test_bench_plot_without_a_suffix_reports_the_png_it_wrote(tmp_path):
    src, plot = tmp_path / "results.json", tmp_path / "decode"
    src.write_text(json.dumps(COMMON_DECODE))
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(src), "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    assert f"wrote {plot}.png " in res.stdout and not plot.exists()
    assert_png(tmp_path / "decode.png")


def test_bench_plot_with_a_suffix_matplotlib_cannot_write_exits_2_before_measuring(tmp_path, monkeypatch):
    """``--plot x.txt`` is a usage error before anything runs (the ``--json`` error document, exit 2), nothing
    written; ``.svg`` is a format matplotlib writes."""
    from linattn.apps import bench as B

    monkeypatch.setattr(B, "run_bench", lambda *a, **k: pytest.fail("measured despite a bad --plot"))
    out = tmp_path / "r.json"
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--batch", "1", "--out", str(out), "--plot",
                                  str(tmp_path / "x.txt"), "--json"])
    assert res.exit_code == 2, res.output
    msg = json.loads(res.stdout)["error"]["message"]
    assert "matplotlib writes no 'txt' files" in msg and ".png" in msg and ".svg" in msg
    assert not out.exists() and not (tmp_path / "x.txt").exists()
    src = tmp_path / "results.json"
    src.write_text(json.dumps(COMMON_DECODE))
    res = runner.invoke(cli.app, ["bench", "gdn_decode", "--from", str(src), "--plot", str(tmp_path / "p.svg")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")
