"""Every resource a control-plane call names is authorized, not only the first (issue 56, findings 4
and 5).

Before the fix a call was authorized on the first of `EndpointName`, `EndpointConfigName`,
`ModelName` it held. A principal with rights on `t-*` only created `CreateEndpointConfig t-cfg`
naming team A's model (as a production or a shadow variant), or `CreateEndpoint t-ep` from team A's
config, and so served team A's model (its code and sealed Environment) under its own access control
and data capture. And an alarm was authorized on its name only: the same principal watched team A's
endpoint with `PutMetricAlarm t-watch` and read its counts in DescribeAlarms' `StateReason` /
`StateReasonData`, though `GetMetricStatistics` was refused to it.

The real API routes (authentication, authorization, dispatch) on a loopback server, driven by boto3,
over the faked Deployer of tests/unit/sagemaker_harness.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.sagemaker_harness import KEY, READER_KEY, READER_SECRET, SECRET, Harness, refused

ACCOUNT = "arn:aws:sagemaker:us-east-1:000000000000"
ALARMS = "arn:aws:cloudwatch:us-east-1:000000000000"
# a 10 s boundary of the metric store, far from the harness's clock on purpose
START = 1_800_000_000.0
ROLLBACK = {
    "BlueGreenUpdatePolicy": {
        "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}
    },
}


def _policy(team: str, *cloudwatch: dict[str, Any]) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": f"Team{team.upper()}",
                    "Effect": "Allow",
                    "Action": "sagemaker:*",
                    "Resource": [
                        f"arn:aws:sagemaker:*:*:model/{team}-*",
                        f"arn:aws:sagemaker:*:*:endpoint-config/{team}-*",
                        f"arn:aws:sagemaker:*:*:endpoint/{team}-*",
                    ],
                },
                *cloudwatch,
            ],
        }
    )


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    # Team A may do anything to a-* and read every metric; team T (the intruder) anything to t-*,
    # and alarms t-*.
    (tmp_path / "team-a.json").write_text(
        _policy("a", {"Effect": "Allow", "Action": "cloudwatch:*", "Resource": "*"})
    )
    (tmp_path / "team-t.json").write_text(
        _policy(
            "t",
            {
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricAlarm", "cloudwatch:DescribeAlarms"],
                "Resource": "arn:aws:cloudwatch:*:*:alarm:t-*",
            },
        )
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "team-a",
                        "AccessKeyId": KEY,
                        "SecretAccessKey": SECRET,
                        "PolicyDocuments": ["team-a.json"],
                    },
                    {
                        "Principal": "team-t",
                        "AccessKeyId": READER_KEY,
                        "SecretAccessKey": READER_SECRET,
                        "PolicyDocuments": ["team-t.json"],
                    },
                ]
            }
        )
    )
    running = Harness(tmp_path, api_identities=str(tmp_path / "identities.yaml"))
    yield running
    running.stop()


def _variant(model: str, name: str = "A") -> dict[str, Any]:
    return {
        "VariantName": name,
        "ModelName": model,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }


def _in_service(harness: Harness, sm: Any, endpoint: str, config: str) -> None:
    sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config)
    harness.deployer.ready(f"{endpoint}@A@1")
    harness.api.tick()
    assert sm.describe_endpoint(EndpointName=endpoint)["EndpointStatus"] == "InService"


def _alarm(name: str, endpoint: str) -> dict[str, Any]:
    return {
        "AlarmName": name,
        "Namespace": "AWS/SageMaker",
        "MetricName": "Invocations",
        "Statistic": "Sum",
        "Dimensions": [
            {"Name": "EndpointName", "Value": endpoint},
            {"Name": "VariantName", "Value": "A"},
        ],
        "Period": 10,
        "EvaluationPeriods": 1,
        "Threshold": 0,
        "ComparisonOperator": "GreaterThanThreshold",
    }


def test_an_endpoint_config_may_name_only_models_its_caller_may_use(harness: Harness) -> None:
    harness.model("a-model")  # team A's, with its code and Environment
    intruder = harness.client(key=READER_KEY, secret=READER_SECRET)
    intruder.create_model(
        ModelName="t-model",
        PrimaryContainer={"Image": "sklearn", "ModelDataUrl": str(harness.models / "iris")},
    )
    refused(
        lambda: intruder.create_endpoint_config(
            EndpointConfigName="t-cfg", ProductionVariants=[_variant("a-model")]
        ),
        "AccessDeniedException",
        "User: team-t",
        "sagemaker:CreateEndpointConfig",
        f"on resource: {ACCOUNT}:model/a-model ",
    )  # before: created, and t-ep from it served team A's model
    refused(
        lambda: intruder.create_endpoint_config(
            EndpointConfigName="t-cfg",
            ProductionVariants=[_variant("t-model")],
            ShadowProductionVariants=[_variant("a-model", "shadow")],
        ),
        "AccessDeniedException",
        "sagemaker:CreateEndpointConfig",
        f"{ACCOUNT}:model/a-model ",
    )
    assert [c["EndpointConfigName"] for c in harness.api.state.all("endpoint-config")] == []


def test_an_endpoint_may_be_created_or_updated_only_from_configs_its_caller_may_use(
    harness: Harness,
) -> None:
    harness.model("a-model")  # harness.sm and harness.client() sign as team A
    harness.config("a-cfg", ("A", "a-model"))
    harness.client("cloudwatch").put_metric_alarm(**_alarm("a-alarm", "a-ep"))
    intruder = harness.client(key=READER_KEY, secret=READER_SECRET)
    refused(
        lambda: intruder.create_endpoint(EndpointName="t-ep", EndpointConfigName="a-cfg"),
        "AccessDeniedException",
        "sagemaker:CreateEndpoint",
        f"on resource: {ACCOUNT}:endpoint-config/a-cfg ",
    )
    # The intruder's own endpoint, from its own config: then an update to team A's config is refused
    # too.
    intruder.create_model(
        ModelName="t-model",
        PrimaryContainer={"Image": "sklearn", "ModelDataUrl": str(harness.models / "iris")},
    )
    intruder.create_endpoint_config(
        EndpointConfigName="t-cfg", ProductionVariants=[_variant("t-model")]
    )
    intruder.create_endpoint_config(
        EndpointConfigName="t-cfg2", ProductionVariants=[_variant("t-model")]
    )
    _in_service(harness, intruder, "t-ep", "t-cfg")
    refused(
        lambda: intruder.update_endpoint(EndpointName="t-ep", EndpointConfigName="a-cfg"),
        "AccessDeniedException",
        "sagemaker:UpdateEndpoint",
        f"{ACCOUNT}:endpoint-config/a-cfg ",
    )
    # A DeploymentConfig's rollback alarms are read by the update: they need
    # cloudwatch:DescribeAlarms.
    refused(
        lambda: intruder.update_endpoint(
            EndpointName="t-ep",
            EndpointConfigName="t-cfg2",
            DeploymentConfig={
                **ROLLBACK,
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "a-alarm"}]},
            },
        ),
        "AccessDeniedException",
        "cloudwatch:DescribeAlarms",
        f"on resource: {ALARMS}:alarm:a-alarm ",
    )
    refused(
        lambda: intruder.create_endpoint(
            EndpointName="t-ep2",
            EndpointConfigName="t-cfg",
            DeploymentConfig={
                **ROLLBACK,
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "a-alarm"}]},
            },
        ),
        "AccessDeniedException",
        "cloudwatch:DescribeAlarms",
        f"{ALARMS}:alarm:a-alarm ",
    )
    described = intruder.describe_endpoint(EndpointName="t-ep")
    assert (
        described["EndpointConfigName"] == "t-cfg" and "PendingDeploymentSummary" not in described
    )
    assert [e["EndpointName"] for e in harness.api.state.all("endpoint")] == ["t-ep"]


def test_a_caller_allowed_on_every_resource_named_still_succeeds(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    team_a = harness.sm
    harness.model("a-model")
    harness.model("a-shadow")
    team_a.create_endpoint_config(
        EndpointConfigName="a-cfg",
        ProductionVariants=[_variant("a-model")],
        ShadowProductionVariants=[_variant("a-shadow", "shadow")],
    )
    team_a.create_endpoint_config(
        EndpointConfigName="a-cfg2", ProductionVariants=[_variant("a-model")]
    )
    harness.client("cloudwatch").put_metric_alarm(**_alarm("a-alarm", "a-ep"))
    with caplog.at_level(logging.INFO, logger="serving.audit"):
        team_a.create_endpoint(EndpointName="a-ep", EndpointConfigName="a-cfg")
    decisions = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "serving.audit"
    ]
    assert [(d["action"], d["resource"], d["decision"]) for d in decisions] == [
        ("sagemaker:CreateEndpoint", f"{ACCOUNT}:endpoint/a-ep", "allow"),
        ("sagemaker:CreateEndpoint", f"{ACCOUNT}:endpoint-config/a-cfg", "allow"),
    ]
    harness.deployer.ready("a-ep@A@1", "a-ep@shadow@1")
    harness.api.tick()
    team_a.update_endpoint(
        EndpointName="a-ep",
        EndpointConfigName="a-cfg2",
        DeploymentConfig={
            **ROLLBACK,
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "a-alarm"}]},
        },
    )
    assert (
        team_a.describe_endpoint(EndpointName="a-ep")["PendingDeploymentSummary"][
            "EndpointConfigName"
        ]
        == "a-cfg2"
    )


class _Invocations:
    """The one family the sampler needs here, written by prometheus_client as `GET /metrics` writes
    it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "serving_invocations", "", ("endpoint", "container", "model"), registry=self.registry
        )

    def families(self) -> list[Any]:
        return list(text_string_to_metric_families(generate_latest(self.registry).decode()))


