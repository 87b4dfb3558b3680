"""A container replica: the supervisor of one model-server process, which speaks for it to Ray; run as a
Serve replica of its own (`ContainerReplica`) or as one of many in its node's container host
(`container_host`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray

from serving._gc import freeze_startup_objects
from serving.autoscaling.windows import tracked
from serving.control.container_versions import Deploy
from serving.control.hosted_apps import MAX_START_FAILURES
from serving.control.records import ContainerPlan
from serving.model_server.container_config import ContainerConfig, ContainerStats, describe_sandbox
from serving.model_server.events import DRAIN_MOST, replay
from serving.model_server.restart_budget import RestartBudget
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
# ... and this soon after an answer that held all it may (`events.DRAIN_MOST`): at most 10,000 metric
# events a second are replayed for one container, so that a container process (tenant code) cannot
# make its supervisor, which may serve other containers, spend more than a bounded share of a core.
STATS_MORE_S = 0.5
# A container process started again in place must serve within this (its model loads again).
RESTART_TIMEOUT_S = 120.0


def _no_counters() -> ContainerStats:
    return {"invocations": 0, "in_flight": 0, "refused": 0, "inline": 0, "custom": {}}


# --- container replicas ---------------------------------------------------------------
class SupervisedContainer:
    """Supervises one container process (`container_main`): the process loads the model and serves
    its data port in a sandbox, with no Ray; this object registers the port, reports the process's
    metrics, starts it again in place when it dies, and stops it when told to (`stop`).

    `replica`: the replica's id in metrics; `own_usage`: whether this process's own CPU and memory
    count as the replica's (a Serve replica's worker serves one container; a node's container host
    serves many, and its own usage is nobody's)."""

    def __init__(
        self,
        replica: str,
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
        tracked_metrics: tuple[str, ...] = (),
        egress_ports: tuple[int, ...] = (),
        shared_network: bool = False,
        fork_template: bool = True,
        own_usage: bool = True,
        holder: str = "",
    ) -> None:
        root = cluster_secret()
        self._holder = holder  # the container host supervising it, if hosted (it dies with it)
        # what its autoscaler tracks, if it has one (it reads the counters: fetch them at the usual pace)
        self._tracked = tuple(tracked_metrics)
        self.metrics = ReplicaMetrics(endpoint, hostname, replica)
        self._host = ray.util.get_node_ip_address() if bind_host == "node" else bind_host
        self._config = ContainerConfig(
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
        )
        self._root, self._version = root, version
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the process and its registration change together
        self._restarts = RestartBudget()
        self._failed: str | None = None  # why the next health check fails
        self.process = ContainerProcess(self._config, self._host)
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
        self._counters: ContainerStats = _no_counters()
        self._more_events = False
        self.metrics.start_utilization(
            pids=lambda: [self.process.pid], environment=environment, own=own_usage
        )
        self.stats = AutoscalingStats(
            self._read_counters, pids=lambda: [self.process.pid], environment=environment
        )
        self.registry = existing_registry()
        self._registration = self._registration_of(self.process.url)
        if not ray.get(self.registry.register.remote(*self._registration), timeout=30):
            raise RuntimeError(f"container {hostname}: the registry refused its registration")
        threading.Thread(target=self._heartbeat, name="registry-heartbeat", daemon=True).start()
        threading.Thread(target=self._relay_stats, name="container-stats", daemon=True).start()
        freeze_startup_objects()

    def _registration_of(self, url: str) -> tuple[str, str, str, str, str, str]:
        """What this replica tells the registry for its process's data port `url`."""
        endpoint, hostname = self._config.endpoint, self._config.hostname
        proof = keys.registration_proof(self._root, endpoint, hostname, url, self._version)
        return endpoint, hostname, self._version, url, proof, self._holder

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            # under the lock `_on_exit` deregisters with: a beat sent for a process that has just
            # died goes before its deregistration, never after it (which would put it back)
            with self._lock:
                if self._failed is None and self.process.alive:
                    self.registry.register.remote(*self._registration)

    def _on_exit(self, code: int) -> None:
        """The container process died on its own (its data port is closed already): leave the routing
        table now, so the gateway sends nothing more here; then start it again in place while the
        restart budget lasts, else fail the next health check, so that Serve replaces this replica."""
        registration = getattr(self, "_registration", None)
        if registration is None:  # it died before this replica registered it: the constructor fails
            self._failed = f"container process exited ({code})"
            return
        try:
            with self._lock:
                self.registry.deregister.remote(*registration[3:5])
        except Exception:  # the registry drops an unrenewed registration anyway
            logger.exception("could not deregister %s", registration[3])
        if self._stopping.is_set():
            return
        if not self._restarts.take():
            self._failed = (
                f"container process exited ({code}) after {self._restarts.restarts} restarts "
                f"within {self._restarts.window_s:g} s"
            )
            return
        try:
            self._restart(code)
        except Exception as error:
            logger.error(
                "container %s could not be started again: %s", self._config.hostname, error
            )
            self._failed = f"container process exited ({code}) and could not start again: {error}"

    def _restart(self, code: int) -> None:
        """Start the container process again in this replica: forked from its stack's template, that
        is its model load and little else, where a new replica would first start a Ray worker."""
        logger.warning(
            "container %s/%s: its process exited (%s); starting it again in place",
            self._config.endpoint,
            self._config.hostname,
            code,
        )
        self.process.stop(grace_s=0)  # its lifeline and scratch folder
        process = ContainerProcess(self._config, self._host)
        try:
            process.start(timeout=RESTART_TIMEOUT_S, on_exit=self._on_exit)
        except Exception:
            process.stop(grace_s=0)
            raise
        registration = self._registration_of(process.url)
        with self._lock:
            if self._stopping.is_set():  # Serve stopped this replica meanwhile
                process.stop(grace_s=0)
                return
            self.process, self._registration = process, registration
            self._counters = _no_counters()  # the new process counts from zero
        if not ray.get(self.registry.register.remote(*registration), timeout=30):
            raise RuntimeError("the registry refused its registration")
        self.metrics.restarted()
        logger.info("container %s serves %s again", self._config.hostname, process.url)

    def _relay_stats(self) -> None:
        """Fetch the container process's counters and record its metric events (it has no Ray to do it)."""
        period = STATS_POLL_S
        while not self._stopping.wait(period):
            moved = self._fetch_stats() or bool(self._tracked)
            period = STATS_POLL_S if moved else min(period * 2, STATS_IDLE_POLL_S)
            if self._more_events:  # the last answer was full: fetch the rest soon
                period = STATS_MORE_S

    def _fetch_stats(self) -> bool:
        """Record what the container process reports; whether anything moved since the last fetch."""
        try:
            stats = self.process.stats()
        except Exception as error:
            if self.process.alive:
                logger.warning("container stats unavailable: %s", error)
            return True  # keep looking at the usual pace
        events = stats.pop("events", [])
        self._more_events = len(events) >= DRAIN_MOST
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

    def autoscaling_sample(self) -> dict[str, float]:
        """What its autoscaler tracks, since the previous call, and nothing else: the sample carries
        the model's own `autoscaling_metrics` (tenant code's names and values), and it goes to a
        process every container shares (Serve's controller, or the registry for a hosted one)."""
        return tracked(self.stats.sample(), self._tracked)

    def data_port(self) -> str:
        return self.process.url

    def failure(self) -> str | None:
        """Why this replica no longer serves (its process exited past the restart budget), or None."""
        return self._failed

    def stop(self) -> None:
        """Leave the routing table first, give the router a poll to notice, then drain."""
        stopping = getattr(self, "_stopping", None)
        if stopping is None:  # the constructor failed: it stopped its process already
            return
        with self._lock:  # a restart in progress sees this and stops what it started
            if stopping.is_set():
                return
            stopping.set()
            process, registration = self.process, self._registration
        self.metrics.stop()
        try:
            url, proof = registration[3:5]
            ray.get(self.registry.deregister.remote(url, proof), timeout=5)
            time.sleep(0.5)
        except Exception:  # the registry may already be gone at cluster shutdown
            pass
        self._fetch_stats()  # the last events
        process.stop()


