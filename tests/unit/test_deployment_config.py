"""UpdateEndpoint's DeploymentConfig (issue 45, item 2) through the real boto3 `sagemaker` and
`cloudwatch` clients over real HTTP: canary, linear and rolling traffic shifting, baking,
termination wait, and rollback on an alarm or a timeout. The Deployer is faked
(tests/unit/sagemaker_harness.py), so a test says when the new fleet is InService and moves the
API's clock itself; real Ray Serve under load runs in tests/integration/test_sagemaker_api.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.gateway.variants import Front, VariantRoute
from tests.unit.sagemaker_harness import Harness, refused

NS = "AWS/SageMaker"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path)
    running.model("m1")
    running.model("m2")
    running.config("c1", ("A", "m1"), count=2)
    running.config("c2", ("A", "m2"), count=2)
    running.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    running.deployer.ready("e1@A@1")
    running.api.tick()
    assert running.status("e1") == "InService"
    yield running
    running.stop()


def canary(size: dict[str, Any], wait: int = 60, **policy: Any) -> dict[str, Any]:
    routing = {"Type": "CANARY", "CanarySize": size, "WaitIntervalInSeconds": wait}
    return {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing, **policy}}


def shares(harness: Harness) -> dict[str, float]:
    """Each served fleet's share of e1's traffic, as the gateways route it."""
    variants = harness.deployer.routes("e1")
    total = sum(weight for _, _, weight in variants)
    return {served: round(weight / total, 3) for _, served, weight in variants if weight}


def step(harness: Harness, seconds: float = 0) -> None:
    harness.clock.advance(seconds)
    harness.api.tick()


def alarm(harness: Harness, name: str = "e1-5xx") -> Any:
    cw = harness.client("cloudwatch")
    cw.put_metric_alarm(
        AlarmName=name,
        Namespace=NS,
        MetricName="Invocation5XXErrors",
        Statistic="Sum",
        Period=10,
        EvaluationPeriods=1,
        Threshold=0,
        ComparisonOperator="GreaterThanThreshold",
        Dimensions=[{"Name": "EndpointName", "Value": "e1"}, {"Name": "VariantName", "Value": "A"}],
    )
    return cw


def test_a_canary_bakes_then_takes_all_traffic_and_the_old_fleet_waits_out_its_termination(
    harness: Harness,
) -> None:
    config = canary({"Type": "INSTANCE_COUNT", "Value": 1}, wait=60, TerminationWaitInSeconds=120)
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2", DeploymentConfig=config)
    step(harness)
    assert shares(harness) == {"e1@A@1": 1.0}  # the new fleet is not up yet
    harness.deployer.ready("e1@A@2")
    step(harness)
    assert shares(harness) == {"e1@A@1": 0.5, "e1@A@2": 0.5}  # one instance of two
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "Updating"
    pending = described["PendingDeploymentSummary"]["ProductionVariants"][0]
    assert pending["CurrentWeight"] == 0.5 and pending["VariantStatus"][0]["Status"] == "Baking"
    assert (
        pending["VariantStatus"][0]["StatusMessage"]
        == "step 1 of 2: 50% of traffic on the new fleet"
    )
    assert described["ProductionVariants"][0]["CurrentWeight"] == 0.5
    step(harness, 59)
    assert shares(harness) == {"e1@A@1": 0.5, "e1@A@2": 0.5}  # still baking
    step(harness, 2)
    # the rest, then a last bake before the old fleet retires
    assert shares(harness) == {"e1@A@2": 1.0}
    assert harness.status("e1") == "Updating"
    step(harness, 61)
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "c2")
    assert described["LastDeploymentConfig"] == config
    step(harness, 125)
    assert "e1@A@1" not in harness.deployer.deleted  # TerminationWaitInSeconds plus the drain
    step(harness, 10)
    assert "e1@A@1" in harness.deployer.deleted


def test_an_alarm_in_alarm_while_baking_sends_all_traffic_back_and_fails_the_update(
    harness: Harness,
) -> None:
    cw = alarm(harness)
    harness.sm.update_endpoint(
        EndpointName="e1",
        EndpointConfigName="c2",
        DeploymentConfig={
            **canary({"Type": "CAPACITY_PERCENT", "Value": 25}, wait=600),
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "e1-5xx"}]},
        },
    )
    harness.deployer.ready("e1@A@2")
    step(harness)
    assert shares(harness) == {"e1@A@1": 0.75, "e1@A@2": 0.25}
    step(harness, 30)
    cw.set_alarm_state(
        AlarmName="e1-5xx", StateValue="ALARM", StateReason="the canary's calls fail"
    )
    step(harness)
    assert shares(harness) == {"e1@A@1": 1.0}
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "c1")
    assert (
        "rolled back" in described["FailureReason"]
        and "alarm e1-5xx went to ALARM" in described["FailureReason"]
    )
    assert "step 1 of 2, 25% of traffic on the new fleet" in described["FailureReason"]
    assert "PendingDeploymentSummary" not in described
    assert "e1@A@2" not in harness.deployer.deleted  # requests the canary holds finish first
    step(harness, 11)
    assert "e1@A@2" in harness.deployer.deleted


def test_linear_and_rolling_move_traffic_step_by_step(harness: Harness) -> None:
    linear = {
        "Type": "LINEAR",
        "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 34},
        "WaitIntervalInSeconds": 30,
    }
    harness.sm.update_endpoint(
        EndpointName="e1",
        EndpointConfigName="c2",
        DeploymentConfig={"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": linear}},
    )
    harness.deployer.ready("e1@A@2")
    seen = []
    for _ in range(4):
        step(harness)
        seen.append(shares(harness).get("e1@A@2", 0.0))
        step(harness, 31)
    assert seen == [0.34, 0.68, 1.0, 1.0] and harness.status("e1") == "InService"
    # RollingUpdatePolicy: batches of MaximumBatchSize, each waiting WaitIntervalInSeconds.
    harness.sm.update_endpoint(
        EndpointName="e1",
        EndpointConfigName="c1",
        DeploymentConfig={
            "RollingUpdatePolicy": {
                "MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1},
                "WaitIntervalInSeconds": 20,
            }
        },
    )
    harness.deployer.ready("e1@A@3")
    step(harness)
    assert shares(harness) == {"e1@A@2": 0.5, "e1@A@3": 0.5}
    step(harness, 21)
    assert shares(harness) == {"e1@A@3": 1.0}


def test_a_deployment_past_its_execution_timeout_rolls_back(harness: Harness) -> None:
    config = canary(
        {"Type": "CAPACITY_PERCENT", "Value": 10}, wait=300, MaximumExecutionTimeoutInSeconds=600
    )
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2", DeploymentConfig=config)
    step(harness, 100)  # the new fleet takes 100 s to come up: the waits no longer fit the timeout
    harness.deployer.ready("e1@A@2")
    step(harness)
    step(harness, 301)
    assert shares(harness) == {"e1@A@2": 1.0}
    step(harness, 200)
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (
        described["EndpointConfigName"] == "c1"
        and "MaximumExecutionTimeoutInSeconds" in described["FailureReason"]
    )
    assert shares(harness) == {"e1@A@1": 1.0}


def test_retain_deployment_config_reuses_the_endpoints_last_one(harness: Harness) -> None:
    config = canary({"Type": "CAPACITY_PERCENT", "Value": 20}, wait=10)
    harness.sm.create_endpoint(EndpointName="e2", EndpointConfigName="c1", DeploymentConfig=config)
    harness.deployer.ready("e2@A@1")
    step(harness)
    assert harness.sm.describe_endpoint(EndpointName="e2")["LastDeploymentConfig"] == config
    harness.sm.update_endpoint(
        EndpointName="e2", EndpointConfigName="c2", RetainDeploymentConfig=True
    )
    harness.deployer.ready("e2@A@2")
    step(harness)
    variants = harness.deployer.routes("e2")
    assert sorted(round(weight, 3) for _, _, weight in variants) == [0.2, 0.8]


def test_settings_the_fleet_or_the_server_cannot_honour_are_refused_naming_the_field(
    harness: Harness,
) -> None:
    update = lambda config: harness.sm.update_endpoint(  # noqa: E731
        EndpointName="e1", EndpointConfigName="c2", DeploymentConfig=config
    )
    refused(
        lambda: update(canary({"Type": "INSTANCE_COUNT", "Value": 2})),
        "ValidationException",
        "TrafficRoutingConfiguration.CanarySize: 2 instances is more than 50% of the new fleet's 2",
    )
    refused(
        lambda: update(canary({"Type": "CAPACITY_PERCENT", "Value": 75})),
        "ValidationException",
        "CanarySize: 75% is more than 50%",
    )
    refused(
        lambda: update(
            {
                **canary({"Type": "CAPACITY_PERCENT", "Value": 10}),
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "no-such-alarm"}]},
            }
        ),
        "ValidationException",
        "Alarms[0].AlarmName",
        "no-such-alarm",
    )
    refused(
        lambda: update(
            canary(
                {"Type": "CAPACITY_PERCENT", "Value": 10},
                wait=600,
                MaximumExecutionTimeoutInSeconds=900,
            )
        ),
        "ValidationException",
        "MaximumExecutionTimeoutInSeconds: 900 s is less than the 1200 s",
    )
    linear = {
        "Type": "LINEAR",
        "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 5},
        "WaitIntervalInSeconds": 1,
    }
    refused(
        lambda: update({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": linear}}),
        "ValidationException",
        "LinearStepSize: a step of 5% of the fleet is less than the 10% allowed",
    )
    refused(
        lambda: update(
            {
                "BlueGreenUpdatePolicy": {
                    "TrafficRoutingConfiguration": {"Type": "CANARY", "WaitIntervalInSeconds": 1}
                }
            }
        ),
        "ValidationException",
        "CanarySize is required",
    )
    both = {
        **canary({"Type": "CAPACITY_PERCENT", "Value": 10}),
        "RollingUpdatePolicy": {
            "MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1},
            "WaitIntervalInSeconds": 1,
        },
    }
    refused(
        lambda: update(both),
        "ValidationException",
        "exactly one of BlueGreenUpdatePolicy and RollingUpdatePolicy",
    )
    assert harness.status("e1") == "InService" and not harness.deployer.generations.get("e1@A@2")


def test_a_target_variant_served_by_two_fleets_is_split_by_their_weights() -> None:
    front = Front(
        "e1",
        (
            VariantRoute("A", "e1@A@1", 0.75),
            VariantRoute("A", "e1@A@2", 0.25),
            VariantRoute("B", "e1@B@1", 0.0),
        ),
    )
    draws = random.Random(7)
    picked = [front.pick("A", draws.random).endpoint for _ in range(4000)]
    assert 0.22 < picked.count("e1@A@2") / len(picked) < 0.28
    # a variant named by TargetVariant is served even at weight 0
    assert front.pick("B").endpoint == "e1@B@1"
