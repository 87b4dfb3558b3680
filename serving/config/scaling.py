"""Autoscaling fields of the endpoint spec: Application Auto Scaling's target tracking, per
container or per endpoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from serving.autoscaling.policy import SPEC_METRIC_TYPES, PolicyArguments
from serving.documents import Document

__all__ = ["AutoScalingConfig", "CustomizedMetric", "PredefinedMetric", "TargetTrackingPolicy"]


class PredefinedMetric(Document):
    """Which built-in metric a target-tracking policy follows."""

    PredefinedMetricType: Literal[
        "SageMakerVariantInvocationsPerInstance",
        "SageMakerVariantConcurrentRequestsPerModel",
        "SageMakerVariantCPUUtilization",
        "SageMakerVariantMemoryUtilization",
    ] = "SageMakerVariantInvocationsPerInstance"


class CustomizedMetric(Document):
    """A metric the container reports itself (its `code/inference.py` defines
    `autoscaling_metrics`)."""

    MetricName: Annotated[
        str,
        Field(
            pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$",
            description="Key of the dict `autoscaling_metrics(model)` returns.",
        ),
    ]
    Statistic: Literal["Average"] = Field(
        "Average", description="Averaged per replica, as the predefined metrics."
    )


class TargetTrackingPolicy(Document):
    """Application Auto Scaling's target-tracking policy fields."""

    TargetValue: float = Field(gt=0, description="Metric value the policy keeps each replica at.")
    PredefinedMetricSpecification: PredefinedMetric | None = Field(
        None, description="A built-in metric (default: SageMakerVariantInvocationsPerInstance)."
    )
    CustomizedMetricSpecification: CustomizedMetric | None = Field(
        None, description="Instead of a predefined metric: one the container reports."
    )
    ScaleOutCooldown: float = Field(
        300,
        ge=0,
        description="Seconds after a scale-out before another scale-out (unless a larger one is needed).",
    )
    ScaleInCooldown: float = Field(
        300,
        ge=0,
        description="Seconds after a scale-in before another scale-in; a scale-out is never blocked by it.",
    )
    DisableScaleIn: bool = False

    @model_validator(mode="after")
    def _one_metric(self) -> TargetTrackingPolicy:
        if (
            self.PredefinedMetricSpecification is not None
            and self.CustomizedMetricSpecification is not None
        ):
            raise ValueError(
                "give PredefinedMetricSpecification or CustomizedMetricSpecification, not both"
            )
        return self

    @property
    def metric(self) -> str:
        """The metric's name as replicas report it (scaling_policy's names)."""
        if self.CustomizedMetricSpecification is not None:
            return self.CustomizedMetricSpecification.MetricName
        predefined = self.PredefinedMetricSpecification or PredefinedMetric()
        return SPEC_METRIC_TYPES[predefined.PredefinedMetricType]

    def as_policy(self) -> PolicyArguments:
        """scaling_policy.TargetTracking's fields (JSON, for Serve's policy_kwargs)."""
        return {
            "metric": self.metric,
            "target": self.TargetValue,
            "scale_out_cooldown_s": self.ScaleOutCooldown,
            "scale_in_cooldown_s": self.ScaleInCooldown,
            "disable_scale_in": self.DisableScaleIn,
        }


class AutoScalingConfig(Document):
    """Replica bounds and target-tracking policies (of a container, or of the whole endpoint)."""

    MinCapacity: int = Field(1, ge=1, le=100)
    MaxCapacity: int = Field(1, ge=1, le=100)
    TargetTrackingScalingPolicyConfiguration: (
        TargetTrackingPolicy | list[TargetTrackingPolicy] | None
    ) = Field(
        None,
        description="One policy, or several (the largest desired count wins; scale-in only when all agree). "
        "Without one, the count is fixed at MinCapacity (which must then equal MaxCapacity).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoScalingConfig:
        if self.MinCapacity > self.MaxCapacity:
            raise ValueError(
                f"MinCapacity ({self.MinCapacity}) must not exceed MaxCapacity ({self.MaxCapacity})"
            )
        if self.MinCapacity != self.MaxCapacity and not self.policies:
            raise ValueError(
                "MinCapacity < MaxCapacity needs a TargetTrackingScalingPolicyConfiguration "
                "(for a fixed replica count set MinCapacity = MaxCapacity)"
            )
        metrics = [policy.metric for policy in self.policies]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"one target-tracking policy per metric; got {metrics}")
        return self

    @property
    def policies(self) -> list[TargetTrackingPolicy]:
        configured = self.TargetTrackingScalingPolicyConfiguration
        if configured is None:
            return []
        return configured if isinstance(configured, list) else [configured]
