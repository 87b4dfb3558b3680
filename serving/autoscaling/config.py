"""What a container's Serve deployment is told about autoscaling: its config and our policy's
arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serving.autoscaling.policy import PolicyArguments

# A document of Serve's own (an `autoscaling_config`, a policy's decision metadata) as Serve reads
# it: its shape is Ray's, open here by design.
ServeOptions = dict[str, Any]

# How often a replica's stats reach the controller, and the window Serve averages them over.
METRICS_INTERVAL_S = 2.0


LOOK_BACK_S = 10.0


POLICY_PATH = "serving.ray_wing.autoscaler:ContainerAutoscaler"


def serve_autoscaling_config(
    endpoint: str,
    container: str | None,
    autoscaling: Any,
    policies: list[PolicyArguments],
    registry: tuple[str, str],
    containers: list[str] | None = None,
) -> ServeOptions:
    """The `autoscaling_config` of one container deployment (Serve's own delays neutralised).

    `container` None with `containers`: the endpoint-level policy, each deployment joining its
    group.
    """
    return {
        "min_replicas": autoscaling.MinCapacity,
        "max_replicas": autoscaling.MaxCapacity,
        "initial_replicas": autoscaling.MinCapacity,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "metrics_interval_s": METRICS_INTERVAL_S,
        "look_back_period_s": LOOK_BACK_S,
        # An import path, not the class: the controller imports this module (as it must on a
        # cluster), rather than unpickling a copy of it.
        "policy": {
            "policy_function": POLICY_PATH,
            "policy_kwargs": {
                "endpoint": endpoint,
                "container": container,
                "containers": containers or [],
                "min_capacity": autoscaling.MinCapacity,
                "max_capacity": autoscaling.MaxCapacity,
                "policies": policies,
                "registry": list(registry),
            },
        },
    }


def per_replica(
    aggregated: Mapping[str, Mapping[Any, float]] | None,
    running: list[Any],
    capacity: int,
    names: list[str],
) -> tuple[dict[str, float | None], dict[str, float]]:
    """Each metric per replica of the capacity Serve is heading to, and each metric's total.

    Summed over the running replicas and divided by the target count: while added replicas start,
    the load is already shared by them in the estimate, so one step of load is not scaled for twice.
    """
    totals: dict[str, float] = {}
    values: dict[str, float | None] = {}
    running_ids = set(running)
    for name in names:
        by_replica = (aggregated or {}).get(name) or {}
        reported = [value for replica, value in by_replica.items() if replica in running_ids]
        if not reported:
            values[name] = None
            continue
        totals[name] = float(sum(reported))
        values[name] = totals[name] / max(capacity, 1)
    return values, totals
