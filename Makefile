# Two entry points: `make verify` (the main job) and `make test`.
# Both create .venv on first use with torch pinned to the local 2.13.0 CPU build (and triton, whose
# interpreter runs the Triton kernels' tests on CPU).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: verify test test-slow browser sandbox clean

$(BIN)/kernelslot: pyproject.toml
	-@$(MAKE) --no-print-directory sandbox
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,triton,service]'
	@touch $@

verify: $(BIN)/kernelslot
	$(BIN)/kernelslot verify

# Two pytest-xdist processes, one test file each at a time, one torch thread each: much of the
# suite waits on worker processes and settle windows, so two processes overlap those waits, and one
# intra-op thread each keeps them from oversubscribing 2 cores (the native pool still uses every
# CPU; test_a_torch_pool_spinning_down_after_return_is_not_work_after_return runs a 2-thread pool).
TEST_ENV = OMP_NUM_THREADS=1
test: $(BIN)/kernelslot
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 --dist loadfile

test-slow: $(BIN)/kernelslot browser
	$(TEST_ENV) $(BIN)/python -m pytest -q -m slow -n 2 --dist loadfile

# The sandbox for candidate code (docs/threat-model.md): bubblewrap where the package manager allows;
# without it the referee falls back to `unshare`, else runs unsandboxed with a warning.
sandbox:
	-@command -v bwrap >/dev/null 2>&1 || apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	  (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1) || \
	  echo "warning: bubblewrap not installed (apt-get install bubblewrap); candidate code will use unshare or no sandbox"

# The HTML report's browser test uses Debian's chromium; optional (the test skips without it).
browser:
	-@command -v chromium >/dev/null 2>&1 || apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  echo "chromium not installed: the HTML browser test will be skipped"

clean:
	rm -rf $(VENV) build src/*.egg-info
