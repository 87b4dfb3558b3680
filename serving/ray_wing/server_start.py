"""Starting a server: the registry with the control plane in it, the gateways (plain Ray actors
that the registry keeps on every node: `gateway_fleet`) and the caller's endpoints alongside, so
that they start at once rather than one after another. No Serve: its controller starts only for a
container Serve runs."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

import ray

from serving.ray_wing.container_host import host_on
from serving.ray_wing.gateway_fleet import GatewayPlan, wait_serving
from serving.ray_wing.operations import control_token, expect_endpoints
from serving.ray_wing.registry import registry_handle
from serving.settings import ServerSettings

# How long the control plane and the gateways may take to run.
START_TIMEOUT_S = 300.0


def start_gateway(
    settings: ServerSettings,
    exclusive: bool = False,
    meanwhile: Callable[[ServerSettings], object] | None = None,
    expected: Sequence[str] = (),
    stacks: Sequence[str] = (),
) -> ServerSettings:
    """Start the registry with the control plane in it, and the gateways (`gateways_per_node` on
    every node, sharing the port, kept there by the registry); returns the settings they serve with
    (`gateway_url` formats this machine's).

    Port 0 is resolved here (the gRPC port too), to a port free on this machine (where the head node
    is, for the embedded server), so that a gateway that Ray restarts binds the same port again
    and clients find it. `exclusive`: refuse a port that anything on this machine holds (gateways
    share theirs with SO_REUSEPORT, so another server of this user would otherwise share it
    silently); a server joining a cluster may find its own gateways there.

    The registry's and this node's container host's Ray workers start together, and the host starts
    the templates of `stacks` (those its first containers fork from) meanwhile. The endpoints
    `expected` are made known to the registry before any gateway starts: a gateway's first 200 on
    /ping then means they route. The control plane starts in the registry's process while the
    gateways start, and `meanwhile(settings)` runs while they do (`serving up` deploys its
    endpoints there), so that everything starts at once; this returns once the control plane and
    the gateways run. A gateway that takes an API call before the control plane runs holds it until
    it does (`API_CALL_TIMEOUT_S`).
    """
    if settings.port == 0 or exclusive:
        settings = settings.model_copy(update={"port": _free_port(settings.host, settings.port)})
    if settings.grpc_port is not None and (settings.grpc_port == 0 or exclusive):
        settings = settings.model_copy(
            update={"grpc_port": _free_port(settings.host, settings.grpc_port)}
        )
    per_node, nodes = (
        settings.gateways_per_node,
        [node for node in ray.nodes() if node.get("Alive")],
    )
    fewest = min((int(node.get("Resources", {}).get("CPU", 0)) for node in nodes), default=0)
    if per_node > 1 and per_node > fewest:
        raise RuntimeError(
            f"--gateways-per-node {per_node} is more than a node of this cluster has CPUs ({fewest}): each gateway "
            "of a node wants a core of its own"
        )
    registry = registry_handle()  # its worker starts now, beside the host's
    if settings.node_hosts:
        _start_container_host(stacks)
    _start_registry(feed_host(settings))
    expect_endpoints(list(expected))
    control = registry.start_control.remote(control_token(), settings.model_dump())
    # One gateway on one machine (the embedded server's default) binds its ports for itself alone.
    share_port = not (exclusive and per_node == 1)
    plan: GatewayPlan = {
        "settings": settings.model_dump(),
        "share_port": share_port,
        "env": _tracing_environment(),
    }
    gateways = ray.get(registry.keep_gateways.remote(control_token(), plan), timeout=60)
    if gateways is None:
        raise RuntimeError(
            "could not start the gateways: the registry refused this process's token"
        )
    if meanwhile is not None:
        meanwhile(settings)
    _wait_control(control)
    try:
        wait_serving(gateways, START_TIMEOUT_S)
    except RuntimeError as error:
        raise RuntimeError(
            f"could not start the endpoint server on {settings.host}:{settings.port}: {error}"
        ) from None
    return settings


def feed_host(settings: ServerSettings) -> str | None:
    """Where the registry's snapshot feed binds: where data ports do (loopback for the embedded server,
    the node's address on a cluster), or nowhere (`--no-registry-feed`)."""
    return settings.container_host if settings.registry_feed else None


def _start_registry(feed: str | None) -> None:
    """The registry, started (or found) with its snapshot feed open on `feed`, or closed."""
    ray.get(registry_handle().open_feed.remote(control_token(), feed), timeout=60)


def _start_container_host(stacks: Sequence[str]) -> None:
    """This node's container host, started with the rest rather than at the first deploy, whose
    replicas would otherwise wait for its Ray worker too (`container_host`), and the templates of
    `stacks` started in it, each on a thread of its own (a framework's import takes seconds)."""
    host = host_on(ray.get_runtime_context().get_node_id())
    for stack in stacks:
        host.warm.remote(stack)


def _wait_control(started: ray.ObjectRef) -> None:
    """Wait, bounded, until the registry runs the control plane; raise with its reason if it could
    not start (`control_seat`)."""
    try:
        allowed = ray.get(started, timeout=START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"could not start the control plane: not running after {START_TIMEOUT_S:.0f} s"
        ) from None
    except ray.exceptions.RayTaskError as error:
        raise RuntimeError(f"could not start the control plane: {error.cause}") from None
    if not allowed:
        raise RuntimeError(
            "could not start the control plane: the registry refused this process's token"
        )


def _tracing_environment() -> dict[str, str]:
    """The `OTEL_*` variables of the process running `serving up`, for the gateways wherever they
    run (docs/tracing.md); none when it has none, so an untraced server's gateways start in Ray's
    plain workers."""
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


def _free_port(host: str, port: int) -> int:
    """`port` (0: one the kernel picks) once it is known that nothing on this machine holds it."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # as the gateway will: TIME_WAIT is no owner
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise RuntimeError(f"cannot bind {host}:{port}: {error.strerror}") from None
        return probe.getsockname()[1]


def gateway_url(settings: ServerSettings) -> str:
    """This machine's gateway URL, as its server formats it (made here, without a call to a
    gateway)."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}"
