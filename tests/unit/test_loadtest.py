"""The load-test harness without Locust: scenario math, option checking and report building.

Locust patches the process with gevent on import, so these tests (like the modules they test)
must never import it; the last test makes sure of that.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter

import pytest

from serving.cli import build_parser
from serving.client.credentials import Anonymous
from serving.loadtest import options, probe, report, scenarios
from serving.loadtest.options import OptionError
from serving.loadtest.recorder import RunResult
from serving.protocol import TARGET_CONTAINER, TARGET_MODEL

DESCRIPTION = {
    "EndpointName": "ep",
    "EndpointStatus": "InService",
    "InferenceExecutionConfig": {"Mode": "Direct"},
    "Containers": [
        {"ContainerHostname": "iris", "Mode": "SingleModel", "CurrentReplicas": 1},
        {"ContainerHostname": "wine", "Mode": "SingleModel", "CurrentReplicas": 2},
        {"ContainerHostname": "customers", "Mode": "MultiModel", "CurrentReplicas": 1},
    ],
}
SERIAL = {
    "InferenceExecutionConfig": {"Mode": "Serial"},
    "Containers": [{"ContainerHostname": "pre"}, {"ContainerHostname": "clf"}],
}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(
        ["loadtest", *argv, "--endpoint", "http://127.0.0.1:8080/endpoints/ep"]
    )


def plan(*argv: str, description=DESCRIPTION) -> options.Plan:
    return options.build_plan(parse(*argv), "http://127.0.0.1:8080", "ep", description, Anonymous())


# --- scenario math -----------------------------------------------------------------------------


def test_weighted_picks_in_proportion() -> None:
    direct = scenarios.Direct({"a": 3, "b": 1})
    rng = random.Random(1)
    counts = Counter(direct.target(0.0, rng).container for _ in range(20_000))
    assert counts["a"] / 20_000 == pytest.approx(0.75, abs=0.02)
    assert scenarios.Weighted({"a": 1, "b": 0}).pick(0.999999) == "a"
    assert scenarios.Weighted({"a": 1, "b": 1}).pick(1.0) == "b"  # never out of range
    for bad in ({}, {"a": 0}, {"a": -1}):
        with pytest.raises(ValueError):
            scenarios.Weighted(bad)


def test_zipf_popularity_is_normalized_ranked_and_seeded() -> None:
    weights = scenarios.zipf_weights(10, 1.1)
    assert sum(weights) == pytest.approx(1.0)
    assert weights == sorted(weights, reverse=True)
    assert weights[0] / weights[1] == pytest.approx(2**1.1)
    assert scenarios.zipf_weights(4, 0) == [0.25] * 4  # s = 0: uniform
    names = scenarios.model_names(10, "customer-{i}.tar.gz")
    assert names[0] == "customer-0.tar.gz" and names[-1] == "customer-9.tar.gz"
    zipf = scenarios.Zipf(names, 1.1, "customers")
    draw = lambda seed: [
        zipf.target(0.0, r).model for r in [random.Random(seed)] for _ in range(5000)
    ]  # noqa: E731
    assert draw(7) == draw(7) != draw(8)
    counts = Counter(draw(7))
    assert counts["customer-0.tar.gz"] / 5000 == pytest.approx(weights[0], abs=0.03)
    assert {zipf.target(0.0, random.Random(0)).container} == {"customers"}
    with pytest.raises(ValueError, match=r"\{i\}"):
        scenarios.model_names(3, "customer.tar.gz")


def test_shift_moves_traffic_linearly_between_25_and_75_percent() -> None:
    f = scenarios.shift_fraction
    assert [f(t, 100) for t in (0, 25, 37.5, 50, 62.5, 75, 100)] == [0, 0, 0.25, 0.5, 0.75, 1, 1]
    shift = scenarios.Shift("a", "b", 100)
    rng = random.Random(3)
    early = Counter(shift.target(10, rng).container for _ in range(1000))
    middle = Counter(shift.target(50, rng).container for _ in range(4000))
    late = Counter(shift.target(90, rng).container for _ in range(1000))
    assert early == {"a": 1000} and late == {"b": 1000}
    assert middle["b"] / 4000 == pytest.approx(0.5, abs=0.03)


def test_step_levels_hold_then_ramp() -> None:
    levels = [10, 50, 10]
    assert [scenarios.step_level(t, levels, 60) for t in (0, 59.9, 60, 119, 120, 500)] == [
        10,
        10,
        50,
        50,
        10,
        10,
    ]
    assert scenarios.step_level(30, levels, 60, ramp=True) == pytest.approx(30)
    assert scenarios.step_level(90, levels, 60, ramp=True) == pytest.approx(30)
    assert scenarios.step_level(130, levels, 60, ramp=True) == 10  # the last level holds
    with pytest.raises(ValueError):
        scenarios.Step([0, 0], 60, scenarios.Serial())


def test_open_loop_schedule_has_exactly_the_planned_count() -> None:
    constant = list(scenarios.arrival_times(lambda t: 50, 2.0))
    assert len(constant) == 100 and constant[0] == 0 and constant[1] == pytest.approx(0.02)
    assert all(b > a for a, b in zip(constant, constant[1:]))
    shape = lambda t: scenarios.step_level(t, [10, 50, 0, 10], 1.0)  # noqa: E731
    stepped = list(scenarios.arrival_times(shape, 4.0))
    assert len(stepped) == 70 and not [t for t in stepped if 2.0 + 1e-6 < t < 3.0 - 1e-6]
    ramp = list(
        scenarios.arrival_times(lambda t: scenarios.step_level(t, [0, 100], 10.0, ramp=True), 10.0)
    )
    assert len(ramp) == 500  # the area under the ramp
    poisson = list(scenarios.arrival_times(lambda t: 100, 60.0, random.Random(5)))
    assert len(poisson) == pytest.approx(6000, rel=0.05)
    assert poisson == list(scenarios.arrival_times(lambda t: 100, 60.0, random.Random(5)))


# --- options ------------------------------------------------------------------------------------


def test_endpoint_and_baseline_urls() -> None:
    assert options.parse_endpoint_url("http://h:1/endpoints/ep") == ("http://h:1", "ep")
    assert options.parse_endpoint_url("https://h/prefix/endpoints/ep/invocations") == (
        "https://h/prefix",
        "ep",
    )
    for bad in ("http://h:1/", "h:1/endpoints/ep", "http://h/endpoints/bad_name"):
        with pytest.raises(OptionError) as caught:
            options.parse_endpoint_url(bad)
        assert caught.value.flag == "--endpoint"
    assert options.parse_baseline_url("http://h:9") == ("http://h:9", "/invocations")
    assert options.parse_baseline_url("http://h:9/v1/predict/") == ("http://h:9", "/v1/predict")


def test_direct_defaults_to_every_container_with_sdk_requests() -> None:
    p = plan("direct")
    assert not p.open_loop and p.level == 10 and p.duration == 30
    assert p.scenario.weights == {"iris": 1.0, "wine": 1.0, "customers": 1.0}
    prepared = p.requests[scenarios.Target("wine")]
    assert (
        prepared.path == "/endpoints/ep/invocations" and prepared.body == b"[[5.1, 3.5, 1.4, 0.2]]"
    )
    assert prepared.headers == {
        "Content-Type": "application/json",
        TARGET_CONTAINER: "wine",
        "Accept": "*/*",
    }


def test_weights_rate_and_payloads(tmp_path) -> None:
    (tmp_path / "wine.csv").write_text("1,2,3\n")
    p = plan(
        "direct",
        "--rate",
        "25",
        "--weights",
        "iris=3,wine=1",
        "--payload",
        f"wine={tmp_path / 'wine.csv'}",
        "--payload-json",
        "[[1, 2]]",
        "--content-type",
        "text/csv",
    )
    assert p.open_loop and p.level == 25 and p.scenario.weights == {"iris": 3.0, "wine": 1.0}
    assert p.requests[scenarios.Target("iris")].body == b"1,2\n"  # the SDK's JSON → CSV encoding
    assert p.requests[scenarios.Target("wine")].body == b"1,2,3\n"
    assert p.requests[scenarios.Target("wine")].headers["Content-Type"] == "text/csv"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["direct", "--weights", "iris=x"], "--weights"),
        (["direct", "--weights", "nope=1"], "--weights"),
        (["shift", "--from", "iris"], "--to"),
        (["shift", "--from", "iris", "--to", "iris"], "--to"),
        (["shift", "--from", "nope", "--to", "iris"], "--from"),
        (["step"], "--steps"),
        (["step", "--steps", "10,x"], "--steps"),
        (["step", "--steps", "1,2", "--rate", "5"], "--rate"),
        (["zipf", "--model-pattern", "m.tar.gz", "--container", "customers"], "--model-pattern"),
        (["zipf", "--container", "nope"], "--container"),
        (["direct", "--payload", "/does/not/exist"], "--payload"),
        (["direct", "--payload-json", "[1,"], "--payload-json"),
    ],
)
def test_bad_options_name_their_flag(argv, flag) -> None:
    with pytest.raises(OptionError) as caught:
        plan(*argv)
    assert caught.value.flag == flag


def test_argparse_refuses_bad_numbers(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("direct", "--rate", "0")
    assert caught.value.code == 2 and "argument --rate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("direct", "--rate", "5", "--users", "3")


def test_serial_step_and_zipf_plans() -> None:
    assert isinstance(plan("serial", description=SERIAL).scenario, scenarios.Serial)
    with pytest.raises(OptionError):
        plan("serial")  # Direct with three containers: every request needs a target
    with pytest.raises(OptionError):
        plan("direct", description=SERIAL)
    step = plan("step", "--steps", "10,50,10", "--step-seconds", "60", description=SERIAL)
    assert (
        step.open_loop
        and step.duration == 180
        and step.peak_level == 50
        and step.level_at(61) == 50
    )
    assert step.parameters()["rate"] is None and step.parameters()["scenario"]["levels"] == [
        10,
        50,
        10,
    ]
    assert "steps 10,50,10 req/s" in report.summary_table(
        report.build_report("step", step.parameters(), RunResult("main", 1.0, 2.0), step.duration)
    )
    assert list(step.requests) == [scenarios.Target(None)]
    users = plan("step", "--steps", "2,8", "--step-unit", "users", "--duration", "10")
    assert not users.open_loop and users.duration == 10 and users.peak_level == 8
    zipf = plan("zipf", "--models", "3")
    assert zipf.scenario.container == "customers"  # the endpoint's one MultiModel container
    headers = zipf.requests[scenarios.Target("customers", "customer-2.tar.gz")].headers
    assert headers[TARGET_MODEL] == "customer-2.tar.gz" and headers[TARGET_CONTAINER] == "customers"
    single = plan("zipf", "--models", "2", description={"Containers": [{"ContainerHostname": "m"}]})
    assert (
        single.scenario.container is None
        and TARGET_CONTAINER not in next(iter(single.requests.values())).headers
    )
    assert json.dumps(zipf.parameters())  # the report can hold it


# --- probe parsing --------------------------------------------------------------------------------


def test_replica_counts_and_invocation_metric() -> None:
    assert probe.replica_counts(DESCRIPTION) == {"iris": 1, "wine": 2, "customers": 1}
    text = "\n".join(
        [
            "# HELP serving_invocations_total Invocations.",
            "# TYPE serving_invocations_total counter",
            'serving_invocations_total{endpoint="ep",container="iris",model=""} 3.0',
            'serving_invocations_total{endpoint="ep",container="customers",model="m1"} 2.0',
            'serving_invocations_total{endpoint="other",container="x",model=""} 9.0',
            'serving_invocations_created{endpoint="ep",container="iris",model=""} 1.7e9',
            "",
        ]
    )
    assert probe.invocations_total(text, "ep") == 5.0
    assert probe.invocations_total(text, "new") == 0.0  # exposed, never invoked
    assert probe.invocations_total("# TYPE other counter\nother_total 1\n", "ep") is None


# --- report -------------------------------------------------------------------------------------


def synthetic() -> RunResult:
    result = RunResult(
        "main", started_at=1_700_000_000.0, ended_at=1_700_000_004.0, levels=[10, 10, 20, 20]
    )
    for i in range(100):  # 1..100 ms, spread over 4 seconds
        result.add(i * 0.04, float(i + 1), "iris" if i % 2 else "wine", None, 200, None)
    result.add(0.5, 1.0, "iris", None, 429, "ModelNotReadyException")
    result.add(3.5, 5.0, "wine", None, 0, "ConnectionRefusedError")
    result.drop(2.5, "iris")
    result.lag_ms.extend([0.1] * 99 + [50.0])
    result.replicas.extend([(0.0, {"iris": 1, "wine": 1}), (2.0, {"iris": 2, "wine": 1})])
    return result


def test_report_totals_latency_series_and_replicas() -> None:
    built = report.build_report(
        "direct", {"load_mode": "open", "rate": 10, "endpoint_url": "u"}, synthetic(), 4.0
    )
    totals = built["totals"]
    assert totals == {
        "requests": 102,
        "ok": 100,
        "failures": 2,
        "answered": 101,
        "dropped": 1,
        "unfinished": 0,
        "failures_by_status": {"429": 1, "no answer": 1},
        "failures_by_code": {"ModelNotReadyException": 1, "ConnectionRefusedError": 1},
    }
    assert built["latency_ms"] == {
        "p50": 50.0,
        "p90": 90.0,
        "p99": 99.0,
        "max": 100.0,
        "mean": 50.5,
    }
    assert built["throughput_rps"] == {"requests": 25.5, "ok": 25.0, "window_s": 4.0}
    assert (
        built["per_target"]["iris"]["requests"] == 51
        and built["per_target"]["iris"]["dropped"] == 1
    )
    series = built["timeseries"]
    assert [row["requests"] for row in series] == [26, 25, 25, 26] and [
        row["level"] for row in series
    ] == [
        10,
        10,
        20,
        20,
    ]
    assert (
        series[0]["errors_by_code"] == {"ModelNotReadyException": 1} and series[2]["dropped"] == 1
    )
    assert series[0]["p50"] == 13.0  # ok latencies 1..25 in the first second
    assert built["replicas"]["containers"] == {
        "iris": [[0.0, 1], [2.0, 2]],
        "wine": [[0.0, 1], [2.0, 1]],
    }
    assert built["generator"]["lag_ms"]["p99"] == 0.1 and built["generator"]["warning"] is None
    assert built["start"].startswith("2023-11-14T22:13:20")
    json.dumps(built, allow_nan=False)


def test_report_baseline_ratios_and_metrics_check() -> None:
    base = synthetic()
    base.samples = [s._replace(latency_ms=s.latency_ms / 2) for s in base.samples]
    check = report.metrics_check(10.0, 111.0, 101)
    built = report.build_report(
        "direct",
        {"load_mode": "closed", "users": 4, "endpoint_url": "u"},
        synthetic(),
        4.0,
        baseline=base,
        baseline_url="http://floor/invocations",
        metrics_check=check,
    )
    assert built["ratios"] == {"p50": 2.0, "p99": 2.0, "throughput": 1.0}
    assert built["baseline"]["url"] == "http://floor/invocations"
    assert built["metrics_check"]["difference"] == 101 and built["metrics_check"]["matches"] is True
    table = report.summary_table(built)
    assert "ModelNotReadyException 1" in table and "p50 2.0x" in table and "matches" in table
    assert report.metrics_check(None, None, 5, "GET /metrics answered 404")["matches"] is None


def test_empty_run_and_late_generator() -> None:
    empty = RunResult("main", started_at=1.0, ended_at=2.0, levels=[5.0])
    built = report.build_report(
        "serial", {"load_mode": "open", "rate": 5, "endpoint_url": "u"}, empty, 1.0
    )
    assert built["latency_ms"]["p50"] is None and built["timeseries"][0]["requests"] == 0
    assert report.percentiles([]) == {
        "p50": None,
        "p90": None,
        "p99": None,
        "max": None,
        "mean": None,
    }
    late = synthetic()
    late.lag_ms = [30.0] * 10
    assert "late" in report.summarize(late, 4.0)["generator"]["warning"]


def test_html_report_is_self_contained(tmp_path) -> None:
    built = report.build_report(
        "direct", {"load_mode": "open", "rate": 10, "endpoint_url": "u"}, synthetic(), 4.0
    )
    paths = report.write_report(built, tmp_path)
    assert json.loads(paths[0].read_text())["totals"]["requests"] == 102
    page = paths[1].read_text()
    assert page.count("data:image/png;base64,") == 4 and "http" not in page.split("<body>")[0]


def test_nothing_here_imports_locust() -> None:
    assert "locust" not in sys.modules  # it would have monkey-patched the test process with gevent
