"""Unauthenticated uploads cost the gateway their headers, not their bodies (finding 4).

A real gateway on 127.0.0.1 (Router + Starlette in a BackgroundServer), driven with raw sockets so
that a test can send headers and hold the body back: a refusal that arrives then was decided before
the body was read. The memory tests run the gateway in a child process and read its VmRSS.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sec_harness import (
    API_KEY,
    DENIED_KEY,
    Stack,
    connect,
    read_answer,
    request_head,
    sigv4_headers,
    vm_rss,
    wait_closed,
)

ROOT = Path(__file__).resolve().parents[2]
PATH = "/endpoints/secure/invocations"
# the default payload limit: the largest body an unauthenticated caller could make us read
PAYLOAD = 6_000_000
JSON = ("Content-Type", "application/json")


def unauthenticated(url: str, scheme: str, length: int) -> list[tuple[str, str]]:
    """Headers of an upload of `length` bytes that must be refused, by scheme."""
    base = [JSON, ("Content-Length", str(length))]
    if scheme == "none":
        return base
    if scheme == "bearer-wrong-key":
        return [*base, ("Authorization", "Bearer not-the-key-of-anyone-at-all")]
    signed = dict(
        sigv4_headers(
            url, PATH, b"x" * 16, key_id="AKIANOBODYKNOWN00", secret="whatever-secret-value"
        )
    )
    if scheme == "sigv4-known-key-other-region":
        signed = dict(sigv4_headers(url, PATH, b"x" * 16))
        signed["Authorization"] = signed["Authorization"].replace("/us-east-1/", "/eu-west-1/")
    if scheme == "sigv4-known-key-expired":
        signed = dict(sigv4_headers(url, PATH, b"x" * 16))
        day = signed["X-Amz-Date"][:8]
        signed["X-Amz-Date"] = "20200101T000000Z"
        signed["Authorization"] = signed["Authorization"].replace(f"/{day}/", "/20200101/")
    return [*base, *((k, v) for k, v in signed.items() if k.lower() != "content-type")]


EXPECTED = {
    "none": "MissingAuthenticationTokenException",
    "bearer-wrong-key": "UnrecognizedClientException",
    "sigv4-unknown-key": "UnrecognizedClientException",
    "sigv4-known-key-other-region": "InvalidSignatureException",
    "sigv4-known-key-expired": "InvalidSignatureException",
}


@pytest.fixture(scope="module")
def url(stack: Stack, identities: Path, table) -> str:
    return stack.gateway(identities, table)


@pytest.mark.parametrize("scheme", list(EXPECTED))
def test_refused_from_the_headers_alone(url: str, scheme: str) -> None:
    # Headers declaring a 6 MB body, and not one byte of it: the answer can only come from the
    # headers.
    with connect(url) as sock:
        sock.sendall(request_head(url, PATH, unauthenticated(url, scheme, PAYLOAD)))
        answer = read_answer(sock, timeout=5)
        assert (answer.status, answer.code) == (403, EXPECTED[scheme]), answer.body
        assert answer.headers.get("connection") == "close"  # the body it announced is not read
        assert wait_closed(sock, 5) is not None


def test_refused_while_the_client_is_still_sending(url: str) -> None:
    sent, done = [0], threading.Event()
    with connect(url) as sock:
        sock.sendall(request_head(url, PATH, unauthenticated(url, "bearer-wrong-key", PAYLOAD)))

        def upload() -> None:
            piece = b"x" * 65536
            try:
                while sent[0] < PAYLOAD:
                    sent[0] += sock.send(piece[: PAYLOAD - sent[0]])
            except OSError:  # the server closed the connection: the rest is never sent
                pass
            done.set()

        threading.Thread(target=upload, daemon=True).start()
        answer = read_answer(sock, timeout=10)
        assert (answer.status, answer.code) == (403, "UnrecognizedClientException")
        done.wait(10)
    assert sent[0] < PAYLOAD, "the whole body was accepted before the refusal"


def test_bearer_callers_are_authorized_before_their_body_is_read(url: str) -> None:
    # A known key is checked in full from the headers, and so are its policies: a caller not allowed
    # to run the container is refused before its body is read ...
    with connect(url) as sock:
        head = [JSON, ("Content-Length", str(PAYLOAD)), ("Authorization", f"Bearer {DENIED_KEY}")]
        sock.sendall(request_head(url, PATH, head))
        answer = read_answer(sock, timeout=5)
        assert (answer.status, answer.code) == (403, "AccessDeniedException")
        assert "User: denied is not authorized" in answer.message
        assert wait_closed(sock, 5) is not None
    # ... and the body of an allowed one is asked for only then.
    with connect(url) as sock:
        body = b'{"ok": 1}'
        head = [
            JSON,
            ("Content-Length", str(len(body))),
            ("Authorization", f"Bearer {API_KEY}"),
            ("Expect", "100-continue"),
        ]
        sock.sendall(request_head(url, PATH, head))
        sock.settimeout(5)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # asked for the body only now
        sock.sendall(body)
        answer = read_answer(sock)
        assert (answer.status, answer.body) == (200, body)


# --- a SigV4 signature needs the body: what a known key id can make us hold is bounded ------------


def signed_head(
    url: str, length: int, secret: str = "not-the-secret-of-signer"
) -> list[tuple[str, str]]:
    """Headers of a signed upload with the known key id and a wrong secret: it passes every check
    before the body, so the gateway must read `length` bytes before it can refuse the signature."""
    signed = sigv4_headers(url, PATH, b"0" * length, secret=secret)
    return [("Content-Length", str(length)), ("Expect", "100-continue"), *signed]


def test_signed_bodies_are_read_within_a_byte_budget(stack: Stack, identities: Path, table) -> None:
    # Budget 2 MB, payload limit 1 MB: two unverified bodies at a time; the third is refused at
    # once.
    url = stack.gateway(identities, table, max_payload_mb=1, preauth_body_budget_mb=2)
    length = 1_000_000
    first, second, third = connect(url), connect(url), connect(url)
    try:
        for sock in (first, second):
            sock.sendall(request_head(url, PATH, signed_head(url, length)))
            sock.settimeout(5)
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # its bytes are reserved now
        third.sendall(request_head(url, PATH, signed_head(url, length)))
        answer = read_answer(third, timeout=5)
        assert (answer.status, answer.code) == (429, "ThrottlingException")
        assert "SERVING_PREAUTH_BODY_BUDGET_MB" in answer.message
        # The first body is read, its signature refused, its bytes given back: the next one fits.
        first.sendall(b"0" * length)
        assert read_answer(first).code == "InvalidSignatureException"
        with connect(url) as fourth:
            fourth.sendall(request_head(url, PATH, signed_head(url, length)))
            fourth.settimeout(5)
            assert fourth.recv(100).startswith(b"HTTP/1.1 100 Continue")
            fourth.sendall(b"0" * length)
            assert read_answer(fourth).code == "InvalidSignatureException"
        # And a correctly signed request still runs.
        body = b'{"signed": true}'
        with connect(url) as good:
            good.sendall(
                request_head(
                    url, PATH, [("Content-Length", str(len(body))), *sigv4_headers(url, PATH, body)]
                )
                + body
            )
            answer = read_answer(good)
            assert (answer.status, answer.body) == (200, body)
    finally:
        for sock in (first, second, third):
            sock.close()


# --- memory of the gateway process under unauthenticated load -------------------------------------


@pytest.fixture
def child(identities: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A gateway in a process of its own (default limits), and its URL."""
    config = {"identities": str(identities), "settings": {}}
    path = os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]
    )  # this checkout's serving, not an installed one
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("sec_harness.py")), json.dumps(config)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        probe = "import serving.gateway.router as router; print(router.__file__)"
        assert subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, "PYTHONPATH": path},
            cwd="/",
            capture_output=True,
            text=True,
        ).stdout.startswith(str(ROOT))
        yield process, url
    finally:
        process.stdin.close()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def upload(
    url: str, headers: list[tuple[str, str]], length: int, together: threading.Barrier
) -> int | str:
    """Send the headers and all but the last byte of a `length`-byte body, wait for the other
    uploads to get as far (so that every body the server accepted is held at once), then the last
    byte; the status of the answer, or why there was none."""
    piece = b"y" * 262144
    with connect(url, timeout=60) as sock:
        sock.sendall(request_head(url, PATH, headers))
        try:
            sent = 0
            while sent < length - 1:
                sent += sock.send(piece[: length - 1 - sent])
        except OSError:
            pass  # refused and closed: stop sending
        together.wait()
        try:
            sock.sendall(b"y")
        except OSError:
            pass
        try:
            return read_answer(sock, timeout=60).status
        except (OSError, http.client.HTTPException) as error:
            return type(error).__name__


