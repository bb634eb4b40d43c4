# Boltforge developer entry points. Everything bootstraps its own virtual environment.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bolt demo

lint: $(STAMP)
	$(BIN)/ruff check boltforge tests bench
	$(BIN)/ruff format --check boltforge tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/placement.py
	$(BIN)/python bench/quality.py
	$(BIN)/python bench/cycle.py
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/control_plane.py
	$(BIN)/python bench/fleet_scale.py
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
