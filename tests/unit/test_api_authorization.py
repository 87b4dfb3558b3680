"""serving.sagemaker_api.authorization: the (action, ARN) pairs each control-plane call is
authorized on (issue 56).

The routes that evaluate them against two principals' policies, over boto3:
tests/security/test_sec_api_resources.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from serving import protocol
from serving.sagemaker_api.authorization import checks
from serving.sagemaker_api.routes import OPERATIONS

SM, CW = "arn:aws:sagemaker:us-east-1:000000000000", "arn:aws:cloudwatch:us-east-1:000000000000"
ROLLBACK = {
    "AutoRollbackConfiguration": {
        "Alarms": [{"AlarmName": "Rollback-1"}, {"AlarmName": "rollback-2"}]
    }
}
READ = ("cloudwatch:GetMetricStatistics", f"{CW}:*")


def _checks(prefix: str, operation: str, **document: Any) -> list[tuple[str, str]]:
    return checks(prefix, operation, document, "us-east-1", "000000000000")


def _sagemaker(operation: str, **document: Any) -> list[tuple[str, str]]:
    return _checks(protocol.SAGEMAKER_TARGET_PREFIX, operation, **document)


def test_an_endpoint_config_is_authorized_on_itself_and_each_model_it_serves() -> None:
    action = "sagemaker:CreateEndpointConfig"
    assert _sagemaker(
        "CreateEndpointConfig",
        EndpointConfigName="Cfg",
        ProductionVariants=[{"ModelName": "M1"}, {"ModelName": "m2"}],
        ShadowProductionVariants=[{"ModelName": "shadow"}, {"ModelName": "m1"}],
    ) == [
        (action, f"{SM}:endpoint-config/cfg"),
        (action, f"{SM}:model/m1"),
        (action, f"{SM}:model/m2"),
        (action, f"{SM}:model/shadow"),
    ]  # ARNs lower-cased, as SageMaker writes them; each once


@pytest.mark.parametrize("operation", ["CreateEndpoint", "UpdateEndpoint"])
def test_an_endpoint_is_authorized_on_itself_its_config_and_its_rollback_alarms(
    operation: str,
) -> None:
    action = f"sagemaker:{operation}"
    assert _sagemaker(
        operation, EndpointName="e", EndpointConfigName="c", DeploymentConfig=ROLLBACK
    ) == [
        (action, f"{SM}:endpoint/e"),
        (action, f"{SM}:endpoint-config/c"),
        ("cloudwatch:DescribeAlarms", f"{CW}:alarm:Rollback-1"),
        ("cloudwatch:DescribeAlarms", f"{CW}:alarm:rollback-2"),
    ]
    assert _sagemaker(
        operation, EndpointName="e", EndpointConfigName="c", RetainAllVariantProperties=True
    ) == [
        (action, f"{SM}:endpoint/e"),
        (action, f"{SM}:endpoint-config/c"),
    ]


def test_a_name_that_is_not_a_string_stands_for_every_resource() -> None:
    # Validation refuses these requests later; until then nothing they name may escape a check.
    assert _sagemaker(
        "CreateEndpointConfig", EndpointConfigName="c", ProductionVariants=[{"ModelName": 7}, "x"]
    ) == [
        ("sagemaker:CreateEndpointConfig", f"{SM}:endpoint-config/c"),
        ("sagemaker:CreateEndpointConfig", f"{SM}:*"),
    ]
    assert _sagemaker("CreateEndpoint", EndpointName=["e"]) == [
        ("sagemaker:CreateEndpoint", f"{SM}:*")
    ]
    assert _sagemaker(
        "UpdateEndpoint",
        EndpointName="e",
        EndpointConfigName="c",
        DeploymentConfig={"AutoRollbackConfiguration": {"Alarms": [{"AlarmName": None}]}},
    )[-1] == ("cloudwatch:DescribeAlarms", f"{CW}:*")
    assert _checks(protocol.CLOUDWATCH_TARGET_PREFIX, "DeleteAlarms", AlarmNames=["a", 1]) == [
        ("cloudwatch:DeleteAlarms", f"{CW}:alarm:a"),
        ("cloudwatch:DeleteAlarms", f"{CW}:*"),
    ]


def test_every_other_sagemaker_operation_names_one_resource_or_lists() -> None:
    names = {"EndpointName": "e", "EndpointConfigName": "c", "ModelName": "m"}
    for operation in OPERATIONS[protocol.SAGEMAKER_TARGET_PREFIX]:
        found = _sagemaker(operation, **names)
        if operation.startswith("List"):
            assert found == [(f"sagemaker:{operation}", f"{SM}:*")]
        elif operation not in ("CreateEndpoint", "UpdateEndpoint"):
            kind = next(
                kind for kind in ("EndpointConfig", "Endpoint", "Model") if kind in operation
            )
            resource = {
                "EndpointConfig": "endpoint-config/c",
                "Endpoint": "endpoint/e",
                "Model": "model/m",
            }[kind]
            assert found == [(f"sagemaker:{operation}", f"{SM}:{resource}")], operation


def test_alarms_need_to_read_the_metric_they_watch() -> None:
    cloudwatch = protocol.CLOUDWATCH_TARGET_PREFIX
    assert _checks(
        cloudwatch,
        "PutMetricAlarm",
        AlarmName="a",
        Dimensions=[{"Name": "EndpointName", "Value": "x"}],
    ) == [("cloudwatch:PutMetricAlarm", f"{CW}:alarm:a"), READ]
    assert _checks(cloudwatch, "DescribeAlarms", AlarmNames=["a", "b"]) == [
        ("cloudwatch:DescribeAlarms", f"{CW}:alarm:a"),
        ("cloudwatch:DescribeAlarms", f"{CW}:alarm:b"),
    ]
    assert _checks(cloudwatch, "DescribeAlarms", AlarmNamePrefix="a") == [
        ("cloudwatch:DescribeAlarms", f"{CW}:*")
    ]
    assert _checks(cloudwatch, "SetAlarmState", AlarmName="a") == [
        ("cloudwatch:SetAlarmState", f"{CW}:alarm:a")
    ]
    for operation in ("GetMetricStatistics", "GetMetricData", "ListMetrics"):
        assert _checks(cloudwatch, operation, AlarmName="ignored") == [
            (f"cloudwatch:{operation}", f"{CW}:*")
        ]


def test_scaling_is_authorized_on_the_variants_endpoint() -> None:
    scaling = protocol.AUTOSCALING_TARGET_PREFIX
    assert _checks(scaling, "PutScalingPolicy", ResourceId="endpoint/E/variant/v") == [
        ("application-autoscaling:PutScalingPolicy", f"{SM}:endpoint/e")
    ]
    assert _checks(scaling, "DescribeScalableTargets", ResourceIds=["endpoint/e/variant/v"]) == [
        ("application-autoscaling:DescribeScalableTargets", f"{SM}:*")
    ]  # as IAM: no resource type
