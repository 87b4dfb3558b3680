"""The control-plane API's stored documents, typed: what each row of the state database holds.

They stay JSON in SQLite (`database.ApiState`, one typed table per kind); these TypedDicts let mypy
check every key where a document is made or read. Statuses and kinds are Literal types: the JSON
holds the strings themselves. The parts that are SageMaker's own request shapes as a caller sent
them (a CreateModel or CreateEndpointConfig request, a DeploymentConfig, a DataCaptureConfig) stay
open JSON (`ApiJson`): `shapes` checks them on the way in and DescribeX returns them as they came.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from serving.documents import ApiJson, SpecJson

__all__ = [
    "ApiJson",
    "DeploymentPlan",
    "EndpointConfigDocument",
    "EndpointDocument",
    "EndpointStatus",
    "ModelDocument",
    "ModelSnapshot",
    "PendingUpdate",
    "Retired",
    "ScalableTargetDocument",
    "ScalingPolicyDocument",
    "Shift",
    "UpdateKind",
    "VariantRow",
]

# SageMaker's EndpointStatus values this runtime reaches (it has no OutOfService, SystemUpdating or
# RollingBack: a rollback here ends the update InService with the reason in FailureReason, as
# SageMaker's does once done).
EndpointStatus = Literal["Creating", "Updating", "InService", "Failed"]
# What started an endpoint update: CreateEndpoint, UpdateEndpoint,
# UpdateEndpointWeightsAndCapacities with new instance counts, or a restarted server bringing back
# what served.
UpdateKind = Literal["create", "update", "capacity", "restore"]


class ModelSnapshot(TypedDict):
    """A model as it is deployed (containers as spec entries, secrets sealed): each variant keeps
    its own copy."""

    mode: Literal["Direct", "Serial"]
    # spec container entries (config.container), as `translate` builds them
    containers: list[SpecJson]
    # the images as CreateModel named them (DeployedImages' SpecifiedImage)
    images: NotRequired[list[str]]


class ModelDocument(TypedDict):
    ModelName: str
    ModelArn: str
    CreationTime: float
    request: ApiJson  # the CreateModel request, secrets sealed (DescribeModel masks them)
    model: ModelSnapshot


class EndpointConfigDocument(TypedDict):
    EndpointConfigName: str
    EndpointConfigArn: str
    CreationTime: float
    request: ApiJson  # the CreateEndpointConfig request


class VariantRow(TypedDict):
    """One production or shadow variant of an endpoint's fleet: a served endpoint of its own
    (`Served`)."""

    VariantName: str
    ModelName: str
    Model: ModelSnapshot
    InstanceType: str
    Weight: float
    Count: int
    DataCapture: ApiJson | None  # the config's DataCaptureConfig: every variant captures alike
    # the served endpoint's name: endpoint, variant and generation (`translate.internal_name`)
    Served: str
    Shadow: NotRequired[bool]  # gets copies of sampled invocations, answers none


class DeploymentPlan(TypedDict):
    """An update's DeploymentConfig made into steps (`deployment.plan`)."""

    steps: list[float]  # each step's share of traffic on the new fleet, the last 1.0
    wait: float  # WaitIntervalInSeconds: how long each step bakes
    termination: float  # TerminationWaitInSeconds: the old fleet's extra life after the last step
    timeout: float | None  # MaximumExecutionTimeoutInSeconds
    alarms: list[str]  # AutoRollbackConfiguration's alarm names


class Shift(TypedDict):
    """Where a stepped update stands: the step baking, since when."""

    step: int
    since: float


class PendingUpdate(TypedDict):
    """The fleet an update brings up beside the serving one, and how far it got."""

    kind: UpdateKind
    EndpointConfigName: str
    variants: list[VariantRow]
    generations: dict[str, int]  # served endpoint -> the deploy generation that brings it up
    StartedAt: float
    # steps and rollback alarms, for UpdateEndpoint only
    deployment: NotRequired[DeploymentPlan | None]
    # set once the new fleet is InService and traffic moves in steps
    shift: NotRequired[Shift | None]


class Retired(TypedDict):
    """A served endpoint traffic has left: deleted at `At` + DRAIN_S (requests in flight finish)."""

    Served: str
    At: float


class EndpointDocument(TypedDict):
    EndpointName: str
    EndpointArn: str
    EndpointConfigName: str
    CreationTime: float
    LastModifiedTime: float
    EndpointStatus: EndpointStatus
    FailureReason: str | None
    Tags: list[dict[str, str]]
    Generation: int  # of the latest fleet; each create or update brings up a new one
    variants: list[VariantRow]  # the fleet that serves
    pending: PendingUpdate | None  # the fleet coming up, while an update is under way
    retired: NotRequired[list[Retired]]
    DeploymentConfig: NotRequired[ApiJson]  # the last one given, for RetainDeploymentConfig


class ScalableTargetDocument(TypedDict):
    ServiceNamespace: str
    ResourceId: str  # endpoint/<name>/variant/<variant>
    ScalableDimension: str
    MinCapacity: int
    MaxCapacity: int
    RoleARN: str
    CreationTime: float
    ScalableTargetARN: str


class ScalingPolicyDocument(TypedDict):
    key: str  # <ResourceId>/<PolicyName>
    PolicyName: str
    PolicyARN: str
    ServiceNamespace: str
    ResourceId: str
    ScalableDimension: str
    PolicyType: str
    TargetTrackingScalingPolicyConfiguration: ApiJson
    Alarms: list[ApiJson]
    CreationTime: float
    spec: ApiJson  # the policy as a spec's TargetTrackingScalingPolicyConfiguration entry
