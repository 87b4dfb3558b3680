"""Hops over the Unix socket beside a data port (`serving.http.local_socket`,
`HopClient(unix_sockets=True)`).

A real `BackgroundServer` serves one app on a TCP listener and on the Unix socket
`local_socket.listen` made for that TCP address, as a container process does; the app records
whether each request came over TCP (a client address) or the Unix socket (none). The socket folder
is a private temporary folder per test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.gateway.hop_client import HopClient, HopRefused
from serving.http import local_socket
from serving.http.server import BackgroundServer


@pytest.fixture(autouse=True)
def private_tmp(monkeypatch) -> Iterator[str]:
    # Short (a socket path holds 107 bytes) and this test's own.
    folder = tempfile.mkdtemp(prefix="hop-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", folder)
    yield folder
    shutil.rmtree(folder)  # does not follow links


class DataPort:
    """A BackgroundServer on TCP and on its Unix socket; `peers` lists each request's client (None:
    Unix)."""

    def __init__(self, unix: bool = True) -> None:
        self.peers: list[str | None] = []

        async def invoke(request: Request) -> Response:
            self.peers.append(request.client.host if request.client else None)
            return Response(await request.body(), media_type="application/json")

        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(64)
        self.port = tcp.getsockname()[1]
        self.unix = local_socket.listen("127.0.0.1", self.port) if unix else None
        self.path = self.unix.getsockname() if self.unix is not None else None
        self.server = BackgroundServer(
            Starlette(routes=[Route("/invocations", invoke, methods=["POST"])]),
            sock=tcp,
            also=(self.unix,) if self.unix is not None else (),
        )
        assert self.server.wait_started()

    def stop(self) -> None:
        self.server.stop()
        if self.unix is not None:
            local_socket.remove(self.unix, self.path)


@pytest.fixture
def port() -> Iterator[DataPort]:
    server = DataPort()
    yield server
    server.stop()


def post(client: HopClient, port: int, times: int = 1) -> list[bytes]:
    async def run() -> list[bytes]:
        answers = [
            (await client.post("127.0.0.1", port, "/invocations", b"[1]", {}, 5)).body
            for _ in range(times)
        ]
        client.close()
        return answers

    return asyncio.run(run())


def test_the_socket_is_private_and_named_by_the_tcp_address(port: DataPort) -> None:
    path = port.path
    assert path == local_socket.path_for("127.0.0.1", port.port)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700


def test_a_replica_on_this_machine_is_reached_over_its_unix_socket(port: DataPort) -> None:
    assert post(HopClient(unix_sockets=True), port.port, times=3) == [b"[1]"] * 3
    assert port.peers == [None, None, None]  # no TCP peer: every hop came over the Unix socket


def test_off_by_setting_the_hop_uses_tcp(port: DataPort) -> None:
    assert post(HopClient(unix_sockets=False), port.port) == [b"[1]"]
    assert port.peers == ["127.0.0.1"]


def test_no_socket_there_means_tcp() -> None:
    server = DataPort(unix=False)  # a replica on another node: nothing at its path on this machine
    try:
        assert post(HopClient(unix_sockets=True), server.port) == [b"[1]"]
        assert server.peers == ["127.0.0.1"]
    finally:
        server.stop()


def test_a_socket_left_by_a_dead_replica_falls_back_to_tcp() -> None:
    server = DataPort(unix=False)
    # bound, then its process died: the file stays
    stale = local_socket.listen("127.0.0.1", server.port)
    assert stale is not None
    path = stale.getsockname()
    stale.close()
    try:
        assert os.path.exists(path)
        assert post(HopClient(unix_sockets=True), server.port, times=2) == [b"[1]"] * 2
        assert server.peers == ["127.0.0.1", "127.0.0.1"]
    finally:
        server.stop()
        os.unlink(path)


def test_a_gone_replica_is_still_refused() -> None:
    server = DataPort()
    port = server.port
    server.stop()  # its Unix socket removed, its TCP port closed

    async def run() -> None:
        await HopClient(unix_sockets=True).post("127.0.0.1", port, "/invocations", b"", {}, 5)

    with pytest.raises(HopRefused):
        asyncio.run(run())


@pytest.mark.parametrize("unsafe", ["open to others", "not ours: a link", "a file"])
def test_a_folder_others_could_enter_is_not_used(private_tmp: str, unsafe: str) -> None:
    folder = os.path.join(private_tmp, f"serving-hops-{os.getuid()}")
    if unsafe == "open to others":
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o755)
    elif unsafe == "not ours: a link":
        target = os.path.join(private_tmp, "elsewhere")
        os.mkdir(target, 0o700)
        os.symlink(target, folder)
    else:
        open(folder, "w").close()
    assert local_socket.folder() is None
    assert local_socket.path_for("127.0.0.1", 8080, create=True) is None
    assert local_socket.listen("127.0.0.1", 8080) is None


def test_a_path_too_long_for_a_unix_socket_is_not_used(monkeypatch, private_tmp: str) -> None:
    deep = os.path.join(private_tmp, "d" * 90)
    os.mkdir(deep)
    monkeypatch.setattr(tempfile, "tempdir", deep)
    assert local_socket.path_for("127.0.0.1", 8080, create=True) is None
    assert local_socket.listen("127.0.0.1", 8080) is None


def test_a_new_replica_sweeps_sockets_that_replicas_killed_left_behind(private_tmp: str) -> None:
    # A replica killed with SIGKILL cannot remove its socket; the next replica to start on this
    # machine does.
    def left_behind(port: int, age_s: float) -> str:
        listener = local_socket.listen("127.0.0.1", port)
        assert listener is not None
        path = listener.getsockname()
        listener.close()  # its process died: the file stays, nothing listens
        old = os.path.getmtime(path) - age_s
        os.utime(path, (old, old), follow_symlinks=False)
        return path

    stale = left_behind(50001, 600)
    young = left_behind(50002, 0)  # might be a replica between its bind and its listen: left alone
    live = DataPort()  # listening: left alone, however old
    os.utime(live.path, (1, 1), follow_symlinks=False)
    newcomer = local_socket.listen("127.0.0.1", 50003)
    try:
        assert not os.path.exists(stale)
        assert os.path.exists(young) and os.path.exists(live.path)
        assert post(HopClient(unix_sockets=True), live.port) == [b"[1]"]
        assert live.peers == [None]
    finally:
        live.stop()
        if newcomer is not None:
            newcomer.close()
