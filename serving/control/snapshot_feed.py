"""The registry's snapshot feed: the gateways' long poll over plain HTTP instead of a Ray call each.

Why: a Ray actor call costs the registry ~1 ms of CPU whatever it carries (threaded or asyncio
method alike), and every gateway asks after every change, so at 400 gateways one change a second
kept the registry at ~0.4 of a core (docs/benchmarks/bench_cluster.md). Here each waiting gateway
costs one HTTP request on a uvicorn loop, and the answer is pickled and signed once per version for
all of them.

Both directions are signed with the feed key (`keys.feed_key`, derived from Ray's token like every
capability): a request is an HMAC over its body, which names the reader, the version it has applied
and a date within `CLOCK_SKEW_S`; an answer is an HMAC over the pickled snapshot, which the gateway
checks before unpickling anything. So a peer without Ray's token can neither read the routing table
here nor hand a gateway one. Nothing depends on the feed: a gateway that cannot use it long-polls
the registry through Ray as before (`ray_wing.registry_follower`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from serving.control.records import Snapshot

FEED_PATH = "/registry/snapshot"
SIGNATURE_HEADER = "x-serving-feed-signature"
CLOCK_SKEW_S = 60.0  # a request dated further from the registry's clock is refused
MAX_ASK_BYTES = 1024  # a request names a reader, two versions, a wait and a date
MAX_WAIT_S = 30.0  # as `Registry.snapshot`'s long poll
# Gateways hold one connection each; past this many, the feed refuses and they use Ray instead.
MAX_CONNECTIONS = 4096

__all__ = [
    "FEED_PATH",
    "SIGNATURE_HEADER",
    "FeedAnswerRefused",
    "SnapshotFeed",
    "ask",
    "open_answer",
]


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def ask(key: bytes, reader: str, since: int, epoch: str | None, wait_s: float) -> tuple[bytes, str]:
    """A gateway's request: its body and the signature header's value."""
    body = json.dumps(
        {"reader": reader, "since": since, "epoch": epoch, "wait": wait_s, "date": time.time()}
    ).encode()
    return body, _mac(key, body)


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


class SnapshotFeed:
    """The ASGI app of the feed. The registry supplies its state through two callables, both safe
    to call from the feed's thread: `current()` its snapshot now, with a key that changes whenever
    the snapshot does; `asked(reader, since, epoch)` what a reader has applied. `changed()` is
    called, from any thread, after every new version."""

    def __init__(
        self,
        key: bytes,
        current: Callable[[], tuple[object, Snapshot]],
        asked: Callable[[str, int, str | None], None],
    ) -> None:
        self._key, self._current, self._asked = key, current, asked
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._sealed: tuple[object, bytes, str] | None = None
        self._seal_lock = threading.Lock()
        self.refused = 0  # requests refused (unsigned, stale or malformed)

    def changed(self) -> None:
        """A new version: wake every waiting request (from any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    def _seal(self) -> tuple[bytes, str]:
        """This version's answer, pickled and signed once for every reader."""
        key, snapshot = self._current()
        with self._seal_lock:
            if self._sealed is None or self._sealed[0] != key:
                body = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
                self._sealed = (key, body, _mac(self._key, body))
            return self._sealed[1], self._sealed[2]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != FEED_PATH or scope["method"] != "POST":
            await _answer(send, 404, b'{"error": "not found"}')
            return
        request = await self._read(scope, receive)
        if request is None:
            self.refused += 1
            await _answer(send, 403, b'{"error": "unsigned, stale or malformed request"}')
            return
        reader, since, epoch, wait_s = request
        self._asked(reader, since, epoch)
        if not await self._wait_change(since, epoch, wait_s):
            await _answer(send, 204, b"")
            return
        body, signature = self._seal()
        await _answer(send, 200, body, ((SIGNATURE_HEADER.encode(), signature.encode()),))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _read(
        self, scope: dict[str, Any], receive: Any
    ) -> tuple[str, int, str | None, float] | None:
        """The request's fields once its signature and date are checked; None otherwise."""
        signature = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == SIGNATURE_HEADER.encode()),
            None,
        )
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_ASK_BYTES:
                return None
            if not message.get("more_body"):
                break
        if signature is None or not hmac.compare_digest(_mac(self._key, body), signature):
            return None
        try:
            fields = json.loads(body)
            reader, since, epoch = str(fields["reader"]), int(fields["since"]), fields["epoch"]
            wait_s, date = float(fields["wait"]), float(fields["date"])
        except (ValueError, KeyError, TypeError):
            return None
        if abs(time.time() - date) > CLOCK_SKEW_S or not (epoch is None or isinstance(epoch, str)):
            return None
        return reader, since, epoch, min(max(wait_s, 0.0), MAX_WAIT_S)

    async def _wait_change(self, since: int, epoch: str | None, wait_s: float) -> bool:
        """Whether the registry moved past `since` of `epoch` within `wait_s` (the long poll)."""
        deadline = time.monotonic() + wait_s
        while True:
            event = self._event  # taken before the check: a change after it sets this very event
            snapshot = self._current()[1]
            if since != snapshot["version"] or epoch not in (None, snapshot["epoch"]):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or event is None:
                return False
            try:
                async with asyncio.timeout(remaining):  # no task of its own, unlike wait_for
                    await event.wait()
            except TimeoutError:
                return False


async def _answer(
    send: Any, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})
