# The two commands of the README: `make run` and `make test`. Everything they need is installed
# here, into .venv, from the package registries; nothing is installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install sandbox browser run test check lint typecheck pytest coverage bench clean

install: $(STAMP) sandbox

# Untrusted code (agents, pip builds, experiments) runs under Debian's bubblewrap.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
	  || echo "warning: bubblewrap not installed; set AUTOPILOT_SANDBOX=off to run untrusted code unconfined"; }

# torch: an already-installed torch (a GPU host's own build) is kept; otherwise the pin in the
# `experiments` extra (torch==2.13.0) takes the local CPU wheel, never a multi-GB CUDA build.
# pip's own output shows what it installs (a first install takes a minute or more).
$(STAMP): pyproject.toml experiments/harness/pyproject.toml
	@echo "== 1/4 the service's venv: $(VENV)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== 2/4 pip itself"
	$(BIN)/python -m pip install --upgrade pip
	@echo "== 3/4 the service, its dev tools and the experiments' packages (an installed torch is kept)"
	if $(BIN)/python -c "import torch" 2>/dev/null; then \
	  $(BIN)/python -m pip install -e '.[dev]' numpy; \
	else \
	  $(BIN)/python -m pip install -e '.[dev,experiments]'; \
	fi
	@echo "== 4/4 the experiment harness"
	$(BIN)/python -m pip install --no-deps -e ./experiments/harness
	@echo "== installed: $$($(BIN)/python -m pip list --format=freeze | wc -l) packages in $(VENV)"
	touch $(STAMP)

# One whole demo cycle on the embedded defaults; the service then stays up for review.
run: install
	$(BIN)/autopilot db upgrade
	$(BIN)/autopilot demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check app workers
	$(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy app workers

check: lint typecheck

# The dashboard's browser tests drive Debian's Chromium (never a browser the test tool downloads).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
	  || echo "warning: chromium not installed; browser tests skip outside CI"; }

# The suite runs on parallel workers (pytest-xdist): most of its time is spent waiting on real
# worker processes, so more workers than cores pays. Each xdist worker has its own Redis
# database and migrated-schema templates; tests marked `timing` run one after another on one
# worker (loadgroup), and those marked `quiet` run alone afterwards; see tests/conftest.py.
PYTEST_WORKERS ?= 4
pytest: install browser
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup --durations=40 -m "not quiet"
	$(BIN)/python -m pytest -q -p no:cacheprovider -m quiet

# Line coverage of app/ and workers/ (in the test processes; workers started as subprocesses are
# not traced), the figure a change must not lower.
coverage: install browser
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup \
	  --cov=app --cov=workers --cov-report=term:skip-covered --cov-report=json:coverage.json

test: check pytest

bench: install
	for b in bench/[!_]*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache
