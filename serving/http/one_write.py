"""Send a response's head and its body in one socket write.

uvicorn writes a response's status line and headers in one `transport.write` and its body in the
next: two system calls, two TCP segments, and often two wake-ups of the peer, whose parser finds a
head without a body and waits again. That head write was a large share of the gateway's CPU under
load, paid again in each container (docs/benchmarks/bench_one_write.md). `HeldHeadTransport` keeps a
response's first write and sends it with the next one, or on the loop's next iteration if nothing
follows by then, so no response waits for its head longer than one loop pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["HeldHeadTransport"]


class HeldHeadTransport:
    """The transport seen by one response: its first write waits for the second (or one loop pass);
    the rest pass on."""

    __slots__ = ("_held", "_hold", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._hold = True  # the next write is the response's first (its head, or a 100 Continue)
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._hold:
            self._hold = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        held = self._held
        if held is None:
            self._transport.write(data)
        else:
            self._held = None
            # one writev on uvloop, without copying the body
            self._transport.writelines((held, data))

    def flush(self) -> None:
        """Send what is held now; dropped if the connection is already closing (the peer is
        gone)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # everything else uvicorn might ask of a transport
        return getattr(self._transport, name)
