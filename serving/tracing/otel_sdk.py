"""The OpenTelemetry SDK, set up from the process's `OTEL_*` variables; imported only once tracing
is on (`spans.configure`).

The SDK reads its own variables: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (the tracer
provider's sampler; parent-based always-on by default), `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` (the resource; the service is `serving` unless they name one), `OTEL_BSP_*`
(the batch span processor), and each exporter its own (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`,
`..._HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`). This module only picks the exporters that
`OTEL_TRACES_EXPORTER` names (default `otlp`, over HTTP/protobuf unless
`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` says `grpc`) by their SDK entry points. The provider is this
runtime's own, never the process-global one, so no other library in the process (nor a second
`configure`) adds to or takes over its spans.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving import protocol
from serving.tracing import spans

__all__ = ["InvocationSpan", "Tracing", "exporters_from_environment"]

_SCOPE = "serving"
_UNSAMPLED: ContextManager[None] = contextlib.nullcontext()
_LOGGERS = "serving"  # this runtime's loggers: their lines inside a trace carry its id
_DEFAULT_SERVICE = "serving"
# OTEL_TRACES_EXPORTER's `otlp`, by OTLP protocol: the SDK entry point of each exporter package
_OTLP = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}


def exporters_from_environment(environ: Mapping[str, str] = os.environ) -> list[SpanExporter]:
    """The span exporters `OTEL_TRACES_EXPORTER` names, each configured by its own variables;
    raises RuntimeError naming the package when one is not installed."""
    exporters = []
    names = environ.get("OTEL_TRACES_EXPORTER", "otlp") or "otlp"
    for name in (part.strip().lower() for part in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "otlp":
            wanted = (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if wanted not in _OTLP:
                raise RuntimeError(f"OTLP protocol {wanted!r} is not one of {sorted(_OTLP)}")
            name = _OTLP[wanted]
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            package = _PACKAGES.get(name, "the package that provides it")
            raise RuntimeError(
                f"OTEL_TRACES_EXPORTER asks for the {name!r} span exporter: install {package}"
            )
        exporters.append(found[0].load()())
    return exporters


def _resource() -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; the service is
    `serving` when they name none."""
    resource = Resource.create()
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        resource = resource.merge(Resource({SERVICE_NAME: _DEFAULT_SERVICE}))
    return resource


class InvocationSpan:
    """An invocation's root span: current in the task that began it until `leave`, ended once by
    `end` (the frame's count: a stream's end, not the frame's)."""

    __slots__ = ("_ended", "_span", "_token", "trace_id")

    def __init__(self, span: trace.Span, token: object) -> None:
        self._span = span
        self._token: object | None = token
        self._ended = False
        self.trace_id = format(span.get_span_context().trace_id, "032x")

    def leave(self) -> None:
        """No longer the current span of the task (the entry frame exits)."""
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None

    def end(self, status: int, attributes: Mapping[str, Any]) -> None:
        """End it with the invocation's outcome: `status` and `attributes` (None values left
        out)."""
        if self._ended:
            return
        self._ended = True
        span = self._span
        if span.is_recording():
            span.set_attributes(
                {key: value for key, value in attributes.items() if value not in (None, (), "")}
            )
            span.set_attribute(spans.STATUS, status)
            if status >= 500:  # a server span's 4xx is the caller's mistake, not an error of ours
                span.set_status(Status(StatusCode.ERROR))
        span.end()


class Tracing:
    """This process's tracer, its provider and the W3C propagator; while on, every log line of a
    `serving.*` logger written inside a trace ends with ` [trace_id=<32 hex>]` (and carries
    `record.trace_id`), so a slow call's lines are found from its response header."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(_SCOPE)
        self.propagator = TraceContextTextMapPropagator()
        self._plain_records = logging.getLogRecordFactory()
        logging.setLogRecordFactory(self._log_record)

    def _log_record(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self._plain_records(*args, **kwargs)
        if record.name.startswith(_LOGGERS) and record.name not in spans.OWN_TRACE_FIELD:
            trace_id = self.current_trace_id()
            if trace_id is not None:
                record.trace_id = trace_id
                record.msg = f"{record.msg} [trace_id={trace_id}]"
        return record

    @classmethod
    def from_environment(cls, exporter: SpanExporter | None = None) -> Tracing:
        """A provider as the `OTEL_*` variables describe; `exporter` replaces their exporters and
        exports each span as it ends."""
        provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            for configured in exporters_from_environment():
                provider.add_span_processor(BatchSpanProcessor(configured))
        return cls(provider)

    def begin(
        self,
        operation: str,
        carrier: Mapping[str, str] | None,
        link: Mapping[str, str] | None = None,
    ) -> InvocationSpan:
        # An empty context, not the task's, when the caller sent none: work started from inside an
        # invocation (a shadow copy, an async run) is a trace of its own, linked to the request
        # that started it, not its child.
        parent = self.propagator.extract(carrier) if carrier is not None else otel_context.Context()
        links = None
        if link is not None:
            linked = trace.get_current_span(self.propagator.extract(link)).get_span_context()
            links = [trace.Link(linked)] if linked.is_valid else None
        span = self.tracer.start_span(operation, context=parent, kind=SpanKind.SERVER, links=links)
        if carrier is not None and span.is_recording():
            inference_id = carrier.get(protocol.INFERENCE_ID)
            if inference_id:
                span.set_attribute(spans.INFERENCE_ID, inference_id)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return InvocationSpan(span, token)

    def step(self, name: str, attributes: Mapping[str, Any] | None) -> ContextManager[Any]:
        # An invocation not sampled makes no child spans: one context read instead of a span each.
        if not trace.get_current_span().is_recording():
            return _UNSAMPLED
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def current_carrier(self) -> dict[str, str] | None:
        if not trace.get_current_span().is_recording():
            return None
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return carrier

    def current_trace_id(self) -> str | None:
        context = trace.get_current_span().get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None

    def record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        span = self.tracer.start_span(name, attributes=attributes, start_time=start_ns)
        span.end(end_time=end_ns)

    def annotate(self, key: str, value: str | int) -> None:
        trace.get_current_span().set_attribute(key, value)

    def shut_down(self) -> None:
        if logging.getLogRecordFactory() == self._log_record:
            logging.setLogRecordFactory(self._plain_records)
        self.provider.shutdown()
