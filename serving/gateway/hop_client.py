"""The gateway's HTTP/1.1 client for plain (unstreamed) hops: pooled keep-alive connections,
httptools' parser.

Why not aiohttp, which streams still use (`transport.HopStream`): it cost several times the client
CPU per hop (commit 9360810 has the measurement). A hop is the one request shape the gateway sends:
`POST`, a body of known length, an answer read whole. So this client does only that. A replica on
the gateway's own machine is reached through the Unix socket beside its data port, where the
gateway's settings allow it (`hop_unix_socket`) and the socket is there (`http.local_socket`).

What a caller can tell apart (the transport's retry rules, docs/reliability.md):
- `HopRefused`: no connection could be made (the replica is gone);
- `HopLost(answered=False)`: the connection closed or reset before any byte of an answer (safe to
  retry);
- `HopLost(answered=True)`: it broke after the answer began, or the answer was not HTTP (never
  retried);
- `TimeoutError`: past the caller's deadline (the connection is closed, never reused). Header values
  go out as the bytes they arrived as (latin-1, as Starlette decodes them), so what the container
  reads is what the gateway signed; a value with CR or LF is refused (`ValueError`), never sent.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Mapping
from typing import cast

import httptools

from serving.http import local_socket

# an idle connection older than this is closed rather than reused (uvicorn closes at 75 s)
IDLE_S = 30.0
MAX_IDLE = 256  # idle connections kept per replica; more are closed when they come back


class HopRefused(Exception):
    """No connection to the replica could be made."""


class HopLost(Exception):
    """The connection broke (or the answer was not HTTP); `answered`: whether any byte of the answer
    had arrived."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class HopAnswer:
    """A container's answer: status, headers (lower-case names) and the whole body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[HopAnswer] | None = None
        self._answered = False
        self._header_name = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's is not an asyncio.Transport subclass
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(HopLost(f"not an HTTP answer: {error}", answered=True))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        why = str(exc) if exc else "closed by the container"
        self._fail(HopLost(f"connection lost: {why}", answered=self._answered))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name:
            self._header_name = name
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        else:  # a continuation of the previous header's value
            key = self._header_name.decode("latin-1").lower()
            self._headers[key] += value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        answer = HopAnswer(self._parser.get_status_code(), self._headers, b"".join(self._body))
        if not self._parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # the client's side
    def send(self, request: bytes) -> asyncio.Future[HopAnswer]:
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._answered, self._headers, self._body = False, {}, []
        self.transport.write(request)
        return self._waiter

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    @property
    def reusable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _head(authority: str, path: str, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {authority}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise ValueError(f"header {name!r}: a line break or colon where none may be")
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
            lines.append(f"{name}: {value}")
    lines.append(f"content-length: {length}")
    text = "\r\n".join(lines) + "\r\n\r\n"
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # a value that never came from an HTTP request: its UTF-8 bytes
        return text.encode("utf-8", "surrogateescape")


class HopClient:
    """Keep-alive connections per replica (host, port), reused one request at a time; no limit on
    how many: the transport bounds requests in flight per replica.

    `unix_sockets`: reach a replica on this machine through the Unix socket beside its data port
    (`http.local_socket`) when there is one; TCP otherwise, and for good once its Unix socket
    refuses."""

    def __init__(self, unix_sockets: bool = False) -> None:
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._closed = False
        self._unix = unix_sockets
        self._unix_paths: dict[tuple[str, int], str | None] = {}  # None: TCP for this replica

    async def post(
        self,
        host: str,
        port: int,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        timeout: float,
    ) -> HopAnswer:
        """POST `body` and read the whole answer, all within `timeout` seconds."""
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = _head(authority, path, headers, len(body)) + body
        connection: _Connection | None = None
        try:
            async with asyncio.timeout(timeout):
                connection = await self._connection(host, port)
                answer = await connection.send(request)
        except BaseException:
            if connection is not None:
                connection.close()  # a half-read answer must not be read by the next request
            raise
        self._release((host, port), connection)
        return answer

    async def _connection(self, host: str, port: int) -> _Connection:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to have been closed
            if connection.reusable and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        path = self._unix_path(host, port)
        if path is not None:
            try:
                _, unix = await loop.create_unix_connection(_Connection, path)
                return unix
            # none there (another node), or left by a replica that died: TCP decides
            except OSError:
                self._unix_paths[(host, port)] = None
        try:
            _, protocol = await loop.create_connection(_Connection, host, port)
        except OSError as error:
            raise HopRefused(f"cannot connect to {host}:{port}: {error}") from None
        return protocol

    def _unix_path(self, host: str, port: int) -> str | None:
        if not self._unix:
            return None
        key = (host, port)
        if key not in self._unix_paths:
            path = local_socket.path_for(host, port)
            self._unix_paths[key] = path if path is not None and os.path.exists(path) else None
        return self._unix_paths[key]

    def _release(self, key: tuple[str, int], connection: _Connection) -> None:
        if self._closed or not connection.reusable:
            connection.close()
            return
        idle = self._idle.setdefault(key, deque())
        if len(idle) >= MAX_IDLE:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def keep_only(self, replicas: set[tuple[str, int]]) -> None:
        """Close the idle connections to replicas no longer in the table."""
        for key in [key for key in self._idle if key not in replicas]:
            for connection in self._idle.pop(key):
                connection.close()
        for key in [key for key in self._unix_paths if key not in replicas]:
            del self._unix_paths[key]

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


__all__ = ["HopAnswer", "HopClient", "HopLost", "HopRefused"]
