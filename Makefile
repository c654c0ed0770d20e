# fastasr — every target works on a fresh clone (it creates .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORPUS := data/synthetic/.complete
# The C++ CPU attention kernels (src/fastasr/kernels/csrc); NATIVE=0 installs without them
# (CPU attention then runs the PyTorch reference, several times slower, and says so).
NATIVE ?= 1
NATIVE_LIB := src/fastasr/kernels/_build/fastasr_cpu.so
NATIVE_SRC := $(wildcard src/fastasr/kernels/csrc/*.cpp src/fastasr/kernels/csrc/*.h)
ifeq ($(NATIVE),0)
KERNELS := $(STAMP)
export FASTASR_NATIVE := 0
else
KERNELS := $(NATIVE_LIB)
endif
ARGS ?=

.PHONY: install native data train test test-full lint bench calibrate-auto matrix report clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

$(NATIVE_LIB): $(STAMP) $(NATIVE_SRC)
	@$(PY) -m fastasr.kernels.native build || { echo "error: the C++ CPU attention kernels did not build (compiler output above). 'make install NATIVE=0' installs without them; CPU attention then runs the PyTorch reference." >&2; exit 1; }

install: $(KERNELS)  ## create .venv, install fastasr with its dev extras, build the C++ CPU kernels

native: $(NATIVE_LIB)  ## (re)build the C++ CPU attention kernels after editing src/fastasr/kernels/csrc

$(CORPUS): $(KERNELS)
	$(PY) -m fastasr.data.synthetic --out data/synthetic

data: $(CORPUS)  ## synthesise the built-in espeak-ng corpus under data/synthetic (offline)

train: $(CORPUS)  ## train the default model (CPU if no GPU); extra overrides: make train ARGS="model.layers=9"
	$(PY) train.py $(ARGS)

test: $(KERNELS)  ## the fast test suite (what CI runs); pytest's exit 5 (no tests collected) is not a failure
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-full: $(KERNELS)  ## every test, slow ones included
	$(PY) -m pytest -q -m "slow or not slow"

lint: $(STAMP)  ## ruff
	$(PY) -m ruff check src tests benchmarks train.py evaluate.py

bench: $(KERNELS)  ## CPU table: ours vs pytorch-fast-transformers (if installed) vs SDPA → benchmarks/results/
	$(PY) benchmarks/cpu_bench.py $(ARGS)

calibrate-auto: $(KERNELS)  ## measure this machine's full/i-clustered crossovers into conf/attention/auto.yaml
	$(PY) -m fastasr.attention.calibrate $(ARGS)

matrix: $(CORPUS)  ## train-with-X / decode-with-Y table (conf/cross_eval.yaml)
	$(PY) -m fastasr.cross_eval $(ARGS)

report: $(KERNELS)  ## static HTML report of a run or matrix dir: make report DIR=outputs/...
	$(PY) -m fastasr.report $(DIR)

clean:  ## remove the venv, generated data and outputs
	rm -rf $(VENV) data/synthetic outputs multirun .pytest_cache src/fastasr/kernels/_build
