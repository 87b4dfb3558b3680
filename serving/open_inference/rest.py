"""The Open Inference Protocol's REST API on every gateway, over InvokeEndpoint's own pipeline.

A model is `<endpoint>.<container>` (one container of a Direct endpoint) or `<endpoint>` (a Serial endpoint's chain,
or an endpoint of one container); a MultiModel container's models are its versions. An infer call is admitted by
`Invocations.admit` exactly as an InvokeEndpoint call naming that container (the same authentication, the same
`sagemaker:InvokeEndpoint` decision with `sagemaker:TargetContainerHostname`), runs the same hops, and is counted
in the same metrics with `protocol="v2-rest"`. Errors leave in the protocol's shape, `{"error": "..."}`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.errors import (
    InternalFailureError,
    ModelNotReadyError,
    ServiceUnavailableError,
    ServingError,
    ValidationError,
)
from serving.gateway.invocation import Admission, InvocationRequest, Invocations
from serving.gateway.router import raw_request
from serving.http.responses import json_response
from serving.metrics.invocations import V2_REST_LABEL, InvocationTrace, record_client_abort, record_invocation
from serving.open_inference import codec
from serving.open_inference.signatures import Signatures

logger = logging.getLogger("serving.open_inference")
SINGLE_MODEL_VERSION = "1"  # the one version of a SingleModel container's model
_MODEL, _VERSIONED = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"


def _version() -> str:
    try:
        return metadata.version("serving")
    except metadata.PackageNotFoundError:
        return "0"


class OpenInferenceRoutes:
    """`/v2/...`; `unroutable()` says why the gateway cannot route every endpoint yet (empty: ready)."""

    def __init__(self, invocations: Invocations, unroutable: Callable[[], list[str]]) -> None:
        self.invocations = invocations
        self.signatures = Signatures(invocations.transport)
        self.unroutable = unroutable
        self.server = {"name": "serving", "version": _version(), "extensions": list(protocol.V2_EXTENSIONS)}

    def hot_routes(self) -> list[Route]:
        """Infer, which the app serves ahead of its middleware stack (`http.hot_path`), as InvokeEndpoint."""
        return [Route(f"{path}/infer", self.infer, methods=["POST"]) for path in (_MODEL, _VERSIONED)]

    def routes(self) -> list[Route]:
        v2 = protocol.V2_PREFIX
        return [
            Route(v2, self.server_metadata, methods=["GET"]),
            Route(f"{v2}/health/live", self.live, methods=["GET"]),
            Route(f"{v2}/health/ready", self.ready, methods=["GET"]),
            *[
                route
                for path in (_MODEL, _VERSIONED)
                for route in (
                    Route(path, self.model_metadata, methods=["GET"]),
                    Route(f"{path}/ready", self.model_ready, methods=["GET"]),
                )
            ],
        ]

    # --- server ---------------------------------------------------------------------------------------------
    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.server)

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        """Ready as GET /ping is: every endpoint this gateway must serve is routable from it."""
        reasons = self.unroutable()
        return json_response({"ready": True}) if not reasons else _error(ServiceUnavailableError("; ".join(reasons)))

    # --- one model ------------------------------------------------------------------------------------------
    async def model_metadata(self, request: Request) -> Response:
        try:
            admission, name, version = await self._admit(request, InvocationTrace())
            first = await self.signatures.get(admission.endpoint.name, admission.chain[0])
            last = await self.signatures.get(admission.endpoint.name, admission.chain[-1])
            multi = admission.chain[0] in admission.endpoint.multi_model
            document: dict[str, Any] = {
                "name": name,
                "versions": [version] if multi and version else [] if multi else [SINGLE_MODEL_VERSION],
                "platform": first.get("platform", ""),
                "inputs": first["inputs"],
                "outputs": last["outputs"],
            }
            return json_response(document)
        except ServingError as error:
            return _error(error)

    async def model_ready(self, request: Request) -> Response:
        """200 while every container of the model has a replica this gateway routes to."""
        try:
            admission, name, _ = await self._admit(request, InvocationTrace())
            transport = self.invocations.transport
            idle = [c for c in admission.chain if transport.replica_count(admission.endpoint.name, c) == 0]
            if idle:
                raise ModelNotReadyError(f"model {name}: no ready replica of {', '.join(idle)}")
            return json_response({"name": name, "ready": True})
        except ServingError as error:
            return _error(error)

    async def infer(self, request: Request) -> Response:
        started = time.perf_counter()
        trace = InvocationTrace(protocol=V2_REST_LABEL)
        counted: int | None = None
        try:
            admission, name, version = await self._admit(request, trace)
            body = await self.invocations.body_of(_invocation(request, admission.endpoint.name), admission, trace)
            inference = codec.parse_request(body, request.headers.get(protocol.V2_HEADER_LENGTH))
            endpoint, chain = admission.endpoint.name, admission.chain
            first = await self.signatures.get(endpoint, chain[0])
            last = first if len(chain) == 1 else await self.signatures.get(endpoint, chain[-1])
            payload, content_type = codec.container_body(inference, first["content_type"])
            hop_headers = {"content-type": content_type, "accept": last["accept"]}
            if admission.target_model is not None:
                hop_headers[protocol.TARGET_MODEL] = admission.target_model
            result = await self.invocations.run(admission, payload, Headers(hop_headers), trace)
            names = [output["name"] for output in last["outputs"]]
            outputs = codec.answer_tensors(result.body, result.content_type, names)
            answer, headers = codec.encode_response(name, version, inference, outputs)
            response = Response(answer, headers=headers)
        except ClientDisconnect:
            record_client_abort(trace)
            return Response(status_code=499)
        except ServingError as error:
            response, counted = _error(error), error.counted_status
        except Exception:  # a bug of ours: the documented shape, and keep serving
            logger.exception("Open Inference call failed inside the gateway")
            response = _error(InternalFailureError("internal failure in the Open Inference route"))
        record_invocation(trace, counted or response.status_code, time.perf_counter() - started)
        return response

    async def _admit(self, request: Request, trace: InvocationTrace) -> tuple[Admission, str, str | None]:
        """The request's model admitted as an InvokeEndpoint call of it; its name and version."""
        name, version = request.path_params["model"], request.path_params.get("version")
        endpoint, _, container = name.partition(protocol.MODEL_NAME_SEPARATOR)
        if not endpoint:
            raise ValidationError(f"model name {name!r} is not <endpoint> or <endpoint>.<container>")
        headers: dict[str, str] = {}
        if container:
            headers[protocol.TARGET_CONTAINER] = container
        if "content-length" in request.headers:
            headers["content-length"] = request.headers["content-length"]
        if version is not None and version != SINGLE_MODEL_VERSION:
            headers[protocol.TARGET_MODEL] = version  # a MultiModel container's model (refused elsewhere)
        try:
            admission = await self.invocations.admit(_invocation(request, endpoint, Headers(headers)), trace)
        except ValidationError as error:  # InvokeEndpoint's refusal, told in this protocol's terms
            for header, term in _TERMS.items():
                error.message = error.message.replace(header, term)
            raise
        return admission, name, version


# InvokeEndpoint's headers, as a V2 request says the same thing
_TERMS = {
    protocol.TARGET_MODEL: "the model version (a MultiModel container's model)",
    protocol.TARGET_CONTAINER: "the container of the model name (<endpoint>.<container>)",
}


def _invocation(request: Request, endpoint: str, headers: Headers | None = None) -> InvocationRequest:
    return InvocationRequest(
        endpoint, request.headers if headers is None else headers, request.stream, lambda: raw_request(request)
    )


def _error(error: ServingError) -> Response:
    """The protocol's error shape, with the status InvokeEndpoint would answer."""
    return json_response({"error": error.message}, error.status)
