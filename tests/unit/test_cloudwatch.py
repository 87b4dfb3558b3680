"""CloudWatch's API over the runtime's metrics (issue 45, item 1): real boto3 `cloudwatch` clients
against the control-plane API on a loopback server (`sagemaker_harness`), fed with metric families
that prometheus_client writes and parses as `GET /metrics` does. What is faked: the Deployer (as in
every API unit test) and the time at which the sampler records an interval (a test calls `observe`
itself rather than waiting 10 s per interval). The sampler fed by a real server's `/metrics` runs in
tests/integration/test_cloudwatch.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.cloudwatch.alarms import evaluate
from serving.cloudwatch.statistics import Stat
from serving.metrics.invocations import LATENCY_BUCKETS
from tests.unit.sagemaker_harness import KEY, READER_KEY, READER_SECRET, SECRET, Harness, refused

NS = "AWS/SageMaker"
REPLICA_SIDE = {"serving_model_latency_seconds", "serving_cpu_utilization_percent"}
# a RESOLUTION_S boundary, far from the harness's real clock on purpose: no wall-time race
START = 1_800_000_000.0


class Metrics:
    """The families `GET /metrics` merges, written by prometheus_client as the gateway and replicas
    write them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("endpoint", "container", "model")
        self.calls = Counter("serving_invocations", "", labels, registry=self.registry)
        self.errors_4xx = Counter(
            "serving_invocation_4xx_errors", "", labels, registry=self.registry
        )
        self.errors_5xx = Counter(
            "serving_invocation_5xx_errors", "", labels, registry=self.registry
        )
        self.latency = Histogram(
            "serving_model_latency_seconds",
            "",
            ("endpoint", "container", "replica"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cpu = Gauge(
            "serving_cpu_utilization_percent",
            "",
            ("endpoint", "container", "replica"),
            registry=self.registry,
        )

    def families(self) -> list[Any]:
        return list(text_string_to_metric_families(generate_latest(self.registry).decode()))


class World:
    """A harness, its CloudWatch client, and the metrics its sampler reads."""

    def __init__(self, harness: Harness) -> None:
        self.harness, self.metrics, self.at = harness, Metrics(), START
        self.cw = harness.client("cloudwatch")
        self.api = harness.control.cloudwatch
        self.tick()  # the first reading is the baseline

    def serve(self, name: str, *containers: str, mode: str = "Direct", replicas: int = 1) -> None:
        self.harness.deployer.served[name] = {
            "EndpointName": name,
            "InferenceExecutionConfig": {"Mode": mode},
            "Containers": [
                {"ContainerHostname": c, "CurrentReplicas": replicas} for c in containers
            ],
        }

    def tick(self, nodes: bool = True) -> bool:
        """One RESOLUTION_S interval ends: the sampler reads the metrics and the alarms are
        evaluated. Without `nodes`, the replica-side families are not read this time (as an idle
        control plane skips the agents)."""
        self.at += 10
        families = [f for f in self.metrics.families() if nodes or f.name not in REPLICA_SIDE]
        return self.api.observe(families, self.at + 0.2)

    def stats(
        self,
        metric: str,
        statistics: tuple[str, ...] = ("Sum",),
        period: int = 60,
        **dimensions: str,
    ) -> list:
        answer = self.cw.get_metric_statistics(
            Namespace=NS,
            MetricName=metric,
            Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
            StartTime=START - 3600,
            EndTime=self.at + 60,
            Period=period,
            Statistics=list(statistics),
        )
        return sorted(answer["Datapoints"], key=lambda point: point["Timestamp"])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    harness = Harness(tmp_path)
    try:
        yield World(harness)
    finally:
        harness.stop()


def test_invocations_sum_to_the_calls_counted_per_variant_and_container(world: World) -> None:
    world.serve("e1@A@1", "only")
    world.serve("mce", "first", "second")
    world.serve("chain", "a", "b", mode="Serial")
    world.metrics.calls.labels("e1@A@1", "only", "").inc(7)
    world.metrics.calls.labels("mce", "first", "").inc(3)
    world.metrics.calls.labels("mce", "second", "").inc(4)
    # named no container: the endpoint's, no container's
    world.metrics.calls.labels("mce", "", "").inc(1)
    for container in ("a", "b"):  # a Serial request counts once per container of the chain
        world.metrics.calls.labels("chain", container, "").inc(5)
    world.tick()
    world.metrics.calls.labels("e1@A@1", "only", "").inc(2)
    world.tick()
    assert [p["Sum"] for p in world.stats("Invocations", EndpointName="e1", VariantName="A")] == [
        9.0
    ]
    ten_s = world.stats(
        "Invocations", ("Sum", "SampleCount"), period=10, EndpointName="e1", VariantName="A"
    )
    assert [(p["Sum"], p["SampleCount"]) for p in ten_s] == [(7.0, 7.0), (2.0, 2.0)]
    assert ten_s[1]["Timestamp"].timestamp() - ten_s[0]["Timestamp"].timestamp() == 10
    assert world.stats("Invocations", EndpointName="mce", VariantName="AllTraffic")[0]["Sum"] == 8.0
    per_container = world.stats(
        "Invocations", EndpointName="mce", VariantName="AllTraffic", ContainerName="second"
    )
    assert per_container[0]["Sum"] == 4.0
    assert (
        world.stats("Invocations", EndpointName="chain", VariantName="AllTraffic")[0]["Sum"] == 5.0
    )
    # One container: no ContainerName series, as SageMaker has none for a single-container endpoint.
    assert (
        world.stats("Invocations", EndpointName="e1", VariantName="A", ContainerName="only") == []
    )
    listed = world.cw.list_metrics(
        Namespace=NS,
        MetricName="Invocations",
        Dimensions=[{"Name": "EndpointName", "Value": "mce"}],
    )["Metrics"]
    assert sorted(len(metric["Dimensions"]) for metric in listed) == [2, 3, 3]


def test_error_averages_are_error_rates_and_a_restarted_counter_is_not_negative(
    world: World,
) -> None:
    world.serve("e1@A@1", "only")
    world.metrics.calls.labels("e1@A@1", "only", "").inc(8)
    world.metrics.errors_5xx.labels("e1@A@1", "only", "").inc(2)
    world.tick()
    point = world.stats(
        "Invocation5XXErrors", ("Sum", "Average", "SampleCount"), EndpointName="e1", VariantName="A"
    )[0]
    assert (point["Sum"], point["Average"], point["SampleCount"]) == (2.0, 0.25, 8.0)
    world.metrics = Metrics()  # a gateway restarted: its counters start again from 0
    world.metrics.calls.labels("e1@A@1", "only", "").inc(3)
    world.tick()
    assert [
        p["Sum"] for p in world.stats("Invocations", period=10, EndpointName="e1", VariantName="A")
    ] == [8, 3]


def test_model_latency_is_in_microseconds_with_percentiles_from_the_buckets(world: World) -> None:
    world.serve("e1@A@1", "only")
    seconds = [0.002] * 90 + [0.2] * 10
    for value in seconds:
        world.metrics.latency.labels("e1@A@1", "only", "r1").observe(value)
    world.tick()
    answer = world.cw.get_metric_statistics(
        Namespace=NS,
        MetricName="ModelLatency",
        StartTime=START,
        EndTime=world.at,
        Period=60,
        Dimensions=[{"Name": "EndpointName", "Value": "e1"}, {"Name": "VariantName", "Value": "A"}],
        Statistics=["Average", "Minimum", "Maximum"],
        ExtendedStatistics=["p50", "p99"],
    )
    point = answer["Datapoints"][0]
    assert point["Unit"] == "Microseconds"
    assert math.isclose(point["Average"], sum(seconds) / len(seconds) * 1e6)
    assert 1000 <= point["ExtendedStatistics"]["p50"] <= 2500  # the bucket (1 ms, 2.5 ms]
    assert 100_000 <= point["ExtendedStatistics"]["p99"] <= 250_000
    assert (point["Minimum"], point["Maximum"]) == (1000.0, 250_000.0)  # bounds of the buckets hit


def test_replica_metrics_read_less_often_are_counted_once_when_read(world: World) -> None:
    world.serve("e1@A@1", "only")
    for _ in range(4):  # before the last full reading: counted in it, and never again
        world.metrics.latency.labels("e1@A@1", "only", "r1").observe(0.002)
    assert world.tick() is False  # nothing invoked: the control plane may skip the nodes next time
    for _ in range(3):  # calls in three intervals whose readings lack the replica side
        world.metrics.calls.labels("e1@A@1", "only", "").inc(2)
        world.metrics.latency.labels("e1@A@1", "only", "r1").observe(0.002)
        world.metrics.latency.labels("e1@A@1", "only", "r1").observe(0.002)
        assert world.tick(nodes=False) is True
    world.tick()
    world.tick()  # read again with nothing new: nothing counted twice
    counts = world.stats(
        "ModelLatency", ("SampleCount",), period=10, EndpointName="e1", VariantName="A"
    )
    assert [point["SampleCount"] for point in counts] == [4.0, 6.0]
    assert [
        p["Sum"] for p in world.stats("Invocations", period=10, EndpointName="e1", VariantName="A")
    ] == [2, 2, 2]


def test_utilization_is_filed_where_sagemaker_files_it(world: World) -> None:
    world.serve("e1@A@1", "only", replicas=2)
    world.metrics.cpu.labels("e1@A@1", "only", "r1").set(30)
    world.metrics.cpu.labels("e1@A@1", "only", "r2").set(90)
    world.tick()
    for namespace in ("/aws/sagemaker/Endpoints", NS):
        point = world.cw.get_metric_statistics(
            Namespace=namespace,
            MetricName="CPUUtilization",
            StartTime=START,
            EndTime=world.at,
            Period=10,
            Dimensions=[
                {"Name": "EndpointName", "Value": "e1"},
                {"Name": "VariantName", "Value": "A"},
            ],
            Statistics=["Average", "Maximum"],
        )["Datapoints"][0]
        assert (point["Average"], point["Maximum"], point["Unit"]) == (60.0, 90.0, "Percent")


def test_get_metric_data_answers_several_queries(world: World) -> None:
    world.serve("e1@A@1", "only")
    world.metrics.calls.labels("e1@A@1", "only", "").inc(4)
    world.metrics.errors_4xx.labels("e1@A@1", "only", "").inc(1)
    world.tick()
    dimensions = [{"Name": "EndpointName", "Value": "e1"}, {"Name": "VariantName", "Value": "A"}]
    answer = world.cw.get_metric_data(
        StartTime=START,
        EndTime=world.at + 60,
        MetricDataQueries=[
            {
                "Id": "calls",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NS,
                        "MetricName": "Invocations",
                        "Dimensions": dimensions,
                    },
                    "Period": 60,
                    "Stat": "Sum",
                },
            },
            {
                "Id": "rate",
                "Label": "4xx rate",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NS,
                        "MetricName": "Invocation4XXErrors",
                        "Dimensions": dimensions,
                    },
                    "Period": 60,
                    "Stat": "Average",
                },
            },
        ],
    )
    results = {result["Id"]: result for result in answer["MetricDataResults"]}
    assert results["calls"]["Values"] == [4.0] and results["calls"]["StatusCode"] == "Complete"
    assert (results["rate"]["Label"], results["rate"]["Values"]) == ("4xx rate", [0.25])


