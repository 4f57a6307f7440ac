# Two entry points, each creating .venv when missing:
#   make demo   set up and run the main job (linattn demo on the CPU's embedded default)
#   make test   set up, lint (ruff check) and run the whole test suite on two workers (pytest-xdist:
#               CI's machine has 2 cores); then the Triton kernels' interpreter and sm_90 compile
#               tests again under the newest Triton (a second venv). The sm_90 digests are checked
#               for the served dtypes' builds; make test-full checks all of them
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.linattn-installed
# The newest Triton release tested (pyproject.toml's triton range ends there), in its own venv;
# its interpreter works with numpy 2.4.
VENV_LATEST ?= .venv-triton-latest
TRITON_LATEST := 3.9.0
PY_LATEST := $(VENV_LATEST)/bin/python
STAMP_LATEST := $(VENV_LATEST)/.linattn-installed-triton-$(TRITON_LATEST)
# What runs under it: the sm_90 builds of every kernel, the shared contract in the interpreter (every
# kernel: decode, clamp, probe, each prefill stage and the fused prefill, both grid layouts, against
# float64), two of the prefill interpreter tests (varlen with empty and length-one sequences; strong
# gates) and tests/kernels but its grid-planner properties (test_grid.py: pure Python, no Triton; the
# first venv runs them). The rest of test_prefill_interp.py runs in the first venv only: under both
# Triton releases it was ~290 of the stage's ~400 CPU seconds (make test's 15-minute budget).
INTERP_LATEST := tests/prefill/test_prefill_interp.py::test_varlen_with_tail_chunks_zero_lengths_and_length_one_matches_reference \
	tests/prefill/test_prefill_interp.py::test_strongly_negative_gates_stay_finite_and_match_reference
TESTS_LATEST := tests/contract/test_compile.py tests/prefill/test_prefill_compile.py \
	$(INTERP_LATEST) tests/contract/test_contract.py tests/kernels \
	--ignore=tests/kernels/test_grid.py

.PHONY: demo test test-full setup test-triton-latest

$(STAMP): pyproject.toml examples/linattn-cpu-chunked/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch (a plain `torch` would pull a multi-GB CUDA build); triton 3.6 is the
	# GPU machine's version and its interpreter needs numpy < 2.4.
	# A torch already in the venv (a build of your choice) is kept.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q triton==3.6.0 "numpy<2.4"
	# CuTe DSL compiles its kernels for sm_90a / sm_100a on the CPU (the tests check that).
	$(PY) -m pip install -q -e ".[dev,cutedsl,plot,transformers]" "nvidia-cutlass-dsl==4.8.1" -e examples/linattn-cpu-chunked
	touch $(STAMP)

$(STAMP_LATEST): pyproject.toml examples/linattn-cpu-chunked/pyproject.toml
	test -x $(PY_LATEST) || python3 -m venv $(VENV_LATEST)
	$(PY_LATEST) -m pip install -q --upgrade pip
	$(PY_LATEST) -c "import torch" 2>/dev/null || $(PY_LATEST) -m pip install -q torch==2.13.0
	$(PY_LATEST) -m pip install -q triton==$(TRITON_LATEST) "numpy>=2.4,<2.5"
	$(PY_LATEST) -m pip install -q -e ".[dev]" -e examples/linattn-cpu-chunked
	touch $(STAMP_LATEST)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/linattn demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2
	$(MAKE) test-triton-latest

# make test and the sm_90 digests of every recorded build (make test checks the decode, clamp and
# bf16 prefill builds: tests/kernels/test_sm90_digests.py); run it before recording digests again
test-full:
	LINATTN_DIGESTS=all $(MAKE) test

test-triton-latest: $(STAMP_LATEST)
	$(PY_LATEST) -m pytest -q -n 2 -p no:cacheprovider $(TESTS_LATEST)
