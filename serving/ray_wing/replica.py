"""A container replica: the Serve replica that supervises one model-server process and speaks for it to Ray."""

from __future__ import annotations

import logging
import threading
import time

import ray
from ray import serve

from serving._gc import freeze_startup_objects
from serving.control.container_versions import (
    Deploy,
)
from serving.model_server.container_config import ContainerConfig, ContainerStats, describe_sandbox
from serving.model_server.events import replay
from serving.model_server.supervisor import ContainerProcess
from serving.models.cache_limits import CacheLimits
from serving.ray_wing.cluster import (
    cluster_secret,
)
from serving.ray_wing.names import HEARTBEAT_S, existing_registry
from serving.ray_wing.replica_metrics import AutoscalingStats, ReplicaMetrics
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.replica")


STATS_POLL_S = (
    2.0  # how often a supervisor fetches its container process's counters and metric events
)
# ... and, doubling after each fetch that found nothing new (no invocation, no event), at most this often: an idle
# container's process is not woken every 2 s for counters that did not move. Not for an autoscaled container,
# whose autoscaler must see a burst's first invocations within STATS_POLL_S.
STATS_IDLE_POLL_S = 8.0


# --- container replicas ---------------------------------------------------------------
class ContainerReplica:
    """A Serve replica that supervises one container process (`container_main`): the process loads the
    model and serves its data port in a sandbox, with no Ray; this replica registers the port, reports
    the process's metrics and autoscaling stats, and stops it when Serve stops the replica."""

    def __init__(
        self,
        endpoint: str,
        hostname: str,
        version: str,
        image: str,
        model_data: str | None,
        environment: dict[str, str],
        bind_host: str,
        multi_model: CacheLimits | None = None,
        sandbox: str = "auto",
        working_dir: str | None = None,
        gpus: float = 0.0,
        autoscaled: bool = False,
        egress_ports: tuple[int, ...] = (),
        shared_network: bool = False,
        fork_template: bool = True,
    ) -> None:
        root = cluster_secret()
        self._autoscaled = (
            autoscaled  # its autoscaler reads the counters: fetch them at the usual pace
        )
        self.metrics = ReplicaMetrics(
            endpoint, hostname, serve.get_replica_context().replica_id.unique_id
        )
        host = ray.util.get_node_ip_address() if bind_host == "node" else bind_host
        self.process = ContainerProcess(
            ContainerConfig(
                endpoint=endpoint,
                hostname=hostname,
                image=image,
                model_data=model_data,
                environment=environment,
                hop_key=keys.hop_key(root, endpoint, hostname),
                multi_model=multi_model,
                sandbox=sandbox,
                working_dir=working_dir,
                gpus=gpus,
                egress_ports=tuple(egress_ports),
                shared_network=shared_network,
                fork_template=fork_template,
            ),
            host,
        )
        self._exited = threading.Event()  # its process exited on its own: no more heartbeats
        try:
            # A failure here marks the container (and endpoint) Failed with its error; an exit later, `_on_exit`.
            report = self.process.start(on_exit=self._on_exit)
        except Exception:
            self.process.stop(grace_s=0)
            raise
        logger.info(
            "container %s/%s serves %s (pid %s; %s)",
            endpoint,
            hostname,
            self.process.url,
            self.process.pid,
            describe_sandbox(report),
        )
        self._counters: ContainerStats = {
            "invocations": 0,
            "in_flight": 0,
            "refused": 0,
            "inline": 0,
            "custom": {},
        }
        self.metrics.start_utilization(pids=lambda: [self.process.pid], environment=environment)
        self.stats = AutoscalingStats(
            self._read_counters, pids=lambda: [self.process.pid], environment=environment
        )
        self.registry = existing_registry()
        url = self.process.url
        self._registration = (
            endpoint,
            hostname,
            version,
            url,
            keys.registration_proof(root, endpoint, hostname, url, version),
        )
        if not ray.get(self.registry.register.remote(*self._registration), timeout=30):
            raise RuntimeError(f"container {hostname}: the registry refused its registration")
        self._stopping = threading.Event()
        threading.Thread(target=self._heartbeat, name="registry-heartbeat", daemon=True).start()
        threading.Thread(target=self._relay_stats, name="container-stats", daemon=True).start()
        freeze_startup_objects()

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            if self._exited.is_set():
                return
            self.registry.register.remote(*self._registration)

    def _on_exit(self, code: int) -> None:
        """The container process died (its data port is closed already): leave the routing table now, so the
        gateway sends nothing more here, and fail the next health check, so Serve replaces this replica."""
        self._exited.set()
        registration = getattr(self, "_registration", None)
        if registration is not None:  # None: it died before this replica registered it
            url, proof = registration[3:]
            self.registry.deregister.remote(url, proof)

    def _relay_stats(self) -> None:
        """Fetch the container process's counters and record its metric events (it has no Ray to do it)."""
        period = STATS_POLL_S
        while not self._stopping.wait(period):
            moved = self._fetch_stats() or self._autoscaled
            period = STATS_POLL_S if moved else min(period * 2, STATS_IDLE_POLL_S)

    def _fetch_stats(self) -> bool:
        """Record what the container process reports; whether anything moved since the last fetch."""
        try:
            stats = self.process.stats()
        except Exception as error:
            if self.process.alive:
                logger.warning("container stats unavailable: %s", error)
            return True  # keep looking at the usual pace
        events = stats.pop("events", [])
        replay(events, self.metrics)
        self.metrics.refused_hops(stats["refused"] - self._counters["refused"])
        before = self._counters
        moved = (
            bool(events)
            or stats["in_flight"] > 0
            or (stats["invocations"], stats["refused"], stats["custom"])
            != (before["invocations"], before["refused"], before["custom"])
        )
        self._counters = stats
        return moved

    def _read_counters(self) -> tuple[int, int, dict[str, float]]:
        counters = self._counters
        return counters["invocations"], counters["in_flight"], counters["custom"]

    def check_health(self) -> None:
        if not self.process.alive:
            exit_code = (
                self.process.process.returncode if self.process.process is not None else None
            )
            raise RuntimeError(f"container process exited ({exit_code})")

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What this replica's autoscaler tracks (Serve calls it, pushes it to the controller, averages it)."""
        return self.stats.sample()

    def data_port(self) -> str:
        return self.process.url

    def __del__(self) -> None:
        # Leave the routing table first, give the router a poll to notice, then drain.
        stopping = getattr(self, "_stopping", None)
        if stopping is None:  # the constructor failed: it stopped its process already
            return
        stopping.set()
        self.metrics.stop()
        try:
            url, proof = self._registration[3:]
            ray.get(self.registry.deregister.remote(url, proof), timeout=5)
            time.sleep(0.5)
        except Exception:  # the registry may already be gone at cluster shutdown
            pass
        self._fetch_stats()  # the last events
        self.process.stop()


def deploy_container(action: Deploy) -> None:
    """Start one container version as its own Serve application, without waiting (the registry watches it)."""
    from ray.serve.api import RunTarget, _run_many  # the non-blocking form of serve.run

    plan = action.plan
    deployment = serve.deployment(ContainerReplica).options(  # type: ignore[attr-defined]  # Ray's overloads
        name=action.container,
        ray_actor_options=plan["actor_options"],
        **plan["count"],
        max_ongoing_requests=8,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=20,
        max_constructor_retry_count=3,  # a model that fails to load fails again: report it soon
    )
    bound = deployment.bind(
        action.endpoint,
        action.container,
        action.version,
        plan["image"],
        plan["model_data"],
        plan["environment"],
        plan["bind_host"],
        multi_model=plan["multi_model"],
        sandbox=plan["sandbox"],
        working_dir=plan["working_dir"],
        gpus=plan["gpus"],
        egress_ports=plan["egress_ports"],
        shared_network=plan["shared_network"],
        fork_template=plan.get("fork_template", True),
        autoscaled="autoscaling_config" in plan["count"],
    )
    _run_many(
        [RunTarget(target=bound, name=action.app, route_prefix=None)],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
