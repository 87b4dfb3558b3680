"""The control plane's one restartable place: the SageMaker, Application Auto Scaling and CloudWatch
APIs, their state and their update step, the cluster's `GET /metrics` merge and CloudWatch's
sampler, as a Serve application of one replica on the head node (`serving-control`).

Every gateway authenticates an API call and hands it here (`call`); losing a gateway loses none of
this, and losing this replica interrupts no invocation (Serve starts another, which restores the
API's endpoints from its state file). What it reports is what every gateway routes with: it takes in
a registry snapshot, and publishes the API's routing, only once every live gateway has applied it
(`Registry.applied_everywhere`).

Its periodic work is three named tasks under `periodic`'s one policy (a failure logged, then a
back-off), on a loop of their own: following the registry, the API's step (restore, then creates and
updates) and CloudWatch's sampler.
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray
from ray import serve
from ray.serve import Application

from serving.cloudwatch.datapoints import RESOLUTION_S
from serving.console.overview import ConsoleJson, endpoint_detail, overview
from serving.control.records import ApiRouting
from serving.control.status import StatusBoard
from serving.documents import ApiJson
from serving.gateway.variants import Front
from serving.metrics.exposition import MetricsRoute
from serving.ray_wing.gateway_counters import published
from serving.ray_wing.names import ON_HEAD
from serving.ray_wing.operations import control_token, delete_endpoint, deploy_endpoint
from serving.ray_wing.periodic import PeriodicLoop
from serving.ray_wing.registry import registry_handle
from serving.sagemaker_api.routes import Answer
from serving.sagemaker_api.service import ControlApi
from serving.settings import ServerSettings, SettingsJson

logger = logging.getLogger("serving.ray_wing.control_plane")

API_TICK_S = 0.5  # how often the API completes creates and updates (when one is under way)
REGISTRY_WAIT_S = 10.0  # a snapshot call waits this long for a change before answering "none"
SAMPLE_LAG_S = (
    0.2  # past each RESOLUTION_S boundary: the interval that just ended is the one recorded
)
IDLE_NODES_S = (
    60.0  # how often an idle server's CloudWatch sampler reads the nodes' replica metrics
)
APPLIED_WAIT_S = (
    5.0  # the longest it waits for every gateway to apply a version (a gateway may have just died)
)


class ControlPlane:
    """A Serve replica running the control-plane API over the registry."""

    def __init__(self, settings: SettingsJson) -> None:
        self.settings = ServerSettings(**settings)
        self.registry = registry_handle()
        self.token = control_token()
        self.board = StatusBoard()
        self.version, self.epoch = -1, None
        self.api = ControlApi(self.settings, _Deployer(self))
        self.metrics = MetricsRoute(
            [], metrics_export_urls, peers=lambda: asyncio.to_thread(published)
        )
        self._restored = False
        sampler = _Sampler(self)
        self.periodic = PeriodicLoop(
            "control-plane-periodic",
            {
                "follow registry": (lambda: asyncio.to_thread(self._follow_registry), 0.0),
                "api step": (lambda: asyncio.to_thread(self._step), API_TICK_S),
                "cloudwatch sampler": (sampler.step, 0.0),
            },
        )

    async def call(self, prefix: str, operation: str, document: ApiJson) -> Answer:
        """One authorized API call (a gateway authenticated and authorized it)."""
        return await asyncio.to_thread(self.api.call, prefix, operation, document)

    async def console(self, endpoint: str | None) -> ConsoleJson | None:
        """The operator console's data (the gateway authorized its viewer): every endpoint (None),
        or one endpoint whole (None: no such endpoint), in one call."""
        descriptions = self.board.descriptions
        if endpoint is None:
            return await asyncio.to_thread(overview, self.api, descriptions)
        return await asyncio.to_thread(endpoint_detail, self.api, descriptions, endpoint)

    async def scrape(self, local: bytes, gateway: str) -> bytes:
        """`GET /metrics` of the gateway `gateway`: its own series (`local`, current) with every
        node's replica metrics and every other gateway's published counters, merged here rather than
        on the data path."""
        return await self.metrics.scrape(local, skip=gateway)

    def check_health(self) -> None:
        stopped = self.periodic.stopped()
        if stopped:
            raise RuntimeError(f"the control plane's periodic tasks stopped: {', '.join(stopped)}")

    def __del__(self) -> None:
        """Serve stops this replica: its periodic tasks end first."""
        if hasattr(self, "periodic"):
            self.periodic.close()

    def wait_applied(self, version: int) -> None:
        """Wait, bounded, until every live gateway routes with `version` of the registry."""
        deadline = time.monotonic() + APPLIED_WAIT_S
        while time.monotonic() < deadline:
            if ray.get(self.registry.applied_everywhere.remote(version), timeout=30):
                return
            time.sleep(0.02)
        logger.warning(
            "not every gateway applied registry version %d within %.0f s", version, APPLIED_WAIT_S
        )

    def _follow_registry(self) -> None:
        """Read the registry's next snapshot (a long poll: it answers once the registry changes,
        else "none" after REGISTRY_WAIT_S), and take it in once every gateway routes with it."""
        call = self.registry.snapshot.remote(self.version, REGISTRY_WAIT_S, self.epoch)
        snapshot = ray.get(call, timeout=REGISTRY_WAIT_S + 30)
        if snapshot is not None:
            self.wait_applied(snapshot["version"])  # what the API reports, every gateway routes
            self.board.read(snapshot)
            self.version, self.epoch = snapshot["version"], snapshot["epoch"]

    def _step(self) -> None:
        """Bring back the API's stored endpoints once the registry is read, then complete creates
        and updates."""
        if not self._restored and self.board.loaded:
            self.api.sagemaker.restore()
            self._restored = True
        if self._restored:
            self.api.sagemaker.tick()


class _Sampler:
    """Every RESOLUTION_S, on its boundary: the merged metrics into CloudWatch's store, then its
    alarms.

    The gateways' counters are read every time (from the GCS); the nodes' replica metrics, whose
    exposition costs each node's metrics agent a fraction of a second, only while something was
    invoked in the last interval, else every IDLE_NODES_S (utilization then has SageMaker's 1-minute
    resolution)."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        # Its own: an aiohttp session belongs to one event loop, and the scrapes run on the
        # replica's.
        self.source = MetricsRoute(
            [], metrics_export_urls, peers=lambda: asyncio.to_thread(published)
        )
        self.busy, self.nodes_read = True, 0.0

    async def step(self) -> None:
        await asyncio.sleep(RESOLUTION_S - time.time() % RESOLUTION_S + SAMPLE_LAG_S)
        nodes = self.busy or time.monotonic() - self.nodes_read >= IDLE_NODES_S - 1
        families = await self.source.merged(nodes=nodes)
        self.nodes_read = time.monotonic() if nodes else self.nodes_read
        self.busy = await asyncio.to_thread(
            self.control.api.cloudwatch.observe, families, time.time()
        )


