# The two commands of the README, and the pieces they are made of.
# Everything runs inside .venv, which `make` creates with the system python3.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-exhaustive lint format bench clean

# Set up, then compile an example for the CPU, run it, check it against numpy, time it;
# then train a small MLP with a compiled training step, step by step beside PyTorch.
demo: $(STAMP)
	$(BIN)/python examples/run_mlp.py
	$(BIN)/python examples/train_mlp.py

# Set up, then run every test tier that this machine's tools allow, one worker per core,
# but the exhaustive sweeps (every case under the sanitizers, the whole library through
# nvcc and hipcc), which test-exhaustive runs and CI runs after it.
# TEST_CORE_MINUTES is the suite's measured cost on one core of a 2-core machine; the
# estimate printed first divides it by the cores (it is a guide, not a promise).
TEST_CORE_MINUTES := 19
EXHAUSTIVE_CORE_MINUTES := 25
CORES := $(shell nproc 2>/dev/null || echo 1)
test: $(STAMP) lint
	@echo "make test: about $$(( ($(TEST_CORE_MINUTES) + $(CORES) - 1) / $(CORES) )) minutes on $(CORES) cores"
	$(BIN)/python -m pytest -n $(CORES) --dist loadgroup -m "not exhaustive" $(PYTEST_ARGS)

test-exhaustive: $(STAMP)
	@echo "make test-exhaustive: about $$(( ($(EXHAUSTIVE_CORE_MINUTES) + $(CORES) - 1) / $(CORES) )) minutes on $(CORES) cores"
	$(BIN)/python -m pytest -n $(CORES) --dist loadgroup -m exhaustive $(PYTEST_ARGS)

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
	@echo "installing Tessera and its test tools into $(VENV) (log: $(VENV)/install.log)"
	@$(BIN)/python -m pip install --upgrade pip > $(VENV)/install.log 2>&1 \
	  && $(BIN)/python -m pip install -e '.[test]' >> $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; exit 1; }
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
