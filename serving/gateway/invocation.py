"""The invocation pipeline: InvokeEndpoint's steps, apart from any web framework.

authenticate the caller (endpoints with AccessControl) -> resolve the target container (Direct) or
the whole chain (Serial) -> authorize every container of it -> check headers and payload -> one hop
per container -> the last container's answer. Nothing reaches a container before the caller may run
it. Every failure is a `ServingError`; the HTTP adapter (`router`) turns it into the documented
response.

A body is read only once the headers have authenticated its sender as far as they can: a bearer key
fully, a Signature V4 up to the signature itself, which covers the body. Bodies held until their
signature is verified share one budget (`BodyBudget`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from serving import protocol
from serving.access.sigv4 import Caller
from serving.errors import (
    AccessDeniedError,
    ServiceUnavailableError,
    ValidationError,
)
from serving.gateway.admission import (
    Admission,
    EndpointRoute,
    InvocationRequest,
    InvocationResult,
    chain_of,
    check_headers,
    target_model_of,
)
from serving.gateway.after_answer import AfterAnswer
from serving.gateway.body_budget import BodyBudget, Hold
from serving.gateway.capture import CaptureWriter
from serving.gateway.entry import invocation_frame
from serving.gateway.failures import container_failure, timed_out
from serving.gateway.shadows import ShadowCopies
from serving.gateway.transport import ContainerTransport, HopResponse
from serving.gateway.variants import Front, ShadowRoute
from serving.http.bodies import read_bounded
from serving.metrics.invocations import InvocationTrace
from serving.settings import ServerSettings
from serving.tracing import spans as tracing

SHADOW_OPERATION = "ShadowCopy"  # a shadow variant's copy: its own trace, linked to the caller's
_FORWARDED = (
    "content-type",
    "accept",
    protocol.CUSTOM_ATTRIBUTES,
    protocol.TARGET_MODEL,
    protocol.INFERENCE_ID,
)


class Invocations:
    """Runs InvokeEndpoint requests against the endpoint table, which the gateway's state
    replaces."""

    def __init__(self, settings: ServerSettings, transport: ContainerTransport) -> None:
        self.settings = settings
        self.transport = transport
        self.endpoints: dict[str, EndpointRoute] = {}
        # API endpoints by name (their variants are served endpoints)
        self.fronts: dict[str, Front] = {}
        # False while a (re)started gateway has not read its table yet: 503, which clients retry
        self.loaded = True
        self.preauth_budget = BodyBudget(settings.preauth_body_budget_bytes)
        # what runs once the caller has its answer: one bound per kind, one close
        self.after_answer = AfterAnswer()
        # DataCaptureConfig: sampled invocations, written later
        self.capture = CaptureWriter(self.after_answer)
        # ShadowProductionVariants: copies run after the answer
        self.shadows = ShadowCopies(self.after_answer)

    async def invoke(
        self, request: InvocationRequest, trace: InvocationTrace, *, stream: bool = False
    ) -> InvocationResult:
        """Every step of one invocation; raises ServingError (or whatever reading the body raises).

        `stream` (InvokeEndpointWithResponseStream): the same steps; the caller's Accept is its
        `X-Amzn-SageMaker-Accept`, and the last container answers with an event stream that the
        result's `chunks` hand on as it arrives (earlier containers of a Serial chain answer whole,
        as always).
        """
        admission = await self.admit(request, trace, stream=stream)
        body = await self.body_of(request, admission, trace)
        result = await self.run(admission, body, request.headers, trace, stream=stream)
        capture = admission.endpoint.data_capture
        if capture is not None and result.chunks is None:  # a streamed answer is not captured
            self.capture.offer(
                capture,
                request.endpoint,
                admission.variant,
                body,
                request.headers,
                result.body,
                result.content_type,
            )
        shadow = admission.shadow
        if shadow is not None and result.chunks is None:
            link = tracing.current_carrier()  # the copy's own trace links to this invocation's
            copy = lambda: self._copy_to_shadow(
                request.endpoint, shadow, admission, body, request.headers, link
            )  # noqa: E731
            self.shadows.start(request.endpoint, shadow.name, copy)
        return result

    async def _copy_to_shadow(
        self,
        public: str,
        shadow: ShadowRoute,
        admission: Admission,
        body: bytes,
        headers: Mapping[str, str],
        link: Mapping[str, str] | None = None,
    ) -> bool:
        """One copy on the shadow variant, counted in its own metrics; its answer is only
        captured."""
        trace = InvocationTrace()
        async with invocation_frame(
            trace, f"shadow variant {shadow.name}", operation=SHADOW_OPERATION, link=link
        ) as frame:
            endpoint = self.endpoints.get(shadow.endpoint)
            if endpoint is None:
                raise ServiceUnavailableError(
                    f"Endpoint {public} is starting shadow variant {shadow.name}"
                )
            trace.endpoint, trace.mode, trace.multi_model = (
                endpoint.name,
                endpoint.mode,
                endpoint.multi_model,
            )
            chain = trace.chain = chain_of(endpoint, headers, public)
            trace.variant = shadow.name
            copy = Admission(endpoint, chain, admission.target_model, None, shadow.name)
            result = await self.run(copy, body, headers, trace)
            capture = admission.endpoint.data_capture
            if capture is not None:
                self.capture.offer(
                    capture, public, shadow.name, body, headers, result.body, result.content_type
                )
        return frame.error is None

    async def admit(
        self,
        request: InvocationRequest,
        trace: InvocationTrace,
        action: str | None = None,
        *,
        stream: bool = False,
    ) -> Admission:
        """Every check before a container runs: the endpoint, its caller (allowed `action`, default
        InvokeEndpoint), the chain, the headers (`stream`: InvokeEndpointWithResponseStream's).
        Raises ServingError."""
        name, headers = request.endpoint, request.headers
        variant = protocol.DEFAULT_VARIANT
        front = self.fronts.get(name)
        shadow = None
        if front is not None:  # an API endpoint: one of its variants runs the request
            chosen, shadow = front.pick(headers.get(protocol.TARGET_VARIANT)), front.shadow()
            endpoint, variant = self.endpoints.get(chosen.endpoint), chosen.name
            if endpoint is None:  # its served endpoint is (re)starting
                raise ServiceUnavailableError(
                    f"Endpoint {name} is starting variant {variant}: retry shortly"
                )
        else:
            # A variant's own endpoint is reached through its API endpoint only (policies name that
            # one).
            endpoint = None if protocol.VARIANT_SEPARATOR in name else self.endpoints.get(name)
        if endpoint is None and not self.loaded:
            raise ServiceUnavailableError("the endpoint server is starting: retry shortly")
        if endpoint is None:
            raise ValidationError(f"Endpoint {name} not found.")
        trace.endpoint, trace.mode, trace.multi_model = (
            endpoint.name,
            endpoint.mode,
            endpoint.multi_model,
        )
        trace.variant = variant
        with tracing.step("authenticate"):
            body, caller = await self._authenticate(endpoint, request, trace, name)
        if endpoint.failure is not None:
            raise ServiceUnavailableError(f"Endpoint {name} is Failed: {endpoint.failure}")
        chain = trace.chain = chain_of(endpoint, headers, name)
        if caller is not None:
            assert endpoint.access is not None
            permission = {"action": action} if action is not None else {}
            with tracing.step("authorize"):
                endpoint.access.authorize(
                    name, caller, chain, headers.get(protocol.TARGET_MODEL), **permission
                )
        check_headers(headers, stream, variant_checked=front is not None)
        target_model = trace.model = target_model_of(endpoint, chain, headers, name)
        return Admission(endpoint, chain, target_model, body, variant, shadow)

    async def body_of(
        self, request: InvocationRequest, admission: Admission, trace: InvocationTrace
    ) -> bytes:
        """The request's body: as authentication read it, else read now within the payload limit (a
        span of its own: a slow upload is the caller's time, not the containers')."""
        if admission.body is not None:
            return admission.body
        with tracing.step("read body"):
            return await self.read_body(request, trace)

    async def run(
        self,
        admission: Admission,
        body: bytes,
        headers: Mapping[str, str],
        trace: InvocationTrace,
        timeout: float | None = None,
        *,
        stream: bool = False,
        accepts: Sequence[str | None] = (),
    ) -> InvocationResult:
        """The admitted chain on `body`; `headers` give what is forwarded, `timeout` replaces the
        server's, `stream` asks the last container for an event stream (the result's `chunks`),
        `accepts` the Accept each container but the last is asked for (None: its default)."""
        forwarded = {key: headers[key] for key in _FORWARDED if key in headers}
        if stream:
            forwarded.pop("accept", None)
            if protocol.STREAM_ACCEPT in headers:
                forwarded["accept"] = headers[protocol.STREAM_ACCEPT]
        endpoint, target_model = admission.endpoint, admission.target_model
        last = await self._run_chain(
            endpoint,
            admission.chain,
            body,
            forwarded,
            target_model,
            trace,
            timeout,
            stream=stream,
            accepts=accepts,
        )
        response_headers = {protocol.INVOKED_VARIANT: admission.variant}
        if last.custom_attributes:
            response_headers[protocol.CUSTOM_ATTRIBUTES] = last.custom_attributes
        content_type = last.content_type or protocol.OCTET_STREAM
        if last.chunks is not None:
            response_headers[protocol.STREAM_CONTENT_TYPE] = content_type
            return InvocationResult(
                b"", protocol.EVENT_STREAM, response_headers, chunks=last.chunks
            )
        return InvocationResult(last.body, content_type, response_headers)

    async def _authenticate(
        self, endpoint: EndpointRoute, request: InvocationRequest, trace: InvocationTrace, name: str
    ) -> tuple[bytes | None, Caller | None]:
        """The caller (None for an anonymous endpoint) and, when its signature covers the body, the
        body. `name`: the endpoint as the caller named it (an API endpoint's, not its variant's)."""
        if endpoint.access is None:
            if not self.settings.anonymous_allowed:
                raise AccessDeniedError(
                    f"Endpoint {name} has no AccessControl and this server is not bound to a loopback address, "
                    "so it accepts no callers (start the server with --allow-anonymous to serve it without "
                    "authentication)"
                )
            return None, None
        raw = request.head()
        claim = endpoint.access.claim(name, raw)  # from the headers, before a byte of the body
        if not claim.needs_body:
            return None, endpoint.access.verify(name, claim, raw)
        # the signature covers the payload: hold it until verified
        with self.preauth_budget.hold() as hold:
            body = await self.read_body(request, trace, hold)
            return body, endpoint.access.verify(name, claim, replace(raw, body=body))

    async def read_body(
        self, request: InvocationRequest, trace: InvocationTrace, hold: Hold | None = None
    ) -> bytes:
        """The whole body within the payload limit (and, with `hold`, within the pre-authentication
        budget)."""
        limit = self.settings.max_payload_bytes

        def too_large(size: int | None) -> ValidationError:
            if size is None:
                return ValidationError(f"payload exceeds the limit of {limit} bytes")
            return ValidationError(f"payload of {size} bytes exceeds the limit of {limit} bytes")

        declared = request.headers.get("content-length")
        body = await read_bounded(request.body(), limit, too_large, declared=declared, hold=hold)
        trace.body_read = True
        return body  # type: ignore[return-value]  # the bytearray itself, read as bytes: no copy

    async def _run_chain(
        self,
        endpoint: EndpointRoute,
        chain: tuple[str, ...],
        body: bytes,
        headers: dict[str, str],
        affinity: str | None = None,
        trace: InvocationTrace | None = None,
        timeout: float | None = None,
        stream: bool = False,
        accepts: Sequence[str | None] = (),
    ) -> HopResponse:
        trace = trace if trace is not None else InvocationTrace()
        timeout = timeout if timeout is not None else self.settings.invocation_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attributes = None
        response: HopResponse | None = None
        headers = dict(headers)
        # The caller's Accept is for the last container; earlier ones emit their default
        # (SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT), which is what the next one reads, unless `accepts`
        # names one.
        wanted = [*(accepts or [None] * (len(chain) - 1)), headers.pop("accept", None)]
        for position, container in enumerate(chain, start=1):
            accept = wanted[position - 1]
            hop_headers = headers if accept is None else {**headers, "accept": accept}
            remaining = deadline - loop.time()
            trace.failed_container = container  # until it answers well
            if remaining <= 0:
                raise timed_out(container, timeout)
            with tracing.hop(container, position):
                sent = time.perf_counter()
                # only the last container streams; its stream outlasts the deadline, which bounds its
                # first byte
                last_streams = stream and position == len(chain)
                hop = self.transport.send(
                    endpoint.name,
                    container,
                    body,
                    hop_headers,
                    remaining,
                    affinity=affinity if container in endpoint.multi_model else None,
                    stream=last_streams,
                    stream_timeout=self.settings.stream_timeout_s if last_streams else None,
                )
                try:
                    # aiohttp's own timeout is the stream's: the deadline bounds its first byte here
                    if last_streams:
                        # not wait_for: no task of its own per hop
                        async with asyncio.timeout(remaining):
                            response = await hop
                    else:  # the transport keeps to `remaining` itself
                        response = await hop
                except TimeoutError:
                    trace.hops.append((container, time.perf_counter() - sent))
                    raise timed_out(container, timeout) from None
                trace.hops.append((container, time.perf_counter() - sent))
                tracing.annotate(tracing.STATUS, response.status)
                if container in endpoint.multi_model and _answered_for_model(response):
                    trace.model_confirmed = True
                if response.status >= 400:
                    raise container_failure(
                        endpoint.name, container, position, len(chain), response
                    )
            trace.failed_container = None
            attributes = response.custom_attributes or attributes
            body = response.body
            if response.content_type:
                headers["content-type"] = response.content_type
        assert response is not None
        return replace(response, custom_attributes=attributes)


def _answered_for_model(response: HopResponse) -> bool:
    """Whether a MultiModel container's answer shows that it resolved the TargetModel to a model: it
    says so (`protocol.MODEL_RESOLVED`, also on a model's own error), or it answered with
    success."""
    return response.model_resolved or response.status < 400
