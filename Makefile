# The two set-up commands of the README, and what they build on.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-unit lint prometheus

$(BIN)/serving: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

install: $(BIN)/serving

demo: install
	$(BIN)/python examples/train_demo.py
	$(BIN)/python examples/demo.py

test: install lint prometheus
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest -m multinode tests/multinode

# Fast feedback: the tests that need no Ray (seconds to a minute).
test-unit: install
	$(BIN)/python -m pytest tests/unit

# Lint, format and types: what keeps the package map readable (CONTRIBUTING.md).
lint: install
	$(BIN)/ruff check serving tests loadtests examples
	$(BIN)/ruff format --check serving
	$(BIN)/mypy

# The metrics integration test scrapes the endpoint with a real Prometheus (Debian's package).
prometheus:
	@command -v prometheus >/dev/null || apt-get install -y --no-install-recommends prometheus >/dev/null \
		|| { apt-get update >/dev/null && apt-get install -y --no-install-recommends prometheus >/dev/null; } \
		|| echo "could not install prometheus (apt-get): tests/integration/test_metrics.py will fail"

