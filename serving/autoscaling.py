"""Target tracking on Ray Serve: a custom autoscaling policy per container deployment.

Control plane. Serve builds one `ContainerAutoscaler` per container deployment inside its controller
(from the JSON `policy_kwargs` that `autoscaling_config` gives it) and calls it every control-loop
tick with the replicas' own stats (`ContainerReplica.record_autoscaling_stats`, averaged by Serve over
its look-back window). The decision is `scaling_policy.TargetTrackingScaler`'s; Serve's own upscale
and downscale delays are set to 0 so that only its cooldowns apply. Every change is reported to the
registry actor, which shows it in `GET /endpoints/{name}` and on `GET /metrics`.

An endpoint-level policy (all containers scale together, like a SageMaker production variant) is one
scaler shared by the endpoint's containers: the controller runs every policy in one process, so the
containers' autoscalers meet in `_ENDPOINT_GROUPS` (see `_groups`).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Any, Mapping

from serving.scaling_policy import ScalingDecision, TargetTracking, TargetTrackingScaler, activity

logger = logging.getLogger("serving.autoscaling")

# How often a replica's stats reach the controller, and the window Serve averages them over.
METRICS_INTERVAL_S = 2.0
LOOK_BACK_S = 10.0
POLICY_PATH = "serving.autoscaling:ContainerAutoscaler"
# An endpoint-level group decides once per tick for all its containers.
_GROUP_TICK_S = 0.5


def serve_autoscaling_config(endpoint: str, container: str | None, autoscaling: Any, policies: list[dict[str, Any]],
                             registry: tuple[str, str], containers: list[str] | None = None) -> dict[str, Any]:
    """The `autoscaling_config` of one container deployment (Serve's own delays neutralised).

    `container` None with `containers`: the endpoint-level policy, each deployment joining its group.
    """
    return {
        "min_replicas": autoscaling.MinCapacity,
        "max_replicas": autoscaling.MaxCapacity,
        "initial_replicas": autoscaling.MinCapacity,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "metrics_interval_s": METRICS_INTERVAL_S,
        "look_back_period_s": LOOK_BACK_S,
        # An import path, not the class: the controller imports this module (as it must on a cluster),
        # rather than unpickling a copy of it.
        "policy": {"policy_function": POLICY_PATH, "policy_kwargs": {
            "endpoint": endpoint, "container": container, "containers": containers or [],
            "min_capacity": autoscaling.MinCapacity, "max_capacity": autoscaling.MaxCapacity,
            "policies": policies, "registry": list(registry),
        }},
    }


def per_replica(aggregated: Mapping[str, Mapping[Any, float]] | None, running: list[Any], capacity: int,
                names: list[str]) -> tuple[dict[str, float | None], dict[str, float]]:
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


class _EndpointGroup:
    """One scaler for all containers of an endpoint: the endpoint-level policy."""

    def __init__(self, scaler: TargetTrackingScaler) -> None:
        self.scaler = scaler
        self.totals: dict[str, dict[str, float]] = {}  # container -> metric -> total over its replicas
        self.decision: ScalingDecision | None = None
        self.decided_at = float("-inf")
        self.lock = threading.Lock()


_ENDPOINT_GROUPS: dict[str, _EndpointGroup] = {}


def _groups() -> dict[str, _EndpointGroup]:
    """The controller's one table of endpoint groups.

    Serve pickles a policy's module by value for each deployment (Ray 2.60, `AutoscalingPolicy.
    serialize_policy`), so this module's globals exist once per deployment in the controller; the
    imported module's table is the one they all share.
    """
    return importlib.import_module("serving.autoscaling")._ENDPOINT_GROUPS


class ContainerAutoscaler:
    """Serve's policy for one container deployment (`policy_function`, built once with `policy_kwargs`)."""

    def __init__(self, endpoint: str, container: str | None, min_capacity: int, max_capacity: int,
                 policies: list[dict[str, Any]], registry: list[str], containers: list[str] | None = None) -> None:
        self.endpoint, self.container = endpoint, container
        self.policies = [TargetTracking(**policy) for policy in policies]
        self.names = [policy.metric for policy in self.policies]
        self.registry = tuple(registry)
        self.containers = list(containers or [])
        self.group: _EndpointGroup | None = None
        if container is None:  # endpoint level: one scaler for the endpoint, whichever container asks first
            self.group = _groups().setdefault(endpoint, _EndpointGroup(
                TargetTrackingScaler(self.policies, min_capacity, max_capacity)))
            self.scaler = self.group.scaler
        else:
            self.scaler = TargetTrackingScaler(self.policies, min_capacity, max_capacity)
        self._reported: tuple | None = None
        self._token: str | None = None  # registry writes need the control plane's capability

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        hostname = self.container or ctx.deployment_name
        target = ctx.target_num_replicas
        try:
            values, totals = per_replica(ctx.aggregated_metrics, list(ctx.running_replicas), target, self.names)
            if self.group is None:
                decision = self.scaler.decide(target, values)
            else:
                decision = self._decide_as_endpoint(hostname, target, totals)
        except Exception:  # a policy error must not stop Serve's control loop: keep the count
            logger.exception("autoscaling of %s/%s failed; keeping %d replicas", self.endpoint, hostname, target)
            return target, ctx.policy_state
        self._report(hostname, ctx.current_num_replicas, decision, values)
        return decision.desired, ctx.policy_state

    def _decide_as_endpoint(self, hostname: str, target: int, totals: dict[str, float]) -> ScalingDecision:
        group = self.group
        assert group is not None
        with group.lock:
            group.totals[hostname] = totals
            now = time.monotonic()
            if group.decision is None or now - group.decided_at >= _GROUP_TICK_S:
                # Per "instance" (one replica of every container): additive over containers.
                members = self.containers or list(group.totals)
                values: dict[str, float | None] = {}
                for name in self.names:
                    reported = [group.totals[c][name] for c in members if name in group.totals.get(c, {})]
                    values[name] = sum(reported) / max(target, 1) if reported else None
                    if reported and name in ("CPUUtilization", "MemoryUtilization"):
                        values[name] = sum(reported) / (max(target, 1) * len(reported))  # utilization: a mean
                group.decision = group.scaler.decide(target, values)
                group.decided_at = now
            decision = group.decision
        return decision if decision.current == target else ScalingDecision(
            decision.desired, target, decision.metric, decision.metric_value, decision.target, decision.reason,
            decision.scale_out_cooldown_left_s, decision.scale_in_cooldown_left_s)

    def _report(self, hostname: str, running: int, decision: ScalingDecision, values: dict[str, float | None]) -> None:
        """Tell the registry the container's desired count and, on a change, the activity (fire and forget)."""
        change = activity(decision, hostname) if decision.changed else None
        state = (decision.desired, running, decision.metric, None if decision.metric_value is None
                 else round(decision.metric_value, 3))
        if change is None and state == self._reported:
            return
        self._reported = state
        try:
            import ray

            registry = ray.get_actor(self.registry[0], namespace=self.registry[1])
            if self._token is None:  # the control plane's capability: the controller holds the cluster's token
                from serving import keys
                from serving.cluster import cluster_secret

                self._token = keys.control_token(cluster_secret())
            registry.record_scaling.remote(self._token, self.endpoint, hostname, {
                "DesiredReplicas": decision.desired, "MetricName": decision.metric,
                "MetricValue": decision.metric_value, "TargetValue": decision.target,
                "Metrics": {name: value for name, value in values.items() if value is not None},
            }, change)
        except Exception:
            logger.exception("could not report the scaling of %s/%s", self.endpoint, hostname)
