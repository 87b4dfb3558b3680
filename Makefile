# The two set-up commands of the README, and what they build on.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test

$(BIN)/serving: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

install: $(BIN)/serving

demo: install
	$(BIN)/python examples/train_demo.py
	$(BIN)/python examples/demo.py

test: install
	$(BIN)/python -m pytest
