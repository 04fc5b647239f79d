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
# One try with a short timeout: pip goes on with the other sources (the local wheel) when the index
# cannot be reached, so its default five retries with backoff only waste time.
TORCH_SPEC := torch==2.13.0
UV_SPEC := uv==0.13.9
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_OPTS ?= --retries 0 --timeout 10
PYTEST_ARGS ?=
# `make test` runs the suite in three parts, each on TEST_WORKERS pytest-xdist workers (a file's tests
# together, in order; each worker with its own var folder and Redis database, tests/xdist_isolation.py)
# but the last: the unit tests; the end-to-end runs (markers in END_TO_END_MARKS: a control plane, a
# Celery worker and local nodes training, or a browser; mostly waiting on nodes and steps, so two at
# once took 365 s where one at a time took about 550, measured 2026-12-04); and one at a time the
# tests that hold the whole machine or read what earlier tests left (SERIAL_MARKS: the chaos soak
# with its own servers, the fuzz run's count). PYTEST_MARKS narrows every part (CI's embedded pass
# leaves out the tests the backend cannot change: markers chaos, runtime, scenario and
# tests/conftest.py's `backend_independent`); a part that selects nothing (pytest's exit status 5)
# is not a failure. The `runtime` tests (multi-process torch runs on gloo, mostly waiting on their
# timeouts) run in the first part: one at a time they took 280 s, beside the rest 148 s (measured,
# docs/reliability.md).
TEST_WORKERS ?= 2
END_TO_END_MARKS := scenario or integration
SERIAL_MARKS := chaos or serial
PYTEST_MARKS ?=
and_marks = $(if $(PYTEST_MARKS), and ($(PYTEST_MARKS)),)
# Browser tests drive the system's Chromium through playwright (its own browser download needs
# the internet): Debian's `chromium`, or whatever SPOTPIPE_CHROMIUM names.
CHROMIUM ?= chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: demo test setup lint migrate browser bench-tools bench-quick clean

# Settings fail closed (production unless asked otherwise); these targets are development work on
# this machine, so they ask for development mode (DEBUG, a built-in key) explicitly.
demo test migrate bench-quick: export SPOTPIPE_DEV = 1
# pytest caches its assertion-rewritten test modules as .pyc files, and only where Python may write
# bytecode; this machine sets PYTHONDONTWRITEBYTECODE, so every pytest process (each xdist worker,
# each part, each CI pass) rewrote all 550 modules again: 9 s of its 31 s of collection here.
# Empty is off (Python reads only a non-empty value).
test: export PYTHONDONTWRITEBYTECODE =

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Everything but torch is installed by uv (from PyPI, like pip, the same versions): a fresh clone's
# whole set-up took 54 s, against about 130 s with pip (2026-11-28). Byte-compiled at install, as pip does:
# where PYTHONDONTWRITEBYTECODE is set (this machine sets it) nothing would ever cache the compiled
# modules, and every process would compile torch and Django again (the suite ran 2x slower so).
# uv ignores pip's configuration, so where PyPI is reachable only through it, pip installs.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		|| $(BIN)/pip install --no-deps "$(TORCH_SPEC)" --extra-index-url $(TORCH_INDEX) $(TORCH_INDEX_OPTS)
	{ $(BIN)/pip install -q "$(UV_SPEC)" && $(BIN)/uv pip install --compile-bytecode --python $(BIN)/python -e ".[dev]"; } \
		|| { echo "== uv could not install; pip installs instead" >&2; $(BIN)/pip install -e ".[dev]"; }
	touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(BIN)/python manage.py migrate --noinput

# ruff, then the import contracts of pyproject.toml ([tool.importlinter]: no circles, no upward imports).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

# Installs Debian's chromium when no Chromium is found; fails with what to do when it cannot.
browser:
	@if [ -n "$$SPOTPIPE_CHROMIUM" ] && [ -x "$$SPOTPIPE_CHROMIUM" ]; then exit 0; fi; \
	if command -v $(CHROMIUM) >/dev/null || command -v chromium-browser >/dev/null; then exit 0; fi; \
	echo "== installing Debian's chromium for the browser tests"; \
	if command -v apt-get >/dev/null \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
		&& command -v $(CHROMIUM) >/dev/null; then exit 0; fi; \
	echo "make: the browser tests need Chromium and it could not be installed here." >&2; \
	echo "      Install it (Debian/Ubuntu: apt-get install -y chromium, as root)" >&2; \
	echo "      or set SPOTPIPE_CHROMIUM to a Chromium binary, then run make test again." >&2; \
	exit 1

# Every part always runs; the last line says how each ended, and the target fails if any did.
test: setup lint browser
	$(BIN)/python manage.py makemigrations --check --dry-run >/dev/null
	@unit=passed; e2e=passed; serial=passed; \
	$(BIN)/python -m pytest -p tests.xdist_isolation -n $(TEST_WORKERS) --dist loadfile \
		-m "not ($(END_TO_END_MARKS) or $(SERIAL_MARKS))$(and_marks)" $(PYTEST_ARGS); \
	code=$$?; [ $$code = 0 ] || [ $$code = 5 ] || unit="FAILED (pytest exit $$code)"; \
	$(BIN)/python -m pytest -p tests.xdist_isolation -n $(TEST_WORKERS) --dist loadfile \
		-m "($(END_TO_END_MARKS)) and not ($(SERIAL_MARKS))$(and_marks)" $(PYTEST_ARGS); \
	code=$$?; [ $$code = 0 ] || [ $$code = 5 ] || e2e="FAILED (pytest exit $$code)"; \
	$(BIN)/python -m pytest -m "($(SERIAL_MARKS))$(and_marks)" $(PYTEST_ARGS); \
	code=$$?; [ $$code = 0 ] || [ $$code = 5 ] || serial="FAILED (pytest exit $$code)"; \
	echo "== make test: unit part $$unit; end-to-end part $$e2e; one-at-a-time part $$serial"; \
	[ "$$unit" = passed ] && [ "$$e2e" = passed ] && [ "$$serial" = passed ]

# `spotpipe demo` migrates by itself.
demo: setup
	$(BIN)/spotpipe demo $(DEMO_ARGS)

# `python -m bench webhooks`'s load generator: Debian's wrk. Without it the benchmark sends the load
# from its Python client and says what that bounds; nothing else needs wrk.
bench-tools:
	@if command -v wrk >/dev/null; then exit 0; fi; \
	echo "== installing Debian's wrk for python -m bench webhooks"; \
	if command -v apt-get >/dev/null \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null \
		&& command -v wrk >/dev/null; then exit 0; fi; \
	echo "make: wrk could not be installed here (apt-get install -y wrk, as root); python -m bench webhooks" >&2; \
	echo "      then uses its Python client, whose own ceiling bounds the figures (it says so)." >&2

bench-quick: setup
	$(BIN)/python -m bench ingest --quick

clean:
	rm -rf var .pytest_cache
