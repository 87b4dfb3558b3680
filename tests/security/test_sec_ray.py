"""The embedded Ray refuses strangers: our listeners bind loopback, Ray's own ports demand its
token.

Ray resolves a loopback node address to the machine's own and listens on every interface, so the
attacker here is a network peer on this machine's non-loopback address. Before the fix the
embedded server ran Ray with RAY_AUTH_MODE=disabled: one POST to the dashboard agent's job API ran
a shell command, and a driver joined through the GCS and read the registry.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
import ray
from suite import endpoints

from serving.model_server.fork_template import supervisor_named

pytestmark = pytest.mark.integration

ENDPOINTS = {"it-single": endpoints.single}  # what `server` deploys for this module, by builder

# A method of each of Ray's gRPC services: answered without a token, each would hand out cluster
# state.
GRPC_METHODS = (
    "/ray.rpc.InternalKVGcsService/InternalKVGet",
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.rpc.ReporterService/GetTraceback",
    "/ray.rpc.ObjectManagerService/FreeObjects",
)
LOOPBACK = ("127.0.0.1", "::1")


def _session_processes() -> list[psutil.Process]:
    """This test session's Ray: the driver (this process) and everything it started, with the
    container processes forked for its replicas from their stack's template (whose titles name
    their supervisor)."""
    me = psutil.Process()
    family = [me, *me.children(recursive=True)]
    pids = {process.pid for process in family}
    for process in psutil.process_iter():
        try:
            supervisor = supervisor_named(" ".join(process.cmdline()))
        except psutil.Error:
            continue
        if supervisor in pids:
            family.append(process)
    return family


def _listeners() -> list[tuple[str, int, str]]:
    pids = {process.pid: process for process in _session_processes()}
    found = []
    for connection in psutil.net_connections("tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.pid in pids:
            try:
                name = pids[connection.pid].name()
            except psutil.Error:
                continue
            found.append((connection.laddr.ip, connection.laddr.port, name))
    return found


def _speaks_http1(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        sock.settimeout(5)
        try:
            return sock.recv(16)
        except OSError:
            return b""


@pytest.fixture(scope="module")
def node_ip(server) -> str:
    address = ray.util.get_node_ip_address()
    assert address not in LOOPBACK, "the attacker needs this machine's non-loopback address"
    return address


def test_our_listeners_bind_loopback(server) -> None:
    from serving import ray_wing

    ours = {int(server.url.rsplit(":", 1)[1])}
    replicas = ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)["replicas"]
    ours |= {int(url.rsplit(":", 1)[1]) for urls in replicas.values() for url in urls}
    bound = {port: ip for ip, port, _ in _listeners() if port in ours}
    assert bound.keys() == ours
    assert set(bound.values()) <= set(LOOPBACK), bound


def test_no_ray_port_runs_a_job_for_a_stranger(server, node_ip, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    job = json.dumps({"entrypoint": f"touch {marker}", "submission_id": "stranger"}).encode()
    exposed = [(ip, port, name) for ip, port, name in _listeners() if ip not in LOOPBACK]
    assert exposed  # Ray listens beyond loopback: that is why it needs authentication
    for ip, port, name in exposed:
        host = node_ip if ip in ("0.0.0.0", "::") else ip
        if not _speaks_http1(host, port).startswith(b"HTTP/"):
            continue
        for path in ("/api/job_agent/jobs/", "/api/jobs/"):
            try:
                response = httpx.post(
                    f"http://{host}:{port}{path}",
                    content=job,
                    timeout=10,
                    headers={"content-type": "application/json"},
                )
            except httpx.HTTPError:
                continue
            assert response.status_code >= 400, (
                name,
                port,
                path,
                response.status_code,
                response.text[:200],
            )
    time.sleep(2)
    assert not marker.exists()


def test_no_ray_grpc_port_answers_without_the_token(server, node_ip) -> None:
    answered = []
    checked = 0
    for ip, port, name in _listeners():
        if ip in LOOPBACK:
            continue
        host = node_ip if ip in ("0.0.0.0", "::") else ip
        if _speaks_http1(host, port).startswith(b"HTTP/"):
            continue  # an HTTP server: the job test above covers it
        checked += 1
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            for method in GRPC_METHODS:
                try:
                    channel.unary_unary(method)(b"", timeout=5)
                    answered.append((name, port, method))
                except grpc.RpcError as error:
                    assert error.code() in (
                        grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.UNIMPLEMENTED,
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ), (name, port, method, error.code())
    assert checked, "no gRPC port found"
    assert not answered, answered


def test_a_driver_without_the_token_cannot_join(server) -> None:
    gcs = ray.get_runtime_context().gcs_address
    code = f"import ray; ray.init(address={gcs!r}); print('joined')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "RAY_AUTH_MODE": "disabled"},
    )
    assert done.returncode != 0 and "joined" not in done.stdout, done.stdout[-500:]


def test_workers_do_not_import_from_the_drivers_working_directory(server) -> None:
    # Issue 41, finding 2: Ray put the driver's working directory first on every worker's sys.path,
    # so a `serving/` folder written there (the default model root was that directory) became the
    # code the next replica ran.
    import os

    paths = ray.get(
        ray.remote(lambda: __import__("sys").path).options(num_cpus=0).remote(), timeout=60
    )
    assert os.getcwd() not in paths, paths[:5]
