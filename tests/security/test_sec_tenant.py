"""A hostile tenant: a model's own code (it-hostile/tenant) attacks the gateway, its neighbour and
the cluster.

The tenant's `code/inference.py` (tests/suite/handlers.py, HANDLERS["hostile"]) tries what the
request tells it: read secrets (the identities file, Ray's token, another model), list Ray's object
store, write outside its scratch folder, call its neighbour's data port, open Ray's Unix sockets,
signal or read the gateway's process, join the cluster as a driver and read the registry. It
reports each attempt; every one must be refused. Before this fix all of them but the neighbour's
403 succeeded (tenant code ran inside a Ray worker, with the cluster's token).
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import psutil
import pytest
import ray
from suite import endpoints
from suite.endpoint_server import TINY
from suite.endpoints import python_container

from serving.client import AccessDenied

pytestmark = pytest.mark.integration

# The hostile tenant's Environment (tests/security): a variable that must reach its container
# process only.
TENANT_CANARY = "SERVING_TENANT_CANARY"


def hostile(handler_models: dict[str, Path]) -> dict:
    """it-hostile: a tenant's model that attacks its neighbour, the gateway and the cluster, beside
    a victim."""
    tenant = python_container(
        "tenant",
        handler_models,
        "hostile",
        Resources=TINY,
        Environment={TENANT_CANARY: "set-by-the-tenant"},
    )
    return {
        "EndpointName": "it-hostile",
        "Containers": [tenant, python_container("victim", handler_models, "echo", Resources=TINY)],
    }


# what `server` deploys for this module, by builder
ENDPOINTS = {"it-hostile": hostile, "it-secure": endpoints.secure}

ROOT = Path(__file__).resolve().parents[2]


def _gateway_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for connection in psutil.net_connections("tcp"):
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr.port == port
            and connection.pid
        ):
            return connection.pid
    raise AssertionError(f"no process listens on {url}")


def _replicas() -> dict[tuple[str, str], list[str]]:
    from serving import ray_wing

    return ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)["replicas"]


@pytest.fixture(scope="module")
def report(server, identities_file, demo_models, tmp_path_factory) -> dict[str, str]:
    replicas = _replicas()
    token_files = [os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")]
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    outside = tmp_path_factory.mktemp("outside-the-sandbox")
    # a run of an older, unconfined version may have left it
    Path("/tmp/serving-tenant-marker").unlink(missing_ok=True)
    targets = {
        "read": [
            str(identities_file),
            *[path for path in token_files if path],
            str(demo_models / "iris-classifier" / "model.skops"),
            str(ROOT / "examples" / "identities.yaml"),
        ],
        "list": ["/dev/shm", str(session), "/tmp", str(Path.home())],
        "write": [str(outside / "marker"), "/tmp/serving-tenant-marker"],
        "post": [
            url + "/invocations"
            for key, urls in replicas.items()
            for url in urls
            if key != ("it-hostile", "tenant")
        ][:4],
        "api": [server.url + "/"],
        "delete": [server.url + "/endpoints/it-secure"],
        "unix": sorted(glob.glob(str(session / "sockets" / "*")))[:3],
        "pids": [_gateway_pid(server.url), os.getpid()],
        "gcs": ray.get_runtime_context().gcs_address,
    }
    response = server.client.invoke("it-hostile", targets, target="tenant")
    assert response.status_code == 200
    found = response.body
    assert not (outside / "marker").exists() and not Path("/tmp/serving-tenant-marker").exists()
    # the tenant's Ray driver attempt runs in its background: collect it
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        cluster = server.client.invoke("it-hostile", {"collect": True}, target="tenant").body
        if "ray driver" in cluster:
            return {**found, **cluster}
        time.sleep(2)
    raise AssertionError(f"the tenant's cluster attempts did not finish: {cluster}")


def _attempts(report: dict[str, str], prefix: str) -> dict[str, str]:
    attempts = {key: value for key, value in report.items() if key.startswith(prefix)}
    assert attempts, f"the tenant made no {prefix!r} attempt"
    return attempts


@pytest.mark.parametrize(
    "kind", ["read ", "list ", "write ", "unix ", "signal ", "environ ", "memory "]
)
def test_the_tenant_reaches_nothing_outside_its_sandbox(report: dict[str, str], kind: str) -> None:
    allowed = {
        key: value for key, value in _attempts(report, kind).items() if value.startswith("ALLOWED")
    }
    assert not allowed, allowed


def test_the_tenant_cannot_call_other_containers(report: dict[str, str]) -> None:
    # Not even to be refused by their hop signature check (403): no connection leaves its network
    # namespace.
    for key, value in _attempts(report, "post ").items():
        assert value.startswith("REFUSED: URLError"), (key, value)


def test_the_tenant_cannot_join_the_cluster_or_read_its_store(report: dict[str, str]) -> None:
    assert report["gcs kv"].startswith("REFUSED"), report["gcs kv"]
    assert report["ray driver"].startswith("REFUSED"), report["ray driver"]


def test_the_tenant_holds_no_ray_credentials(report: dict[str, str]) -> None:
    # nor the trace collector's (the session's Ray runs with OTEL_EXPORTER_OTLP_HEADERS: suite.otlp)
    leaked = [
        name
        for name in report["environment"]
        if name.startswith(("RAY_", "AWS_", "OTEL_")) or "TOKEN" in name
    ]
    assert not leaked, leaked


def test_the_tenants_environment_is_its_container_process_only(report: dict[str, str]) -> None:
    """Its Environment is its container process's, never its Ray worker's (which holds Ray's
    credentials): once, PYTHONPATH there ran the tenant's sitecustomize.py in the worker. (Variables
    that choose code as a process starts are now refused by name: test_sec_environment.py.)"""
    assert TENANT_CANARY in report["environment"]  # the variable did reach the container process
    supervisor = Path(f"/proc/{report['supervisor']}/environ").read_bytes()
    assert TENANT_CANARY.encode() not in supervisor


def test_the_tenant_cannot_reach_the_control_plane(report: dict[str, str], server) -> None:
    # Container processes have a network namespace of their own (and Landlock allows them no TCP
    # port but their own): neither the SageMaker API nor `serving delete`'s control route answers
    # them, whatever they hold.
    for key, value in {**_attempts(report, "api "), **_attempts(report, "delete ")}.items():
        assert value.startswith("REFUSED: URLError") and "Permission denied" in value, (key, value)
    # not deleted
    assert server.client.describe_endpoint("it-secure")["EndpointStatus"] == "InService"


def test_registry_writes_need_the_control_plane_capability(server) -> None:
    # A process that reaches the registry without the capability (here: the test driver, with a
    # guessed token) can neither rewrite an endpoint, nor delete one, nor register a replica of
    # someone else's.
    from serving import ray_wing

    registry = ray_wing.registry_handle()
    before = ray.get(registry.snapshot.remote(-1), timeout=30)
    # the attack: drop it-secure's AccessControl
    forged = {**before["endpoints"]["it-secure"], "access": None}
    assert ray.get(registry.put_endpoint.remote("0" * 64, forged), timeout=30) is False
    assert ray.get(registry.delete_endpoint.remote("", "it-secure"), timeout=30) is False
    version = before["endpoints"]["it-secure"]["containers"][0]["Version"]
    assert (
        ray.get(
            registry.register.remote(
                "it-secure", "customIps-iris", version, "http://127.0.0.1:9", "0" * 64
            ),
            timeout=30,
        )
        is False
    )
    some_url = next(iter(before["replicas"][("it-secure", "customIps-iris")]))
    assert ray.get(registry.deregister.remote(some_url, "0" * 64), timeout=30) is False
    after = ray.get(registry.snapshot.remote(-1), timeout=30)
    assert after["endpoints"]["it-secure"] == before["endpoints"]["it-secure"]
    assert "http://127.0.0.1:9" not in after["replicas"].get(("it-secure", "customIps-iris"), [])
    assert some_url in after["replicas"][("it-secure", "customIps-iris")]
    assert after["refused"] >= before["refused"] + 4
    with pytest.raises(AccessDenied) as anonymous:
        server.client.invoke("it-secure", [[5.1, 3.5, 1.4, 0.2]], target="customIps-iris")
    assert anonymous.value.status_code == 403  # still protected


def test_no_secret_travels_through_ray(server, access_callers) -> None:
    # What the registry (actor state, object store) holds names the identities file; no secret, no
    # digest.
    import hashlib

    snapshot = repr(
        ray.get(
            __import__("serving.ray_wing", fromlist=["registry_handle"])
            .registry_handle()
            .snapshot.remote(-1),
            timeout=30,
        )
    )
    for credentials in access_callers.values():
        for field in ("SecretAccessKey", "ApiKey"):
            secret = credentials.get(field)
            if secret:
                assert secret not in snapshot
                assert hashlib.sha256(secret.encode()).hexdigest() not in snapshot


def test_the_tenant_cannot_join_or_reach_any_listener_of_the_node(server, access_callers) -> None:
    """Issue 56: with an MPTCP socket (which Landlock's TCP rules do not cover) the tenant once
    joined the gateway's SO_REUSEPORT group and answered 18 of 40 calls made to another,
    access-controlled endpoint, reading their keys. Now it tries every socket the kernel offers
    (tests/security/tenant_probe.py) on the gateway's HTTP and gRPC ports, and connects to them, to
    Ray's GCS and to another container's data port and Unix socket, while callers of it-secure keep
    calling: every call is answered by it-secure, and the tenant bound, reached and got nothing."""
    import httpx

    gateway_port = int(server.url.rsplit(":", 1)[1])
    grpc_port = int(server.grpc_target.rsplit(":", 1)[1])
    gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    victim = next(url for key, urls in _replicas().items() for url in urls if key[0] == "it-secure")
    victim_host, victim_port = victim.removeprefix("http://").rsplit(":", 1)
    from serving.http import local_socket

    targets = {
        "listen": [["127.0.0.1", gateway_port], ["127.0.0.1", grpc_port]],
        "connect": [
            ["127.0.0.1", gateway_port],
            ["127.0.0.1", grpc_port],
            [gcs_host, int(gcs_port)],
            [victim_host, int(victim_port)],
        ],
        "unix": [local_socket.path_for(victim_host, int(victim_port))],
        "window_s": 8,
    }
    found = server.client.invoke("it-hostile", {"sockets": targets}, target="tenant").body
    key = access_callers["batch-job"]["ApiKey"]
    origins = []
    for _ in range(40):  # fresh connections: the kernel spreads them over the port's group
        with httpx.Client(base_url=server.url, timeout=30) as caller:
            answer = caller.post(
                "/endpoints/it-secure/invocations",
                content=b"[[5.1, 3.5, 1.4, 0.2]]",
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {key}",
                    "X-Amzn-SageMaker-Target-Container-Hostname": "customIps-iris",
                },
            )
            origins.append(
                (answer.status_code, answer.headers.get("x-Amzn-Invoked-Production-Variant"))
            )
    deadline = time.monotonic() + 60
    while not (
        got := server.client.invoke("it-hostile", {"collect_sockets": True}, target="tenant").body
    )["done"]:
        assert time.monotonic() < deadline, "the tenant's listeners did not finish"
        time.sleep(0.5)
    # each answered by it-secure
    assert all(status == 200 and variant for status, variant in origins), origins
    assert got["received"] == 0, got
    assert not found["connected"], found["connected"]
    stream_like = [entry for entry in found["bound"] if entry.split("/")[1] in ("1", "5")]
    assert not stream_like, stream_like


def test_the_embedded_gateways_ports_admit_no_second_listener(server) -> None:
    """One gateway on one machine binds its ports without SO_REUSEPORT: not even a process of the
    server's own user, in its own network namespace, can join them (before: any such process setting
    SO_REUSEPORT could)."""
    import socket

    for port in (int(server.url.rsplit(":", 1)[1]), int(server.grpc_target.rsplit(":", 1)[1])):
        with socket.socket() as intruder:
            intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with pytest.raises(OSError):
                intruder.bind(("127.0.0.1", port))


def test_the_control_planes_calls_need_the_capability(server) -> None:
    # The control plane runs in the registry's process: a caller without the control token can
    # neither make an API call there (here: delete an endpoint), nor read the console's data, nor
    # start it again with settings of its own. Until issue 60 it was a Serve application whose
    # `call` any holder of Ray's token reached through a Serve handle.
    from serving import protocol, ray_wing

    registry = ray_wing.registry_handle()
    guessed = "0" * 64
    call = registry.api_call.remote(
        guessed, protocol.SAGEMAKER_TARGET_PREFIX, "DeleteEndpoint", {"EndpointName": "it-secure"}
    )
    with pytest.raises(ray.exceptions.RayTaskError, match="refused api_call"):
        ray.get(call, timeout=30)
    with pytest.raises(ray.exceptions.RayTaskError, match="refused console"):
        ray.get(registry.console.remote(guessed, None), timeout=30)
    assert ray.get(registry.start_control.remote(guessed, {"port": 1}), timeout=30) is False
    # nor have the registry start gateways of its own (on a port of its choosing, say)
    plan = {"settings": {"port": 1}, "share_port": True, "env": {}}
    assert ray.get(registry.keep_gateways.remote(guessed, plan), timeout=30) is None
    assert server.client.describe_endpoint("it-secure")["EndpointStatus"] == "InService"
