"""Processes a benchmark starts and waits for: each in its own session (its children go with it),
bounded waits, plain HTTP calls, interruption that still runs every cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


class BenchError(RuntimeError):
    """A step of the benchmark failed; the message says which and why."""


class Interrupted(BaseException):
    """SIGTERM/SIGINT/SIGALRM: unwind through every `finally` so that cleanup runs."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def install_interrupts() -> None:
    """SIGINT, SIGTERM and SIGALRM raise Interrupted (install again after ray.init, which sets its
    own)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
        signal.signal(signum, _raise_interrupted)


def free_port() -> int:
    """A free loopback port, for peers that cannot take port 0 (MLServer's three listeners)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(
    method: str,
    url: str,
    body: str | bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_until(what: str, check, timeout: float, interval: float = 0.25):
    """Call `check()` until it returns a truthy value (returned) or raise after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError) as error:
            last_error = error
        time.sleep(interval)
    raise BenchError(
        f"{what}: not ready after {timeout:g} s"
        + (f" (last error: {last_error})" if last_error else "")
    )


class Processes:
    """Subprocesses this run started, each in its own session so that its children go with it."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.started.append(process)
        return process

    def stop(self, process: subprocess.Popen, timeout: float = 10.0) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # the group this run created for it
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        else:  # the leader is gone; its workers may not be
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if process in self.started:
            self.started.remove(process)

    def stop_all(self) -> None:
        for process in list(reversed(self.started)):
            try:
                self.stop(process)
            except Exception as error:  # keep stopping the others
                log(f"could not stop pid {process.pid}: {error}")
