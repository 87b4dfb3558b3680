"""Control-plane operations on a running cluster: deploy, delete, describe, shut down."""

from __future__ import annotations

import time
from functools import lru_cache

import ray

from serving.config.spec import EndpointSpec
from serving.control.container_versions import (
    parse_app_name,
)
from serving.control.plans import endpoint_record
from serving.control.records import EndpointDescription
from serving.control.status import EndpointRecord, StatusBoard
from serving.ray_wing.cluster import (
    cluster_secret,
    stop_local_ray,
)
from serving.ray_wing.gateway_fleet import stop_gateways
from serving.ray_wing.names import existing_registry
from serving.ray_wing.registry import registry_handle
from serving.ray_wing.serve_status import (
    ServeNotRunning,
    serve_status,
)
from serving.settings import ServerSettings
from serving.trust import keys


@lru_cache(maxsize=1)
def root_secret() -> bytes:
    return cluster_secret()


def control_token() -> str:
    """The control plane's capability for registry writes (derivable only with the cluster's
    token)."""
    return keys.control_token(root_secret())


def http_control_token() -> str:
    """What the gateway's control routes (`serving apply` / `serving delete` over HTTP) require."""
    return keys.http_control_token(root_secret())


def deploy_endpoint(spec: EndpointSpec, settings: ServerSettings) -> int:
    """Create or update the endpoint (blue/green per changed container); returns without waiting.

    The registry deploys each new container version beside the serving one and moves traffic once
    all are ready, or rolls back (see `container_versions`); `describe_endpoints` shows the
    progress. Returns the update's generation: its description's `LastUpdate.Generation` once the
    gateway has seen it.
    """
    generation = ray.get(
        registry_handle().put_endpoint.remote(control_token(), endpoint_record(spec, settings)),
        timeout=30,
    )
    if not generation:
        raise RuntimeError(
            "the registry refused the endpoint: this process does not hold the cluster's token"
        )
    return generation


def expect_endpoints(names: list[str], expected: bool = True) -> None:
    """Tell the registry these endpoints are about to be deployed: no gateway answers /ping with 200
    until they route (or are deleted). `expected=False`: they will not be after all."""
    if names and not ray.get(
        registry_handle().expect.remote(control_token(), names, expected), timeout=30
    ):
        raise RuntimeError(
            "the registry refused the endpoints: this process does not hold the cluster's token"
        )


def delete_endpoint(name: str, timeout: float = 60.0, wait: bool = True) -> bool:
    """Stop routing to the endpoint and (`wait`) wait, bounded, until its applications are gone;
    False if it was unknown."""
    registry = registry_handle()
    known = name in (ray.get(registry.snapshot.remote(-1), timeout=30) or {}).get("endpoints", {})
    ray.get(registry.delete_endpoint.remote(control_token(), name), timeout=30)
    if not wait:
        return known
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not any((parse_app_name(app) or ("",))[0] == name for app in serve_status()):
                break
        except ServeNotRunning:
            break
        time.sleep(0.5)
    return known


def shutdown(timeout: float = 30.0) -> None:
    """Stop every endpoint and the gateways gracefully, then the embedded Ray (never used on a
    shared cluster).

    Once the registry has stopped reconciling (it would deploy them again) and keeping the gateways
    (it would start them again), the gateways drain and stop, and Serve's applications, if a
    container Serve runs started its controller, are deleted (their replicas drain). Not
    `serve.shutdown()`: its controller kills itself while the driver's call to it is still open,
    and Ray prints "Task ServeController.graceful_shutdown failed ... will be retried" on the
    console of every clean stop. Stopping Ray then ends the rest, no call to any of it open.
    """
    try:
        try:
            ray.get(existing_registry().stop_reconciling.remote(control_token()), timeout=30)
        except ValueError:
            pass  # never started
        stop_gateways()
        deadline = time.monotonic() + timeout
        apps = list(serve_status())
        from ray import serve  # here: only a server whose containers Serve runs gets here

        for app in apps:
            serve.delete(app, _blocking=False)
        while apps and time.monotonic() < deadline:
            time.sleep(0.2)
            apps = list(serve_status())
    except ServeNotRunning:
        pass
    finally:
        stop_local_ray()


def describe_endpoints() -> dict[str, EndpointDescription]:
    """Descriptions of every endpoint, read from the registry (no HTTP needed)."""
    snapshot = ray.get(registry_handle().snapshot.remote(-1), timeout=30)
    board = StatusBoard()
    board.records = {
        name: EndpointRecord.from_snapshot(record) for name, record in snapshot["endpoints"].items()
    }
    board.refresh(snapshot["statuses"], snapshot["registered"])
    return board.descriptions


def disconnect() -> None:
    """Leave a cluster, its gateways and endpoints running."""
    ray.shutdown()
