"""Every error code of the HTTP contract, produced by a real request, in the documented shape."""

from __future__ import annotations

import threading

import pytest
from suite import endpoints

from serving.client import ServingClientError

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-single": endpoints.single,
    "it-serial": endpoints.serial,
    "it-serial-fail": endpoints.serial_fail,
    "it-broken": endpoints.broken,
}  # what `server` deploys for this module, by builder

ROW = [[5.1, 3.5, 1.4, 0.2]]
JSON = "application/json"


def raised(call, *args, **options) -> ServingClientError:
    """The error the SDK raised for `call(*args, **options)`: the status, headers and body the
    server answered."""
    with pytest.raises(ServingClientError) as caught:
        call(*args, **options)
    return caught.value


def assert_error(error: ServingClientError, status: int, code: str, *fragments: str) -> dict:
    assert error.status_code == status, error
    assert error.headers["x-amzn-errortype"] == code
    body = error.body
    assert body["__type"] == code
    for fragment in fragments:
        assert fragment in body["message"], body["message"]
    return body


def test_unknown_endpoint(server):
    assert_error(
        raised(server.client.invoke, "no-such-endpoint", ROW),
        400,
        "ValidationError",
        "no-such-endpoint",
    )


def test_missing_target_header_with_several_containers(server):
    assert_error(
        raised(server.client.invoke, "it-direct", ROW),
        400,
        "ValidationError",
        "X-Amzn-SageMaker-Target-Container-Hostname",
        "iris",
    )


def test_unknown_target_hostname(server):
    assert_error(
        raised(server.client.invoke, "it-direct", ROW, target="nosuch"),
        400,
        "ValidationError",
        "nosuch",
    )


def test_target_header_on_serial_endpoint(server):
    assert_error(
        raised(server.client.invoke, "it-serial", ROW, target="classifier"),
        400,
        "ValidationError",
        "Serial",
    )


def test_unsupported_content_type_is_a_model_error_with_the_containers_415(server):
    # SageMaker reports every non-2xx answer of a model container as ModelError, with the
    # container's status.
    body = assert_error(
        raised(server.client.invoke, "it-single", b"<xml/>", content_type="application/xml"),
        424,
        "ModelError",
        "application/xml",
        "container only",
        "(415)",
    )
    assert body["OriginalStatusCode"] == 415
    assert "unsupported content type 'application/xml'" in body["OriginalMessage"]


def test_unknown_operation_is_sagemaker_shaped(server):
    for method, path, words in [
        ("POST", "/endpoints/it-single/foo", ["POST /endpoints/it-single/foo"]),
        ("GET", "/endpoints/it-single/invocations", ["InvokeEndpoint", "GET"]),
    ]:
        response = server.http.request(method, path)
        assert response.headers["x-amzn-errortype"] == "UnknownOperationException", response.text
        assert response.json()["__type"] == "UnknownOperationException"
        for word in words:
            assert word in response.json()["message"]


def test_boto3_model_error_has_original_status_and_log_stream(server):
    import boto3
    from botocore.config import Config

    runtime = boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    for kwargs, status in [
        ({"EndpointName": "it-single", "ContentType": "application/xml", "Body": b"<xml/>"}, 415),
        (
            {
                "EndpointName": "it-direct",
                "TargetContainerHostname": "faulty",
                "ContentType": "application/json",
                "Body": b"[[1.0]]",
            },
            500,
        ),
    ]:
        with pytest.raises(runtime.exceptions.ModelError) as raised:
            runtime.invoke_endpoint(**kwargs)
        error = raised.value.response
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
        assert error["OriginalStatusCode"] == status
        # where the container process's output goes: its replica worker's log file on the node,
        # named without the node's folder (issue 41, finding 7g: it was the file's path on the
        # server)
        stream = error["LogStreamArn"]
        assert stream.startswith(f"{kwargs['EndpointName']}/") and stream.endswith(".err"), error
        assert stream.count("/") == 2 and "/tmp" not in stream and "session" not in stream, stream


def test_payload_over_the_limit(server):
    big = b"[" + b"1.0," * 400_000 + b"1.0]"  # ~1.6 MB against the session's 1 MB limit
    assert_error(
        raised(server.client.invoke, "it-single", big, content_type=JSON),
        400,
        "ValidationError",
        "limit",
    )
    # the server keeps serving
    assert server.client.invoke("it-single", ROW).status_code == 200


def test_model_failure_names_the_container(server):
    body = assert_error(
        raised(server.client.invoke, "it-direct", ROW, target="faulty"), 424, "ModelError", "faulty"
    )
    assert body["OriginalStatusCode"] == 500
    assert "cannot score this input" in body["OriginalMessage"]


def test_wrong_feature_count_is_a_model_error(server):
    body = assert_error(
        raised(server.client.invoke, "it-direct", [[1.0, 2.0]], target="iris"),
        424,
        "ModelError",
        "iris",
    )
    assert "features" in body["OriginalMessage"]


def test_serial_failure_names_container_and_position(server):
    body = assert_error(
        raised(server.client.invoke, "it-serial-fail", ROW),
        424,
        "ModelError",
        "faulty",
        "position 2 of 3",
    )
    assert body["ContainerHostname"] == "faulty"


def test_invocation_timeout(server):
    body = assert_error(
        raised(
            server.client.invoke,
            "it-direct",
            b"{}",
            target="sleepy",
            content_type=JSON,
            custom_attributes="sleep=5",
        ),
        424,
        "ModelError",
        "timed out",
        "sleepy",
    )
    assert body["OriginalStatusCode"] == 408


def test_backpressure_is_model_not_ready(server):
    slow_started = threading.Event()
    results = {}

    def slow_call():
        slow_started.set()
        results["slow"] = server.client.invoke(
            "it-direct", b"{}", target="narrow", content_type=JSON, custom_attributes="sleep=2"
        )

    worker = threading.Thread(target=slow_call)
    worker.start()
    slow_started.wait(5)
    import time

    time.sleep(0.5)  # let the slow request reach the replica
    rejected = raised(
        server.client.invoke,
        "it-direct",
        b"{}",
        target="narrow",
        content_type=JSON,
        custom_attributes="sleep=0",
    )
    worker.join(30)
    assert_error(rejected, 429, "ModelNotReadyException", "narrow", "limit of 1")
    assert results["slow"].status_code == 200  # what was accepted is not lost


def test_failed_endpoint_is_service_unavailable(server):
    assert_error(
        raised(server.client.invoke, "it-broken", ROW, target="fine"),
        503,
        "ServiceUnavailable",
        "broken",
        "weights file is corrupt",
    )


def test_bad_variant_and_target_model_headers(server):
    assert_error(
        raised(server.client.invoke, "it-single", ROW, variant="Blue"),
        400,
        "ValidationError",
        "Blue",
    )
    assert_error(
        raised(server.client.invoke, "it-single", ROW, model="m.tar.gz"),
        400,
        "ValidationError",
        "MultiModel",
    )
