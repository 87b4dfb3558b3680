"""The registry's snapshot feed: the gateways' long poll over plain HTTP instead of a Ray call each.

Why: a Ray actor call costs the registry ~1 ms of CPU whatever it carries (threaded or asyncio
method alike), and every gateway asks after every change, so at 400 gateways one change a second
kept the registry at ~0.4 of a core (docs/benchmarks/bench_cluster.md). Here a waiting gateway is a
connection in a set: on a change the answer is pickled, signed and framed once, then written to each.

Why not uvicorn, which every other listener of this project runs: its cycle per request (an ASGI
task, its messages) cost ~150 µs per gateway per change here, most of the feed's cost; this server
knows one request shape, so it parses with httptools and answers from the event loop's callbacks,
with no task per request. It keeps the limits a listener needs (`MAX_CONNECTIONS`, a bounded head,
`HEAD_TIMEOUT_S` for a connection that sends no request, no body read, no pipelining).

Both directions are signed with the feed key (`keys.feed_key`, derived from Ray's token like every
capability): a request is an HMAC over its one header `ASK_HEADER`, which names the reader, the
version it has applied, the registry epoch, the wait and a date within `CLOCK_SKEW_S` (a header, not
a body: the server reads no body at all); an answer is an HMAC over the pickled snapshot, which the
gateway checks before unpickling anything. So a peer without Ray's token can neither read the routing table
here nor hand a gateway one. Nothing depends on the feed: a gateway that cannot use it long-polls
the registry through Ray as before (`ray_wing.registry_follower`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import pickle
import socket
import threading
import time
from collections.abc import Callable
from typing import cast

import httptools

from serving.control.records import Snapshot

FEED_PATH = "/registry/snapshot"
ASK_HEADER = (
    "x-serving-feed-ask"  # "reader since epoch wait date", epoch "-" when the reader has none
)
SIGNATURE_HEADER = "x-serving-feed-signature"
CLOCK_SKEW_S = 60.0  # a request dated further from the registry's clock is refused
MAX_ASK_BYTES = 512  # a reader's name, a version, an epoch, a wait and a date
MAX_WAIT_S = 30.0  # as `Registry.snapshot`'s long poll
HEAD_TIMEOUT_S = 10.0  # a connection with no request this long after it opened or was answered
MAX_HEAD_BYTES = 4096  # a request's line and headers
SWEEP_S = 0.5  # how often waits that ran out are answered 204, and silent connections closed
# Gateways hold one connection each; past this many, the feed refuses and they use Ray instead.
MAX_CONNECTIONS = 4096

__all__ = [
    "ASK_HEADER",
    "FEED_PATH",
    "SIGNATURE_HEADER",
    "FeedAnswerRefused",
    "FeedServer",
    "ask",
    "open_answer",
]


def _mac(key: bytes, body: bytes) -> str:
    return hmac.digest(key, body, hashlib.sha256).hex()


def ask(key: bytes, reader: str, since: int, epoch: str | None, wait_s: float) -> dict[str, str]:
    """A gateway's request: its headers (the ask and its signature). Names are this project's own
    (`gateway:<hex>`), so they hold no space."""
    value = f"{reader} {since} {epoch or '-'} {wait_s:.3f} {time.time():.3f}"
    return {ASK_HEADER: value, SIGNATURE_HEADER: _mac(key, value.encode("latin-1"))}


class FeedAnswerRefused(Exception):
    """An answer the gateway must not believe: unsigned, signed with another key, or not a
    snapshot."""


def open_answer(key: bytes, body: bytes, signature: str | None) -> Snapshot:
    """The snapshot in a feed's `200` answer, once its signature is checked (before unpickling)."""
    if signature is None or not hmac.compare_digest(_mac(key, body), signature):
        raise FeedAnswerRefused("the feed's answer is not signed with this cluster's feed key")
    snapshot = pickle.loads(body)
    if not isinstance(snapshot, dict) or "version" not in snapshot:
        raise FeedAnswerRefused("the feed's answer is not a snapshot")
    return cast(Snapshot, snapshot)


