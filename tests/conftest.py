"""What every tier shares: the suite's fixtures (tests/suite, as plugins) and an answer comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

# The suite's shared fixtures, by concern: trained models, shared endpoints, the session's endpoint server.
pytest_plugins = ["suite.models", "suite.endpoint_server", "suite.endpoints"]

ROOT = Path(__file__).resolve().parent.parent


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