def test_an_alarm_goes_to_alarm_and_back_with_its_history(world: World) -> None:
    world.serve("e1@A@1", "only")
    world.cw.put_metric_alarm(
        AlarmName="e1-5xx",
        Namespace=NS,
        MetricName="Invocation5XXErrors",
        Statistic="Sum",
        Period=10,
        EvaluationPeriods=3,
        DatapointsToAlarm=2,
        Threshold=0,
        ComparisonOperator="GreaterThanThreshold",
        TreatMissingData="notBreaching",
        AlarmActions=["arn:aws:sns:us-east-1:000000000000:pager"],
        Dimensions=[{"Name": "EndpointName", "Value": "e1"}, {"Name": "VariantName", "Value": "A"}],
    )
    state = lambda: world.cw.describe_alarms(AlarmNames=["e1-5xx"])["MetricAlarms"][0]  # noqa: E731
    assert state()["StateValue"] == "INSUFFICIENT_DATA"
    world.tick()  # no data, treated as not breaching
    assert state()["StateValue"] == "OK"
    for _ in range(2):
        world.metrics.calls.labels("e1@A@1", "only", "").inc(5)
        world.metrics.errors_5xx.labels("e1@A@1", "only", "").inc(1)
        world.tick()
        first = state()
    assert first["StateValue"] == "ALARM", first["StateReason"]
    assert (
        "2 out of the last 3 datapoints" in first["StateReason"]
        and "greater than" in first["StateReason"]
    )
    assert json.loads(first["StateReasonData"])["recentDatapoints"] == [1.0, 1.0]
    assert first["AlarmActions"] == ["arn:aws:sns:us-east-1:000000000000:pager"]
    for _ in range(2):  # healthy calls push the errors out of the window
        world.metrics.calls.labels("e1@A@1", "only", "").inc(5)
        world.tick()
    assert state()["StateValue"] == "OK"
    summaries = [
        item["HistorySummary"]
        for item in world.cw.describe_alarm_history(
            AlarmName="e1-5xx", HistoryItemType="StateUpdate", ScanBy="TimestampAscending"
        )["AlarmHistoryItems"]
    ]
    assert summaries == [
        "Alarm updated from INSUFFICIENT_DATA to OK",
        "Alarm updated from OK to ALARM",
        "Alarm updated from ALARM to OK",
    ]
    world.cw.set_alarm_state(
        AlarmName="e1-5xx", StateValue="ALARM", StateReason="testing the pager"
    )
    assert (state()["StateValue"], state()["StateReason"]) == ("ALARM", "testing the pager")
    world.tick()  # the next evaluation puts it back, as CloudWatch's does
    assert state()["StateValue"] == "OK"
    assert world.cw.describe_alarms(StateValue="ALARM")["MetricAlarms"] == []
    world.cw.delete_alarms(AlarmNames=["e1-5xx", "never-was"])
    assert world.cw.describe_alarms()["MetricAlarms"] == []
    refused(
        lambda: world.cw.set_alarm_state(AlarmName="e1-5xx", StateValue="OK", StateReason="x"),
        "ResourceNotFound",
        "e1-5xx",
    )