class FeedServer:
    """The feed's server, on an event loop of its own thread. The registry supplies its state through
    two callables, both safe to call from that thread: `current()` its snapshot now, with a key that
    changes whenever the snapshot does; `asked(reader, since, epoch)` what a reader has applied.
    `changed()` is called, from any thread, after every new version."""

    def __init__(
        self,
        key: bytes,
        current: Callable[[], tuple[object, Snapshot]],
        asked: Callable[[str, int, str | None], None],
        host: str,
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._key, self._current, self._asked = key, current, asked
        self.max_connections = max_connections
        self.refused = 0  # requests refused (unsigned, stale or malformed)
        self.connections: set[_Connection] = set()
        self.waiting: dict[_Connection, tuple[int, str | None, float]] = {}
        self._sealed: tuple[object, bytes] | None = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # raises at once if it cannot
        self._socket.listen(1024)
        self.port: int = self._socket.getsockname()[1]
        self._loop = _new_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{self.port}", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            self._loop.create_server(lambda: _Connection(self), sock=self._socket)
        )
        self._loop.call_later(SWEEP_S, self._sweep)
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for connection in list(self.connections):
                connection.close()
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    def changed(self) -> None:
        """A new version: answer every waiting request (from any thread)."""
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closing
                self._loop.call_soon_threadsafe(self._answer_waiting)

    def stop(self) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _answer(self) -> bytes:
        """This version's whole answer, pickled, signed and framed once for every reader."""
        key, snapshot = self._current()
        if self._sealed is None or self._sealed[0] != key:
            body = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
            head = (
                f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n"
                f"{SIGNATURE_HEADER}: {_mac(self._key, body)}\r\n\r\n"
            )
            self._sealed = (key, head.encode() + body)
        return self._sealed[1]

    def _answer_waiting(self) -> None:
        if not self.waiting:
            return
        snapshot, answer = self._current()[1], None
        for connection, (since, epoch, _) in list(self.waiting.items()):
            if _moved(snapshot, since, epoch):
                answer = answer or self._answer()
                del self.waiting[connection]
                connection.send(answer)

    def _sweep(self) -> None:
        """Answer 204 to the waits that ran out; close connections that sent no request in time."""
        self._loop.call_later(SWEEP_S, self._sweep)  # first: nothing below can stop the next sweep
        now = time.monotonic()
        for connection, (_, _, deadline) in list(self.waiting.items()):
            if now >= deadline:
                del self.waiting[connection]
                connection.send(_NO_CHANGE)
        for connection in list(self.connections):
            if connection not in self.waiting and now - connection.since > HEAD_TIMEOUT_S:
                connection.close()

    def request(self, connection: _Connection, ask: bytes | None, signature: bytes | None) -> None:
        """A whole request from `connection`: refused, answered at once, or held until a change."""
        parsed = self._verify(ask, signature)
        if parsed is None:
            self.refused += 1
            connection.send(_REFUSED, close=True)
            return
        reader, since, epoch, wait_s = parsed
        self._asked(reader, since, epoch)
        if _moved(self._current()[1], since, epoch):
            connection.send(self._answer())
        else:
            self.waiting[connection] = (since, epoch, time.monotonic() + wait_s)

    def _verify(
        self, ask: bytes | None, signature: bytes | None
    ) -> tuple[str, int, str | None, float] | None:
        """The ask's fields once its signature and date are checked; None otherwise."""
        if ask is None or signature is None or len(ask) > MAX_ASK_BYTES:
            return None
        if not hmac.compare_digest(_mac(self._key, ask).encode(), signature):
            return None
        try:
            reader, since, epoch, wait_s, date = ask.decode("latin-1").split(" ")
            if abs(time.time() - float(date)) > CLOCK_SKEW_S:
                return None
            wait = min(max(float(wait_s), 0.0), MAX_WAIT_S)
            return reader, int(since), None if epoch == "-" else epoch, wait
        except ValueError:  # not five fields, or not numbers
            return None


def _moved(snapshot: Snapshot, since: int, epoch: str | None) -> bool:
    """Whether `snapshot` is past version `since` of `epoch` (a new registry process always is)."""
    return since != snapshot["version"] or epoch not in (None, snapshot["epoch"])


class _Connection(asyncio.Protocol):
    """One gateway's connection: one request at a time, parsed by httptools."""

    def __init__(self, server: FeedServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.since = time.monotonic()  # opened, or last answered: a request is due
        self._head = 0
        self._url = b""
        self._ask: bytes | None = None
        self._signature: bytes | None = None
        self._busy = False  # a request is being answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if len(self.server.connections) >= self.server.max_connections:
            self.transport.close()
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.waiting.pop(self, None)

    def data_received(self, data: bytes) -> None:
        self._head += len(data)
        if self._busy or self._head > MAX_HEAD_BYTES:  # pipelined, or a head too long
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_message_begin(self) -> None:
        self._url, self._ask, self._signature = b"", None, None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == _ASK:
            self._ask = value
        elif name == _SIGNATURE:
            self._signature = value

    def on_body(self, body: bytes) -> None:
        self.close()  # the feed's requests have none

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self._busy:  # a second request in the same read, before the first was answered
            self.close()
            return
        self._busy = True
        if self._url != FEED_PATH.encode() or self.parser.get_method() != b"POST":
            self.send(_NOT_FOUND, close=True)
            return
        self.server.request(self, self._ask, self._signature)

    def send(self, answer: bytes, close: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(answer)
        self._busy, self._head, self.since = False, 0, time.monotonic()
        if close:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.new_event_loop()


def _plain(status: str, body: bytes, close: bool = False) -> bytes:
    connection = "connection: close\r\n" if close else ""
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{connection}\r\n".encode() + body


_ASK, _SIGNATURE = ASK_HEADER.encode(), SIGNATURE_HEADER.encode()
_NO_CHANGE = _plain("204 No Content", b"")
_REFUSED = _plain("403 Forbidden", b'{"error": "unsigned, stale or malformed request"}', close=True)
_NOT_FOUND = _plain("404 Not Found", b'{"error": "not found"}', close=True)
