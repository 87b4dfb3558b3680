"""UpdateEndpointWeightsAndCapacities and Application Auto Scaling's operations, through the real
boto3 `sagemaker` and `application-autoscaling` clients over real HTTP.

The Deployer under the API is faked (tests/unit/sagemaker_harness.py) because these tests are about
the protocol layer; real Ray Serve under the same API runs in
tests/integration/test_sagemaker_api.py. What a scalable target and its policies become is checked
on the spec the API re-applies: the same endpoint-level AutoScaling block a spec file writes,
decided by the same engine.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sagemaker_harness import DIMENSION, Harness, refused

RESOURCE = "endpoint/e1/variant/A"
INVOCATIONS = {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path)
    running.in_service("e1", "c1", ("A", "B"))
    yield running
    running.stop()


@pytest.fixture
def scaling(harness: Harness) -> Any:
    return harness.client("application-autoscaling")


def register(scaling: Any, low: int, high: int, resource: str = RESOURCE) -> dict[str, Any]:
    return scaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=DIMENSION,
        MinCapacity=low,
        MaxCapacity=high,
    )


def put_policy(
    scaling: Any, name: str, target: float, resource: str = RESOURCE, **metric: Any
) -> dict[str, Any]:
    return scaling.put_scaling_policy(
        PolicyName=name,
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": target,
            "ScaleInCooldown": 60,
            **metric,
        },
    )


def scaling_of(harness: Harness, served: str = "e1@A@1") -> dict[str, Any]:
    return harness.deployer.spec(served)["AutoScaling"]


def applied(harness: Harness) -> list[str]:
    return [spec.EndpointName for spec in harness.deployer.applied]


# --- UpdateEndpointWeightsAndCapacities -----------------------------------------------------------
def test_weights_move_traffic_at_once_without_redeploying(harness: Harness) -> None:
    before = applied(harness)
    harness.sm.update_endpoint_weights_and_capacities(
        EndpointName="e1", DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredWeight": 3.0}]
    )
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 3.0), ("B", "e1@B@1", 1.0)]
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "InService"
    assert [v["CurrentWeight"] for v in described["ProductionVariants"]] == [3.0, 1.0]
    assert applied(harness) == before
    harness.sm.update_endpoint_weights_and_capacities(
        EndpointName="e1", DesiredWeightsAndCapacities=[{"VariantName": "B", "DesiredWeight": 0.0}]
    )
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 3.0), ("B", "e1@B@1", 0.0)]
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredWeight": 0.0}],
        ),
        "ValidationException",
        "cannot all be 0",
    )
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "C", "DesiredWeight": 1.0}],
        ),
        "ValidationException",
        "DesiredWeightsAndCapacities[0].VariantName",
        "A, B",
    )
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 3.0), ("B", "e1@B@1", 0.0)]


def test_a_new_instance_count_re_applies_the_same_served_variant(harness: Harness) -> None:
    harness.sm.update_endpoint_weights_and_capacities(
        EndpointName="e1",
        DesiredWeightsAndCapacities=[{"VariantName": "B", "DesiredInstanceCount": 3}],
    )
    # The same served names (no new generation): A's spec is put again unchanged, B's with the new
    # count.
    assert set(applied(harness)[2:]) == {"e1@A@1", "e1@B@1"}
    assert scaling_of(harness, "e1@B@1") == {"MinCapacity": 3, "MaxCapacity": 3}
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "Updating" and "PendingDeploymentSummary" not in described
    assert [v["DesiredInstanceCount"] for v in described["ProductionVariants"]] == [1, 3]
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 1.0), ("B", "e1@B@1", 1.0)]
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredWeight": 2.0}],
        ),
        "ValidationException",
        "Cannot update in-progress endpoint",
    )
    harness.deployer.ready("e1@B@1")
    harness.api.tick()
    assert harness.status("e1") == "Updating"  # until A's unchanged spec is through too
    harness.deployer.ready("e1@A@1")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "InService"
    assert [v["CurrentInstanceCount"] for v in described["ProductionVariants"]] == [1, 3]
    assert harness.deployer.deleted == []
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredInstanceCount": 0}],
        ),
        "ValidationException",
        "at least 1 instance",
    )
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredInstanceCount": 5}],
        ),
        "ResourceLimitExceeded",
    )


# --- scalable targets and policies ----------------------------------------------------------------
def test_register_refuses_what_this_api_did_not_create(harness: Harness, scaling: Any) -> None:
    refused(
        lambda: register(scaling, 1, 2, "endpoint/nope/variant/A"),
        "ValidationException",
        "no endpoint nope",
    )
    refused(
        lambda: register(scaling, 1, 2, "endpoint/e1/variant/Z"), "ValidationException", "variant Z"
    )
    refused(
        lambda: register(scaling, 3, 2),
        "ValidationException",
        "MinCapacity (3) must not exceed MaxCapacity (2)",
    )
    refused(
        lambda: scaling.register_scalable_target(
            ServiceNamespace="ecs",
            ResourceId="service/cluster/web",
            ScalableDimension="ecs:service:DesiredCount",
            MinCapacity=1,
            MaxCapacity=2,
        ),
        "ValidationException",
        "ServiceNamespace",
    )
    refused(
        lambda: scaling.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=RESOURCE, ScalableDimension=DIMENSION
        ),
        "ValidationException",
        "MinCapacity and MaxCapacity are required",
    )
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert len(applied(harness)) == 2


def test_a_policy_needs_a_registered_target(scaling: Any) -> None:
    refused(
        lambda: put_policy(scaling, "p", 5.0, PredefinedMetricSpecification=INVOCATIONS),
        "ObjectNotFoundException",
        RESOURCE,
    )
    refused(
        lambda: scaling.deregister_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=RESOURCE, ScalableDimension=DIMENSION
        ),
        "ObjectNotFoundException",
    )
    refused(
        lambda: scaling.delete_scaling_policy(
            PolicyName="p",
            ServiceNamespace="sagemaker",
            ResourceId=RESOURCE,
            ScalableDimension=DIMENSION,
        ),
        "ObjectNotFoundException",
        "policy name: p",
    )


def test_targets_and_policies_become_the_variants_autoscaling(
    harness: Harness, scaling: Any
) -> None:
    arn = register(scaling, 2, 4)["ScalableTargetARN"]
    assert (
        arn == f"arn:aws:application-autoscaling:us-east-1:000000000000:scalable-target/{RESOURCE}"
    )
    # no policy yet: the count, within bounds
    assert scaling_of(harness) == {"MinCapacity": 2, "MaxCapacity": 2}
    # the other variant untouched
    assert scaling_of(harness, "e1@B@1") == {"MinCapacity": 1, "MaxCapacity": 1}
    count = len(applied(harness))
    register(scaling, 2, 4)  # the same bounds: nothing to re-apply
    assert len(applied(harness)) == count
    [target] = scaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[RESOURCE]
    )["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"], target["ScalableDimension"]) == (
        2,
        4,
        DIMENSION,
    )
    assert isinstance(target["CreationTime"], datetime.datetime)

    policy_arn = put_policy(
        scaling, "per-instance", 50.0, PredefinedMetricSpecification=INVOCATIONS
    )["PolicyARN"]
    assert policy_arn.startswith("arn:aws:autoscaling:us-east-1:000000000000:scalingPolicy:")
    assert policy_arn.endswith(f":resource/sagemaker/{RESOURCE}:policyName/per-instance")
    put_policy(
        scaling,
        "queue",
        3.0,
        CustomizedMetricSpecification={
            "MetricName": "queue_depth",
            "Namespace": "serving",
            "Statistic": "Average",
        },
    )
    block = scaling_of(harness)
    assert (block["MinCapacity"], block["MaxCapacity"]) == (2, 4)
    policies = {
        (p.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
        or p["CustomizedMetricSpecification"]["MetricName"]: p
        for p in block["TargetTrackingScalingPolicyConfiguration"]
    }
    assert set(policies) == {"SageMakerVariantInvocationsPerInstance", "queue_depth"}
    assert (
        policies["queue_depth"]["TargetValue"] == 3.0
        and policies["queue_depth"]["ScaleInCooldown"] == 60
    )
    refused(
        lambda: put_policy(scaling, "again", 9.0, PredefinedMetricSpecification=INVOCATIONS),
        "ValidationException",
        "already has a target-tracking policy on SageMakerVariantInvocationsPerInstance",
    )
    # replaces its own
    put_policy(scaling, "per-instance", 70.0, PredefinedMetricSpecification=INVOCATIONS)
    described = scaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=RESOURCE
    )["ScalingPolicies"]
    assert sorted(
        (p["PolicyName"], p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"])
        for p in described
    ) == [("per-instance", 70.0), ("queue", 3.0)]
    assert (
        scaling.describe_scaling_policies(ServiceNamespace="sagemaker", PolicyNames=["queue"])[
            "ScalingPolicies"
        ][0]["PolicyName"]
        == "queue"
    )

    # UpdateEndpointWeightsAndCapacities stays within the target's bounds.
    refused(
        lambda: harness.sm.update_endpoint_weights_and_capacities(
            EndpointName="e1",
            DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredInstanceCount": 5}],
        ),
        "ValidationException",
        "outside the scalable target's bounds [2, 4]",
    )
    # A variant with a scalable target cannot be dropped by an update.
    harness.config("only-b", ("B", "m1"))
    refused(
        lambda: harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="only-b"),
        "ValidationException",
        "deregister it first",
    )

    scaling.delete_scaling_policy(
        PolicyName="queue",
        ServiceNamespace="sagemaker",
        ResourceId=RESOURCE,
        ScalableDimension=DIMENSION,
    )
    assert [
        p["PredefinedMetricSpecification"]["PredefinedMetricType"]
        for p in scaling_of(harness)["TargetTrackingScalingPolicyConfiguration"]
    ] == ["SageMakerVariantInvocationsPerInstance"]
    scaling.deregister_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=RESOURCE, ScalableDimension=DIMENSION
    )
    # back to the variant's own count
    assert scaling_of(harness) == {"MinCapacity": 1, "MaxCapacity": 1}
    assert scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []


def test_deleting_the_endpoint_deletes_its_targets_and_policies(
    harness: Harness, scaling: Any
) -> None:
    register(scaling, 1, 3)
    put_policy(scaling, "p", 5.0, PredefinedMetricSpecification=INVOCATIONS)
    harness.sm.delete_endpoint(EndpointName="e1")
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []


def test_scaling_activities_are_the_engines_records(harness: Harness, scaling: Any) -> None:
    register(scaling, 1, 4)
    put_policy(scaling, "p", 5.0, PredefinedMetricSpecification=INVOCATIONS)
    out = {
        "Time": "2026-03-01T10:00:00Z",
        "From": 1,
        "To": 3,
        "Reason": "InvocationsPerInstance 12 > 5",
    }
    harness.deployer.served["e1@A@1"]["ScalingActivities"] = [
        out,
        dict(out),  # the same change, recorded by a second container of the variant
        {
            "Time": "2026-03-01T10:30:00Z",
            "From": 3,
            "To": 2,
            "Reason": "InvocationsPerInstance 1 < 5",
        },
    ]
    harness.deployer.served["e1@B@1"]["ScalingActivities"] = [
        {"Time": "2026-03-01T09:00:00Z", "From": 1, "To": 2, "Reason": "manual"}
    ]
    activities = scaling.describe_scaling_activities(
        ServiceNamespace="sagemaker", ResourceId=RESOURCE
    )["ScalingActivities"]
    assert [a["Description"] for a in activities] == [
        "Setting desired instance count to 2.",
        "Setting desired instance count to 3.",
    ]  # newest first, once each
    latest, earlier = activities
    assert (
        latest["Cause"].startswith("scale in")
        and earlier["Cause"] == "scale out: InvocationsPerInstance 12 > 5"
    )
    assert earlier["StartTime"] == datetime.datetime(2026, 3, 1, 10, 0, tzinfo=datetime.UTC)
    assert {a["StatusCode"] for a in activities} == {"Successful"} and {
        a["ResourceId"] for a in activities
    } == {RESOURCE}
    assert len({a["ActivityId"] for a in activities}) == 2
    every = scaling.describe_scaling_activities(ServiceNamespace="sagemaker")["ScalingActivities"]
    assert [a["ResourceId"] for a in every] == [RESOURCE, RESOURCE, "endpoint/e1/variant/B"]
