"""The gateway: the endpoint HTTP server on every node, in a `gateway_fleet.NodeGateway` actor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import ray
from prometheus_client import generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving._gc import freeze_startup_objects
from serving.access.decision import configure_audit_log
from serving.access.identities import load_identities
from serving.config.spec import DEFAULT_MAX_CONCURRENCY
from serving.console.access import ConsoleAccess
from serving.console.overview import ConsoleJson
from serving.console.page import ConsoleRoutes
from serving.control.status import StatusBoard
from serving.documents import ApiJson
from serving.errors import ServiceUnavailableError
from serving.gateway.control_routes import ControlRoutes
from serving.gateway.openai_routes import OpenAIRoutes
from serving.gateway.replica_choice import local_hosts
from serving.gateway.router import Router
from serving.gateway.state import GatewayState
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer, HttpLimits
from serving.metrics.exposition import CONTENT_TYPE, exposition
from serving.metrics.invocations import (
    REGISTRY,
    DesiredReplicasCollector,
    ReplicaCountCollector,
    series_moves,
)
from serving.open_inference.dataplane import OpenInference
from serving.open_inference.grpc_service import GrpcInference
from serving.open_inference.rest import OpenInferenceRoutes
from serving.ray_wing.async_journal import HEARTBEAT_S, GcsJournal
from serving.ray_wing.gateway_counters import PUBLISH_S as COUNTERS_PUBLISH_S
from serving.ray_wing.gateway_counters import GatewayCounters
from serving.ray_wing.operations import (
    control_token,
    delete_endpoint,
    deploy_endpoint,
    root_secret,
)
from serving.ray_wing.periodic import every
from serving.ray_wing.registry import registry_handle
from serving.ray_wing.registry_follower import RegistryFollower
from serving.sagemaker_api.routes import Answer, api_routes
from serving.settings import ServerSettings, SettingsJson
from serving.tracing import spans as tracing
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.gateway")


# --- gateway ------------------------------------------------------------------------
class Gateway:
    """The endpoint HTTP server: router plus control routes (`gateway_fleet.NodeGateway` runs it)."""

    def __init__(self, settings: SettingsJson, share_port: bool = True) -> None:
        """`share_port`: bind the ports with SO_REUSEPORT, for the other gateways of this node or
        this machine; an embedded server's one gateway shares them with nothing (docs/security.md,
        "Listeners")."""
        self.settings = ServerSettings(**settings)
        configure_audit_log()  # access decisions: JSON lines on this replica's stderr
        # on when the OTEL_* variables `serving up` passed ask for traces; a missing exporter fails
        # the start, naming its package
        tracing.configure()
        self.registry = registry_handle()
        self._control = control_token()
        root = root_secret()
        hop_keys: dict[tuple[str, str], bytes] = {}

        def hop_key(endpoint: str, container: str) -> bytes:
            key = hop_keys.get((endpoint, container))
            if key is None:
                key = hop_keys[(endpoint, container)] = keys.hop_key(root, endpoint, container)
            return key

        self.transport = ContainerTransport(
            default_limit=DEFAULT_MAX_CONCURRENCY,
            hop_key=hop_key,
            unix_sockets=self.settings.hop_unix_socket,
            local_hosts=local_hosts(self.settings.locality_routing, ray.util.get_node_ip_address()),
        )
        self.router = Router(self.settings, self.transport)
        # this gateway process's unfinished async requests
        self.journal = GcsJournal(owner=uuid.uuid4().hex)
        self.journal.beat()
        self.router.async_invocations.journal = self.journal
        self.board = StatusBoard()
        # how the registry knows what this gateway has applied
        self.reader = f"gateway:{uuid.uuid4().hex}"
        self.follower = RegistryFollower(self.registry, self.reader, root)
        # its own counters, for the other gateways' scrapes
        self.counters = GatewayCounters(self.reader)
        self.state = GatewayState(
            self.settings, self.router.invocations, self.transport, self.board
        )
        # Its own series; GET /metrics adds every node's and gateway's in the control plane (off the
        # data path).
        self.local_metrics: list[Any] = [
            REGISTRY,
            ReplicaCountCollector(self.state.replica_counts),
            DesiredReplicasCollector(self.state.desired_replicas),
        ]
        control = ControlRoutes(
            keys.http_control_token(root),
            apply=lambda spec: deploy_endpoint(spec, self.settings),
            delete=delete_endpoint,
            describe=lambda name: self.board.descriptions.get(name),
        )
        api = api_routes(self.settings, self._dispatch_api, self.router.invocations.preauth_budget)
        open_inference = OpenInference(self.router.invocations, self.board.unroutable)
        v2 = OpenInferenceRoutes(open_inference)
        # gRPC: its own listener, on uvicorn's event loop (started with it), over the same pipeline
        grpc_on = self.settings.grpc_port is not None
        self.grpc = GrpcInference(open_inference, self.settings, share_port) if grpc_on else None
        self.board.everywhere = self._applied_everywhere
        self._read_first_snapshot()
        app = serving_app(
            self.board.routes()
            + control.routes()
            + self.router.routes()
            + [Route("/metrics", self._metrics)]
            + api
            + v2.routes()
            + OpenAIRoutes(self.router.invocations).routes()
            + self._console().routes(),
            lifespan=self._lifespan,
            hot=[self.router.hot_route(), *v2.hot_routes()],
        )
        self.server = BackgroundServer(
            app,
            self.settings.host,
            self.settings.port,
            HttpLimits.from_settings(self.settings),
            reuse_port=share_port,
        )
        if not self.server.wait_started():
            raise RuntimeError(f"endpoint server did not start on {self.server.url}")
        freeze_startup_objects()

    def _console(self) -> ConsoleRoutes:
        """`GET /console`: its viewers are the API's identities (anonymous on loopback without
        them); its data, one control-plane call per refresh."""
        settings = self.settings
        identities = load_identities(settings.api_identities) if settings.api_identities else None
        access = ConsoleAccess(identities, settings.host, settings.region, settings.account_id)
        return ConsoleRoutes(access, self._read_console)

    async def _read_console(self, endpoint: str | None) -> ConsoleJson | None:
        call = self.registry.console.remote(self._control, endpoint)
        try:
            return await asyncio.wait_for(call, METRICS_TIMEOUT_S)
        except TimeoutError:
            raise ServiceUnavailableError(
                f"the control plane did not answer the console within {METRICS_TIMEOUT_S:.0f} s; retry shortly"
            ) from None

    def _read_first_snapshot(self) -> None:
        """Read the routing table before listening: the gateways of a node share the port, and the
        kernel hands a listening one its share of new connections at once, which a gateway that
        cannot route yet would turn away (a restarted gateway, or one on a node that just joined).
        Bounded: past it, 503s until the poll."""
        try:
            call = self.registry.snapshot.remote(-1, 0.0, None, self.reader)
            snapshot = ray.get(call, timeout=FIRST_SNAPSHOT_S)
            self.follower.learn(snapshot)
            self.state.offer(snapshot)
        # the registry restarting: the poll catches up, and the router answers 503
        except Exception as error:
            logger.warning(
                "no routing table before listening (%s); answering 503 until the first poll", error
            )

    async def _applied_everywhere(self) -> bool:
        """Whether every live gateway has read this gateway's table version (/ping: a client cannot
        pick which gateway of a shared port its next call reaches)."""
        call = self.registry.applied_everywhere.remote(self.state.version)
        try:
            return bool(
                await asyncio.wait_for(asyncio.wrap_future(call.future()), FIRST_SNAPSHOT_S)
            )
        except Exception:
            return False

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        """What the gateway runs beside its routes, and their closing in reverse order of starting:
        gRPC first (no new call while the rest winds down), then the periodic tasks, leaving the
        registry, the after-the-answer tasks (async requests write failure objects, shadow copies
        are cancelled, captured invocations written), the transport."""
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(tracing.shut_down)  # last: what the rest traced is exported
            await self.transport.start()
            stack.push_async_callback(self.transport.close)
            stack.callback(self.follower.close)
            stack.push_async_callback(self.router.invocations.after_answer.close)
            stack.push_async_callback(self._leave_registry)
            tasks = [
                every("registry poll", self._poll_registry, self.settings.registry_poll_s),
                every("drop unreachable replicas", self._drop_unreachable, DROP_CHECK_S),
                every("async journal", self._keep_journal, HEARTBEAT_S),
                every("publish counters", self._publish_counters, COUNTERS_PUBLISH_S),
            ]
            stack.callback(lambda: [task.cancel() for task in tasks])
            if self.grpc is not None:
                await self.grpc.start()
                stack.push_async_callback(self.grpc.stop)
            yield

    async def _leave_registry(self) -> None:
        # the registry gone too: it forgets silent readers itself
        with contextlib.suppress(Exception):
            leave = self.registry.leave.remote(self._control, self.reader)
            await asyncio.wait_for(asyncio.wrap_future(leave.future()), 5.0)

    async def _poll_registry(self) -> None:
        """Keep the router's tables current: a long poll that the registry answers as soon as its
        state changes (at most every `registry_poll_s`), so an idle server makes one call per
        REGISTRY_WAIT_S, not four a second."""
        snapshot = await self.follower.next(self.state.version, self.state.epoch, REGISTRY_WAIT_S)
        self.state.offer(snapshot)

    async def _drop_unreachable(self) -> None:
        """Have the registry forget replicas the transport found refusing connections (a local check
        first)."""
        for url in self.transport.take_dropped():
            self.registry.deregister.remote(url, token=self._control)

    async def _keep_journal(self) -> None:
        """Say this gateway is alive, and take over the async requests of gateways gone silent (once
        the routing table is read: a job needs its endpoint's route)."""
        await asyncio.to_thread(self.journal.beat)
        if self.router.invocations.loaded:
            await self.router.async_invocations.take_over()

    async def _publish_counters(self) -> None:
        moves = series_moves()
        await asyncio.to_thread(self.counters.publish, moves, lambda: generate_latest(REGISTRY))

    async def _metrics(self, request: Request) -> Response:
        """`GET /metrics`: this gateway's own series, current, merged by the control plane with
        every node's and every other gateway's (what Prometheus scrapes from any gateway is the
        whole cluster)."""
        local = await asyncio.to_thread(
            lambda: exposition(
                family for collector in self.local_metrics for family in collector.collect()
            )
        )
        try:
            body = await asyncio.wait_for(
                self.registry.scrape.remote(self._control, local, self.reader), METRICS_TIMEOUT_S
            )
        except TimeoutError:
            raise ServiceUnavailableError(
                f"the control plane did not merge the metrics within {METRICS_TIMEOUT_S:.0f} s; scrape again"
            ) from None
        return Response(body, media_type=CONTENT_TYPE)

    async def _dispatch_api(self, prefix: str, operation: str, document: ApiJson) -> Answer:
        """An authorized API call, run by the control plane (`control_plane`, in the registry's
        process), bounded in time."""
        call = self.registry.api_call.remote(self._control, prefix, operation, document)
        try:
            return await asyncio.wait_for(call, API_CALL_TIMEOUT_S)
        except TimeoutError:
            raise ServiceUnavailableError(
                f"the control plane did not answer {operation} within {API_CALL_TIMEOUT_S:.0f} s; retry shortly"
            ) from None

    def check_health(self) -> None:
        if not self.server.alive:
            raise RuntimeError("endpoint HTTP server stopped")

    def url(self) -> str:
        return self.server.url

    def __del__(self) -> None:
        self.server.stop()


# a starting gateway waits this long for its first routing table, /ping for a confirmation
FIRST_SNAPSHOT_S = 10.0
METRICS_TIMEOUT_S = 10.0  # Prometheus's default scrape timeout
# an API call waits this long for the control plane (restarting: a few seconds)
API_CALL_TIMEOUT_S = 60.0
# a registry snapshot call waits this long for a change before answering "none"
REGISTRY_WAIT_S = 10.0
DROP_CHECK_S = 0.25  # how often replicas found unreachable are reported to the registry
