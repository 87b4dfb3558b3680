"""The router's metrics (serving.metrics.invocations) counted over real HTTP: router + containers on
loopback ports.

Counters live in one process-wide registry, so each test reads them before and after its own
requests and checks the exact difference.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_router import containers, endpoints, module_servers, start_router, table  # noqa: F401  (fixtures)

from serving.gateway.failures import container_failure
from serving.metrics import invocations
from serving.metrics.invocations import (
    REGISTRY,
    InvocationTrace,
    ReplicaCountCollector,
    record_invocation,
)

ROW = [[5.1, 3.5, 1.4, 0.2]]


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Deltas:
    """Sample values of the registry now, to compare with later."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.samples = samples
        self.before = [value(name, **labels) for name, labels in samples]

    def now(self) -> list[float]:
        return [
            value(name, **labels) - before
            for (name, labels), before in zip(self.samples, self.before)
        ]


def inv(endpoint: str, container: str, model: str = "") -> tuple[str, dict[str, str]]:
    return "serving_invocations_total", {
        "endpoint": endpoint,
        "container": container,
        "model": model,
        "protocol": "sagemaker-runtime",
    }


def err(kind: str, endpoint: str, container: str, model: str = "") -> tuple[str, dict[str, str]]:
    return f"serving_invocation_{kind}_errors_total", {
        "endpoint": endpoint,
        "container": container,
        "model": model,
        "protocol": "sagemaker-runtime",
    }


def hops(endpoint: str, container: str) -> tuple[str, dict[str, str]]:
    return "serving_container_latency_seconds_count", {"endpoint": endpoint, "container": container}


@pytest.fixture(scope="module")
def router(module_servers, containers) -> Iterator[httpx.Client]:  # noqa: F811
    url, _ = start_router(module_servers, endpoints(), table(containers))
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client


