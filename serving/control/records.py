"""The records the control plane hands the registry, and the registry the gateway and the replicas,
typed.

They cross processes through Ray and sit in Ray's key-value store as JSON, so they stay plain dicts
(TypedDicts, not classes): what changes is that mypy knows every key, and a key misspelt where a
record is made or read fails `make lint` instead of a replica at start. `plans.endpoint_record`
makes them; `container_versions`, the registry, the container replica and the gateway's state read
them.

One key style: snake_case for the runtime's own fields; PascalCase only for the parts shown as they
are in a SageMaker-shaped description (a container row, an update's status). Statuses and modes are
Literal types (below).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from serving.access.identities import AccessReference
from serving.autoscaling.policy import ScalerState, ScalingActivity
from serving.models.cache_limits import CacheLimits

__all__ = [
    "ApiRouting",
    "AppStatus",
    "ContainerDescription",
    "ContainerPlan",
    "ContainerRow",
    "EndpointDescription",
    "EndpointStatus",
    "LastUpdate",
    "Passthrough",
    "DeploymentStatus",
    "EndpointSnapshot",
    "VersionsUpdate",
    "RegistryRecord",
    "ScalingRecord",
    "Snapshot",
    "ContainerMode",
    "Mode",
    "UpdateStatus",
]

# The closed sets of values, as the JSON holds them. Literal types rather than `str` enums: a record
# crosses Ray by pickle as well as the key-value store by JSON, and an enum member that survives the
# pickle formats as `ExecutionMode.SERIAL` in a log line or a metric label; a Literal is the string
# itself, checked by mypy.
Mode = Literal["Direct", "Serial"]  # config.spec.ExecutionMode's values
ContainerMode = Literal["SingleModel", "MultiModel"]  # config.container.ContainerMode's values
UpdateStatus = Literal["InProgress", "Succeeded", "Failed"]
EndpointStatus = Literal["Creating", "Updating", "InService", "Failed"]
# A document kept as the spec gave it (AsyncInferenceConfig, DataCaptureConfig, MultiModel settings:
# validated by their config models, which are their types), or options handed through to Ray as they
# are (actor options, Serve's autoscaling_config): open here by design.
Passthrough = dict[str, Any]


class ContainerPlan(TypedDict):
    """Everything one container's replicas are built from; its digest is the container's version."""

    image: str
    model_data: str | None
    # the container process's (Environment, Batching, the Resources share)
    environment: dict[str, str]
    bind_host: str  # where data ports bind: an address, or "node" for the Ray node's
    multi_model: CacheLimits | None  # None for a SingleModel container
    sandbox: str  # auto | required | off
    # opted in: TCP ports it may connect to from the node's network; else none, isolated
    egress_ports: list[int]
    # where no network namespace can be made: the node's network under its rules
    shared_network: bool
    # may be forked from its stack's template (a plan stored before templates has none: they may)
    fork_template: NotRequired[bool]
    # "node": its replicas live in their nodes' container hosts (absent: each is a Serve replica)
    hosting: NotRequired[str]
    working_dir: str | None
    gpus: float
    # Ray actor options of each replica (CPUs, GPUs, memory, runtime_env)
    actor_options: Passthrough
    count: Passthrough  # Serve's `num_replicas`, or its `autoscaling_config`


class ContainerRow(TypedDict):
    """One container of a record, as descriptions show it."""

    ContainerHostname: str
    Image: str
    Mode: ContainerMode
    DesiredReplicas: int
    Version: str


class RegistryRecord(TypedDict):
    """One endpoint as the registry keeps it: what the router and descriptions need, and each
    container's plan."""

    name: str
    mode: Mode
    containers: list[ContainerRow]
    limits: dict[str, int]  # requests in flight per replica, by container
    not_idempotent: list[str]  # containers whose requests are never sent twice
    # where the gateway reads the identities (no secret), None: anonymous
    access: AccessReference | None
    async_inference: Passthrough | None  # AsyncInferenceConfig, as JSON
    # DataCaptureConfig, as JSON (absent in records saved before it)
    data_capture: NotRequired[Passthrough | None]
    plans: dict[str, ContainerPlan]  # by container hostname


