"""The data plane's HTTP edge: a thin adapter from Starlette to the invocation pipeline
(`invocation`).

It turns a request into an `InvocationRequest`, the pipeline's result or error into a response
(errors through `serving.http.responses.error_response`, the function every server app's handler
uses), counts each answer (`metrics.invocations`), and closes the connection of a request refused
before its body was read. The steps themselves live in the pipeline, which knows no web framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import quote

from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from serving import protocol
from serving._malloc import keep_large_blocks_in_mmap
from serving.access.sigv4 import RawRequest
from serving.gateway.admission import EndpointRoute, InvocationRequest, InvocationResult
from serving.gateway.async_invocations import AsyncInvocations
from serving.gateway.entry import invocation_frame
from serving.gateway.invocation import Invocations
from serving.gateway.streaming import EVENT_STREAM, Framing, relay
from serving.gateway.transport import ContainerTransport
from serving.http.responses import error_response
from serving.metrics.invocations import InvocationTrace
from serving.settings import ServerSettings

__all__ = ["EndpointRoute", "Router", "streamed_response"]

# the root span's name: SageMaker Runtime's operation
_OPERATION = protocol.RUNTIME_OPERATIONS["invocations"]
_STREAM_OPERATION = protocol.RUNTIME_OPERATIONS["invocations-response-stream"]


class Router:
    """Serves `POST /endpoints/{name}/invocations`; the endpoint table is refreshed from outside."""

    def __init__(self, settings: ServerSettings, transport: ContainerTransport) -> None:
        self.settings = settings
        self.transport = transport
        self.invocations = Invocations(settings, transport)
        self.async_invocations = AsyncInvocations(
            settings, self.invocations, raw_request, after=self.invocations.after_answer
        )
        # Request bodies are the gateway's large allocations: without this, the memory of a burst of
        # them stays with the process after they are freed (measured: up to 62 MiB after a 64 MB
        # burst, varying run to run).
        keep_large_blocks_in_mmap()

    @property
    def endpoints(self) -> dict[str, EndpointRoute]:
        return self.invocations.endpoints

    @endpoints.setter
    def endpoints(self, table: dict[str, EndpointRoute]) -> None:
        self.invocations.endpoints = table

    @property
    def loaded(self) -> bool:
        return self.invocations.loaded

    @loaded.setter
    def loaded(self, value: bool) -> None:
        self.invocations.loaded = value

    def hot_route(self) -> Route:
        """InvokeEndpoint's route: the app serves it ahead of its middleware stack
        (`http.hot_path`)."""
        return Route("/endpoints/{name}/invocations", self.invoke, methods=["POST"])

    def routes(self) -> list[Route]:
        return [
            Route(
                "/endpoints/{name}/invocations-response-stream",
                self.invoke_stream,
                methods=["POST"],
            ),
            *self.async_invocations.routes(),
        ]

    async def invoke(self, request: Request) -> Response:
        return await self._answer(request, stream=False)

    async def invoke_stream(self, request: Request) -> Response:
        """InvokeEndpointWithResponseStream: the same pipeline; errors before the first part are
        answered as InvokeEndpoint's, later ones as an error event that ends the stream
        (`gateway.streaming`)."""
        return await self._answer(request, stream=True)

    async def _answer(self, request: Request, stream: bool) -> Response:
        trace = InvocationTrace()
        invocation = InvocationRequest(
            request.path_params["name"],
            request.headers,
            request.stream,
            lambda: raw_request(request),
        )
        response: Response | None = None
        async with invocation_frame(
            trace,
            "the endpoint router",
            (ClientDisconnect,),
            carrier=request.headers,
            operation=_STREAM_OPERATION if stream else _OPERATION,
        ) as frame:
            result = await self.invocations.invoke(invocation, trace, stream=stream)
            if result.chunks is not None:
                if frame.span is not None:
                    result.headers[protocol.TRACE_ID] = frame.span.trace_id
                return streamed_response(result, trace, frame.defer())
            # The container's Content-Type exactly as it set it (media_type= would add ";
            # charset=utf-8" to text/*).
            response = Response(
                result.body, headers={**result.headers, "content-type": result.content_type}
            )
        # the client left (or was cut off) mid-body: its doing, not a failure of ours
        if frame.aborted:
            # nginx's "client closed request"; nobody is there to read it
            return Response(status_code=499)
        if frame.error is not None:
            response = error_response(frame.error)
        assert response is not None
        if frame.span is not None:
            response.headers[protocol.TRACE_ID] = frame.span.trace_id
        if not trace.body_read:
            # Refused before its body was read: close rather than read (and drop) what anyone may
            # send.
            response.headers["connection"] = "close"
        return response


def streamed_response(
    result: InvocationResult,
    trace: InvocationTrace,
    count: Callable[[int], None],
    framing: Framing = EVENT_STREAM,
) -> Response:
    """The streamed response (SageMaker's event stream unless `framing` says otherwise); the
    invocation is counted once (`count`), when the stream ends however it ends."""
    hop = result.chunks
    assert hop is not None
    first_part = time.perf_counter()
    ended = False

    def finished(status: int) -> None:
        nonlocal ended
        hop.close()  # also when the stream never started (the caller left first)
        if ended:
            return
        ended = True
        if trace.hops:  # the last hop lasted until its stream ended
            container, seconds = trace.hops[-1]
            trace.hops[-1] = (container, seconds + time.perf_counter() - first_part)
        if status >= 400:
            trace.failed_container = trace.chain[-1]
        count(status)

    container = trace.chain[-1]
    return StreamingResponse(
        relay(hop, container, finished, framing),
        headers=result.headers,
        media_type=result.content_type,
        background=BackgroundTask(finished, 200),
    )


def raw_request(request: Request) -> RawRequest:
    """The request as it arrived on the wire, for signature verification."""
    scope = request.scope
    raw_path = scope.get("raw_path") or quote(scope["path"]).encode()
    return RawRequest(
        method=request.method,
        path=raw_path.decode("latin-1").split("?", 1)[0],
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=tuple(
            (key.decode("latin-1"), value.decode("latin-1")) for key, value in request.headers.raw
        ),
        body=b"",
    )
