"""Shared test helpers: demo models trained from scikit-learn's bundled datasets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _train_demo():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "examples" / "train_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory) -> Path:
    """The README demo's models, trained once per test session into a temp folder."""
    out = tmp_path_factory.mktemp("demo-models")
    _train_demo()(out)
    return out
