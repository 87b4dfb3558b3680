"""How many gateways run: `gateways_per_node` on every live Ray node, as Serve's autoscaling policy
of the gateway deployment. Serve's controller asks it every loop, so a node that joins gets its
gateways and a node that leaves takes only its own, with nobody acting; `max_replicas_per_node`
keeps them one node's share each."""

from __future__ import annotations

import time

from serving.autoscaling.config import ServeOptions

# how long a count of live nodes is reused (the controller asks many times a second)
NODES_TTL_S = 2.0
MAX_NODES = 1000  # Serve needs an upper bound


def live_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def autoscaling_config(per_node: int, nodes: int) -> ServeOptions:
    """The gateway deployment's `autoscaling_config`: this policy, starting at `per_node` ×
    `nodes`."""
    return {
        "min_replicas": per_node,
        "max_replicas": per_node * MAX_NODES,
        "initial_replicas": per_node * max(nodes, 1),
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "policy": {
            "policy_function": "serving.ray_wing.gateway_count:GatewayCount",
            "policy_kwargs": {"per_node": per_node},
        },
    }


class GatewayCount:
    """Serve's policy for the gateway deployment: `per_node` replicas per live node."""

    def __init__(self, per_node: int) -> None:
        self.per_node = per_node
        self._nodes, self._counted_at = 1, float("-inf")

    def __call__(self, ctx) -> tuple[int, ServeOptions]:
        now = time.monotonic()
        if now - self._counted_at > NODES_TTL_S:
            try:
                self._nodes = max(live_nodes(), 1)
            except Exception:  # the GCS briefly unreachable: keep the last count
                pass
            self._counted_at = now
        return self.per_node * self._nodes, ctx.policy_state
