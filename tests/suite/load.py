"""Requests at a fixed rate while a test breaks something, each status kept: callers count their
own failures."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx


class Load:
    """Requests at a fixed rate from a thread pool until stopped; the status of every one, in
    order."""

    def __init__(self, send, rate: float = 20.0) -> None:
        self.send, self.period = send, 1.0 / rate
        self.statuses: list[int | str] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(16)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> None:
        try:
            self.statuses.append(self.send())
        except Exception as error:  # a connection error, or what boto3 raised after its retries
            self.statuses.append(type(error).__name__)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one)
            next_at += self.period
            time.sleep(max(next_at - time.monotonic(), 0))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=True)

    def failures(self) -> Counter:
        return Counter(status for status in self.statuses if status != 200)


def invoker(
    server, endpoint: str, target: str, body: bytes = b'{"x": 1}', headers: dict | None = None
):
    client = httpx.Client(base_url=server.url, timeout=30)

    def send() -> int:
        return client.post(
            f"/endpoints/{endpoint}/invocations",
            content=body,
            headers={
                "Content-Type": "application/json",
                "X-Amzn-SageMaker-Target-Container-Hostname": target,
                **(headers or {}),
            },
        ).status_code

    return send


def settle(predicate, what: str, timeout: float) -> None:
    """Wait, bounded, until `predicate()` holds (polled every 0.5 s); else fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"not {what} within {timeout} s")
