"""The conformance suite (``linattn.testing``): it passes on every backend available on the CPU
and fails, with a report that says what and where, on backends that are wrong in known ways."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch

import linattn
from linattn.testing import generate_cases, load_xfail, run_suite
from linattn.backends.base import FEATURES
from linattn.testing.runner import availability

from plugin_fakes import (AcceptsEverything, DropsCallOptions, IgnoresFreshSequences, IgnoresPadding, Plugin,
                          WrapsBelowMinusOne, ZeroesReadyGates)

BUILTIN = ("torch-ref", "torch-chunked", "triton-split", "triton-folded", "cutedsl")


def _installed(entry_point: str) -> bool:
    return any(ep.name == entry_point for ep in metadata.entry_points(group="linattn.backends"))


@pytest.mark.parametrize("name", BUILTIN + ("cpu-chunked",))
def test_suite_passes_on_every_backend_available_on_the_cpu(registry, name):
    if name == "cpu-chunked" and not _installed(name):
        pytest.skip("the example plugin is not installed: pip install -e examples/linattn-cpu-chunked (CI does)")
    assert name in registry.backends, f"{name} is a built-in and must be registered"
    b = registry.backends[name]
    avail = availability(b, list(b.ops), "cpu")
    if all(why is not None for why in avail.values()):
        pytest.skip(f"{name} does not run on this CPU: {next(iter(avail.values()))}")
    ops = list(b.ops)
    if name.startswith("triton"):
        # In the Triton interpreter a chunked-prefill case at the head dims these kernels accept
        # (K, V in {64, 128, 256}) takes seconds: ~200 s per backend. Their prefill is covered by
        # tests/prefill and tests/contract here, and `linattn check --device cuda` on a GPU runs all.
        ops = [op for op in ops if not op.endswith("_prefill")]
    rep = run_suite(name, ops=ops, device="cpu")
    assert rep.ok, "\n".join(f"{r.id}: {r.message}" for r in rep.failures())
    ran = [r for r in rep.results if r.kind in ("accuracy", "pool") and r.status == "passed"]
    assert ran, "no accuracy case ran"
    # negative cases: a feature the backend does not declare (run_suite ran its own ops only)
    assert any(r.kind == "negative" for r in rep.results) or set(b.ops) == set(linattn.dispatch.OPS) or all(
        f in b.declared_features(op) for op in b.ops for f in FEATURES if op.endswith("_decode") or f != "precomputed_gates")


@pytest.mark.parametrize("name", ["triton-split", "triton-folded"])
def test_floor_gate_cases_pass_on_the_triton_prefill_in_the_interpreter(registry, name):
    """F28 (``gates-floor``: fp32, mild gates after gates at the floor -1000, pool and dense mode)
    on the Triton chunked prefill. The run above leaves the Triton prefill out (interpreter
    time); these cases are small (300 tokens, one head) and pin down its two-float gates."""
    pytest.importorskip("triton")
    if not linattn.capabilities.interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU (tests/conftest.py sets it)")
    from linattn.dispatch import resolve_device
    from linattn.testing.runner import run_case

    caps = resolve_device(torch.device("cpu"))
    cases = [c for c in generate_cases(registry.backends[name], ops=["gdn_prefill", "kda_prefill"],
                                       kinds=["accuracy"], caps=caps) if "/gates-floor[" in c.id]
    assert sorted((c.op, c.spec["mode"]) for c in cases) == [
        (op, mode) for op in ("gdn_prefill", "kda_prefill") for mode in ("dense", "pool")]
    results = [run_case(c, "cpu") for c in cases]
    assert all(r.status == "passed" for r in results), [(r.id, r.status, r.message) for r in results]


@pytest.mark.parametrize("op", ["gdn_prefill", "kda_prefill"])
def test_checkpoint_cases_pass_on_the_triton_prefill_in_the_interpreter(registry, op):
    """The conformance suite's ``checkpoints`` case (issue 32 item 1) on the Triton chunked prefill in
    the interpreter: each checkpoint the state kernel stores (``HAS_CKPT``) within tolerance of the
    float64 token-serial reference after that many tokens, bitwise the same backend's prefill stopped
    there (the same pipeline: on the CPU the planner never picks the fused prefill), the outputs and
    final states as the reference, every row not written bitwise unchanged."""
    pytest.importorskip("triton")
    if not linattn.capabilities.interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU (tests/conftest.py sets it)")
    from linattn.dispatch import resolve_device
    from linattn.testing.runner import run_case

    cases = [c for c in generate_cases(registry.backends["triton-split"], ops=[op], kinds=["pool"],
                                       caps=resolve_device(torch.device("cpu"))) if "/checkpoints[" in c.id]
    assert len(cases) == 1
    result = run_case(cases[0], "cpu")
    assert result.status == "passed", (result.id, result.status, result.message)


def test_check_of_a_backend_that_does_not_run_on_the_device_is_not_a_pass(registry):
    """cutedsl needs an SM90/SM100 GPU: on the CPU only its negative cases run, and the report
    says NOT AVAILABLE with the reason and exits 3 (neither a crash nor a pass)."""
    from typer.testing import CliRunner

    from linattn.apps.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["check", "--backend", "cutedsl", "--device", "cpu", "--json"])
    assert res.exit_code == 3, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["status"] == "not_available"
    (rep,) = doc["backends"]
    assert rep["status"] == "not_available" and rep["available"] is False and rep["ok"] is False  # no field reads as a pass
    assert set(rep["availability"]) == {"gdn_prefill", "kda_prefill"}
    assert all(why.startswith("[device] device_type='cpu'") for why in rep["availability"].values())
    runs = [r for r in rep["results"] if r["kind"] in ("accuracy", "pool")]
    assert runs and all(r["status"] == "skipped" and "backend not available here: [device]" in r["message"]
                        for r in runs)
    negative = [r for r in rep["results"] if r["kind"] == "negative"]
    assert negative and all(r["status"] == "passed" for r in negative)
    res = runner.invoke(app, ["check", "--backend", "cutedsl", "--device", "cpu"], env={"COLUMNS": "250"})
    assert res.exit_code == 3
    assert "NOT AVAILABLE cutedsl" in res.output and "PASSED" not in res.output
    assert "cutedsl does not run on cpu" in res.output


def test_report_status_separates_passed_failed_and_not_available(registry):
    rep = run_suite("torch-ref", ops=["silu_and_mul_clamp"], kinds=["accuracy"])
    assert rep.status == "passed" and rep.available
    rep = run_suite("cutedsl", ops=["gdn_prefill"], kinds=["accuracy"], device="cpu")
    assert rep.ok and not rep.available and rep.status == "not_available"
    rep = run_suite("cutedsl", ops=["gdn_prefill"], kinds=["negative"], device="cpu")
    assert rep.status == "passed"  # only negative cases asked for: they all ran
    registry.add_plugin(Plugin(IgnoresPadding), name="wrong", distribution="tests")
    assert run_suite("ignores-padding", ops=["gdn_decode"], kinds=["pool"]).status == "failed"


def test_cases_follow_the_declared_capabilities():
    ids = [c.id for c in generate_cases(IgnoresPadding())]
    # declared: fp32 only, fp32 state, both layouts, gdn_decode + gdn_prefill, any head dims
    assert "gdn_decode/accuracy/dtype[float32,state=float32,vk,pool,N5T1,K32V16,H2HV4]" in ids
    assert "gdn_prefill/accuracy/layout[float32,state=float32,kv,pool,K32V16,H2HV4]" in ids
    assert not any("bfloat16,state" in i for i in ids if "/accuracy/" in i)
    assert {"gdn_decode/negative/dtype[bfloat16]", "gdn_decode/negative/state-dtype[bfloat16]",
            "kda_decode/negative/op[undeclared]", "gdn_decode/negative/vendor[sm90]"} <= set(ids)


class DeclaresHeadDims(IgnoresPadding):
    name = "declares-head-dims"
    head_dims_k = frozenset({64, 128})
    head_dims_v = frozenset({128})


def test_declared_head_dims_give_cases_at_their_ends_and_negatives_outside(registry):
    ids = {c.id for c in generate_cases(DeclaresHeadDims(), ops=["gdn_decode"])}
    assert "gdn_decode/accuracy/dtype[float32,state=float32,vk,pool,N5T1,K64V128,H2HV4]" in ids
    assert "gdn_decode/accuracy/head-dims[float32,state=float32,vk,pool,N5T1,K128V128,H2HV4]" in ids
    negatives = {i for i in ids if "/negative/head-dim" in i}
    assert negatives == {f"gdn_decode/negative/head-dim[{d}]" for d in ("K48", "K192", "V96", "V192")}
    registry.add_plugin(Plugin(DeclaresHeadDims), name="dims", distribution="tests")
    rep = run_suite("declares-head-dims", ops=["gdn_decode"], kinds=["negative"])
    assert rep.ok and all("[shape]" in r.message for r in rep.results if "/head-dim" in r.id)


def test_suite_fails_with_a_clear_report_on_a_backend_that_ignores_padding(registry):
    registry.add_plugin(Plugin(IgnoresPadding), name="wrong", distribution="tests")
    rep = run_suite("ignores-padding", ops=["gdn_decode"])
    assert not rep.ok
    failed = {r.id: r.message for r in rep.failures()}
    slot0 = failed["gdn_decode/pool/slot0-padding[float32,state=float32,vk,pool,N4T1,K32V16,H2HV4]"]
    assert "padding rows (negative slot) [1, 3] must be exactly zero" in slot0
    assert "pool rows [5] changed but are not owned by the call" in slot0
    # every accuracy case has padding rows, so each failure names the rule it breaks
    assert all("padding rows (negative slot)" in m for m in failed.values())
    assert all(r.status == "passed" for r in rep.results if r.kind == "negative")


@pytest.mark.parametrize("fake, op, case, needle", [
    (WrapsBelowMinusOne, "gdn_decode", "gdn_decode/pool/all-padding", "pool rows [2] changed"),
    (WrapsBelowMinusOne, "gdn_prefill", "gdn_prefill/pool/all-padding", "pool rows [2] changed"),
    (IgnoresFreshSequences, "gdn_decode", "gdn_decode/pool/fresh", "state_pool[owned slots]: not finite"),
    (IgnoresFreshSequences, "gdn_prefill", "gdn_prefill/pool/fresh", "o: not finite (NaN or inf)"),
    (ZeroesReadyGates, "gdn_decode", "gdn_decode/accuracy/gate-form", "o: relative error"),
    (DropsCallOptions, "gdn_decode", "gdn_decode/accuracy/scale", "o: relative error"),
    (DropsCallOptions, "gdn_prefill", "gdn_prefill/accuracy/no-l2norm", "state_pool[owned slots]: relative error"),
    (DropsCallOptions, "gdn_decode", "gdn_decode/accuracy/softplus", "o: relative error"),
    (DropsCallOptions, "gdn_gating", "gdn_gating/accuracy/softplus", "g: relative error"),
])
def test_suite_fails_a_backend_that_breaks_what_it_declares(registry, fake, op, case, needle):
    """The suite fails a plugin that breaks any of: padding as every negative slot (-2 wrapped to a row here),
    a declared has_initial_state or precomputed gates, scale, use_qk_l2norm=False, the softplus options."""
    registry.add_plugin(Plugin(fake), name=fake.name, distribution="tests")
    rep = run_suite(fake.name, ops=[op])
    failed = {r.id.split("[")[0]: r.message for r in rep.failures()}
    assert not rep.ok and case in failed, sorted(failed)
    assert needle in failed[case]


def test_the_declared_features_have_their_cases():
    ids = [c.id.split("[")[0] for c in generate_cases(linattn.backends.torch_ref.TorchRefBackend(),
                                                      ops=["gdn_decode", "kda_prefill"])]
    assert {"gdn_decode/pool/fresh", "gdn_decode/accuracy/gate-form", "gdn_decode/accuracy/gate-form-t3",
            "kda_prefill/pool/fresh"} <= set(ids)


def test_suite_catches_a_backend_that_accepts_what_it_does_not_declare(registry):
    registry.add_plugin(Plugin(AcceptsEverything), name="lax", distribution="tests")
    rep = run_suite("accepts-everything", ops=["silu_and_mul_clamp"])
    failed = {r.id: r.message for r in rep.failures()}
    assert set(failed) == {f"silu_and_mul_clamp/negative/dtype[{dt}]" for dt in ("bfloat16", "float16", "float64")}
    assert all("accepted it" in m and "predicates must reject" in m for m in failed.values())


def test_xfail_file_records_known_gaps(registry, tmp_path):
    registry.add_plugin(Plugin(IgnoresPadding), name="wrong", distribution="tests")
    path = tmp_path / "xfail.toml"
    path.write_text('[[xfail]]\ncase = "gdn_decode/pool/*"\nreason = "padding not implemented yet (issue 7)"\n'
                    '[[xfail]]\ncase = "gdn_decode/negative/vendor*"\nreason = "thought we ran there"\n'
                    '[[xfail]]\ncase = "gdn_decode/negative/dtype*"\nreason = "stale entry"\nstrict = true\n')
    rep = run_suite("ignores-padding", ops=["gdn_decode"], xfail=load_xfail(path))
    status = {r.id: r for r in rep.results}
    pool = [r for r in rep.results if r.kind == "pool"]
    assert pool and all(r.status == "xfail" and r.xfail_reason == "padding not implemented yet (issue 7)"
                        for r in pool)
    assert all(r.status == "xpass" for i, r in status.items() if "/negative/vendor" in i)
    stale = [r for i, r in status.items() if "/negative/dtype" in i]
    assert stale and all(r.status == "failed" and "xfail file (strict)" in r.message for r in stale)
    assert all(r.status == "failed" for r in rep.results if r.kind == "accuracy")  # not covered by the file


def test_bad_xfail_file_is_a_clear_error(tmp_path):
    path = tmp_path / "xfail.toml"
    path.write_text('[[xfail]]\ncase = "x/*"\n')
    with pytest.raises(ValueError, match="entry 1.*needs.*reason"):
        load_xfail(path)
    path.write_text("not toml [")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_xfail(path)
    with pytest.raises(FileNotFoundError, match="xfail file .*missing.toml: does not exist"):
        load_xfail(tmp_path / "missing.toml")


def test_contract_cases_run_for_a_backend_that_declares_triton_kernels(registry):
    pytest.importorskip("triton")
    if not linattn.capabilities.interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU (tests/conftest.py sets it)")

    class DeclaresKernels(AcceptsEverything):
        name = "declares-kernels"
        triton_kernels = ("gdn_decode", "not-registered-kernel")

        supports_dtype = linattn.backends.base.Backend.supports_dtype

    registry.add_plugin(Plugin(DeclaresKernels), name="kernels", distribution="tests")
    rep = run_suite("declares-kernels", kinds=["contract"])
    status = {r.id: (r.status, r.message) for r in rep.results}
    assert status["contract/contract/program-id[gdn_decode]"][0] == "passed"
    st, msg = status["contract/contract/program-id[not-registered-kernel]"]
    assert st == "failed" and "not in linattn.kernels.triton.registry.KERNELS" in msg


def test_linattn_check_command_json_and_exit_codes(registry):
    from typer.testing import CliRunner

    from linattn.apps.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["check", "--backend", "torch-ref", "--op", "silu_and_mul_clamp", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["ok"] and doc["backends"][0]["backend"] == "torch-ref"
    assert doc["backends"][0]["counts"]["passed"] >= 4
    res = runner.invoke(app, ["check", "--backend", "no-such-backend"])
    assert res.exit_code == 2 and "no backend named 'no-such-backend'" in res.output
    registry.add_plugin(Plugin(IgnoresPadding), name="wrong", distribution="tests")
    res = runner.invoke(app, ["check", "--backend", "ignores-padding", "--op", "gdn_decode"], env={"COLUMNS": "250"})
    assert res.exit_code == 1
    assert "FAILED" in res.output
    assert "gdn_decode/pool/slot0-padding[float32,state=float32,vk,pool,N4T1,K32V16,H2HV4]" in res.output


def _run_pytest_plugin(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The conformance suite as a pytest plugin, in a fresh interpreter in an empty directory."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "pytest", "-p", "linattn.testing.pytest_plugin", *args, "-q", "-p",
           "no:cacheprovider", "-rA"]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def test_pytest_plugin_turns_cases_into_items(tmp_path):
    res = _run_pytest_plugin(tmp_path, "--linattn-backend", "torch-ref", "--linattn-op", "silu_and_mul_clamp")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASSED linattn-conformance[torch-ref]::check[silu_and_mul_clamp/accuracy/dtype[float32" in res.stdout
    assert " passed" in res.stdout.splitlines()[-1]


def test_pytest_plugin_skips_a_backend_that_does_not_run_on_the_device_with_the_reason(tmp_path):
    res = _run_pytest_plugin(tmp_path, "--linattn-backend", "cutedsl", "--linattn-device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    skipped = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("backend not available on cpu: [device] device_type='cpu'" in line for line in skipped)
    assert "PASSED linattn-conformance[cutedsl]::check[gdn_prefill/negative/" in res.stdout
    assert not any("/accuracy/" in line or "/pool/" in line for line in res.stdout.splitlines()
                   if line.startswith("PASSED"))


def test_an_op_the_backend_does_not_declare_is_said_to_be_checked_for_its_refusal_only():
    from linattn.testing import run_suite

    rep = run_suite("triton-split", ops=["gdn_gating"], device="cpu")
    assert [r.kind for r in rep.results] == ["negative"] and rep.results[0].status == "passed"
    assert any("gdn_gating: not declared by triton-split: only its refusal was checked" in n for n in rep.notes)
    declared = run_suite("torch-ref", ops=["gdn_gating"], kinds=["negative"], device="cpu")
    assert not any("not declared" in n for n in declared.notes)
