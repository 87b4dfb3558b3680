"""The registry's side of container hosts: it places each replica of a hosted container version
(`control.hosted_apps`) with a Ray placement group that reserves the replica's resources, starts it
on the container host of the node that group landed on (`container_host`), and watches it: a replica
whose process failed past its restart budget, or whose host died, is started again; a node lost
takes its placement groups elsewhere (Ray reschedules them) and its replicas follow. A replica taken
off (scale-in, delete) keeps its reservation until it has drained.

Runs in the registry's reconcile thread (`reconcile`), which calls `tick` every status poll, and its
scaling thread (`hosted_scaling`), which resizes autoscaled versions. What it runs is kept in Ray's
key-value store and on the hosts, so a restarted registry adopts the replicas still running instead
of starting them twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table

from serving.control.container_versions import Deploy
from serving.control.hosted_apps import HostedApp, Slot, StoredHostedApp, slot_of
from serving.control.records import AppStatus
from serving.ray_wing.container_host import HOST_PREFIX, host_on
from serving.ray_wing.hosted_scaling import HostedScaling
from serving.ray_wing.kv_store import KvStore
from serving.ray_wing.names import NAMESPACE
from serving.ray_wing.replica import replica_arguments
from serving.ray_wing.slot_reservations import SlotReservations, group_name

logger = logging.getLogger("serving.ray_wing.node_hosting")

_KV_HOSTED = b"hosted/"
HEALTH_S = (
    5.0  # how often each host is asked for its replicas' health (Serve's health-check period)
)
CALL_TIMEOUT_S = 10.0
PLACE_WAIT_S = 0.2  # how long a deploy waits for its placement groups before the next poll retries
STOP_ALL_TIMEOUT_S = 20.0


def _error(error: BaseException) -> str:
    return str(getattr(error, "cause", None) or error)


@dataclass(frozen=True)
class ScaledApp:
    """An autoscaled hosted version as its autoscaler sees it: its slot count and running replicas."""

    app: str
    container: str
    target: int
    running: dict[str, str]  # replica -> node
    policy_kwargs: dict[str, Any]


class NodeHosting:
    """Hosted container versions by application name. The reconcile thread calls most; the scaling
    thread `autoscaled` and `resize`, and `stop_all` comes from a third, so every method takes the
    lock. `wake`: tell the reconcile loop that something moved; `forget`: take the replicas a dead
    container host held (by its name) out of the routing table (called without the lock)."""

    def __init__(
        self,
        store: KvStore | None = None,
        wake: Callable[[], None] = lambda: None,
        forget: Callable[[str], None] = lambda host: None,
    ) -> None:
        self._store = store or KvStore()
        self._wake, self._forget = wake, forget
        self._dead: list[str] = []  # container hosts found dead, for `forget`
        self.scaling = HostedScaling(self)
        self._lock = threading.RLock()
        self._apps: dict[str, HostedApp] = {}
        self._reservations = SlotReservations()
        self._starts: dict[Any, tuple[str, Slot, str]] = {}  # object ref -> (app, slot, replica)
        self._hosts: dict[str, Any] = {}  # node id -> its host's handle
        self._checked = 0.0
        self._recovered = False

    # --- what the reconcile loop calls ---------------------------------------------------------
    def deploy(self, action: Deploy) -> None:
        with self._lock:
            if action.app in self._apps:
                return
            hosted = HostedApp.of(
                action.app, action.endpoint, action.container, action.version, action.plan
            )
            self._apps[action.app] = hosted
            self._store.put(_KV_HOSTED, action.app, hosted.to_dict())
            groups = [self._group(hosted, slot) for slot in hosted.slots]
            if hosted.autoscaled:
                self.scaling.ensure_running()
        self._start_placed(groups)

    def _start_placed(self, groups: list[PlacementGroup]) -> None:
        """Placed in milliseconds where there is room: start now rather than at the next poll."""
        if groups:
            ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=PLACE_WAIT_S)
        self.tick()

    def autoscaled(self) -> list[ScaledApp]:
        """The autoscaled versions serving (not failed), for the scaling thread."""
        with self._lock:
            return [
                ScaledApp(
                    app,
                    hosted.container,
                    len(hosted.slots),
                    {
                        s.replica: s.node
                        for s in hosted.slots
                        if s.state == "RUNNING" and s.replica and s.node
                    },
                    hosted.plan["count"]["autoscaling_config"]["policy"]["policy_kwargs"],
                )
                for app, hosted in self._apps.items()
                if hosted.autoscaled and hosted.failure is None
            ]

    def resize(self, app: str, replicas: int) -> None:
        """An autoscaler's decision: place and start the slots added, stop those taken off."""
        with self._lock:
            hosted = self._apps.get(app)
            if hosted is None or self.scaling.stopped.is_set():
                return
            before = len(hosted.slots)
            for slot in hosted.resize(replicas):
                self._reservations.release(app, slot.index, self._stop(slot))
            self._store.put(_KV_HOSTED, app, hosted.to_dict())
            groups = [self._group(hosted, slot) for slot in hosted.slots[before:]]
        logger.info("hosted %s: %d -> %d replicas", app, before, replicas)
        self._start_placed(groups)
        self._wake()

    def delete(self, app: str) -> bool:
        """Stop a hosted version's replicas (each drains on its host) and free its reservations;
        False for an application it does not run."""
        with self._lock:
            hosted = self._apps.pop(app, None)
            if hosted is None:
                return False
            self._store.delete(_KV_HOSTED, app)
            stops = [self._stop(slot) for slot in hosted.slots]
            for slot, stop in zip(hosted.slots, stops):
                self._reservations.release(app, slot.index, stop)
        logger.info("hosted %s: %d replicas stopping", app, sum(stop is not None for stop in stops))
        return True

    def statuses(self) -> dict[str, AppStatus]:
        with self._lock:
            return {app: hosted.status() for app, hosted in self._apps.items()}

    def stop_all(self) -> None:
        """The server stops: drain every hosted replica, bounded."""
        self.scaling.stopped.set()
        with self._lock:
            stops = [
                ref
                for hosted in list(self._apps.values())
                for ref in [self._stop(slot) for slot in hosted.slots]
                if ref is not None
            ]
            self._apps.clear()
        try:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_ALL_TIMEOUT_S)
        except Exception:
            logger.exception("stopping the hosted replicas")

    def tick(self) -> bool:
        """Advance every slot: starts that finished, groups that were placed, health; whether
        anything is still in motion (the reconcile loop then polls at its busy pace)."""
        with self._lock:
            if not self._recovered:
                self._recovered = True
                self._recover()
            self._finished_starts()
            for hosted in self._apps.values():
                if hosted.failure is not None:
                    continue
                for slot in hosted.slots:
                    if slot.state == "PLACING":
                        self._start(hosted, slot)
            if time.monotonic() - self._checked >= HEALTH_S:
                self._checked = time.monotonic()
                self._check_health()
            releasing = self._reservations.released()
            moving = releasing or not all(hosted.settled for hosted in self._apps.values())
            dead, self._dead = self._dead, []
        for host in dead:  # before their slots start again (the next tick): never counted twice
            self._forget(host)
        return moving

    # --- placing and starting --------------------------------------------------------------------
    def _group(self, hosted: HostedApp, slot: Slot) -> PlacementGroup:
        return self._reservations.of(hosted.app, slot.index, hosted.plan["actor_options"])

    def _start(self, hosted: HostedApp, slot: Slot) -> None:
        table = placement_group_table(self._group(hosted, slot))
        if table.get("state") != "CREATED":
            return  # not placed yet (no node has the resources free), or being rescheduled
        node = table["bundles_to_node_id"][0]
        replica = slot.new_replica(node)
        ref = self.host(node).start.remote(
            replica,
            hosted.app,
            replica_arguments(hosted.endpoint, hosted.container, hosted.version, hosted.plan),
        )
        self._starts[ref] = (hosted.app, slot, replica)

    def _finished_starts(self) -> None:
        if not self._starts:
            return
        done, _ = ray.wait(list(self._starts), num_returns=len(self._starts), timeout=0)
        for ref in done:
            app, slot, replica = self._starts.pop(ref)
            hosted = self._apps.get(app)
            if hosted is None or slot.replica != replica:
                continue  # deleted, or replaced, meanwhile
            try:
                ray.get(ref)
            except Exception as error:
                logger.warning(
                    "hosted %s: replica %s did not start: %s", app, replica, _error(error)
                )
                if isinstance(error, ray.exceptions.RayActorError):
                    self._hosts.pop(slot.node or "", None)
                    slot.lost()
                else:
                    hosted.start_failed(slot, _error(error))
                continue
            slot.state = "RUNNING"

    def host(self, node: str):
        """The container host of a node (started there if need be)."""
        with self._lock:
            host = self._hosts.get(node)
            if host is None:
                host = self._hosts[node] = host_on(node)
            return host

    def _stop(self, slot: Slot):
        """Stop a slot's replica on its host (it drains there); the call's ref, or None."""
        replica, node = slot.replica, slot.node
        slot.lost()
        if replica is None or node is None:
            return None
        try:
            return self.host(node).stop.remote(replica)
        except Exception:
            logger.exception("could not stop %s", replica)
            return None

    # --- health ------------------------------------------------------------------------------------
    def _check_health(self) -> None:
        """Ask each host that holds a running replica for its replicas; start again what it lost."""
        by_node: dict[str, list[tuple[HostedApp, Slot]]] = {}
        for hosted in self._apps.values():
            for slot in hosted.slots:
                if slot.state == "RUNNING" and slot.node is not None:
                    by_node.setdefault(slot.node, []).append((hosted, slot))
        reports = {node: self.host(node).report.remote() for node in by_node}
        for node, ref in reports.items():
            try:
                report = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayActorError:
                logger.warning(
                    "the container host of node %s died; placing its replicas again", node
                )
                self._hosts.pop(node, None)
                self._dead.append(HOST_PREFIX + node)
                report = {}
            except Exception:
                logger.exception("no report from the container host of node %s", node)
                continue
            for hosted, slot in by_node[node]:
                app, failure = report.get(slot.replica or "", (None, "gone from its host"))
                if failure is not None:
                    logger.warning(
                        "hosted %s: replica %s failed (%s); starting it again",
                        hosted.app,
                        slot.replica,
                        failure,
                    )
                    self._stop(slot)  # leaves it PLACING: the next tick starts a new one

    # --- a restarted registry ---------------------------------------------------------------------
    def _recover(self) -> None:
        """Adopt the hosted versions and replicas a previous registry process left running."""
        stored: dict[str, StoredHostedApp] = self._store.load(_KV_HOSTED)
        for app, data in stored.items():
            hosted = HostedApp.of(
                app,
                data["endpoint"],
                data["container"],
                data["version"],
                data["plan"],
                data.get("replicas"),
            )
            self._apps[app] = hosted
            if hosted.autoscaled:
                self.scaling.ensure_running()
            for slot in hosted.slots:
                self._group(hosted, slot)
        stops = self._adopt_replicas() if stored else {}
        wanted = {(app, slot.index) for app, hosted in self._apps.items() for slot in hosted.slots}
        self._reservations.release_orphans(wanted, stops)
        logger.info(
            "registry adopted %d hosted versions, %d replicas running",
            len(self._apps),
            sum(s.state == "RUNNING" for h in self._apps.values() for s in h.slots),
        )

    def _adopt_replicas(self) -> dict[str, Any]:
        """Take the replicas the hosts run into their slots; stop those no slot wants. Returns the
        stops' refs by their slot's group name."""
        stops: dict[str, Any] = {}
        hosts = [
            entry["name"]
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == NAMESPACE and entry["name"].startswith(HOST_PREFIX)
        ]
        for name in hosts:
            node = name[len(HOST_PREFIX) :]
            try:
                report = ray.get(self.host(node).report.remote(), timeout=CALL_TIMEOUT_S)
            except Exception:
                logger.exception("no report from %s", name)
                continue
            for replica, (app, failure) in report.items():
                owner, index = self._apps.get(app), slot_of(replica)
                place = (
                    owner.slots[index]
                    if owner is not None and index is not None and index < len(owner.slots)
                    else None
                )
                if place is None or place.replica is not None or failure is not None:
                    stop = self.host(node).stop.remote(replica)  # not wanted any more, or twice
                    if place is None and index is not None:
                        stops[group_name(app, index)] = stop
                    continue
                place.state, place.node, place.replica = "RUNNING", node, replica
        return stops
