"""The gateway replica: the endpoint HTTP server on the head node, and how the control plane starts it."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import ray
from ray import serve
from starlette.applications import Starlette

from serving.access.decision import EndpointAccess, configure_audit_log
from serving.access.identities import Identities
from serving.config.spec import DEFAULT_MAX_CONCURRENCY
from serving.control.status import EndpointRecord, StatusBoard
from serving.gateway.control_routes import ControlRoutes
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.server import BackgroundServer, HttpLimits
from serving.metrics.exposition import MetricsRoute
from serving.metrics.invocations import (
    REGISTRY,
    DesiredReplicasCollector,
    ReplicaCountCollector,
)
from serving.ray_wing.names import GATEWAY_APP, ON_HEAD
from serving.ray_wing.operations import (
    control_token,
    delete_endpoint,
    deploy_endpoint,
    root_secret,
)
from serving.ray_wing.registry import registry_handle
from serving.settings import ServerSettings
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.gateway")


# --- gateway ------------------------------------------------------------------------
class Gateway:
    """A Serve replica running the endpoint HTTP server: router plus control routes."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = ServerSettings(**settings)
        configure_audit_log()  # access decisions: JSON lines on this replica's stderr
        self.registry = registry_handle()
        self._control = control_token()
        root = root_secret()
        hop_keys: dict[tuple[str, str], bytes] = {}

        def hop_key(endpoint: str, container: str) -> bytes:
            key = hop_keys.get((endpoint, container))
            if key is None:
                key = hop_keys[(endpoint, container)] = keys.hop_key(root, endpoint, container)
            return key

        self.transport = ContainerTransport(default_limit=DEFAULT_MAX_CONCURRENCY, hop_key=hop_key)
        self._identities: dict[tuple[str, str], EndpointAccess] = {}  # (file, fingerprint) -> access, loaded once
        self.router = Router(self.settings, self.transport)
        self.router.loaded = False  # until the first registry snapshot
        self.board = StatusBoard()
        self.access: dict[str, EndpointAccess] = {}
        self.metrics = MetricsRoute([REGISTRY, ReplicaCountCollector(self._replica_counts),
                                     DesiredReplicasCollector(self._desired_replicas)], _metrics_export_urls)
        control = ControlRoutes(keys.http_control_token(root), apply=lambda spec: deploy_endpoint(spec, self.settings),
                                delete=delete_endpoint, describe=lambda name: self.board.descriptions.get(name))
        app = Starlette(routes=self.board.routes() + control.routes() + self.router.routes() + self.metrics.routes(),
                        lifespan=self._lifespan)
        self.server = BackgroundServer(app, self.settings.host, self.settings.port, HttpLimits.from_settings(self.settings))
        if not self.server.wait_started():
            raise RuntimeError(f"endpoint server did not start on {self.server.url}")

    def _lifespan(self, app):
        gateway = self

        class _Lifespan:
            async def __aenter__(self):
                await gateway.transport.start()
                self.task = asyncio.create_task(gateway._poll_registry())

            async def __aexit__(self, *exc):
                self.task.cancel()
                await gateway.transport.close()
                await gateway.metrics.close()

        return _Lifespan()

    async def _poll_registry(self) -> None:
        version, epoch, known = -1, None, 0
        while True:
            try:
                snapshot = await asyncio.wrap_future(self.registry.snapshot.remote(version).future())
                if snapshot is not None:
                    if snapshot["epoch"] != epoch and known and not snapshot["endpoints"]:
                        # A registry that lost its store would empty the table: keep serving what we know.
                        logger.error("a new registry knows no endpoint; keeping the %d this gateway routes to", known)
                    else:
                        version, epoch, known = snapshot["version"], snapshot["epoch"], len(snapshot["endpoints"])
                        self._apply(snapshot)
                for url in self.transport.take_dropped():
                    self.registry.deregister.remote(url, token=self._control)
            except Exception:
                logger.exception("registry poll failed")
            await asyncio.sleep(self.settings.registry_poll_s)

    def _apply(self, snapshot: dict[str, Any]) -> None:
        """Swap in the registry's view: descriptions, replica lists, access, the router's table."""
        records = {name: EndpointRecord.from_snapshot(document) for name, document in snapshot["endpoints"].items()}
        for name, record in records.items():
            scaling = snapshot.get("scaling", {}).get(name, {})
            record.scaling = scaling.get("containers", {})
            record.scaling_activities = scaling.get("activities", [])
        self.board.records = records
        self.board.refresh(snapshot["statuses"], snapshot["registered"])
        limits = {(name, host): limit for name, record in records.items() for host, limit in record.limits.items()}
        once = {(name, host) for name, record in records.items() for host in record.not_idempotent}
        self.transport.update(snapshot["replicas"], limits, once)
        self.access = self._access_of(records)
        self.router.endpoints = {
            name: EndpointRoute(name, record.mode, tuple(c["ContainerHostname"] for c in record.containers),
                                failure=self.board.failure(name), access=self.access.get(name),
                                multi_model=frozenset(c["ContainerHostname"] for c in record.containers
                                                      if c["Mode"] == "MultiModel"))
            for name, record in records.items()
        }
        self.router.loaded = True

    def _desired_replicas(self) -> dict[tuple[str, str], int]:
        """Each container's desired count: its autoscaler's last decision, else the count it was deployed with."""
        return {(name, c["ContainerHostname"]): record.scaling.get(c["ContainerHostname"], {}).get(
                    "DesiredReplicas", c["DesiredReplicas"])
                for name, record in self.board.records.items() for c in record.containers}

    def _replica_counts(self) -> dict[tuple[str, str], int]:
        return {(name, container): self.transport.replica_count(name, container)
                for name, route in self.router.endpoints.items() for container in route.containers}

    def _access_of(self, records: dict[str, EndpointRecord]) -> dict[str, EndpointAccess]:
        """Access control of each endpoint that has it: the gateway reads each identities file itself
        (the registry names it, never its contents), once per file and fingerprint."""
        access, loaded = {}, {}
        for name, record in records.items():
            if record.access is None:
                continue
            reference = (record.access["IdentitiesFile"], record.access["Fingerprint"])
            if reference not in loaded:
                loaded[reference] = self._identities.get(reference)
            if loaded[reference] is None:
                try:
                    loaded[reference] = EndpointAccess.from_reference(
                        record.access, region=self.settings.region, account_id=self.settings.account_id)
                except Exception as error:  # validated at deploy; if not, refuse every call rather than serve openly
                    logger.error("access control of endpoint %s could not be loaded on the gateway; refusing its "
                                 "calls: %s", name, error)
                    loaded[reference] = EndpointAccess(  # no identities: nobody authenticates
                        Identities([]), region=self.settings.region, account_id=self.settings.account_id)
            access[name] = loaded[reference]
        self._identities = {key: value for key, value in loaded.items() if value.identities.identities}
        return access

    def check_health(self) -> None:
        if not self.server.alive:
            raise RuntimeError("endpoint HTTP server stopped")

    def url(self) -> str:
        return self.server.url

    def __del__(self) -> None:
        self.server.stop()


