"""serving.autoscaling.policy: target tracking on synthetic metric traces with a fake clock.

Every step of a trace asserts the exact replica count (and a fragment of the reason), so a rule that
drifts fails at the step where it matters.
"""

from __future__ import annotations

import math
from typing import Any, get_args

import pytest

from serving.autoscaling.policy import (
    CONCURRENT_REQUESTS_PER_REPLICA,
    CPU_UTILIZATION,
    INVOCATIONS_PER_INSTANCE,
    PREDEFINED_METRICS,
    SPEC_METRIC_TYPES,
    ScalingDecision,
    TargetTracking,
    TargetTrackingScaler,
    activity,
)
from serving.config.spec import PredefinedMetric

INV = INVOCATIONS_PER_INSTANCE


class FakeClock:
    """Monotonic seconds that the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scaler(
    *policies: TargetTracking, lo: int = 1, hi: int = 10, **kwargs: Any
) -> tuple[TargetTrackingScaler, FakeClock]:
    clock = FakeClock()
    return TargetTrackingScaler(
        policies or (TargetTracking(INV, 70),), lo, hi, clock=clock, **kwargs
    ), clock


def run_trace(subject: TargetTrackingScaler, clock: FakeClock, steps: list[tuple]) -> None:
    """Steps are (time, current, metrics, expected desired, reason fragment); a bare number is the
    INV metric."""
    for at, current, metrics, expected, fragment in steps:
        clock.now = at
        if not isinstance(metrics, dict):
            metrics = {INV: metrics}
        decision = subject.decide(current, metrics)
        assert (at, decision.desired) == (at, expected), decision.reason
        assert fragment in decision.reason, (at, decision.reason)
        assert decision.changed == (expected != current)


@pytest.mark.parametrize(
    ("current", "metric", "target", "lo", "hi", "expected"),
    [
        (2, 140, 70, 1, 10, 4),  # the worked example: ceil(2 * 140 / 70)
        (2, 71, 70, 1, 10, 3),  # just above target: scale out, no tolerance on the way up
        (2, 70, 70, 1, 10, 2),  # on target
        (4, 700, 70, 1, 100, 40),  # proportional: one step to 40, not +1
        (2, 700, 70, 1, 5, 5),  # capped at MaxCapacity
        # scale in to ceil(80 / 70) = 2: predicted 40 <= 70, while 1 would be 80
        (4, 20, 70, 1, 10, 2),
        (4, 35, 70, 1, 10, 2),  # predicted exactly the target is allowed
        (10, 0, 70, 1, 10, 1),  # no load: down to MinCapacity in one step
        (10, 0, 70, 3, 10, 3),
        # ceil(18.3) = 19 < 20 but 64 >= 63 (70 * 0.9): inside the tolerance band
        (20, 64, 70, 1, 20, 20),
        (20, 62, 70, 1, 20, 18),  # 62 < 63: scale in to ceil(17.7) = 18
        (3, 0.1, 0.1, 1, 10, 3),  # 3 * 0.1 / 0.1 = 3.0000000000000004 in floats: no phantom replica
        (0, 5, 10, 0, 5, 1),  # from zero the metric is one replica's load: ceil(5 / 10)
        (2, 0, 70, 0, 5, 0),  # MinCapacity 0 lets an idle container go to zero
        (0, 0, 70, 0, 5, 0),
    ],
)
def test_one_decision(
    current: int, metric: float, target: float, lo: int, hi: int, expected: int
) -> None:
    subject, _ = scaler(TargetTracking(INV, target), lo=lo, hi=hi)
    assert subject.decide(current, {INV: metric}).desired == expected


@pytest.mark.parametrize(("tolerance", "expected"), [(0.1, 20), (0.0, 19), (0.05, 19), (0.08, 20)])
def test_tolerance_is_a_parameter(tolerance: float, expected: int) -> None:
    subject, _ = scaler(TargetTracking(INV, 70), hi=20, scale_in_tolerance=tolerance)
    assert subject.decide(20, {INV: 66}).desired == expected  # 66 < 70 * (1 - tolerance)?


def test_worked_example_decision_and_activity() -> None:
    subject, clock = scaler(TargetTracking(INV, 70, scale_out_cooldown_s=60))
    clock.now = 1000.0
    decision = subject.decide(2, {INV: 140.0})
    assert decision == ScalingDecision(
        desired=4,
        current=2,
        metric=INV,
        metric_value=140.0,
        target=70,
        reason="scale out: SageMakerVariantInvocationsPerInstance 140.0 > target 70.0 per replica → 4 replicas",
        scale_out_cooldown_left_s=60.0,
        scale_in_cooldown_left_s=0.0,
    )
    assert decision.changed
    assert activity(decision, "iris", wall_clock=lambda: 1714564800.25) == {
        "Time": "2024-05-01T12:00:00.250Z",
        "ContainerHostname": "iris",
        "From": 2,
        "To": 4,
        "MetricName": INV,
        "MetricValue": 140.0,
        "TargetValue": 70,
        "Reason": decision.reason,
        "Cooldown": {"ScaleOutSecondsLeft": 60.0, "ScaleInSecondsLeft": 0.0},
    }
    clock.now = 1030.0
    held = subject.decide(4, {INV: 70.0})
    assert (held.desired, held.changed, held.scale_out_cooldown_left_s) == (4, False, 30.0)
    with pytest.raises(ValueError, match="decision"):
        activity(held, "iris")


TRACES = {
    "step up, then steady": [
        (0, 2, 140, 4, "scale out"),
        (60, 4, 70, 4, "within tolerance"),
        (120, 4, 69, 4, "within tolerance"),
    ],
    "step down, second scale-in waits for ScaleInCooldown": [
        (
            0,
            4,
            20,
            2,
            "scale in: SageMakerVariantInvocationsPerInstance 20.0 < target 70.0 per replica → 2 "
            "replicas (predicted 40.0 per replica)",
        ),
        (60, 2, 10, 2, "blocked by ScaleInCooldown (240 s left)"),
        (299, 2, 10, 2, "blocked by ScaleInCooldown (1 s left)"),
        (300, 2, 10, 1, "scale in"),  # the cooldown has fully passed
        (400, 1, 0, 1, "at MinCapacity"),
    ],
    # At 20 replicas every value below 70 asks for fewer (66 → ceil(18.9) = 19); the band 63..70
    # holds.
    "oscillation inside the tolerance band never flaps": [
        (0, 20, 66, 20, "within tolerance"),
        (60, 20, 69.9, 20, ""),
        (120, 20, 63.5, 20, ""),
        (180, 20, 70, 20, ""),
        (240, 20, 64, 20, ""),
        (
            300,
            20,
            63,
            20,
            "within tolerance: SageMakerVariantInvocationsPerInstance 63.0 vs target 70.0",
        ),
        (360, 20, 62.9, 18, "scale in"),  # leaving the band: ceil(17.97) = 18
    ],
    "spike during ScaleOutCooldown: blocked unless larger than the last scale-out": [
        (0, 2, 140, 4, "scale out"),
        (
            60,
            2,
            140,
            2,
            "blocked by ScaleOutCooldown (240 s left; the last scale-out already set 4 replicas)",
        ),
        (90, 3, 90, 3, "blocked by ScaleOutCooldown"),  # ceil(3.86) = 4: already on its way
        (120, 2, 210, 6, "scale out"),  # ceil(6) = 6 > 4: larger, so at once
        (150, 4, 100, 4, "blocked by ScaleOutCooldown (270 s left"),  # ceil(5.7) = 6, not above 6
        (420, 4, 100, 6, "scale out"),  # cooldown over: the same need now passes
    ],
    "scale-out during ScaleInCooldown is allowed and ends it": [
        (0, 4, 20, 2, "scale in"),
        (100, 2, 10, 2, "blocked by ScaleInCooldown (200 s left)"),
        (120, 2, 140, 4, "scale out"),
        (180, 4, 10, 1, "scale in"),  # no ScaleInCooldown left to wait for
    ],
    "the worked example of docs/autoscaling.md": [
        (0, 2, 140, 4, "scale out"),
        (60, 4, 70, 4, "within tolerance"),
        (600, 4, 20, 2, "predicted 40.0 per replica"),
        (660, 2, 10, 2, "blocked by ScaleInCooldown (240 s left)"),
        (700, 2, 140, 4, "scale out"),
        (730, 2, 140, 2, "blocked by ScaleOutCooldown"),
        (760, 2, 210, 6, "scale out"),
    ],
    "a scale-in ends ScaleOutCooldown: the capacity it added is gone": [
        (0, 2, 140, 4, "scale out"),
        (60, 4, 10, 1, "scale in"),
        (90, 1, 140, 2, "scale out"),  # 2 <= 4 would have been blocked otherwise
    ],
}


@pytest.mark.parametrize("steps", list(TRACES.values()), ids=list(TRACES))
def test_trace(steps: list[tuple]) -> None:
    subject, clock = scaler(hi=30)
    run_trace(subject, clock, steps)


def test_bounds_are_enforced_whatever_the_cooldowns_say() -> None:
    subject, clock = scaler(lo=2, hi=5)
    run_trace(
        subject,
        clock,
        [
            (0, 5, 10, 2, "scale in"),  # wants ceil(50 / 70) = 1: held at MinCapacity 2
            # in ScaleInCooldown
            (10, 7, 10, 5, "7 replicas outside MinCapacity..MaxCapacity 2..5 → 5 replicas"),
            (20, 1, None, 2, "outside MinCapacity..MaxCapacity"),  # no data, still corrected
            (30, 0, 100, 2, "outside"),  # in ScaleOutCooldown (last set 2): still corrected
            (
                40,
                2,
                700,
                5,
                "scale out: SageMakerVariantInvocationsPerInstance 700.0 > target 70.0 per replica "
                "→ 5 replicas (MaxCapacity)",
            ),
            (50, 5, 700, 5, "at MaxCapacity"),
        ],
    )


def test_disable_scale_in() -> None:
    subject, clock = scaler(TargetTracking(INV, 70, disable_scale_in=True), lo=1, hi=6)
    run_trace(
        subject,
        clock,
        [
            (0, 4, 10, 4, "DisableScaleIn"),
            (1000, 4, 0, 4, "DisableScaleIn"),
            (1001, 4, 140, 6, "scale out"),  # scaling out is unaffected
            (2000, 8, 10, 6, "outside"),  # above MaxCapacity is still corrected
        ],
    )


def test_multiple_policies_largest_wins_and_scale_in_needs_all() -> None:
    subject, clock = scaler(TargetTracking(INV, 70), TargetTracking(CPU_UTILIZATION, 50), hi=10)
    steps = [
        (
            0,
            2,
            {INV: 140, CPU_UTILIZATION: 20},
            4,
            "scale out: SageMakerVariantInvocationsPerInstance",
        ),
        (60, 4, {INV: 35, CPU_UTILIZATION: 60}, 5, "scale out: CPUUtilization 60.0 > target 50.0"),
        # INV alone wants 2
        (400, 5, {INV: 20, CPU_UTILIZATION: 48}, 5, "within tolerance: CPUUtilization"),
        # both agree: the larger, 3
        (460, 5, {INV: 20, CPU_UTILIZATION: 30}, 3, "scale in: CPUUtilization"),
        # silence holds scale-in
        (800, 3, {INV: 10, CPU_UTILIZATION: None}, 3, "no data for CPUUtilization"),
        (
            860,
            3,
            {INV: 140, CPU_UTILIZATION: None},
            6,
            "scale out: SageMakerVariantInvocationsPerInstance",
        ),
    ]
    run_trace(subject, clock, steps)
    clock.now = 900
    decision = subject.decide(6, {INV: 70, CPU_UTILIZATION: 100})
    assert (decision.desired, decision.metric, decision.metric_value, decision.target) == (
        10,
        CPU_UTILIZATION,
        100,
        50,
    )


def test_each_policy_keeps_its_own_cooldowns() -> None:
    subject, clock = scaler(
        TargetTracking(INV, 70, scale_in_cooldown_s=600),
        TargetTracking(CONCURRENT_REQUESTS_PER_REPLICA, 4, scale_in_cooldown_s=0),
        hi=10,
    )
    run_trace(
        subject,
        clock,
        [
            (0, 8, {INV: 10, CONCURRENT_REQUESTS_PER_REPLICA: 1}, 2, "scale in"),
            (
                60,
                2,
                {INV: 10, CONCURRENT_REQUESTS_PER_REPLICA: 1},
                2,
                "blocked by ScaleInCooldown (540 s left)",
            ),
        ],
    )


@pytest.mark.parametrize("metrics", [{}, {INV: None}, {INV: math.nan}, {"other": 500.0}])
def test_missing_metric_changes_nothing(metrics: dict) -> None:
    subject, _ = scaler()
    decision = subject.decide(3, metrics)
    assert (decision.desired, decision.changed, decision.metric_value) == (3, False, None)
    assert decision.reason == "no data for SageMakerVariantInvocationsPerInstance"


def test_custom_metric_names_work_like_predefined_ones() -> None:
    subject, _ = scaler(TargetTracking("QueueDepthPerReplica", 5))
    assert subject.decide(2, {"QueueDepthPerReplica": 12}).desired == 5


def test_spec_metric_types_all_map_to_a_predefined_metric() -> None:
    spec_types = get_args(PredefinedMetric.model_fields["PredefinedMetricType"].annotation)
    assert set(SPEC_METRIC_TYPES) == set(spec_types)
    assert set(SPEC_METRIC_TYPES.values()) == PREDEFINED_METRICS


def test_aws_default_cooldowns() -> None:
    policy = TargetTracking(INV, 70)
    assert (policy.scale_out_cooldown_s, policy.scale_in_cooldown_s, policy.disable_scale_in) == (
        300,
        300,
        False,
    )


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TargetTracking(INV, 0), "target"),
        (lambda: TargetTracking(INV, -5), "target"),
        (lambda: TargetTracking(INV, math.nan), "target"),
        (lambda: TargetTracking(INV, 70, scale_out_cooldown_s=-1), "scale_out_cooldown_s"),
        (lambda: TargetTracking(INV, 70, scale_in_cooldown_s=-0.5), "scale_in_cooldown_s"),
        (lambda: TargetTracking("", 70), "metric"),
        (lambda: TargetTrackingScaler([TargetTracking(INV, 70)], -1, 3), "min_capacity"),
        (lambda: TargetTrackingScaler([TargetTracking(INV, 70)], 4, 3), "min_capacity"),
        (lambda: TargetTrackingScaler([TargetTracking(INV, 70)], 1, 2.5), "max_capacity"),
        (lambda: TargetTrackingScaler([], 1, 3), "policies"),
        (
            lambda: TargetTrackingScaler([TargetTracking(INV, 70), TargetTracking(INV, 50)], 1, 3),
            "policies",
        ),
        (
            lambda: TargetTrackingScaler([TargetTracking(INV, 70)], 1, 3, scale_in_tolerance=1),
            "scale_in_tolerance",
        ),
        (lambda: scaler()[0].decide(-1, {INV: 1}), "current"),
        (lambda: scaler()[0].decide(2, {INV: -3}), "metrics"),
        (lambda: scaler()[0].decide(2, {INV: math.inf}), "metrics"),
    ],
)
def test_invalid_inputs_name_the_field(build: Any, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        build()
