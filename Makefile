# kvcache.offload: one entry point. `make help` lists the targets.
# Everything the targets make lives under build/ (git ignores it); nothing is
# written to the user's home, and nothing calls Galaxy or a container registry.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
BUILD := $(CURDIR)/build
VENV := $(BUILD)/venv
STAMP := $(VENV)/.installed
COLLECTION_LINK := $(BUILD)/collections/ansible_collections/kvcache/offload

export PATH := $(VENV)/bin:$(PATH)
export KVCACHE_BUILD_DIR := $(BUILD)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_HOME := $(BUILD)/ansible-home
export ANSIBLE_LOCAL_TEMP := $(BUILD)/ansible-home/tmp
export ANSIBLE_COLLECTIONS_PATH := $(BUILD)/collections
export ANSIBLE_FORCE_COLOR := 0
export XDG_CACHE_HOME := $(BUILD)/cache
# Download caches of pinned inputs, kept OUTSIDE the checkout so that the next clean clone on
# this machine reuses them (issue #39): pip's wheels of the tool venv, uv's package caches of
# the lab's nodes (also molecule's nodes scenario and the converge benchmark) and of the GPU
# contract's CUDA venv (about 13 GB), and the venvs ansible-test sanity makes for its tests
# (scripts/sanity.sh). pip and uv address their caches by content and lock them, ansible-test
# keys its venvs by their requirements, so two checkouts may share them. Root's default is
# /var/cache/kvcache-offload; anyone else's is build/cache. `make clean-cache` empties it.
KVCACHE_CACHE_DIR ?= $(if $(filter 0,$(shell id -u)),/var/cache/kvcache-offload,$(BUILD)/cache)
export KVCACHE_CACHE_DIR
export PIP_CACHE_DIR := $(KVCACHE_CACHE_DIR)/pip
# make check's gates at once (2 cores here: 3 keeps both busy while one gate waits on I/O).
CHECK_JOBS ?= 3
export MOLECULE_GLOB := molecule/*/molecule.yml
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Telemetry off for every tool that has it.
export DO_NOT_TRACK := 1
export VLLM_NO_USAGE_STATS := 1
export LMCACHE_TRACK_USAGE := false
export ANSIBLE_LINT_SKIP_SCHEMA_UPDATE := 1
export ANSIBLE_LINT_NODEPS := 0

.PHONY: help venv mitogen promtool collection docker image check lint sanity unit docs docs-check molecule integration gpu-contract gpu-contract-venv fleet dist test test-check test-gpu-contract-venv test-containers test-controller lab lab-test lab-down bench clean

# Every scenario in molecule/; `make molecule MOLECULE_SCENARIOS="nodes router"` runs some.
MOLECULE_SCENARIOS ?= $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))
# What `make test` (CI) runs: every scenario except `router`, whose vllm-router path the
# lab runs end to end in lab-test (site.yml + tests/integration/lab/test_router.py).
MOLECULE_CI_SCENARIOS ?= $(filter-out router,$(MOLECULE_SCENARIOS))

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt
	@echo "==> tool venv in $(VENV) (pinned: requirements-dev.txt)"
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip >$(BUILD)/pip.log 2>&1 || { cat $(BUILD)/pip.log; exit 1; }
	@$(VENV)/bin/python -m pip install --quiet -r requirements-dev.txt >>$(BUILD)/pip.log 2>&1 || { cat $(BUILD)/pip.log; exit 1; }
	@touch $@

venv: $(STAMP) collection ## Create the pinned tool venv (ansible, molecule, linters, pytest)

# Mitogen for Ansible, the OPT-IN executor (docs/mitogen.md): beside the tool venv, never in it.
# The unit tests load it (tests/unit/scripts/test_bench_mitogen.py), so `make unit` installs it.
MITOGEN_STAMP := $(BUILD)/mitogen/.installed
$(MITOGEN_STAMP): requirements-mitogen.txt $(STAMP)
	@echo "==> Mitogen (opt-in executor) in $(BUILD)/mitogen (pinned: requirements-mitogen.txt)"
	@rm -rf $(BUILD)/mitogen
	@$(VENV)/bin/python -m pip install --quiet --no-deps --target $(BUILD)/mitogen -r requirements-mitogen.txt >>$(BUILD)/pip.log 2>&1 || { cat $(BUILD)/pip.log; exit 1; }
	@touch $@

mitogen: $(MITOGEN_STAMP) ## Install the opt-in Mitogen executor into build/mitogen (docs/mitogen.md)

collection: ## Link this checkout into build/collections as kvcache.offload
	@mkdir -p $(dir $(COLLECTION_LINK)) $(ANSIBLE_LOCAL_TEMP)
	@test -L $(COLLECTION_LINK) || ln -sfn ../../../.. $(COLLECTION_LINK)

docker: ## Make sure a Docker engine runs (installs docker.io, starts dockerd)
	@scripts/ensure-docker.sh

image: docker ## Build the local Debian 12 systemd image (cached by recipe hash)
	@scripts/build-image.sh >/dev/null

# The four gates are independent (sanity runs in a private copy of the tree): side by side,
# each one's output printed whole when it ends, so `make check` takes about its longest gate.
check: venv ## Fast gates: yamllint, ansible-lint, ansible-test sanity, unit tests, generated docs up to date
	@$(MAKE) --no-print-directory -j$(CHECK_JOBS) --output-sync=target lint sanity unit docs-check

lint: venv
	@echo "==> yamllint"
	@yamllint --strict .
	@echo "==> ansible-lint (production profile)"
	@ansible-lint --offline --profile production -q

sanity: venv
	@echo "==> ansible-test sanity"
	@scripts/sanity.sh

docs: venv ## Regenerate the option reference docs/reference/ from DOCUMENTATION and argument_specs
	@python scripts/gen-docs.py

docs-check: venv
	@echo "==> generated docs (docs/reference)"
	@python scripts/gen-docs.py --check

# promtool (Debian's prometheus package, extracted into build/tools): the alert rules' unit tests.
promtool:
	@scripts/promtool.sh

unit: venv mitogen promtool
	@echo "==> unit tests"
	@python -m pytest tests/unit -q --cov=plugins --cov-report=term-missing:skip-covered --cov-report=xml:$(BUILD)/coverage.xml

molecule: venv image ## Molecule scenarios (converge, idempotence, verify); MOLECULE_SCENARIOS picks some, MOLECULE_JOBS runs them in parallel (default 2)
	@scripts/molecule-run.sh $(MOLECULE_SCENARIOS)

# Its test files side by side, INTEGRATION_JOBS at a time (pytest-xdist; one file per worker, so
# a file's module fixtures, such as a started store, are made once): run one by one the suite
# left 2 cores 70 % idle, waiting on the doubles and on the LMCache servers it starts (issue #39).
INTEGRATION_JOBS ?= 4
integration: venv ## ONTAP / StorageGRID roles against recording test doubles of their APIs; INTEGRATION_JOBS files at a time (default 4)
	@echo "==> integration tests (management API test doubles), $(INTEGRATION_JOBS) files at a time"
	@python -m pytest tests/integration -q -p no:cacheprovider -o testpaths=tests/integration --ignore=tests/integration/lab --ignore=tests/integration/fleet \
	  -n $(INTEGRATION_JOBS) --dist loadfile --durations=15

# GPU_CONTRACT_PAIR=<vllm>,<lmcache> checks a candidate pair instead of the matrix's cuda pins.
gpu-contract: venv ## The GPU path without a GPU: rendered settings against the CUDA builds of the pinned vLLM and LMCache (docs/gpu-acceptance.md)
	@scripts/gpu-contract.sh

dist: venv ## Build the collection tarball, install it into build/dist/collections, ansible-test sanity on the installed copy
	@scripts/dist.sh

# The execution environment a portal runs the collection in (docs/execution-environment.md):
# built from the local base image with ansible-builder only when its inputs changed, then
# smoke-tested. It takes the tarball of `make dist` (rebuilt without sanity when stale).
.PHONY: ee
ee: venv image ## The execution environment image kvcache-offload/ee (ansible-builder), rebuilt when its inputs change, then its smoke test
	@scripts/ee.sh >/dev/null

# After gpu-contract: it mounts that venv read-only into the nodes (docs/lab.md, "The GPU-shaped fleet").
# FLEET_KEEP=1 leaves the containers up (kvcache-fleet-*) after the run.
fleet: venv image ## inventories/example as shipped on GPU-shaped containers (HGX 8-GPU + PCIe 2-GPU), asserted (issue #18)
	@scripts/fleet-test.sh

# Only the first step of gpu-contract: its venv (cached; a no-op when the pins did not change).
gpu-contract-venv: venv
	@GPU_CONTRACT_PHASE=venv scripts/gpu-contract.sh

# The GPU contract needs about 18 GB under build/ and 6 minutes cold (docs/gpu-acceptance.md).
# Its venv (about 3 minutes cold, mostly downloads and disk writes) is built beside make check.
test: ## Everything CI runs: check, molecule, integration, the GPU contract, the GPU-shaped fleet, the built collection, the lab end to end
	@rm -f $(BUILD)/suite-times.tsv $(BUILD)/suite-failures.tsv
	@python3 scripts/disk-preflight.py
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-check test-gpu-contract-venv
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-containers test-controller
	@scripts/lab-test.sh tests

# Each suite of make test runs under scripts/suite-time.py, which appends its wall time to
# build/suite-times.tsv; .ci/run ends with the table (issue #39; budget: docs/development.md).
TIMED = python3 scripts/suite-time.py run

# The lanes' shared prerequisites are made once, here, before the lanes start: two sub-makes
# each making the tool venv at once broke a cold run (pip of one lane ran in the venv the other
# was creating).
test-check test-gpu-contract-venv: venv
test-containers test-controller: venv image

test-check:
	@$(TIMED) check -- $(MAKE) --no-print-directory check

test-gpu-contract-venv:
	@$(TIMED) gpu-contract-venv -- $(MAKE) --no-print-directory gpu-contract-venv

# make test's two lanes, run side by side (each prints when it ends). Containers: the molecule
# scenarios, the built collection, the execution environment, then the lab brought up (kept
# for its tests). Controller: the GPU contract first (its venv holds the LMCache that the
# integration suite's deleted-object test runs, and the fleet mounts it), then the others.
# The lab's tests run alone afterwards: its fault tests time engine restarts.
test-containers:
	@$(TIMED) molecule -- $(MAKE) --no-print-directory molecule MOLECULE_SCENARIOS="$(MOLECULE_CI_SCENARIOS)"
	@$(TIMED) dist -- $(MAKE) --no-print-directory dist
	@$(TIMED) ee -- $(MAKE) --no-print-directory ee
	@$(TIMED) "lab first run" -- scripts/lab-test.sh up

test-controller:
	@$(TIMED) gpu-contract -- $(MAKE) --no-print-directory gpu-contract
	@echo "==> unit tests that need the GPU contract's venv (make check ran before it was built)"
	@$(TIMED) "unit (LMCache 0.5.6)" -- env KVCACHE_REQUIRE_LMCACHE=1 python -m pytest -q -p no:cacheprovider tests/unit/roles/test_router_policies.py -k lmcache_0_5_6
	@$(TIMED) integration -- env KVCACHE_REQUIRE_LMCACHE=1 $(MAKE) --no-print-directory integration
	@$(TIMED) fleet -- $(MAKE) --no-print-directory fleet

lab: venv image ## Bring the lab up and run site.yml on it
	@ansible-playbook playbooks/lab_up.yml
	@ansible-playbook site.yml
	@ansible-playbook playbooks/lab_info.yml

lab-test: venv image ## The lab from scratch, then its tests (incl. a site.yml rerun that must change nothing)
	@scripts/lab-test.sh

lab-down: venv ## Remove everything the lab made
	@ansible-playbook playbooks/lab_down.yml

# BENCH_ARGS="--sections converge --converge-nodes 2,8" runs only part of it (docs/benchmarks.md).
bench: venv image ## Benchmarks (storage, lab TTFT, break-even, converge on 2/8/32 simulated nodes) into build/bench/
	@python scripts/bench.py $(BENCH_ARGS)

bench-smoke: venv ## The small benchmark run CI does (no LMCache venv is built for it)
	@python scripts/bench.py --smoke --no-venv-create

clean: lab-down ## Remove build/ (the tool venv, reports; the download caches outside it stay: make clean-cache)
	rm -rf $(BUILD)

.PHONY: clean-cache
clean-cache: ## Empty the download caches of pinned inputs (KVCACHE_CACHE_DIR; the next run downloads again)
	rm -rf $(KVCACHE_CACHE_DIR)/pip $(KVCACHE_CACHE_DIR)/lab $(KVCACHE_CACHE_DIR)/gpu-contract $(KVCACHE_CACHE_DIR)/ansible-test-home $(KVCACHE_CACHE_DIR)/promtool
