"""What the multinode-session tests share: free ports, bounded waits, stopping what they started (by
PID), and finding which gateway process accepted a connection (gateways share a port through
SO_REUSEPORT); the echo model they serve is `loadtests.cluster.echo`'s."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time

import httpx
import psutil

from loadtests.cluster.echo import echo_model

__all__ = ["accepting_pid", "echo_model", "free_port", "listeners", "stop", "wait_for"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, what: str, timeout: float = 180, every: float = 1.0) -> float:
    """Wait until `predicate()` is true (errors count as not yet); returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except (httpx.HTTPError, ValueError, KeyError, OSError):
            pass
        time.sleep(every)
    raise AssertionError(f"not {what} within {timeout} s")


def stop(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM, then after `grace` SIGKILL it and its children: only processes this test started."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            children: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):
                children = psutil.Process(process.pid).children(recursive=True)
            for child in children:
                # it may exit between the listing and the kill
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            process.kill()
            process.wait(10)


def listeners(port: int) -> set[int]:
    """The processes listening on `port` (the gateways sharing it)."""
    return {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
    }


def accepting_pid(client: socket.socket, port: int) -> int:
    """The process that accepted this client's connection to `port`: the gateway the kernel
    chose."""
    local = client.getsockname()[1]
    for _ in range(50):  # accepted by the server's loop a moment after connect() returns
        for c in psutil.net_connections("tcp"):
            if c.pid and c.laddr and c.raddr and c.laddr.port == port and c.raddr.port == local:
                return c.pid
        time.sleep(0.02)
    raise AssertionError(f"no process accepted the connection from port {local}")
