"""The registry actor: the control plane's state (in Ray's GCS key-value store) and its reconcile loop."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter

import ray
from ray import serve

from serving.autoscaling.policy import ScalerState, ScalingActivity
from serving.control import container_versions
from serving.control.container_versions import Delete, Deploy, EndpointState, parse_app_name, step
from serving.control.records import (
    ApiRouting,
    AppStatus,
    RegistryRecord,
    ScalingRecord,
    Snapshot,
    VersionsUpdate,
)
from serving.ray_wing.cluster import NAMESPACE, cluster_secret
from serving.ray_wing.kv_store import KvStore
from serving.ray_wing.names import ON_HEAD, REGISTRY_NAME, REPLICA_TTL_S
from serving.ray_wing.replica import deploy_container
from serving.ray_wing.serve_status import ServeNotRunning, serve_status
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.registry")


# --- registry ------------------------------------------------------------------------
SCALING_ACTIVITIES_KEPT = 50  # per endpoint, newest first (DescribeScalingActivities shows the recent ones)


UPDATE_TIMEOUT_S = 900.0  # a new version not ready within this long is rolled back


# Serve's statuses are read every STATUS_POLL_S while anything changes (a rollout, a failure, a new replica) and
# every STATUS_IDLE_POLL_S once nothing has for a while: each read is a call to the Serve controller, which then
# builds every application's status, so an idle server polling at 1 s spent CPU on answers nobody needed.
STATUS_POLL_S = 1.0
STATUS_IDLE_POLL_S = 5.0
QUIET_POLLS = 5  # unchanged reads in a row before the idle period applies
SNAPSHOT_MAX_WAIT_S = 30.0  # the longest a snapshot call waits for a change (the gateway's long poll)


_KV_ENDPOINT, _KV_REPLICA, _KV_SCALING, _KV_AWAITED = b"endpoint/", b"replica/", b"scaling/", b"awaited/"
_KV_API = b"api/"
# A gateway that has not asked for a snapshot for this long is gone: it no longer holds up `applied_everywhere` (its long poll
# asks at least every REGISTRY_WAIT_S, 10 s).
READER_SILENT_S = 25.0


# Snapshots run in a group of their own: a gateway's long poll waits there without holding up registrations.
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, concurrency_groups={"snapshots": 64})  # type: ignore[call-overload]  # Ray's stubs lack concurrency_groups
class Registry:
    """The control plane's state and reconciler: endpoints (desired and active), live replicas, statuses.

    Every change is written through to Ray's GCS key-value store, so a restarted registry (or a new
    one after `serving up` restarts on a cluster) carries on where the last stopped: same endpoints,
    same routing table (replicas re-register every HEARTBEAT_S and one not heard from for
    REPLICA_TTL_S leaves it), updates in progress resumed. A background loop reads Serve's
    statuses every STATUS_POLL_S and advances each endpoint toward its desired record (`container_versions`).
    Writes need the control plane's token; a registration needs the proof made for that very
    container, version and URL (`keys`). Anything else is refused, logged and counted. Nothing
    here is secret: snapshots may be read by anyone who can reach the cluster.
    """

    def __init__(self) -> None:
        self.version = 0
        self.epoch = secrets.token_hex(6)  # a new registry process: the gateway knows its table was rebuilt
        self.states: dict[str, EndpointState] = {}
        self.replicas: dict[str, tuple[str, str, str]] = {}  # url -> (endpoint, container, version)
        self.seen: dict[str, float] = {}  # url -> last heartbeat (monotonic)
        self.statuses: dict[str, AppStatus] = {}  # Serve application statuses (control.StatusBoard reads)
        # Autoscaled containers: endpoint -> {"containers": {hostname: state}, "activities": [newest first]}
        self.scaling: dict[str, ScalingRecord] = {}
        # Endpoints a server was started with and has not deployed yet: no gateway is ready while one is missing.
        self.awaited: set[str] = set()
        # The control-plane API's routing: API endpoints' variants (fronts) and the served endpoints behind them.
        self.api: ApiRouting | None = None
        self.readers: dict[str, tuple[int, str | None, float]] = {}  # gateway -> (version applied, epoch, when)
        self.refused = 0
        self.root_secret = cluster_secret()
        self._control = keys.control_token(self.root_secret)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every new version (snapshots wait on it)
        self._wake = threading.Event()  # a put or delete: read Serve's statuses now, not after the idle period
        self._deployed: set[str] = set()  # applications deployed by this process (their status may lag)
        self._stopping = False  # the embedded server is stopping: deploy and delete nothing more
        self._store = KvStore()
        self._restore()
        # Polled here, not in the gateway: the gateway's process serves requests and must not
        # spend its GIL on the controller's answers.
        threading.Thread(target=self._loop, name="reconcile", daemon=True).start()

    def _restore(self) -> None:
        now = time.monotonic()
        for name, data in self._store.load(_KV_ENDPOINT).items():
            self.states[name] = EndpointState.from_dict(data)
        for url, key in self._store.load(_KV_REPLICA).items():
            self.replicas[url], self.seen[url] = tuple(key), now  # heartbeats confirm them, or they expire
        self.scaling = self._store.load(_KV_SCALING)
        self.awaited = set(self._store.load(_KV_AWAITED))
        self.api = self._store.load(_KV_API).get("routing")
        if self.states:
            logger.info("registry restored %d endpoints and %d replicas", len(self.states), len(self.replicas))

    def _bump(self) -> None:
        """A new version of the state (call with the lock held): wake the snapshots waiting for one."""
        self.version += 1
        self._changed.notify_all()

    def _loop(self) -> None:
        quiet = 0
        while True:
            try:
                before = self.version
                statuses = serve_status()
                with self._lock:
                    if statuses != self.statuses:
                        self.statuses = statuses
                        self._bump()
                acted = False if self._stopping else self._reconcile(statuses)
                busy = (
                    acted
                    or self.version != before
                    or any(s.update.get("Status") == "InProgress" for s in self.states.values())
                )
                quiet = 0 if busy else quiet + 1
            except ServeNotRunning:
                quiet = 0  # the control plane starts Serve before it deploys anything
            except Exception:
                logger.exception("status poll or reconcile failed")
            self._wake.wait(STATUS_IDLE_POLL_S if quiet >= QUIET_POLLS else STATUS_POLL_S)
            self._wake.clear()

    def _reconcile(self, statuses: dict[str, AppStatus]) -> bool:
        """Advance every endpoint; whether anything was deployed or deleted."""
        actions: list[Deploy | Delete] = []
        with self._lock:
            self._expire()
            registered = Counter(self.replicas.values())
            for name, state in self.states.items():
                before = json.dumps(state.to_dict(), sort_keys=True)
                actions += step(state, statuses, registered, time.time(), UPDATE_TIMEOUT_S, self._deployed)
                if json.dumps(state.to_dict(), sort_keys=True) != before:
                    self._store.put(_KV_ENDPOINT, name, state.to_dict())
                    self._bump()
            for app in statuses:  # every application of a deleted endpoint
                parsed = parse_app_name(app)
                if parsed is not None and parsed[0] not in self.states:
                    actions.append(Delete(app))
        for action in actions:
            try:
                if isinstance(action, Deploy):
                    deploy_container(action)
                    self._deployed.add(action.app)
                else:
                    serve.delete(action.app, _blocking=False)
                    self._deployed.discard(action.app)
            except Exception:
                logger.exception("could not %s", action)
        return bool(actions)

    def _allowed(self, token: object, what: str) -> bool:
        if keys.verify(self._control, token):
            return True
        self.refused += 1
        logger.warning("registry: refused %s without the control plane's token", what)
        return False

    def record_scaling(
        self, token: str, endpoint: str, container: str, state: ScalerState, activity: ScalingActivity | None
    ) -> bool:
        """An autoscaler's latest state for a container and, when it changed the count, the activity."""
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
        """The API's fronts and served endpoints, for every gateway; the version carrying them (0: refused)."""
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
            now = time.monotonic()
            return all(
                applied >= version and epoch == self.epoch
                for applied, epoch, when in self.readers.values()
                if now - when < READER_SILENT_S
            )

    def leave(self, token: str, reader: str) -> bool:
        """A gateway stopping cleanly: no longer one of those that `applied_everywhere` waits for."""
        if not self._allowed(token, f"leave({reader})"):
            return False
        with self._lock:
            self.readers.pop(reader, None)
        return True

    def stop_reconciling(self, token: str) -> bool:
        """The embedded server is stopping and deletes every application itself: deploy nothing again."""
        if not self._allowed(token, "stop_reconciling"):
            return False
        self._stopping = True
        return True

    def expect(self, token: str, names: list[str], expected: bool = True) -> bool:
        """Endpoints about to be deployed (`serving up`'s specs): every gateway's /ping answers 503 until they are
        put, or deleted, so that the first 200 means they route. `expected=False` withdraws (a failed start)."""
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
        """Make `record` the endpoint's desired state: created, or updated blue/green (same record: no-op).

        Returns the update's generation (its description's LastUpdate.Generation), False if refused.
        """
        name = record["name"]
        if not self._allowed(token, f"put_endpoint({name})"):
            return False
        with self._lock:
            self._arrived(name)
            state = self.states.get(name)
            if state is not None and state.desired == record and state.update.get("Status") != "Failed":
                return state.update.get("Generation", 1)
            generation = (state.update.get("Generation", 0) if state is not None else 0) + 1
            update = VersionsUpdate(
                Status="InProgress", StartedAt=time.time(), FailureReason=None, Generation=generation
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
        self._wake.set()
        return generation

    def delete_endpoint(self, token: str, name: str) -> bool:
        """Forget the endpoint: it leaves the routing table now, its applications go on the next loop."""
        if not self._allowed(token, f"delete_endpoint({name})"):
            return False
        with self._lock:
            self._arrived(name)
            self.states.pop(name, None)
            self.scaling.pop(name, None)
            self._store.delete(_KV_ENDPOINT, name)
            self._store.delete(_KV_SCALING, name)
            for url in [url for url, key in self.replicas.items() if key[0] == name]:
                self._forget(url)
            self._bump()
        self._wake.set()
        return True

    def register(self, endpoint: str, container: str, version: str, url: str, proof: str) -> bool:
        """Put a replica's data port under (endpoint, container, version): only with the proof made for exactly that."""
        if not keys.verify(keys.registration_proof(self.root_secret, endpoint, container, url, version), proof):
            self.refused += 1
            logger.warning("registry: refused to register %s for %s/%s without its proof", url, endpoint, container)
            return False
        key = (endpoint, container, version)
        with self._lock:
            self.seen[url] = time.monotonic()
            if self.replicas.get(url) != key:
                self.replicas[url] = key
                self._store.put(_KV_REPLICA, url, list(key))
                self._bump()
        return True

    def deregister(self, url: str, proof: str | None = None, token: str | None = None) -> bool:
        """Remove a replica: by itself (its registration proof), or by a gateway it refused (the control token)."""
        key = self.replicas.get(url)
        own = key is not None and keys.verify(
            keys.registration_proof(self.root_secret, key[0], key[1], url, key[2]), proof
        )
        if not own and not self._allowed(token, f"deregister({url})"):
            return False
        with self._lock:
            self._forget(url)
        return True

    def _forget(self, url: str) -> None:
        self.seen.pop(url, None)
        if self.replicas.pop(url, None) is not None:
            self._store.delete(_KV_REPLICA, url)
            self._bump()

    def _expire(self) -> None:
        now = time.monotonic()
        for url in [url for url, seen in self.seen.items() if now - seen > REPLICA_TTL_S]:
            self._forget(url)

    @ray.method(concurrency_group="snapshots")
    def snapshot(
        self, since: int, wait_s: float = 0.0, epoch: str | None = None, reader: str | None = None
    ) -> Snapshot | None:
        """Everything the gateway needs, or None when nothing changed since version `since` (of this registry
        process, `epoch`) within `wait_s` seconds (at most SNAPSHOT_MAX_WAIT_S): a long poll, answered as soon
        as the state changes. `reader`: the gateway asking, which has applied `since` (`applied_everywhere`)."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), SNAPSHOT_MAX_WAIT_S)
        with self._lock:
            if reader is not None:
                self.readers[reader] = (since, epoch, time.monotonic())
                for gone in [r for r, (_, _, when) in self.readers.items() if time.monotonic() - when > 3600]:
                    del self.readers[gone]
            self._expire()
            while since == self.version and epoch in (None, self.epoch):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)
            registered = Counter(self.replicas.values())
            endpoints = {name: state.snapshot() for name, state in self.states.items()}
            table = container_versions.routed_replicas(self.states, self.replicas)
            return {
                "version": self.version,
                "epoch": self.epoch,
                "endpoints": endpoints,
                "replicas": table,
                "registered": dict(registered),
                "statuses": self.statuses,
                "refused": self.refused,
                "awaited": sorted(self.awaited),
                "api": self.api,
                "scaling": {
                    name: ScalingRecord(containers=dict(s["containers"]), activities=list(s["activities"]))
                    for name, s in self.scaling.items()
                },
            }


def registry_handle():
    return Registry.options(
        name=REGISTRY_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        resources=ON_HEAD,
    ).remote()
