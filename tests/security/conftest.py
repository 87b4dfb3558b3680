"""Fixtures of the security tests: an identities file and gateways on loopback ports (see sec_harness)."""

from __future__ import annotations

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
