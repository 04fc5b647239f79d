# spotpipe: two commands on a fresh machine.
#   make demo   set everything up and run the main job on the embedded default
#   make test   set everything up and run the test suite
# Both create .venv if it is missing and (re)install when pyproject.toml changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spotpipe-installed
# torch comes from PyTorch's CPU index (or a local wheel) first, so nothing can pull a CUDA build;
# --no-deps so only torch itself is looked up there (its dependencies come from PyPI next).
TORCH_SPEC := torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

.PHONY: demo test setup lint migrate bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		|| $(BIN)/pip install --no-deps "$(TORCH_SPEC)" --extra-index-url $(TORCH_INDEX)
	$(BIN)/pip install -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(BIN)/python manage.py migrate --noinput

lint: setup
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/python manage.py makemigrations --check --dry-run >/dev/null
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# `spotpipe demo` migrates by itself.
demo: setup
	$(BIN)/spotpipe demo $(DEMO_ARGS)

bench-quick: setup
	$(BIN)/python -m bench ingest --quick

clean:
	rm -rf var .pytest_cache
