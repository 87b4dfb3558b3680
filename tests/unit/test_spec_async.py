"""AsyncInferenceConfig in the endpoint spec: SageMaker's fields, what is refused, and the input
prefix rule."""

from __future__ import annotations

from typing import Any

import pytest

from serving.config.async_inference import DEFAULT_ASYNC_CONCURRENCY
from serving.config.spec import SpecError, parse_spec
from serving.s3 import parse_s3_uri

OUTPUT = {"S3OutputPath": "s3://bucket-a/async/answers"}
INPUT = {"S3InputPath": "s3://bucket-a/async/inputs/"}


def spec(config: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    document = {
        "EndpointName": "async-demo",
        "Containers": [{"ContainerHostname": "only", "Image": "python"}],
        "AsyncInferenceConfig": {"OutputConfig": OUTPUT, "InputConfig": INPUT}
        if config is None
        else config,
    }
    return {**document, **fields}


def refused(document: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(document)
    return str(caught.value)


def test_sagemaker_fields_and_defaults() -> None:
    config = parse_spec(spec()).AsyncInferenceConfig
    assert config is not None
    assert config.ClientConfig.MaxConcurrentInvocationsPerInstance == DEFAULT_ASYNC_CONCURRENCY
    assert config.OutputConfig.output.uri == "s3://bucket-a/async/answers"
    assert config.OutputConfig.output.child("id.out").uri == "s3://bucket-a/async/answers/id.out"
    # failures land somewhere
    assert config.OutputConfig.failure.uri == config.OutputConfig.output.uri
    assert config.S3EndpointUrl is None
    assert parse_spec(spec(AsyncInferenceConfig=None)).AsyncInferenceConfig is None


def test_a_serial_endpoint_may_serve_it() -> None:
    containers = [{"ContainerHostname": name, "Image": "python"} for name in ("first", "second")]
    document = spec(Containers=containers, InferenceExecutionConfig={"Mode": "Serial"})
    assert parse_spec(document).AsyncInferenceConfig is not None


@pytest.mark.parametrize(
    ("output", "field", "reason"),
    [
        (
            {**OUTPUT, "NotificationConfig": {"SuccessTopic": "arn:aws:sns:us-east-1:1:t"}},
            "NotificationConfig",
            "SNS",
        ),
        ({**OUTPUT, "KmsKeyId": "alias/mine"}, "KmsKeyId", "not supported"),
        ({"S3OutputPath": "https://bucket-a.s3.amazonaws.com/x"}, "S3OutputPath", "s3://"),
        ({"S3OutputPath": "s3://A_B/x"}, "S3OutputPath", "bucket"),
        ({**OUTPUT, "S3FailurePath": "s3://bucket-a/x/../y"}, "S3FailurePath", "'..'"),
        ({**OUTPUT, "SuccessTopic": "x"}, "SuccessTopic", "unknown field"),
    ],
)
def test_unsupported_or_malformed_output_fields_are_named(
    output: dict, field: str, reason: str
) -> None:
    message = refused(spec({"OutputConfig": output, "InputConfig": INPUT}))
    line = next(
        line
        for line in message.splitlines()
        if f"AsyncInferenceConfig.OutputConfig.{field}" in line
    )
    assert reason in line, line


def test_the_input_prefix_is_required_and_says_why() -> None:
    message = refused(spec({"OutputConfig": OUTPUT}))
    assert "AsyncInferenceConfig.InputConfig: required" in message
    assert "own credentials" in message


@pytest.mark.parametrize(
    "inputs", ["s3://bucket-a/", "s3://bucket-a/async/", "s3://bucket-a/async/answers/old/"]
)
def test_inputs_may_not_overlap_answers(inputs: str) -> None:
    message = refused(spec({"OutputConfig": OUTPUT, "InputConfig": {"S3InputPath": inputs}}))
    assert "overlaps OutputConfig.S3OutputPath" in message


def test_inputs_may_not_overlap_failures() -> None:
    output = {**OUTPUT, "S3FailurePath": "s3://bucket-a/async/inputs/failed/"}
    assert "overlaps OutputConfig.S3FailurePath" in refused(
        spec({"OutputConfig": output, "InputConfig": INPUT})
    )


def test_concurrency_is_bounded_as_sagemaker_bounds_it() -> None:
    config = {
        "OutputConfig": OUTPUT,
        "InputConfig": INPUT,
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1001},
    }
    assert "ClientConfig.MaxConcurrentInvocationsPerInstance" in refused(spec(config))


def test_a_direct_endpoint_of_several_containers_is_refused() -> None:
    containers = [{"ContainerHostname": name, "Image": "python"} for name in ("first", "second")]
    message = refused(spec(Containers=containers))
    assert "AsyncInferenceConfig" in message and "cannot name a target container" in message


def test_a_multimodel_container_is_refused() -> None:
    containers = [
        {
            "ContainerHostname": "many",
            "Image": "python",
            "Mode": "MultiModel",
            "ModelDataUrl": "s3://m/p/",
        }
    ]
    assert "cannot name a TargetModel" in refused(spec(Containers=containers))


@pytest.mark.parametrize(
    ("uri", "bucket", "key"),
    [
        ("s3://bucket-a/k/x.json", "bucket-a", "k/x.json"),
        ("s3://bucket-a", "bucket-a", ""),
        ("s3://b.c-d/k/", "b.c-d", "k/"),
    ],
)
def test_s3_uris(uri: str, bucket: str, key: str) -> None:
    location = parse_s3_uri(uri)
    assert (location.bucket, location.key) == (bucket, key)


@pytest.mark.parametrize(
    "uri", ["s3://bucket-a//x", "s3://bucket-a/./x", "s3://bucket-a/a/../b", "file:///x", "s3:///x"]
)
def test_s3_uris_that_could_leave_their_prefix_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_s3_uri(uri)


def test_containment_is_by_folder_not_by_string_prefix() -> None:
    inputs = parse_s3_uri("s3://bucket-a/in")
    assert inputs.contains(parse_s3_uri("s3://bucket-a/in/x.json"))
    assert not inputs.contains(parse_s3_uri("s3://bucket-a/inside/x.json"))
    assert not inputs.contains(parse_s3_uri("s3://bucket-b/in/x.json"))
