# fastasr — every target works on a fresh clone (it creates .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# the console scripts of pyproject.toml [project.scripts], installed into the venv by make install
BIN := $(VENV)/bin
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

.PHONY: install native data features lm train test test-slow test-full test-runtime lint bench calibrate-auto matrix report clean help gpu-check

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

# torch 2.11's CUDA build and its NVIDIA libraries take ~5.2 GB in .venv, plus their wheels while
# pip installs them: say so before pip fails half-way with 'No space left on device'.
INSTALL_NEEDS_GB := 8

$(STAMP): pyproject.toml
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	if [ "$$free" -lt $(INSTALL_NEEDS_GB) ]; then \
	  echo "error: 'make install' needs about $(INSTALL_NEEDS_GB) GB free on the disk of $$(pwd) (torch's CUDA build: ~5.2 GB in .venv, plus its wheels while pip installs them); $$free GB is free." >&2; exit 1; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -e '.[dev,slurm,deploy]'
	touch $(STAMP)

$(NATIVE_LIB): $(STAMP) $(NATIVE_SRC)
	@$(BIN)/fastasr-kernels build || { echo "error: the C++ CPU attention kernels did not build (compiler output above). 'make install NATIVE=0' installs without them; CPU attention then runs the PyTorch reference." >&2; exit 1; }

install: $(KERNELS)  ## create .venv, install fastasr (its console scripts fastasr-* into .venv/bin) with its dev, slurm and deploy extras, build the C++ CPU kernels

native: $(NATIVE_LIB)  ## (re)build the C++ CPU attention kernels after editing src/fastasr/kernels/csrc

$(CORPUS): $(KERNELS)
	$(BIN)/fastasr-corpus synthetic --out data/synthetic

data: $(CORPUS)  ## synthesise the built-in espeak-ng corpus under data/synthetic (offline)

features: $(CORPUS)  ## filterbank caches of the config's manifests under data/feature_cache; overrides as train: make features ARGS="features=fbank80"
	$(BIN)/fastasr-features $(ARGS)

LM := data/synthetic/lm/words-3gram.arpa

$(LM): $(CORPUS)
	$(BIN)/fastasr-lm build --manifest data/synthetic/train.jsonl --order 3 --out $(LM) --dev data/synthetic/dev.jsonl

lm: $(LM)  ## word 3-gram LM (ARPA, modified Kneser-Ney) of the built-in corpus's training transcripts (seconds)

train: $(LM)  ## train the default model (CPU if no GPU), then beam-decode its test split with the LM; extra overrides: make train ARGS="model.layers=9"
	$(PY) train.py $(ARGS)

test: $(KERNELS)  ## the fast tier (4-5 min on 2 cores); CI runs it, then test-slow. No test collected = failure
	$(PY) -m pytest -q

test-slow: $(KERNELS)  ## the slow tier only: trainings, smoke matrix, subprocess re-runs, kernel compile/bench checks
	$(PY) -m pytest -q -m slow

test-full: $(KERNELS)  ## every test (= test + test-slow, what CI covers)
	$(PY) -m pytest -q -m "slow or not slow"

# The PyTorch-free runtime as a user installs it (docs/DEPLOY.md, "Without PyTorch"): while the full
# install exports a tiny model and writes PyTorch's words (tests/runtime/write_fixture.py), a fresh
# venv without torch gets ./runtime (the fastasr-runtime distribution) and pytest; tests/runtime
# then runs there. PYTHONPATH is cleared for that venv: it must find fastasr where pip put it.
RUNTIME_VENV := .venv-runtime
RUNTIME_FIXTURE := data/runtime_fixture

test-runtime: $(KERNELS)  ## the runtime installed from ./runtime into a fresh venv without torch: tests/runtime and fastasr-onnx-transcribe there (CI runs it)
	rm -rf $(RUNTIME_VENV); \
	$(PY) tests/runtime/write_fixture.py $(RUNTIME_FIXTURE) & fixture=$$!; \
	env -u PYTHONPATH $(PYTHON) -m venv $(RUNTIME_VENV) \
	  && env -u PYTHONPATH $(RUNTIME_VENV)/bin/python -m pip install --quiet ./runtime pytest pytest-timeout \
	  || { kill $$fixture; exit 1; }; \
	wait $$fixture
	env -u PYTHONPATH FASTASR_RUNTIME_FIXTURE=$(RUNTIME_FIXTURE) $(RUNTIME_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/runtime

lint: $(STAMP)  ## ruff
	$(PY) -m ruff check src tests benchmarks train.py evaluate.py

bench: $(KERNELS)  ## CPU table: ours vs pytorch-fast-transformers (if installed) vs SDPA → benchmarks/results/
	$(PY) -m benchmarks.attention.cpu_table $(ARGS)

gpu-check:  ## on a GPU machine, with its own Python (torch, triton, lightning; other deps from .whl/): a 3-min make train, compile check, Triton tests, bench, model step → benchmarks/results/ (~8 min)
	PYTHON=$(PYTHON) bash benchmarks/gpu/check.sh

calibrate-auto: $(KERNELS)  ## measure this machine's full/i-clustered crossovers into conf/attention/auto.yaml
	$(BIN)/fastasr-calibrate $(ARGS)

matrix: $(CORPUS)  ## train-with-X / decode-with-Y table (conf/cross_eval.yaml)
	$(BIN)/fastasr-matrix $(ARGS)

.PHONY: data-long budget
LONG_CORPUS := data/synthetic_long/.complete

$(LONG_CORPUS): $(KERNELS)
	$(BIN)/fastasr-corpus synthetic --out data/synthetic_long --min-seconds 10 --max-seconds 40 --train 600 --dev 60 --test 60

data-long: $(LONG_CORPUS)  ## synthesise the long-utterance corpus (10-40 s, 600/60/60, 3.6 h of training audio) under data/synthetic_long (offline)

.PHONY: base-model
SRC ?=

base-model: $(KERNELS)  ## the base model to fine-tune from: Mini LibriSpeech (SRC=path/to/train-clean-5), 6,000 updates, resumable (docs/RECIPES.md)
	@test -n "$(SRC)" || { echo "error: make base-model needs SRC=<LibriSpeech train-clean-5 directory> (docs/DATA.md: Mini LibriSpeech)" >&2; exit 2; }
	$(BIN)/fastasr-corpus mini-librispeech $(SRC) data/mini_librispeech
	$(PY) train.py data=manifest experiment=base_model $(ARGS)

.PHONY: data-joined
JOINED_CORPUS := data/synthetic_joined/.complete

$(JOINED_CORPUS): $(CORPUS)
	$(BIN)/fastasr-corpus join data/synthetic/train.jsonl data/synthetic_joined --count 150 --min-seconds 10 --max-seconds 30

data-joined: $(JOINED_CORPUS)  ## the built-in training set plus 150 utterances of 10-30 s (~0.9 h) joined across voices (data=synthetic_joined, docs/TRANSCRIBE.md)

budget: $(LONG_CORPUS)  ## dev PER for a wall-clock budget, against training and forward time (Figure 1; conf/budget.yaml, docs/BUDGET.md)
	$(BIN)/fastasr-budget $(ARGS)

report: $(KERNELS)  ## static HTML report of a run or matrix dir: make report DIR=outputs/...
	$(BIN)/fastasr-report $(DIR)

clean:  ## remove the venv, generated data and outputs
	rm -rf $(VENV) $(RUNTIME_VENV) data/synthetic data/feature_cache $(RUNTIME_FIXTURE) outputs multirun .pytest_cache src/fastasr/kernels/_build
