# spark-vllm: every entry point an operator or CI uses. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CACHE   ?= $(HOME)/.cache/spark-vllm
VENV    ?= venv
PY      := $(VENV)/bin/python
STACK   ?= dev
# Local state, no Pulumi Cloud: a file backend outside the checkout, a passphrase file for secrets.
# The dev stack (the lab) is encrypted with the lab's passphrase (lab/dev.passphrase: not a
# secret; Pulumi.dev.yaml carries its salt); every other stack with yours.
STATE_DIR ?= $(HOME)/.spark-vllm/state
export PULUMI_BACKEND_URL ?= file://$(STATE_DIR)
# (promote opens each stack with its own: FROM=dev with the lab's, the target with yours)
ifeq ($(STACK)$(FROM),dev)
export PULUMI_CONFIG_PASSPHRASE_FILE ?= $(CURDIR)/lab/dev.passphrase
else
export PULUMI_CONFIG_PASSPHRASE_FILE ?= $(HOME)/.spark-vllm/passphrase
endif
export PULUMI_SKIP_UPDATE_CHECK := true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION := true
export PATH := $(CACHE)/toolchain/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export PIP_CACHE_DIR ?= $(CACHE)/pip

.PHONY: help setup venv toolchain host-packages toolchain-bundle lint test test-all require-root test-unit demo lab-up lab-down lab-seed recon bench bench-serve promote

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# contract/ (what the program and the pack share) goes into both: the program's editable install
# maps it, the pack's virtualenv gets its own copy (re-made when a contract file changes)
$(VENV)/.installed: requirements.txt policies/requirements.txt pyproject.toml $(wildcard contract/*.py contract/pyproject.toml)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@test -x policies/venv/bin/python || python3 -m venv policies/venv
	policies/venv/bin/python -m pip install -q -r policies/requirements.txt
	policies/venv/bin/python -m pip install -q --no-deps --no-build-isolation --force-reinstall ./contract
	@rm -rf contract/build contract/*.egg-info  # pip builds in the tree: no stale copy of a removed module next time
	@touch $@

venv: $(VENV)/.installed ## the project and policy-pack virtualenvs (pip wheels cached in $(CACHE)/pip)

toolchain: venv ## Pulumi's CLI, language host and plugins (TOOLCHAIN_BUNDLE=DIR / TOOLCHAIN_SOURCES=DIR offline)
	VENV="$(CURDIR)/$(VENV)" TOOLCHAIN_BUNDLE="$(TOOLCHAIN_BUNDLE)" TOOLCHAIN_SOURCES="$(TOOLCHAIN_SOURCES)" scripts/toolchain.sh all
	@mkdir -p $(STATE_DIR) && chmod 700 $(dir $(STATE_DIR))
	@f=$(HOME)/.spark-vllm/passphrase; test -s $$f || { umask 077; head -c 24 /dev/urandom | base64 > $$f; echo "created a passphrase for your stacks in $$f"; }

toolchain-bundle: ## on a machine with internet: Pulumi's release archives + SHA256SUMS into DIR
	@test -n "$(DIR)" || { echo "usage: make toolchain-bundle DIR=/path/to/bundle" >&2; exit 2; }
	scripts/toolchain.sh bundle "$(DIR)"

host-packages: ## Debian's haproxy, netplan.io, iptables, nftables, systemd, prometheus, run for real by the tests (installed when missing, as root)
	scripts/host_packages.sh

setup: venv toolchain host-packages ## everything a fresh machine needs (idempotent; seconds when warm)

lint: venv ## ruff, mypy (strict: the program, contract/, the pack's rules, bench), the import layers, the generated docs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(PY) scripts/contract_doc.py --check
	$(PY) bench/golden_steps.py --check

test-unit: venv ## fast tier: mocks, policy rules, recon parsers (no CLI, no hosts)
	$(PY) -m pytest -q -n 2 tests/unit tests/policies

# scripts/run_tests.py runs the tiers as separate pytest processes (the mock tests install
# Pulumi's global mock monitor, which the engine tests must not inherit), fails on any skipped
# test, and prints each tier's time and the 15 slowest tests. docs/testing.md: what proves what.
test: require-root setup lint ## the whole suite: lint, unit, engine, promote, lab, e2e (CI; ~55 min)
	$(PY) scripts/run_tests.py $(TEST_ARGS)

test-all: require-root setup lint ## make test plus the long tail of e2e cases (docs/testing.md; ~80 min)
	$(PY) scripts/run_tests.py --all $(TEST_ARGS)

require-root:
	@test "$$(id -u)" = 0 || { echo "make test: the lab and e2e tiers drive simulated Sparks (network namespaces, a dockerd per node), which needs root. Run it as root; nothing was run." >&2; exit 2; }

demo: setup ## bring up the lab, `pulumi up` the dev stack, show a completion
	scripts/demo.sh $(STACK)

lab-up: ## start the simulated Sparks (root; NODES=3 for three; waits while a test run or demo holds the lab)
	python3 lab/lab.py up --nodes $${NODES:-2}

lab-seed: ## reproduce the reference machine on spark-1 (foreign vLLM containers, partial HF cache)
	python3 lab/lab.py seed

lab-down: ## remove everything the lab made (waits while a test run or demo holds the lab)
	python3 lab/lab.py down

recon: venv ## survey the stack's nodes and print the side-by-side table
	$(VENV)/bin/spark-vllm-recon --stack $(STACK) $(RECON_ARGS)

bench: setup ## measure change costs, fan-out and scaling on the lab -> docs/benchmarks.md (~1 h)
	$(PY) bench/bench.py $(BENCH_ARGS)

bench-serve: venv ## vLLM's own serving benchmark against a deployed stack -> docs/serving-bench.md (STACK=dev)
	$(PY) -m pip install -q -r bench/requirements.txt
	$(PY) bench/serve.py --stack $(STACK) $(BENCH_SERVE_ARGS)

promote: venv ## promote verified artifacts: FROM=dev TO=staging [PROMOTE_ARGS="--yes|--dry-run"]
	$(VENV)/bin/spark-vllm-promote --from $(FROM) --to $(TO) $(PROMOTE_ARGS)
