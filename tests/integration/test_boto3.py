"""An unmodified boto3 sagemaker-runtime client pointed at the server with endpoint_url=."""

from __future__ import annotations

import json

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config
from suite import endpoints

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-serial": endpoints.serial,
    "it-serial-fail": endpoints.serial_fail,
}  # what `server` deploys for this module, by builder


@pytest.fixture(scope="module")
def runtime(server):
    # Authentication is off on a loopback server without policies; boto3 still signs requests.
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


def test_direct_invocation(runtime):
    response = runtime.invoke_endpoint(
        EndpointName="it-direct",
        TargetContainerHostname="iris",
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps([[6.7, 3.0, 5.2, 2.3]]),
    )
    assert json.loads(response["Body"].read()) == [2]
    assert response["ContentType"].startswith("application/json")
    assert response["InvokedProductionVariant"] == "AllTraffic"


def test_serial_invocation_with_custom_attributes(runtime):
    response = runtime.invoke_endpoint(
        EndpointName="it-serial",
        ContentType="text/csv",
        Body="5.1,3.5,1.4,0.2\n",
        CustomAttributes="run=7",
    )
    assert json.loads(response["Body"].read()) == {"labels": ["setosa"]}
    assert response["CustomAttributes"] == "run=7;labelled=1"


def test_validation_error_is_a_botocore_exception(runtime):
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-direct",
            TargetContainerHostname="nosuch",
            ContentType="application/json",
            Body="[[1,2,3,4]]",
        )
    assert raised.value.response["Error"]["Code"] == "ValidationError"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert isinstance(raised.value, runtime.exceptions.ValidationError)


def test_model_error_carries_the_original_status(runtime):
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-serial-fail",
            ContentType="application/json",
            Body="[[5.1,3.5,1.4,0.2]]",
        )
    error = raised.value.response
    assert error["Error"]["Code"] == "ModelError"
    assert error["OriginalStatusCode"] == 500
    assert "cannot score this input" in error["OriginalMessage"]