class Peak:
    """Samples a process's VmRSS every 5 ms on a thread; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, vm_rss(pid), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, vm_rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def settle(pid: int, ceiling: int, seconds: float = 15.0) -> int:
    """VmRSS once it is at most `ceiling`, or the last value after `seconds`."""
    deadline = time.monotonic() + seconds
    while (rss := vm_rss(pid)) > ceiling and time.monotonic() < deadline:
        time.sleep(0.1)
    return rss


MiB = 1 << 20
CONNECTIONS = 100
# what uvicorn may read of CONNECTIONS requests before the app has looked at them
READ_AHEAD = 32 * MiB


def burst(url: str, heads: list[list[tuple[str, str]]], length: int) -> list[int | str]:
    together = threading.Barrier(len(heads), timeout=120)
    with ThreadPoolExecutor(len(heads)) as pool:
        return list(pool.map(lambda head: upload(url, head, length, together), heads))


def warm_up(url: str) -> None:
    # One of each kind of request first, so that the baseline includes the code paths' own
    # allocations.
    burst(url, [unauthenticated(url, scheme, 1000) for scheme in EXPECTED] * 4, 1000)
    burst(url, [signed_head(url, 1000)] * 4, 1000)


def test_memory_of_unauthenticated_uploads(child) -> None:
    process, url = child
    warm_up(url)
    baseline = vm_rss(process.pid)
    schemes = ["none", "bearer-wrong-key", "sigv4-unknown-key"]
    heads = [unauthenticated(url, schemes[i % 3], PAYLOAD) for i in range(CONNECTIONS)]
    peak = Peak(process.pid)
    statuses = burst(url, heads, PAYLOAD)
    peak = peak.stop()
    after = settle(process.pid, baseline + 16 * MiB)
    print(
        f"\n{CONNECTIONS} unauthenticated {PAYLOAD} B uploads: VmRSS baseline {baseline / MiB:.1f} MiB, "
        f"peak +{(peak - baseline) / MiB:.1f} MiB, after +{(after - baseline) / MiB:.1f} MiB; answers {sorted(set(map(str, statuses)))}"
    )
    assert all(status == 403 for status in statuses), statuses
    # Each connection costs at most what uvicorn reads ahead of the app before it is refused: 64
    # KiB, plus one socket read of up to 256 KiB; 100 of them fit in 32 MiB. Without the pre-body
    # check: ~570 MiB.
    assert peak - baseline < READ_AHEAD
    assert after - baseline < 16 * MiB


def test_memory_of_signed_uploads_that_fail_verification(child) -> None:
    process, url = child
    warm_up(url)
    baseline = vm_rss(process.pid)
    heads = [signed_head(url, PAYLOAD) for _ in range(CONNECTIONS)]
    # as boto3 sends them: body right away
    heads = [[h for h in head if h[0] != "Expect"] for head in heads]
    peak = Peak(process.pid)
    statuses = burst(url, heads, PAYLOAD)
    peak = peak.stop()
    after = settle(process.pid, baseline + 16 * MiB)
    print(
        f"\n{CONNECTIONS} signed {PAYLOAD} B uploads with a wrong secret: VmRSS baseline {baseline / MiB:.1f} MiB, "
        f"peak +{(peak - baseline) / MiB:.1f} MiB, after +{(after - baseline) / MiB:.1f} MiB; "
        f"answers {[(s, statuses.count(s)) for s in sorted(set(statuses), key=str)]}"
    )
    assert set(statuses) <= {403, 429}, statuses
    # At most the budget (64 MB by default) of bodies is held at once, plus uvicorn's read-ahead of
    # the connections being refused, as above. Without the budget: ~570 MiB.
    assert peak - baseline < 64_000_000 + READ_AHEAD
    assert after - baseline < 16 * MiB
