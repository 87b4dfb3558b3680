"""Target-tracking autoscaling, decided the way Application Auto Scaling does it for SageMaker
variants.

Pure policy core: no Ray, no I/O, the clock is injected, so every rule is unit-tested on synthetic
traces. The caller samples each policy's metric (already averaged per replica), calls
`TargetTrackingScaler.decide` and applies the returned count when `decision.changed`; the scaler
records every decision with `desired != current` as applied, so there is no separate confirm step.
`current` is the number of replicas the metric was averaged over: while replicas added by a
scale-out are still starting it is below the count that scale-out set, which is what
ScaleOutCooldown guards. The rules and formulas: docs/autoscaling.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

__all__ = [
    "CONCURRENT_REQUESTS_PER_REPLICA",
    "CPU_UTILIZATION",
    "DEFAULT_COOLDOWN_S",
    "DEFAULT_SCALE_IN_TOLERANCE",
    "INVOCATIONS_PER_INSTANCE",
    "MEMORY_UTILIZATION",
    "PREDEFINED_METRICS",
    "SPEC_METRIC_TYPES",
    "PolicyArguments",
    "ScalerState",
    "ScalingActivity",
    "ScalingDecision",
    "ScalingState",
    "TargetTracking",
    "TargetTrackingScaler",
    "activity",
]

# Predefined metrics, each a value per replica that the caller measures. Any other string names a
# custom metric (what a CustomizedMetricSpecification's MetricName would be); the scaler treats all
# of them alike.
# invocations per replica per minute
INVOCATIONS_PER_INSTANCE = "SageMakerVariantInvocationsPerInstance"
CONCURRENT_REQUESTS_PER_REPLICA = "ConcurrentRequestsPerReplica"  # requests in flight per replica
CPU_UTILIZATION = "CPUUtilization"  # percent of the replica's CPUs
MEMORY_UTILIZATION = "MemoryUtilization"  # percent of the replica's memory
PREDEFINED_METRICS = frozenset(
    {INVOCATIONS_PER_INSTANCE, CONCURRENT_REQUESTS_PER_REPLICA, CPU_UTILIZATION, MEMORY_UTILIZATION}
)
# serving/spec.py's PredefinedMetricType values → the names above (the spec keeps SageMaker's
# spelling).
SPEC_METRIC_TYPES = {
    "SageMakerVariantInvocationsPerInstance": INVOCATIONS_PER_INSTANCE,
    "SageMakerVariantConcurrentRequestsPerModel": CONCURRENT_REQUESTS_PER_REPLICA,
    "SageMakerVariantCPUUtilization": CPU_UTILIZATION,
    "SageMakerVariantMemoryUtilization": MEMORY_UTILIZATION,
}

# Application Auto Scaling's default for both cooldowns of a SageMaker variant
DEFAULT_COOLDOWN_S = 300.0
# scale in only below target * (1 - 0.1): no flapping around the target
DEFAULT_SCALE_IN_TOLERANCE = 0.1


@dataclass(frozen=True)
class TargetTracking:
    """One target-tracking policy: keep `metric` (per replica) at `target`."""

    metric: str  # INVOCATIONS_PER_INSTANCE is the spec's default
    target: float
    scale_out_cooldown_s: float = DEFAULT_COOLDOWN_S
    scale_in_cooldown_s: float = DEFAULT_COOLDOWN_S
    disable_scale_in: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"metric: must be a non-empty name, got {self.metric!r}")
        if not (isinstance(self.target, (int, float)) and 0 < self.target < math.inf):
            raise ValueError(f"target: must be a number > 0, got {self.target!r}")
        for field in ("scale_out_cooldown_s", "scale_in_cooldown_s"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"{field}: must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class ScalingDecision:
    """What one `decide` call concluded, and why; apply `desired` when `changed`."""

    desired: int
    current: int
    metric: str  # the deciding policy's metric, its value (None: no data) and target
    metric_value: float | None
    target: float
    reason: str
    scale_out_cooldown_left_s: float  # the deciding policy's cooldowns, after this decision
    scale_in_cooldown_left_s: float

    @property
    def changed(self) -> bool:
        return self.desired != self.current


@dataclass
class ScalingState:
    """What the cooldowns need to remember: the last scale-out (time, count it set) and the last
    scale-in."""

    scale_out_at: float | None = None
    scale_out_to: int | None = None
    scale_in_at: float | None = None


@dataclass(frozen=True)
class _Proposal:
    policy: TargetTracking
    value: float | None
    desired: int
    reason: str


def _num(value: float) -> float:
    return round(float(value), 3)


class TargetTrackingScaler:
    """The replica count of one container under one or more target-tracking policies."""

    def __init__(
        self,
        policies: Sequence[TargetTracking],
        min_capacity: int,
        max_capacity: int,
        *,
        scale_in_tolerance: float = DEFAULT_SCALE_IN_TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        policies = tuple(policies)
        if not policies or not all(isinstance(p, TargetTracking) for p in policies):
            raise ValueError(f"policies: need at least one TargetTracking, got {policies!r}")
        metrics = [p.metric for p in policies]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"policies: one policy per metric, got {metrics}")
        for field, value in (("min_capacity", min_capacity), ("max_capacity", max_capacity)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field}: must be a whole number >= 0, got {value!r}")
        if min_capacity > max_capacity:
            raise ValueError(
                f"min_capacity: {min_capacity} must not exceed max_capacity {max_capacity}"
            )
        if not (isinstance(scale_in_tolerance, (int, float)) and 0 <= scale_in_tolerance < 1):
            raise ValueError(f"scale_in_tolerance: must be in [0, 1), got {scale_in_tolerance!r}")
        self.policies = policies
        self.min_capacity, self.max_capacity = min_capacity, max_capacity
        self.scale_in_tolerance = float(scale_in_tolerance)
        self.state = ScalingState()
        self._clock = clock

    def decide(self, current: int, metrics: Mapping[str, float | None]) -> ScalingDecision:
        """One decision from the current count and each policy's metric; records it when it changes
        the count.

        The largest proposal wins, so capacity only goes down when every policy proposes fewer
        replicas; a policy without data proposes `current`, which holds scale-in but lets the others
        scale out.
        """
        if not isinstance(current, int) or isinstance(current, bool) or current < 0:
            raise ValueError(f"current: must be a whole number >= 0, got {current!r}")
        now = self._clock()
        proposals = [
            self._propose(p, current, self._value(p.metric, metrics), now) for p in self.policies
        ]
        best = max(proposals, key=lambda p: p.desired)  # the first listed wins a tie
        desired, reason = self._clamp(best.desired), best.reason
        if not self.min_capacity <= current <= self.max_capacity:
            reason = (
                f"{current} replicas outside MinCapacity..MaxCapacity "
                f"{self.min_capacity}..{self.max_capacity} → {desired} replicas"
            )
        if desired > current:  # a scale-out ends any scale-in cooldown
            self.state = ScalingState(scale_out_at=now, scale_out_to=desired)
        # and a scale-in any scale-out cooldown: the capacity it added is gone
        elif desired < current:
            self.state = ScalingState(scale_in_at=now)
        return ScalingDecision(
            desired,
            current,
            best.policy.metric,
            best.value,
            best.policy.target,
            reason,
            self._left(self.state.scale_out_at, best.policy.scale_out_cooldown_s, now),
            self._left(self.state.scale_in_at, best.policy.scale_in_cooldown_s, now),
        )

    def _propose(
        self, policy: TargetTracking, current: int, value: float | None, now: float
    ) -> _Proposal:
        """One policy's count: desired = ceil(current * metric / target), then its own rules and
        cooldowns."""
        m, t = policy.metric, _num(policy.target)
        if value is None:
            return _Proposal(policy, None, current, f"no data for {m}")
        v = _num(value)
        # max(current, 1): from zero replicas the metric is read as one replica's load. round()
        # keeps float noise (3 * 0.1 / 0.1 = 3.0000000000000004) from asking for a replica nobody
        # needs.
        wanted = math.ceil(round(max(current, 1) * value / policy.target, 9))
        desired = self._clamp(wanted)
        if desired > current:
            left = self._left(self.state.scale_out_at, policy.scale_out_cooldown_s, now)
            if (
                left > 0
                and self.state.scale_out_to is not None
                and desired <= self.state.scale_out_to
            ):
                return _Proposal(
                    policy,
                    value,
                    current,
                    f"blocked by ScaleOutCooldown ({left:.0f} s left; the last "
                    f"scale-out already set {self.state.scale_out_to} replicas)",
                )
            capped = " (MaxCapacity)" if desired < wanted else ""
            return _Proposal(
                policy,
                value,
                desired,
                f"scale out: {m} {v} > target {t} per replica → {desired} replicas{capped}",
            )
        if desired < current:
            if policy.disable_scale_in:
                return _Proposal(
                    policy,
                    value,
                    current,
                    f"DisableScaleIn: {m} {v} < target {t}, holding {current}",
                )
            if value >= policy.target * (1 - self.scale_in_tolerance):
                return _Proposal(policy, value, current, f"within tolerance: {m} {v} vs target {t}")
            left = self._left(self.state.scale_in_at, policy.scale_in_cooldown_s, now)
            if left > 0:
                return _Proposal(
                    policy, value, current, f"blocked by ScaleInCooldown ({left:.0f} s left)"
                )
            predicted = _num(value * current / desired) if desired else 0.0
            return _Proposal(
                policy,
                value,
                desired,
                f"scale in: {m} {v} < target {t} per replica → {desired} replicas (predicted {predicted} per replica)",
            )
        if wanted > current:
            return _Proposal(
                policy,
                value,
                current,
                f"at MaxCapacity: {m} {v} > target {t} wants {wanted} replicas",
            )
        if wanted < current and value < policy.target * (1 - self.scale_in_tolerance):
            return _Proposal(policy, value, current, f"at MinCapacity: {m} {v} < target {t}")
        return _Proposal(policy, value, current, f"within tolerance: {m} {v} vs target {t}")

    def _clamp(self, count: int) -> int:
        return min(max(count, self.min_capacity), self.max_capacity)

    @staticmethod
    def _value(name: str, metrics: Mapping[str, float | None]) -> float | None:
        value = metrics.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None  # no data yet (Prometheus-style sources report NaN)
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not 0 <= value < math.inf
        ):
            raise ValueError(
                f"metrics[{name!r}]: must be a finite number >= 0 or None, got {value!r}"
            )
        return float(value)

    @staticmethod
    def _left(since: float | None, cooldown_s: float, now: float) -> float:
        return 0.0 if since is None else max(0.0, since + cooldown_s - now)


class PolicyArguments(TypedDict):
    """A TargetTracking's fields as JSON: how a spec's policy reaches Serve's controller
    (policy_kwargs)."""

    metric: str
    target: float
    scale_out_cooldown_s: float
    scale_in_cooldown_s: float
    disable_scale_in: bool


class Cooldown(TypedDict):
    ScaleOutSecondsLeft: float
    ScaleInSecondsLeft: float


class ScalingActivity(TypedDict):
    """One capacity change, as an endpoint's description lists it
    (DescribeScalingActivities-style)."""

    Time: str  # ISO 8601, UTC, to the millisecond (as AWS times an activity)
    ContainerHostname: str
    From: int
    To: int
    MetricName: str
    MetricValue: float | None
    TargetValue: float
    Reason: str
    Cooldown: Cooldown


class ScalerState(TypedDict):
    """What a container's autoscaler last decided, and on what (the registry keeps it; descriptions
    show it)."""

    DesiredReplicas: int
    MetricName: str
    MetricValue: float | None
    TargetValue: float
    Metrics: dict[str, float]  # every metric it read, by name


def activity(
    decision: ScalingDecision, container: str, *, wall_clock: Callable[[], float] = time.time
) -> ScalingActivity:
    """A capacity change as a DescribeScalingActivities-style entry for the endpoint's describe
    output."""
    if not decision.changed:
        raise ValueError(
            f"decision: {decision.current} → {decision.desired} changes nothing, so it is no activity"
        )
    when = (
        datetime.fromtimestamp(wall_clock(), UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
    return {
        "Time": when,
        "ContainerHostname": container,
        "From": decision.current,
        "To": decision.desired,
        "MetricName": decision.metric,
        "MetricValue": decision.metric_value,
        "TargetValue": decision.target,
        "Reason": decision.reason,
        "Cooldown": {
            "ScaleOutSecondsLeft": decision.scale_out_cooldown_left_s,
            "ScaleInSecondsLeft": decision.scale_in_cooldown_left_s,
        },
    }
