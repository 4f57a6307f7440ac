# Two entry points, each creating .venv when missing:
#   make demo   set up and run the main job (linattn demo on the CPU's embedded default)
#   make test   set up, lint (ruff check) and run the whole test suite on two workers (pytest-xdist:
#               CI's machine has 2 cores) under the newest Triton; then the tests that depend on the
#               Triton release (sm_90 digests and builds, AMD builds, the shared contract) under the
#               H200's Triton, in a second venv. The sm_90 digests are checked for the served dtypes'
#               builds; make test-full checks all of them
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP = $(VENV)/.linattn-installed-triton-$(TRITON_LATEST)
# The main venv runs the newest Triton release tested (pyproject.toml's triton range ends there): its
# interpreter runs this suite's kernels about a fifth faster than 3.6's (tests/prefill/test_prefill_segments.py
# on two workers: 94 against 119 s of CPU), and it needs numpy 2.4.
TRITON_LATEST := 3.9.0
# The H200's Triton (the GPU machine's version), in its own venv: the sm_90 digests were recorded with it
# (tests/kernels/test_sm90_digests.py skips under another release), the sm_90 and AMD builds are checked
# against its spill tables, and its interpreter needs numpy < 2.4.
VENV_DEVICE ?= .venv-triton-device
TRITON_DEVICE := 3.6.0
PY_DEVICE := $(VENV_DEVICE)/bin/python
STAMP_DEVICE := $(VENV_DEVICE)/.linattn-installed-triton-$(TRITON_DEVICE)
# What runs under it: the sm_90 digests, the sm_90 and AMD builds of every kernel, the shared contract in
# the interpreter (every kernel: decode, clamp, probe, each prefill stage and the fused prefill, both grid
# layouts, against float64), two of the prefill interpreter tests (varlen with empty and length-one
# sequences; strong gates) and tests/kernels (the decode configs, replay, fast launch, digests; its grid-planner
# properties too, pure Python). These run there only (make test's 15-minute budget: the AMD builds take 44 s a
# target); the main venv runs every other test.
INTERP_DEVICE := tests/prefill/test_prefill_interp.py::test_varlen_with_tail_chunks_zero_lengths_and_length_one_matches_reference \
	tests/prefill/test_prefill_interp.py::test_strongly_negative_gates_stay_finite_and_match_reference
TESTS_DEVICE := tests/contract/test_compile.py tests/contract/test_compile_amd.py tests/prefill/test_prefill_compile.py \
	$(INTERP_DEVICE) tests/contract/test_contract.py tests/kernels
# The main venv leaves those out (each ran in both venvs until 2026-12-03: about 60 s of make test's wall time on
# two cores, over the 15-minute budget). Under Triton 3.9 the interpreter still runs every kernel through the
# prefill, decode, fuzz, conformance and field tests; the builds and the contract are bound to the H200's release.
MAIN_SKIPS := $(addprefix --ignore=,tests/contract/test_compile_amd.py tests/contract/test_compile.py \
	tests/prefill/test_prefill_compile.py tests/contract/test_contract.py tests/kernels) \
	$(addprefix --deselect=,$(INTERP_DEVICE))

.PHONY: demo test test-full setup test-triton-device

$(STAMP): pyproject.toml examples/linattn-cpu-chunked/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch (a plain `torch` would pull a multi-GB CUDA build); the newest Triton and
	# the numpy its interpreter works with.
	# A torch already in the venv (a build of your choice) is kept.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q triton==$(TRITON_LATEST) "numpy>=2.4,<2.5"
	# CuTe DSL compiles its kernels for sm_90a / sm_100a on the CPU (the tests check that).
	$(PY) -m pip install -q -e ".[dev,cutedsl,plot,transformers]" "nvidia-cutlass-dsl==4.8.1" -e examples/linattn-cpu-chunked
	touch $(STAMP)

# The second venv holds only its own Triton and numpy (and the editable installs); torch, pytest and every
# other package come from the main venv, whose site-packages a .pth file appends to this venv's sys.path
# AFTER its own site-packages: this venv's Triton 3.6 and numpy < 2.4 shadow the main venv's 3.9 and 2.4,
# everything it lacks is the main venv's (its torch; a second copy of the ~190 MB torch and its
# dependencies was most of this venv's install time: 200 against 37 s here under load). The main venv is
# set up first (a prerequisite) and must run the same Python minor version (checked: its packages' builds
# are this venv's); on a first setup Triton and numpy are installed before the .pth exists, so pip never
# sees the main venv's as the ones to replace (on a rebuild this venv's own come first on sys.path anyway);
# the last line checks which ones import. A venv set up before this (its own torch in its site-packages)
# keeps working as it was.
$(STAMP_DEVICE): $(STAMP) pyproject.toml examples/linattn-cpu-chunked/pyproject.toml
	test -x $(PY_DEVICE) || python3 -m venv $(VENV_DEVICE)
	test "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" = "$$($(PY_DEVICE) -c 'import sys; print(sys.version_info[:2])')" \
		|| { echo "$(VENV) and $(VENV_DEVICE) run different Pythons; the second takes the first's packages: remove $(VENV_DEVICE) and run make again"; exit 1; }
	$(PY_DEVICE) -m pip install -q --upgrade pip
	$(PY_DEVICE) -m pip install -q triton==$(TRITON_DEVICE) "numpy<2.4"
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(PY_DEVICE) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/linattn-main-venv.pth"
	$(PY_DEVICE) -m pip install -q -e ".[dev]" -e examples/linattn-cpu-chunked
	$(PY_DEVICE) -c "import numpy, triton, torch; v = tuple(int(x) for x in numpy.__version__.split('.')[:2]); \
		assert triton.__version__ == '$(TRITON_DEVICE)' and v < (2, 4), (triton.__version__, numpy.__version__)"
	touch $(STAMP_DEVICE)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/linattn demo

# --maxschedchunk 1: pytest-xdist's load scheduling hands each worker a first batch of an eighth of the suite
# (two workers) and never moves a test once handed out; the tests that read a build subprocess run first
# (tests/conftest.py), so the first worker got every one of them in its batch. The second stage's five
# builds (sm_90 contract, prefill and digests, two AMD targets) then ran one after another on one worker
# while the other, done with the interpreter tests, sat idle for minutes. One test at a time (each worker
# holds the test it runs and the next) spreads the builds over both workers and leaves no long tail on one.
XDIST := -n 2 --maxschedchunk 1
# PYTHONSAFEPATH=1 on the pytest runs: `python -m` puts the working directory (this repository's root) first on
# sys.path, where the source folders kernels/, backends/, dispatch/ ... (linattn's subpackages, mapped by the
# editable install) shadow PyPI packages of the same name, e.g. the `kernels` package transformers imports.

test: $(STAMP)
	$(VENV)/bin/ruff check .
	PYTHONSAFEPATH=1 $(PY) -m pytest -q $(XDIST) $(MAIN_SKIPS)
	$(MAKE) test-triton-device

# make test, the sm_90 builds under the main venv's Triton (its spill table) and the sm_90 digests of every recorded build (make test checks the decode, clamp and
# bf16 prefill builds: tests/kernels/test_sm90_digests.py); run it before recording digests again
test-full:
	LINATTN_DIGESTS=all $(MAKE) test
	PYTHONSAFEPATH=1 $(PY) -m pytest -q $(XDIST) tests/contract/test_compile.py  # the sm_90 builds under the main venv's Triton too

test-triton-device: $(STAMP_DEVICE)
	PYTHONSAFEPATH=1 $(PY_DEVICE) -m pytest -q $(XDIST) -p no:cacheprovider $(TESTS_DEVICE)
