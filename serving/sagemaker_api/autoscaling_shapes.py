"""The requests of Application Auto Scaling's operations, validated as `shapes` validates
SageMaker's: only SageMaker variants scale here (ServiceNamespace `sagemaker`, ResourceId
`endpoint/<name>/variant/<variant>`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from serving.protocol import SIGNING_SERVICE
from serving.sagemaker_api.shapes import Shape


def _sagemaker(namespace: str) -> str:
    if namespace != SIGNING_SERVICE:
        raise ValueError(
            f"this server scales SageMaker variants only (ServiceNamespace {SIGNING_SERVICE})"
        )
    return namespace


Namespace = Annotated[str, AfterValidator(_sagemaker)]
Dimension = Literal["sagemaker:variant:DesiredInstanceCount"]
ResourceIdStr = Annotated[str, Field(pattern=r"^endpoint/[^/]+/variant/[^/]+$", max_length=1600)]


class RegisterScalableTargetInput(Shape):
    ServiceNamespace: Namespace
    ResourceId: ResourceIdStr
    ScalableDimension: Dimension
    MinCapacity: Annotated[int, Field(ge=1, le=100)] | None = None
    MaxCapacity: Annotated[int, Field(ge=1, le=100)] | None = None
    # accepted, shown; no role is assumed
    RoleARN: Annotated[str, Field(max_length=1600)] | None = None


class TargetsInput(Shape):
    ServiceNamespace: Namespace
    ResourceIds: Annotated[list[ResourceIdStr], Field(max_length=50)] | None = None
    ScalableDimension: Dimension | None = None
    MaxResults: Annotated[int, Field(ge=1, le=50)] = 50
    NextToken: Annotated[str, Field(max_length=8192)] | None = None


class TargetInput(Shape):
    ServiceNamespace: Namespace
    ResourceId: ResourceIdStr
    ScalableDimension: Dimension


class PredefinedMetricSpecificationShape(Shape):
    PredefinedMetricType: Literal[
        "SageMakerVariantInvocationsPerInstance",
        "SageMakerVariantConcurrentRequestsPerModel",
        "SageMakerVariantCPUUtilization",
        "SageMakerVariantMemoryUtilization",
    ]
    ResourceLabel: Annotated[str, Field(max_length=1023)] | None = None


class MetricDimension(Shape):
    Name: str
    Value: str


class CustomizedMetricSpecificationShape(Shape):
    MetricName: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")]
    # accepted and shown: the metric is the one the container reports by this name
    Namespace: str | None = None
    Dimensions: list[MetricDimension] = Field(default_factory=list)
    Statistic: Literal["Average"] = "Average"
    Unit: str | None = None


class TargetTrackingConfiguration(Shape):
    TargetValue: Annotated[float, Field(gt=0)]
    PredefinedMetricSpecification: PredefinedMetricSpecificationShape | None = None
    CustomizedMetricSpecification: CustomizedMetricSpecificationShape | None = None
    ScaleOutCooldown: Annotated[int, Field(ge=0, le=86400)] = 300
    ScaleInCooldown: Annotated[int, Field(ge=0, le=86400)] = 300
    DisableScaleIn: bool = False

    @model_validator(mode="after")
    def _one_metric(self) -> TargetTrackingConfiguration:
        if (self.PredefinedMetricSpecification is None) == (
            self.CustomizedMetricSpecification is None
        ):
            raise ValueError(
                "give exactly one of PredefinedMetricSpecification and CustomizedMetricSpecification"
            )
        return self


class PutScalingPolicyInput(Shape):
    PolicyName: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=256)]
    ServiceNamespace: Namespace
    ResourceId: ResourceIdStr
    ScalableDimension: Dimension
    PolicyType: Literal["TargetTrackingScaling"] = "TargetTrackingScaling"
    TargetTrackingScalingPolicyConfiguration: TargetTrackingConfiguration


class PoliciesInput(Shape):
    ServiceNamespace: Namespace
    PolicyNames: Annotated[list[str], Field(max_length=50)] | None = None
    ResourceId: ResourceIdStr | None = None
    ScalableDimension: Dimension | None = None
    MaxResults: Annotated[int, Field(ge=1, le=50)] = 50
    NextToken: Annotated[str, Field(max_length=8192)] | None = None


class DeletePolicyInput(Shape):
    PolicyName: str
    ServiceNamespace: Namespace
    ResourceId: ResourceIdStr
    ScalableDimension: Dimension


class ActivitiesInput(Shape):
    ServiceNamespace: Namespace
    ResourceId: ResourceIdStr | None = None
    ScalableDimension: Dimension | None = None
    MaxResults: Annotated[int, Field(ge=1, le=50)] = 50
    NextToken: Annotated[str, Field(max_length=8192)] | None = None
    IncludeNotScaledActivities: bool = False