class _Deployer:
    """What the API drives: the registry (apply, delete, the API's routing) and the board of
    descriptions."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control

    def apply(self, spec):
        return deploy_endpoint(spec, self.control.settings)

    def delete(self, name: str) -> bool:
        return delete_endpoint(name, wait=False)

    def descriptions(self):
        return self.control.board.descriptions

    def set_fronts(self, fronts: dict[str, Front]) -> None:
        """Publish the API's routing through the registry, and return once every gateway routes with
        it."""
        routing: ApiRouting = {
            "fronts": {
                name: [
                    (variant.name, variant.endpoint, variant.weight) for variant in front.variants
                ]
                for name, front in fronts.items()
            },
            "shadows": {
                name: [(shadow.name, shadow.endpoint, shadow.share) for shadow in front.shadows]
                for name, front in fronts.items()
                if front.shadows
            },
            "served": sorted(self.control.api.sagemaker.served_names()),
        }
        version = ray.get(
            self.control.registry.publish_api.remote(self.control.token, routing), timeout=30
        )
        if not version:
            raise RuntimeError(
                "the registry refused the API's routing: this process lacks the cluster's token"
            )
        self.control.wait_applied(version)

    def capacity(self):
        return ray.cluster_resources()


async def metrics_export_urls() -> list[str]:
    """Where each live Ray node's metrics agent serves what the replicas on that node record."""
    nodes = await asyncio.to_thread(ray.nodes)  # a GCS call: off the event loop
    return [
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in nodes
        if node.get("Alive") and node.get("MetricsExportPort")
    ]


def control_plane_target(settings: ServerSettings) -> Application:
    """The control plane as a bound Serve deployment (`server_start` deploys it, or replaces it
    with new settings, beside the gateways)."""
    control = serve.deployment(ControlPlane).options(  # type: ignore[attr-defined]  # Ray's overloads
        name="control",
        num_replicas=1,
        # calls queue in the replica, behind the API's one lock, not in each gateway
        max_ongoing_requests=64,
        health_check_period_s=5,
        ray_actor_options={"num_cpus": 0, "resources": ON_HEAD},
    )
    return control.bind(settings.model_dump())
