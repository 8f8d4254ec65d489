# raydec: two commands on a fresh machine -> `make demo`, `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A local CPU build of torch; users with GPUs install their own torch first (see README).
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup lint test demo bench clean

$(BIN)/.installed: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# two workers: the suite's processes run torch on one thread each (tests/conftest.py), so a second
# worker keeps the second core busy; a module's tests (and the Serve app's) stay on one worker
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

demo: setup
	$(BIN)/python -m raydec.cli demo

clean:
	rm -rf $(VENV) out .pytest_cache
