# Two entry points: `make verify` (the main job) and `make test`.
# Both create .venv on first use with torch pinned to the local 2.13.0 CPU build.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: verify test test-slow clean

$(BIN)/kernelslot: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

verify: $(BIN)/kernelslot
	$(BIN)/kernelslot verify

test: $(BIN)/kernelslot
	$(BIN)/python -m pytest -q

test-slow: $(BIN)/kernelslot
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build src/*.egg-info