class ContainerReplica(SupervisedContainer):
    """A Serve replica that supervises one container process: Serve starts, health-checks, scales and
    stops it (its own Ray worker per replica)."""

    def __init__(self, *args, **kwargs) -> None:
        from ray import serve  # here, not above: a container host supervises without Serve

        super().__init__(serve.get_replica_context().replica_id.unique_id, *args, **kwargs)

    def check_health(self) -> None:
        if self._failed is not None:
            raise RuntimeError(self._failed)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What this replica's autoscaler tracks (Serve calls it, pushes it to the controller, averages it)."""
        return self.autoscaling_sample()

    def __del__(self) -> None:
        self.stop()


def tracked_metrics(plan: ContainerPlan) -> tuple[str, ...]:
    """The metrics an autoscaled plan's policies track; () for a fixed count."""
    scaling = plan["count"].get("autoscaling_config")
    if not scaling:
        return ()
    policies = scaling["policy"]["policy_kwargs"]["policies"]
    return tuple(dict.fromkeys(policy["metric"] for policy in policies))


def replica_arguments(
    endpoint: str, container: str, version: str, plan: ContainerPlan
) -> dict[str, Any]:
    """A `SupervisedContainer`'s arguments (but its replica id) for one replica of a plan."""
    return {
        "endpoint": endpoint,
        "hostname": container,
        "version": version,
        "image": plan["image"],
        "model_data": plan["model_data"],
        "environment": plan["environment"],
        "bind_host": plan["bind_host"],
        "multi_model": plan["multi_model"],
        "sandbox": plan["sandbox"],
        "working_dir": plan["working_dir"],
        "gpus": plan["gpus"],
        "egress_ports": tuple(plan["egress_ports"]),
        "shared_network": plan["shared_network"],
        "fork_template": plan.get("fork_template", True),
        "tracked_metrics": tracked_metrics(plan),
    }


def deploy_container(action: Deploy) -> None:
    """Start one container version as its own Serve application, without waiting (the registry watches it).
    Serve's controller starts with the first (`gateway_fleet`), without Serve's own proxy."""
    from ray import serve
    from ray.serve.api import RunTarget, _run_many  # the non-blocking form of serve.run

    if not _serve_started:
        _start_serve()
    plan = action.plan
    deployment = serve.deployment(ContainerReplica).options(  # type: ignore[attr-defined]  # Ray's overloads
        name=action.container,
        ray_actor_options=plan["actor_options"],
        **plan["count"],
        max_ongoing_requests=8,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=20,
        # a model that fails to load fails again: report it soon
        max_constructor_retry_count=MAX_START_FAILURES,
    )
    bound = deployment.bind(
        **replica_arguments(action.endpoint, action.container, action.version, plan)
    )
    _run_many(
        [RunTarget(target=bound, name=action.app, route_prefix=None)],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )


_serve_started = False


def _start_serve() -> None:
    """Serve's controller (or the one running), without Serve's proxy: `_run_many` would start one
    on every node, on port 8000 of every interface."""
    from ray import serve

    global _serve_started
    serve.start(proxy_location="Disabled")
    _serve_started = True
