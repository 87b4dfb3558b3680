"""The registry's snapshot feed (`control.snapshot_feed`) and a gateway's follower of it
(`ray_wing.registry_follower`): the feed's real server on loopback, the gateway's real HTTP client,
raw sockets for what a client should not send. The registry is a plain object here (its state, and a
Ray long poll that records being used); the Ray tier runs the feed inside the real registry
(`test_a_registry_restart_keeps_every_endpoint_routable`), the multinode tier across hosts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from serving.control import snapshot_feed
from serving.control.snapshot_feed import ASK_HEADER, FEED_PATH, SIGNATURE_HEADER, FeedServer
from serving.gateway.hop_client import HopClient
from serving.ray_wing import registry_follower
from serving.ray_wing.registry_follower import RegistryFollower
from serving.trust import keys

ROOT = b"r" * 32


class FakeRegistry:
    """The registry's side of the feed: a version, an epoch, who asked; and Ray's `snapshot`, which
    answers at once and counts its calls (the fallback)."""

    def __init__(self) -> None:
        self.version, self.epoch, self.feed_url = 1, "e1", None
        self.asked: list[tuple[str, int, str | None]] = []
        self.ray_calls = 0
        self.lock = threading.Lock()
        self.feed = FeedServer(keys.feed_key(ROOT), self.current, self.note, "127.0.0.1")
        self.feed_url = f"http://127.0.0.1:{self.feed.port}"
        self.snapshot = self  # `registry.snapshot.remote(...)`

    def current(self) -> tuple[object, dict[str, Any]]:
        with self.lock:
            return self.version, {
                "version": self.version,
                "epoch": self.epoch,
                "feed": self.feed_url,
            }

    def note(self, reader: str, since: int, epoch: str | None) -> None:
        self.asked.append((reader, since, epoch))

    def bump(self) -> None:
        with self.lock:
            self.version += 1
        self.feed.changed()

    def remote(self, since: int, wait_s: float, epoch: str | None, reader: str) -> Any:
        self.ray_calls += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(self.current()[1])

        class Ref:
            def future(self) -> concurrent.futures.Future[Any]:
                return future

        return Ref()


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    registry = FakeRegistry()
    try:
        yield registry
    finally:
        registry.feed.stop()


def follower(registry: FakeRegistry, root: bytes = ROOT) -> RegistryFollower:
    reader = RegistryFollower(registry, "gateway:a", root)
    reader.learn({"version": 0, "epoch": "e1", "feed": registry.feed_url})  # type: ignore[typeddict-item]
    return reader


def test_a_long_poll_is_answered_by_the_feed_as_soon_as_the_registry_changes(registry) -> None:
    async def main() -> tuple[dict[str, Any] | None, float]:
        reader = follower(registry)
        started = time.monotonic()
        threading.Timer(0.3, registry.bump).start()
        snapshot = await reader.next(1, "e1", 5.0)
        reader.close()
        assert reader.via_feed == 1
        return snapshot, time.monotonic() - started  # type: ignore[return-value]

    snapshot, took = asyncio.run(main())
    assert snapshot is not None and snapshot["version"] == 2
    assert 0.25 < took < 3.0
    assert registry.asked == [("gateway:a", 1, "e1")] and registry.ray_calls == 0


def test_no_change_within_the_wait_is_no_snapshot_and_a_new_epoch_is_answered_at_once(
    registry,
) -> None:
    async def main() -> tuple[Any, Any]:
        reader = follower(registry)
        unchanged = await reader.next(1, "e1", 0.3)
        other_epoch = await reader.next(1, "e0", 5.0)  # a registry that restarted: at once
        reader.close()
        return unchanged, other_epoch

    unchanged, other_epoch = asyncio.run(main())
    assert unchanged is None and other_epoch["epoch"] == "e1"
    assert registry.ray_calls == 0


def post(url: str, body: bytes, headers: dict[str, str]) -> Any:
    host, port = url.removeprefix("http://").split(":")

    async def main() -> Any:
        client = HopClient()
        try:
            return await client.post(host, int(port), FEED_PATH, body, headers, 5.0)
        finally:
            client.close()

    return asyncio.run(main())


def _signed(value: str) -> dict[str, str]:
    return {
        ASK_HEADER: value,
        SIGNATURE_HEADER: snapshot_feed._mac(keys.feed_key(ROOT), value.encode()),
    }


@pytest.mark.parametrize(
    "case", ["unsigned", "other key", "stale", "altered", "malformed", "too large", "no ask"]
)
def test_a_request_without_the_feed_key_is_refused_before_anything_is_noted(registry, case) -> None:
    headers = snapshot_feed.ask(keys.feed_key(ROOT), "gateway:x", 0, None, 0.0)
    if case == "unsigned":
        del headers[SIGNATURE_HEADER]
    elif case == "other key":
        headers = snapshot_feed.ask(b"k" * 32, "gateway:x", 0, None, 0.0)
    elif case == "stale":
        headers = _signed(f"gateway:x 0 - 0.000 {time.time() - snapshot_feed.CLOCK_SKEW_S - 5:.3f}")
    elif case == "altered":
        headers[ASK_HEADER] = headers[ASK_HEADER].replace("gateway:x 0", "gateway:x 9")
    elif case == "malformed":
        headers = _signed(f"gateway:x zero - 0.000 {time.time():.3f}")
    elif case == "too large":
        headers = _signed(f"{'g' * snapshot_feed.MAX_ASK_BYTES} 0 - 0.000 {time.time():.3f}")
    elif case == "no ask":
        del headers[ASK_HEADER]
    answer = post(registry.feed_url, b"", headers)
    assert answer.status == 403 and SIGNATURE_HEADER not in answer.headers
    assert registry.asked == [] and registry.feed.refused == 1


def _raw(port: int, data: bytes, wait_s: float = 3.0) -> bytes:
    """What the feed answers `data` on a fresh connection before it closes (or `wait_s` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as connection:
        connection.sendall(data)
        received = b""
        with contextlib.suppress(TimeoutError):
            while chunk := connection.recv(65536):
                received += chunk
        return received


def _request(headers: dict[str, str], path: str = FEED_PATH, extra: bytes = b"") -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST {path} HTTP/1.1\r\nhost: feed\r\n{lines}".encode() + extra + b"\r\n"


@pytest.mark.parametrize("case", ["other path", "a body", "pipelined", "not http", "huge head"])
def test_a_request_the_feed_does_not_serve_closes_the_connection(registry, case) -> None:
    ask = snapshot_feed.ask(keys.feed_key(ROOT), "gateway:x", 1, "e1", 5.0)  # would wait
    data = {
        "other path": _request(ask, "/elsewhere"),
        "a body": _request(ask, extra=b"content-length: 4\r\n") + b"body",
        "pipelined": _request(ask) + _request(ask),
        "not http": b"\x16\x03\x01 hello\r\n\r\n",
        "huge head": _request({"x-pad": "p" * snapshot_feed.MAX_HEAD_BYTES, **ask}),
    }[case]
    started = time.monotonic()
    answer = _raw(registry.feed.port, data)
    assert time.monotonic() - started < 2.5  # closed, not held until the wait ends
    assert b"200 OK" not in answer and b"204" not in answer
    if case == "other path":
        assert answer.startswith(b"HTTP/1.1 404")
    assert not registry.feed.waiting


def test_a_connection_that_sends_no_request_is_closed(registry, monkeypatch) -> None:
    monkeypatch.setattr(snapshot_feed, "HEAD_TIMEOUT_S", 0.5)
    started = time.monotonic()
    assert _raw(registry.feed.port, b"", wait_s=10.0) == b""
    assert time.monotonic() - started < 3.0


def test_connections_past_the_cap_are_closed_at_once(registry) -> None:
    registry.feed.max_connections = 2
    held = [socket.create_connection(("127.0.0.1", registry.feed.port)) for _ in range(2)]
    try:
        time.sleep(0.2)
        started = time.monotonic()
        assert _raw(registry.feed.port, b"", wait_s=5.0) == b""
        assert time.monotonic() - started < 2.0
    finally:
        for connection in held:
            connection.close()


class Planted:
    """What unpickling a forged answer would run."""

    ran = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (Planted._run, ())

    @staticmethod
    def _run() -> None:
        Planted.ran = True


def test_an_answer_not_signed_with_the_feed_key_is_never_unpickled() -> None:
    # A peer posing as the feed (it need not hold Ray's token to listen on a port) hands the gateway
    # a pickle that runs code: the gateway checks the signature first, and asks Ray instead.
    forged = pickle.dumps(Planted())
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_once() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s: %s\r\n\r\n"
            % (len(forged), SIGNATURE_HEADER.encode(), b"0" * 64)
            + forged
        )
        connection.close()

    threading.Thread(target=serve_once, daemon=True).start()
    registry = FakeRegistry()
    registry.feed_url = f"http://127.0.0.1:{port}"

    async def main() -> Any:
        reader = follower(registry)
        snapshot = await reader.next(1, "e1", 1.0)
        reader.close()
        return snapshot, reader

    snapshot, reader = asyncio.run(main())
    listener.close()
    assert not Planted.ran
    assert registry.ray_calls == 1 and snapshot["version"] == 1 and reader.via_feed == 0


