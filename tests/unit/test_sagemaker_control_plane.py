"""The control-plane API (serving.sagemaker_api) through the real boto3 `sagemaker` client over real
HTTP.

The API runs in this process on a loopback BackgroundServer, as the gateway mounts it, and is driven
by unmodified boto3/botocore. The one thing faked is the `Deployer` under it
(`sagemaker_harness.FakeDeployer`, in memory) because these tests are about the protocol layer
(shapes, validation, ARNs, paging, blue/green bookkeeping, routing tables, authentication, stored
state): a test says when a served variant is InService or Failed, and calls `api.tick()` itself
instead of the gateway's 0.5 s loop. Real Ray Serve under the same API runs in
tests/integration/test_sagemaker_api.py. Application Auto Scaling's operations and
UpdateEndpointWeightsAndCapacities are in test_sagemaker_autoscaling_api.py.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import random
import stat
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import WaiterError

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.errors import ValidationError
from serving.gateway.admission import EndpointRoute, InvocationRequest
from serving.gateway.invocation import Invocations
from serving.gateway.transport import ContainerTransport
from serving.gateway.variants import Front, VariantRoute
from serving.metrics.invocations import InvocationTrace
from serving.runtimes.context import Headers
from serving.sagemaker_api import endpoint_update
from serving.settings import ServerSettings
from tests.unit.sagemaker_harness import (
    API_KEY,
    KEY,
    READER_KEY,
    READER_SECRET,
    SECRET,
    FakeDeployer,
    Harness,
    refused,
)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path)
    yield running
    running.stop()


# --- models and endpoint configs ------------------------------------------------------------------
def test_models_and_configs_are_created_described_listed_and_deleted(harness: Harness) -> None:
    sm = harness.sm
    arn = sm.create_model(
        ModelName="Iris-1", PrimaryContainer={"Image": "sklearn", "ModelDataUrl": "iris"}
    )["ModelArn"]
    # lower-cased, as SageMaker writes it
    assert arn == "arn:aws:sagemaker:us-east-1:000000000000:model/iris-1"
    described = sm.describe_model(ModelName="Iris-1")
    assert described["ModelArn"] == arn and described["PrimaryContainer"]["Image"] == "sklearn"
    assert isinstance(described["CreationTime"], datetime.datetime)
    assert abs(described["CreationTime"].timestamp() - time.time()) < 60
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["Iris-1"]

    config_arn = sm.create_endpoint_config(
        EndpointConfigName="cfg",
        ProductionVariants=[
            {"VariantName": "A", "ModelName": "Iris-1", "InstanceType": "ml.m5.large"}
        ],
    )["EndpointConfigArn"]
    assert config_arn == "arn:aws:sagemaker:us-east-1:000000000000:endpoint-config/cfg"
    config = sm.describe_endpoint_config(EndpointConfigName="cfg")
    assert config["ProductionVariants"][0]["InitialInstanceCount"] == 1
    assert config["ProductionVariants"][0]["InitialVariantWeight"] == 1.0
    assert isinstance(config["CreationTime"], datetime.datetime)
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == [
        "cfg"
    ]

    sm.delete_endpoint_config(EndpointConfigName="cfg")
    sm.delete_model(ModelName="Iris-1")
    assert sm.list_models()["Models"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []
    refused(
        lambda: sm.describe_model(ModelName="Iris-1"),
        "ValidationException",
        "Could not find model",
        arn,
    )
    refused(
        lambda: sm.describe_endpoint_config(EndpointConfigName="cfg"),
        "ValidationException",
        "Could not find",
    )
    refused(
        lambda: sm.describe_endpoint(EndpointName="nothing"),
        "ValidationException",
        "Could not find endpoint",
    )
    refused(lambda: sm.delete_model(ModelName="Iris-1"), "ValidationException", "Could not find")


def test_a_name_taken_is_refused_and_a_config_needs_its_model_and_a_known_instance_type(
    harness: Harness,
) -> None:
    harness.model("m1")
    refused(
        lambda: harness.model("m1"), "ValidationException", "Cannot create already existing model"
    )
    harness.config("c1", ("A", "m1"))
    refused(
        lambda: harness.config("c1", ("A", "m1")),
        "ValidationException",
        "already existing endpoint configuration",
    )
    refused(
        lambda: harness.config("c2", ("A", "absent")), "ValidationException", "Could not find model"
    )
    refused(
        lambda: harness.config("c3", ("A", "m1"), instance="ml.x99.huge"),
        "ValidationException",
        "ProductionVariants[0].InstanceType",
        "ml.x99.huge",
    )
    refused(
        lambda: harness.sm.create_endpoint_config(
            EndpointConfigName="twice",
            ProductionVariants=[
                {"VariantName": "A", "ModelName": "m1", "InstanceType": "ml.m5.large"}
            ]
            * 2,
        ),
        "ValidationException",
        "VariantName A is given more than once",
    )


def test_list_pages_with_max_results_and_next_token_and_refuses_a_forged_token(
    harness: Harness,
) -> None:
    names = [f"model-{index:02d}" for index in range(12)]
    for name in names:
        harness.model(name)
    seen, token, pages = [], None, 0
    while True:
        answer = harness.sm.list_models(
            MaxResults=5,
            SortBy="Name",
            SortOrder="Ascending",
            **({"NextToken": token} if token else {}),
        )
        seen += [m["ModelName"] for m in answer["Models"]]
        pages += 1
        token = answer.get("NextToken")
        if token is None:
            break
    assert (seen, pages) == (names, 3)
    assert len(harness.sm.list_models()["Models"]) == 10  # SageMaker's default MaxResults
    paged = harness.sm.get_paginator("list_models").paginate(PaginationConfig={"PageSize": 4})
    assert sorted(m["ModelName"] for page in paged for m in page["Models"]) == names
    forged = [
        "not-a-token",
        base64.urlsafe_b64encode(b'{"place": 3}').decode(),
        base64.urlsafe_b64encode(b'{"offset": -3}').decode(),
        base64.urlsafe_b64encode(b'{"offset": "x"}').decode(),
        base64.urlsafe_b64encode(b"[3]").decode(),
    ]
    for token in forged:
        refused(lambda: harness.sm.list_models(NextToken=token), "ValidationException", "NextToken")
    # Past the end (the list shrank between pages): an empty last page, not an error.
    assert (
        harness.sm.list_models(NextToken=base64.urlsafe_b64encode(b'{"offset": 1000}').decode())[
            "Models"
        ]
        == []
    )


def test_list_sorts_and_filters(harness: Harness) -> None:
    for name in ("beta", "Alpha-iris", "gamma-IRIS", "delta"):
        harness.model(name)
    listed = harness.sm.list_models
    assert [m["ModelName"] for m in listed()["Models"]] == [
        "delta",
        "gamma-IRIS",
        "Alpha-iris",
        "beta",
    ]
    assert [m["ModelName"] for m in listed(SortOrder="Ascending")["Models"]] == [
        "beta",
        "Alpha-iris",
        "gamma-IRIS",
        "delta",
    ]
    assert [m["ModelName"] for m in listed(SortBy="Name", SortOrder="Ascending")["Models"]] == [
        "Alpha-iris",
        "beta",
        "delta",
        "gamma-IRIS",
    ]
    assert [m["ModelName"] for m in listed(NameContains="iris", SortBy="Name")["Models"]] == [
        "gamma-IRIS",
        "Alpha-iris",
    ]
    refused(lambda: listed(SortBy="Size"), "ValidationException", "SortBy")


# --- what the shapes refuse -----------------------------------------------------------------------
VARIANT = {"VariantName": "A", "ModelName": "m1", "InstanceType": "ml.m5.large"}
CONTAINER = {"Image": "sklearn"}
BLUE_GREEN = {
    "BlueGreenUpdatePolicy": {
        "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}
    }
}
UNSUPPORTED = [
    (
        "create_model",
        {
            "ModelName": "m",
            "PrimaryContainer": CONTAINER,
            "VpcConfig": {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]},
        },
        "VpcConfig",
    ),
    (
        "create_model",
        {
            "ModelName": "m",
            "PrimaryContainer": {**CONTAINER, "ImageConfig": {"RepositoryAccessMode": "Platform"}},
        },
        "PrimaryContainer.ImageConfig",
    ),
    (
        "create_model",
        {
            "ModelName": "m",
            "PrimaryContainer": {
                **CONTAINER,
                "ModelDataSource": {
                    "S3DataSource": {
                        "S3Uri": "s3://bucket/model/",
                        "S3DataType": "S3Prefix",
                        "CompressionType": "None",
                    }
                },
            },
        },
        "PrimaryContainer.ModelDataSource",
    ),
    (
        "create_endpoint_config",
        {
            "EndpointConfigName": "c",
            "ProductionVariants": [VARIANT],
            "KmsKeyId": "arn:aws:kms:us-east-1:000000000000:key/abc",
        },
        "KmsKeyId",
    ),
    (
        "create_endpoint_config",
        {
            "EndpointConfigName": "c",
            "ProductionVariants": [VARIANT],
            "AsyncInferenceConfig": {"OutputConfig": {"S3OutputPath": "s3://bucket/out"}},
        },
        "AsyncInferenceConfig",
    ),
    (
        "create_endpoint_config",
        {
            "EndpointConfigName": "c",
            "ProductionVariants": [
                {**VARIANT, "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 5}}
            ],
        },
        "ProductionVariants[0].ServerlessConfig",
    ),
    (
        "create_endpoint_config",
        {"EndpointConfigName": "c", "ProductionVariants": [{**VARIANT, "VolumeSizeInGB": 30}]},
        "ProductionVariants[0].VolumeSizeInGB",
    ),
    (
        "update_endpoint",
        {
            "EndpointName": "e",
            "EndpointConfigName": "c",
            "DeploymentConfig": {
                **BLUE_GREEN,
                "BlueGreenUpdatePolicy": {
                    **BLUE_GREEN["BlueGreenUpdatePolicy"],
                    "MaximumExecutionTimeoutInSeconds": 600,
                },
            },
            "ExcludeRetainedVariantProperties": [{"VariantPropertyType": "DesiredWeight"}],
        },
        "ExcludeRetainedVariantProperties",
    ),
]


@pytest.mark.parametrize(
    ("operation", "params", "field"), UNSUPPORTED, ids=[f"{c[0]}-{c[2]}" for c in UNSUPPORTED]
)
def test_every_unsupported_field_is_refused_by_name(
    harness: Harness, operation: str, params: dict, field: str
) -> None:
    if operation == "create_endpoint_config":
        harness.model("m1")
    message = refused(
        lambda: getattr(harness.sm, operation)(**params), "ValidationException", f"{field}: "
    )
    assert "not supported by this runtime" in message or "Input should be False" in message
    assert [m["ModelName"] for m in harness.api.state.all("model")] == (
        ["m1"] if operation == "create_endpoint_config" else []
    )
    assert harness.api.state.all("endpoint-config") == [] and harness.deployer.applied == []


CAPTURE = {
    "InitialSamplingPercentage": 10,
    "DestinationS3Uri": "s3://bucket/capture",
    "CaptureOptions": [{"CaptureMode": "Input"}],
}


def test_data_capture_reaches_every_variant_spec_and_describe_endpoint(harness: Harness) -> None:
    harness.model("m1")
    harness.sm.create_endpoint_config(
        EndpointConfigName="c", ProductionVariants=[VARIANT], DataCaptureConfig=CAPTURE
    )
    assert (
        harness.sm.describe_endpoint_config(EndpointConfigName="c")["DataCaptureConfig"][
            "DestinationS3Uri"
        ]
        == "s3://bucket/capture"
    )
    harness.sm.create_endpoint(EndpointName="e", EndpointConfigName="c")
    (spec,) = harness.deployer.applied
    assert (
        spec.DataCaptureConfig is not None
        and spec.DataCaptureConfig.InitialSamplingPercentage == 10
    )
    summary = harness.sm.describe_endpoint(EndpointName="e")["DataCaptureConfig"]
    assert summary == {
        "EnableCapture": True,
        "CaptureStatus": "Started",
        "CurrentSamplingPercentage": 10,
        "DestinationS3Uri": "s3://bucket/capture",
    }


@pytest.mark.parametrize(
    ("capture", "field"),
    [
        (
            {**CAPTURE, "DestinationS3Uri": "/var/lib/anything"},
            "DataCaptureConfig.DestinationS3Uri",
        ),
        ({**CAPTURE, "DestinationS3Uri": "file:///etc"}, "DataCaptureConfig.DestinationS3Uri"),
        (
            {**CAPTURE, "InitialSamplingPercentage": 101},
            "DataCaptureConfig.InitialSamplingPercentage",
        ),
        (
            {**CAPTURE, "CaptureOptions": [{"CaptureMode": "Everything"}]},
            "DataCaptureConfig.CaptureOptions[0].CaptureMode",
        ),
    ],
)
def test_an_api_caller_may_capture_to_s3_only_and_bad_settings_are_refused_by_name(
    harness: Harness, capture: dict, field: str
) -> None:
    harness.model("m1")
    refused(
        lambda: harness.sm.create_endpoint_config(
            EndpointConfigName="c", ProductionVariants=[VARIANT], DataCaptureConfig=capture
        ),
        "ValidationException",
        field,
    )
    assert harness.api.state.all("endpoint-config") == []


def raw(url: str, target: str, body: bytes | dict, **headers: str) -> httpx.Response:
    """An unsigned POST, for what botocore would refuse before sending."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {protocol.AMZ_TARGET: target, "Content-Type": protocol.AMZ_JSON, **headers}
    return httpx.post(url, content=content, headers=headers)


