"""Fixtures of the security tests: an identities file and gateways on loopback ports (see
sec_harness)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from sec_harness import Stack, echo_container, write_identities


@pytest.fixture(scope="session")
def identities(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_identities(tmp_path_factory.mktemp("sec-identities"))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = Stack()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def echo_url(stack: Stack) -> str:
    return stack.serve(echo_container)


@pytest.fixture(scope="module")
def table(echo_url: str) -> dict[tuple[str, str], list[str]]:
    return {("secure", "echo"): [echo_url], ("open", "echo"): [echo_url]}


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serving.ray_wing` replaced by a trap: a command that should refuse before starting Ray fails
    the test if it goes on to it."""

    def went_on(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        pytest.fail(f"serving server went on to serving.ray_wing.{name}")

    trap = types.ModuleType("serving.ray_wing")
    trap.__getattr__ = went_on  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "serving.ray_wing", trap)
    monkeypatch.setattr("serving.ray_wing", trap, raising=False)