def test_a_gateway_that_cannot_reach_the_feed_uses_ray_then_tries_the_feed_again(
    registry, monkeypatch
) -> None:
    registry.feed_url = "http://127.0.0.1:1"  # nothing listens there
    clock = [100.0]
    monkeypatch.setattr(registry_follower.time, "monotonic", lambda: clock[0])

    async def main() -> RegistryFollower:
        reader = follower(registry)
        await reader.next(1, "e1", 1.0)  # refused: Ray
        await reader.next(1, "e1", 1.0)  # Ray for FEED_RETRY_S, not the feed again
        assert registry.ray_calls == 2
        clock[0] += registry_follower.FEED_RETRY_S + 1
        await reader.next(1, "e1", 1.0)  # the feed once more: refused again, so Ray
        reader.close()
        return reader

    reader = asyncio.run(main())
    assert registry.ray_calls == 3 and reader.via_feed == 0


def test_a_snapshot_naming_a_new_feed_is_followed_at_once(registry) -> None:
    # A registry that restarted opens its feed on a new port; a gateway on Ray meanwhile learns it
    # from the first snapshot and uses it for the next poll, not after FEED_RETRY_S.
    working = registry.feed_url
    registry.feed_url = "http://127.0.0.1:1"

    async def main() -> RegistryFollower:
        reader = follower(registry)
        registry.feed_url = working  # what Ray's answer names
        await reader.next(1, "e1", 1.0)  # feed refused: Ray, which names the working feed
        registry.bump()
        snapshot = await reader.next(1, "e1", 1.0)
        assert snapshot is not None and snapshot["version"] == 2
        reader.close()
        return reader

    reader = asyncio.run(main())
    assert registry.ray_calls == 1 and reader.via_feed == 1