def test_fields_botocore_would_not_send_are_refused_too(harness: Harness) -> None:
    answer = raw(
        harness.url,
        "SageMaker.CreateModel",
        {"ModelName": "m", "PrimaryContainer": CONTAINER, "Colour": "red"},
    )
    assert answer.status_code == 400
    assert (
        answer.json()["__type"] == "ValidationException"
        and "Colour: not supported" in answer.json()["message"]
    )
    answer = raw(
        harness.url,
        "SageMaker.CreateModel",
        {"ModelName": "m", "PrimaryContainer": CONTAINER, "Containers": []},
    )
    assert "exactly one of PrimaryContainer and Containers" in answer.json()["message"]
    answer = raw(harness.url, "SageMaker.CreateModel", b"{not json")
    assert (answer.status_code, answer.json()["__type"]) == (400, "ValidationException")
    answer = raw(harness.url, "SageMaker.CreateModel", b"[1, 2]")
    assert "must be a JSON object" in answer.json()["message"]
    assert harness.sm.list_models()["Models"] == []


def test_an_unknown_operation_is_refused(harness: Harness) -> None:
    refused(
        harness.sm.list_training_jobs, "UnknownOperationException", "SageMaker.ListTrainingJobs"
    )
    answer = raw(harness.url, "DynamoDB_20120810.ListTables", {})
    assert (answer.status_code, answer.json()["__type"]) == (400, "UnknownOperationException")
    answer = httpx.post(harness.url, content=b"{}")
    assert answer.json()["__type"] == "UnknownOperationException"


