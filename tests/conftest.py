"""Shared test helpers: demo models trained from scikit-learn's bundled datasets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from server_fixtures import *  # noqa: F401,F403  (the shared endpoint server and what it serves)

ROOT = Path(__file__).resolve().parent.parent


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_demo():
    return _example("train_demo").train


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory) -> Path:
    """The README demo's models, trained once per test session into a temp folder."""
    out = tmp_path_factory.mktemp("demo-models")
    _train_demo()(out)
    return out


@pytest.fixture(scope="session")
def hetero_models(tmp_path_factory) -> Path:
    """The heterogeneous demo's models (sklearn, PyTorch, TensorFlow, ONNX, Python), trained once per session.

    `expected.json` in the folder holds each model's sample request and the answer it must give.
    """
    out = tmp_path_factory.mktemp("hetero-models")
    _example("train_hetero").train(out)
    return out


@pytest.fixture(scope="session")
def hetero_expected(hetero_models) -> dict:
    """Per model folder of `hetero_models`: {"request", "response", "classes"} (see examples/train_hetero.py)."""
    return json.loads((hetero_models / "expected.json").read_text())


def answers_match(got, want, atol: float = 1e-4) -> bool:
    """Nested JSON answers equal, numbers within `atol` (frameworks differ in the last float32 bits)."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(answers_match(got[k], want[k], atol) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(answers_match(g, w, atol) for g, w in zip(got, want))
        )
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(got, (int, float)) and abs(got - want) <= atol
    return got == want


@pytest.fixture(scope="session")
def answer_matches():
    """`answer_matches(got, want)`: nested JSON equality with a float tolerance."""
    return answers_match
