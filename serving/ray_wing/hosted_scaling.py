"""Target tracking for container versions on container hosts, run by the registry: what Serve's
controller does for a Serve application (each replica's autoscaling stats every
METRICS_INTERVAL_S, averaged over LOOK_BACK_S, handed to the container's `ContainerAutoscaler`),
after which `node_hosting` resizes the version's slots. A new replica is then a fork on a host
already running, not a Ray worker's start.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from serving.autoscaling.config import LOOK_BACK_S, METRICS_INTERVAL_S
from serving.autoscaling.windows import MetricWindows
from serving.ray_wing.autoscaler import ContainerAutoscaler

if TYPE_CHECKING:
    from serving.ray_wing.node_hosting import NodeHosting, ScaledApp

logger = logging.getLogger("serving.ray_wing.hosted_scaling")

CALL_TIMEOUT_S = 5.0


@dataclass
class HostedScalingContext:
    """What `ContainerAutoscaler` reads of Serve's `AutoscalingContext`, for a hosted version."""

    deployment_name: str
    target_num_replicas: int
    current_num_replicas: int
    running_replicas: list[str]
    aggregated_metrics: dict[str, dict[str, float]]
    policy_state: dict[str, Any] = field(default_factory=dict)


class HostedScaling:
    """A thread of the registry that samples and scales the autoscaled hosted versions; started
    with the first of them, it sleeps while there is none."""

    def __init__(self, hosting: NodeHosting) -> None:
        self._hosting = hosting
        self._windows = MetricWindows(LOOK_BACK_S)
        self._autoscalers: dict[str, ContainerAutoscaler] = {}
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def ensure_running(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="hosted-scaling", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(METRICS_INTERVAL_S):
            try:
                self.tick()
            except Exception:
                logger.exception("scaling the hosted versions failed")

    def tick(self) -> None:
        """Sample every running replica of the autoscaled versions, decide each version's count."""
        apps = self._hosting.autoscaled()
        self._autoscalers = {app.app: self._autoscaler(app) for app in apps}
        by_node: dict[str, list[str]] = {}
        for app in apps:
            for replica, node in app.running.items():
                by_node.setdefault(node, []).append(replica)
        refs = {
            node: self._hosting.host(node).autoscaling_stats.remote(replicas)
            for node, replicas in by_node.items()
        }
        now = time.monotonic()
        for node, ref in refs.items():
            try:
                samples = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except Exception as error:  # a dead host: its slots are placed again by health checks
                logger.warning("no autoscaling stats from the host of node %s: %s", node, error)
                continue
            for replica, sample in samples.items():
                self._windows.add(replica, sample, now)
        self._windows.keep(replica for app in apps for replica in app.running)
        for app in apps:
            context = HostedScalingContext(
                deployment_name=app.container,
                target_num_replicas=app.target,
                current_num_replicas=len(app.running),
                running_replicas=list(app.running),
                aggregated_metrics=self._windows.averages(app.running, now),
            )
            desired, _ = self._autoscalers[app.app](context)
            if desired != app.target:
                self._hosting.resize(app.app, desired)

    def _autoscaler(self, app: ScaledApp) -> ContainerAutoscaler:
        """The version's policy object, built once (it keeps the cooldowns), as Serve builds it."""
        autoscaler = self._autoscalers.get(app.app)
        if autoscaler is None:
            autoscaler = ContainerAutoscaler(**app.policy_kwargs)
        return autoscaler
