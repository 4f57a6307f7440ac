"""benchmarks/decode_sweep.py (issue 32 item 5: the bf16-pool decode configs) on the CPU, in the Triton
interpreter with tiny heads: every candidate's checks run (output and written rows against the pinned
config, unowned rows, float64 reference) and its row carries the config's fields, the bf16 bytes and
the share of copy; the fp32 reference row counts the state at 4 bytes. The timer and the copy
ceiling are stand-ins (no GPU): what is asserted is how the rows follow from them."""

import sys
from pathlib import Path

import pytest
import torch

from linattn.capabilities import interpreter_enabled, probe

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not interpreter_enabled(), reason="runs kernels in the interpreter (TRITON_INTERPRET=1)")


def test_every_candidate_is_checked_and_timed_into_its_row(monkeypatch, load_benchmark):
    """Every config of CANDIDATES runs (V = 32: two BV 16 tiles, so ``blocks=2`` at BV 16 covers real rows)."""
    sweep = load_benchmark("decode_sweep", "decode_sweep_under_test")
    dec = sys.modules["decode"]  # benchmarks/decode.py, whose inputs, bytes and timer the sweep uses
    monkeypatch.setattr(dec, "_dev", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setitem(dec.SHAPES, "kda", dict(H=1, HV=1, K=16, V=32))
    monkeypatch.setattr(sweep, "ORACLE_ROWS", 2)
    monkeypatch.setattr(sweep, "_time", lambda fn, graph=True: (fn(), (0.5, "stand-in"))[1])
    names = list(sweep.CANDIDATES)
    rows = sweep.sweep_one("kda", 2, probe(torch.device("cpu")), 2.0, names, fp32_row=True)
    assert [r["config"] for r in rows] == names + ["fp32_pinned"]
    state = 2 * 2 * 16 * 32  # read and written, N = 2, HV = 1, K x V
    for r in rows[:-1]:
        assert "error" not in r, r
        assert r["unowned_rows_unchanged"] and r["state_dtype"] == "bf16"
        assert r["bytes"] == dec.decode_bytes("kda", 2) - state * 2
        assert r["TBps"] == pytest.approx(r["bytes"] / 0.5e-3 / 1e12) and r["frac_of_copy"] == pytest.approx(r["TBps"] / 2.0)
        assert r["rel_err_o_vs_fp64"] < 2e-2 and r["rel_err_state_vs_fp64"] < 1e-2
        # the interpreter has no layouts and no register caps: every config gives the pin's sums
        assert r["config"] == "pinned" or (r["bitwise"], r["max_abs_diff_o"], r["max_abs_diff_state"]) == (True, 0.0, 0.0), r
    assert rows[0]["pinned"] and "bitwise" not in rows[0]
    by = {r["config"]: r for r in rows}
    blk = by["bv16_w1_blk2_vec4_reg112"]
    assert (blk["BV"], blk["num_warps"], blk["blocks"], blk["state_vec"], blk["maxnreg"]) == (16, 1, 2, 4, 112)
    assert rows[-1]["state_dtype"] == "fp32" and rows[-1]["bytes"] == dec.decode_bytes("kda", 2)


def test_the_checks_see_a_config_that_computes_something_else(monkeypatch, load_benchmark):
    """A candidate whose tiles miss rows (BV 2 on a grid planned for BV 4) shows a nonzero difference."""
    sweep = load_benchmark("decode_sweep", "decode_sweep_under_test")
    dec = sys.modules["decode"]
    monkeypatch.setattr(dec, "_dev", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setitem(dec.SHAPES, "gdn", dict(H=1, HV=2, K=16, V=16))
    monkeypatch.setattr(sweep, "ORACLE_ROWS", 2)
    monkeypatch.setattr(sweep, "_time", lambda fn, graph=True: (0.5, "stand-in"))
    real = sweep.recurrent_decode

    def broken(**kw):
        if kw["config"].num_warps != 2:  # the pinned config (1 warp) runs as shipped
            return real(**kw)
        from linattn.kernels.triton.decode import DecodeLaunch

        plan = DecodeLaunch(**kw)
        plan.launch.constexprs["BV"] = kw["config"].block_v // 2  # half the rows of the planned tiles
        return plan(kw)
    monkeypatch.setattr(sweep, "recurrent_decode", broken)
    rows = sweep.sweep_one("gdn", 3, probe(torch.device("cpu")), 2.0, ["pinned", "bv16_w2"], fp32_row=False)
    assert rows[0]["rel_err_state_vs_fp64"] < 1e-2
    assert rows[1]["max_abs_diff_state"] > 0 and not rows[1]["bitwise"] and rows[1]["rel_err_state_vs_fp64"] > 1e-2


def test_merge_puts_the_sweep_rows_into_the_decode_file_and_replaces_them_next_time(tmp_path, load_benchmark):
    """--merge: the sweep's rows join the decode file as kind bf16_sweep / bf16_sweep_copy, with one
    note; the file's other rows and notes stay; a second merge replaces the first's rows and note; a
    labelled merge (--label) adds its rows and note beside them and replaces only its own;
    a sweep file from another device, or with rows of another kind, is refused."""
    mod = load_benchmark("decode_sweep", "decode_sweep_under_test")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _results import read_results, write_results

        dev = {"name": "NVIDIA H200", "kind": "cuda"}
        target, sweep = tmp_path / "decode_h200.json", tmp_path / "decode_sweep_h200.json"
        write_results(target, [dict(kind="copy", TBps=4.0), dict(kind="decode", op="gdn", N=256)], ["decode note"],
                      device=dev, command="python benchmarks/decode.py", commit="abc1234")
        write_results(sweep, [dict(kind="copy", TBps=4.2), dict(kind="sweep", op="gdn", N=256, config="pinned")],
                      ["sweep note"], device=dev, command="python benchmarks/decode_sweep.py", commit="def5678")
        for _ in range(2):
            mod.merge_into(sweep, target, "how it ran")
            doc = read_results(target)
            assert [r["kind"] for r in doc.rows] == ["copy", "decode", "bf16_sweep_copy", "bf16_sweep"]
            assert doc.rows[0]["TBps"] == 4.0 and doc.rows[2]["TBps"] == 4.2 and doc.commit == "abc1234"
            assert doc.notes[0] == "decode note" and sum(n.startswith(mod.MERGED_NOTE) for n in doc.notes) == 1
            assert "how it ran" in doc.notes[-1] and "def5678" in doc.notes[-1]
        for _ in range(2):  # a labelled sweep joins the unlabelled one; merged again, it replaces only itself
            mod.merge_into(sweep, target, "later", label="s12")
            doc = read_results(target)
            assert [(r["kind"], r.get("sweep")) for r in doc.rows] == [
                ("copy", None), ("decode", None), ("bf16_sweep_copy", None), ("bf16_sweep", None),
                ("bf16_sweep_copy", "s12"), ("bf16_sweep", "s12")]
            assert sum(n.startswith(mod.MERGED_NOTE) for n in doc.notes) == 2
            assert doc.notes[-1].startswith(mod.MERGED_NOTE + " [s12]") and "later" in doc.notes[-1]
        mod.merge_into(sweep, target, "again")  # the unlabelled merge keeps the labelled rows and note
        doc = read_results(target)
        assert sum(r.get("sweep") == "s12" for r in doc.rows) == 2
        assert sum(n.startswith(mod.MERGED_NOTE) for n in doc.notes) == 2 and "again" in doc.notes[-1]
        write_results(sweep, [dict(kind="copy", TBps=4.2)], device={"name": "NVIDIA B200", "kind": "cuda"},
                      command="x", commit="y")
        with pytest.raises(ValueError, match="B200"):
            mod.merge_into(sweep, target)
        write_results(sweep, [dict(kind="decode")], device=dev, command="x", commit="y")
        with pytest.raises(ValueError, match="kind"):
            mod.merge_into(sweep, target)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
