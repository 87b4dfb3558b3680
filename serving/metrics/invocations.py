"""The router's metrics: what the gateway process measures of each invocation.

DESIGN.md's metrics, router side (the replica side is `replica_metrics`; both appear merged on
`GET /metrics`, see `metrics.exposition`). They live in this module's own registry rather than
prometheus_client's global one, so nothing else in the process (Ray registers its own) collides.
Counters are exact and immediate: one gateway process sees every request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

__all__ = [
    "ACCESS_DECISIONS",
    "LATENCY_BUCKETS",
    "REGISTRY",
    "DesiredReplicasCollector",
    "InvocationTrace",
    "ReplicaCountCollector",
    "record_access",
    "record_client_abort",
    "record_invocation",
    "series_moves",
]

# Milliseconds to minutes: a 0.3 ms hop and a 90 s cold load of a large model both land in a bucket.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

REGISTRY = CollectorRegistry(auto_describe=True)
# How many times this process's request series (everything below but the registry polls, which move on
# their own every long poll) have moved: a gateway generates its exposition again for the other gateways
# only once this changed (`ray_wing.gateway_counters`), since generating it is what an idle one paid.
_moves = [0]


def series_moves() -> int:
    return _moves[0]


def _moved() -> None:
    _moves[0] += 1


ACCESS_DECISIONS = Counter(
    "serving_access_decisions",  # exposed as serving_access_decisions_total
    "Access decisions on invocations of endpoints with AccessControl: allow, deny (policy) or unauthenticated.",
    labelnames=("endpoint", "decision"),
    registry=REGISTRY,
)
INVOCATIONS = Counter(
    "serving_invocations",
    "InvokeEndpoint requests, counted once per container they were addressed to (Serial: each container of "
    "the chain); model is the TargetModel of MultiModel containers; protocol: sagemaker-runtime, v2-rest, v2-grpc or openai "
    "(Open Inference).",
    labelnames=("endpoint", "container", "model", "protocol"),
    registry=REGISTRY,
)
ERRORS_4XX = Counter(
    "serving_invocation_4xx_errors",
    "InvokeEndpoint requests answered with a 4xx status (a ModelError: whose model answered 4xx).",
    labelnames=("endpoint", "container", "model", "protocol"),
    registry=REGISTRY,
)
ERRORS_5XX = Counter(
    "serving_invocation_5xx_errors",
    "InvokeEndpoint requests answered with a 5xx status (a ModelError: whose model answered 5xx).",
    labelnames=("endpoint", "container", "model", "protocol"),
    registry=REGISTRY,
)
CLIENT_ABORTS = Counter(
    "serving_invocation_client_aborts",
    "InvokeEndpoint requests whose client went away before their body had arrived (it disconnected, or was cut "
    "off by a body timeout); not counted as invocations nor as 4XX/5XX errors.",
    labelnames=("endpoint",),
    registry=REGISTRY,
)
REGISTRY_POLLS = Counter(
    "serving_registry_polls",
    "A gateway's long polls of the registry by the way they went: feed (its signed HTTP snapshot feed), ray (a Ray "
    "call: no feed, or the feed failed lately) or feed_failed (the feed could not be used; Ray was asked instead).",
    labelnames=("path",),
    registry=REGISTRY,
)
CONTAINER_LATENCY = Histogram(
    "serving_container_latency_seconds",
    "One hop to a container as the router sees it: the network both ways plus the container's own time.",
    labelnames=("endpoint", "container"),
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
OVERHEAD_LATENCY = Histogram(
    "serving_overhead_latency_seconds",
    "Router time of a request excluding its container hops (authentication, checks, dispatch); the "
    "container label is empty for Serial endpoints.",
    labelnames=("endpoint", "container"),
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)


# The invocation metrics' `protocol` label: how a request arrived (the SageMaker Runtime API, Open
# Inference's REST or gRPC)
RUNTIME_API_LABEL, V2_REST_LABEL, V2_GRPC_LABEL = "sagemaker-runtime", "v2-rest", "v2-grpc"
OPENAI_LABEL = "openai"  # the OpenAI-compatible routes (`gateway.openai_routes`)


@dataclass
class InvocationTrace:
    """What the router learned about one request, filled in as it goes."""

    # set once the endpoint is known (requests to unknown names are not counted)
    endpoint: str | None = None
    mode: str = "Direct"
    chain: tuple[str, ...] = ()
    model: str | None = None  # TargetModel, once checked
    variant: str | None = None  # the production (or shadow) variant that runs it, once picked
    # a MultiModel container answered for `model`: only then is it a label value
    model_confirmed: bool = False
    multi_model: frozenset[str] = frozenset()
    # (container, seconds) of each completed hop
    hops: list[tuple[str, float]] = field(default_factory=list)
    failed_container: str | None = None  # the container an error names, if any
    body_read: bool = False  # the whole request body has arrived
    protocol: str = (
        # how the request arrived: the SageMaker Runtime API, V2_REST_LABEL or V2_GRPC_LABEL
        RUNTIME_API_LABEL
    )


# (metric, *label values) -> its child: labels() costs ~1 µs a call
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, remembered: no series is ever removed, so a child stays the
    metric's own."""
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def record_invocation(trace: InvocationTrace, status: int, seconds: float) -> None:
    """Count one answered request and observe its latencies (a no-op for unknown endpoints)."""
    endpoint = trace.endpoint
    if endpoint is None:
        return
    containers = trace.chain or ("",)  # "" when the request never resolved to a container
    # A TargetModel becomes a label value only once a container answered for it: a name that was
    # refused (unknown, malformed) or never answered (timed out) would otherwise let any caller add
    # series without bound.
    model = trace.model if trace.model and trace.model_confirmed else None
    label = lambda container: model if model and container in trace.multi_model else ""
    for container in containers:
        _child(INVOCATIONS, endpoint, container, label(container), trace.protocol).inc()
    if status >= 400:  # counted once, on the container at fault, else the first one addressed
        at_fault = trace.failed_container if trace.failed_container in containers else containers[0]
        errors = ERRORS_5XX if status >= 500 else ERRORS_4XX
        _child(errors, endpoint, at_fault, label(at_fault), trace.protocol).inc()
    spent = 0.0
    for container, hop_seconds in trace.hops:
        _child(CONTAINER_LATENCY, endpoint, container).observe(hop_seconds)
        spent += hop_seconds
    overhead_container = trace.chain[0] if trace.mode != "Serial" and len(trace.chain) == 1 else ""
    _child(OVERHEAD_LATENCY, endpoint, overhead_container).observe(max(seconds - spent, 0.0))
    _moved()  # after the series moved: a reader of the count never generates before them