# --- images, model data, the spec a variant becomes -----------------------------------------------
IMAGES = [
    ("sklearn", "sklearn"),
    ("xgboost", "xgboost"),
    (
        "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3",
        "sklearn",
    ),
    ("763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-inference:2.1.0-cpu-py310", "pytorch"),
    ("763104351884.dkr.ecr.eu-west-1.amazonaws.com/tensorflow-inference:2.13-cpu", "tensorflow"),
    ("683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1", "xgboost"),
    (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-inference:"
        "2.1.0-transformers4.37.0-cpu-py310-ubuntu22.04",
        "huggingface",
    ),
    (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:"
        "2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04",
        "huggingface",
    ),
    (
        "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/pytorch-inference@sha256:" + "0" * 64,
        "pytorch",
    ),
]


@pytest.mark.parametrize(("image", "stack"), IMAGES)
def test_an_image_maps_to_the_stack_serving_its_artifacts(
    harness: Harness, image: str, stack: str
) -> None:
    harness.model("m1", image=image)
    harness.config("c1", ("A", "m1"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    assert harness.deployer.spec("e1@A@1")["Containers"][0]["Image"] == stack
    pending = harness.sm.describe_endpoint(EndpointName="e1")["PendingDeploymentSummary"]
    assert pending["ProductionVariants"][0]["DeployedImages"] == [
        {"SpecifiedImage": image, "ResolvedImage": stack}
    ]


@pytest.mark.parametrize(
    "image",
    [
        "nginx:latest",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-own-inference:1",
        "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3; rm -rf /",
    ],
)
def test_an_unknown_image_is_refused_naming_the_field(harness: Harness, image: str) -> None:
    refused(
        lambda: harness.model("m1", image=image),
        "ValidationException",
        "PrimaryContainer.Image",
        "not served",
    )
    refused(
        lambda: harness.sm.create_model(
            ModelName="m2", Containers=[{"Image": "sklearn"}, {"Image": image}]
        ),
        "ValidationException",
        "Containers[1].Image",
    )
    assert harness.sm.list_models()["Models"] == []


def test_network_isolation_is_the_default_and_egress_the_operators_to_allow(
    harness: Harness, tmp_path: Path
) -> None:
    # SageMaker's default is false (network on); here a container has no network unless the operator
    # names egress ports and the model asks for them.
    def model(api: Harness, name: str, isolated: bool) -> None:
        api.sm.create_model(
            ModelName=name,
            EnableNetworkIsolation=isolated,
            PrimaryContainer={"Image": "sklearn", "ModelDataUrl": str(api.models / "iris")},
        )

    refused(
        lambda: model(harness, "open", False),
        "ValidationException",
        "EnableNetworkIsolation: false asks for outbound network",
        "--container-egress-ports",
    )
    model(harness, "isolated", True)
    harness.config("c1", ("A", "isolated"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    assert harness.deployer.spec("e1@A@1")["Containers"][0]["EnableNetworkIsolation"] is True
    allowing = Harness(tmp_path / "egress", container_egress_ports=(443,))
    try:
        model(allowing, "open", False)
        allowing.config("c1", ("A", "open"))
        allowing.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
        assert allowing.deployer.spec("e1@A@1")["Containers"][0]["EnableNetworkIsolation"] is False
    finally:
        allowing.stop()


def test_model_data_must_lie_inside_the_model_roots(harness: Harness, tmp_path: Path) -> None:
    outside = tmp_path / "secrets"
    outside.mkdir()
    for url in (str(outside), "../secrets", "iris/../../secrets", f"file://{outside}", "/etc"):
        refused(
            lambda: harness.model("m1", ModelDataUrl=url),
            "ValidationException",
            "PrimaryContainer.ModelDataUrl",
            "outside the model roots",
        )
    harness.model("relative", ModelDataUrl="iris")
    # A MultiModel prefix is read by the container's supervisor (its process has no network), with
    # the server's credentials unless the container brings its own: held to the s3:// roots as a
    # SingleModel's archive is.
    refused(
        lambda: harness.model("s3", ModelDataUrl="s3://bucket/models/", Mode="MultiModel"),
        "ValidationException",
        "PrimaryContainer.ModelDataUrl",
        "lies under none of its s3:// model roots",
    )
    own_keys = {"AWS_ACCESS_KEY_ID": "AKIAOWN", "AWS_SECRET_ACCESS_KEY": "own-secret"}
    harness.model("s3", ModelDataUrl="s3://bucket/models/", Mode="MultiModel", Environment=own_keys)
    harness.config("c1", ("A", "relative"), ("B", "s3"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    assert harness.deployer.spec("e1@A@1")["Containers"][0]["ModelDataUrl"] == str(
        (harness.models / "iris").resolve()
    )
    assert harness.deployer.spec("e1@B@1")["Containers"][0]["ModelDataUrl"] == "s3://bucket/models/"


def test_a_multi_model_primary_container_is_served_direct(harness: Harness) -> None:
    # SageMaker's multi-model endpoint: a PrimaryContainer with Mode MultiModel and no
    # InferenceExecutionConfig.
    harness.model(
        "mme",
        ModelDataUrl="iris",
        Mode="MultiModel",
        MultiModelConfig={"ModelCacheSetting": "Disabled"},
    )
    harness.config("c1", ("A", "mme"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    spec = harness.deployer.spec("e1@A@1")
    assert spec["InferenceExecutionConfig"] == {"Mode": "Direct"}
    assert spec["Containers"][0]["Mode"] == "MultiModel"
    assert spec["Containers"][0]["MultiModelConfig"] == {"ModelCacheSetting": "Disabled"}
    refused(
        lambda: harness.sm.create_model(
            ModelName="chain",
            Containers=[
                {"Image": "sklearn", "Mode": "MultiModel", "ModelDataUrl": "iris"},
                {"Image": "python"},
            ],
        ),
        "ValidationException",
        "Serial endpoint",
    )


def test_each_variant_becomes_a_spec_of_its_own(harness: Harness) -> None:
    harness.sm.create_model(
        ModelName="pair",
        Containers=[
            {"ContainerHostname": "first", "Image": "sklearn"},
            {"ContainerHostname": "second", "Image": "python"},
        ],
        InferenceExecutionConfig={"Mode": "Direct"},
    )
    harness.model("single")
    harness.sm.create_endpoint_config(
        EndpointConfigName="c1",
        ProductionVariants=[
            {
                "VariantName": "Pair",
                "ModelName": "pair",
                "InstanceType": "ml.m5.xlarge",
                "InitialInstanceCount": 2,
            },
            {
                "VariantName": "One",
                "ModelName": "single",
                "InstanceType": "ml.t2.medium",
                "InitialVariantWeight": 3,
            },
        ],
    )
    harness.deployer.cpus = 16.0
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    pair, one = harness.deployer.spec("e1@Pair@1"), harness.deployer.spec("e1@One@1")
    assert pair["InferenceExecutionConfig"] == {"Mode": "Direct"}
    assert [c["ContainerHostname"] for c in pair["Containers"]] == ["first", "second"]
    # ml.m5.xlarge's 4 CPUs, shared
    assert [c["Resources"]["Cpus"] for c in pair["Containers"]] == [2.0, 2.0]
    assert pair["AutoScaling"] == {"MinCapacity": 2, "MaxCapacity": 2}
    assert one["Containers"][0]["ContainerHostname"] == "primary"
    assert one["Containers"][0]["Resources"]["Cpus"] == 2.0 and one["AutoScaling"] == {
        "MinCapacity": 1,
        "MaxCapacity": 1,
    }
    assert "AccessControl" not in one  # no API identities: the endpoint is as anonymous as the API
    refused(
        lambda: harness.sm.create_model(
            ModelName="ambiguous",
            Containers=[{"Image": "sklearn"}, {"Image": "python"}],
            InferenceExecutionConfig={"Mode": "Direct"},
        ),
        "ValidationException",
        "Containers[0].ContainerHostname",
    )


# --- endpoints: create, update (blue/green), delete -----------------------------------------------
def test_create_goes_in_service_when_its_variants_do_and_publishes_their_weights(
    harness: Harness,
) -> None:
    harness.model("m1")
    harness.sm.create_endpoint_config(
        EndpointConfigName="c1",
        ProductionVariants=[
            {**VARIANT, "VariantName": "A", "InitialVariantWeight": 3.0},
            {**VARIANT, "VariantName": "B", "InitialVariantWeight": 1.0},
        ],
    )
    arn = harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")["EndpointArn"]
    assert arn == "arn:aws:sagemaker:us-east-1:000000000000:endpoint/e1"
    assert [s.EndpointName for s in harness.deployer.applied] == ["e1@A@1", "e1@B@1"]
    refused(
        lambda: harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1"),
        "ValidationException",
        "Cannot create already existing endpoint",
    )
    harness.api.tick()
    assert harness.status("e1") == "Creating" and not (harness.deployer.fronts or {}).get("e1")
    harness.deployer.ready("e1@A@1")
    harness.api.tick()
    assert harness.status("e1") == "Creating"
    harness.deployer.ready("e1@B@1")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (
        described["EndpointStatus"] == "InService" and "PendingDeploymentSummary" not in described
    )
    assert [
        (v["VariantName"], v["CurrentWeight"], v["CurrentInstanceCount"])
        for v in described["ProductionVariants"]
    ] == [("A", 3.0, 1), ("B", 1.0, 1)]
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 3.0), ("B", "e1@B@1", 1.0)]
    listed = harness.sm.list_endpoints(StatusEquals="InService")["Endpoints"]
    assert [(e["EndpointName"], e["EndpointStatus"]) for e in listed] == [("e1", "InService")]
    assert harness.sm.list_endpoints(StatusEquals="Creating")["Endpoints"] == []


def test_the_endpoint_in_service_waiter(harness: Harness) -> None:
    harness.model("m1")
    harness.config("c1", ("A", "m1"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    stop = threading.Event()

    def advance() -> None:  # the gateway's loop, faster; the variant comes up after a first poll
        time.sleep(0.5)
        harness.deployer.ready("e1@A@1")
        while not stop.is_set():
            harness.api.tick()
            time.sleep(0.05)

    ticker = threading.Thread(target=advance, daemon=True)
    ticker.start()
    try:
        started = time.monotonic()
        harness.sm.get_waiter("endpoint_in_service").wait(
            EndpointName="e1", WaiterConfig={"Delay": 1, "MaxAttempts": 10}
        )
        assert time.monotonic() - started < 8
    finally:
        stop.set()
        ticker.join()
    assert harness.status("e1") == "InService"


def test_a_first_create_that_fails_leaves_the_endpoint_failed(harness: Harness) -> None:
    harness.model("m1")
    harness.config("c1", ("A", "m1"))
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    harness.deployer.fail("e1@A@1", "model.skops: no such file")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "Failed"
    assert "variant A: model.skops: no such file" in described["FailureReason"]
    assert "e1@A@1" in harness.deployer.deleted and "e1" not in (harness.deployer.fronts or {})
    with pytest.raises(WaiterError, match="terminal failure state"):
        harness.sm.get_waiter("endpoint_in_service").wait(
            EndpointName="e1", WaiterConfig={"Delay": 1, "MaxAttempts": 2}
        )


def test_an_update_moves_traffic_only_when_the_whole_new_set_is_in_service(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoint_update, "DRAIN_S", 30.0)
    harness.in_service("e1", "c1", ("A",))
    harness.model("m2", image="python")
    harness.config("c2", ("A", "m2"), ("B", "m1"))
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2")
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert described["EndpointStatus"] == "Updating" and described["EndpointConfigName"] == "c1"
    assert [
        v["VariantName"] for v in described["PendingDeploymentSummary"]["ProductionVariants"]
    ] == ["A", "B"]
    # beside the old
    assert [s.EndpointName for s in harness.deployer.applied] == ["e1@A@1", "e1@A@2", "e1@B@2"]
    refused(
        lambda: harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c1"),
        "ValidationException",
        "Cannot update in-progress endpoint",
    )
    harness.deployer.ready("e1@A@2")
    harness.api.tick()
    assert harness.status("e1") == "Updating" and harness.deployer.routes("e1") == [
        ("A", "e1@A@1", 1.0)
    ]
    harness.deployer.ready("e1@B@2")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "c2")
    assert harness.deployer.routes("e1") == [("A", "e1@A@2", 1.0), ("B", "e1@B@2", 1.0)]
    assert harness.deployer.deleted == []  # the old set drains first
    harness.clock.advance(29)
    harness.api.tick()
    assert harness.deployer.deleted == []
    harness.clock.advance(2)
    harness.api.tick()
    assert harness.deployer.deleted == ["e1@A@1"]


def test_a_failed_update_rolls_back_to_the_set_serving(harness: Harness) -> None:
    harness.in_service("e1", "c1", ("A",))
    harness.config("c2", ("A", "m1"), ("B", "m1"))
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2")
    harness.deployer.ready("e1@A@2")
    harness.deployer.fail("e1@B@2", "container primary: out of memory")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "c1")
    assert (
        "rolled back" in described["FailureReason"]
        and "out of memory" in described["FailureReason"]
    )
    assert harness.deployer.routes("e1") == [("A", "e1@A@1", 1.0)]
    assert sorted(harness.deployer.deleted) == ["e1@A@2", "e1@B@2"]
    # may be tried again: generation 3
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2")
    assert {s.EndpointName for s in harness.deployer.applied[-2:]} == {"e1@A@3", "e1@B@3"}


def test_delete_endpoint_and_the_endpoint_deleted_waiter(harness: Harness) -> None:
    harness.in_service("e1", "c1", ("A", "B"))
    harness.sm.delete_endpoint(EndpointName="e1")
    assert (
        sorted(harness.deployer.deleted) == ["e1@A@1", "e1@B@1"] and harness.deployer.fronts == {}
    )
    harness.sm.get_waiter("endpoint_deleted").wait(
        EndpointName="e1", WaiterConfig={"Delay": 1, "MaxAttempts": 2}
    )
    refused(
        lambda: harness.sm.delete_endpoint(EndpointName="e1"),
        "ValidationException",
        "Could not find endpoint",
    )
    assert harness.sm.list_endpoints()["Endpoints"] == []


def test_variants_needing_more_than_the_cluster_has_are_refused(harness: Harness) -> None:
    harness.model("m1")
    harness.config("big", ("A", "m1"), instance="ml.m5.4xlarge")
    refused(
        lambda: harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="big"),
        "ResourceLimitExceeded",
        "need 16 CPUs",
        "has 8",
    )
    assert harness.sm.list_endpoints()["Endpoints"] == []
    # 2 × 4 CPUs: fits, not twice
    harness.config("c1", ("A", "m1"), instance="ml.m5.xlarge", count=2)
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    harness.deployer.ready("e1@A@1")
    harness.api.tick()
    harness.config("c2", ("B", "m1"))
    refused(
        lambda: harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2"),
        "ResourceLimitExceeded",
        "still serving",
    )
    assert [s.EndpointName for s in harness.deployer.applied] == ["e1@A@1"]


# --- authentication -------------------------------------------------------------------------------
@pytest.fixture
def identities(tmp_path: Path) -> Path:
    (tmp_path / "builder.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Resource": "*",
                        "Action": [
                            "sagemaker:CreateModel",
                            "sagemaker:DescribeModel",
                            "application-autoscaling:DescribeScalableTargets",
                        ],
                    }
                ],
            }
        )
    )
    (tmp_path / "reader.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "sagemaker:Describe*", "Resource": "*"},
                    {
                        "Effect": "Deny",
                        "Action": "sagemaker:DescribeModel",
                        "Resource": "arn:aws:sagemaker:*:*:model/secret*",
                    },
                ],
            }
        )
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "builder",
                        "AccessKeyId": KEY,
                        "SecretAccessKey": SECRET,
                        "ApiKey": API_KEY,
                        "PolicyDocuments": ["builder.json"],
                    },
                    {
                        "Principal": "reader",
                        "AccessKeyId": READER_KEY,
                        "SecretAccessKey": READER_SECRET,
                        "PolicyDocuments": ["reader.json"],
                    },
                ]
            }
        )
    )
    return tmp_path / "identities.yaml"


