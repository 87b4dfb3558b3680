"""The gateways: `gateways_per_node` plain Ray actors on every live node, which the registry keeps.

They were a Serve application, whose controller placed them on each node, replaced a dead one and
checked their health. Every server then ran Serve's controller, a Ray worker that wakes twice a
second, for that alone: containers are hosted (`container_host`) and start without it. Now the
registry's process does those three things (`GatewayKeeper`, mixed into `Registry` by
`GatewayKeeping`), and Serve's controller starts only for a container Serve runs (one with a GPU or
a `RuntimeEnvironment`: `replica.deploy_container`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, TypedDict

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from serving.ray_wing.kv_store import KvStore
from serving.ray_wing.names import NAMESPACE

if TYPE_CHECKING:  # a type only: every process with a registry handle imports this module
    from serving.settings import SettingsJson

logger = logging.getLogger("serving.ray_wing.gateways")

GATEWAY_PREFIX = "serving-gateway:"  # each gateway actor's name: prefix, plan, node, index
CHECK_S = 5.0  # how often the keeper looks for new nodes and checks every gateway's health
CHECK_TIMEOUT_S = (
    30.0  # a gateway that does not answer its check within this is restarted (Serve's bound)
)
RETRY_MAX_S = 60.0  # a gateway that cannot start is tried again after 5 s, 10 s, ... up to this
STOP_TIMEOUT_S = 20.0  # how long `stop_gateways` lets the gateways drain before it kills them
_KV = b"gateways/"


class GatewayPlan(TypedDict):
    """What every gateway runs with: the server's settings, whether a node's gateways share their
    ports, and the environment variables `serving up` passes them (its `OTEL_*`)."""

    settings: SettingsJson
    share_port: bool
    env: dict[str, str]


@ray.remote(num_cpus=0, max_restarts=-1)
class NodeGateway:
    """One gateway's Ray worker. Ray starts it again where it ran if its process dies; its module
    loads here only, so that the process that creates it (the registry's) imports none of it."""

    def __init__(self, settings: SettingsJson, share_port: bool) -> None:
        from serving.ray_wing.gateway import Gateway

        self.gateway = Gateway(settings, share_port)

    def check_health(self) -> None:
        self.gateway.check_health()

    def where(self) -> tuple[str, int]:
        """Its node's ID and its process's PID."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def stop(self) -> None:
        """Stop accepting, let the calls in flight finish, leave the registry."""
        self.gateway.server.stop()


def plan_id(plan: GatewayPlan) -> str:
    """A short digest of the plan, in its gateways' names: a server started again with other settings
    gets new gateways, and the keeper stops the old ones."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:10]


def gateway_names() -> list[str]:
    """The names of the gateway actors alive (or restarting) in this cluster."""
    return [name for name in ray.util.list_named_actors() if name.startswith(GATEWAY_PREFIX)]


def stop_gateways(timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop every gateway: each drains (bounded by `timeout`, for all together), then its actor ends."""
    handles = []
    for name in gateway_names():
        try:
            handles.append(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            continue  # gone meanwhile
    if handles:
        ray.wait([h.stop.remote() for h in handles], num_returns=len(handles), timeout=timeout)
    for handle in handles:
        ray.kill(handle, no_restart=True)


def wait_serving(names: list[str], timeout: float) -> None:
    """Wait, bounded, until each named gateway listens; raise with the reason one could not start."""
    handles = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
    try:
        ray.get([h.check_health.remote() for h in handles], timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"still starting after {timeout:.0f} s") from None
    except ray.exceptions.RayError as error:
        raise RuntimeError(_reason(error)) from None


def _reason(error: Exception) -> str:
    """The last line of what a gateway that could not start raised (Ray adds its own lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _exists(name: str) -> bool:
    """Whether the named gateway is alive or being started again (Ray forgets a dead one's name)."""
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _live_nodes() -> list[str]:
    return [node["NodeID"] for node in ray.nodes() if node.get("Alive")]


class GatewayKeeper:
    """In the registry's process: `per_node` gateways on every live node. A thread looks every CHECK_S
    for nodes that joined, drops those that left, checks each gateway's health (one that fails or
    does not answer is restarted, as Serve did) and starts again, backing off, one that Ray could
    not (its start failed). The plan is kept in the GCS, so a restarted registry keeps it too."""

    def __init__(self, store: KvStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._plan: GatewayPlan | None = store.load(_KV).get("plan")
        self._handles: dict[str, Any] = {}
        self._retry: dict[str, tuple[float, float]] = {}  # name -> (not before, next backoff)
        self._healthy: set[str] = set()  # passed a check since Ray last started them
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if self._plan is not None:
            self._start_thread()

    def keep(self, plan: GatewayPlan) -> list[str]:
        """Run these gateways from now on (those of another plan stop); the names of this plan's."""
        with self._lock:
            self._plan = plan
            self._store.put(_KV, "plan", plan)
            names = self._ensure()
        self._stopped.clear()
        self._start_thread()
        threading.Thread(target=self._stop_others, args=(plan_id(plan),), daemon=True).start()
        return names

    def stop(self) -> None:
        """Keep no gateway any more (the server stops them itself: `stop_gateways`)."""
        self._stopped.set()

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="gateways", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(CHECK_S):
            try:
                self.step()
            except Exception:
                logger.exception("keeping the gateways failed")

    def step(self) -> None:
        """One look: start what is missing, then check every gateway's health."""
        with self._lock:
            self._ensure()
            handles = dict(self._handles)
        self._check(handles)

    def _ensure(self) -> list[str]:
        """Start the plan's gateways missing on live nodes (lock held); all of their names."""
        plan = self._plan
        if plan is None:
            return []
        prefix = f"{GATEWAY_PREFIX}{plan_id(plan)}:"
        wanted = {
            f"{prefix}{node}:{index}": node
            for node in _live_nodes()
            for index in range(plan["settings"].get("gateways_per_node", 1))
        }
        for name in [name for name in self._handles if name not in wanted]:
            del self._handles[name]  # its node left (or another plan replaced it)
        now = time.monotonic()
        for name, node in wanted.items():
            if name not in self._handles and self._retry.get(name, (0.0, 0.0))[0] <= now:
                self._handles[name] = _start(plan, name, node)
        return list(wanted)

    def _check(self, handles: dict[str, Any]) -> None:
        """Restart a gateway that fails its check, or that answered once and then stops answering
        (one starting is not held to the bound: its start has bounds of its own)."""
        calls = {name: handle.check_health.remote() for name, handle in handles.items()}
        if not calls:
            return
        done, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=CHECK_TIMEOUT_S)
        for name, call in calls.items():
            if call not in done:
                if name in self._healthy:
                    logger.error("gateway %s did not answer its health check: restarting it", name)
                    self._restart(name, handles[name])
                continue
            try:
                ray.get(call)
                self._healthy.add(name)
                self._retry.pop(name, None)
            except ray.exceptions.RayActorError as error:
                self._healthy.discard(name)
                if _exists(name):
                    continue  # Ray is starting it again (its process died)
                # gone for good (its start failed): started again, later each time
                backoff = self._retry.get(name, (0.0, CHECK_S))[1]
                logger.error(
                    "gateway %s is gone (%s): starting it again in %.0f s",
                    name,
                    _reason(error),
                    backoff,
                )
                with self._lock:
                    self._retry[name] = (time.monotonic() + backoff, min(backoff * 2, RETRY_MAX_S))
                    self._handles.pop(name, None)
            except ray.exceptions.RayTaskError as error:  # its check failed: its server stopped
                logger.error(
                    "gateway %s failed its health check (%s): restarting it", name, _reason(error)
                )
                self._restart(name, handles[name])

    def _restart(self, name: str, handle: Any) -> None:
        self._healthy.discard(name)
        ray.kill(handle, no_restart=False)

    def _stop_others(self, current: str) -> None:
        """Stop the gateways of an earlier plan (a server started again with other settings)."""
        for name in gateway_names():
            if name[len(GATEWAY_PREFIX) :].split(":", 1)[0] == current:
                continue
            try:
                handle = ray.get_actor(name, namespace=NAMESPACE)
                ray.wait([handle.stop.remote()], timeout=STOP_TIMEOUT_S)
                ray.kill(handle, no_restart=True)
            except Exception:
                logger.exception("could not stop gateway %s of an earlier plan", name)


def _start(plan: GatewayPlan, name: str, node: str) -> Any:
    """Start (or find) the named gateway on `node`, which it never leaves."""
    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
    }
    if plan["env"]:
        options["runtime_env"] = {"env_vars": plan["env"]}
    actor = NodeGateway.options(**options)  # type: ignore[attr-defined]  # Ray's decorator
    return actor.remote(plan["settings"], plan["share_port"])


class GatewayKeeping:
    """Mixed into `Registry`, which provides `_allowed` (its control-token check) and `_store`."""

    _store: KvStore

    def _allowed(self, token: object, what: str) -> bool:  # pragma: no cover - the registry's
        raise NotImplementedError

    def _keep_gateways(self) -> None:
        """At the registry's start: keep the gateways `serving up` asked for, if it did."""
        self._gateways = GatewayKeeper(self._store)

    def keep_gateways(self, token: str, plan: GatewayPlan) -> list[str] | None:
        """Run `plan`'s gateways on every live node (`serving up`); their names, or None if refused."""
        if not self._allowed(token, "keep_gateways"):
            return None
        return self._gateways.keep(plan)