@pytest.mark.parametrize(
    ("treatment", "expected"),
    [
        ("missing", "INSUFFICIENT_DATA"),
        ("ignore", "OK"),
        ("breaching", "ALARM"),
        ("notBreaching", "OK"),
    ],
)
def test_missing_data_is_treated_as_the_alarm_says(treatment: str, expected: str) -> None:
    alarm = {
        "Statistic": "Sum",
        "ComparisonOperator": "GreaterThanThreshold",
        "Threshold": 1,
        "Period": 60,
        "EvaluationPeriods": 3,
        "DatapointsToAlarm": 2,
        "TreatMissingData": treatment,
        "StateValue": "OK",
    }
    assert evaluate(alarm, [None, None, None], START)[0] == expected
    one_breach = [Stat(1, 5, 5, 5), None, None]
    assert evaluate(alarm, one_breach, START)[0] == ("ALARM" if treatment == "breaching" else "OK")


def test_what_cloudwatch_would_refuse_is_refused_naming_the_field(world: World) -> None:
    alarm = {
        "AlarmName": "a",
        "Namespace": NS,
        "MetricName": "Invocations",
        "Statistic": "Sum",
        "Period": 60,
        "EvaluationPeriods": 1,
        "Threshold": 1,
        "ComparisonOperator": "GreaterThanThreshold",
    }
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "Namespace": "MyApp"}),
        "InvalidParameterValue",
        "'MyApp'",
        "out of scope",
    )
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "MetricName": "Invocationz"}),
        "InvalidParameterValue",
        "Invocationz",
    )
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "Period": 45}),
        "InvalidParameterValue",
        "Period 45",
    )
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "Period": 3600, "EvaluationPeriods": 4}),
        "InvalidParameterValue",
        "EvaluationPeriods 4",
    )
    refused(
        lambda: world.cw.put_metric_alarm(
            **{**alarm, "EvaluationPeriods": 1, "DatapointsToAlarm": 2}
        ),
        "InvalidParameterValue",
        "DatapointsToAlarm",
    )
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "ExtendedStatistic": "p99"}),
        "InvalidParameterCombination",
        "exactly one of Statistic and ExtendedStatistic",
    )
    refused(
        lambda: world.cw.put_metric_alarm(
            **{**alarm, "ComparisonOperator": "LessThanLowerThreshold"}
        ),
        "InvalidParameterValue",
        "ComparisonOperator",
    )
    refused(
        lambda: world.cw.put_metric_alarm(**{**alarm, "ThresholdMetricId": "m1"}),
        "InvalidParameterValue",
        "ThresholdMetricId is not supported",
    )
    refused(
        lambda: world.cw.get_metric_data(
            StartTime=START,
            EndTime=START + 60,
            MetricDataQueries=[{"Id": "m", "Expression": "SUM(METRICS())"}],
        ),
        "InvalidParameterValue",
        "Expression is not supported",
    )
    refused(
        lambda: world.cw.get_metric_statistics(
            Namespace=NS,
            MetricName="Invocations",
            StartTime=START,
            EndTime=START + 86400,
            Period=10,
            Statistics=["Sum"],
        ),
        "InvalidParameterCombination",
        "8640 datapoints",
        "limit of 1440",
    )
    refused(
        lambda: world.cw.list_metrics(Namespace="Custom/Thing"),
        "InvalidParameterValue",
        "Custom/Thing",
    )
    refused(lambda: world.cw.describe_alarms(NextToken="forged"), "InvalidNextToken")
    world.cw.put_metric_alarm(**alarm)
    refused(
        lambda: world.cw.set_alarm_state(
            AlarmName="a", StateValue="OK", StateReason="r", StateReasonData="{x"
        ),
        "InvalidFormat",
        "StateReasonData must be JSON",
    )
    world.cw.delete_alarms(AlarmNames=["a"])
    # PutMetricData is not an operation here: metrics of one's own are out of scope, refused by
    # name.
    refused(
        lambda: world.cw.put_metric_data(
            Namespace="Mine", MetricData=[{"MetricName": "x", "Value": 1}]
        ),
        "UnknownOperationException",
        "PutMetricData",
    )
    world.tick()  # and the server still samples and answers
    assert world.cw.describe_alarms()["MetricAlarms"] == []


