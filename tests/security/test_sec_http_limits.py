"""Slow clients, oversized heads and too many connections against a real gateway (finding 4).

Each limit is checked with raw sockets on 127.0.0.1: the refusal comes in the documented error shape
where an HTTP answer is still possible, the connection is cut within the configured time, and the
server serves a normal request afterwards. The timeouts here are small (about a second) so that the
tests are quick; the bounds on cut-off times are generous (two seconds of slack) because the machine
may be busy.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from sec_harness import Stack, connect, read_answer, request_head, wait_closed

OPEN = "/endpoints/open/invocations"
HEADER_TIMEOUT, BODY_IDLE, BODY_TOTAL = 1.0, 1.0, 3.0
SLACK = 2.0


@pytest.fixture(scope="module")
def url(stack: Stack, identities: Path, table) -> str:
    return stack.gateway(
        identities,
        table,
        header_timeout_s=HEADER_TIMEOUT,
        body_idle_timeout_s=BODY_IDLE,
        body_timeout_s=BODY_TOTAL,
    )


def serves(url: str) -> bool:
    """A normal request gets its normal answer."""
    response = httpx.post(
        url + OPEN,
        content=b'{"still": "serving"}',
        headers={"content-type": "application/json"},
        timeout=10,
    )
    return response.status_code == 200 and response.json() == {"still": "serving"}


def trickle(sock: socket.socket, data: bytes, every: float) -> threading.Thread:
    """Send `data` one byte every `every` seconds on a thread, until done or the server closes."""

    def run() -> None:
        try:
            for index in range(len(data)):
                sock.send(data[index : index + 1])
                time.sleep(every)
        except OSError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- slow clients ---------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(url: str) -> None:
    with connect(url) as sock:
        closed_after = wait_closed(sock, HEADER_TIMEOUT + SLACK)
    assert closed_after is not None, "an idle new connection stays open"
    assert closed_after >= HEADER_TIMEOUT * 0.9
    assert serves(url)


def test_headers_trickled_byte_by_byte_are_cut_off(url: str) -> None:
    head = request_head(url, OPEN, [("Content-Type", "application/json"), ("Content-Length", "2")])
    with connect(url) as sock:
        started = time.monotonic()
        trickle(sock, head, every=0.05)  # ~150 bytes: 7 s at this pace
        answer = read_answer(sock, timeout=HEADER_TIMEOUT + SLACK)
        elapsed = time.monotonic() - started
        assert (answer.status, answer.code) == (408, "RequestTimeout")
        assert "SERVING_HEADER_TIMEOUT_S" in answer.message
        assert wait_closed(sock, SLACK) is not None
    assert HEADER_TIMEOUT * 0.9 <= elapsed <= HEADER_TIMEOUT + SLACK
    assert serves(url)


def test_a_stalled_body_is_cut_off(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(
            request_head(
                url, OPEN, [("Content-Type", "application/json"), ("Content-Length", "1000")]
            )
            + b"[1,"
        )
        started = time.monotonic()
        answer = read_answer(sock, timeout=BODY_IDLE + SLACK)
        elapsed = time.monotonic() - started
        assert (answer.status, answer.code) == (408, "RequestTimeout")
        assert "SERVING_BODY_IDLE_TIMEOUT_S" in answer.message
    assert BODY_IDLE * 0.9 <= elapsed <= BODY_IDLE + SLACK
    assert serves(url)


def test_a_body_trickled_faster_than_the_idle_timeout_is_cut_off_at_the_body_deadline(
    url: str,
) -> None:
    with connect(url) as sock:
        sock.sendall(
            request_head(
                url, OPEN, [("Content-Type", "application/json"), ("Content-Length", "1000")]
            )
        )
        started = time.monotonic()
        # never idle for long, but 1000 bytes take 250 s
        trickle(sock, b"1" * 1000, every=BODY_IDLE / 4)
        answer = read_answer(sock, timeout=BODY_TOTAL + SLACK)
        elapsed = time.monotonic() - started
        assert (answer.status, answer.code) == (408, "RequestTimeout")
        assert "SERVING_BODY_TIMEOUT_S" in answer.message
    assert BODY_TOTAL * 0.9 <= elapsed <= BODY_TOTAL + SLACK
    assert serves(url)


def test_idle_keep_alive_connections_are_not_cut_by_the_header_timeout(url: str) -> None:
    # Between requests a connection is governed by the keep-alive timeout (75 s), as the gateway's
    # pooled connections to container data ports are: the header clock starts with the next
    # request's first byte.
    body = b'{"again": 1}'
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.post(OPEN, content=body).status_code == 200
        time.sleep(HEADER_TIMEOUT + 0.5)
        response = client.post(OPEN, content=body)
        assert response.status_code == 200
        assert client.post(OPEN, content=body).status_code == 200
    assert response.json() == {"again": 1}


# --- oversized heads ------------------------------------------------------------------------------


def send_head(
    url: str, headers: list[tuple[str, str]], body: bytes = b"{}"
) -> tuple[int, str | None, str]:
    """Status, error code and message of a request with these headers (sent on a thread: the server
    may answer and close before it has all of them)."""
    head = request_head(
        url,
        OPEN,
        [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers],
    )
    with connect(url) as sock:
        threading.Thread(target=lambda: _send_quietly(sock, head + body), daemon=True).start()
        answer = read_answer(sock, timeout=10)
        if answer.status == 200:
            return 200, None, ""
        return answer.status, answer.code, answer.message


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_a_two_megabyte_header_is_refused(url: str) -> None:
    status, code, message = send_head(url, [("X-Big", "b" * 2_000_000)])
    assert (status, code) == (431, "ValidationError")
    assert "16384" in message and "SERVING_MAX_HEADER_BYTES" in message
    assert serves(url)


def test_five_thousand_headers_are_refused(url: str) -> None:
    status, code, message = send_head(url, [(f"X-H{i}", "v") for i in range(5000)])
    assert (status, code) == (431, "ValidationError")
    assert serves(url)


def test_the_header_limits_are_exact(url: str) -> None:
    # 100 headers (Host, Content-Type and Content-Length among them) pass, 101 do not.
    assert send_head(url, [(f"X-H{i}", "v") for i in range(97)])[0] == 200
    status, code, message = send_head(url, [(f"X-H{i}", "v") for i in range(98)])
    assert (status, code) == (431, "ValidationError")
    assert "100" in message and "SERVING_MAX_HEADER_COUNT" in message
    # 16 KiB for the request line and every header: 15,000 bytes of one value pass, 17,000 do not.
    assert send_head(url, [("X-Pad", "p" * 15_000)])[0] == 200
    assert send_head(url, [("X-Pad", "p" * 17_000)])[:2] == (431, "ValidationError")
    assert serves(url)


# --- too many connections -------------------------------------------------------------------------


def test_connections_beyond_the_limit_are_closed(stack: Stack, identities: Path, table) -> None:
    url = stack.gateway(identities, table, max_connections=8, header_timeout_s=30)
    held = [connect(url) for _ in range(8)]
    try:
        time.sleep(0.2)  # let the server take all eight
        with connect(url) as extra:
            closed_after = wait_closed(extra, SLACK)
        assert closed_after is not None, "a ninth connection was kept open"
        with pytest.raises(httpx.TransportError):
            httpx.post(url + OPEN, content=b"{}", timeout=5)
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5  # until the server has seen the eight close
    while True:
        try:
            assert serves(url)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
