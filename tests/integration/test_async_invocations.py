"""InvokeEndpointAsync with an unmodified boto3 client, inputs and answers on a local S3-compatible
server.

it-async (built below) is one `sleepy` container with an AsyncInferenceConfig: answers under
s3://it-async/answers/, failures under s3://it-async/failures/, inputs only from
s3://it-async/inputs/. Each answer is checked against what InvokeEndpoint returns for the same
input, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import boto3
import botocore.exceptions
import psutil
import pytest
from botocore.config import Config
from suite import endpoints
from suite.endpoint_server import TINY
from suite.endpoints import python_container

from serving.client import ModelError

pytestmark = pytest.mark.integration

# it-async: InvokeEndpointAsync on the session's S3-compatible server.
ASYNC_BUCKET = "it-async"


def sleepy_async(handler_models: dict[str, Path], s3_models: str) -> dict:
    return {
        "EndpointName": "it-async",
        "Containers": [python_container("sleepy", handler_models, "sleepy", Resources=TINY)],
        "AsyncInferenceConfig": {
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2},
            "OutputConfig": {
                "S3OutputPath": f"s3://{ASYNC_BUCKET}/answers",
                "S3FailurePath": f"s3://{ASYNC_BUCKET}/failures/",
            },
            "InputConfig": {"S3InputPath": f"s3://{ASYNC_BUCKET}/inputs/"},
            "S3EndpointUrl": s3_models,
        },
    }


ENDPOINTS = {
    "it-async": sleepy_async,
    "it-single": endpoints.single,
}  # what `server` deploys for this module, by builder

# a job runs in well under a second; the bound only keeps a broken gateway from hanging the suite
WAIT_S = 60


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


@pytest.fixture(scope="module")
def s3(server, s3_models):
    client = boto3.client(
        "s3",
        endpoint_url=s3_models,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=ASYNC_BUCKET)
    return client


def _put_input(s3, body: bytes) -> str:
    key = f"inputs/{uuid.uuid4()}.json"
    s3.put_object(Bucket=ASYNC_BUCKET, Key=key, Body=body)
    return f"s3://{ASYNC_BUCKET}/{key}"


def _object(s3, uri: str, timeout: float = WAIT_S) -> bytes:
    """The object at `uri` once it exists (bounded wait)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    deadline = time.monotonic() + timeout
    while True:
        try:
            return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except s3.exceptions.NoSuchKey:
            if time.monotonic() > deadline:
                raise AssertionError(f"{uri} was not written within {timeout:.0f} s") from None
            time.sleep(0.1)


def _absent(s3, uri: str) -> bool:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except botocore.exceptions.ClientError:
        return True
    return False


def test_answer_is_written_where_sagemaker_writes_it(server, runtime, s3):
    payload = b'{"question": 42}'
    response = runtime.invoke_endpoint_async(
        EndpointName="it-async",
        InputLocation=_put_input(s3, payload),
        ContentType="application/json",
        CustomAttributes="sleep=0.1",
    )
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 202
    inference_id = response["InferenceId"]
    assert str(uuid.UUID(inference_id)) == inference_id  # generated: a UUID, as SageMaker does
    assert response["OutputLocation"] == f"s3://{ASYNC_BUCKET}/answers/{inference_id}.out"
    assert response["FailureLocation"] == f"s3://{ASYNC_BUCKET}/failures/{inference_id}-error.out"
    synchronous = server.client.invoke(
        "it-async", payload, content_type="application/json", custom_attributes="sleep=0.1"
    )
    assert synchronous.status_code == 200
    assert _object(s3, response["OutputLocation"]) == synchronous.raw == b'{"slept":0.1}'
    assert _absent(s3, response["FailureLocation"])


def test_inference_id_and_inline_body(runtime, s3):
    response = runtime.invoke_endpoint_async(
        EndpointName="it-async",
        InferenceId="batch-7-item-3",
        Body=b"{}",
        ContentType="application/json",
    )
    assert response["InferenceId"] == "batch-7-item-3"
    assert response["OutputLocation"] == f"s3://{ASYNC_BUCKET}/answers/batch-7-item-3.out"
    assert _object(s3, response["OutputLocation"]) == b'{"slept":0.0}'


