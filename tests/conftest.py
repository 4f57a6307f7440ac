"""Suite-wide setup. On a machine without a GPU, Triton kernels run in the interpreter: the
variable must be set before anything imports triton."""

import os

# One intra-op thread per pytest-xdist worker (make test: ``-n 2`` on CI's two cores): the workers
# already fill the cores, and a second OpenMP / OpenBLAS thread per worker only spins against the
# other worker and the build subprocesses (measured: tests/plugins on two workers 139 -> 95 s of CPU;
# the conformance suite on torch-chunked 17 s -> 1.3 s). Set before torch and numpy (the Triton
# interpreter's matmuls) load; a value already in the environment is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER") and os.environ["OMP_NUM_THREADS"] == "1":
    torch.set_num_threads(1)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter's test-only speed-ups (tests/_interpreter_speed.py)
    import _interpreter_speed

    _interpreter_speed.install()

# Static ranks only: no tuned table of this machine (``linattn tune``, the table shipped for the arch)
# changes a choice a test expects; the ``tuned`` fixture below turns tables on in a folder of the test's.
os.environ["LINATTN_TUNED"] = "0"
os.environ.pop("LINATTN_AUTOTUNE", None)


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess_job(key): the test reads the result of the subprocess registered "
                                       "as key in tests/subprocess_jobs.py (started ahead, on another core)")


def pytest_collection_finish(session):
    """Start the selected tests' build subprocesses (tests/subprocess_jobs.py) in the background, one at a
    time in suite order (those tests run last: pytest_collection_modifyitems); a worker of ``pytest -n``
    runs each with its test instead."""
    if hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return
    import subprocess_jobs

    subprocess_jobs.start_ahead([m.args[0] for item in session.items
                                 for m in item.iter_markers("subprocess_job")])


def pytest_sessionfinish(session):
    import subprocess_jobs

    subprocess_jobs.stop_all()


def pytest_collection_modifyitems(config, items):
    import pytest

    # the tests that read a build subprocess run last (their relative order kept), so that their
    # subprocesses, started when collection ends, build while the other tests run; under pytest-xdist
    # nothing starts ahead (each worker runs the subprocess of the test it is given), so they run
    # first instead: minutes-long builds at the end of the run would leave the other worker idle
    first = hasattr(config, "workerinput")
    items.sort(key=lambda item: (item.get_closest_marker("subprocess_job") is not None) != first)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- fixtures shared by the plugin tests (tests/plugins, tests/field) ----------------------------------

import sys  # noqa: E402

import pytest  # noqa: E402

PLUGIN_ENV_VARS = ("LINATTN_PLUGINS", "LINATTN_DISABLE_PLUGINS", "LINATTN_BACKEND", "LINATTN_DISABLE")


@pytest.fixture
def registry(monkeypatch):
    """The process registry reloaded from the real entry points (plugin env vars unset), and
    reloaded again afterwards so no test leaks a plugin into the next."""
    from linattn.dispatch import reset_registry

    for var in PLUGIN_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    yield reset_registry()
    monkeypatch.undo()
    reset_registry()


@pytest.fixture
def site(tmp_path, monkeypatch, registry):
    """A fresh folder on sys.path for fake distributions; their modules are forgotten afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name, mod in list(sys.modules.items()):
        if str(getattr(mod, "__file__", "") or "").startswith(str(root)):
            del sys.modules[name]


# -- the tuned-table fixture shared by tests/dispatch/test_tuning.py and tests/gpu/test_tuning_gpu.py ----


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """Tuned tables on (``LINATTN_TUNED=1``), read from and written to an empty folder of this
    test's (yielded); autotuning off; the dispatcher's cache cleared before and after."""
    from linattn.dispatch import clear_cache

    monkeypatch.setenv("LINATTN_TUNE_DIR", str(tmp_path))
    monkeypatch.setenv("LINATTN_TUNED", "1")
    monkeypatch.delenv("LINATTN_AUTOTUNE", raising=False)
    clear_cache()
    yield tmp_path
    clear_cache()
