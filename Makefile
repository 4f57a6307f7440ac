# Two entry points, each creating .venv when missing:
#   make demo   set up and run the main job (linattn demo on the CPU's embedded default)
#   make test   set up, lint (ruff check) and run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.linattn-installed

.PHONY: demo test setup

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

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/linattn demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q
