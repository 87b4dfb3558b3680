"""Router -> container hops: pooled HTTP/1.1 keep-alive connections to replica data ports.

The replica table comes from the registry. A replica that refuses connections is dropped
at once and the request goes to another (it never reached the dead one, so it cannot run
twice). A connection that is reset or closed before any byte of the answer arrives (a
replica dying, a keep-alive connection the replica just closed) is retried once on another
replica, within the caller's deadline: inference is idempotent unless the container says
otherwise (`SERVING_IDEMPOTENT: "false"`). A connection lost after the answer began is
never retried: the container reported, or may have reported, something.

A streamed hop (InvokeEndpointWithResponseStream) is handed on as its bytes arrive: aiohttp's read
buffer (64 KiB before it stops reading the socket) is all it holds, so a slow caller slows the
container rather than filling the gateway's memory. Its replica counts as busy until the stream
ends; closing the stream closes the connection, which the container sees as its caller gone.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping

import aiohttp

from serving import protocol
from serving.errors import ModelNotReadyError
from serving.gateway.hop_answers import HopResponse, HopStream, StreamBroken, lost_connection
from serving.gateway.hop_client import HopClient, HopLost, HopRefused
from serving.gateway.replica_choice import LOCAL_SLACK, ModelHomes, Replica, choose
from serving.tracing import hop_steps
from serving.tracing import spans as tracing
from serving.trust import hops

# the answers and the replica are also importable from here, where they were first
__all__ = [
    "LOCAL_SLACK",
    "ContainerTransport",
    "HopResponse",
    "HopStream",
    "Replica",
    "StreamBroken",
]


# What aiohttp would add to a request that lacks them (and what containers have always received
# then).
_DEFAULT_HEADERS = {"content-type": protocol.OCTET_STREAM, "accept": "*/*"}


def _with_defaults(headers: Mapping[str, str]) -> dict[str, str]:
    present = {key.lower() for key in headers}
    return {
        **{key: value for key, value in _DEFAULT_HEADERS.items() if key not in present},
        **headers,
    }


class ContainerTransport:
    """Sends invocations to the least-busy replica of a container (to a model's home for
    MultiModel)."""

    def __init__(
        self,
        default_limit: int,
        hop_key: Callable[[str, str], bytes] | None = None,
        unix_sockets: bool = False,
        local_hosts: frozenset[str] = frozenset(),
    ) -> None:
        """`hop_key(endpoint, container)`: the key each hop to that container is signed with
        (`trust.hops`); None sends unsigned hops (tests of containers that verify nothing).
        `unix_sockets`: plain hops to a replica on this machine go through its data port's Unix
        socket (`http.local_socket`). `local_hosts`: the addresses of this node, whose replicas are
        preferred (LOCAL_SLACK)."""
        self._hop_key = hop_key
        self._local_hosts = local_hosts
        self._homes = ModelHomes()
        self._replicas: dict[tuple[str, str], list[Replica]] = {}
        self._limits: dict[tuple[str, str], int] = {}
        self._no_retry: set[tuple[str, str]] = set()  # containers that are not idempotent
        self.default_limit = default_limit
        self._dropped: list[str] = []
        self._turn = itertools.count()
        self._session: aiohttp.ClientSession | None = None  # streamed hops (its flow control)
        self._client = HopClient(unix_sockets)  # every other hop: the hot path, kept lean

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )

    async def close(self) -> None:
        self._client.close()
        if self._session is not None:
            await self._session.close()

    def update(
        self,
        table: Mapping[tuple[str, str], list[str]],
        limits: Mapping[tuple[str, str], int] | None = None,
        not_idempotent: set[tuple[str, str]] | None = None,
    ) -> None:
        """Replace the replica table (and per-replica in-flight limits, and which containers may not
        be retried), keeping counts of replicas that stay."""
        if limits is not None:
            self._limits = dict(limits)
        if not_idempotent is not None:
            self._no_retry = set(not_idempotent)
        current = {(key, r.url): r for key, replicas in self._replicas.items() for r in replicas}
        self._replicas = {
            key: [current.get((key, url)) or self._replica(url) for url in sorted(urls)]
            for key, urls in table.items()
        }
        self._client.keep_only(
            {replica.address for replicas in self._replicas.values() for replica in replicas}
        )

    def _replica(self, url: str) -> Replica:
        replica = Replica(url)
        replica.local = replica.address[0] in self._local_hosts
        return replica

    def take_dropped(self) -> list[str]:
        """URLs dropped since the last call (to tell the registry)."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def replica_count(self, endpoint: str, container: str) -> int:
        return len(self._replicas.get((endpoint, container), ()))

    def replica_urls(self, endpoint: str, container: str) -> tuple[str, ...]:
        return tuple(replica.url for replica in self._replicas.get((endpoint, container), ()))

    def _pick(
        self, replicas: list[Replica], home: str | None = None, avoid: Replica | None = None
    ) -> Replica:
        return choose(replicas, next(self._turn), home, avoid, local_first=bool(self._local_hosts))

    def home_of(self, endpoint: str, container: str, model: str) -> str | None:
        """The replica URL that last served `model` of a MultiModel container."""
        return self._homes.get((endpoint, container, model))

    async def send(
        self,
        endpoint: str,
        container: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        affinity: str | None = None,
        stream: bool = False,
        stream_timeout: float | None = None,
    ) -> HopResponse:
        """POST /invocations on one replica of the container; raises ModelNotReadyError if none
        answers, and TimeoutError when `timeout` (seconds, a retry on another replica included) runs
        out first.

        `affinity`: a MultiModel request's TargetModel, routed to the replica that holds it when it
        can. `stream`: ask for an event stream; a successful answer returns once its headers arrive,
        with `chunks` (bounded by `stream_timeout` in all, raising TimeoutError past it,
        StreamBroken if the connection breaks).
        """
        assert self._session is not None, "transport not started"
        key = (endpoint, container)
        home_key = (endpoint, container, affinity) if affinity is not None else None
        # sign exactly what is sent: no client adds a header after signing
        headers = _with_defaults(headers)
        if stream:
            headers[protocol.HOP_STREAM_HEADER] = "true"
        # Traced: the hop span's context, signed, so the container times its steps and logs the id.
        traced = tracing.current_carrier()
        if traced is not None:
            headers[protocol.TRACEPARENT] = traced[protocol.TRACEPARENT]
        if self._hop_key is not None:
            headers.update(
                hops.sign(
                    self._hop_key(endpoint, container),
                    "POST",
                    protocol.INVOCATIONS_PATH,
                    body,
                    headers,
                )
            )
        retries_left = 0 if key in self._no_retry else 1
        tries = 0
        broken: Replica | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._replicas.get(key):
            replicas = self._replicas[key]
            replica = self._pick(
                replicas, self._homes.get(home_key) if home_key and broken is None else None, broken
            )
            limit = self._limits.get(key, self.default_limit)
            if replica.in_flight >= limit:
                # Shed load here rather than queue without bound: the caller retries (429).
                raise ModelNotReadyError(
                    f"container {container} is busy: {len(replicas)} replica(s) each at the limit of {limit} "
                    "concurrent requests; retry shortly"
                )
            replica.in_flight += 1
            tries += 1
            with tracing.attempt(replica.url, tries, replica.address[0], replica.local):
                answered, held = False, False
                try:
                    if not stream:
                        answer = await self._post(
                            replica, body, headers, deadline - loop.time(), traced is not None
                        )
                    else:
                        response = await self._session.post(
                            replica.invocations_url,
                            data=body,
                            headers=headers,
                            timeout=aiohttp.ClientTimeout(total=stream_timeout),
                        )
                        answered = True
                        streaming = response.status < 400
                        try:
                            answer = HopResponse(
                                status=response.status,
                                body=b"" if streaming else await response.read(),
                                content_type=response.headers.get(
                                    protocol.STREAM_CONTENT_TYPE if streaming else "content-type"
                                ),
                                custom_attributes=response.headers.get(protocol.CUSTOM_ATTRIBUTES),
                                model_resolved=response.headers.get(protocol.MODEL_RESOLVED)
                                == "true",
                                platform=response.headers.get(protocol.PLATFORM_ERROR) == "true",
                                log_stream=response.headers.get(protocol.LOG_STREAM),
                                chunks=HopStream(response, replica) if streaming else None,
                            )
                            # the stream releases the replica and the connection when it ends
                            held = streaming
                        finally:
                            if not held:
                                response.release()
                    if home_key is not None and answer.status < 400:  # it holds the model now
                        self._homes.remember(home_key, replica.url)
                    return answer
                except (aiohttp.ClientConnectorError, HopRefused):
                    # Refused: the replica is gone. Forget it until the registry says otherwise.
                    tracing.annotate(tracing.OUTCOME, "refused")
                    if replica in replicas:
                        replicas.remove(replica)
                        self._dropped.append(replica.url)
                except TimeoutError:
                    raise  # the router reports the invocation timeout
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, HopLost) as error:
                    # Closed or reset before any answer: the replica died or dropped an idle connection.
                    if (
                        answered
                        or retries_left == 0
                        or (isinstance(error, HopLost) and error.answered)
                    ):
                        raise lost_connection(container, error) from None
                    tracing.annotate(tracing.OUTCOME, "lost")
                    retries_left -= 1
                    broken = replica
                except aiohttp.ClientError as error:
                    # The answer was under way: never retry it, report the container as failed.
                    raise lost_connection(container, error) from None
                finally:
                    if not held:
                        replica.in_flight -= 1
        raise ModelNotReadyError(
            f"container {container} of endpoint {endpoint} has no ready replica; retry shortly"
        )

    async def read(self, endpoint: str, container: str, path: str, timeout: float) -> HopResponse:
        """GET `path` on one replica of the container, signed as a hop (its model's signature, say);
        raises ModelNotReadyError when it has no replica, ModelError when the one asked does not
        answer."""
        assert self._session is not None, "transport not started"
        replicas = self._replicas.get((endpoint, container))
        if not replicas:
            raise ModelNotReadyError(
                f"container {container} of endpoint {endpoint} has no ready replica; retry shortly"
            )
        return await self._signed(
            endpoint, container, self._pick(replicas), "GET", path, b"", timeout
        )

    async def each(
        self, endpoint: str, container: str, method: str, path: str, body: bytes, timeout: float
    ) -> list[HopResponse]:
        """`method path` with `body` on every replica of the container at once, signed as hops (a
        MultiModel container's repository: each replica has its own cache); ModelNotReadyError when
        it has none."""
        replicas = list(self._replicas.get((endpoint, container), ()))
        if not replicas:
            raise ModelNotReadyError(
                f"container {container} of endpoint {endpoint} has no ready replica; retry shortly"
            )
        calls = [
            self._signed(endpoint, container, replica, method, path, body, timeout)
            for replica in replicas
        ]
        return list(await asyncio.gather(*calls))

    async def _signed(
        self,
        endpoint: str,
        container: str,
        replica: Replica,
        method: str,
        path: str,
        body: bytes,
        timeout: float,
    ) -> HopResponse:
        assert self._session is not None, "transport not started"
        headers = {"accept": protocol.JSON}  # sent as signed (aiohttp would add its own Accept)
        if body:
            headers["content-type"] = protocol.JSON
        if self._hop_key is not None:
            headers.update(
                hops.sign(self._hop_key(endpoint, container), method, path, body, headers)
            )
        try:
            async with self._session.request(
                method,
                replica.url + path,
                data=body or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                answer = await response.read()
                return HopResponse(
                    response.status, answer, response.headers.get("content-type"), None
                )
        except aiohttp.ClientError as error:
            raise lost_connection(container, error) from None

    async def _post(
        self,
        replica: Replica,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        traced: bool = False,
    ) -> HopResponse:
        host, port = replica.address
        sent_ns = time.time_ns() if traced else 0
        answer = await self._client.post(
            host, port, protocol.INVOCATIONS_PATH, body, headers, timeout
        )
        got = answer.headers
        if traced:  # the container's steps, as child spans of this attempt
            _record_steps(got.get(protocol.HOP_STEPS_HEADER), sent_ns)
        return HopResponse(
            status=answer.status,
            body=answer.body,
            content_type=got.get("content-type"),
            custom_attributes=got.get(protocol.CUSTOM_ATTRIBUTES.lower()),
            model_resolved=got.get(protocol.MODEL_RESOLVED.lower()) == "true",
            platform=got.get(protocol.PLATFORM_ERROR.lower()) == "true",
            log_stream=got.get(protocol.LOG_STREAM.lower()),
        )


def _record_steps(header: str | None, sent_ns: int) -> None:
    """The container's steps of a traced hop (`tracing.hop_steps`), within this attempt's time."""
    if not header:
        return
    steps, batch = hop_steps.parse(header, sent_ns, time.time_ns())
    for name, start, end in steps:
        attributes = {tracing.BATCH_SIZE: batch} if name == "predict" and batch else {}
        tracing.record(name, start, end, attributes)
