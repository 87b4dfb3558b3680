"""The OpenAI-compatible API on every gateway: `POST /v1/chat/completions` and `/v1/completions`.

`model` is `<endpoint>.<container>`: the request becomes an invocation of that container, through
the same pipeline as InvokeEndpoint (`invocation.Invocations`), so the same credentials
(`Authorization: Bearer <ApiKey>`, which OpenAI's clients send, or Signature V4), per-container
policies, limits, metrics and entry frame hold. The container (the huggingface stack) receives the
OpenAI request in its own content type (`runtimes.llm_wire`) and answers in OpenAI's shape; a
streamed answer's events pass through as server-sent events, an error after the first event as one
`data: {"error": ...}` event. Errors before it are OpenAI's `{"error": {"message", "type", "param",
"code"}}` with the status InvokeEndpoint would answer (a container's own 4XX kept as it is).

The body is read before the caller is known (the model it names picks the endpoint), so it is held
under the pre-authentication budget (`gateway.body_budget`), as a signed InvokeEndpoint body is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import orjson
from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.errors import ModelError, ServingError, ValidationError
from serving.gateway.admission import InvocationRequest
from serving.gateway.entry import invocation_frame
from serving.gateway.invocation import Invocations
from serving.gateway.router import raw_request, streamed_response
from serving.gateway.streaming import Framing
from serving.metrics.invocations import OPENAI_LABEL, InvocationTrace

__all__ = ["OpenAIRoutes"]

CHAT, COMPLETIONS, EVENT_STREAM = (
    protocol.OPENAI_CHAT,
    protocol.OPENAI_COMPLETIONS,
    protocol.SERVER_SENT_EVENTS,
)
# the root span's name, by the request's kind (OpenAI's own names for the two calls)
_OPERATIONS = {CHAT: "ChatCompletions", COMPLETIONS: "Completions"}


def _error_document(message: str, kind: str, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def _sse_error(code: str, message: str) -> bytes:
    return b"data: " + _error_document(message, "server_error", code) + b"\n\n"


# A container's events pass through; an error that ends the stream is one more event.
SERVER_SENT_EVENTS = Framing(
    payload=lambda data: [data],
    model_error=_sse_error,
    internal_failure=lambda message: _sse_error("internal_failure", message),
)


def error_response(error: ServingError) -> Response:
    """OpenAI's error object; a container's own 4XX (a bad parameter) keeps its status."""
    status = error.status
    message = error.message
    if isinstance(error, ModelError) and 400 <= error.original_status < 500:
        status, message = error.original_status, f"{error.container}: {error.original_message}"
    kind = "invalid_request_error" if status < 500 else "server_error"
    return Response(
        _error_document(message, kind, str(error.code)),
        status_code=status,
        media_type=protocol.JSON,
    )


class OpenAIRoutes:
    """`/v1/chat/completions` and `/v1/completions` over the invocation pipeline."""

    def __init__(self, invocations: Invocations) -> None:
        self.invocations = invocations

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]

    async def chat(self, request: Request) -> Response:
        return await self._answer(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, COMPLETIONS)

    async def _answer(self, request: Request, kind: str) -> Response:
        trace = InvocationTrace(protocol=OPENAI_LABEL)
        response = Response(status_code=499)  # the caller left: nobody is there to read it
        async with invocation_frame(
            trace,
            "the OpenAI route",
            (ClientDisconnect,),
            carrier=request.headers,
            operation=_OPERATIONS[kind],
        ) as frame:
            head = InvocationRequest(
                "", request.headers, request.stream, lambda: raw_request(request)
            )
            with self.invocations.preauth_budget.hold() as hold:
                body = await self.invocations.read_body(head, trace, hold)
                endpoint, container, stream = _target(body)
                headers = MutableHeaders(raw=list(request.headers.raw))
                headers[protocol.TARGET_CONTAINER] = container
                headers["content-type"] = kind
                headers["accept"] = EVENT_STREAM if stream else protocol.JSON
                headers[protocol.STREAM_ACCEPT] = EVENT_STREAM
                invocation = InvocationRequest(
                    endpoint, headers, _once(body), lambda: raw_request(request)
                )
                result = await self.invocations.invoke(invocation, trace, stream=stream)
            if result.chunks is not None:
                trace_header = (
                    {} if frame.span is None else {protocol.TRACE_ID: frame.span.trace_id}
                )
                result = replace(result, content_type=EVENT_STREAM, headers=trace_header)
                return streamed_response(result, trace, frame.defer(), SERVER_SENT_EVENTS)
            response = Response(result.body, media_type=result.content_type)
        if frame.error is not None:
            response = error_response(frame.error)
        if frame.span is not None:
            response.headers[protocol.TRACE_ID] = frame.span.trace_id
        return response


def _target(body: bytes) -> tuple[str, str, bool]:
    """(endpoint, container, streamed) of an OpenAI request body."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ValidationError(f"request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValidationError("request body must be a JSON object")
    model = document.get("model")
    if not isinstance(model, str) or model.count(".") < 1:
        raise ValidationError(
            "parameter 'model' must name '<endpoint>.<container>' (a container that generates text)"
        )
    endpoint, container = model.split(".", 1)
    if not endpoint or not container:
        raise ValidationError(f"parameter 'model' {model!r} must be '<endpoint>.<container>'")
    return endpoint, container, document.get("stream") is True


def _once(body: bytes) -> Callable[[], AsyncIterator[bytes]]:
    """The already-read body, as the pipeline reads a body: an async iterator, once."""

    async def chunks() -> AsyncIterator[bytes]:
        yield bytes(body)

    return chunks