def test_signed_calls_are_authorized_by_the_identitys_policies(
    tmp_path: Path, identities: Path
) -> None:
    harness = Harness(tmp_path, api_identities=str(identities))
    try:
        harness.model("m1")
        harness.model("secret-model")
        assert harness.sm.describe_model(ModelName="m1")["ModelName"] == "m1"
        refused(
            lambda: harness.sm.delete_model(ModelName="m1"),
            "AccessDeniedException",
            "User: builder",
            "sagemaker:DeleteModel",
            "arn:aws:sagemaker:us-east-1:000000000000:model/m1",
        )
        refused(harness.sm.list_models, "AccessDeniedException", "sagemaker:ListModels")
        reader = harness.client(key=READER_KEY, secret=READER_SECRET)
        assert reader.describe_model(ModelName="m1")["ModelName"] == "m1"
        refused(
            lambda: reader.describe_model(ModelName="secret-model"),
            "AccessDeniedException",
            "explicit deny",
        )
        refused(
            lambda: reader.create_model(ModelName="m3", PrimaryContainer=CONTAINER),
            "AccessDeniedException",
        )
        # Application Auto Scaling's client signs for its own service; the same key verifies there.
        scaling = harness.client("application-autoscaling")
        assert (
            scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
        )
        refused(
            lambda: harness.client(
                "application-autoscaling", READER_KEY, READER_SECRET
            ).describe_scalable_targets(ServiceNamespace="sagemaker"),
            "AccessDeniedException",
            "application-autoscaling:DescribeScalableTargets",
        )
        # A signed request botocore would not have sent (a field it does not know): authorized, then
        # refused.
        body = json.dumps(
            {"ModelName": "m9", "PrimaryContainer": CONTAINER, "Colour": "red"}
        ).encode()
        request = AWSRequest(
            "POST",
            harness.url + "/",
            data=body,
            headers={
                protocol.AMZ_TARGET: "SageMaker.CreateModel",
                "Content-Type": protocol.AMZ_JSON,
            },
        )
        SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1").add_auth(request)
        answer = httpx.post(request.url, content=body, headers=dict(request.headers.items()))
        assert (answer.status_code, answer.json()["__type"]) == (400, "ValidationException")
        assert "Colour: not supported" in answer.json()["message"]
        # The endpoints the API creates carry the same identities file as their AccessControl.
        harness.api.operations["CreateEndpointConfig"](
            {"EndpointConfigName": "c1", "ProductionVariants": [VARIANT]}
        )
        harness.api.operations["CreateEndpoint"]({"EndpointName": "e1", "EndpointConfigName": "c1"})
        assert harness.deployer.spec("e1@A@1")["AccessControl"]["IdentitiesFile"] == str(identities)
    finally:
        harness.stop()


