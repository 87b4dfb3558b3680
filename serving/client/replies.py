"""The shapes of what the client hands back: boto3's `invoke_endpoint` response, and the server's
endpoint descriptions.

Typed for editors and mypy only: a newer server's extra keys pass through untouched, so every
description key is optional here. The server's own types are `serving.control.records`'s (the
client sits below that layer and ships without it)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ResponseMetadata(TypedDict):
    """botocore's `ResponseMetadata` (the parts an HTTP answer fills in)."""

    HTTPStatusCode: int
    HTTPHeaders: dict[str, str]
    RetryAttempts: int


class InvokeEndpointResponse(TypedDict):
    """What boto3's `sagemaker-runtime` `invoke_endpoint` returns."""

    Body: Any  # a botocore StreamingBody (botocore ships no types)
    ContentType: str
    InvokedProductionVariant: str | None
    CustomAttributes: NotRequired[str]
    ResponseMetadata: ResponseMetadata


class EndpointSummary(TypedDict):
    """One entry of `GET /endpoints`."""

    EndpointName: str
    EndpointStatus: str


class ContainerDescription(TypedDict, total=False):
    """One container of a description: its row and how its replicas stand."""

    ContainerHostname: str
    Image: str
    Mode: str
    DesiredReplicas: int
    CurrentReplicas: int
    Version: str
    Status: str
    Replicas: dict[str, int]  # Running, Starting, Stopping
    ScalingMetric: dict[str, float | str | None]
    PendingVersion: str
    LastFailureReason: str
    FailureReason: str


class EndpointDescription(TypedDict, total=False):
    """`GET /endpoints/<name>`: DescribeEndpoint-shaped."""

    EndpointName: str
    EndpointStatus: str  # Creating | Updating | InService | Failed ...
    FailureReason: str | None
    InferenceExecutionConfig: dict[str, str]
    Containers: list[ContainerDescription]
    # Generation, Status, FailureReason, StartedAt, FinishedAt
    LastUpdate: dict[str, int | float | str | None]
    ScalingActivities: list[dict[str, object]]  # DescribeScalingActivities-style records
    AsyncInferenceConfig: dict[str, object]
    DataCaptureConfig: dict[str, object]
