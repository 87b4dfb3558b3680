"""Names every part of the Ray wing agrees on: the registry's, the head node's resource."""

from __future__ import annotations

from serving.protocol import RAY_NAMESPACE as NAMESPACE
from serving.protocol import REGISTRY_ACTOR as REGISTRY_NAME

# Control-plane actors live on the head node, which outlives worker nodes.
ON_HEAD = {"node:__internal_head__": 0.001}

HEARTBEAT_S = 5.0  # how often a replica tells the registry it is alive
REPLICA_TTL_S = 15.0  # a replica not heard from for this long (crashed, node lost) leaves the table


def existing_registry():
    """The registry actor, which the control plane created (replicas only look it up)."""
    import ray

    return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