def test_unsigned_forged_and_unknown_callers_are_refused(tmp_path: Path, identities: Path) -> None:
    harness = Harness(tmp_path, api_identities=str(identities))
    try:
        refused(
            lambda: harness.client(secret="not-the-builders-secret-at-all").describe_model(
                ModelName="m1"
            ),
            "InvalidSignatureException",
        )
        refused(
            lambda: harness.client(
                "application-autoscaling", secret="not-the-builders-secret-at-all"
            ).describe_scalable_targets(ServiceNamespace="sagemaker"),
            "InvalidSignatureException",
        )
        refused(
            lambda: harness.client(key="AKIANOBODYKNOWSTHIS1").describe_model(ModelName="m1"),
            "UnrecognizedClientException",
        )
        answer = raw(
            harness.url, "SageMaker.CreateModel", {"ModelName": "m", "PrimaryContainer": CONTAINER}
        )
        assert (answer.status_code, answer.json()["__type"]) == (
            403,
            "MissingAuthenticationTokenException",
        )
        answer = raw(
            harness.url,
            "SageMaker.CreateModel",
            {"ModelName": "m", "PrimaryContainer": CONTAINER},
            Authorization="Bearer not-the-builders-api-key",
        )
        assert (answer.status_code, answer.json()["__type"]) == (403, "UnrecognizedClientException")
        assert harness.api.state.all("model") == []
        # A caller that cannot sign: the identity's API key, under the same policies.
        answer = raw(
            harness.url,
            "SageMaker.CreateModel",
            {"ModelName": "m", "PrimaryContainer": CONTAINER},
            Authorization=f"Bearer {API_KEY}",
        )
        assert answer.status_code == 200 and answer.json()["ModelArn"].endswith(":model/m")
        answer = raw(
            harness.url,
            "SageMaker.DeleteModel",
            {"ModelName": "m"},
            Authorization=f"Bearer {API_KEY}",
        )
        assert (answer.status_code, answer.json()["__type"]) == (403, "AccessDeniedException")
    finally:
        harness.stop()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_server_without_identities_refuses_every_call_unless_told_otherwise(
    tmp_path: Path, host: str
) -> None:
    # Issue 41, finding 3: anonymous on loopback by default let any local process, tenant code
    # included, create, replace and delete every team's endpoints. Now only `--allow-anonymous-api`
    # (loopback only) opens it. Bound to 127.0.0.1 here either way, but configured as a server on
    # `host` would be: that is what decides.
    harness = Harness(tmp_path, host=host, allow_anonymous_api=False)
    try:
        refused(harness.sm.list_models, "AccessDeniedException", "no anonymous calls")
        refused(lambda: harness.model("m1"), "AccessDeniedException")
        refused(
            lambda: harness.client("application-autoscaling").describe_scalable_targets(
                ServiceNamespace="sagemaker"
            ),
            "AccessDeniedException",
        )
        assert harness.api.state.all("model") == []
    finally:
        harness.stop()


