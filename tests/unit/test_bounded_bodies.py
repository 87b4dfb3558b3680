"""The one bounded body reader (serving/http/bodies.py) and the four routes that read bodies through
it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from serving.http.bodies import read_bounded


class TooLarge(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


class Ledger:
    """A hold that records what it was asked for and refuses past `cap`."""

    def __init__(self, cap: int = 1 << 30) -> None:
        self.cap, self.asked = cap, []

    def grow_to(self, size: int) -> None:
        self.asked.append(size)
        if size > self.cap:
            raise RuntimeError("over the budget")


async def _chunks(*parts: bytes, read: list[int] | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        if read is not None:
            read.append(len(part))
        yield part


def _read(
    *parts: bytes, limit: int, declared: str | None = None, hold: Ledger | None = None, read=None
) -> bytearray:
    return asyncio.run(
        read_bounded(_chunks(*parts, read=read), limit, TooLarge, declared=declared, hold=hold)
    )


def test_a_body_within_the_limit_is_read_whole_in_one_buffer() -> None:
    body = _read(b"ab", b"cd", b"e", limit=5)
    assert body == b"abcde" and isinstance(body, bytearray)


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read() -> None:
    read: list[int] = []
    with pytest.raises(TooLarge) as refused:
        _read(b"x" * 10, limit=5, declared="10", read=read)
    assert refused.value.size == 10 and read == []


def test_a_chunked_body_is_refused_as_it_passes_the_limit() -> None:
    read: list[int] = []
    with pytest.raises(TooLarge) as refused:
        _read(b"xxx", b"xxx", b"xxx", limit=5, read=read)
    assert refused.value.size is None and read == [3, 3]  # the third chunk is never asked for


def test_a_lying_declared_length_does_not_let_more_in() -> None:
    with pytest.raises(TooLarge):
        _read(b"xxxx", b"xxxx", limit=5, declared="4")


def test_the_hold_grows_by_the_declared_length_first_then_as_the_body_arrives() -> None:
    ledger = Ledger()
    _read(b"ab", b"cd", limit=10, declared="4", hold=ledger)
    assert ledger.asked == [4, 2, 4]
    chunked = Ledger()
    _read(b"ab", b"cd", limit=10, hold=chunked)
    assert chunked.asked == [2, 4]


def test_a_full_budget_refuses_before_reading() -> None:
    read: list[int] = []
    with pytest.raises(RuntimeError, match="over the budget"):
        _read(b"x" * 8, limit=10, declared="8", hold=Ledger(cap=4), read=read)
    assert read == []


@pytest.mark.parametrize("declared", ["", "abc", "-1", "1e3"])
def test_a_declared_length_that_is_no_number_is_ignored_and_the_body_counted(declared: str) -> None:
    assert _read(b"abc", limit=5, declared=declared) == b"abc"
    with pytest.raises(TooLarge):
        _read(b"abcdef", limit=5, declared=declared)


def test_every_route_that_reads_a_body_reads_it_through_the_one_reader() -> None:
    """Invocations, the API, `serving apply`'s spec route and Open Inference's index: no reader of
    their own."""
    import inspect

    from serving.gateway import control_routes, invocation
    from serving.open_inference import rest
    from serving.sagemaker_api import routes

    for module in (invocation, routes, control_routes, rest):
        source = inspect.getsource(module)
        assert "read_bounded(" in source, module.__name__
        assert "async for chunk in" not in source, module.__name__