def record_client_abort(trace: InvocationTrace) -> None:
    """Count a request whose client went away before its body arrived (a no-op for unknown
    endpoints)."""
    if trace.endpoint is not None:
        CLIENT_ABORTS.labels(trace.endpoint).inc()
        _moved()


def record_access(endpoint: str, decision: str) -> None:
    """Count one access decision on an endpoint with AccessControl (`ACCESS_DECISIONS`)."""
    _child(ACCESS_DECISIONS, endpoint, decision).inc()
    _moved()


class _PerContainerGauge:
    """A gauge per (endpoint, container) read from the gateway's tables at scrape time."""

    name = documentation = ""

    def __init__(self, read) -> None:
        self._read = read  # () -> {(endpoint, container): value}

    def collect(self):
        family = GaugeMetricFamily(self.name, self.documentation, labels=("endpoint", "container"))
        for (endpoint, container), value in sorted(self._read().items()):
            family.add_metric((endpoint, container), value)
        yield family


class ReplicaCountCollector(_PerContainerGauge):
    """`serving_replicas{endpoint,container}`: replicas receiving traffic."""

    name, documentation = "serving_replicas", "Replicas of a container that receive traffic."


class DesiredReplicasCollector(_PerContainerGauge):
    """`serving_desired_replicas{endpoint,container}`: what the container's autoscaler last
    decided."""

    name = "serving_desired_replicas"
    documentation = (
        "Replicas a container should have: its autoscaler's last decision, else its fixed count "
        "(serving_replicas catches up as replicas start or drain)."
    )