def test_anonymous_calls_are_for_a_loopback_server_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a loopback host"):
        ServerSettings(host="0.0.0.0", allow_anonymous_api=True)
    with pytest.raises(ValueError, match="exclude each other"):
        ServerSettings(allow_anonymous_api=True, api_identities=str(tmp_path / "identities.yaml"))


# --- stored state ---------------------------------------------------------------------------------
def test_a_second_server_over_the_same_state_file_brings_every_endpoint_back(
    tmp_path: Path,
) -> None:
    state_file = tmp_path / "state" / "api.db"
    first = Harness(tmp_path, state_file=str(state_file))
    try:
        first.in_service("e1", "c1", ("A", "B"))
        first.model("m2")
        first.config("c2", ("A", "m2"))
        # under way when the server stops
        first.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2")
    finally:
        first.stop()
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600

    second = Harness(tmp_path, state_file=str(state_file))
    try:
        assert sorted(m["ModelName"] for m in second.sm.list_models()["Models"]) == ["m1", "m2"]
        assert (
            second.sm.describe_endpoint_config(EndpointConfigName="c2")["ProductionVariants"][0][
                "ModelName"
            ]
            == "m2"
        )
        assert second.status("e1") == "Updating"
        assert second.deployer.applied == []
        second.api.restore()
        assert sorted(s.EndpointName for s in second.deployer.applied) == [
            "e1@A@1",
            "e1@A@2",
            "e1@B@1",
        ]
        assert second.deployer.routes("e1") == [("A", "e1@A@1", 1.0), ("B", "e1@B@1", 1.0)]
        second.deployer.ready("e1@A@1", "e1@B@1", "e1@A@2")
        second.api.tick()
        described = second.sm.describe_endpoint(EndpointName="e1")
        assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", "c2")
        assert second.deployer.routes("e1") == [("A", "e1@A@2", 1.0)]
    finally:
        second.stop()


