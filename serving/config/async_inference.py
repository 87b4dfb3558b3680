"""An endpoint's AsyncInferenceConfig: SageMaker's field names, plus where callers' inputs may come
from.

InvokeEndpointAsync reads its input from an S3 object the caller names and writes the answer under
`OutputConfig.S3OutputPath`, with the gateway's own credentials. So that a caller cannot make the
gateway read any object those credentials reach, an input must lie under `InputConfig.S3InputPath`
(ours; SageMaker checks the caller's own IAM permissions instead, which this runtime cannot see).
What SageMaker offers and this runtime does not (SNS notifications, KMS keys) is refused with a
message naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from serving.documents import Document
from serving.s3 import S3Location, parse_s3_uri

__all__ = [
    "DEFAULT_ASYNC_CONCURRENCY",
    "AsyncClientConfig",
    "AsyncInferenceConfig",
    "AsyncInputConfig",
    "AsyncOutputConfig",
]

# SageMaker "chooses an optimal value"; async requests are the long ones, and a few at a time per
# endpoint keep its replicas busy without taking every slot from its real-time callers.
DEFAULT_ASYNC_CONCURRENCY = 4


def _s3_folder(value: str, field: str) -> str:
    parse_s3_uri(value, field)
    return value


class AsyncClientConfig(Document):
    """SageMaker's AsyncInferenceClientConfig."""

    MaxConcurrentInvocationsPerInstance: int = Field(
        DEFAULT_ASYNC_CONCURRENCY,
        ge=1,
        le=1000,
        description="Async requests this endpoint runs at once (the gateway is its one 'instance'); more wait in "
        "its queue. SageMaker picks a value when none is given; here 4.",
    )


class AsyncOutputConfig(Document):
    """SageMaker's AsyncInferenceOutputConfig: where answers and failures are written."""

    S3OutputPath: str = Field(
        description="s3://bucket/prefix: each answer is written to <S3OutputPath>/<InferenceId>.out."
    )
    S3FailurePath: str | None = Field(
        None,
        description="s3://bucket/prefix: each failure is written to <S3FailurePath>/<InferenceId>-error.out. "
        "Default: S3OutputPath (SageMaker writes failures nowhere without it; here they always land somewhere).",
    )
    KmsKeyId: Any = Field(
        None, description="Refused: outputs are written with the bucket's default encryption."
    )
    NotificationConfig: Any = Field(
        None, description="Refused: no SNS notifications; poll the output locations."
    )

    @field_validator("S3OutputPath", "S3FailurePath")
    @classmethod
    def _s3(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _s3_folder(value, info.field_name or "location")

    @field_validator("KmsKeyId")
    @classmethod
    def _no_kms(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "KmsKeyId is not supported: this runtime writes outputs with the bucket's default encryption; "
                "set the key as the bucket's default (SSE-KMS) instead"
            )
        return None

    @field_validator("NotificationConfig")
    @classmethod
    def _no_notifications(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "NotificationConfig (SNS SuccessTopic/ErrorTopic) is not supported: this runtime publishes no "
                "notifications; poll the OutputLocation and FailureLocation that InvokeEndpointAsync returns"
            )
        return None

    @property
    def output(self) -> S3Location:
        return parse_s3_uri(self.S3OutputPath)

    @property
    def failure(self) -> S3Location:
        return parse_s3_uri(self.S3FailurePath or self.S3OutputPath)


class AsyncInputConfig(Document):
    """Where callers' InputLocations may be (not a SageMaker field: see docs/security.md)."""

    S3InputPath: str = Field(
        description="s3://bucket/prefix: an InvokeEndpointAsync InputLocation must name an object under it; "
        "any other is refused before the gateway reads a byte."
    )

    @field_validator("S3InputPath")
    @classmethod
    def _s3(cls, value: str) -> str:
        return _s3_folder(value, "S3InputPath")

    @property
    def input(self) -> S3Location:
        return parse_s3_uri(self.S3InputPath)


class AsyncInferenceConfig(Document):
    """SageMaker's AsyncInferenceConfig, plus InputConfig and S3EndpointUrl (this runtime's)."""

    ClientConfig: AsyncClientConfig = AsyncClientConfig()
    OutputConfig: AsyncOutputConfig = Field(description="Where answers and failures are written.")
    InputConfig: AsyncInputConfig = Field(
        description="Where inputs may be read from. Required: the gateway reads them with its own credentials."
    )
    S3EndpointUrl: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="An S3-compatible store's URL (MinIO, Ceph, ...). Default: the gateway's SERVING_S3_ENDPOINT_URL, "
        "else boto3's own configuration (AWS S3). Credentials are the gateway's (boto3's usual chain).",
    )

    @model_validator(mode="after")
    def _inputs_apart_from_outputs(self) -> AsyncInferenceConfig:
        # An input under the output or failure path would let one caller feed another's answers to
        # the model.
        allowed = self.InputConfig.input
        for name, place in (
            ("S3OutputPath", self.OutputConfig.output),
            ("S3FailurePath", self.OutputConfig.failure),
        ):
            if allowed.contains(place) or place.contains(allowed):
                raise ValueError(
                    f"InputConfig.S3InputPath {allowed.uri} overlaps OutputConfig.{name} {place.uri}: keep inputs "
                    "apart from answers, so that a caller cannot feed another caller's answers to the model"
                )
        return self
