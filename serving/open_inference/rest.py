"""The Open Inference Protocol's REST API (`/v2/...`) on every gateway: HTTP in and out of
`dataplane.OpenInference`.

Errors leave in the protocol's shape, `{"error": "..."}`, with the status InvokeEndpoint would
answer; infer calls are counted with `protocol="v2-rest"`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.errors import (
    ServiceUnavailableError,
    ServingError,
    UnknownOperationError,
    ValidationError,
)
from serving.gateway.entry import invocation_frame
from serving.gateway.router import raw_request
from serving.http.bodies import read_bounded
from serving.http.responses import json_response
from serving.metrics.invocations import V2_REST_LABEL, InvocationTrace
from serving.open_inference import codec
from serving.open_inference.dataplane import V2_OPERATION, ModelCall, OpenInference

_MODEL, _VERSIONED = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"
INDEX_BODY_LIMIT = 65536  # a repository index request is `{"ready": true}`


Handler = Callable[[Any, Request], Awaitable[Response]]


def _v2_errors(handler: Handler) -> Handler:
    """A route whose ServingError is answered in the protocol's shape (`_error`): the one place
    every /v2 route but infer (whose outcome its entry frame holds) maps an error to its wire."""

    @functools.wraps(handler)
    async def route(routes: Any, request: Request) -> Response:
        try:
            return await handler(routes, request)
        except ServingError as error:
            return _error(error)

    return route


class OpenInferenceRoutes:
    """`/v2/...` over the shared V2 operations."""

    def __init__(self, v2: OpenInference) -> None:
        self.v2 = v2

    def hot_routes(self) -> list[Route]:
        """Infer, which the app serves ahead of its middleware stack (`http.hot_path`), as
        InvokeEndpoint."""
        return [
            Route(f"{path}/infer", self.infer, methods=["POST"]) for path in (_MODEL, _VERSIONED)
        ]

    def routes(self) -> list[Route]:
        v2 = protocol.V2_PREFIX
        return [
            Route(v2, self.server_metadata, methods=["GET"]),
            Route(f"{v2}/health/live", self.live, methods=["GET"]),
            Route(f"{v2}/health/ready", self.ready, methods=["GET"]),
            Route(f"{v2}/repository/index", self.repository_index, methods=["POST"]),
            Route(
                f"{v2}/repository/models/{{model:path}}/{{action:str}}",
                self.repository_change,
                methods=["POST"],
            ),
            *[
                route
                for path in (_MODEL, _VERSIONED)
                for route in (
                    Route(path, self.model_metadata, methods=["GET"]),
                    Route(f"{path}/ready", self.model_ready, methods=["GET"]),
                )
            ],
        ]

    # --- server -----------------------------------------------------------------------------------
    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.v2.server)

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        """Ready as GET /ping is: every endpoint this gateway must serve is routable from it."""
        reasons = self.v2.unroutable()
        return (
            json_response({"ready": True})
            if not reasons
            else _error(ServiceUnavailableError("; ".join(reasons)))
        )

    # --- one model --------------------------------------------------------------------------------
    @_v2_errors
    async def model_metadata(self, request: Request) -> Response:
        return json_response(await self.v2.model_metadata(_call(request)))

    @_v2_errors
    async def model_ready(self, request: Request) -> Response:
        """200 while every container of the model has a replica this gateway routes to."""
        call = _call(request)
        await self.v2.model_ready(call)
        return json_response({"name": call.model, "ready": True})

    async def infer(self, request: Request) -> Response:
        trace = InvocationTrace(protocol=V2_REST_LABEL)
        length = request.headers.get(protocol.V2_HEADER_LENGTH)
        response = Response(status_code=499)  # the caller left: nobody is there to read it
        async with invocation_frame(
            trace,
            "the Open Inference route",
            (ClientDisconnect,),
            carrier=request.headers,
            operation=V2_OPERATION,
        ) as frame:
            answer = await self.v2.infer(
                _call(request), trace, lambda body: codec.parse_request(body, length)
            )
            body, headers = codec.encode_response(
                answer.model, answer.version, answer.request, answer.outputs
            )
            response = Response(body, headers=headers)
        if frame.error is not None:
            response = _error(frame.error)
        if frame.span is not None:
            response.headers[protocol.TRACE_ID] = frame.span.trace_id
        return response

    # --- the model repository extension -----------------------------------------------------------
    @_v2_errors
    async def repository_index(self, request: Request) -> Response:
        """`[{"name", "state", "reason"}]`: the MultiModel containers' models this caller may
        invoke."""
        body = await _small_body(request)
        try:
            document = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            raise ValidationError("the index request's body is not JSON") from None
        ready = bool(document.get("ready")) if isinstance(document, dict) else False
        head = replace(raw_request(request), body=body)  # a Signature V4 covers it
        return json_response(await self.v2.repository_index(head, ready))

    @_v2_errors
    async def repository_change(self, request: Request) -> Response:
        """`load` or `unload` of `<endpoint>.<container>.<model>` (a MultiModel container's
        model)."""
        action = request.path_params["action"]
        if action not in ("load", "unload"):
            raise UnknownOperationError(
                f"POST {request.url.path}: the repository offers load and unload"
            )
        await self.v2.repository_change(_call(request), action)
        return json_response({})


async def _small_body(request: Request) -> bytes:
    """A repository index request's body, refused as soon as it passes INDEX_BODY_LIMIT (read before
    any credentials are checked: never buffered whole)."""
    declared = request.headers.get("content-length")
    return bytes(
        await read_bounded(request.stream(), INDEX_BODY_LIMIT, _index_too_large, declared=declared)
    )


def _index_too_large(size: int | None) -> ValidationError:
    return ValidationError(f"the index request's body is over {INDEX_BODY_LIMIT} bytes")


def _call(request: Request) -> ModelCall:
    return ModelCall(
        request.path_params["model"],
        request.path_params.get("version"),
        request.headers.get("content-length"),
        request.stream,
        lambda: raw_request(request),
    )


def _error(error: ServingError) -> Response:
    """The protocol's error shape, with the status InvokeEndpoint would answer."""
    return json_response({"error": error.message}, error.status)
