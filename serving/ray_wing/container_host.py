"""A node's container host: one Ray worker per node that supervises every container replica the
registry places on that node (`node_hosting`), where a Serve replica would cost a Ray worker (its
interpreter, Ray's core worker, its 10 ms tick) per container replica.

The host runs no tenant code and holds no caller-chosen value beyond the plans it is handed: each
replica is the same sandboxed container process a Serve replica supervises (`SupervisedContainer`),
started from the same plan; only its supervisor's process is shared.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from serving.model_server import forked
from serving.ray_wing.names import NAMESPACE
from serving.ray_wing.replica import SupervisedContainer

logger = logging.getLogger("serving.ray_wing.container_host")

HOST_PREFIX = "serving-container-host:"
# concurrent calls: starts (each waits for its model to load) and stops (each drains) run side by side
HOST_CONCURRENCY = 64


class ContainerHost:
    """Supervises the container replicas of one node; started by the registry, detached, so that the
    containers outlive a registry restart as Serve's replicas do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replicas: dict[str, tuple[str, SupervisedContainer]] = {}  # id -> (app, supervisor)
        self._starting: set[str] = set()
        self._cancelled: set[str] = set()  # stopped while starting
        # what its replicas' registrations name: should this host die, the registry forgets them
        self._name = HOST_PREFIX + ray.get_runtime_context().get_node_id()

    def start(self, replica: str, app: str, arguments: dict[str, Any]) -> str:
        """Start one container replica (its process loads the model, then registers); its data
        port's URL. Raises what kept it from serving."""
        with self._lock:
            if replica in self._replicas or replica in self._starting:
                raise RuntimeError(f"replica {replica} exists")
            self._starting.add(replica)
        container = None
        try:
            container = SupervisedContainer(
                replica, **arguments, own_usage=False, holder=self._name
            )
        finally:
            with self._lock:
                self._starting.discard(replica)
                cancelled = replica in self._cancelled
                self._cancelled.discard(replica)
                if container is not None and not cancelled:
                    self._replicas[replica] = (app, container)
        if cancelled:
            assert container is not None
            container.stop()
            raise RuntimeError(f"replica {replica} was stopped while it started")
        return container.data_port()

    def warm(self, stack: str) -> bool:
        """Start this machine's template for `stack` now, while the server that will place its
        containers here is still starting (`forked.warm`); whether one runs. A stack name only, from
        a fixed set: nothing else a caller chose reaches the template."""
        try:
            return forked.warm(stack)
        except Exception:  # a container starting later starts the template itself, or fresh
            logger.exception("could not start the %s template ahead of its containers", stack)
            return False

    def stop(self, replica: str) -> bool:
        """Deregister and drain one replica (a start in progress is stopped once it returns);
        whether it was known."""
        with self._lock:
            entry = self._replicas.pop(replica, None)
            if entry is None and replica in self._starting:
                self._cancelled.add(replica)
                return True
        if entry is None:
            return False
        entry[1].stop()
        return True

    def report(self) -> dict[str, tuple[str, str | None]]:
        """Every replica it holds: id -> (application, why it no longer serves, or None)."""
        with self._lock:
            entries = list(self._replicas.items())
        return {replica: (app, container.failure()) for replica, (app, container) in entries}

    def autoscaling_stats(self, replicas: list[str]) -> dict[str, dict[str, float]]:
        """What each of these replicas' autoscaler tracks, since the previous call (the registry's
        `hosted_scaling` calls every METRICS_INTERVAL_S, as Serve calls `record_autoscaling_stats`)."""
        with self._lock:
            wanted = [(r, self._replicas[r][1]) for r in replicas if r in self._replicas]
        return {replica: container.autoscaling_sample() for replica, container in wanted}

    def pid(self) -> int:
        """This host's process (tests and benchmarks look at it)."""
        return os.getpid()

    def pids(self) -> dict[str, int | None]:
        """Each replica's container process (tests and benchmarks look at it)."""
        with self._lock:
            entries = list(self._replicas.items())
        return {replica: container.process.pid for replica, (_, container) in entries}


def host_on(node_id: str):
    """The container host of one node, started there if it is not running yet."""
    return (
        ray.remote(ContainerHost)
        .options(
            name=HOST_PREFIX + node_id,
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=HOST_CONCURRENCY,
            max_restarts=0,  # a dead host's replicas are placed again by the registry
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )
