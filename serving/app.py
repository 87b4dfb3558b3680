"""Ray Serve glue and composition root: the only module that imports `ray.serve`.

Layout on Ray: one Serve application per endpoint holding one deployment per
container, plus one `serving-gateway` application whose replica runs the HTTP
server (router + control routes). A small registry actor tells the gateway which
endpoints exist and where each container replica's data port listens.

Trust: every process started here is a Ray worker holding the cluster's token, except
the container processes, where tenant code runs (`container_main`): a container replica
is a supervisor that starts one and relays its metrics. The registry accepts writes only
with the control plane's capability and registrations only with the container's own
proof (`keys`); it never holds a secret (the gateway reads identities files itself).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import threading
import time
from collections import Counter
from functools import lru_cache
from typing import Any

import ray
from ray import serve
from starlette.applications import Starlette

from serving import keys, rollout
from serving._http_server import BackgroundServer, HttpLimits
from serving.access import EndpointAccess, configure_audit_log
from serving.autoscaling import serve_autoscaling_config
from serving.auth import Identities
from serving.cluster import (
    NAMESPACE,
    UnauthenticatedClusterError,
    cluster_secret,
    connect_cluster,
    start_local_ray,
    stop_local_ray,
)
from serving.container_process import ContainerConfig, ContainerProcess, describe_sandbox
from serving.control import EndpointRecord, StatusBoard, applications_from_serve_details
from serving.control_routes import ControlRoutes
from serving.metrics import REGISTRY, DesiredReplicasCollector, ReplicaCountCollector
from serving.metrics_exposition import MetricsRoute
from serving.replica_events import replay
from serving.replica_metrics import AutoscalingStats, ReplicaMetrics
from serving.rollout import Delete, Deploy, EndpointState, parse_app_name, plan_version, step
from serving.router import EndpointRoute, Router
from serving.runtime_env import ray_runtime_env, replica_environment
from serving.settings import ServerSettings
from serving.spec import DEFAULT_MAX_CONCURRENCY, ContainerSpec, EndpointSpec
from serving.transport import ContainerTransport

logger = logging.getLogger("serving.app")

__all__ = ["UnauthenticatedClusterError", "connect_cluster", "start_local_ray"]  # re-exported: the CLI and benchmarks start Ray through here

REGISTRY_NAME = "serving-registry"
GATEWAY_APP = "serving-gateway"
STATUS_POLL_S = 1.0
STATS_POLL_S = 2.0  # how often a supervisor fetches its container process's counters and metric events


@lru_cache(maxsize=1)
def _root() -> bytes:
    return cluster_secret()


def control_token() -> str:
    """The control plane's capability for registry writes (derivable only with the cluster's token)."""
    return keys.control_token(_root())


def http_control_token() -> str:
    """What the gateway's control routes (`serving apply` / `serving delete` over HTTP) require."""
    return keys.http_control_token(_root())


# --- registry ------------------------------------------------------------------------
SCALING_ACTIVITIES_KEPT = 50  # per endpoint, newest first (DescribeScalingActivities shows the recent ones)
REPLICA_TTL_S = 15.0  # a replica not heard from for this long (crashed, node lost) leaves the table
HEARTBEAT_S = 5.0
UPDATE_TIMEOUT_S = 900.0  # a new version not ready within this long is rolled back
_KV_ENDPOINT, _KV_REPLICA, _KV_SCALING = b"endpoint/", b"replica/", b"scaling/"


class _Store:
    """The registry's state in Ray's GCS key-value store: it outlives the registry actor and the gateway."""

    def put(self, prefix: bytes, key: str, value: Any) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(prefix + key.encode(), json.dumps(value).encode(), overwrite=True,
                                     namespace=NAMESPACE)

    def delete(self, prefix: bytes, key: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(prefix + key.encode(), namespace=NAMESPACE)

    def load(self, prefix: bytes) -> dict[str, Any]:
        from ray.experimental import internal_kv

        found = {}
        for key in internal_kv._internal_kv_list(prefix, namespace=NAMESPACE):
            value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
            if value is not None:
                found[key[len(prefix):].decode()] = json.loads(value)
        return found


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)  # calls wait out a restart
class Registry:
    """The control plane's state and reconciler: endpoints (desired and active), live replicas, statuses.

    Every change is written through to Ray's GCS key-value store, so a restarted registry (or a new
    one after `serving up` restarts on a cluster) carries on where the last stopped: same endpoints,
    same routing table (replicas re-register every HEARTBEAT_S and one not heard from for
    REPLICA_TTL_S leaves it), updates in progress resumed. A background loop reads Serve's
    statuses every STATUS_POLL_S and advances each endpoint toward its desired record (`rollout`).
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
        self.statuses: dict[str, dict[str, Any]] = {}  # Serve application statuses (control.StatusBoard reads)
        # Autoscaled containers: endpoint -> {"containers": {hostname: state}, "activities": [newest first]}
        self.scaling: dict[str, dict[str, Any]] = {}
        self.refused = 0
        self._root = cluster_secret()
        self._control = keys.control_token(self._root)
        self._lock = threading.RLock()
        self._deployed: set[str] = set()  # applications deployed by this process (their status may lag)
        self._store = _Store()
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
        if self.states:
            logger.info("registry restored %d endpoints and %d replicas", len(self.states), len(self.replicas))

    def _loop(self) -> None:
        while True:
            try:
                statuses = serve_status()
                with self._lock:
                    if statuses != self.statuses:
                        self.statuses = statuses
                        self.version += 1
                self._reconcile(statuses)
            except ServeNotRunning:
                pass  # the control plane starts Serve before it deploys anything
            except Exception:
                logger.exception("status poll or reconcile failed")
            time.sleep(STATUS_POLL_S)

    def _reconcile(self, statuses: dict[str, dict[str, Any]]) -> None:
        actions: list[Deploy | Delete] = []
        with self._lock:
            self._expire()
            registered = Counter(self.replicas.values())
            for name, state in self.states.items():
                before = json.dumps(state.to_dict(), sort_keys=True)
                actions += step(state, statuses, registered, time.time(), UPDATE_TIMEOUT_S, self._deployed)
                if json.dumps(state.to_dict(), sort_keys=True) != before:
                    self._store.put(_KV_ENDPOINT, name, state.to_dict())
                    self.version += 1
            for app in statuses:  # every application of a deleted endpoint
                parsed = parse_app_name(app)
                if parsed is not None and parsed[0] not in self.states:
                    actions.append(Delete(app))
        for action in actions:
            try:
                if isinstance(action, Deploy):
                    _deploy_container(action)
                    self._deployed.add(action.app)
                else:
                    serve.delete(action.app, _blocking=False)
                    self._deployed.discard(action.app)
            except Exception:
                logger.exception("could not %s", action)

    def _allowed(self, token: object, what: str) -> bool:
        if keys.verify(self._control, token):
            return True
        self.refused += 1
        logger.warning("registry: refused %s without the control plane's token", what)
        return False

    def record_scaling(self, token: str, endpoint: str, container: str, state: dict[str, Any],
                       activity: dict[str, Any] | None) -> bool:
        """An autoscaler's latest state for a container and, when it changed the count, the activity."""
        if not self._allowed(token, f"record_scaling({endpoint}/{container})"):
            return False
        with self._lock:
            scaling = self.scaling.setdefault(endpoint, {"containers": {}, "activities": []})
            scaling["containers"][container] = state
            if activity is not None:
                scaling["activities"] = [activity, *scaling["activities"]][:SCALING_ACTIVITIES_KEPT]
            self._store.put(_KV_SCALING, endpoint, scaling)
            self.version += 1
        return True

    def put_endpoint(self, token: str, record: dict[str, Any]) -> int | bool:
        """Make `record` the endpoint's desired state: created, or updated blue/green (same record: no-op).

        Returns the update's generation (its description's LastUpdate.Generation), False if refused.
        """
        name = record["name"]
        if not self._allowed(token, f"put_endpoint({name})"):
            return False
        with self._lock:
            state = self.states.get(name)
            if state is not None and state.desired == record and state.update.get("Status") != "Failed":
                return state.update.get("Generation", 1)
            generation = (state.update.get("Generation", 0) if state is not None else 0) + 1
            update = {"Status": "InProgress", "StartedAt": time.time(), "FailureReason": None, "Generation": generation}
            if state is None:
                state = self.states[name] = EndpointState(name, record, None, update)
            else:
                state.desired, state.update = record, update
            if state.active is None or state.active.get("containers") != record.get("containers"):
                self.scaling.pop(name, None)  # a new spec starts a new history
                self._store.delete(_KV_SCALING, name)
            self._store.put(_KV_ENDPOINT, name, state.to_dict())
            self.version += 1
        return generation

    def delete_endpoint(self, token: str, name: str) -> bool:
        """Forget the endpoint: it leaves the routing table now, its applications go on the next loop."""
        if not self._allowed(token, f"delete_endpoint({name})"):
            return False
        with self._lock:
            self.states.pop(name, None)
            self.scaling.pop(name, None)
            self._store.delete(_KV_ENDPOINT, name)
            self._store.delete(_KV_SCALING, name)
            for url in [url for url, key in self.replicas.items() if key[0] == name]:
                self._forget(url)
            self.version += 1
        return True

    def register(self, endpoint: str, container: str, version: str, url: str, proof: str) -> bool:
        """Put a replica's data port under (endpoint, container, version): only with the proof made for exactly that."""
        if not keys.verify(keys.registration_proof(self._root, endpoint, container, url, version), proof):
            self.refused += 1
            logger.warning("registry: refused to register %s for %s/%s without its proof", url, endpoint, container)
            return False
        self.seen[url] = time.monotonic()
        key = (endpoint, container, version)
        if self.replicas.get(url) != key:
            with self._lock:
                self.replicas[url] = key
                self._store.put(_KV_REPLICA, url, list(key))
                self.version += 1
        return True

    def deregister(self, url: str, proof: str | None = None, token: str | None = None) -> bool:
        """Remove a replica: by itself (its registration proof) or by the control plane (the gateway
        drops a replica that refuses connections)."""
        key = self.replicas.get(url)
        own = key is not None and keys.verify(
            keys.registration_proof(self._root, key[0], key[1], url, key[2]), proof)
        if not own and not self._allowed(token, f"deregister({url})"):
            return False
        with self._lock:
            self._forget(url)
        return True

    def _forget(self, url: str) -> None:
        self.seen.pop(url, None)
        if self.replicas.pop(url, None) is not None:
            self._store.delete(_KV_REPLICA, url)
            self.version += 1

    def _expire(self) -> None:
        now = time.monotonic()
        for url in [url for url, seen in self.seen.items() if now - seen > REPLICA_TTL_S]:
            self._forget(url)

    def snapshot(self, since: int) -> dict[str, Any] | None:
        """Everything the gateway needs, or None when nothing changed since version `since`."""
        with self._lock:
            self._expire()
            if since == self.version:
                return None
            registered = Counter(self.replicas.values())
            endpoints, table = {}, {}
            for name, state in self.states.items():
                routing = state.routing()
                routing_versions = rollout.versions(routing)
                endpoints[name] = {
                    **{key: value for key, value in routing.items() if key != "plans"},
                    "update": dict(state.update), "failed": state.failed, "in_service": state.active is not None,
                    "desired_versions": rollout.versions(state.desired),
                }
                for host, version in routing_versions.items():
                    table[(name, host)] = sorted(url for url, key in self.replicas.items() if key == (name, host, version))
            return {"version": self.version, "epoch": self.epoch, "endpoints": endpoints, "replicas": table,
                    "registered": dict(registered), "statuses": self.statuses, "refused": self.refused,
                    "scaling": {name: {"containers": dict(s["containers"]), "activities": list(s["activities"])}
                                for name, s in self.scaling.items()}}


# Control-plane actors live on the head node, which outlives worker nodes.
_ON_HEAD = {"node:__internal_head__": 0.001}


def _registry():
    return Registry.options(
        name=REGISTRY_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached", resources=_ON_HEAD,
    ).remote()


# --- container replicas ---------------------------------------------------------------
class ContainerReplica:
    """A Serve replica that supervises one container process (`container_main`): the process loads the
    model and serves its data port in a sandbox, with no Ray; this replica registers the port, reports
    the process's metrics and autoscaling stats, and stops it when Serve stops the replica."""

    def __init__(self, endpoint: str, hostname: str, version: str, image: str, model_data: str | None,
                 environment: dict[str, str], bind_host: str, multi_model: dict[str, Any] | None = None,
                 sandbox: str = "auto", working_dir: str | None = None, gpus: float = 0.0) -> None:
        root = cluster_secret()
        self.metrics = ReplicaMetrics(endpoint, hostname, serve.get_replica_context().replica_id.unique_id)
        host = ray.util.get_node_ip_address() if bind_host == "node" else bind_host
        self.process = ContainerProcess(ContainerConfig(
            endpoint=endpoint, hostname=hostname, image=image, model_data=model_data, environment=environment,
            hop_key=keys.hop_key(root, endpoint, hostname), multi_model=multi_model, sandbox=sandbox,
            working_dir=working_dir, gpus=gpus), host)
        try:
            report = self.process.start()  # a failure here marks the container (and endpoint) Failed with its error
        except Exception:
            self.process.stop(grace_s=0)
            raise
        logger.info("container %s/%s serves %s (pid %s; %s)", endpoint, hostname, self.process.url,
                    self.process.pid, describe_sandbox(report))
        self._counters: dict[str, Any] = {"invocations": 0, "in_flight": 0, "custom": {}}
        self.metrics.start_utilization(pids=lambda: [self.process.pid])
        self.stats = AutoscalingStats(self._read_counters, pids=lambda: [self.process.pid])
        self.registry = _registry()
        url = self.process.url
        self._registration = (endpoint, hostname, version, url,
                              keys.registration_proof(root, endpoint, hostname, url, version))
        if not ray.get(self.registry.register.remote(*self._registration), timeout=30):
            raise RuntimeError(f"container {hostname}: the registry refused its registration")
        self._stopping = threading.Event()
        threading.Thread(target=self._heartbeat, name="registry-heartbeat", daemon=True).start()
        threading.Thread(target=self._relay_stats, name="container-stats", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            self.registry.register.remote(*self._registration)

    def _relay_stats(self) -> None:
        """Fetch the container process's counters and record its metric events (it has no Ray to do it)."""
        while not self._stopping.wait(STATS_POLL_S):
            self._fetch_stats()

    def _fetch_stats(self) -> None:
        try:
            stats = self.process.stats()
        except Exception as error:
            if self.process.alive:
                logger.warning("container stats unavailable: %s", error)
            return
        replay(stats.pop("events", []), self.metrics)
        self.metrics.refused_hops(stats["refused"] - self._counters.get("refused", 0))
        self._counters = stats

    def _read_counters(self) -> tuple[int, int, dict[str, float]]:
        counters = self._counters
        return counters["invocations"], counters["in_flight"], counters["custom"]

    def check_health(self) -> None:
        if not self.process.alive:
            raise RuntimeError(f"container process exited ({self.process.process.returncode})")

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


# --- gateway ------------------------------------------------------------------------
class Gateway:
    """A Serve replica running the endpoint HTTP server: router plus control routes."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = ServerSettings(**settings)
        configure_audit_log()  # access decisions: JSON lines on this replica's stderr
        self.registry = _registry()
        self._control = control_token()
        root = _root()
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


class ServeNotRunning(RuntimeError):
    """Serve's controller is not up (yet): nothing to read, nothing to reconcile."""


def serve_status() -> dict[str, dict[str, Any]]:
    """Serve's application statuses as plain dicts (what control.StatusBoard reads).

    Reads the controller's instance details (the documented REST schema) directly:
    `serve.status()` builds the same from them through pydantic at ~100 times the CPU.
    """
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:  # Serve not started yet
        raise ServeNotRunning()
    get_details = getattr(client, "get_serve_details", None)
    if get_details is not None:
        return applications_from_serve_details(get_details())
    return {  # a Ray that moved it: the public API, same answer, slower  # pragma: no cover
        name: {
            "status": str(getattr(app.status, "value", app.status)),
            "message": app.message or "",
            "deployments": {
                dep_name: {
                    "status": str(getattr(dep.status, "value", dep.status)),
                    "message": dep.message or "",
                    "replicas": {str(getattr(k, "value", k)): v for k, v in dep.replica_states.items()},
                }
                for dep_name, dep in app.deployments.items()
            },
        }
        for name, app in serve.status().applications.items()
    }


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
    _registry()
    gateway = serve.deployment(Gateway).options(
        name="gateway", num_replicas=1, max_ongoing_requests=8, health_check_period_s=5,
        ray_actor_options={"num_cpus": 0, "resources": _ON_HEAD},
    )
    try:
        handle = serve.run(gateway.bind(settings.model_dump()), name=GATEWAY_APP, route_prefix=None)
    except RuntimeError as error:
        raise RuntimeError(f"could not start the endpoint server on {settings.host}:{settings.port}: {error}") from None
    return handle.url.remote().result(timeout_s=30)


def container_plan(spec: EndpointSpec, container: ContainerSpec, settings: ServerSettings) -> dict[str, Any]:
    """Everything one container's replicas are built from (its version is a digest of this)."""
    resources = container.Resources
    actor_options: dict[str, Any] = {
        "num_cpus": resources.Cpus,
        "num_gpus": resources.Gpus,
        "runtime_env": ray_runtime_env(container),  # Environment + CPU/GPU share, RuntimeEnvironment
    }
    if resources.MemoryMb:
        actor_options["memory"] = resources.MemoryMb * 1024 * 1024
    if resources.Custom:
        actor_options["resources"] = dict(resources.Custom)
    scaling = spec.scaling_of(container)
    if scaling is not None and scaling.policies:  # target tracking: our policy in Serve's controller
        endpoint_level = spec.AutoScaling is not None
        count = {"autoscaling_config": serve_autoscaling_config(
            spec.EndpointName, None if endpoint_level else container.ContainerHostname, scaling,
            [policy.as_policy() for policy in scaling.policies], (REGISTRY_NAME, NAMESPACE),
            containers=[c.ContainerHostname for c in spec.Containers] if endpoint_level else None)}
    else:
        count = {"num_replicas": spec.replicas_of(container)}
    return {
        "image": container.Image, "model_data": container.ModelDataUrl, "environment": replica_environment(container),
        "bind_host": settings.container_host, "multi_model": container.multi_model, "sandbox": settings.sandbox,
        "working_dir": container.RuntimeEnvironment.WorkingDir if container.RuntimeEnvironment else None,
        "gpus": resources.Gpus, "actor_options": actor_options, "count": count,
    }


def endpoint_record(spec: EndpointSpec, settings: ServerSettings) -> dict[str, Any]:
    """The registry's record of a spec: what the router and descriptions need, and each container's plan."""
    plans = {c.ContainerHostname: container_plan(spec, c, settings) for c in spec.Containers}
    return {
        "name": spec.EndpointName,
        "mode": spec.mode.value,
        "containers": [
            {"ContainerHostname": c.ContainerHostname, "Image": c.Image, "Mode": c.Mode.value,
             "DesiredReplicas": spec.replicas_of(c), "Version": plan_version(plans[c.ContainerHostname])}
            for c in spec.Containers
        ],
        "limits": {c.ContainerHostname: c.max_concurrency for c in spec.Containers},
        "not_idempotent": [c.ContainerHostname for c in spec.Containers if not c.idempotent],
        # Where the gateway reads the identities itself: the secrets never travel through Ray.
        "access": spec.AccessControl.identities.reference() if spec.AccessControl else None,
        "plans": plans,
    }


def _deploy_container(action: Deploy) -> None:
    """Start one container version as its own Serve application, without waiting (the registry watches it)."""
    from ray.serve.api import RunTarget, _run_many  # the non-blocking form of serve.run

    plan = action.plan
    deployment = serve.deployment(ContainerReplica).options(
        name=action.container, ray_actor_options=plan["actor_options"], **plan["count"],
        max_ongoing_requests=8, health_check_period_s=5, graceful_shutdown_timeout_s=20,
        max_constructor_retry_count=3,  # a model that fails to load fails again: report it soon
    )
    bound = deployment.bind(action.endpoint, action.container, action.version, plan["image"], plan["model_data"],
                            plan["environment"], plan["bind_host"], multi_model=plan["multi_model"],
                            sandbox=plan["sandbox"], working_dir=plan["working_dir"], gpus=plan["gpus"])
    _run_many([RunTarget(target=bound, name=action.app, route_prefix=None)],
              wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)


def deploy_endpoint(spec: EndpointSpec, settings: ServerSettings) -> int:
    """Create or update the endpoint (blue/green per changed container); returns without waiting.

    The registry deploys each new container version beside the serving one and moves traffic once
    all are ready, or rolls back (see `rollout`); `describe_endpoints` shows the progress. Returns the
    update's generation: its description's `LastUpdate.Generation` once the gateway has seen it.
    """
    generation = ray.get(_registry().put_endpoint.remote(control_token(), endpoint_record(spec, settings)), timeout=30)
    if not generation:
        raise RuntimeError("the registry refused the endpoint: this process does not hold the cluster's token")
    return generation


def delete_endpoint(name: str, timeout: float = 60.0) -> bool:
    """Stop routing to the endpoint and wait (bounded) until its applications are gone; False if it was unknown."""
    registry = _registry()
    known = name in (ray.get(registry.snapshot.remote(-1), timeout=30) or {}).get("endpoints", {})
    ray.get(registry.delete_endpoint.remote(control_token(), name), timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not any((parse_app_name(app) or ("",))[0] == name for app in serve_status()):
                break
        except ServeNotRunning:
            break
        time.sleep(0.5)
    return known


def shutdown() -> None:
    """Stop Serve and the embedded Ray (never used on a shared cluster)."""
    try:
        serve.shutdown()
    finally:
        stop_local_ray()


def describe_endpoints() -> dict[str, dict[str, Any]]:
    """Descriptions of every endpoint, read from the registry (no HTTP needed)."""
    snapshot = ray.get(_registry().snapshot.remote(-1), timeout=30)
    board = StatusBoard()
    board.records = {name: EndpointRecord.from_snapshot(record) for name, record in snapshot["endpoints"].items()}
    board.refresh(snapshot["statuses"], snapshot["registered"])
    return board.descriptions


def disconnect() -> None:
    """Leave a cluster, its Serve applications running."""
    ray.shutdown()