def invoke(router: httpx.Client, endpoint: str, target: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if target:
        headers["X-Amzn-SageMaker-Target-Container-Hostname"] = target
    return router.post(f"/endpoints/{endpoint}/invocations", json=ROW, headers=headers)


def test_direct_invocations_and_latencies_are_counted_exactly(router: httpx.Client) -> None:
    deltas = Deltas(
        inv("direct", "iris"),
        inv("direct", "labels"),
        hops("direct", "iris"),
        ("serving_overhead_latency_seconds_count", {"endpoint": "direct", "container": "iris"}),
        err("4xx", "direct", "iris"),
        err("5xx", "direct", "iris"),
    )
    sums = Deltas(
        ("serving_container_latency_seconds_sum", {"endpoint": "direct", "container": "iris"}),
        ("serving_overhead_latency_seconds_sum", {"endpoint": "direct", "container": "iris"}),
    )
    for _ in range(3):
        assert invoke(router, "direct", "iris").status_code == 200
    assert deltas.now() == [3, 0, 3, 3, 0, 0]
    container_time, overhead_time = sums.now()
    assert container_time > 0 and overhead_time > 0


def test_serial_counts_every_container_and_the_models_error_on_the_one_at_fault(
    router: httpx.Client,
) -> None:
    deltas = Deltas(
        inv("pipeline-boom", "scaler"),
        inv("pipeline-boom", "boom"),
        inv("pipeline-boom", "labels"),
        err("4xx", "pipeline-boom", "scaler"),
        err("4xx", "pipeline-boom", "boom"),
        err("5xx", "pipeline-boom", "boom"),
        hops("pipeline-boom", "scaler"),
        hops("pipeline-boom", "boom"),
        hops("pipeline-boom", "labels"),
        ("serving_overhead_latency_seconds_count", {"endpoint": "pipeline-boom", "container": ""}),
    )
    response = invoke(router, "pipeline-boom")
    assert response.status_code == 424
    # The caller gets ModelError (424); the error counts by the status the model answered (500), as
    # SageMaker's Invocation4XXErrors / Invocation5XXErrors count "the model returned a 4xx / 5xx
    # response".
    assert response.json()["OriginalStatusCode"] == 500
    assert deltas.now() == [1, 1, 1, 0, 0, 1, 1, 1, 0, 1]


def test_requests_refused_before_a_container_count_on_no_container(router: httpx.Client) -> None:
    deltas = Deltas(
        inv("direct", ""), err("4xx", "direct", ""), inv("failed", ""), err("5xx", "failed", "")
    )
    assert invoke(router, "direct").status_code == 400  # three containers, none named
    assert invoke(router, "failed", "iris").status_code == 503
    assert deltas.now() == [1, 1, 1, 1]


def test_unknown_endpoints_add_no_series(router: httpx.Client) -> None:
    assert invoke(router, "no-such-endpoint", "iris").status_code == 400
    names = {
        sample.labels.get("endpoint") for family in REGISTRY.collect() for sample in family.samples
    }
    assert "no-such-endpoint" not in names


@pytest.mark.parametrize(
    "status, confirmed", [(200, True), (424, True), (424, False), (400, False), (503, False)]
)
def test_a_target_model_is_a_label_only_once_a_container_answered_for_it(
    status: int, confirmed: bool
) -> None:
    # An unknown, refused or timed-out TargetModel must not become a series: callers choose those
    # names.
    name = f"model-{status}-{confirmed}.tar.gz"
    trace = InvocationTrace(
        endpoint="mm",
        chain=("multi",),
        model=name,
        multi_model=frozenset({"multi"}),
        hops=[("multi", 0.01)],
        failed_container="multi" if status >= 400 else None,
        model_confirmed=confirmed,
    )
    labelled = confirmed
    before = value(
        "serving_invocations_total",
        endpoint="mm",
        container="multi",
        model=name,
        protocol="sagemaker-runtime",
    )
    record_invocation(trace, status, 0.02)
    after = value(
        "serving_invocations_total",
        endpoint="mm",
        container="multi",
        model=name,
        protocol="sagemaker-runtime",
    )
    assert after - before == (1 if labelled else 0)


def test_overhead_is_the_request_time_less_its_hops() -> None:
    trace = InvocationTrace(
        endpoint="timing", mode="Serial", chain=("a", "b"), hops=[("a", 0.25), ("b", 0.5)]
    )
    before = value("serving_overhead_latency_seconds_sum", endpoint="timing", container="")
    record_invocation(trace, 200, 1.0)
    assert value(
        "serving_overhead_latency_seconds_sum", endpoint="timing", container=""
    ) - before == pytest.approx(0.25)


def test_replica_counts_are_read_at_scrape_time() -> None:
    counts = {("e", "a"): 2}
    family = next(iter(ReplicaCountCollector(lambda: counts).collect()))
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"endpoint": "e", "container": "a"}, 2)
    ]
    counts[("e", "a")] = 0
    family = next(iter(ReplicaCountCollector(lambda: counts).collect()))
    assert family.samples[0].value == 0


def test_latency_buckets_span_milliseconds_to_minutes() -> None:
    assert invocations.LATENCY_BUCKETS[0] <= 0.001 and invocations.LATENCY_BUCKETS[-1] >= 60
    assert list(invocations.LATENCY_BUCKETS) == sorted(set(invocations.LATENCY_BUCKETS))


def test_registry_text_is_valid_prometheus() -> None:
    from prometheus_client import generate_latest

    names = {
        family.name for family in text_string_to_metric_families(generate_latest(REGISTRY).decode())
    }
    assert {
        "serving_invocations",
        "serving_container_latency_seconds",
        "serving_overhead_latency_seconds",
    } <= names


def test_a_model_error_counts_by_its_models_status_and_a_timeout_as_the_servers_failure() -> None:
    from serving.gateway.failures import timed_out
    from serving.gateway.transport import HopResponse

    raised = container_failure(
        "e", "c", 1, 1, HopResponse(500, b'{"message": "boom"}', "application/json", None)
    )
    refused = container_failure(
        "e", "c", 1, 1, HopResponse(415, b"unsupported", "text/plain", None)
    )
    late = timed_out("c", 3.0)
    assert (raised.status, raised.counted_status) == (424, 500)
    assert (refused.status, refused.counted_status) == (424, 415)
    assert (late.status, late.body()["OriginalStatusCode"], late.counted_status) == (424, 408, 504)
