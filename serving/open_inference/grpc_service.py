"""The Open Inference Protocol's gRPC service, `inference.GRPCInferenceService`, on a gateway's
`--grpc-port`.

Its methods are served by name over raw bytes and parsed here (`grpc_codec`), so that a Signature V4
can cover the exact bytes sent. Credentials travel in the call's metadata: `authorization` with a
bearer key, or a Signature V4 of `POST /inference.GRPCInferenceService/<Method>` over the signed
metadata (`host` and `x-amz-date` among them) and the serialized message. Everything after the
transport is `dataplane.OpenInference`, as for REST. Errors are gRPC statuses carrying the message
InvokeEndpoint would give; infer calls are counted with `protocol="v2-grpc"`.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.errors import ModelNotReadyError, ServingError, ValidationError
from serving.gateway.entry import invocation_frame
from serving.http.grpc_server import (
    GrpcAbort,
    GrpcCall,
    GrpcLimits,
    GrpcServer,
    Handler,
    StatusCode,
)
from serving.metrics.invocations import V2_GRPC_LABEL, InvocationTrace
from serving.open_inference import grpc_codec
from serving.open_inference import grpc_messages_pb2 as pb
from serving.open_inference.dataplane import V2_OPERATION, ModelCall, OpenInference
from serving.settings import ServerSettings

STOP_GRACE_S = 5.0  # calls in flight when the gateway stops may finish within this

# The gRPC status of each HTTP status InvokeEndpoint answers (anything else: INTERNAL)
_STATUS = {
    400: StatusCode.INVALID_ARGUMENT,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.NOT_FOUND,
    408: StatusCode.DEADLINE_EXCEEDED,
    413: StatusCode.RESOURCE_EXHAUSTED,
    429: StatusCode.RESOURCE_EXHAUSTED,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(error: ServingError) -> StatusCode:
    return _STATUS.get(error.status, StatusCode.INTERNAL)


Method = Callable[[Any, bytes, GrpcCall], Awaitable[bytes]]


def _grpc_errors(method: Method) -> Method:
    """A method whose ServingError ends the call with the status InvokeEndpoint's would map to
    (`grpc_status`): the one place every method maps an error to its wire."""

    @functools.wraps(method)
    async def call(service: Any, raw: bytes, context: GrpcCall) -> bytes:
        try:
            return await method(service, raw, context)
        except ServingError as error:
            raise GrpcAbort(grpc_status(error), error.message) from error

    return call


class GrpcInference:
    """The service's handlers over the shared V2 operations, and the listener that serves them."""

    def __init__(
        self, v2: OpenInference, settings: ServerSettings, share_port: bool = True
    ) -> None:
        self.v2 = v2
        self.settings = settings
        # SO_REUSEPORT: the port is shared with the node's other gateways
        self.share_port = share_port
        self.server: GrpcServer | None = None
        self.port = 0  # the port bound, once started (grpc_port 0: the kernel's choice)

    def methods(self) -> dict[str, Handler]:
        return {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ServerMetadata": self.server_metadata,
            "ModelReady": self.model_ready,
            "ModelMetadata": self.model_metadata,
            "ModelInfer": self.model_infer,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_load,
            "RepositoryModelUnload": self.repository_unload,
        }

    async def start(self) -> None:
        """Listen on the settings' host and gRPC port (TLS when a certificate is given), in the
        running loop."""
        settings = self.settings
        limits = GrpcLimits(
            max_calls=settings.grpc_max_concurrent_rpcs,
            max_message=settings.max_payload_bytes,  # a message is the payload
            max_header_bytes=settings.max_header_bytes,
            max_streams=settings.grpc_max_concurrent_rpcs,
            max_connections=settings.max_connections,
        )
        tls = None
        if settings.grpc_tls_cert is not None and settings.grpc_tls_key is not None:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(settings.grpc_tls_cert, settings.grpc_tls_key)
        server = GrpcServer(protocol.V2_GRPC_SERVICE, self.methods(), limits)
        try:
            # as the HTTP port: shared with the node's other gateways
            port = await server.start(
                settings.host, settings.grpc_port or 0, reuse_port=self.share_port, tls=tls
            )
        except OSError as error:
            raise RuntimeError(
                f"the gRPC listener could not bind {settings.host}:{settings.grpc_port}: {error}"
            ) from error
        self.server, self.port = server, port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)

    # --- server -----------------------------------------------------------------------------------
    async def server_live(self, raw: bytes, context: GrpcCall) -> bytes:
        return pb.ServerLiveResponse(live=True).SerializeToString()

    async def server_ready(self, raw: bytes, context: GrpcCall) -> bytes:
        """Ready as GET /ping is: every endpoint this gateway must serve is routable from it."""
        return pb.ServerReadyResponse(ready=not self.v2.unroutable()).SerializeToString()

    async def server_metadata(self, raw: bytes, context: GrpcCall) -> bytes:
        server = self.v2.server
        return pb.ServerMetadataResponse(
            name=server["name"], version=server["version"], extensions=server["extensions"]
        ).SerializeToString()

    # --- one model --------------------------------------------------------------------------------
    @_grpc_errors
    async def model_ready(self, raw: bytes, context: GrpcCall) -> bytes:
        """Ready, or not (no replica, or no such model: Triton's answer); a caller refused is
        refused."""
        try:
            message = grpc_codec.parse(pb.ModelReadyRequest, raw)
            await self.v2.model_ready(
                _call(message.name, message.version, raw, context, "ModelReady")
            )
            ready = True
        except (ModelNotReadyError, ValidationError):
            ready = False
        return pb.ModelReadyResponse(ready=ready).SerializeToString()

    @_grpc_errors
    async def model_metadata(self, raw: bytes, context: GrpcCall) -> bytes:
        message = grpc_codec.parse(pb.ModelMetadataRequest, raw)
        document = await self.v2.model_metadata(
            _call(message.name, message.version, raw, context, "ModelMetadata")
        )
        return grpc_codec.metadata_response(document)

    @_grpc_errors
    async def model_infer(self, raw: bytes, context: GrpcCall) -> bytes:
        trace = InvocationTrace(protocol=V2_GRPC_LABEL)
        response = b""
        # a cancelled call (by its client, or its deadline) is counted as an abort and cancelled on
        aborts = (asyncio.CancelledError,)
        async with invocation_frame(
            trace,
            "the Open Inference gRPC service",
            aborts,
            reraise_abort=True,
            carrier={k: v for k, v in context.metadata if isinstance(v, str)},
            operation=V2_OPERATION,
        ) as frame:
            message = grpc_codec.parse(pb.ModelInferRequest, raw)
            call = _call(message.model_name, message.model_version, raw, context, "ModelInfer")
            answer = await self.v2.infer(
                call, trace, lambda body: grpc_codec.infer_request(message)
            )
            response = grpc_codec.infer_response(
                answer.model, answer.version, answer.request, answer.outputs
            )
        if frame.span is not None:  # also on an error's status
            context.set_trailing_metadata(((protocol.TRACE_ID.lower(), frame.span.trace_id),))
        if frame.error is not None:
            raise frame.error  # to the method's wire (`_grpc_errors`)
        return response

    # --- the model repository extension -----------------------------------------------------------
    @_grpc_errors
    async def repository_index(self, raw: bytes, context: GrpcCall) -> bytes:
        """The MultiModel containers' models the caller may invoke (`repository_name` is not read:
        one here)."""
        message = grpc_codec.parse(pb.RepositoryIndexRequest, raw)
        # a Signature V4 covers the message
        head = replace(_head(context, "RepositoryIndex"), body=raw)
        entries = await self.v2.repository_index(head, message.ready)
        index = [pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries]
        return pb.RepositoryIndexResponse(models=index).SerializeToString()

    @_grpc_errors
    async def repository_load(self, raw: bytes, context: GrpcCall) -> bytes:
        await self._repository_change(raw, context, "load", "RepositoryModelLoad")
        return pb.RepositoryModelLoadResponse().SerializeToString()

    @_grpc_errors
    async def repository_unload(self, raw: bytes, context: GrpcCall) -> bytes:
        await self._repository_change(raw, context, "unload", "RepositoryModelUnload")
        return pb.RepositoryModelUnloadResponse().SerializeToString()

    async def _repository_change(
        self, raw: bytes, context: GrpcCall, action: str, method: str
    ) -> None:
        # Unload's fields are the same
        message = grpc_codec.parse(pb.RepositoryModelLoadRequest, raw)
        await self.v2.repository_change(_call(message.model_name, "", raw, context, method), action)


def _head(context: GrpcCall, method: str) -> RawRequest:
    """A call as signed: POST to its method's path, with its metadata as headers (`-bin` keys' bytes
    left out)."""
    metadata: Any = context.invocation_metadata() or ()
    headers = tuple((key, value) for key, value in metadata if isinstance(value, str))
    return RawRequest("POST", f"/{protocol.V2_GRPC_SERVICE}/{method}", "", headers, b"")


def _call(model: str, version: str, raw: bytes, context: GrpcCall, method: str) -> ModelCall:
    """A call naming `model`: its message is its body, its metadata and method path what a signature
    covers."""

    async def body() -> AsyncIterator[bytes]:
        yield raw

    return ModelCall(model, version or None, str(len(raw)), body, lambda: _head(context, method))
