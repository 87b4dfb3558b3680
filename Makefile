# The two set-up commands of the README, and what they build on.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-slow test-all test-unit test-frameworks lint prometheus chromium

$(BIN)/serving: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

install: $(BIN)/serving

demo: install
	$(BIN)/python examples/train_demo.py
	$(BIN)/python examples/demo.py

# Every tier, by name (a bare `pytest` runs tests/unit only): the unit tier on both cores, then the tiers that share
# one embedded Ray (one process), then the two-node cluster.
TIERS := tests/unit tests/security tests/integration tests/e2e

test: install lint prometheus chromium
	$(BIN)/python -m pytest tests/unit -n 2
	$(BIN)/python -m pytest tests/security tests/integration tests/e2e --durations=15
	$(BIN)/python -m pytest -m multinode tests/multinode

# The long real runs kept out of `make test` (and CI: 51 min without them, 65 with): the trainer's six recipes on
# 2 workers, a worker killed mid-run, a killed run resumed to the same weights (~14 min: its serving test starts a server of its own).
test-slow: install
	$(BIN)/python -m pytest -m slow $(TIERS)

test-all: test test-slow

# Fast feedback: the unit tests that need no Ray and load no framework (torch, TensorFlow, ONNX Runtime, XGBoost, LightGBM).
test-unit: install
	$(BIN)/python -m pytest tests/unit -m 'not frameworks and not slow and not multinode' -n 2

test-frameworks: install
	$(BIN)/python -m pytest tests/unit -m frameworks

# Lint, format and types: what keeps the package map readable (CONTRIBUTING.md).
lint: install
	$(BIN)/ruff check serving tests loadtests examples
	$(BIN)/ruff format --check serving loadtests tests
	$(BIN)/mypy

# The metrics integration test scrapes the endpoint with a real Prometheus (Debian's package).
prometheus:
	@command -v prometheus >/dev/null || apt-get install -y --no-install-recommends prometheus >/dev/null \
		|| { apt-get update >/dev/null && apt-get install -y --no-install-recommends prometheus >/dev/null; } \
		|| echo "could not install prometheus (apt-get): tests/integration/test_metrics.py will fail"

# The console's browser test drives a real headless Chromium (Debian's package) with Playwright.
chromium:
	@command -v chromium >/dev/null || apt-get install -y --no-install-recommends chromium >/dev/null \
		|| { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; } \
		|| echo "could not install chromium (apt-get): tests/integration/test_console.py will fail"
