# Quick start: `make demo` runs the main job on embedded defaults, `make test` passes the tests.
# Both install everything they need first and are idempotent.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint bench clean

$(STAMP): pyproject.toml infra/setup.sh
	bash infra/setup.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/rollyard demo

# The static checks first (seconds): lint, formatting, strict types and the import layering are
# part of passing.
test: lint
	$(PY) -m pytest -q -m "not slow and not docker"

test-slow: setup
	$(PY) -m pytest -q -m "slow"

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy \
		&& $(VENV)/bin/lint-imports

bench: setup
	$(PY) benchmarks/sandbox_startup.py

clean:
	rm -rf $(VENV) .rollyard
