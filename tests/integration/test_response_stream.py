"""InvokeEndpointWithResponseStream with an unmodified boto3 client against real Ray Serve
endpoints."""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EventStreamError
from suite import endpoints
from suite.endpoint_server import TINY
from suite.endpoints import python_container

pytestmark = pytest.mark.integration


def stream(handler_models: dict[str, Path]) -> dict:
    """it-stream: a container whose output_fn yields chunks."""
    return {
        "EndpointName": "it-stream",
        "Containers": [python_container("streamer", handler_models, "streamer", Resources=TINY)],
    }


ENDPOINTS = {
    "it-stream": stream,
    "it-single": endpoints.single,
    "it-serial": endpoints.serial,
}  # what `server` deploys for this module, by builder

GAP_S = 0.4


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}, read_timeout=30),
    )


def stream(runtime, endpoint: str, document, **kwargs):
    kwargs.setdefault("Accept", "application/jsonlines")
    return runtime.invoke_endpoint_with_response_stream(
        EndpointName=endpoint,
        ContentType="application/json",
        Body=json.dumps(document),
        **kwargs,
    )


def test_a_generator_streams_parts_as_it_makes_them(runtime):
    response = stream(runtime, "it-stream", {"count": 4, "gap": GAP_S})
    assert response["ContentType"] == "application/jsonlines"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    arrivals, chunks = [], []
    for event in response["Body"]:
        arrivals.append(time.time())
        chunks.append(json.loads(event["PayloadPart"]["Bytes"]))
    assert [chunk["index"] for chunk in chunks] == [0, 1, 2, 3]
    # the first part reached boto3 before the generator made its last one: nothing buffered the
    # whole answer
    assert arrivals[0] < chunks[-1]["made"] - GAP_S, (arrivals, chunks)


def test_a_non_streaming_container_answers_with_one_part(runtime):
    response = stream(runtime, "it-single", [[5.1, 3.5, 1.4, 0.2]], Accept="text/csv")
    assert response["ContentType"] == "text/csv"
    assert list(response["Body"]) == [{"PayloadPart": {"Bytes": b"0\n"}}]


def test_serial_chain_streams_the_last_containers_answer(runtime):
    response = stream(runtime, "it-serial", [[5.1, 3.5, 1.4, 0.2]], Accept="application/json")
    assert json.loads(b"".join(event["PayloadPart"]["Bytes"] for event in response["Body"])) == {
        "labels": ["setosa"]
    }


def test_a_generator_raising_midway_is_a_model_stream_error(runtime):
    response = stream(runtime, "it-stream", {"count": 5, "fail": 2})
    events = iter(response["Body"])
    assert [json.loads(next(events)["PayloadPart"]["Bytes"])["index"] for _ in range(2)] == [0, 1]
    with pytest.raises(EventStreamError) as raised:
        next(events)
    assert raised.value.response["Error"]["Code"] == "ModelStreamError"
    assert "the generator broke at chunk 2" in raised.value.response["Error"]["Message"]


def test_an_error_before_the_first_part_is_a_model_error(runtime):
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        stream(runtime, "it-stream", {"count": 2, "fail": 0})
    error = raised.value.response
    assert error["OriginalStatusCode"] == 500
    assert error["OriginalMessage"] == "ValueError: the generator broke at chunk 0"
    assert error["LogStreamArn"]


def test_an_unsupported_parameter_is_refused_by_name(runtime):
    with pytest.raises(runtime.exceptions.ValidationError, match="InferenceComponentName"):
        stream(runtime, "it-stream", {"count": 1}, InferenceComponentName="ic-1")
