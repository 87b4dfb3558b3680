"""The gateway's gRPC server (serving.http.grpc_server) against grpcio's own client, and against raw
HTTP/2 frames for what a hostile peer can send: each on a real loopback port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import grpc
import hpack
import pytest
from grpc import aio

from serving.http import h2
from serving.http.grpc_server import GrpcAbort, GrpcCall, GrpcLimits, GrpcServer, StatusCode

SERVICE = "test.Echo"
Handler = Callable[[bytes, GrpcCall], Awaitable[bytes]]


@asynccontextmanager
async def serving(handlers: dict[str, Handler], **limits: int) -> AsyncIterator[GrpcServer]:
    server = GrpcServer(SERVICE, handlers, GrpcLimits(**limits))
    server.port = await server.start("127.0.0.1", 0)  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        await server.stop(0)


def method(server: GrpcServer, channel: aio.Channel, name: str) -> aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(f"/{SERVICE}/{name}")


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


async def echo(raw: bytes, call: GrpcCall) -> bytes:
    return raw


def test_a_call_carries_its_message_metadata_and_trailers() -> None:
    seen: list[GrpcCall] = []

    async def handler(raw: bytes, call: GrpcCall) -> bytes:
        seen.append(call)
        call.set_trailing_metadata((("x-trace-id", "abc"),))
        return raw[::-1]

    async def scenario() -> None:
        async with serving({"Reverse": handler}) as server:
            async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # type: ignore[attr-defined]
                call = method(server, channel, "Reverse")(
                    b"hello",
                    metadata=(("authorization", "Bearer k"), ("x-blob-bin", b"\x00\xff")),
                    timeout=5,
                )
                assert await call == b"olleh"
                assert tuple(await call.trailing_metadata()) == (("x-trace-id", "abc"),)
                assert await call.code() == grpc.StatusCode.OK
        metadata = dict(seen[0].invocation_metadata())
        assert seen[0].method == "Reverse"
        assert metadata["authorization"] == "Bearer k" and metadata["x-blob-bin"] == b"\x00\xff"
        assert "user-agent" in metadata  # as grpcio's servers give it
        assert not {"content-type", "te", "grpc-timeout", ":path"} & set(metadata)

    run(scenario)


def test_statuses_unknown_methods_and_failures_are_grpc_answers() -> None:
    async def refuse(raw: bytes, call: GrpcCall) -> bytes:
        raise GrpcAbort(StatusCode.PERMISSION_DENIED, "caller k may not — 100% sure")

    async def crash(raw: bytes, call: GrpcCall) -> bytes:
        raise ValueError("boom")

    async def no_bytes(raw: bytes, call: GrpcCall) -> bytes:
        return None  # type: ignore[return-value]  # an answer that cannot be written

    async def scenario() -> None:
        handlers = {"Refuse": refuse, "Crash": crash, "NoBytes": no_bytes, "Echo": echo}
        async with serving(handlers) as server:
            async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # type: ignore[attr-defined]
                for name, code, details in (
                    ("Refuse", grpc.StatusCode.PERMISSION_DENIED, "caller k may not — 100% sure"),
                    ("Crash", grpc.StatusCode.UNKNOWN, "Exception calling application: boom"),
                    (
                        "NoBytes",
                        grpc.StatusCode.UNKNOWN,
                        "Exception calling application: object of type 'NoneType' has no len()",
                    ),
                    ("Nope", grpc.StatusCode.UNIMPLEMENTED, f"Method not found: /{SERVICE}/Nope"),
                ):
                    with pytest.raises(aio.AioRpcError) as error:
                        await method(server, channel, name)(b"x", timeout=5)
                    assert (error.value.code(), error.value.details()) == (code, details)
                assert (
                    await method(server, channel, "Echo")(b"still serving", timeout=5)
                    == b"still serving"
                )

    run(scenario)


def test_messages_larger_than_every_window_cross_both_ways() -> None:
    big = bytes(range(256)) * 12_000  # 3 MB: past the stream's and the connection's first windows

    async def scenario() -> None:
        async with serving({"Echo": echo}, max_message=4_000_000) as server:
            options = [("grpc.max_receive_message_length", 8_000_000)]
            async with aio.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:  # type: ignore[attr-defined]
                answers = await asyncio.gather(
                    *(method(server, channel, "Echo")(big, timeout=20) for _ in range(3))
                )
                assert all(answer == big for answer in answers)
                with pytest.raises(aio.AioRpcError) as error:
                    await method(server, channel, "Echo")(big + big, timeout=20)
                assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert await method(server, channel, "Echo")(b"after", timeout=5) == b"after"
            assert server.calls == 0

    run(scenario)


def test_calls_past_the_limit_are_refused_and_a_deadline_or_cancel_stops_the_handler() -> None:
    release = asyncio.Event()
    cancelled: list[str] = []

    async def hold(raw: bytes, call: GrpcCall) -> bytes:
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(raw.decode())
            raise
        return raw

    async def scenario() -> None:
        async with serving({"Hold": hold}, max_calls=2) as server:
            async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # type: ignore[attr-defined]
                hold_call = method(server, channel, "Hold")
                held = [asyncio.ensure_future(hold_call(b"a", timeout=10)) for _ in range(2)]
                while server.calls < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(aio.AioRpcError) as refused:
                    await hold_call(b"c", timeout=5)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                release.set()
                assert await asyncio.gather(*held) == [b"a", b"a"]
                release.clear()
                with pytest.raises(aio.AioRpcError) as late:
                    await hold_call(b"deadline", timeout=0.3)
                assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                gone = hold_call(b"cancel", timeout=10)
                while server.calls < 1:
                    await asyncio.sleep(0.01)
                gone.cancel()
                for _ in range(200):
                    if server.calls == 0 and len(cancelled) == 2:
                        break
                    await asyncio.sleep(0.01)
        assert sorted(cancelled) == ["cancel", "deadline"] and server.calls == 0

    run(scenario)


# --- a hostile peer, frame by frame ----------------------------------------------------------------
def _request_headers(encoder: hpack.Encoder, name: str = "Echo", extra: int = 0) -> bytes:
    fields = [
        (":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/{name}"),
        (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
    ] + [(f"x-{index}", "v" * 20) for index in range(extra)]  # fmt: skip
    return encoder.encode(fields)


async def _raw(port: int, frames: bytes) -> tuple[bytes, asyncio.StreamWriter]:
    """Send the preface and `frames`; what the server answered until it closed (or 2 s passed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(h2.PREFACE + h2.settings({}) + frames)
    answer = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 2):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return answer, writer


