"""The data port of a container process: SageMaker's container contract over HTTP.

Each container process answers `POST /invocations` and `GET /ping` like a SageMaker model container,
so the router reaches it with one plain HTTP hop instead of Ray Serve's slower handle path (see
docs/benchmarks/bench_invoke.md for the measurements behind this). With a hop key, every request but
`/ping` must carry the gateway's signature for this container (`trust.hops`); anything else is
refused with 403 and counted. `GET /_serving/stats` gives the replica's supervisor the counters and
metric events it records on the container's behalf, `GET /_serving/signature` the gateway the
model's tensors (Open Inference metadata).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.errors import (
    AccessDeniedError,
    ContainerAnswerError,
    ContainerError,
    ServingError,
    ValidationError,
)
from serving.http.responses import error_response, json_response, serving_app
from serving.model_server import predictors
from serving.model_server.container_config import ContainerStats
from serving.model_server.events import EventLog
from serving.model_server.inline import InlineGate
from serving.model_server.streaming import stream_answer
from serving.model_server.tfs_rest import LocalRest
from serving.models.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext, Runtime
from serving.runtimes.concurrency import BatchSettings
from serving.runtimes.context import Headers
from serving.tracing import hop_steps
from serving.trust import hops

logger = logging.getLogger("serving.container")


def _resolved(response: Response, context: InvocationContext) -> Response:
    """Say whether the answer concerns a model the container resolved (the router's metric labels
    use it)."""
    if context.model_resolved:
        response.headers[protocol.MODEL_RESOLVED] = "true"
    return response


class ContainerApp:
    """ASGI app wrapping one loaded runtime, or a MultiModel container's models (the router bounds
    how many requests reach it)."""

    def __init__(
        self,
        predictor: predictors.Predictor,
        hostname: str,
        *,
        runtime: Runtime | None = None,
        models: MultiModelHandler | None = None,
        hop_key: bytes | None = None,
        events: EventLog | None = None,
        log_stream: str | None = None,
        data_url: str | None = None,
    ) -> None:
        """`predictor`: how the model runs for a request, whole answers and streams alike
        (`build_container_app` chooses it). The facts it serves: the SingleModel `runtime` (its
        tensor signature, its autoscaling hook, its calls back) or the MultiModel `models` (their
        repository). `hop_key`: refuse requests the gateway did not sign for this container (None
        only in tests that run no gateway). `events`: drained by `GET /_serving/stats`.
        `log_stream`: where this process's output goes, told to the gateway on every error answer
        (the caller's ModelError names it as LogStreamArn). `data_url`: the data port's TCP address,
        where a handler calls back (`context.rest_uri`) whichever socket its request came in on
        (None: the address the request reached)."""
        if (runtime is None) == (models is None):
            raise ValueError("give a runtime (SingleModel) or models (MultiModel)")
        self.predictor = predictor
        self.runtime = runtime
        self.models = models
        self.hostname = hostname
        self.hop_key = hop_key
        self.events = events
        self.log_stream = log_stream
        self.in_flight = 0
        self.invocations = 0
        self.refused = 0  # requests refused for a missing or bad hop signature
        self.local_rest = LocalRest(runtime, data_url) if hasattr(runtime, "rest_call") else None
        self.app = serving_app(
            [
                Route(protocol.PING_PATH, self.ping, methods=["GET"]),
                Route(protocol.STATS_PATH, self.stats, methods=["GET"]),
                Route(protocol.SIGNATURE_PATH, self.signature, methods=["GET"]),
                Route(protocol.REPOSITORY_PATH, self.repository, methods=["GET"]),
                Route(
                    protocol.REPOSITORY_PATH + "/{action:str}",
                    self.repository_change,
                    methods=["POST"],
                ),
                *([self.local_rest.route()] if self.local_rest is not None else []),
            ],
            hot=Route(protocol.INVOCATIONS_PATH, self.invoke, methods=["POST"]),
        )

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)

    async def ping(self, request: Request) -> Response:
        return Response(b"", status_code=200)

    def _refusal(
        self, request: Request, body: bytes, headers: Headers | None = None
    ) -> Response | None:
        """None when the hop is the gateway's for this container, else the 403 to answer. `headers`:
        the request's (`Headers.from_asgi`), the very mapping its handler reads."""
        if self.hop_key is None:
            return None
        if headers is None:
            headers = Headers.from_asgi(request.scope["headers"])
        try:
            hops.verify(self.hop_key, request.method, request.scope["path"], body, headers)
        except hops.HopAuthError as error:
            self.refused += 1
            logger.warning(
                "container %s: refused a request from %s: %s",
                self.hostname,
                request.client.host if request.client else "?",
                error,
            )
            return error_response(AccessDeniedError(f"container {self.hostname}: {error}"))
        return None

    async def stats(self, request: Request) -> Response:
        """Counters, the model's own autoscaling metrics and the metric events since the last
        call."""
        refusal = self._refusal(request, b"")
        if refusal is not None:
            return refusal
        document: ContainerStats = {
            "invocations": self.invocations,
            "in_flight": self.in_flight,
            "refused": self.refused,
            "inline": self.inline.inline if self.inline is not None else 0,
            "custom": self._custom_metrics(),
        }
        if self.events is not None:
            document["events"] = self.events.drain()
            document["dropped_events"] = self.events.dropped
        return json_response(document)

    async def signature(self, request: Request) -> Response:
        """The model's tensors and how to carry them (`Runtime.tensor_signature`), for Open
        Inference metadata; a MultiModel container's models differ, so it names none."""
        refusal = self._refusal(request, b"")
        if refusal is not None:
            return refusal
        if self.runtime is None:
            return json_response(
                {
                    "inputs": [],
                    "outputs": [],
                    "content_type": protocol.JSON,
                    "accept": protocol.JSON,
                }
            )
        return json_response({"platform": self.runtime.name, **self.runtime.tensor_signature()})

    async def repository(self, request: Request) -> Response:
        """A MultiModel container's models: under its prefix, and loaded in this replica (none for
        SingleModel)."""
        refusal = self._refusal(request, b"")
        if refusal is not None:
            return refusal
        return json_response(
            self.models.repository() if self.models is not None else {"available": [], "loaded": []}
        )

    async def repository_change(self, request: Request) -> Response:
        """`load` or `unload` one model of a MultiModel container's cache: `{"model": name}`."""
        body = await request.body()
        refusal = self._refusal(request, body)
        if refusal is not None:
            return refusal
        action = request.path_params["action"]
        try:
            model = json.loads(body).get("model") if body else None
            if (
                self.models is None
                or action not in ("load", "unload")
                or not isinstance(model, str)
            ):
                raise ValidationError(
                    f"container {self.hostname}: POST {{'model': name}} to load or unload"
                )
            if action == "load":
                await self.models.load(model)
                return json_response({"model": model, "loaded": True})
            return json_response({"model": model, "unloaded": await self.models.cache.evict(model)})
        except ServingError as error:
            return error_response(error)
        # the model's own load failed: its error, as an invocation's would be
        except Exception as error:
            return error_response(ContainerError.of(error))

    def _custom_metrics(self) -> dict[str, float]:
        hook = self.runtime.hook("autoscaling_metrics") if self.runtime is not None else None
        if hook is None:
            return {}
        try:
            return {str(key): float(value) for key, value in (hook() or {}).items()}
        except Exception:  # the model's own hook must not break the replica's reports
            logger.exception("container %s: autoscaling_metrics of the model failed", self.hostname)
            return {}

    @property
    def inline(self) -> InlineGate | None:
        """The gate that lets fast predictions run on the event loop (None when the predictor has
        none)."""
        return self.predictor.gate

    async def invoke(self, request: Request) -> Response:
        self.in_flight += 1
        self.invocations += 1
        context = InvocationContext()
        streaming = False
        try:
            # One mapping for the signature check and for everything after it (the hooks' context
            # too: MMS's request properties), so no repeated header can be checked in one place and
            # read in another.
            headers = context.headers = Headers.from_asgi(request.scope["headers"])
            if self.hop_key is not None and hops.SIGNATURE_HEADER not in headers:
                # unsigned: refused before its body is read
                refusal = self._refusal(request, b"", headers)
            else:
                body = await request.body()
                refusal = self._refusal(request, body, headers)
            if refusal is not None:
                self.invocations -= 1  # not an invocation: it never reached the model
                return refusal
            context.custom_attributes = headers.get(protocol.CUSTOM_ATTRIBUTES)
            context.target_model = headers.get(protocol.TARGET_MODEL)
            context.inference_id = headers.get(protocol.INFERENCE_ID)
            arrived = _traced(context, headers)
            if headers.get(protocol.HOP_STREAM_HEADER) == "true":
                response = await self._stream(request, body, headers, context)
                streaming = True  # in flight until the stream ends
                return response
            if self.local_rest is not None:
                context.local_api = self.local_rest.grant(request)
            out, content_type = await self.predictor.predict(
                body, headers.get("content-type"), headers.get("accept"), context
            )
            # A hook may set the answer's status and headers through the context, as on MMS /
            # TorchServe.
            response_headers = {**context.response_headers, "content-type": content_type}
            if context.response_custom_attributes:
                response_headers[protocol.CUSTOM_ATTRIBUTES] = context.response_custom_attributes
            if context.steps is not None:
                response_headers[protocol.HOP_STEPS_HEADER] = _steps(context, arrived)
            return _resolved(
                Response(out, status_code=context.response_status, headers=response_headers),
                context,
            )
        # the framework container's own error answer, as it sends it
        except ContainerAnswerError as answer:
            return _resolved(
                Response(answer.raw, status_code=answer.status, media_type=answer.content_type),
                context,
            )
        except Exception as error:
            return self._failure(error, context)
        finally:
            if not streaming:
                self.in_flight -= 1
                if self.local_rest is not None:
                    self.local_rest.revoke(context.local_api)

    async def _stream(
        self, request: Request, body: bytes, headers: Any, context: InvocationContext
    ) -> Response:
        """The model's chunks as an event stream, run by the predictor as a whole answer is
        (`Predictor.stream`)."""
        if self.local_rest is not None:
            context.local_api = self.local_rest.grant(request)
        answer = await self.predictor.stream(
            body, headers.get("content-type"), headers.get("accept"), context
        )
        response_headers = {}
        if context.response_custom_attributes:
            response_headers[protocol.CUSTOM_ATTRIBUTES] = context.response_custom_attributes

        def done() -> None:
            self.in_flight -= 1
            if self.local_rest is not None:
                self.local_rest.revoke(context.local_api)
            answer.end()

        try:
            response = await stream_answer(
                answer.chunks, answer.content_type, response_headers, self.hostname, done
            )
        except BaseException:  # failed before its first chunk: answered as any failure (`invoke`)
            answer.end()
            raise
        return _resolved(response, context)

    def _failure(self, error: Exception, context: InvocationContext) -> Response:
        """The error answer. The platform's own refusals (a MultiModel TargetModel it cannot
        resolve) are marked as such; whatever the model, runtime or handler raised is a
        ContainerError with the status AWS's toolkits give it, which the gateway reports as
        ModelError (so no code a model raises passes for the platform's)."""
        platform = (
            isinstance(error, ServingError)
            and not isinstance(error, ContainerError)
            and self.models is not None
            and not context.model_resolved
        )
        if platform:
            assert isinstance(error, ServingError)
            response = error_response(error)
            response.headers[protocol.PLATFORM_ERROR] = "true"
        else:
            if not isinstance(error, ServingError):  # the model failed: report it, keep serving
                logger.exception(
                    "container %s: invocation failed%s", self.hostname, _trace_note(context)
                )
            # no paths of this machine, no traceback
            response = error_response(ContainerError.of(error))
        if self.log_stream:
            response.headers[protocol.LOG_STREAM] = self.log_stream
        return _resolved(response, context)


def _traced(context: InvocationContext, headers: Headers) -> int:
    """With a traced hop (a `traceparent` the gateway signed), time this request's steps; returns
    when it arrived (ns), 0 untraced."""
    if protocol.TRACEPARENT not in headers:
        return 0
    context.steps = []
    return time.time_ns()


def _steps(context: InvocationContext, arrived: int) -> str:
    """The steps header: a wait for the model (a thread, the loop) before its first step, then the
    steps themselves (a batch's wait is among them)."""
    steps = context.steps or []
    if steps and not any(name == "queue" for name, _, _ in steps) and steps[0][1] > arrived:
        steps.insert(0, ("queue", arrived, steps[0][1]))
    return hop_steps.render(steps, context.batch_size)


def _trace_note(context: InvocationContext) -> str:
    """` (trace <id>)` for a traced hop's log line, so that the line is found from the trace."""
    traceparent = context.headers.get(protocol.TRACEPARENT) or ""
    return f" (trace {traceparent[3:35]})" if len(traceparent) >= 35 else ""


def build_container_app(
    runtime: Runtime | None,
    hostname: str,
    models: MultiModelHandler | None = None,
    *,
    threads: int = 1,
    batching: BatchSettings | None = None,
    inline_budget_s: float = 0.0,
    model_latency: Callable[[float], None] | None = None,
    events: EventLog | None = None,
    hop_key: bytes | None = None,
    log_stream: str | None = None,
    data_url: str | None = None,
) -> ContainerApp:
    """A container's app: its predictor chosen from how the model should run (`predictors.choose`:
    `threads` at once, `batching`, on the event loop under `inline_budget_s`; `model_latency` gets
    each SingleModel prediction's time), then the app over it, given the facts it serves
    (`ContainerApp`)."""
    predictor = predictors.choose(
        runtime,
        models,
        threads=threads,
        batching=batching,
        inline_budget_s=inline_budget_s,
        model_latency=model_latency,
        events=events,
    )
    return ContainerApp(
        predictor,
        hostname,
        runtime=runtime,
        models=models,
        hop_key=hop_key,
        events=events,
        log_stream=log_stream,
        data_url=data_url,
    )
