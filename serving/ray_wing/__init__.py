"""The Ray wing: everything that imports `ray`, and nothing else does (tests/unit/test_layout.py checks).

`cluster` starts the embedded Ray or joins a cluster and derives the root secret; `registry` is the
control plane's actor (state in GCS, reconcile loop); `replica` supervises one model-server process per
Serve replica; `gateway` runs the endpoint HTTP server as a Serve replica; `serve_status` reads Serve's
statuses; `autoscaler` is the policy Serve's controller calls; `replica_metrics` records through Ray's
metrics API; `operations` is what the CLI and tests call (deploy, delete, describe, shut down);
`embedded` is the one embedded server, as a context manager.
"""

from serving.ray_wing.cluster import (
    UnauthenticatedClusterError,
    connect_cluster,
    start_local_ray,
)
from serving.ray_wing.embedded import EmbeddedServer, EndpointsNotReady, Readiness
from serving.ray_wing.gateway import start_gateway
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
from serving.ray_wing.serve_status import ServeNotRunning, serve_status

__all__ = [
    "EmbeddedServer",
    "EndpointsNotReady",
    "Readiness",
    "ServeNotRunning",
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
    "serve_status",
    "shutdown",
    "start_gateway",
    "start_local_ray",
]
