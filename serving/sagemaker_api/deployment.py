"""DeploymentConfig: how an update moves traffic from the serving fleet to its new one, and when it
rolls back.

The new fleet comes up whole beside the old one (as SageMaker's blue/green does); once it is
InService, traffic moves in steps: ALL_AT_ONCE (one step), CANARY (CanarySize, then the rest),
LINEAR (LinearStepSize at a time); a RollingUpdatePolicy moves MaximumBatchSize at a time. Each step
bakes WaitIntervalInSeconds, the last one too. An alarm of AutoRollbackConfiguration in ALARM, or
MaximumExecutionTimeoutInSeconds passed, sends all traffic back to the old fleet and ends the update
failed; else the old fleet is deleted TerminationWaitInSeconds after the last step. `plan` makes a
config into steps, refusing one that cannot hold for the fleet; the update that runs them is
`endpoint_update`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from serving.errors import ApiValidationError
from serving.sagemaker_api.shapes import CapacitySizeShape, DeploymentConfigShape
from serving.sagemaker_api.stored import DeploymentPlan, VariantRow

__all__ = ["plan"]


def plan(
    config: DeploymentConfigShape,
    variants: Sequence[VariantRow],
    alarm_exists: Callable[[str], bool],
) -> DeploymentPlan:
    """The steps (each a share of traffic on the new fleet) and limits of `config` for the fleet
    `variants`; a ValidationException names the field that cannot hold for this fleet."""
    fleet = sum(int(variant["Count"]) for variant in variants if not variant.get("Shadow"))
    blue_green, rolling = config.BlueGreenUpdatePolicy, config.RollingUpdatePolicy
    if blue_green is not None:
        routing, where = (
            blue_green.TrafficRoutingConfiguration,
            "DeploymentConfig.BlueGreenUpdatePolicy",
        )
        wait, termination = routing.WaitIntervalInSeconds, blue_green.TerminationWaitInSeconds
        timeout = blue_green.MaximumExecutionTimeoutInSeconds
        if routing.Type == "CANARY":
            assert routing.CanarySize is not None
            size = _fraction(
                routing.CanarySize, fleet, f"{where}.TrafficRoutingConfiguration.CanarySize", 0.5
            )
            steps = [size, 1.0]
        elif routing.Type == "LINEAR":
            assert routing.LinearStepSize is not None
            size = _fraction(
                routing.LinearStepSize,
                fleet,
                f"{where}.TrafficRoutingConfiguration.LinearStepSize",
                0.5,
            )
            steps = _linear(size, f"{where}.TrafficRoutingConfiguration.LinearStepSize", 0.1)
        else:
            steps = [1.0]
    else:
        assert rolling is not None
        where = "DeploymentConfig.RollingUpdatePolicy"
        wait, termination, timeout = (
            rolling.WaitIntervalInSeconds,
            0,
            rolling.MaximumExecutionTimeoutInSeconds,
        )
        size = _fraction(rolling.MaximumBatchSize, fleet, f"{where}.MaximumBatchSize", 0.5)
        steps = _linear(size, f"{where}.MaximumBatchSize", 0.05)
    baking = len(steps) * wait + termination
    if timeout is not None and timeout < baking:
        raise ApiValidationError(
            f"{where}.MaximumExecutionTimeoutInSeconds: {timeout} s is less than the {baking} s this deployment "
            f"waits ({len(steps)} steps of WaitIntervalInSeconds plus TerminationWaitInSeconds)"
        )
    rollback = config.AutoRollbackConfiguration
    alarms = [alarm.AlarmName for alarm in rollback.Alarms] if rollback is not None else []
    for index, name in enumerate(alarms):
        if not alarm_exists(name):
            raise ApiValidationError(
                f"DeploymentConfig.AutoRollbackConfiguration.Alarms[{index}].AlarmName: no CloudWatch alarm "
                f"{name!r} exists on this server (create it with put_metric_alarm first: docs/cloudwatch.md)"
            )
    return {
        "steps": steps,
        "wait": wait,
        "termination": termination,
        "timeout": timeout,
        "alarms": alarms,
    }


def _fraction(size: CapacitySizeShape, fleet: int, field: str, most: float) -> float:
    """The share of the fleet `size` names, at most `most` of it (SageMaker's bound for canaries and
    steps)."""
    if size.Type == "INSTANCE_COUNT":
        if size.Value > fleet * most:
            raise ApiValidationError(
                f"{field}: {size.Value} instances is more than {most:.0%} of the new fleet's {fleet} "
                f"(InitialInstanceCount over its variants)"
            )
        return size.Value / fleet
    if size.Value > most * 100:
        raise ApiValidationError(f"{field}: {size.Value}% is more than {most:.0%} of the fleet")
    return size.Value / 100


def _linear(size: float, field: str, least: float) -> list[float]:
    if size < least:
        raise ApiValidationError(
            f"{field}: a step of {size:.0%} of the fleet is less than the {least:.0%} allowed"
        )
    count = math.ceil(1 / size - 1e-9)
    return [min(1.0, size * step) for step in range(1, count + 1)]
