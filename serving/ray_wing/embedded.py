"""The one embedded server: Ray (started here or joined), the gateway and its endpoints, as a context manager.

`serving up`, the integration tests' session server and every benchmark in loadtests/ start the same way:

    with EmbeddedServer([spec], ServerSettings(port=0), num_cpus=2) as server:
        httpx.post(f"{server.url}/endpoints/{spec.EndpointName}/invocations", ...)

Entering starts an embedded Ray (or connects to the cluster at `address`), the gateway, deploys the specs and
waits, bounded, until each endpoint is InService *in the gateway's own view over HTTP* (`GET /endpoints/{name}`:
the router routes with what that reports) with a ready replica for every container, and `GET /ping` answers
200 when the gateway knows no other endpoint (docs/reliability.md: 200 only when every known endpoint is
routable). Leaving stops what entering started and nothing more: an embedded Ray is shut down; on a cluster it
merely joined, the endpoints it deployed are deleted (unless `keep_endpoints`) and the driver disconnects,
leaving the gateway and everything else running, as `serving up --address` always has.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

import ray

from serving import protocol
from serving.config.spec import EndpointSpec
from serving.control.records import EndpointDescription, Snapshot
from serving.model_server import forked
from serving.ray_wing.cluster import connect_cluster, start_local_ray, stop_local_ray
from serving.ray_wing.operations import (
    delete_endpoint,
    deploy_endpoint,
    describe_endpoints,
    disconnect,
    expect_endpoints,
    shutdown,
)
from serving.ray_wing.registry import registry_handle
from serving.ray_wing.server_start import gateway_url, start_gateway
from serving.settings import ServerSettings

if TYPE_CHECKING:
    import httpx

SETTLED = ("InService", "Failed")


class EndpointsNotReady(RuntimeError):
    """Entering with `wait=True`: an endpoint failed, or was not InService and routable within the
    timeout."""

    def __init__(self, readiness: Readiness) -> None:
        super().__init__(readiness.explain())
        self.readiness = readiness


@dataclass
class Readiness:
    """What one bounded wait saw last: each endpoint's description and why the server is not ready
    (if so)."""

    # as the gateway answered (the registry's view if it is unreachable)
    descriptions: dict[str, EndpointDescription]
    pending: list[str] = field(default_factory=list)  # neither InService nor Failed yet
    failed: list[str] = field(default_factory=list)
    unroutable: list[str] = field(
        default_factory=list
    )  # InService, yet the gateway cannot route it (or /ping says why)
    # "gateway" (HTTP) or "registry" (the gateway's URL did not answer from here)
    source: str = "gateway"

    @property
    def settled(self) -> bool:
        """Every endpoint is InService or Failed."""
        return not self.pending

    @property
    def ready(self) -> bool:
        """Every endpoint InService and routable through the gateway."""
        return not self.pending and not self.failed and not self.unroutable

    def status(self, name: str) -> tuple[str, str | None]:
        """The endpoint's last status and failure reason (`Creating` if the gateway did not know it
        yet)."""
        description = self.descriptions.get(name)
        return (
            (description["EndpointStatus"], description["FailureReason"])
            if description
            else ("Creating", None)
        )

    def explain(self) -> str:
        parts = [f"{name}: Failed ({self.status(name)[1]})" for name in self.failed]
        parts += [f"{name}: {self.status(name)[0]}" for name in self.pending]
        parts += self.unroutable
        return "endpoints not ready: " + "; ".join(parts) if parts else "ready"


class EmbeddedServer:
    """Ray, the endpoint server and `specs`, running while the `with` block runs.

    `address`: join that Ray cluster instead of starting one (`allow_unauthenticated_ray` as for
    `serving up`). `wait`: on entering, wait up to `ready_timeout_s` until every endpoint is ready,
    else raise EndpointsNotReady (after stopping what was started); with `wait=False` call
    `wait_ready` yourself. `after_ray_start` runs once Ray is up (ray.init installs signal handlers
    of its own: a caller's must come after).
    """

    def __init__(
        self,
        specs: Iterable[EndpointSpec] = (),
        settings: ServerSettings | None = None,
        *,
        address: str | None = None,
        allow_unauthenticated_ray: bool = False,
        num_cpus: int | None = None,
        wait: bool = True,
        ready_timeout_s: float = 180.0,
        keep_endpoints: bool = False,
        after_ray_start: Callable[[], None] | None = None,
    ) -> None:
        settings = settings or ServerSettings(port=0)
        if not address:  # one machine: nothing else needs to reach a data port (docs/security.md)
            settings = settings.model_copy(update={"container_host": "127.0.0.1"})
        self.specs = list(specs)
        self.settings = settings  # the ports are the ones bound once entered (port 0 resolved)
        self.address = address
        self.url = ""
        self._allow_unauthenticated, self._num_cpus = allow_unauthenticated_ray, num_cpus
        self._wait, self.ready_timeout_s, self.keep_endpoints = (
            wait,
            ready_timeout_s,
            keep_endpoints,
        )
        self._after_ray_start = after_ray_start
        # "embedded" or "joined" while this object holds a Ray connection
        self._ray: str | None = None
        self._deployed: list[str] = []  # endpoint names, in deploy order, to delete on a cluster

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self._start()
            if self._wait:
                readiness = self.wait_ready()
                if not readiness.ready:
                    raise EndpointsNotReady(readiness)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self) -> None:
        if self.address:
            connect_cluster(self.address, allow_unauthenticated=self._allow_unauthenticated)
            self._ray = "joined"
        else:
            try:
                start_local_ray(num_cpus=self._num_cpus)
            except BaseException:
                stop_local_ray()  # whatever ray.init left, and this run's token
                raise
            self._ray = "embedded"
        if self._after_ray_start is not None:
            self._after_ray_start()
        # The endpoints are deployed while the control plane and the gateways start: every
        # replica starts at once. They are expected before any gateway starts: its first 200 on
        # /ping then means these endpoints route (issue 43).
        self.settings = start_gateway(
            self.settings,
            exclusive=not self.address,
            meanwhile=self._deploy_specs,
            expected=[spec.EndpointName for spec in self.specs],
            stacks=self._stacks(),
        )
        self.url = gateway_url(self.settings)

    def _stacks(self) -> list[str]:
        """The stacks whose templates this server's first containers will fork from (a container
        with a `RuntimeEnvironment` runs in Ray's environment for it, whose template is its own)."""
        if not self.settings.fork_templates:
            return []
        return forked.stacks_to_warm(
            (container.Image, container.Environment, container.Resources.Gpus)
            for spec in self.specs
            for container in spec.Containers
            if container.RuntimeEnvironment is None
        )

    def _deploy_specs(self, settings: ServerSettings) -> None:
        self.settings = settings  # the ports resolved: the endpoints' records carry them
        for spec in self.specs:  # one call each: Serve starts their replicas a little apart
            self.deploy(spec)

    def close(self) -> None:
        """Stop what entering started (idempotent): the embedded Ray, or this server's endpoints on
        a cluster."""
        held, self._ray = self._ray, None
        if held == "embedded":
            shutdown()
            from serving.model_server import scratch

            scratch.sweep()  # a killed replica's scratch folder: its supervisor could not remove it
        elif held == "joined":
            try:
                if not self.keep_endpoints:
                    # leave the rest of the cluster's Serve applications alone
                    for name in self._deployed:
                        delete_endpoint(name)
                # Expected but never deployed (a failed start): no gateway waits for them any
                # longer.
                expect_endpoints(
                    [s.EndpointName for s in self.specs if s.EndpointName not in self._deployed],
                    False,
                )
            finally:
                disconnect()

    # --- what callers do with it ------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The endpoints deployed through this server, in order."""
        return list(self._deployed)

    def deploy(self, spec: EndpointSpec) -> int:
        """Create or update an endpoint (blue/green); returns its update's generation without
        waiting."""
        generation = deploy_endpoint(spec, self.settings)
        if spec.EndpointName not in self._deployed:
            self._deployed.append(spec.EndpointName)
        return generation

    def delete(self, name: str) -> bool:
        """Delete an endpoint and wait (bounded) for its applications to go; False if it was
        unknown."""
        if name in self._deployed:
            self._deployed.remove(name)
        return delete_endpoint(name)

    def describe(self) -> dict[str, EndpointDescription]:
        """Every endpoint's description, from the registry (no HTTP)."""
        return describe_endpoints()

    def snapshot(self) -> Snapshot:
        """The registry's state now: endpoint records, replica data-port URLs per (endpoint,
        container), statuses."""
        return ray.get(registry_handle().snapshot.remote(-1), timeout=60)

    def wait_ready(
        self,
        names: Iterable[str] | None = None,
        timeout: float | None = None,
        interval: float = 0.2,
    ) -> Readiness:
        """Wait (at most `timeout`, default `ready_timeout_s`) until the endpoints (default: all
        deployed here) are settled and, unless one failed, routable; returns what was seen last,
        ready or not."""
        import httpx  # here, not before Ray starts: `serving up` is one core's work until then

        wanted = list(self._deployed if names is None else names)
        deadline = time.monotonic() + (self.ready_timeout_s if timeout is None else timeout)
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while True:
                readiness = self._look(client, wanted)
                if readiness.settled and (readiness.failed or not readiness.unroutable):
                    return readiness
                if time.monotonic() >= deadline:
                    return readiness
                time.sleep(interval)

    def _look(self, client: httpx.Client, names: list[str]) -> Readiness:
        import httpx

        try:
            descriptions = {}
            for name in names:
                response = client.get(f"/endpoints/{name}")
                if response.status_code == 200:
                    descriptions[name] = response.json()
            known = {
                e["EndpointName"] for e in client.get("/endpoints").json().get("Endpoints", [])
            }
            ping = (
                client.get(protocol.PING_PATH) if known <= set(names) else None
            )  # /ping answers for every known endpoint
        # e.g. a cluster's gateway this machine cannot reach
        except (httpx.TransportError, ValueError):
            found = describe_endpoints()
            descriptions, ping = {name: found[name] for name in names if name in found}, None
            source = "registry"
        else:
            source = "gateway"
        readiness = Readiness(descriptions, source=source)
        for name in names:
            status, _ = readiness.status(name)
            if status == "Failed":
                readiness.failed.append(name)
            elif status != "InService":
                readiness.pending.append(name)
            elif idle := [
                c["ContainerHostname"]
                for c in descriptions[name]["Containers"]
                if not c["CurrentReplicas"]
            ]:
                readiness.unroutable.append(f"{name}: no ready replica of {', '.join(idle)}")
        if ping is not None and ping.status_code != 200 and not readiness.unroutable:
            readiness.unroutable.append(f"GET /ping: {ping.status_code} {ping.text[:300]}")
        return readiness
