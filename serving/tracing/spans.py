"""What the request path calls to trace an invocation; free when tracing is off.

Off (the default) every call here is one global read and a return: no OpenTelemetry module is ever
imported, no object is made. `configure` turns tracing on, once at start-up, when the process's
standard `OTEL_*` variables ask for traces (`enabled_by`); everything else those variables say
(sampler and ratio, service name, resource attributes, exporter endpoint and headers, batching) is
read by the SDK itself (`otel_sdk`).

An invocation's root span is begun by the gateway's entry frame (`begin`), which makes it the current
span of the task until the frame leaves; `step`, `hop` and `attempt` open its children there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.tracing.otel_sdk import InvocationSpan, Tracing

__all__ = [
    "CONTAINER",
    "CONTAINERS",
    "ENDPOINT",
    "ERROR_CODE",
    "INFERENCE_ID",
    "MODEL",
    "OUTCOME",
    "PROTOCOL",
    "STATUS",
    "VARIANT",
    "annotate",
    "attempt",
    "begin",
    "configure",
    "current_carrier",
    "current_trace_id",
    "enabled",
    "enabled_by",
    "hop",
    "record",
    "shut_down",
    "step",
]

# The attributes an invocation's spans carry: names operators query by, so kept stable.
ENDPOINT = "serving.endpoint"
CONTAINERS = "serving.containers"  # the root span: every container addressed, in order
CONTAINER = "serving.container"  # a hop's
VARIANT = "serving.variant"
MODEL = "serving.model"  # a MultiModel container's TargetModel
PROTOCOL = "serving.protocol"
STATUS = "serving.status"  # the status the invocation was counted under (a hop's: what it answered)
ERROR_CODE = "serving.error_code"
INFERENCE_ID = "serving.inference_id"
POSITION = "serving.hop.position"  # 1-based place of the hop in its chain
REPLICA = "serving.replica"  # the replica's data-port URL
NODE = "serving.node"  # the address of the node the replica runs on
LOCAL = "serving.replica.local"  # on the gateway's own node (locality routing)
ATTEMPT = "serving.attempt"  # 1, 2, ...: each replica tried for the hop (refused, or retried)
OUTCOME = "serving.attempt.outcome"  # an attempt that got no answer: refused, or lost
BATCH_SIZE = "serving.batch.size"  # requests merged into the model call that answered this one

# Loggers whose lines carry the trace id in a field of their own (JSON lines: the audit log), not
# appended to the message by `otel_sdk`.
OWN_TRACE_FIELD: set[str] = set()

# Set by `configure` only (start-up), read by every call below: None while tracing is off.
_active: Tracing | None = None
_OFF: ContextManager[None] = contextlib.nullcontext()


def enabled_by(environ: Mapping[str, str]) -> bool:
    """Whether these `OTEL_*` variables ask for traces: an exporter named (not `none`) or an OTLP
    endpoint given, and the SDK not disabled. The SDK's own default exporter (`otlp`) would trace
    every process; this runtime traces only when asked."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def configure(exporter: Any = None) -> bool:
    """Turn tracing on when this process's `OTEL_*` variables ask for it, else leave it off;
    returns whether it is on. `exporter`: a span exporter to use instead of the configured ones
    (each span exported as it ends: tests, with the SDK's in-memory exporter)."""
    global _active
    shut_down()
    if exporter is None and not enabled_by(os.environ):
        return False
    from serving.tracing.otel_sdk import Tracing

    _active = Tracing.from_environment(exporter)
    return True


def shut_down() -> None:
    """Export what is buffered and turn tracing off."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.shut_down()


def enabled() -> bool:
    return _active is not None


def begin(
    operation: str,
    carrier: Mapping[str, str] | None = None,
    link: Mapping[str, str] | None = None,
) -> InvocationSpan | None:
    """An invocation's root span, current until its `leave`, ended by its `end`; joined to the
    caller's `traceparent`/`tracestate` in `carrier` (request headers), else a new trace, linked to
    the span whose context `link` holds (a shadow copy's caller, an async run's admission). None
    when tracing is off."""
    active = _active
    return None if active is None else active.begin(operation, carrier, link)


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C context as headers (`traceparent`, `tracestate`): what a hop sends
    its container, what a shadow copy or an async run links to. None when off or when no span is
    recording."""
    active = _active
    return None if active is None else active.current_carrier()


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex), for log lines; None when off or outside a trace."""
    active = _active
    return None if active is None else active.current_trace_id()


def record(name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
    """A finished child span of the current one, with times measured elsewhere (a container's
    steps, reported with its answer)."""
    active = _active
    if active is not None:
        active.record(name, start_ns, end_ns, attributes)


def step(name: str) -> ContextManager[Any]:
    """A child span of the current one around a step of the gateway (`authenticate`,
    `authorize`)."""
    active = _active
    return _OFF if active is None else active.step(name, None)


def hop(container: str, position: int) -> ContextManager[Any]:
    """A child span around one hop of the chain to `container` (its `position`, from 1)."""
    active = _active
    if active is None:
        return _OFF
    return active.step(f"hop {container}", {CONTAINER: container, POSITION: position})


def attempt(replica: str, number: int, node: str, local: bool) -> ContextManager[Any]:
    """A child span of a hop around one try on one replica (`number` 2: the retry elsewhere), on
    `node` (its address), `local` when on the gateway's own node."""
    active = _active
    if active is None:
        return _OFF
    attributes = {REPLICA: replica, ATTEMPT: number, NODE: node, LOCAL: local}
    return active.step("attempt", attributes)


def annotate(key: str, value: str | int) -> None:
    """Set an attribute on the current span (a hop's answer status, say)."""
    active = _active
    if active is not None:
        active.annotate(key, value)
