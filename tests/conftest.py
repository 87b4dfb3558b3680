"""What every tier shares: the suite's fixtures (tests/suite, as plugins, by tier) and an answer
comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

# Every tier's fixtures: the trained models.
pytest_plugins = ["suite.models"]
# The Ray tiers' fixtures: handler scripts, the S3 server and identities, the session's endpoint
# server and the endpoints several modules share. pytest reads `pytest_plugins` in this conftest
# only, so they load here too, but only when a run names a path outside tests/unit: the unit tier
# starts without them.
RAY_TIER_PLUGINS = [
    "suite.handlers",
    "suite.services",
    "suite.otlp",
    "suite.endpoint_server",
    "suite.endpoints",
]

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "tests" / "unit"


def pytest_configure(config: pytest.Config) -> None:
    here = config.invocation_params.dir
    paths = [(here / argument.split("::")[0]).resolve() for argument in config.args]
    if any(not path.is_relative_to(UNIT) for path in paths):
        for name in RAY_TIER_PLUGINS:
            config.pluginmanager.import_plugin(name)


def answers_match(got, want, atol: float = 1e-4) -> bool:
    """Nested JSON answers equal, numbers within `atol` (frameworks differ in the last float32
    bits)."""
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
