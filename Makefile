# danaus: the two commands a newcomer needs are `make demo` and `make test`; CI runs
# `make test-all`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install compile test test-all test-rdma check test-unit test-integration demo bench lint docs clean

install: $(STAMP)

# Procs import danaus at start: byte-compile it (also where PYTHONDONTWRITEBYTECODE is
# set, which would make every proc compile every module again: 100 ms -> 60 ms a proc).
compile: install
	@$(PY) -m compileall -q danaus > /dev/null

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# The CPU wheel, pinned: a bare `torch` would pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,torch,hf,lightning]'
	bash scripts/install_pyverbs.sh $(PY)
	touch $(STAMP)

# make test: the newcomer's loop, about 5 minutes on 2 cores: every test except those
# marked slow, procs forked by the fork server (the default).
test: compile
	$(PY) -m pytest -q -m "not slow" tests

# make test-all: the full matrix, what CI runs. The process tests run twice: procs
# forked by the fork server, then started as fresh interpreters. The first run includes
# the slow tests and reports the controller's line coverage (make test-all COV= to skip
# it: it makes the CPU-bound unit tests about 1.5x slower). The second leaves out what
# does not depend on how procs start: the people's tools (they read the controller),
# SLURM (srun starts its agents), the rdma-bench CLI, the model-sized tensor-engine tests
# (test_tensor_engine covers fresh interpreters there) and whole-model parallelism
# (torch.distributed in actors; test_spmd covers exec there), with its checkpoints and
# recoveries and the copies of state they read (a respawn spawns procs the way the
# mesh's were; checked by hand in exec; test_copies passed in exec by hand),
# Lightning's strategy (its ranks are test_spmd's launch, which runs in exec; passed in
# exec by hand), the tensor engine's simulator (no procs), and the planner under cgroup
# CPU quotas and memory limits (whole-model parallelism again; test_memory_limits alone took 7 minutes in exec;
# test_memory_limits passed whole in exec by hand: it warms its procs before a limit, so
# fresh interpreters' torch imports are not charged to the group).
COV ?= --cov=danaus --cov-report=term:skip-covered
EXEC_SKIP := test_top test_dashboard test_slurm test_spmd_slurm test_rdma_bench \
	test_tensor_engine_models test_parallel test_checkpoints test_recovery test_simulator \
	test_lightning test_memory_limits test_unlike_procs test_copies
test-all: compile
	$(PY) -m pytest -q $(COV) tests
	DANAUS_SPAWN_METHOD=exec $(PY) -m pytest -q tests/integration tests/conformance \
		$(foreach t,$(EXEC_SKIP),--ignore=tests/integration/$(t).py)

# make check: the edit loop, lint and the unit tests (a minute or two).
check: lint
	$(PY) -m pytest -q tests/unit

# make test-rdma: every ibverbs test on a real kernel RDMA device (SoftRoCE in a QEMU
# guest, scripts/softroce.sh; about 15 minutes under CPU emulation). Installs what it needs
# as root; elsewhere it says why and skips.
test-rdma: compile
	bash scripts/test_rdma.sh

test-unit: compile
	$(PY) -m pytest -q tests/unit

test-integration: compile
	$(PY) -m pytest -q tests/integration

demo: compile
	$(PY) examples/hello_mesh.py

bench: compile
	$(PY) -m bench

# make docs: the site from docs/ and mkdocs.yml into site/; a broken link, anchor or API
# reference fails it (strict). NO_MKDOCS_2_WARNING: the theme's notice about MkDocs 2.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# make lint: ruff, mypy --strict, the import contracts in pyproject.toml (lint-imports:
# imports point down the layers, and cross into a package only through its seams), and
# the actor and mesh layers' module-level process state, by name (it may not grow).
lint: install
	$(VENV)/bin/ruff check danaus tests bench examples
	$(VENV)/bin/ruff format --check danaus tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/process_state.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info .coverage .coverage.* site
