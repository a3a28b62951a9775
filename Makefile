# One place for every command; CI and pre-commit call these targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install format lint typecheck test test-unit test-integration test-fault bench demo all clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

format: $(STAMP)
	$(BIN)/ruff format prq api tests bench
	$(BIN)/ruff check --fix prq api tests bench

lint: $(STAMP)
	$(BIN)/ruff check prq api tests bench
	$(BIN)/ruff format --check prq api tests bench

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy tests bench

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest tests/integration -m integration

test-fault: $(STAMP)
	$(BIN)/pytest tests -m fault

# The whole gate: what CI runs, and what the README calls "the tests".
test: lint typecheck
	$(BIN)/pytest tests -m "not bench" -p no:cacheprovider

all: test

bench: $(STAMP)
	$(BIN)/python bench/rpc.py

demo: $(STAMP)
	$(BIN)/prq demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
