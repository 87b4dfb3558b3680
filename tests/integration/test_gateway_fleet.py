"""serving.ray_wing.gateway_fleet: the gateways are plain Ray actors that the registry keeps, not
Serve replicas. On the session's server: a gateway that cannot bind names its reason, and
one whose HTTP server stops is restarted by the registry's health check (a killed one, by Ray:
test_reliability). A node that joins gets its gateway: tests/multinode."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
import ray
from suite.processes import holders

from serving.ray_wing import gateway_fleet
from serving.ray_wing.names import NAMESPACE
from serving.ray_wing.serve_status import serve_running, serve_status

ENDPOINTS: dict = {}  # none: the session's server alone


def _where(gateway) -> int:
    """The gateway's PID, once it answers (a restarting actor is briefly unavailable)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return ray.get(gateway.where.remote(), timeout=30)[1]
        except ray.exceptions.ActorUnavailableError:
            assert time.monotonic() < deadline, "the gateway stayed unavailable"
            time.sleep(0.5)


def _serves(url: str) -> bool:
    """Whether the gateway answers (not /ping, which waits for every gateway the registry knows to
    have read its table, the one that could not start included, until the registry forgets it)."""
    try:
        return httpx.get(f"{url}/endpoints", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_gateway_is_a_plain_actor_not_a_serve_replica(server) -> None:
    names = gateway_fleet.gateway_names()
    assert len(names) == 1, names  # one node, one gateway
    (holder,) = holders(server.url)
    assert holder.cmdline()[0].startswith("ray::NodeGateway"), holder.cmdline()
    # Serve runs only once a container it runs (a RuntimeEnvironment's, in other modules) started it
    if serve_running():
        assert not [name for name in serve_status() if name.startswith("serving-gateway")]


def test_a_gateway_that_cannot_bind_names_its_reason(server, ray_server) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        settings = ray_server.settings.model_copy(
            update={"port": port, "grpc_port": None, "grpc_tls_cert": None, "grpc_tls_key": None}
        )
        plan: gateway_fleet.GatewayPlan = {
            "settings": settings.model_dump(),
            "share_port": False,
            "env": {},
        }
        name = f"test-gateway:{time.time_ns()}"  # not one the registry keeps
        gateway_fleet._start(plan, name, ray.get_runtime_context().get_node_id())
        with pytest.raises(RuntimeError, match="[Aa]ddress already in use"):
            gateway_fleet.wait_serving([name], timeout=120)
    # started once, not again and again: its name is free
    with pytest.raises(ValueError):
        ray.get_actor(name, namespace=NAMESPACE)
    assert _serves(server.url)


def test_a_gateway_whose_server_stopped_is_restarted_by_the_registry(server) -> None:
    (name,) = gateway_fleet.gateway_names()
    gateway = ray.get_actor(name, namespace=NAMESPACE)
    before = _where(gateway)
    ray.get(gateway.stop.remote(), timeout=60)  # its process lives on, its port closed
    assert not _serves(server.url)
    stopped = time.monotonic()
    deadline = stopped + gateway_fleet.CHECK_S + 60
    while not _serves(server.url):
        assert time.monotonic() < deadline, "the stopped gateway was not restarted"
        time.sleep(0.2)
    print(f"gateway answered again {time.monotonic() - stopped:.1f} s after its server stopped")
    after = _where(gateway)
    assert after != before  # a new process, the same actor
