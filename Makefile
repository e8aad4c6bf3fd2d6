# The two commands of the README, and the pieces they are made of.
# Everything runs inside .venv, which `make` creates with the system python3.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format bench clean

# Set up, then compile an example for the CPU, run it, check it against numpy, time it.
demo: $(STAMP)
	$(BIN)/python examples/run_mlp.py

# Set up, then run every test tier that this machine's tools allow.
test: $(STAMP) lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/black --check tessera tests bench examples
	$(BIN)/ruff check tessera tests bench examples

format: $(STAMP)
	$(BIN)/black tessera tests bench examples
	$(BIN)/ruff check --fix tessera tests bench examples

bench: $(STAMP)
	$(BIN)/python bench/parse.py
	$(BIN)/python bench/cpu.py

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
