"""The records the control plane hands the registry, and the registry the gateway and the replicas, typed.

They cross processes through Ray and sit in Ray's key-value store as JSON, so they stay plain dicts (TypedDicts,
not classes): what changes is that mypy knows every key, and a key misspelt where a record is made or read fails
`make lint` instead of a replica at start. `plans.endpoint_record` makes them; `rollout`, the registry, the
container replica and the gateway's state read them.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["ContainerPlan", "ContainerRow", "EndpointUpdate", "RegistryRecord"]


class ContainerPlan(TypedDict):
    """Everything one container's replicas are built from; its digest is the container's version."""

    image: str
    model_data: str | None
    environment: dict[str, str]  # the container process's (Environment, Batching, the Resources share)
    bind_host: str  # where data ports bind: an address, or "node" for the Ray node's
    multi_model: dict[str, Any] | None  # MultiModel settings, None for a SingleModel container
    sandbox: str  # auto | required | off
    closed_ports: list[int]  # the endpoint server's ports, closed to the container process
    working_dir: str | None
    gpus: float
    actor_options: dict[str, Any]  # Ray actor options of each replica (CPUs, GPUs, memory, runtime_env)
    count: dict[str, Any]  # Serve's `num_replicas`, or its `autoscaling_config`


class ContainerRow(TypedDict):
    """One container of a record, as descriptions show it."""

    ContainerHostname: str
    Image: str
    Mode: str  # SingleModel | MultiModel
    DesiredReplicas: int
    Version: str


class RegistryRecord(TypedDict):
    """One endpoint as the registry keeps it: what the router and descriptions need, and each container's plan."""

    name: str
    mode: str  # Direct | Serial
    containers: list[ContainerRow]
    limits: dict[str, int]  # requests in flight per replica, by container
    not_idempotent: list[str]  # containers whose requests are never sent twice
    access: dict[str, Any] | None  # where the gateway reads the identities (no secret), None: anonymous
    async_inference: dict[str, Any] | None  # AsyncInferenceConfig, as JSON
    plans: dict[str, ContainerPlan]  # by container hostname


class EndpointUpdate(TypedDict, total=False):
    """The state of an endpoint's latest update (`rollout.EndpointState.update`)."""

    Generation: int
    Status: str  # InProgress | Succeeded | Failed
    FailureReason: str | None
    StartedAt: float
    FinishedAt: float