def test_a_restored_endpoint_is_updating_until_its_variants_are_back(tmp_path: Path) -> None:
    state_file = tmp_path / "api.db"
    first = Harness(tmp_path, state_file=str(state_file))
    first.in_service("e1", "c1", ("A",))
    first.stop()
    second = Harness(tmp_path, state_file=str(state_file))
    try:
        second.api.restore()
        assert [s.EndpointName for s in second.deployer.applied] == ["e1@A@1"]
        assert second.status("e1") == "Updating" and second.deployer.routes("e1") == [
            ("A", "e1@A@1", 1.0)
        ]
        second.deployer.ready("e1@A@1")
        second.api.tick()
        assert second.status("e1") == "InService" and second.deployer.deleted == []
    finally:
        second.stop()


def test_an_endpoint_that_cannot_be_restored_fails_alone(tmp_path: Path) -> None:
    """A stored endpoint whose spec no longer applies is Failed with the reason; the others come
    back (one bad document used to raise out of restore, which the server retried forever with no
    endpoint restored)."""
    state_file = tmp_path / "api.db"
    first = Harness(tmp_path, state_file=str(state_file))
    first.in_service("e1", "c1", ("A",))
    first.in_service("e2", "c2", ("A",))
    first.stop()

    class Refusing(FakeDeployer):
        def apply(self, spec):
            if spec.EndpointName.startswith("e1@"):
                raise ValueError("Resources.Gpus: no such resource on this cluster")
            return super().apply(spec)

    second = Harness(tmp_path, deployer=Refusing(), state_file=str(state_file))
    try:
        second.api.restore()
        assert [s.EndpointName for s in second.deployer.applied] == ["e2@A@1"]
        described = second.sm.describe_endpoint(EndpointName="e1")
        assert described["EndpointStatus"] == "Failed"
        assert (
            "could not be restored" in described["FailureReason"]
            and "Resources.Gpus" in described["FailureReason"]
        )
        second.deployer.ready("e2@A@1")
        second.api.tick()
        assert second.status("e2") == "InService" and second.deployer.routes("e2") == [
            ("A", "e2@A@1", 1.0)
        ]
        second.sm.delete_endpoint(EndpointName="e1")  # a Failed endpoint can still be deleted
        assert "e1" not in [e["EndpointName"] for e in second.sm.list_endpoints()["Endpoints"]]
    finally:
        second.stop()