def test_a_failing_model_leaves_its_error_at_the_failure_location(server, runtime, s3):
    payload = b"[1]"
    response = runtime.invoke_endpoint_async(
        EndpointName="it-async",
        InputLocation=_put_input(s3, payload),
        ContentType="application/json",
        CustomAttributes="sleep=never",  # the handler's float() fails: the model's own error
    )
    with pytest.raises(ModelError) as raised:
        server.client.invoke(
            "it-async", payload, content_type="application/json", custom_attributes="sleep=never"
        )
    synchronous = raised.value
    assert synchronous.status_code == 424
    failure = json.loads(_object(s3, response["FailureLocation"]))
    assert failure == synchronous.body
    assert failure["__type"] == "ModelError" and failure["OriginalStatusCode"] == 500
    assert "could not convert string to float" in failure["OriginalMessage"]
    assert _absent(s3, response["OutputLocation"])


def test_invocation_timeout_is_honoured(runtime, s3):
    response = runtime.invoke_endpoint_async(
        EndpointName="it-async",
        InputLocation=_put_input(s3, b"{}"),
        ContentType="application/json",
        CustomAttributes="sleep=2.5",
        InvocationTimeoutSeconds=1,
    )
    failure = json.loads(_object(s3, response["FailureLocation"]))
    assert failure["__type"] == "ModelError" and "timed out" in failure["message"]


def test_input_outside_the_allowed_prefix_is_refused(runtime, s3):
    s3.put_object(Bucket=ASYNC_BUCKET, Key="answers/secret.json", Body=b"{}")
    for location in (
        f"s3://{ASYNC_BUCKET}/answers/secret.json",
        "s3://it-models/team-a/iris-0.tar.gz",
        f"s3://{ASYNC_BUCKET}/inputs/../answers/secret.json",
    ):
        with pytest.raises(runtime.exceptions.ValidationError) as raised:
            runtime.invoke_endpoint_async(EndpointName="it-async", InputLocation=location)
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        message = raised.value.response["Error"]["Message"]
        assert "S3InputPath" in message or "'..'" in message, message


def test_an_endpoint_without_async_inference_config_refuses(runtime):
    with pytest.raises(runtime.exceptions.ValidationError) as raised:
        runtime.invoke_endpoint_async(
            EndpointName="it-single", InputLocation=f"s3://{ASYNC_BUCKET}/inputs/x.json"
        )
    assert "AsyncInferenceConfig" in raised.value.response["Error"]["Message"]


def test_describe_endpoint_shows_the_config(server):
    config = server.client.describe_endpoint("it-async")["AsyncInferenceConfig"]
    assert config["OutputConfig"]["S3OutputPath"] == f"s3://{ASYNC_BUCKET}/answers"
    assert config["ClientConfig"] == {"MaxConcurrentInvocationsPerInstance": 2}
    assert "AsyncInferenceConfig" not in server.client.describe_endpoint("it-single")


def _gateway(url: str) -> psutil.Process:
    """The process listening on the gateway's port (this session's own gateway replica)."""
    port = int(url.rsplit(":", 1)[1])
    holders = {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
    }
    assert len(holders) == 1, holders
    return psutil.Process(holders.pop())


def test_requests_admitted_before_the_gateway_is_killed_are_finished_exactly_once(
    server, runtime, s3
):
    # Last on purpose (the gateway restarts). Issue 43: admitted (202) but unfinished requests lived
    # only in the gateway's memory, and a killed gateway lost them without a trace. Now each is
    # recorded in Ray's key-value store before the 202, and the gateway that takes over finishes it:
    # one answer, written once.
    s3.put_bucket_versioning(Bucket=ASYNC_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    run = uuid.uuid4().hex[:8]
    admitted = []
    # two run at once (MaxConcurrentInvocationsPerInstance), two wait in the queue
    for index in range(4):
        admitted.append(
            runtime.invoke_endpoint_async(
                EndpointName="it-async",
                InputLocation=_put_input(s3, b"{}"),
                ContentType="application/json",
                CustomAttributes="sleep=1.5",
                InferenceId=f"killed-{run}-{index}",
            )
        )
    gateway = _gateway(server.url)
    assert gateway.pid != os.getpid()
    gateway.send_signal(signal.SIGKILL)
    # the restart (seconds) and the takeover of a silent gateway's requests
    deadline = time.monotonic() + 120
    for response in admitted:
        answer = _object(
            s3, response["OutputLocation"], timeout=max(deadline - time.monotonic(), 1)
        )
        assert answer == b'{"slept":1.5}'
        bucket, _, key = response["OutputLocation"].removeprefix("s3://").partition("/")
        versions = s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]
        assert len([v for v in versions if v["Key"] == key]) == 1, versions
        assert _absent(s3, response["FailureLocation"])
    assert _gateway(server.url).pid != gateway.pid
