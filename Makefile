# FabricLab: `make demo` sets everything up (if missing) and runs the main scenario;
# `make test` sets up and runs the whole test suite (what CI runs). Run as root.
-include /etc/fabriclab/env
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
export VENV

.PHONY: setup demo test unit lint bench clean

setup:
	bash lab/setup.sh

demo: setup
	$(VENV)/bin/fabriclab run ecmp-basic

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest

unit: setup
	$(PY) -m pytest tests/unit

bench: setup
	$(PY) bench/run_all.py

clean:
	$(VENV)/bin/fabriclab clean
