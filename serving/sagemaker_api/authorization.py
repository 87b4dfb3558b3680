"""What a control-plane call must be allowed: an (IAM action, resource ARN) pair for every resource
it names.

A call that names a second resource uses it: an endpoint config serves the models it names, an
endpoint serves its config's models, a deployment's rollback reads the alarms it names, an alarm
reads the metric it watches. Authorizing the first name only let a caller serve another team's model
under its own access control (issue 56). So each is authorized, with the resource types AWS's
Service Authorization Reference lists for the action (CreateEndpoint and UpdateEndpoint: `endpoint`
and `endpoint-config`) and, where IAM leaves a named resource to a condition key or to a role this
server does not have, the safe choice (docs/sagemaker-api.md, "Authentication and authorization").

Pure: no web framework; `routes` evaluates each pair against the caller's policies, in this order.
"""

from __future__ import annotations

from typing import Any

from serving import protocol
from serving.documents import ApiJson
from serving.sagemaker_api.resources import arn

__all__ = ["Check", "checks", "metric_read"]

Check = tuple[str, str]  # (IAM action, resource ARN)

# operation -> (the field naming what it acts on, that resource's type); the others act on `...:*`
_SAGEMAKER = {
    **dict.fromkeys(("CreateModel", "DescribeModel", "DeleteModel"), ("ModelName", "model")),
    **dict.fromkeys(
        ("CreateEndpointConfig", "DescribeEndpointConfig", "DeleteEndpointConfig"),
        ("EndpointConfigName", "endpoint-config"),
    ),
    **dict.fromkeys(
        (
            "CreateEndpoint",
            "DescribeEndpoint",
            "UpdateEndpoint",
            "UpdateEndpointWeightsAndCapacities",
            "DeleteEndpoint",
        ),
        ("EndpointName", "endpoint"),
    ),
}
_ALARMS_FIELD = {  # CloudWatch operation -> the field naming its alarms; the others act on `...:*`
    **dict.fromkeys(("PutMetricAlarm", "SetAlarmState", "DescribeAlarmHistory"), "AlarmName"),
    **dict.fromkeys(("DescribeAlarms", "DeleteAlarms"), "AlarmNames"),
}


def checks(
    prefix: str, operation: str, document: ApiJson, region: str, account: str
) -> list[Check]:
    """Every (action, ARN) the call needs, its own resource first. A name that is there but is not a
    string (which validation refuses later) stands for every resource, `...:*`, so that nothing
    named goes unchecked."""
    action = f"{protocol.API_IAM_PREFIXES[prefix]}:{operation}"
    if prefix == protocol.CLOUDWATCH_TARGET_PREFIX:
        return _cloudwatch(action, operation, document, region, account)
    # a variant's scaling is authorized on its endpoint
    if prefix == protocol.AUTOSCALING_TARGET_PREFIX:
        resource_id = document.get("ResourceId")
        endpoint = (
            resource_id.split("/")[1]
            if isinstance(resource_id, str) and resource_id.count("/") == 3
            else None
        )
        return [(action, _arn(endpoint, "endpoint", region, account))]
    if operation not in _SAGEMAKER:
        return [(action, _arn(None, "", region, account))]  # the List* operations
    field, kind = _SAGEMAKER[operation]
    needed = [(action, _arn(document.get(field), kind, region, account))]
    if operation == "CreateEndpointConfig":  # the config serves each variant's model, shadows' too
        for variants in ("ProductionVariants", "ShadowProductionVariants"):
            needed += [
                (action, _arn(row.get("ModelName"), "model", region, account))
                for row in _rows(document, variants)
            ]
    # IAM: on the endpoint and on the endpoint config
    if operation in ("CreateEndpoint", "UpdateEndpoint"):
        needed.append(
            (action, _arn(document.get("EndpointConfigName"), "endpoint-config", region, account))
        )
        needed += _rollback_alarms(document.get("DeploymentConfig"), region, account)
    return list(dict.fromkeys(needed))


def metric_read(region: str, account: str) -> Check:
    """What reading a metric's datapoints needs, an alarm's included: GetMetricStatistics' own
    authorization (IAM gives the metric operations no resource type, hence `...:*`)."""
    return f"{protocol.CLOUDWATCH_IAM_PREFIX}:GetMetricStatistics", _alarm(None, region, account)


def _cloudwatch(
    action: str, operation: str, document: ApiJson, region: str, account: str
) -> list[Check]:
    """Alarm operations on each alarm named (`...:*` when none is), metric operations on `...:*`;
    PutMetricAlarm also needs to read the metric it watches, whose datapoints the alarm's state
    reason shows."""
    field = _ALARMS_FIELD.get(operation)
    named = document.get(field) if field else None
    names = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    needed = [(action, _alarm(name, region, account)) for name in names] or [
        (action, _alarm(None, region, account))
    ]
    if operation == "PutMetricAlarm":
        needed.append(metric_read(region, account))
    return list(dict.fromkeys(needed))


def _rollback_alarms(config: Any, region: str, account: str) -> list[Check]:
    """A DeploymentConfig's rollback alarms, whose states the update reads. AWS has the endpoint's
    execution role read them (`cloudwatch:DescribeAlarms`); no role is assumed here, so the caller
    must be allowed to."""
    rollback = config.get("AutoRollbackConfiguration") if isinstance(config, dict) else None
    action = f"{protocol.CLOUDWATCH_IAM_PREFIX}:DescribeAlarms"
    return [
        (action, _alarm(row.get("AlarmName"), region, account)) for row in _rows(rollback, "Alarms")
    ]


def _rows(document: Any, field: str) -> list[ApiJson]:
    """The objects of a list field; anything else in the list becomes an empty row (whose name is
    then `...:*`)."""
    rows = document.get(field) if isinstance(document, dict) else None
    return [row if isinstance(row, dict) else {} for row in rows] if isinstance(rows, list) else []


def _arn(name: Any, kind: str, region: str, account: str) -> str:
    """SageMaker's ARN of a named resource; `...:*` for no name or one that is not a string."""
    if isinstance(name, str):
        return arn(region, account, kind, name)
    return f"arn:aws:{protocol.SIGNING_SERVICE}:{region}:{account}:*"


def _alarm(name: Any, region: str, account: str) -> str:
    """CloudWatch's ARN of a named alarm; `...:*` for no name or one that is not a string."""
    scope = f"arn:aws:{protocol.CLOUDWATCH_IAM_PREFIX}:{region}:{account}"
    return f"{scope}:alarm:{name}" if isinstance(name, str) else f"{scope}:*"