class VersionsUpdate(TypedDict, total=False):
    """Where the latest move of an endpoint's containers to new versions stands
    (`container_versions.EndpointState`)."""

    Generation: int
    Status: UpdateStatus
    FailureReason: str | None
    StartedAt: float
    FinishedAt: float


class LastUpdate(TypedDict):
    """A description's view of the latest update: every key, None where it has none yet."""

    Generation: int | None
    Status: UpdateStatus | None
    FailureReason: str | None
    StartedAt: float | None
    FinishedAt: float | None


class ReplicaCounts(TypedDict):
    Running: int
    Starting: int
    Stopping: int


class ContainerDescription(ContainerRow):
    """One container in an endpoint's description: its row, and how its replicas stand."""

    Status: EndpointStatus
    CurrentReplicas: int
    Replicas: ReplicaCounts
    ScalingMetric: NotRequired[
        dict[str, float | str | None]
    ]  # an autoscaled one's MetricName, MetricValue, TargetValue
    PendingVersion: NotRequired[str]  # the version being moved to
    LastFailureReason: NotRequired[str]
    FailureReason: NotRequired[str]


class EndpointDescription(TypedDict):
    """An endpoint as `GET /endpoints/<name>` describes it (DescribeEndpoint-shaped:
    `control.status.describe`)."""

    EndpointName: str
    EndpointStatus: EndpointStatus
    FailureReason: str | None
    InferenceExecutionConfig: dict[str, Mode]
    Containers: list[ContainerDescription]
    LastUpdate: LastUpdate
    ScalingActivities: list[ScalingActivity]
    AsyncInferenceConfig: NotRequired[Passthrough]
    DataCaptureConfig: NotRequired[Passthrough]  # its summary, as DescribeEndpoint shows it


class DeploymentStatus(TypedDict):
    """One Serve deployment's status, as `ray_wing.serve_status` reads it."""

    status: str  # Serve's DeploymentStatus value
    message: str
    replicas: dict[str, int]  # replica count by Serve replica state


class AppStatus(TypedDict):
    """One Serve application's status (one container version), as `ray_wing.serve_status` reads
    it."""

    status: str  # Serve's ApplicationStatus value (DEPLOY_FAILED, RUNNING ...)
    message: str
    deployments: dict[str, DeploymentStatus]


class ScalingRecord(TypedDict):
    """An endpoint's autoscaling as the registry keeps it: each container's latest state, recent
    activities."""

    containers: dict[str, ScalerState]  # by container hostname
    activities: list[ScalingActivity]  # newest first


class EndpointSnapshot(TypedDict):
    """One endpoint in a snapshot: its routing record without plans, and where its update stands."""

    name: str
    mode: Mode
    containers: list[ContainerRow]
    limits: dict[str, int]
    not_idempotent: list[str]
    access: AccessReference | None
    async_inference: Passthrough | None
    data_capture: Passthrough | None
    update: VersionsUpdate
    failed: bool  # its first deployment could not be brought up
    in_service: bool  # brought up once
    desired_versions: dict[str, str]  # hostname -> the version being rolled out


class ApiRouting(TypedDict):
    """What the control-plane API publishes for every gateway: each API endpoint's variants, and the
    served endpoints behind them (a gateway is not ready until it has seen each of those)."""

    # endpoint -> (variant, served endpoint, weight)
    fronts: dict[str, list[tuple[str, str, float]]]
    # endpoint -> (variant, served endpoint, share)
    shadows: NotRequired[dict[str, list[tuple[str, str, float]]]]
    served: list[str]


class Snapshot(TypedDict):
    """Everything a gateway needs from the registry (`Registry.snapshot`), versioned for the long
    poll."""

    version: int
    epoch: str
    endpoints: dict[str, EndpointSnapshot]
    # (endpoint, container) -> URLs of the routed version
    replicas: dict[tuple[str, str], list[str]]
    registered: dict[tuple[str, str, str], int]  # (endpoint, container, version) -> live replicas
    statuses: dict[str, AppStatus]  # by Serve application name
    refused: int  # calls refused for want of the control plane's token
    awaited: list[str]  # endpoints a server was started with, not deployed yet (`Registry.expect`)
    # None until the control-plane API has restored its endpoints and published
    api: ApiRouting | None
    scaling: dict[str, ScalingRecord]
    # the registry's snapshot feed (`control.snapshot_feed`), once open: where gateways long-poll
    feed: NotRequired[str | None]
