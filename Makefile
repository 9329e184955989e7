# danaus: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-unit test-integration demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# The CPU wheel, pinned: a bare `torch` would pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	bash scripts/install_pyverbs.sh $(PY)
	touch $(STAMP)

test: install
	$(PY) -m pytest -q tests

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

demo: install
	$(PY) examples/hello_mesh.py

bench: install
	$(PY) -m bench

lint: install
	$(VENV)/bin/ruff check danaus tests bench examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
