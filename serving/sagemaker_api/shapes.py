"""The requests of SageMaker's operations as SageMaker defines them, validated (Application Auto
Scaling's: `autoscaling_shapes`).

Field names are the services' own. A field SageMaker has but this runtime does not support is not a
field here, so the request is refused with a ValidationException naming it (never silently ignored);
so is a field neither service knows. Values are checked as the services document them (names,
counts, weights).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from serving.documents import field_path
from serving.errors import ApiValidationError
from serving.protocol import NAME_PATTERN

Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]
EnvironmentMap = dict[
    Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,1023}$")],
    Annotated[str, Field(max_length=1024)],
]


class Shape(BaseModel):
    """A request structure: unknown or unsupported fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Tag(Shape):
    Key: Annotated[str, Field(min_length=1, max_length=128)]
    Value: Annotated[str, Field(max_length=256)] = ""


class MultiModelConfigShape(Shape):
    ModelCacheSetting: Literal["Enabled", "Disabled"] = "Enabled"


class ContainerDefinition(Shape):
    """One container of a model (SageMaker's ContainerDefinition, without the fields this runtime
    lacks)."""

    ContainerHostname: Name | None = None
    Image: Annotated[str, Field(min_length=1, max_length=255)]
    Mode: Literal["SingleModel", "MultiModel"] = "SingleModel"
    ModelDataUrl: Annotated[str, Field(max_length=1024)] | None = None
    Environment: EnvironmentMap = Field(default_factory=dict)
    MultiModelConfig: MultiModelConfigShape | None = None


class InferenceExecutionConfigShape(Shape):
    Mode: Literal["Direct", "Serial"]


