"""Metrics end to end: requests to it-metrics, scraped from GET /metrics by a real Prometheus
server.

Prometheus is Debian's `prometheus` package (`make test` installs it), started on a loopback port
with a 3 s scrape interval and stopped by PID. The endpoint `it-metrics` is invoked by this module
only: one MultiModel replica with a cache of 2 models, and one SingleModel container, so every
count below follows from the requests sent. The same Prometheus, with deploy/prometheus/alerts.yml
loaded, runs every query of deploy/grafana's dashboards (deploy/monitoring.md).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from suite import dashboards
from suite.endpoint_server import TINY
from suite.endpoints import sklearn_container

from serving.client import InvokeResult, ValidationError

pytestmark = pytest.mark.integration


def metrics(demo_models: Path, multi_model_prefix: Path) -> dict:
    """it-metrics: the endpoint only this module invokes, so that it can predict every count."""
    return {
        "EndpointName": "it-metrics",
        "Containers": [
            {
                "ContainerHostname": "multi",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": str(multi_model_prefix),
                "Environment": {"SERVING_MAX_MODELS": "2"},
                "Resources": TINY,
            },
            sklearn_container("single", demo_models, "iris-classifier", Resources=TINY),
        ],
    }


ENDPOINTS = {"it-metrics": metrics}  # what `server` deploys for this module, by builder

ENDPOINT = "it-metrics"
ROW = [[5.1, 3.5, 1.4, 0.2]]
# Through an LRU cache of 2: a miss, a hit, b miss, a hit, c miss (evicts b), b miss (evicts a), a
# miss (evicts c).
SEQUENCE = ["iris-0", "iris-0", "iris-1", "iris-0", "iris-2", "iris-1", "iris-0"]
HITS, MISSES = 2, 5
SINGLE_REQUESTS = 5
WAIT_S = 90  # replicas push their metrics every 5 s, Prometheus scrapes every 3 s
SCRAPE_S = 3
ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
# A rule that fires for it-metrics at once: the dashboards' alerts panel must show it.
DASHBOARD_TEST_RULES = {
    "groups": [
        {
            "name": "dashboard-test",
            "rules": [
                {
                    "alert": "DashboardTestAlwaysFiring",
                    "expr": f'max by (endpoint, container) (serving_replicas{{endpoint="{ENDPOINT}"}}) > 0',
                    "labels": {"severity": "info"},
                }
            ],
        }
    ]
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory) -> Iterator[str]:
    """A Prometheus server scraping the endpoint server; its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("SERVING_SKIP_PROMETHEUS") == "1":
            pytest.skip("SERVING_SKIP_PROMETHEUS=1 and no prometheus binary")
        pytest.fail(
            "the prometheus binary is missing: `make test` installs Debian's prometheus package "
            "(apt-get install prometheus); set SERVING_SKIP_PROMETHEUS=1 to skip this test"
        )
    root = tmp_path_factory.mktemp("prometheus")
    target = server.url.removeprefix("http://")
    (root / "rules.yml").write_text(json.dumps(DASHBOARD_TEST_RULES))
    config = {
        "global": {"scrape_interval": "3s", "scrape_timeout": "3s", "evaluation_interval": "3s"},
        # deploy/'s alerting rules, so that the dashboards' alerts panel reads what Prometheus has
        "rule_files": [str(ALERTS), str(root / "rules.yml")],
        "scrape_configs": [{"job_name": "serving", "static_configs": [{"targets": [target]}]}],
    }
    (root / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    log = (root / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, (root / "prometheus.log").read_text()
            time.sleep(0.3)
        else:
            pytest.fail("prometheus did not become ready in 30 s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def query(prometheus: str, promql: str) -> dict[str, float]:
    """An instant query's result: {label text: value}."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert answer["status"] == "success", answer
    return {
        json.dumps(item["metric"], sort_keys=True): float(item["value"][1])
        for item in answer["data"]["result"]
    }


def wait_for(prometheus: str, expected: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Poll every query until all give the expected answer (or WAIT_S passes); the last answers."""
    deadline = time.monotonic() + WAIT_S
    while True:
        answers = {promql: query(prometheus, promql) for promql in expected}
        if answers == expected or time.monotonic() > deadline:
            return answers
        time.sleep(1)


def invoke(server, target: str, model: str | None = None) -> InvokeResult:
    return server.client.invoke(
        ENDPOINT, ROW, target=target, model=f"{model}.tar.gz" if model else None
    )


@pytest.fixture(scope="module")
def traffic(server) -> None:
    """The module's requests, sent once, sequentially."""
    for model in SEQUENCE:
        response = invoke(server, "multi", model)
        assert response.status_code == 200
    for _ in range(SINGLE_REQUESTS):
        assert invoke(server, "single").status_code == 200
    with pytest.raises(ValidationError) as raised:
        invoke(server, "multi", "no-such-model")
    unknown = raised.value
    assert unknown.status_code == 400 and "no-such-model" in unknown.message


def test_prometheus_sees_the_invocations_and_cache_hit_ratio_sent(
    server, traffic, prometheus
) -> None:
    e = f'endpoint="{ENDPOINT}"'
    counts = {model: SEQUENCE.count(model) for model in set(SEQUENCE)}
    expected = {
        f"sum by (container) (serving_invocations_total{{{e}}})": {
            json.dumps({"container": "multi"}): len(SEQUENCE) + 1,
            json.dumps({"container": "single"}): SINGLE_REQUESTS,
        },
        f'sum by (model) (serving_invocations_total{{{e},container="multi",model!=""}})': {
            json.dumps({"model": f"{m}.tar.gz"}): n for m, n in counts.items()
        },
        f"sum(serving_invocation_4xx_errors_total{{{e}}})": {"{}": 1.0},
        f"sum(serving_model_cache_hit_total{{{e}}}) / (sum(serving_model_cache_hit_total{{{e}}}) "
        f"+ sum(serving_model_cache_miss_total{{{e}}}))": {"{}": HITS / (HITS + MISSES)},
        f"sum(serving_model_cache_miss_total{{{e}}})": {"{}": MISSES},
        f"sum(serving_loaded_model_count{{{e}}})": {"{}": 2.0},
        f"sum by (container) (serving_replicas{{{e}}})": {
            json.dumps({"container": "multi"}): 1.0,
            json.dumps({"container": "single"}): 1.0,
        },
        f"sum(serving_model_loading_time_seconds_count{{{e}}})": {"{}": MISSES},
        # 2 stay loaded
        f"sum(serving_model_unloading_time_seconds_count{{{e}}})": {"{}": MISSES - 2},
    }
    answers = wait_for(prometheus, expected)
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    assert answers == expected, [
        (t["health"], t["lastError"], t["lastScrapeDuration"]) for t in targets
    ]


def test_latencies_are_positive_and_ordered(server, traffic, prometheus) -> None:
    families = {}
    deadline = time.monotonic() + WAIT_S
    # until the replicas' next push carries the module's requests
    while time.monotonic() < deadline:
        families = {
            s.name: s.value
            for f in text_string_to_metric_families(server.http.get("/metrics").text)
            for s in f.samples
            if s.labels.get("endpoint") == ENDPOINT and s.labels.get("container") == "single"
        }
        if families.get("serving_model_latency_seconds_count") == SINGLE_REQUESTS:
            break
        time.sleep(1)
    model = families["serving_model_latency_seconds_sum"]
    container = families["serving_container_latency_seconds_sum"]
    assert families["serving_container_latency_seconds_count"] == SINGLE_REQUESTS
    # The router's hop contains the container's model time, plus the network both ways.
    assert 0 < model < container
    assert families["serving_overhead_latency_seconds_sum"] > 0
    answer = query(
        prometheus,
        f'sum(serving_model_loading_wait_time_seconds_sum{{endpoint="{ENDPOINT}"}}) '
        f'- sum(serving_model_loading_time_seconds_sum{{endpoint="{ENDPOINT}"}})',
    )
    # a request that missed waited at least for its model's load
    assert list(answer.values())[0] >= 0


def test_refused_model_names_add_no_series(server, traffic) -> None:
    assert "no-such-model" not in server.http.get("/metrics").text


def test_utilization_of_every_replica_is_reported(server, traffic) -> None:
    deadline = time.monotonic() + WAIT_S
    seen: dict[str, float] = {}
    while time.monotonic() < deadline and len(seen) < 2:
        for family in text_string_to_metric_families(server.http.get("/metrics").text):
            for sample in family.samples:
                if (
                    sample.name == "serving_memory_utilization_percent"
                    and sample.labels["endpoint"] == ENDPOINT
                ):
                    seen[sample.labels["container"]] = sample.value
        time.sleep(1)
    assert set(seen) == {"multi", "single"}
    assert all(0 < value < 100 for value in seen.values())


# Dashboard queries that return no series for it-metrics, and why: (dashboard, panel, refId) -> reason.
# Each still runs (Prometheus must accept it) and names only metric families /metrics declares.
NO_SERIES_HERE = {
    ("serving-dashboard.json", "Access decisions per second", "A"): (
        "it-metrics has no AccessControl: serving_access_decisions_total counts only endpoints with one"
    ),
    ("serving-dashboard.json", "4XX and 5XX errors per second by variant", "B"): (
        "it-metrics answers no 5XX, and a 5XX series exists only from an endpoint's first 5XX on"
    ),
    ("serving-dashboard.json", "GPU utilization per container (avg over replicas)", "A"): (
        "it-metrics' replicas have no GPU"
    ),
}
# Families not even declared on /metrics here, and why.
NOT_EXPORTED_HERE = {
    "serving_gpu_utilization_percent": "only replicas that have a GPU export it (Ray's metrics)",
}


def test_every_dashboard_query_returns_series_of_the_endpoint(server, traffic, prometheus) -> None:
    """Every query of deploy/grafana's dashboards, its variables resolved against Prometheus and
    interpolated as Grafana does (tests/suite/dashboards.py), returns it-metrics' series: a panel
    reading a metric or label that /metrics does not have fails."""
    window_s = 60.0
    deadline = time.monotonic() + WAIT_S
    while True:  # until the rate windows hold two scrapes and the test rule has fired
        problems, resolved = [], {}
        families = dashboards.scraped_metric_families(prometheus)
        problems += [
            f"{name} is declared now: out of NOT_EXPORTED_HERE"
            for name in NOT_EXPORTED_HERE
            if name in families
        ]
        # the alerts panel shows what alerts.yml's rules find: each must evaluate
        groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
        problems += [
            f"rule {rule['name']}: {rule['health']} {rule.get('lastError', '')}"
            for group in groups
            for rule in group["rules"]
            if rule["health"] != "ok"
        ]
        for path in dashboards.DASHBOARDS:
            document = dashboards.load(path)
            values, wrong = dashboards.resolve_variables(prometheus, document, ENDPOINT, window_s)
            resolved[path.name] = values
            problems += [f"{path.name}: {problem}" for problem in wrong]
            for query in dashboards.queries(path):
                unknown = dashboards.undeclared(query.expr, families) - set(NOT_EXPORTED_HERE)
                if unknown:
                    problems.append(f"{query}: /metrics has no {sorted(unknown)}")
                series = dashboards.run(prometheus, query, values, SCRAPE_S, window_s)
                ours = [s for s in series if s["metric"].get("endpoint", ENDPOINT) == ENDPOINT]
                if (query.dashboard, query.panel, query.ref) in NO_SERIES_HERE:
                    if ours:
                        problems.append(f"{query} has series now: take it out of NO_SERIES_HERE")
                elif not ours or len(ours) != len(series):
                    problems.append(
                        f"{query}: {len(ours)} of {len(series)} series are {ENDPOINT}'s"
                    )
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(SCRAPE_S)
    assert not problems, "\n".join(problems)
    for values in resolved.values():
        assert values.get("container") == ["multi", "single"], values