def test_signed_calls_need_cloudwatch_actions_on_the_alarm(tmp_path: Path) -> None:
    (tmp_path / "ops.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["cloudwatch:PutMetricAlarm", "cloudwatch:Describe*"],
                        "Resource": "arn:aws:cloudwatch:*:*:alarm:team-*",
                    },
                    # An alarm reads its metric, so putting one needs this too
                    # (tests/security/test_sec_api_resources.py).
                    {
                        "Effect": "Allow",
                        "Action": "cloudwatch:GetMetricStatistics",
                        "Resource": "*",
                    },
                ],
            }
        )
    )
    (tmp_path / "sagemaker.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "sagemaker:*", "Resource": "*"}],
            }
        )
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "ops",
                        "AccessKeyId": KEY,
                        "SecretAccessKey": SECRET,
                        "PolicyDocuments": ["ops.json"],
                    },
                    {
                        "Principal": "reader",
                        "AccessKeyId": READER_KEY,
                        "SecretAccessKey": READER_SECRET,
                        "PolicyDocuments": ["sagemaker.json"],
                    },
                ]
            }
        )
    )
    harness = Harness(tmp_path, api_identities=str(tmp_path / "identities.yaml"))
    try:
        cw = harness.client("cloudwatch")  # signs for `monitoring`, CloudWatch's signing name
        alarm = {
            "Namespace": NS,
            "MetricName": "Invocations",
            "Statistic": "Sum",
            "Period": 60,
            "EvaluationPeriods": 1,
            "Threshold": 1,
            "ComparisonOperator": "GreaterThanThreshold",
        }
        cw.put_metric_alarm(AlarmName="team-a", **alarm)
        refused(
            lambda: cw.put_metric_alarm(AlarmName="other", **alarm),
            "AccessDeniedException",
            "cloudwatch:PutMetricAlarm",
            "arn:aws:cloudwatch:us-east-1:000000000000:alarm:other",
        )
        assert [
            a["AlarmName"] for a in cw.describe_alarms(AlarmNames=["team-a"])["MetricAlarms"]
        ] == ["team-a"]
        refused(
            lambda: cw.delete_alarms(AlarmNames=["team-a"]),
            "AccessDeniedException",
            "cloudwatch:DeleteAlarms",
        )
        query = {
            "Id": "q",
            "MetricStat": {
                "Metric": {"Namespace": NS, "MetricName": "Invocations"},
                "Period": 60,
                "Stat": "Sum",
            },
        }
        refused(
            lambda: cw.get_metric_data(
                StartTime=START, EndTime=START + 60, MetricDataQueries=[query]
            ),
            "AccessDeniedException",
            "cloudwatch:GetMetricData",
            "arn:aws:cloudwatch:us-east-1:000000000000:*",
        )
        reader = harness.client("cloudwatch", READER_KEY, READER_SECRET)
        refused(lambda: reader.describe_alarms(AlarmNames=["team-a"]), "AccessDeniedException")
        refused(
            lambda: harness.client(
                "cloudwatch", KEY, "not-the-secret-of-ops-at-all"
            ).describe_alarms(),
            "InvalidSignatureException",
        )
    finally:
        harness.stop()
