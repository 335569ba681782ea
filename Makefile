# Every target installs what it needs from nothing: a .venv with torch==2.13.0 first (the CPU wheel on
# this machine; a bare `torch` would pull a multi-GB CUDA build), then triton, then hqkv and its extras.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.hqkv-installed
export TRITON_INTERPRET ?= 1
export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test nbtest pytest check-clean docs docs-test bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check triton==3.9.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

install: $(STAMP)

## demo: the main job (for now: the capacity plan of the default geometry in every format)
demo: $(STAMP)
	$(BIN)/hqkv plan

check-clean: $(STAMP)
	bash .ci/check-clean $(BIN)

nbtest: $(STAMP)
	$(BIN)/nbdev-test --n-workers 2 --timing

pytest: $(STAMP)
	$(BIN)/pytest -q

## test: notebooks and package agree, every notebook's tests, then pytest (its summary line is last)
test: $(STAMP)
	bash .ci/check-clean $(BIN)
	$(BIN)/nbdev-test --n-workers 2 --timing
	$(BIN)/pytest -q

## bench: the long measurements (`#| slow` cells), tables saved beside the notebooks
bench: $(STAMP)
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing

## gpu-check: kernel checks + benchmarks on a GPU machine (kernels/README.md)
gpu-check: $(STAMP)
	TRITON_INTERPRET=0 $(PY) kernels/check_attention.py && TRITON_INTERPRET=0 $(PY) kernels/bench_attention.py

clean:
	rm -rf _site _docs _proc .pytest_cache
