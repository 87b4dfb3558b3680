"""The gateway's lean HTTP/1.1 hop client (`serving.gateway.hop_client`) against a scripted loopback
server.

The server is a real asyncio TCP server on 127.0.0.1 whose answer to each request the test chooses
(a normal answer, a close before or during the answer, bytes that are not HTTP, silence), and which
records what arrived and on how many connections. The transport's retry rules rest on telling these
cases apart.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from serving.gateway.hop_client import HopClient, HopLost, HopRefused

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-extra: 1\r\ncontent-length: 5\r\n\r\n[1,2]"

# False: close the connection
Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


class Scripted:
    """A loopback server answering request i with behaviours[i] (the last one repeats)."""

    def __init__(self, behaviours: list[Behaviour]) -> None:
        self.behaviours = behaviours
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    self.requests.append(await read_request(reader))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                behaviour = self.behaviours[min(len(self.requests), len(self.behaviours)) - 1]
                if not await behaviour(reader, writer):
                    return
        finally:
            writer.close()


def answer(raw: bytes = OK) -> Behaviour:
    async def behave(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return b"connection: close" not in raw.lower()

    return behave


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    return False


async def close_mid_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(OK[:40])
    await writer.drain()
    return False


async def silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(5)
    return False


def run(coroutine: Awaitable[object]) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_sequential_hops_share_one_connection_and_read_the_whole_answer() -> None:
    async def scenario() -> None:
        async with Scripted([answer()]) as server:
            client = HopClient()
            for _ in range(3):
                got = await client.post(
                    "127.0.0.1", server.port, "/invocations", b"[[1]]", {"accept": "a/b"}, 5
                )
                assert (
                    got.status,
                    got.body,
                    got.headers["content-type"],
                    got.headers["x-extra"],
                ) == (
                    200,
                    b"[1,2]",
                    "application/json",
                    "1",
                )
            assert server.connections == 1
            request = server.requests[0]
            assert request.startswith(b"POST /invocations HTTP/1.1\r\n")
            assert b"\r\naccept: a/b\r\n" in request and b"\r\ncontent-length: 5\r\n" in request
            assert request.endswith(b"\r\n\r\n[[1]]")
            client.close()

    run(scenario())


def test_a_refused_connection_is_told_apart() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(HopRefused):
        run(HopClient().post("127.0.0.1", port, "/invocations", b"", {}, 5))


@pytest.mark.parametrize(
    ("behaviour", "answered"),
    [(close_at_once, False), (close_mid_answer, True), (answer(b"SMTP ready\r\n\r\n"), True)],
    ids=["closed before any answer", "closed mid-answer", "not HTTP"],
)
def test_a_broken_hop_says_whether_the_answer_had_begun(
    behaviour: Behaviour, answered: bool
) -> None:
    async def scenario() -> None:
        async with Scripted([behaviour, answer()]) as server:
            client = HopClient()
            with pytest.raises(HopLost) as lost:
                await client.post("127.0.0.1", server.port, "/invocations", b"x", {}, 5)
            assert lost.value.answered is answered
            # a fresh connection
            got = await client.post("127.0.0.1", server.port, "/invocations", b"x", {}, 5)
            assert got.status == 200 and server.connections == 2
            client.close()

    run(scenario())


def test_a_timed_out_connection_is_never_reused() -> None:
    async def scenario() -> None:
        async with Scripted([silence, answer()]) as server:
            client = HopClient()
            with pytest.raises(TimeoutError):
                await client.post("127.0.0.1", server.port, "/invocations", b"x", {}, 0.2)
            got = await client.post("127.0.0.1", server.port, "/invocations", b"x", {}, 5)
            # not the late answer to the first request
            assert (got.status, got.body) == (200, b"[1,2]")
            assert server.connections == 2
            client.close()

    run(scenario())


def test_connection_close_and_a_closed_idle_connection_open_a_new_one() -> None:
    closing = OK.replace(b"x-extra: 1", b"connection: close")

    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await answer()(reader, writer)
        return False  # as uvicorn does with a connection idle past its keep-alive

    async def scenario() -> None:
        async with Scripted([answer(closing), answer_then_close, answer()]) as server:
            client = HopClient()
            statuses = []
            for _ in range(3):
                statuses.append(
                    (await client.post("127.0.0.1", server.port, "/", b"x", {}, 5)).status
                )
                await asyncio.sleep(0.2)  # the close reaches the client before its next request
            assert statuses == [200, 200, 200]
            assert server.connections == 3
            client.close()

    run(scenario())


def test_header_values_keep_their_bytes_and_line_breaks_are_refused() -> None:
    async def scenario() -> None:
        async with Scripted([answer()]) as server:
            client = HopClient()
            await client.post("127.0.0.1", server.port, "/", b"x", {"x-attributes": "caf\xe9"}, 5)
            # one byte, as Starlette decoded it
            assert b"\r\nx-attributes: caf\xe9\r\n" in server.requests[0]
            for bad in ({"x-a": "1\r\nx-admin: true"}, {"x-a\nb": "1"}):
                with pytest.raises(ValueError, match="line break"):
                    await client.post("127.0.0.1", server.port, "/", b"x", bad, 5)
            assert len(server.requests) == 1  # nothing was sent for them
            client.close()

    run(scenario())