def _goaway_code(answer: bytes) -> int | None:
    at = 0
    while at + 9 <= len(answer):
        length, kind = int.from_bytes(answer[at : at + 3], "big"), answer[at + 3]
        if kind == h2.GOAWAY:
            return int.from_bytes(answer[at + 13 : at + 17], "big")
        at += 9 + length
    return None


@pytest.mark.parametrize(
    "attack, code",
    [
        ("continuation_flood", h2.ENHANCE_YOUR_CALM),
        ("rapid_reset", h2.ENHANCE_YOUR_CALM),
        ("oversized_frame", h2.FRAME_SIZE_ERROR),
        ("data_on_an_idle_stream", h2.PROTOCOL_ERROR),
        ("bad_hpack", h2.COMPRESSION_ERROR),
        ("push_promise", h2.PROTOCOL_ERROR),
        ("window_overflow", h2.FLOW_CONTROL_ERROR),
    ],
)
def test_a_peer_breaking_the_protocol_loses_its_connection_and_others_are_served(
    attack: str, code: int
) -> None:
    encoder = hpack.Encoder()  # the server's decoder sees every block this one encodes, in order
    frames = {
        "continuation_flood": lambda: (
            h2.frame(h2.HEADERS, 0, 1, _request_headers(encoder))
            + b"".join(h2.frame(h2.CONTINUATION, 0, 1, b"\x00" * 16_000) for _ in range(8))
        ),
        "rapid_reset": lambda: b"".join(
            h2.frame(h2.HEADERS, h2.END_HEADERS, stream, _request_headers(encoder))
            + h2.rst_stream(stream, h2.CANCEL)
            for stream in range(1, 2 * 500, 2)
        ),
        "oversized_frame": lambda: h2.frame(h2.DATA, 0, 1, b"\x00" * 20_000),
        "data_on_an_idle_stream": lambda: h2.frame(h2.DATA, 0, 7, b"\x00" * 5),
        "bad_hpack": lambda: h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\x7f"),
        "push_promise": lambda: h2.frame(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00" * 4),
        "window_overflow": lambda: h2.window_update(0, 2**31 - 1),
    }[attack]()

    async def scenario() -> None:
        async with serving({"Echo": echo}) as server:
            port = server.port  # type: ignore[attr-defined]
            answer, writer = await _raw(port, frames)
            assert _goaway_code(answer) == code
            assert writer.transport.is_closing() or not server.connections
            writer.close()
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert await method(server, channel, "Echo")(b"ok", timeout=5) == b"ok"
            assert server.calls == 0

    run(scenario)


def test_a_peer_that_does_not_read_cannot_make_the_server_buffer() -> None:
    """1,000,000 PINGs, each owed an ACK, from a peer that reads nothing: the server stops reading once
    its output backs up, so what it holds stays bounded."""

    async def scenario() -> None:
        async with serving({"Echo": echo}) as server:
            port = server.port  # type: ignore[attr-defined]
            peer = socket.create_connection(("127.0.0.1", port))
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            peer.setblocking(False)
            flood = h2.PREFACE + h2.settings({}) + h2.frame(h2.PING, 0, 0, b"12345678") * 1_000_000
            loop = asyncio.get_running_loop()
            sent = 0
            try:
                while sent < len(flood):
                    chunk = flood[sent : sent + 65536]
                    await asyncio.wait_for(loop.sock_sendall(peer, chunk), 1)
                    sent += len(chunk)
            except TimeoutError:
                pass  # the server stopped reading: the kernel's buffers are full
            await asyncio.sleep(0.2)
            (connection,) = server.connections
            assert connection.transport is not None
            assert connection.transport.get_write_buffer_size() < 1 << 20
            assert sent < len(flood), "the whole flood was read: nothing pushed back"
            peer.close()

    run(scenario)


def test_stopping_lets_running_calls_finish_and_refuses_new_ones() -> None:
    async def slow(raw: bytes, call: GrpcCall) -> bytes:
        await asyncio.sleep(0.3)
        return raw

    async def scenario() -> None:
        server = GrpcServer(SERVICE, {"Slow": slow}, GrpcLimits())
        port = await server.start("127.0.0.1", 0)
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            running = asyncio.ensure_future(
                channel.unary_unary(f"/{SERVICE}/Slow")(b"x", timeout=5)
            )
            while server.calls < 1:
                await asyncio.sleep(0.01)
            await server.stop(5)
            assert await running == b"x"
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    run(scenario)


def test_a_cached_header_block_follows_the_peers_table() -> None:
    """An indexed-only block means other fields once the peer's table changes: the cache must not
    answer the old ones."""
    encoder = hpack.Encoder()
    blocks = h2.HeaderBlocks(16_384, lambda fields: fields)
    blocks.decode(encoder.encode([("x-key", "1")]))  # the table's newest entry (62): x-key: 1
    assert blocks.decode(b"\xbe") == ((b"x-key", b"1"),)
    blocks.decode(encoder.encode([("x-key", "2")]))  # 62 is now x-key: 2
    assert blocks.decode(b"\xbe") == ((b"x-key", b"2"),)


def test_connections_past_the_limit_are_closed_as_accepted() -> None:
    async def scenario() -> None:
        async with serving({"Echo": echo}, max_connections=1) as server:
            port = server.port  # type: ignore[attr-defined]
            first_reader, first = await asyncio.open_connection("127.0.0.1", port)
            assert (await asyncio.wait_for(first_reader.read(9), 2))[3] == h2.SETTINGS
            second_reader, second = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(second_reader.read(9), 2) == b""  # closed, no SETTINGS
            first.close()
            second.close()
            for _ in range(100):
                if not server.connections:
                    break
                await asyncio.sleep(0.01)
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert await method(server, channel, "Echo")(b"ok", timeout=5) == b"ok"

    run(scenario)
