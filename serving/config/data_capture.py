"""An endpoint's DataCaptureConfig: SageMaker's field names, and a local folder as well as S3 as its
destination.

A sampled share of the endpoint's invocations is written, request and answer, in SageMaker's capture
record format (`serving.gateway.capture`). In a spec the destination may be a folder of this machine
(`file:///path` or an absolute path: the operator who writes the spec chooses it, as for
ModelDataUrl); `s3://bucket/prefix` is written with the gateway's own credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from serving.documents import Document, document_path, folder_of
from serving.protocol import CSV, JSON
from serving.s3 import parse_s3_uri

__all__ = ["CaptureContentTypes", "CaptureOption", "DataCaptureConfig", "capture_summary"]

# SageMaker's pattern for a content type in CaptureContentTypeHeader.
_CONTENT_TYPE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*/[a-zA-Z0-9](-*[a-zA-Z0-9.])*$")


class CaptureOption(Document):
    """What to capture: the request (`Input`), the answer (`Output`), or both."""

    CaptureMode: Literal["Input", "Output", "InputAndOutput"]


class CaptureContentTypes(Document):
    """Which content types are captured as text (CSV or JSON); any other body is captured
    base64-encoded."""

    CsvContentTypes: list[str] = Field(default_factory=lambda: [CSV], min_length=1, max_length=10)
    JsonContentTypes: list[str] = Field(default_factory=lambda: [JSON], min_length=1, max_length=10)

    @field_validator("CsvContentTypes", "JsonContentTypes")
    @classmethod
    def _types(cls, values: list[str], info: ValidationInfo) -> list[str]:
        for value in values:
            if len(value) > 256 or not _CONTENT_TYPE.match(value):
                raise ValueError(
                    f"{info.field_name}: {value!r} is not a content type (type/subtype)"
                )
        return [value.lower() for value in values]


class DataCaptureConfig(Document):
    """SageMaker's DataCaptureConfig, with a local folder allowed as the destination."""

    EnableCapture: bool = True
    InitialSamplingPercentage: int = Field(
        ge=0,
        le=100,
        description="The share of invocations captured, drawn independently for each invocation.",
    )
    DestinationS3Uri: str = Field(
        max_length=512,
        description="s3://bucket/prefix, or (in a spec) a folder: file:///path or a path. Records go under "
        "<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/.",
    )
    KmsKeyId: str | None = Field(
        None,
        max_length=2048,
        description="S3 only: the objects are written with SSE-KMS under this key.",
    )
    CaptureOptions: list[CaptureOption] = Field(min_length=1, max_length=32)
    CaptureContentTypeHeader: CaptureContentTypes = CaptureContentTypes()
    S3EndpointUrl: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="An S3-compatible store's URL. Default: the gateway's SERVING_S3_ENDPOINT_URL, else boto3's own "
        "configuration. Not a SageMaker field.",
    )

    @field_validator("DestinationS3Uri")
    @classmethod
    def _destination(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("s3://"):
            parse_s3_uri(value, "DestinationS3Uri")
            return value.rstrip("/")
        if value.startswith(("https://", "http://")):
            raise ValueError(
                "DestinationS3Uri: https:// destinations are not supported; give s3://bucket/prefix"
            )
        path = value.removeprefix("file://")
        if not path:
            raise ValueError("DestinationS3Uri is empty")
        return str(document_path(path, folder_of(info)).resolve())

    @model_validator(mode="after")
    def _kms_only_for_s3(self) -> DataCaptureConfig:
        if self.KmsKeyId is not None and not self.is_s3:
            raise ValueError(
                "KmsKeyId applies to an s3:// DestinationS3Uri only; a local folder is not encrypted"
            )
        return self

    @property
    def is_s3(self) -> bool:
        return self.DestinationS3Uri.startswith("s3://")

    @property
    def folder(self) -> Path:
        """The local destination (only when not `is_s3`)."""
        return Path(self.DestinationS3Uri)

    @property
    def captures_input(self) -> bool:
        return any(
            option.CaptureMode in ("Input", "InputAndOutput") for option in self.CaptureOptions
        )

    @property
    def captures_output(self) -> bool:
        return any(
            option.CaptureMode in ("Output", "InputAndOutput") for option in self.CaptureOptions
        )


def capture_summary(document: Mapping[str, Any]) -> dict[str, str | bool | int]:
    """DescribeEndpoint's DataCaptureConfig (the shape SageMaker calls DataCaptureConfigSummary) of
    a validated config."""
    summary = {
        "EnableCapture": document["EnableCapture"],
        "CaptureStatus": "Started" if document["EnableCapture"] else "Stopped",
        "CurrentSamplingPercentage": document["InitialSamplingPercentage"],
        "DestinationS3Uri": document["DestinationS3Uri"],
    }
    if document.get("KmsKeyId"):
        summary["KmsKeyId"] = document["KmsKeyId"]
    return summary