async def _metrics_export_urls() -> list[str]:
    """Where each live Ray node's metrics agent serves what the replicas on that node record."""
    nodes = await asyncio.to_thread(ray.nodes)  # a GCS call: off the event loop
    return [f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
            for node in nodes if node.get("Alive") and node.get("MetricsExportPort")]


# --- control-plane operations ---------------------------------------------------------
def start_gateway(settings: ServerSettings) -> str:
    """Start Serve without its own proxy, the registry, and the endpoint HTTP server; returns its URL.

    Port 0 is resolved here, to a port free on this machine (where the head node is, for the embedded server),
    so that a gateway that Serve restarts binds the same port again and clients find it.
    """
    if settings.port == 0:
        with socket.socket() as probe:
            probe.bind((settings.host, 0))
            settings = settings.model_copy(update={"port": probe.getsockname()[1]})
    serve.start(proxy_location="Disabled")
    registry_handle()
    gateway = serve.deployment(Gateway).options(
        name="gateway", num_replicas=1, max_ongoing_requests=8, health_check_period_s=5,
        ray_actor_options={"num_cpus": 0, "resources": ON_HEAD},
    )
    try:
        handle = serve.run(gateway.bind(settings.model_dump()), name=GATEWAY_APP, route_prefix=None)
    except RuntimeError as error:
        raise RuntimeError(f"could not start the endpoint server on {settings.host}:{settings.port}: {error}") from None
    return handle.url.remote().result(timeout_s=30)
