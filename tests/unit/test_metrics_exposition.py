"""GET /metrics: Ray node expositions and the gateway's registry merged into one scrape.

`data/ray_node_metrics.txt` is a trimmed real exposition of a Ray 2.60 node's metrics agent (two
MultiModel replicas and one of Ray's own families), captured from `serving up`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from serving.http.server import BackgroundServer
from serving.metrics.exposition import (
    MetricsRoute,
    exposition,
    merge_families,
    serving_families_from_ray,
)

NODE_TEXT = (Path(__file__).parent / "data" / "ray_node_metrics.txt").read_text()
LATENCY_EXACT = {"gs2g7il6": 0.016473060994030675, "92hxx7tj": 0.02928649699606467}


def samples(families, sample_name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in families
        for s in f.samples
        if s.name == sample_name
    }


def test_only_serving_families_with_ray_labels_and_prefix_removed() -> None:
    families = serving_families_from_ray(NODE_TEXT)
    assert sorted(f.name for f in families) == [
        "serving_model_cache_hit",
        "serving_model_latency_seconds",
    ]
    for family in families:
        for sample in family.samples:
            assert set(sample.labels) <= {"endpoint", "container", "replica", "model", "le"}, sample


def test_histogram_sums_are_the_exact_ones_not_rays_bucket_midpoints() -> None:
    sums = samples(serving_families_from_ray(NODE_TEXT), "serving_model_latency_seconds_sum")
    by_replica = {dict(labels)["replica"]: value for labels, value in sums.items()}
    assert by_replica == LATENCY_EXACT
    assert "_exact_sum" not in exposition(serving_families_from_ray(NODE_TEXT)).decode()


def test_two_nodes_reporting_the_same_series_are_summed_once_per_family() -> None:
    text = exposition(
        serving_families_from_ray(NODE_TEXT) + serving_families_from_ray(NODE_TEXT)
    ).decode()
    assert text.count("# TYPE serving_model_cache_hit_total counter") == 1
    hits = samples(text_string_to_metric_families(text), "serving_model_cache_hit_total")
    assert list(hits.values()) == [6.0]  # 3 on each "node"


def test_gateway_and_node_families_merge_and_created_samples_are_left_out() -> None:
    registry = CollectorRegistry()
    counter = Counter("serving_invocations", "test", ["endpoint"], registry=registry)
    counter.labels("e").inc(2)
    merged = merge_families(list(registry.collect()) + serving_families_from_ray(NODE_TEXT))
    assert [f.name for f in merged] == [
        "serving_invocations",
        "serving_model_cache_hit",
        "serving_model_latency_seconds",
    ]
    assert not any(s.name.endswith("_created") for f in merged for s in f.samples)
    assert samples(merged, "serving_invocations_total") == {(("endpoint", "e"),): 2.0}


def test_empty_and_foreign_text_give_no_families() -> None:
    assert serving_families_from_ray("") == []
    assert serving_families_from_ray("# TYPE ray_serve_x counter\nray_serve_x_total 3\n") == []


@pytest.fixture
def node_agent():
    """A stand-in node metrics agent on loopback serving the captured exposition."""
    app = Starlette(routes=[Route("/metrics", lambda request: PlainTextResponse(NODE_TEXT))])
    server = BackgroundServer(app, "127.0.0.1", 0)
    assert server.wait_started()
    yield f"{server.url}/metrics"
    server.stop()


def test_metrics_route_scrapes_every_node_and_survives_one_down(node_agent: str) -> None:
    registry = CollectorRegistry()
    Counter("serving_invocations", "test", ["endpoint"], registry=registry).labels("e").inc()
    # the last one refuses connections
    nodes = [node_agent, f"{node_agent}?node=2", "http://127.0.0.1:9/metrics"]

    async def node_urls() -> list[str]:
        return nodes

    route = MetricsRoute([registry], node_urls, timeout_s=2.0, wait_s=5.0)
    app = Starlette(routes=route.routes())

    async def scrape() -> httpx.Response:
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            ) as client:
                return await client.get("/metrics")
        finally:
            await route.close()

    response = asyncio.run(scrape())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(response.text))
    assert samples(families, "serving_invocations_total") == {(("endpoint", "e"),): 1.0}
    # two live nodes
    assert list(samples(families, "serving_model_cache_hit_total").values()) == [6.0]


def test_escaped_label_values_and_help_text_survive() -> None:
    text = (
        '# HELP ray_serving_x_total Counts "things"\\n twice.\n# TYPE ray_serving_x_total counter\n'
        'ray_serving_x_total{WorkerId="w1",model="a\\"b\\\\c",replica="r"} 2.0\n'
        'ray_serving_x_total{WorkerId="w2",model="a\\"b\\\\c",replica="r"} 3.0\n'
    )
    (family,) = serving_families_from_ray(text)
    assert family.name == "serving_x" and family.type == "counter"
    merged = merge_families([family])
    assert samples(merged, "serving_x_total") == {(("model", 'a"b\\c'), ("replica", "r")): 5.0}
    assert (
        list(text_string_to_metric_families(exposition([family]).decode()))[0]
        .samples[0]
        .labels["model"]
        == 'a"b\\c'
    )


def test_a_scrape_counts_the_asking_gateway_once_with_its_current_counters() -> None:
    # Issue 43: the control plane merges /metrics for whichever gateway is scraped. That gateway
    # sends its own counters, current; what it last published (up to 5 s old) must not be added on
    # top of them.
    def text(value: float) -> str:
        return f'# HELP serving_invocations_total n\n# TYPE serving_invocations_total counter\nserving_invocations_total{{endpoint="e"}} {value}\n'

    async def no_nodes() -> list[str]:
        return []

    async def published() -> dict[str, str]:
        return {"asking": text(5), "other": text(7)}

    route = MetricsRoute([], no_nodes, peers=published)

    async def scrape() -> bytes:
        try:
            return await route.scrape(text(9).encode(), skip="asking")
        finally:
            await route.close()

    families = list(text_string_to_metric_families(asyncio.run(scrape()).decode()))
    # 9 current + 7 other
    assert samples(families, "serving_invocations_total") == {(("endpoint", "e"),): 16.0}


def test_the_gateways_counters_are_parsed_again_only_when_they_change() -> None:
    # An idle gateway republishes the same text every few seconds; the control plane's sampler read
    # and parsed it each time (a measurable share of an idle server's CPU).
    def text(value: float) -> str:
        return f'# HELP serving_invocations_total n\n# TYPE serving_invocations_total counter\nserving_invocations_total{{endpoint="e"}} {value}\n'

    async def no_nodes() -> list[str]:
        return []

    current = {"a": text(1), "b": text(2)}

    async def published() -> dict[str, str]:
        return dict(current)

    route = MetricsRoute([], no_nodes, peers=published)

    async def reads() -> list[tuple[dict[str, list], float]]:
        seen = []
        try:
            for change in ({}, {}, {"b": text(5)}, {"a": None}):
                for gateway, value in change.items():
                    if value is None:
                        del current[gateway]
                    else:
                        current[gateway] = value
                families = await route.merged(nodes=False)
                total = samples(families, "serving_invocations_total")[(("endpoint", "e"),)]
                seen.append((dict(route._peer_families), total))
        finally:
            await route.close()
        return seen

    (first, one), (second, three), (changed, six), (left, five) = asyncio.run(reads())
    assert (one, three, six, five) == (3.0, 3.0, 6.0, 5.0)
    assert second["a"] is first["a"] and second["b"] is first["b"]  # unchanged: not parsed again
    assert changed["a"] is first["a"] and changed["b"] is not first["b"]
    assert set(left) == {"b"}
