"""serving.ray_wing.autoscaler: the Serve policy object fed by Serve-shaped contexts (no Ray: a
context is what Serve's controller passes, built here as a plain object; the registry report is
captured)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.autoscaling.config import per_replica, serve_autoscaling_config
from serving.config.spec import parse_spec
from serving.ray_wing import autoscaler as autoscaling
from serving.ray_wing.autoscaler import ContainerAutoscaler

RATE = "SageMakerVariantInvocationsPerInstance"
POLICY = {"metric": RATE, "target": 60.0, "scale_out_cooldown_s": 30.0, "scale_in_cooldown_s": 60.0}


class Recording(ContainerAutoscaler):
    """The autoscaler with its registry report captured instead of sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reports: list[tuple[str, dict, dict | None]] = []

    def _report(self, hostname, running, decision, values) -> None:
        from serving.autoscaling.policy import activity

        self.reports.append(
            (
                hostname,
                {"DesiredReplicas": decision.desired},
                activity(decision, hostname) if decision.changed else None,
            )
        )


def context(
    per_replica_rates: list[float], target: int, *, name: str = "busy", running: int | None = None
):
    replicas = [f"r{i}" for i in range(len(per_replica_rates))]
    running_ids = replicas[: len(replicas) if running is None else running]
    return SimpleNamespace(
        deployment_name=name,
        target_num_replicas=target,
        current_num_replicas=len(running_ids),
        running_replicas=running_ids,
        aggregated_metrics={RATE: dict(zip(replicas, per_replica_rates))},
        policy_state={"serve": "state"},
    )


def test_metric_is_summed_over_running_replicas_and_shared_by_the_target_count() -> None:
    values, totals = per_replica(
        {RATE: {"a": 120.0, "b": 60.0, "gone": 999.0}}, ["a", "b"], 3, [RATE, "other"]
    )
    assert totals == {RATE: 180.0}
    assert values == {RATE: 60.0, "other": None}


def test_a_load_step_scales_out_once_and_the_pending_replicas_are_counted() -> None:
    scaler = Recording("ep", "busy", 1, 4, [POLICY], ["serving-registry", "serving"])
    desired, state = scaler(context([180.0], 1))  # 180/min on one replica, target 60: 3 replicas
    assert (desired, state) == (3, {"serve": "state"})
    # Next tick: Serve's target is 3 while two replicas still start; the same load is no reason for
    # more.
    assert scaler(context([180.0], 3, running=1))[0] == 3
    assert [r[2]["To"] for r in scaler.reports if r[2]] == [3]


def test_no_data_keeps_the_count() -> None:
    scaler = Recording("ep", "busy", 1, 4, [POLICY], ["r", "n"])
    ctx = context([], 2)
    assert scaler(ctx)[0] == 2
    assert scaler.reports[-1][2] is None


def test_a_failing_policy_keeps_serves_target() -> None:
    scaler = Recording("ep", "busy", 1, 4, [POLICY], ["r", "n"])
    ctx = context([60.0], 2)
    ctx.aggregated_metrics = {RATE: {"r0": -5.0}}  # invalid: the scaler refuses negative metrics
    assert scaler(ctx) == (2, {"serve": "state"})


def test_endpoint_level_containers_share_one_decision() -> None:
    autoscaling._ENDPOINT_GROUPS.pop("variant", None)
    a = Recording("variant", None, 1, 4, [POLICY], ["r", "n"], containers=["a", "b"])
    b = Recording("variant", None, 1, 4, [POLICY], ["r", "n"], containers=["a", "b"])
    assert a.scaler is b.scaler
    assert a(context([60.0], 1, name="a"))[0] == 1  # b not heard from yet: 60/min per instance
    autoscaling._ENDPOINT_GROUPS["variant"].decided_at = float("-inf")  # next tick
    # b reports 120/min: the variant takes 180/min per instance (one replica of each) -> 3 of each.
    assert b(context([120.0], 1, name="b"))[0] == 3
    assert a(context([60.0], 1, name="a"))[0] == 3


@pytest.mark.parametrize("level", ["container", "endpoint"])
def test_spec_becomes_a_serve_autoscaling_config_without_serves_own_delays(level: str) -> None:
    scaling = {
        "MinCapacity": 1,
        "MaxCapacity": 3,
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 70,
            "ScaleOutCooldown": 5,
            "ScaleInCooldown": 20,
        },
    }
    container = {"ContainerHostname": "c", "Image": "python"}
    document = (
        {"EndpointName": "e", "Containers": [{**container, "AutoScaling": scaling}]}
        if level == "container"
        else {"EndpointName": "e", "Containers": [container], "AutoScaling": scaling}
    )
    spec = parse_spec(document)
    config = serve_autoscaling_config(
        "e",
        "c" if level == "container" else None,
        spec.scaling_of(spec.Containers[0]),
        [p.as_policy() for p in spec.scaling_of(spec.Containers[0]).policies],
        ("serving-registry", "serving"),
    )
    assert (config["min_replicas"], config["max_replicas"], config["initial_replicas"]) == (1, 3, 1)
    assert config["upscale_delay_s"] == config["downscale_delay_s"] == 0
    kwargs = config["policy"]["policy_kwargs"]
    assert kwargs["policies"] == [
        {
            "metric": RATE,
            "target": 70.0,
            "scale_out_cooldown_s": 5.0,
            "scale_in_cooldown_s": 20.0,
            "disable_scale_in": False,
        }
    ]
    from ray.serve.config import (
        AutoscalingConfig,  # Serve accepts it as it is, and finds the class
    )

    assert AutoscalingConfig(**config).policy.get_policy() is ContainerAutoscaler
