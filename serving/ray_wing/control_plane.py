"""The control plane: the SageMaker, Application Auto Scaling and CloudWatch APIs, their state and
their update step, the cluster's `GET /metrics` merge and CloudWatch's sampler, run in the registry's
process on the head node (`control_seat` seats it there; it was a Serve application of its own, a
Ray worker of ~110 MiB beside the registry it reads and writes).

Every gateway authenticates an API call and hands it here through the registry's handle (`call`);
losing a gateway loses none of this, and losing the registry's process interrupts no invocation (Ray
restarts it, and the control plane with it, which restores the API's endpoints from its state file).
What it reports is what every gateway routes with: it takes in a registry snapshot, and publishes
the API's routing, only once every live gateway has applied it (`Registry.applied_everywhere`).

Its periodic work is three named tasks under `periodic`'s one policy (a failure logged, then a
back-off), on a loop of their own: following the registry, the API's step (restore, then creates and
updates) and CloudWatch's sampler. The `/metrics` merge runs on that loop too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from serving.cloudwatch.datapoints import RESOLUTION_S
from serving.console.overview import ConsoleJson, endpoint_detail, overview
from serving.control.records import ApiRouting
from serving.control.status import StatusBoard
from serving.documents import ApiJson
from serving.gateway.variants import Front
from serving.metrics.exposition import MetricsRoute
from serving.ray_wing.gateway_counters import published
from serving.ray_wing.operations import control_token, delete_endpoint, deploy_endpoint
from serving.ray_wing.periodic import PeriodicLoop
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
SCRAPE_TIMEOUT_S = 10.0  # Prometheus's default scrape timeout


class ControlPlane:
    """The control-plane API over the registry whose process runs it (`registry`: its handle)."""

    def __init__(self, settings: SettingsJson, registry: Any) -> None:
        self.settings = ServerSettings(**settings)
        self.registry = registry
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

    def call(self, prefix: str, operation: str, document: ApiJson) -> Answer:
        """One authorized API call (a gateway authenticated and authorized it)."""
        return self.api.call(prefix, operation, document)

    def console(self, endpoint: str | None) -> ConsoleJson | None:
        """The operator console's data (the gateway authorized its viewer): every endpoint (None),
        or one endpoint whole (None: no such endpoint), in one call."""
        descriptions = self.board.descriptions
        if endpoint is None:
            return overview(self.api, descriptions)
        return endpoint_detail(self.api, descriptions, endpoint)

    def scrape(self, local: bytes, gateway: str) -> bytes:
        """`GET /metrics` of the gateway `gateway`: its own series (`local`, current) with every
        node's replica metrics and every other gateway's published counters, merged here rather than
        on the data path (on the periodic loop, which owns the scrapes' HTTP session)."""
        merged = self.periodic.submit(self.metrics.scrape(local, skip=gateway))
        return merged.result(SCRAPE_TIMEOUT_S)

    def stopped(self) -> list[str]:
        """Its periodic tasks that no longer run (`control_seat` then starts it afresh)."""
        return self.periodic.stopped()

    def close(self) -> None:
        """Replaced or stopped: its periodic tasks end first."""
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
        # Its own, though on the same loop as the gateways' scrapes: each keeps its peers' parse.
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
