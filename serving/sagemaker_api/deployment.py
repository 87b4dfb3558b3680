"""DeploymentConfig: how an update moves traffic from the serving fleet to its new one, and when it rolls back.

The new fleet comes up whole beside the old one (as SageMaker's blue/green does); once it is InService, traffic
moves in steps: ALL_AT_ONCE (one step), CANARY (CanarySize, then the rest), LINEAR (LinearStepSize at a time);
a RollingUpdatePolicy moves MaximumBatchSize at a time. Each step bakes WaitIntervalInSeconds, the last one too.
An alarm of AutoRollbackConfiguration in ALARM, or MaximumExecutionTimeoutInSeconds passed, sends all traffic
back to the old fleet and ends the update failed; else the old fleet is deleted TerminationWaitInSeconds after
the last step. `EndpointApi.tick` calls `progress` about twice a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from serving.errors import ApiValidationError
from serving.gateway.variants import VariantRoute
from serving.sagemaker_api.shapes import CapacitySizeShape, DeploymentConfigShape

__all__ = ["plan", "progress", "routes", "share", "variant_status"]


def plan(
    config: DeploymentConfigShape, variants: list[dict[str, Any]], alarm_exists: Callable[[str], bool]
) -> dict[str, Any]:
    """The steps (each a share of traffic on the new fleet) and limits of `config` for the fleet `variants`;
    a ValidationException names the field that cannot hold for this fleet."""
    fleet = sum(int(variant["Count"]) for variant in variants if not variant.get("Shadow"))
    blue_green, rolling = config.BlueGreenUpdatePolicy, config.RollingUpdatePolicy
    if blue_green is not None:
        routing, where = blue_green.TrafficRoutingConfiguration, "DeploymentConfig.BlueGreenUpdatePolicy"
        wait, termination = routing.WaitIntervalInSeconds, blue_green.TerminationWaitInSeconds
        timeout = blue_green.MaximumExecutionTimeoutInSeconds
        if routing.Type == "CANARY":
            assert routing.CanarySize is not None
            size = _fraction(routing.CanarySize, fleet, f"{where}.TrafficRoutingConfiguration.CanarySize", 0.5)
            steps = [size, 1.0]
        elif routing.Type == "LINEAR":
            assert routing.LinearStepSize is not None
            size = _fraction(routing.LinearStepSize, fleet, f"{where}.TrafficRoutingConfiguration.LinearStepSize", 0.5)
            steps = _linear(size, f"{where}.TrafficRoutingConfiguration.LinearStepSize", 0.1)
        else:
            steps = [1.0]
    else:
        assert rolling is not None
        where = "DeploymentConfig.RollingUpdatePolicy"
        wait, termination, timeout = rolling.WaitIntervalInSeconds, 0, rolling.MaximumExecutionTimeoutInSeconds
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
    return {"steps": steps, "wait": wait, "termination": termination, "timeout": timeout, "alarms": alarms}


def _fraction(size: CapacitySizeShape, fleet: int, field: str, most: float) -> float:
    """The share of the fleet `size` names, at most `most` of it (SageMaker's bound for canaries and steps)."""
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
        raise ApiValidationError(f"{field}: a step of {size:.0%} of the fleet is less than the {least:.0%} allowed")
    count = math.ceil(1 / size - 1e-9)
    return [min(1.0, size * step) for step in range(1, count + 1)]


def share(pending: dict[str, Any]) -> float:
    """The share of traffic on the new fleet now (0 before the first step)."""
    shift = pending.get("shift")
    return pending["deployment"]["steps"][shift["step"]] if shift else 0.0


def routes(serving: list[dict[str, Any]], pending: dict[str, Any]) -> tuple[VariantRoute, ...]:
    """Both fleets' production variants, weighted so that the new one takes its step's share of the traffic
    (shadow variants keep getting copies from the serving set's shadows until the update ends)."""
    new, coming = share(pending), [v for v in pending["variants"] if not v.get("Shadow")]
    old_total = sum(float(v["Weight"]) for v in serving) or 1.0
    new_total = sum(float(v["Weight"]) for v in coming) or 1.0
    return (
        *(VariantRoute(v["VariantName"], v["Served"], float(v["Weight"]) / old_total * (1 - new)) for v in serving),
        *(VariantRoute(v["VariantName"], v["Served"], float(v["Weight"]) / new_total * new) for v in coming),
    )


def progress(pending: dict[str, Any], now: float, alarm_state: Callable[[str], str | None]) -> tuple[str, str]:
    """What the tick does next: ("wait" | "step" | "finish" | "rollback", why)."""
    deployment, shift = pending["deployment"], pending["shift"]
    where = f"step {shift['step'] + 1} of {len(deployment['steps'])}, {share(pending):.0%} of traffic on the new fleet"
    for alarm in deployment["alarms"]:
        if alarm_state(alarm) == "ALARM":
            return (
                "rollback",
                f"alarm {alarm} went to ALARM during the deployment ({where}); all traffic is back on the old fleet",
            )
    if deployment["timeout"] is not None and now - pending["StartedAt"] > deployment["timeout"]:
        return (
            "rollback",
            f"the deployment ran past MaximumExecutionTimeoutInSeconds ({deployment['timeout']} s; {where})",
        )
    if now - shift["since"] < deployment["wait"]:
        return "wait", where
    return ("finish" if shift["step"] + 1 == len(deployment["steps"]) else "step"), where


def variant_status(pending: dict[str, Any]) -> list[dict[str, Any]]:
    """A new variant's VariantStatus in DescribeEndpoint's PendingDeploymentSummary: the step it bakes in."""
    shift = pending.get("shift")
    if not shift:
        return [{"Status": "Creating", "StartTime": pending["StartedAt"]}]
    steps = pending["deployment"]["steps"]
    message = f"step {shift['step'] + 1} of {len(steps)}: {share(pending):.0%} of traffic on the new fleet"
    return [{"Status": "Baking", "StatusMessage": message, "StartTime": shift["since"]}]
