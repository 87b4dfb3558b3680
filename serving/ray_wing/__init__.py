"""The Ray wing: everything that imports `ray`, and nothing else does (tests/unit/test_layout.py
checks).

Modules: `cluster` (start or join Ray), `names` (Ray names the wing shares), `registry` (the routing
table's actor), `reconcile` (its loop toward each endpoint's desired state), `replica_table` (its
replicas), `gateway_readers` (what each gateway applied), `kv_store` (its state in GCS),
`registry_feed` (its snapshot feed's server), `registry_follower` (a gateway's long poll of it),
`control_plane` (the SageMaker API's one place), `control_seat` (its place in the registry's
process), `replica` (a container replica's supervisor, and its Serve replica, for a container Serve
runs), `container_host` (one node's supervisor of many), `node_hosting` (the registry placing and
watching them), `slot_reservations` (their resources, as placement groups), `hosted_scaling` (the
registry's target tracking for them), `gateway` (the endpoint HTTP server), `gateway_fleet` (the
gateways on every node, kept by the registry), `server_start` (the control plane and gateways,
started together), `gateway_counters` (their counters, shared),
`async_journal` (their async requests, durable), `periodic` (their periodic tasks' one
error-and-backoff policy), `serve_status`, `autoscaler`, `replica_metrics`, `operations` (deploy,
delete, describe), `embedded` (the one embedded server), `training` and `train_session` (`serving
train`'s driver and worker sides).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and readers
    from serving.ray_wing.cluster import (
        UnauthenticatedClusterError,
        connect_cluster,
        start_local_ray,
    )
    from serving.ray_wing.embedded import EmbeddedServer, EndpointsNotReady, Readiness
    from serving.ray_wing.operations import (
        control_token,
        delete_endpoint,
        deploy_endpoint,
        describe_endpoints,
        disconnect,
        http_control_token,
        root_secret,
        shutdown,
    )
    from serving.ray_wing.registry import registry_handle
    from serving.ray_wing.server_start import start_gateway

# Every name loads its module on first use (PEP 562): a replica's worker process imports
# `serving.ray_wing.replica` alone, not the gateway, the registry and the embedded server with it,
# and a container host imports no `ray.serve` (~45 MiB). `serve_status` is not exported: it is also
# a submodule, whose import would replace the package's attribute; import it from there.
_HOMES = {
    "UnauthenticatedClusterError": "cluster",
    "connect_cluster": "cluster",
    "start_local_ray": "cluster",
    "EmbeddedServer": "embedded",
    "EndpointsNotReady": "embedded",
    "Readiness": "embedded",
    "start_gateway": "server_start",
    "control_token": "operations",
    "delete_endpoint": "operations",
    "deploy_endpoint": "operations",
    "describe_endpoints": "operations",
    "disconnect": "operations",
    "http_control_token": "operations",
    "root_secret": "operations",
    "shutdown": "operations",
    "registry_handle": "registry",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "EmbeddedServer",
    "EndpointsNotReady",
    "Readiness",
    "UnauthenticatedClusterError",
    "connect_cluster",
    "control_token",
    "delete_endpoint",
    "deploy_endpoint",
    "describe_endpoints",
    "disconnect",
    "http_control_token",
    "registry_handle",
    "root_secret",
    "shutdown",
    "start_gateway",
    "start_local_ray",
]
