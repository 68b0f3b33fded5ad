# Two commands do everything on a fresh machine with Python 3.11: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup  ## train the digits demo on an embedded local Ray, layout chosen automatically
	$(BIN)/raytf run experiments/digits.py

test: setup lint  ## lint, then the whole test suite (unit, real Ray, multi-process TF)
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check raytf tests experiments
	$(BIN)/ruff format --check raytf tests experiments

format: setup
	$(BIN)/ruff format raytf tests experiments
	$(BIN)/ruff check --fix raytf tests experiments

bench: setup  ## the benchmark table in the README
	$(BIN)/python experiments/benchmark.py --markdown

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
