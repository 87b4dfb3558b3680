"""A real OTLP/HTTP trace receiver for the session's endpoint server, and the `OTEL_*` variables
that point the server at it.

The session's gateway traces as an operator would configure it (docs/tracing.md): OTLP over
HTTP/protobuf with a collector's bearer header, a parent-based 10 % ratio sampler (a caller's
sampled `traceparent` is always traced, so tests that send one get their trace every time), a
service name and resource attributes. Each `ExportTraceServiceRequest` is decoded with
`opentelemetry-proto` (no SDK on this side) and kept, bounded, for the tests to query.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

COLLECTOR_TOKEN = "Bearer suite-collector-token"
SAMPLED_RATIO = 0.1
MAX_SPANS = 200_000  # the whole session's traces at 10 %, with room to spare


def value_of(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    """One exported span, decoded: ids as hex, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    links: list[tuple[str, str]]  # (trace id, span id)
    resource: dict
    status_code: int


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                got += [_decoded(span, resource) for span in scope_spans.spans]
        with self.lock:
            self.spans.extend(got[: max(0, MAX_SPANS - len(self.spans))])

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, root_name: str, timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """The trace's spans once its root (the last span to end) has arrived; bounded."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if any(span.name == root_name for span in spans):
                time.sleep(0.3)  # spans ended just before the root may ride the next export
                return self.trace(trace_id)
            time.sleep(0.05)
        raise AssertionError(f"trace {trace_id} ({root_name}) not exported in {timeout_s} s")

    def roots(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.name == name]


def _decoded(span: Span, resource: dict) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes={a.key: value_of(a.value) for a in span.attributes},
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        resource=resource,
        status_code=span.status.code,
    )


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.paths.add(self.path)
            receiver.authorizations.add(self.headers.get("authorization", ""))
            receiver.add(request)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()


def tracing_environment(receiver: Receiver) -> dict[str, str]:
    """What an operator sets for `serving up` to trace to this receiver."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={urllib.parse.quote(COLLECTOR_TOKEN)}",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(SAMPLED_RATIO),
        "OTEL_SERVICE_NAME": "serving-suite",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