def test_ticks_read_nothing_once_nothing_is_under_way(harness: Harness, monkeypatch) -> None:
    """An idle server's background step does no work; an update wakes it (it read the state twice a
    second)."""
    harness.in_service("e1", "c1", ("A",))
    harness.api.tick()  # nothing pending or draining now
    reads = []
    original = harness.api.state.all
    monkeypatch.setattr(harness.api.state, "all", lambda kind: reads.append(kind) or original(kind))
    harness.api.tick()
    harness.api.tick()
    assert reads == []
    harness.model("m2")
    harness.config("c2", ("A", "m2"))
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="c2")
    reads.clear()
    harness.deployer.ready("e1@A@2")
    harness.api.tick()
    assert reads and harness.status("e1") == "InService"
    assert harness.deployer.routes("e1") == [("A", "e1@A@2", 1.0)]


# --- routing an API endpoint's invocations --------------------------------------------------------
FRONT = Front("e1", (VariantRoute("A", "e1@A@1", 3.0), VariantRoute("B", "e1@B@1", 1.0)))


def test_front_pick_honours_target_variant_and_splits_by_weight() -> None:
    assert FRONT.pick("B").endpoint == "e1@B@1"
    with pytest.raises(ValidationError, match="names no variant of endpoint e1; variants: A, B"):
        FRONT.pick("C")
    draw = random.Random(17).random
    picks = [FRONT.pick(None, draw).name for _ in range(4000)]
    assert abs(picks.count("A") / 4000 - 0.75) < 0.03
    zero = Front("e1", (VariantRoute("A", "e1@A@1", 0.0), VariantRoute("B", "e1@B@1", 0.0)))
    with pytest.raises(ValidationError, match="weight 0"):
        zero.pick(None)
    assert zero.pick("A").name == "A"  # a variant may still be named
    half = Front("e1", (VariantRoute("A", "e1@A@1", 0.0), VariantRoute("B", "e1@B@1", 2.0)))
    assert {half.pick(None, draw).name for _ in range(200)} == {"B"}


def admit(invocations: Invocations, endpoint: str, **headers: str) -> Any:
    async def body() -> AsyncIterator[bytes]:
        yield b"[1]"

    head = RawRequest("POST", f"/endpoints/{endpoint}/invocations", "", tuple(headers.items()), b"")
    request = InvocationRequest(endpoint, Headers(headers), body, lambda: head)
    return asyncio.run(invocations.admit(request, InvocationTrace()))


def test_invocations_reach_a_variant_only_through_its_api_endpoint() -> None:
    invocations = Invocations(ServerSettings(), ContainerTransport(default_limit=1))
    invocations.endpoints = {
        name: EndpointRoute(name, "Direct", ("primary",)) for name in ("e1@A@1", "e1@B@1")
    }
    invocations.fronts = {"e1": FRONT}
    with pytest.raises(ValidationError, match="Endpoint e1@A@1 not found"):
        admit(invocations, "e1@A@1")
    admission = admit(invocations, "e1", **{protocol.TARGET_VARIANT: "B"})
    assert (admission.endpoint.name, admission.variant) == ("e1@B@1", "B")
    with pytest.raises(ValidationError, match="names no variant"):
        admit(invocations, "e1", **{protocol.TARGET_VARIANT: "AllTraffic"})


def test_a_model_whose_requirements_would_install_packages_is_refused(harness: Harness) -> None:
    # Ray would install them outside the container's sandbox, with Ray's credentials
    # (docs/security.md)
    code = harness.models / "needs" / "code"
    code.mkdir(parents=True)
    (code / "requirements.txt").write_text("surely-not-installed-pkg==1.0\n")
    refused(
        lambda: harness.model("m1", ModelDataUrl="needs"),
        "ValidationException",
        "model m1: Containers[primary].ModelDataUrl",
        "surely-not-installed-pkg==1.0",
        "SERVING_ALLOW_MODEL_REQUIREMENTS",
    )
    (harness.models / "plain").mkdir()
    harness.model("ok", ModelDataUrl="plain")
    # a model whose folder gains the file after CreateModel ...
    harness.model("m2", ModelDataUrl="iris")
    (harness.models / "iris" / "code").mkdir()
    (harness.models / "iris" / "code" / "requirements.txt").write_text(
        "surely-not-installed-pkg==1.0\n"
    )
    harness.config("c1", ("A", "ok"), ("B", "m2"))
    refused(
        lambda: harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1"),
        "ValidationException",
        "surely-not-installed-pkg==1.0",
    )
    # ... is refused when deployed, before any variant is applied
    assert harness.deployer.applied == []


def test_model_requirements_are_installed_where_the_operator_allows_it(tmp_path: Path) -> None:
    allowed = Harness(tmp_path, allow_model_requirements=True)
    try:
        code = allowed.models / "needs" / "code"
        code.mkdir(parents=True)
        (code / "requirements.txt").write_text("surely-not-installed-pkg==1.0\n")
        allowed.model("m1", ModelDataUrl="needs")
        assert allowed.sm.list_models()["Models"][0]["ModelName"] == "m1"
    finally:
        allowed.stop()
