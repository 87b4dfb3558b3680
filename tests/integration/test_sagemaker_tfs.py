"""SageMaker TensorFlow Serving container scripts, as AWS's examples write them, on a real endpoint.

it-tfs (tests/server_fixtures.py) holds two tensorflow containers on TF Serving's half_plus_three
(0.5 * x + 3): `io` with input_handler/output_handler, `posting` with a handler that posts to
`context.rest_uri` with `requests` from inside its sandboxed container process (so loopback TCP to the
data port works under Landlock and seccomp). Invoked with unmodified boto3; the expected bytes are TF
Serving's own answer, which output_handler returns as `response.content`.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config

pytestmark = pytest.mark.integration

ENDPOINTS = ("it-tfs",)  # what `server` deploys for this module

TFS_ANSWER = b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.mark.parametrize("container", ["io", "posting"])
def test_csv_through_the_handlers(runtime, container: str) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-tfs",
        TargetContainerHostname=container,
        ContentType="text/csv",
        Accept="application/json",
        Body="1.0,2.0,5.0",
    )
    assert response["Body"].read() == TFS_ANSWER
    assert response["ContentType"] == "application/json"


@pytest.mark.parametrize("container", ["io", "posting"])
def test_json_passes_through_to_tf_serving(runtime, container: str) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-tfs",
        TargetContainerHostname=container,
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps({"inputs": [1.0, 2.0]}),
    )
    assert response["Body"].read() == b'{\n    "outputs": [\n        3.5,\n        4.0\n    ]\n}'


@pytest.mark.parametrize("container", ["io", "posting"])
def test_a_handler_failure_is_a_model_error_with_the_containers_answer(runtime, container: str) -> None:
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-tfs",
            TargetContainerHostname=container,
            ContentType="application/json",
            Body=json.dumps({"instances": ["a"]}),
        )
    error = raised.value.response
    assert error["OriginalStatusCode"] == 500
    # python_service.py answers {"error": str(e)}; here e carries TF Serving's own 400 answer.
    tf_serving = json.loads(json.loads(error["OriginalMessage"])["error"])
    assert "holds text" in tf_serving["error"]
