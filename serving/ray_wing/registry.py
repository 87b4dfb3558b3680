"""The registry actor: the control plane's state, kept in Ray's GCS key-value store, the long poll
that hands it to every gateway (its reconcile loop: `reconcile`; the snapshot it hands out:
`control.snapshots`), and the control plane itself."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter

import ray

from serving.autoscaling.policy import ScalerState, ScalingActivity
from serving.control.container_versions import Delete, Deploy, EndpointState, parse_app_name, step
from serving.control.records import (
    ApiRouting,
    AppStatus,
    RegistryRecord,
    ScalingRecord,
    Snapshot,
    VersionsUpdate,
)
from serving.control.snapshots import snapshot_of
from serving.ray_wing.cluster import NAMESPACE, cluster_secret
from serving.ray_wing.control_seat import CONTROL_CALLS, ControlSeat
from serving.ray_wing.gateway_fleet import GatewayKeeping
from serving.ray_wing.gateway_readers import GatewayReaders
from serving.ray_wing.kv_store import KvStore
from serving.ray_wing.names import ON_HEAD, REGISTRY_NAME
from serving.ray_wing.registry_feed import RegistryFeed
from serving.ray_wing.replica_table import ReplicaTable
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.registry")


# per endpoint, newest first (DescribeScalingActivities shows the recent ones)
SCALING_ACTIVITIES_KEPT = 50
UPDATE_TIMEOUT_S = 900.0  # a new version not ready within this long is rolled back
# the longest a snapshot call waits for a change (the gateway's long poll)
SNAPSHOT_MAX_WAIT_S = 30.0

_KV_ENDPOINT, _KV_SCALING, _KV_AWAITED, _KV_API = b"endpoint/", b"scaling/", b"awaited/", b"api/"

# Snapshots run in a group of their own: a gateway's long poll waits there without holding up
# registrations; so do the control plane's calls (`control_seat`). (Ray's stubs lack them.)
_GROUPS = {"snapshots": 64, "control": CONTROL_CALLS}


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, concurrency_groups=_GROUPS)  # type: ignore[call-overload]
class Registry(ControlSeat, GatewayKeeping):
    """The control plane's state and reconciler: endpoints (desired and active), live replicas,
    statuses; it keeps the gateways too (`gateway_fleet`). Every change is written through to Ray's
    GCS key-value store, so a restarted registry (or a new one after `serving up` restarts on a
    cluster) carries on where the last stopped: same endpoints, same routing table (replicas
    re-register every HEARTBEAT_S; one silent for REPLICA_TTL_S leaves it), updates in progress
    resumed. A background loop reads the replicas' statuses every STATUS_POLL_S (and at once on a
    put, a delete or a new replica) and advances each endpoint toward its desired record
    (`container_versions`). Writes need the control plane's token; a registration needs the proof
    made for that very container, version and URL (`keys`); anything else is refused, logged and
    counted. Snapshots hold nothing secret, but only holders of Ray's token read them."""

    def __init__(self) -> None:
        self.version = 0
        # a new registry process: the gateway knows its table was rebuilt
        self.epoch = secrets.token_hex(6)
        self.states: dict[str, EndpointState] = {}
        self.statuses: dict[str, AppStatus] = {}  # each version's (control.StatusBoard reads)
        # endpoint -> {"containers": {hostname: scaler state}, "activities": [newest first]}
        self.scaling: dict[str, ScalingRecord] = {}
        # Endpoints a server was started with and has not deployed yet: no gateway is ready while
        # one is missing.
        self.awaited: set[str] = set()
        # the control-plane API's routing: its endpoints' variants and the served endpoints behind
        self.api: ApiRouting | None = None
        self.readers = GatewayReaders()
        self.refused = 0
        self.root_secret = cluster_secret()
        self._control = keys.control_token(self.root_secret)
        self._lock = threading.RLock()
        # notified on every new version (snapshots wait on it)
        self._changed = threading.Condition(self._lock)
        # the last snapshot built, by (version, refused): what every gateway's long poll returns
        self._built: tuple[tuple[int, int], Snapshot] | None = None
        self._store = KvStore()
        self._replicas = ReplicaTable(self._store, self.root_secret)
        # the gateways' long poll over HTTP, once `open_feed` says where (Ray's `snapshot` otherwise)
        self.feed = RegistryFeed(
            self.root_secret, self._feed_current, self.readers.asked, self._store
        )
        self._restore()
        from serving.ray_wing.reconcile import Reconciler  # here: a handle's holder imports us

        self._reconciler = Reconciler(self)
        self._reconciler.start()
        self._seat_control()
        self._keep_gateways()

    def _restore(self) -> None:
        for name, data in self._store.load(_KV_ENDPOINT).items():
            self.states[name] = EndpointState.from_dict(data)
        self.scaling = self._store.load(_KV_SCALING)
        self.awaited = set(self._store.load(_KV_AWAITED))
        self.api = self._store.load(_KV_API).get("routing")
        self.feed.reopen()
        if self.states:
            counts = len(self.states), len(self._replicas.by_url)
            logger.info("registry restored %d endpoints and %d replicas", *counts)

    def _bump(self) -> None:
        """A new version of the state (call with the lock held): wake the snapshots waiting for
        one."""
        self.version += 1
        self._changed.notify_all()
        self.feed.changed()

    def _observe(self, statuses: dict[str, AppStatus]) -> None:
        """The versions' latest statuses (the reconcile loop's read)."""
        with self._lock:
            if statuses != self.statuses:
                self.statuses = statuses
                self._bump()

    def _updating(self) -> bool:
        """Whether any endpoint's update is in progress (the reconcile loop stays at its fast
        period)."""
        with self._lock:
            return any(s.update.get("Status") == "InProgress" for s in self.states.values())

    def _advance(self, statuses: dict[str, AppStatus], deployed: set[str]) -> list[Deploy | Delete]:
        """Step every endpoint toward its desired record, written through; the applications to
        deploy or delete for it (`deployed`: those this process deployed, whose status may lag)."""
        actions: list[Deploy | Delete] = []
        with self._lock:
            self._expire()
            registered = Counter(self._replicas.by_url.values())
            for name, state in self.states.items():
                before = json.dumps(state.to_dict(), sort_keys=True)
                actions += step(
                    state, statuses, registered, time.time(), UPDATE_TIMEOUT_S, deployed
                )
                if json.dumps(state.to_dict(), sort_keys=True) != before:
                    self._store.put(_KV_ENDPOINT, name, state.to_dict())
                    self._bump()
            for app in statuses:  # every application of a deleted endpoint
                parsed = parse_app_name(app)
                if parsed is not None and parsed[0] not in self.states:
                    actions.append(Delete(app))
        return actions

    def _allowed(self, token: object, what: str) -> bool:
        if keys.verify(self._control, token):
            return True
        self.refused += 1
        logger.warning("registry: refused %s without the control plane's token", what)
        return False

    def record_scaling(
        self,
        token: str,
        endpoint: str,
        container: str,
        state: ScalerState,
        activity: ScalingActivity | None,
    ) -> bool:
        """An autoscaler's latest state for a container and, when it changed the count, the
        activity."""
        if not self._allowed(token, f"record_scaling({endpoint}/{container})"):
            return False
        with self._lock:
            scaling = self.scaling.setdefault(endpoint, {"containers": {}, "activities": []})
            scaling["containers"][container] = state
            if activity is not None:
                scaling["activities"] = [activity, *scaling["activities"]][:SCALING_ACTIVITIES_KEPT]
            self._store.put(_KV_SCALING, endpoint, scaling)
            self._bump()
        return True

    def publish_api(self, token: str, routing: ApiRouting) -> int:
        """The API's fronts and served endpoints, for every gateway; the version carrying them (0:
        refused)."""
        if not self._allowed(token, "publish_api"):
            return 0
        with self._lock:
            self.api = routing
            self._store.put(_KV_API, "routing", routing)
            self._bump()
            return self.version

    @ray.method(concurrency_group="snapshots")
    def applied_everywhere(self, version: int) -> bool:
        """Whether every live gateway has applied `version` (or a later one) of this registry."""
        with self._lock:
            return self.readers.applied(version, self.epoch)

    def leave(self, token: str, reader: str) -> bool:
        """A gateway stopping cleanly: no longer one of those that `applied_everywhere` waits
        for."""
        if not self._allowed(token, f"leave({reader})"):
            return False
        with self._lock:
            self.readers.left(reader)
        return True

    def open_feed(self, token: str, host: str | None) -> str | None:
        """Serve snapshots over HTTP on `host` (`registry_feed`), or no longer (None); its URL, which
        every snapshot now names, or None (gateways use Ray)."""
        if not self._allowed(token, "open_feed"):
            return None
        url = self.feed.open(host)
        with self._lock:
            self._bump()
        return url

    def _feed_current(self) -> tuple[object, Snapshot]:
        with self._lock:
            return (self.version, self.refused), self._current_snapshot()

    def stop_reconciling(self, token: str) -> bool:
        """The embedded server is stopping and deletes every Serve application itself: deploy nothing
        again (hosted replicas drain on their hosts) and start no gateway."""
        if not self._allowed(token, "stop_reconciling"):
            return False
        self._reconciler.stop()
        self._gateways.stop()
        return True

    def expect(self, token: str, names: list[str], expected: bool = True) -> bool:
        """Endpoints about to be deployed (`serving up`'s specs): every gateway's /ping answers 503
        until they are put, or deleted, so that the first 200 means they route. `expected=False`
        withdraws (a failed start)."""
        if not self._allowed(token, f"expect({', '.join(names)})"):
            return False
        with self._lock:
            for name in names:
                if not expected:
                    self._arrived(name)
                elif name not in self.states:
                    self.awaited.add(name)
                    self._store.put(_KV_AWAITED, name, True)
            self._bump()
        return True

    def _arrived(self, name: str) -> None:
        if name in self.awaited:
            self.awaited.discard(name)
            self._store.delete(_KV_AWAITED, name)

    def put_endpoint(self, token: str, record: RegistryRecord) -> int | bool:
        """Make `record` the endpoint's desired state: created, or updated blue/green (same record:
        no-op).

        Returns the update's generation (its description's LastUpdate.Generation), False if refused.
        """
        name = record["name"]
        if not self._allowed(token, f"put_endpoint({name})"):
            return False
        with self._lock:
            self._arrived(name)
            state = self.states.get(name)
            if (
                state is not None
                and state.desired == record
                and state.update.get("Status") != "Failed"
            ):
                return state.update.get("Generation", 1)
            generation = (state.update.get("Generation", 0) if state is not None else 0) + 1
            update = VersionsUpdate(
                Status="InProgress",
                StartedAt=time.time(),
                FailureReason=None,
                Generation=generation,
            )
            if state is None:
                state = self.states[name] = EndpointState(name, record, None, update)
            else:
                state.desired, state.update = record, update
            if state.active is None or state.active["containers"] != record["containers"]:
                self.scaling.pop(name, None)  # a new spec starts a new history
                self._store.delete(_KV_SCALING, name)
            self._store.put(_KV_ENDPOINT, name, state.to_dict())
            self._bump()
        self._reconciler.wake()
        return generation

    def delete_endpoint(self, token: str, name: str) -> bool:
        """Forget the endpoint: it leaves the routing table now, its applications go on the next
        loop."""
        if not self._allowed(token, f"delete_endpoint({name})"):
            return False
        with self._lock:
            self._arrived(name)
            self.states.pop(name, None)
            self.scaling.pop(name, None)
            self._store.delete(_KV_ENDPOINT, name)
            self._store.delete(_KV_SCALING, name)
            self._replicas.forget_endpoint(name)
            self._bump()
        self._reconciler.wake()
        return True

    def register(
        self, endpoint: str, container: str, version: str, url: str, proof: str, holder: str = ""
    ) -> bool:
        """Put a replica's data port under (endpoint, container, version): only with the proof made
        for exactly that. `holder`: the container host supervising it, if hosted."""
        key = (endpoint, container, version)
        if not self._replicas.proven(key, url, proof):
            self.refused += 1
            logger.warning("registry: refused to register %s as %s without its proof", url, key)
            return False
        with self._lock:
            new = self._replicas.heard(url, key, holder or None)
            if new:
                self._bump()
        if new:  # an update waiting for this replica moves its traffic now, not at the next read
            self._reconciler.wake()
        return True

    def deregister(self, url: str, proof: str | None = None, token: str | None = None) -> bool:
        """Remove a replica: by itself (its registration proof), or by a gateway it refused (the
        control token)."""
        own = self._replicas.owned(url, proof)
        if not own and not self._allowed(token, f"deregister({url})"):
            return False
        with self._lock:
            if self._replicas.forget(url):
                self._bump()
        return True

    def _forget_held(self, holder: str) -> None:
        """A container host died: its replicas leave now, not at REPLICA_TTL_S beside successors."""
        with self._lock:
            if self._replicas.forget_held(holder):
                self._bump()

    def _expire(self) -> None:
        if self._replicas.expire():
            self._bump()

    @ray.method(concurrency_group="snapshots")
    def snapshot(
        self, since: int, wait_s: float = 0.0, epoch: str | None = None, reader: str | None = None
    ) -> Snapshot | None:
        """Everything the gateway needs, or None when nothing changed since version `since` (of this
        registry process, `epoch`) within `wait_s` seconds (at most SNAPSHOT_MAX_WAIT_S): a long
        poll, answered as soon as the state changes. `reader`: the gateway asking, which has applied
        `since` (`applied_everywhere`)."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), SNAPSHOT_MAX_WAIT_S)
        with self._lock:
            if reader is not None:
                self.readers.asked(reader, since, epoch)
            self._expire()
            while since == self.version and epoch in (None, self.epoch):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)
            return self._current_snapshot()

    def _current_snapshot(self) -> Snapshot:
        """This version's snapshot, built once however many gateways ask for it (call with the lock
        held): every state change bumps the version, and `refused` counts without one."""
        key = (self.version, self.refused)
        if self._built is None or self._built[0] != key:
            snapshot = snapshot_of(
                version=self.version,
                epoch=self.epoch,
                states=self.states,
                replicas=self._replicas.by_url,
                statuses=self.statuses,
                refused=self.refused,
                awaited=self.awaited,
                api=self.api,
                feed=self.feed.url,
                scaling=self.scaling,
            )
            self._built = (key, snapshot)
        return self._built[1]


def registry_handle():
    return Registry.options(
        name=REGISTRY_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        resources=ON_HEAD,
    ).remote()
