"""Target tracking on Ray Serve: the custom autoscaling policy Serve's controller runs per
container."""

from __future__ import annotations

import importlib
import logging
import threading
import time

from serving.autoscaling.config import ServeOptions, per_replica
from serving.autoscaling.policy import (
    PolicyArguments,
    ScalingDecision,
    TargetTracking,
    TargetTrackingScaler,
    activity,
)

logger = logging.getLogger("serving.ray_wing.autoscaler")


# An endpoint-level group decides once per tick for all its containers.
_GROUP_TICK_S = 0.5


class _EndpointGroup:
    """One scaler for all containers of an endpoint: the endpoint-level policy."""

    def __init__(self, scaler: TargetTrackingScaler) -> None:
        self.scaler = scaler
        # container -> metric -> total over its replicas
        self.totals: dict[str, dict[str, float]] = {}
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
    return importlib.import_module("serving.ray_wing.autoscaler")._ENDPOINT_GROUPS


class ContainerAutoscaler:
    """Serve's policy for one container deployment (`policy_function`, built once with
    `policy_kwargs`)."""

    def __init__(
        self,
        endpoint: str,
        container: str | None,
        min_capacity: int,
        max_capacity: int,
        policies: list[PolicyArguments],
        registry: list[str],
        containers: list[str] | None = None,
    ) -> None:
        self.endpoint, self.container = endpoint, container
        self.policies = [TargetTracking(**policy) for policy in policies]
        self.names = [policy.metric for policy in self.policies]
        self.registry = tuple(registry)
        self.containers = list(containers or [])
        self.group: _EndpointGroup | None = None
        # endpoint level: one scaler for the endpoint, whichever container asks first
        if container is None:
            self.group = _groups().setdefault(
                endpoint,
                _EndpointGroup(TargetTrackingScaler(self.policies, min_capacity, max_capacity)),
            )
            self.scaler = self.group.scaler
        else:
            self.scaler = TargetTrackingScaler(self.policies, min_capacity, max_capacity)
        self._reported: tuple | None = None
        self._token: str | None = None  # registry writes need the control plane's capability

    def __call__(self, ctx) -> tuple[int, ServeOptions]:
        hostname = self.container or ctx.deployment_name
        target = ctx.target_num_replicas
        try:
            values, totals = per_replica(
                ctx.aggregated_metrics, list(ctx.running_replicas), target, self.names
            )
            if self.group is None:
                decision = self.scaler.decide(target, values)
            else:
                decision = self._decide_as_endpoint(hostname, target, totals)
        except Exception:  # a policy error must not stop Serve's control loop: keep the count
            logger.exception(
                "autoscaling of %s/%s failed; keeping %d replicas", self.endpoint, hostname, target
            )
            return target, ctx.policy_state
        self._report(hostname, ctx.current_num_replicas, decision, values)
        return decision.desired, ctx.policy_state

    def _decide_as_endpoint(
        self, hostname: str, target: int, totals: dict[str, float]
    ) -> ScalingDecision:
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
                    reported = [
                        group.totals[c][name] for c in members if name in group.totals.get(c, {})
                    ]
                    values[name] = sum(reported) / max(target, 1) if reported else None
                    if reported and name in ("CPUUtilization", "MemoryUtilization"):
                        # utilization: a mean
                        values[name] = sum(reported) / (max(target, 1) * len(reported))
                group.decision = group.scaler.decide(target, values)
                group.decided_at = now
            decision = group.decision
        return (
            decision
            if decision.current == target
            else ScalingDecision(
                decision.desired,
                target,
                decision.metric,
                decision.metric_value,
                decision.target,
                decision.reason,
                decision.scale_out_cooldown_left_s,
                decision.scale_in_cooldown_left_s,
            )
        )

    def _report(
        self,
        hostname: str,
        running: int,
        decision: ScalingDecision,
        values: dict[str, float | None],
    ) -> None:
        """Tell the registry the container's desired count and, on a change, the activity (fire and
        forget)."""
        change = activity(decision, hostname) if decision.changed else None
        state = (
            decision.desired,
            running,
            decision.metric,
            None if decision.metric_value is None else round(decision.metric_value, 3),
        )
        if change is None and state == self._reported:
            return
        self._reported = state
        try:
            import ray

            registry = ray.get_actor(self.registry[0], namespace=self.registry[1])
            # the control plane's capability: the controller holds the cluster's token
            if self._token is None:
                from serving.ray_wing.cluster import cluster_secret
                from serving.trust import keys

                self._token = keys.control_token(cluster_secret())
            registry.record_scaling.remote(
                self._token,
                self.endpoint,
                hostname,
                {
                    "DesiredReplicas": decision.desired,
                    "MetricName": decision.metric,
                    "MetricValue": decision.metric_value,
                    "TargetValue": decision.target,
                    "Metrics": {name: value for name, value in values.items() if value is not None},
                },
                change,
            )
        except Exception:
            logger.exception("could not report the scaling of %s/%s", self.endpoint, hostname)
