"""The one reader of a request body within a limit, for every way in (invocations, Open Inference,
the API, specs).

A body is refused by its declared length before a byte of it is read, and as soon as what arrived
passes the limit, so that it is never buffered beyond it; what is held before the sender is verified
is charged to a hold as it arrives (`gateway.body_budget`). A limit fixed here holds for every route
that reads a body.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Protocol

__all__ = ["Growing", "read_bounded"]


class Growing(Protocol):
    """A share of a budget that grows with the body (`gateway.body_budget.Hold`); raises when it
    cannot."""

    def grow_to(self, size: int) -> None: ...


async def read_bounded(
    chunks: AsyncIterable[bytes],
    limit: int,
    too_large: Callable[[int | None], Exception],
    *,
    declared: str | None = None,
    hold: Growing | None = None,
) -> bytearray:
    """The whole body in one bytearray (no list of chunks, no joined copy: a body costs its own size
    once), or `too_large(size)` raised: with the declared size when `declared` (Content-Length) is
    over the limit, with None when the body passes it as it arrives. Whatever the source raises (a
    client gone) passes through."""
    if declared is not None and declared.isdigit():
        size = int(declared)
        if size > limit:
            raise too_large(size)
        if hold is not None:
            hold.grow_to(size)  # refused before a byte is read if it cannot fit
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            raise too_large(None)
        if hold is not None:
            hold.grow_to(len(body) + len(chunk))  # a body without Content-Length: as it arrives
        body += chunk
    return body