class CreateModelInput(Shape):
    ModelName: Name
    PrimaryContainer: ContainerDefinition | None = None
    Containers: Annotated[list[ContainerDefinition], Field(max_length=15)] | None = None
    InferenceExecutionConfig: InferenceExecutionConfigShape | None = None
    # Accepted and shown by DescribeModel; no role is assumed here (docs/sagemaker-api.md).
    ExecutionRoleArn: Annotated[str, Field(min_length=20, max_length=2048)] | None = None
    # None or True: no network for the containers (the default here); False: outbound TCP to the
    # operator's container_egress_ports, refused where there are none (docs/sagemaker-api.md)
    EnableNetworkIsolation: bool | None = None
    Tags: Annotated[list[Tag], Field(max_length=50)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _containers(self) -> CreateModelInput:
        if (self.PrimaryContainer is None) == (self.Containers is None):
            raise ValueError("give exactly one of PrimaryContainer and Containers")
        if self.Containers is not None and not self.Containers:
            raise ValueError("Containers must hold 1 to 15 containers")
        if self.InferenceExecutionConfig is not None and self.Containers is None:
            raise ValueError(
                "InferenceExecutionConfig applies to Containers, not to a PrimaryContainer"
            )
        return self


class ProductionVariant(Shape):
    VariantName: Name
    ModelName: Name
    InitialInstanceCount: Annotated[int, Field(ge=1, le=100)] = 1
    InstanceType: Annotated[str, Field(min_length=1, max_length=64)]
    InitialVariantWeight: Annotated[float, Field(ge=0)] = 1.0


class CaptureOptionShape(Shape):
    CaptureMode: Literal["Input", "Output", "InputAndOutput"]


class CaptureContentTypeHeaderShape(Shape):
    CsvContentTypes: Annotated[list[str], Field(min_length=1, max_length=10)] | None = None
    JsonContentTypes: Annotated[list[str], Field(min_length=1, max_length=10)] | None = None


class DataCaptureConfigShape(Shape):
    """SageMaker's DataCaptureConfig. Through the API the destination is S3 only, as SageMaker's own
    pattern says: a caller may not choose a folder of the server's machine (a spec file may,
    docs/spec.md)."""

    EnableCapture: bool = True
    InitialSamplingPercentage: Annotated[int, Field(ge=0, le=100)]
    DestinationS3Uri: Annotated[str, Field(pattern=r"^s3://", max_length=512)]
    KmsKeyId: Annotated[str, Field(max_length=2048)] | None = None
    CaptureOptions: Annotated[list[CaptureOptionShape], Field(min_length=1, max_length=32)]
    CaptureContentTypeHeader: CaptureContentTypeHeaderShape | None = None


class CreateEndpointConfigInput(Shape):
    EndpointConfigName: Name
    ProductionVariants: Annotated[list[ProductionVariant], Field(min_length=1, max_length=10)]
    ShadowProductionVariants: (
        Annotated[list[ProductionVariant], Field(min_length=1, max_length=1)] | None
    ) = None
    DataCaptureConfig: DataCaptureConfigShape | None = None
    Tags: Annotated[list[Tag], Field(max_length=50)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_variants(self) -> CreateEndpointConfigInput:
        if self.ShadowProductionVariants and len(self.ProductionVariants) > 1:
            raise ValueError(
                "ProductionVariants: with ShadowProductionVariants, give one production variant (as SageMaker)"
            )
        names = [
            variant.VariantName
            for variant in [*self.ProductionVariants, *(self.ShadowProductionVariants or [])]
        ]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(
                f"ProductionVariants: VariantName {', '.join(duplicated)} is given more than once"
            )
        return self


class CapacitySizeShape(Shape):
    Type: Literal["INSTANCE_COUNT", "CAPACITY_PERCENT"]
    Value: Annotated[int, Field(ge=1)]


Seconds = Annotated[int, Field(ge=0, le=3600)]
ExecutionTimeout = Annotated[int, Field(ge=600, le=28800)]


class TrafficRoutingConfigShape(Shape):
    Type: Literal["ALL_AT_ONCE", "CANARY", "LINEAR"]
    WaitIntervalInSeconds: Seconds
    CanarySize: CapacitySizeShape | None = None
    LinearStepSize: CapacitySizeShape | None = None

    @model_validator(mode="after")
    def _size(self) -> TrafficRoutingConfigShape:
        if (self.Type == "CANARY") != (self.CanarySize is not None):
            raise ValueError("CanarySize is required with Type CANARY, and only with it")
        if (self.Type == "LINEAR") != (self.LinearStepSize is not None):
            raise ValueError("LinearStepSize is required with Type LINEAR, and only with it")
        return self


class BlueGreenUpdatePolicyShape(Shape):
    TrafficRoutingConfiguration: TrafficRoutingConfigShape
    TerminationWaitInSeconds: Seconds = 0
    MaximumExecutionTimeoutInSeconds: ExecutionTimeout | None = None


class RollingUpdatePolicyShape(Shape):
    MaximumBatchSize: CapacitySizeShape
    WaitIntervalInSeconds: Seconds
    MaximumExecutionTimeoutInSeconds: ExecutionTimeout | None = None
    RollbackMaximumBatchSize: CapacitySizeShape | None = None


class AlarmNameShape(Shape):
    AlarmName: Annotated[str, Field(min_length=1, max_length=255)]


class AutoRollbackConfigShape(Shape):
    Alarms: Annotated[list[AlarmNameShape], Field(min_length=1, max_length=10)]


class DeploymentConfigShape(Shape):
    BlueGreenUpdatePolicy: BlueGreenUpdatePolicyShape | None = None
    RollingUpdatePolicy: RollingUpdatePolicyShape | None = None
    AutoRollbackConfiguration: AutoRollbackConfigShape | None = None

    @model_validator(mode="after")
    def _one_policy(self) -> DeploymentConfigShape:
        if (self.BlueGreenUpdatePolicy is None) == (self.RollingUpdatePolicy is None):
            raise ValueError("give exactly one of BlueGreenUpdatePolicy and RollingUpdatePolicy")
        return self


class CreateEndpointInput(Shape):
    EndpointName: Name
    EndpointConfigName: Name
    DeploymentConfig: DeploymentConfigShape | None = None
    Tags: Annotated[list[Tag], Field(max_length=50)] = Field(default_factory=list)


class UpdateEndpointInput(Shape):
    EndpointName: Name
    EndpointConfigName: Name
    RetainAllVariantProperties: bool = False
    DeploymentConfig: DeploymentConfigShape | None = None
    RetainDeploymentConfig: bool = False


class DesiredWeightAndCapacity(Shape):
    VariantName: Name
    DesiredWeight: Annotated[float, Field(ge=0)] | None = None
    DesiredInstanceCount: Annotated[int, Field(ge=0, le=100)] | None = None

    @model_validator(mode="after")
    def _something(self) -> DesiredWeightAndCapacity:
        if self.DesiredWeight is None and self.DesiredInstanceCount is None:
            raise ValueError("give DesiredWeight, DesiredInstanceCount or both")
        return self


class UpdateWeightsInput(Shape):
    EndpointName: Name
    DesiredWeightsAndCapacities: Annotated[
        list[DesiredWeightAndCapacity], Field(min_length=1, max_length=10)
    ]


class ModelNameInput(Shape):
    ModelName: Name


class EndpointConfigNameInput(Shape):
    EndpointConfigName: Name


class EndpointNameInput(Shape):
    EndpointName: Name


class ListInput(Shape):
    """The List* operations' shared paging, sorting and filtering fields (timestamps as epoch
    seconds)."""

    SortBy: Literal["Name", "CreationTime", "Status"] = "CreationTime"
    SortOrder: Literal["Ascending", "Descending"] = "Descending"
    NextToken: Annotated[str, Field(max_length=8192)] | None = None
    MaxResults: Annotated[int, Field(ge=1, le=100)] = 10
    NameContains: Annotated[str, Field(max_length=63)] | None = None
    CreationTimeBefore: float | None = None
    CreationTimeAfter: float | None = None
    LastModifiedTimeBefore: float | None = None
    LastModifiedTimeAfter: float | None = None
    StatusEquals: (
        Literal[
            "OutOfService",
            "Creating",
            "Updating",
            "SystemUpdating",
            "RollingBack",
            "InService",
            "Deleting",
            "Failed",
            "UpdateRollbackFailed",
        ]
        | None
    ) = None


S = TypeVar("S", bound=Shape)


def parse(shape: type[S], document: Any, operation: str) -> S:
    """`document` as `shape`, or a ValidationException naming every field at fault."""
    if not isinstance(document, dict):
        raise ApiValidationError(f"{operation}: the request body must be a JSON object")
    try:
        return shape.model_validate(document)
    except PydanticValidationError as error:
        lines = []
        for item in error.errors(include_url=False):
            path = field_path(item["loc"], root=operation)
            if item["type"] == "extra_forbidden":
                lines.append(
                    f"{path}: not supported by this runtime (docs/sagemaker-api.md lists what is)"
                )
            elif item["type"] == "missing":
                lines.append(f"{path}: required")
            else:
                lines.append(f"{path}: {item['msg'].removeprefix('Value error, ')}")
        count = len(lines)
        raise ApiValidationError(
            f"{count} validation error{'s' if count > 1 else ''} detected in {operation}: "
            + "; ".join(lines)
        ) from None