def test_an_alarm_cannot_read_a_metric_its_caller_may_not(harness: Harness) -> None:
    harness.deployer.served["a-ep@A@1"] = {  # team A's endpoint, serving
        "EndpointName": "a-ep@A@1",
        "InferenceExecutionConfig": {"Mode": "Direct"},
        "Containers": [{"ContainerHostname": "only", "CurrentReplicas": 1}],
    }
    intruder = harness.client("cloudwatch", READER_KEY, READER_SECRET)
    refused(
        lambda: intruder.put_metric_alarm(**_alarm("t-watch", "a-ep")),
        "AccessDeniedException",
        "User: team-t",
        "cloudwatch:GetMetricStatistics",
        f"on resource: {ALARMS}:* ",
    )  # before: created
    # An alarm the intruder may describe but whose metric it may not read (one put before this fix,
    # or by an operator): DescribeAlarms shows its state, not its datapoints.
    operator = harness.client("cloudwatch")
    operator.put_metric_alarm(**_alarm("t-legacy", "a-ep"))
    metrics, cloudwatch = _Invocations(), harness.control.cloudwatch
    cloudwatch.observe(metrics.families(), START + 0.2)  # the baseline
    metrics.calls.labels("a-ep@A@1", "only", "").inc(7)
    cloudwatch.observe(metrics.families(), START + 10.2)
    seen = operator.describe_alarms(AlarmNames=["t-legacy"])["MetricAlarms"][0]
    assert seen["StateValue"] == "ALARM" and "7.0" in seen["StateReason"]
    assert json.loads(seen["StateReasonData"])["recentDatapoints"] == [7.0]
    shown = intruder.describe_alarms(AlarmNames=["t-legacy"])["MetricAlarms"][0]
    assert shown["AlarmName"] == "t-legacy" and shown["StateValue"] == "ALARM"
    assert "7.0" not in shown["StateReason"] and "withheld" in shown["StateReason"]
    assert "StateReasonData" not in shown  # before: '{"recentDatapoints": [7.0], ...}'
