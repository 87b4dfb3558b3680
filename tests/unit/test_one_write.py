"""A response's head goes out with its body in one write (serving.http.one_write), through a real
uvicorn server.

The write count is the server thread's own `syscw` (/proc/self/task/TID/io): every socket write of
the server's event loop, and nothing of the client's, which runs on this test's thread.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route

from serving.http.server import BackgroundServer

BIG = bytes(range(256)) * 8192  # 2 MiB


async def plain(request):
    return Response(b'{"ok": 1}', media_type="application/json")


async def big(request):
    return Response(BIG, media_type="application/octet-stream")


async def empty(request):
    return Response(status_code=204)


async def slow_stream(request):
    async def chunks():
        await asyncio.sleep(1.0)
        yield b"late"

    return StreamingResponse(chunks(), media_type="text/plain")


async def broken(scope, receive, send):
    """Declares a body it never sends: uvicorn closes the connection, which must still send the held
    head."""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]}
    )
    raise RuntimeError("the app failed after its head")


app = Starlette(
    routes=[
        Route("/plain", plain, methods=["POST", "GET", "HEAD"]),
        Route("/big", big),
        Route("/empty", empty),
        Route("/slow", slow_stream),
        Mount("/broken", app=broken),
    ]
)


@pytest.fixture(scope="module")
def server():
    server = BackgroundServer(app)
    assert server.wait_started()
    yield server
    server.stop()


def _writes(server: BackgroundServer) -> int:
    text = Path(f"/proc/self/task/{server._thread.native_id}/io").read_text()
    return int(dict(line.split(": ") for line in text.splitlines())["syscw"])


def test_each_response_is_one_write(server):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    for _ in range(5):  # warm: the connection exists, the route is known
        connection.request("POST", "/plain", body=b"[1]")
        connection.getresponse().read()
    before, n = _writes(server), 100
    for _ in range(n):
        connection.request("POST", "/plain", body=b"[1]")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b'{"ok": 1}'
    per_response = (_writes(server) - before) / n
    assert per_response <= 1.05, (
        f"{per_response} socket writes per response (head and body apart: 2)"
    )


def test_large_body_head_and_empty_responses_are_whole(server):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    connection.request("GET", "/big")
    response = connection.getresponse()
    assert response.status == 200 and response.read() == BIG
    connection.request("HEAD", "/plain")
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b""
    connection.request("GET", "/empty")
    response = connection.getresponse()
    assert response.status == 204 and response.read() == b""
    connection.request("POST", "/plain", body=b"[1]")  # the same keep-alive connection still works
    assert connection.getresponse().read() == b'{"ok": 1}'


def _recv_until(sock: socket.socket, marker: bytes, deadline: float) -> bytes:
    data = b""
    while marker not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_a_streamed_head_does_not_wait_for_its_first_chunk(server):
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        head = _recv_until(sock, b"\r\n\r\n", started + 0.8)  # the chunk comes after 1 s
        assert head.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in head, head
        assert time.monotonic() - started < 0.8
        rest = _recv_until(sock, b"late", started + 5)
        assert b"late" in head + rest


def test_a_head_whose_body_never_comes_is_sent_before_the_close(server):
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"GET /broken/ HTTP/1.1\r\nhost: x\r\n\r\n")
        started = time.monotonic()
        data = _recv_until(sock, b"never", started + 5)  # reads until the server closes
        assert time.monotonic() - started < 4, "the connection was not closed"
        assert data.startswith(b"HTTP/1.1 200") and b"content-length: 10" in data


def test_pipelined_requests_get_their_own_answers_in_order(server):
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(
            b"HEAD /plain HTTP/1.1\r\nhost: x\r\n\r\nGET /empty HTTP/1.1\r\nhost: x\r\n\r\n" * 2
        )
        data = _recv_until(sock, b"never", time.monotonic() + 1.5)
    statuses = [
        line.split(b" ")[1] for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")
    ]
    assert statuses == [b"200", b"204", b"200", b"204"]
