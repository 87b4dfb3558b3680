"""InvokeEndpointWithResponseStream through a real router and real container apps over loopback HTTP
(no Ray), read with botocore's event-stream parser; and how container errors reach the caller."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer
from test_router import ROWS, Servers, load, start_router, write_handler

from serving import protocol
from serving.errors import (
    ContainerError,
    ModelNotReadyError,
    UnsupportedFormatError,
    ValidationError,
)
from serving.gateway.admission import EndpointRoute
from serving.gateway.failures import container_failure
from serving.gateway.transport import HopResponse
from serving.model_server.app import build_container_app

if TYPE_CHECKING:
    from conftest import SavedModel

STREAM_PATH = "/endpoints/{}/invocations-response-stream"
GAP_S = 0.3

# output_fn returns a generator: each chunk carries the time it was made. "fail=N" raises after N
# chunks, "forever" never ends (until the caller leaves: its `finally` tells the test).
STREAMING_HANDLER = """
import json, threading, time

def model_fn(model_dir):
    return {"closed": threading.Event()}

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    if isinstance(data, list):  # another container's answer: one chunk per item
        return {"count": len(data), "items": data}
    return data

def output_fn(prediction, accept, context):
    def chunks():
        try:
            count = prediction.get("count", 3)
            index = 0
            while prediction.get("forever") or index < count:
                if index == prediction.get("fail"):
                    raise ValueError("the generator broke at chunk %d" % index)
                item = prediction["items"][index] if "items" in prediction else None
                yield json.dumps({"index": index, "item": item, "made": time.time()}) + "\\n"
                index += 1
                time.sleep(prediction.get("gap", 0))
        finally:
            MODEL["closed"].set()
    return chunks()  # a generator: each item is one part (content type: the Accept)
"""

TOOLKIT_ERROR_HANDLER = """
class BaseInferenceToolkitError(Exception):  # the shape of sagemaker_inference.errors' class
    def __init__(self, status_code, message, phrase):
        self.status_code, self.message, self.phrase = status_code, message, phrase
        super().__init__(status_code, message, phrase)

def predict_fn(data, model):
    if data == [["validation"]]:
        from serving.errors import ValidationError
        raise ValidationError("looks like the platform's, is the model's")
    raise BaseInferenceToolkitError(403, "this caller may not see this row", "Forbidden")
"""


@pytest.fixture(scope="module")
def streaming(
    tmp_path_factory: pytest.TempPathFactory, iris_classifier: SavedModel
) -> Iterator[tuple[httpx.Client, dict]]:
    servers = Servers()
    streamer = load("python", write_handler(tmp_path_factory.mktemp("streamer"), STREAMING_HANDLER))
    # the generator's view of its model
    streamer._hooks["output_fn"].__globals__["MODEL"] = streamer.model
    runtimes = {
        "streamer": streamer,
        "iris": load("sklearn", iris_classifier.path),
        "toolkit": load(
            "python", write_handler(tmp_path_factory.mktemp("toolkit"), TOOLKIT_ERROR_HANDLER)
        ),
    }
    urls = {
        name: servers.serve(build_container_app(runtime, name, log_stream="/var/log/" + name))
        for name, runtime in runtimes.items()
    }
    routes = [
        EndpointRoute("stream", "Direct", ("streamer",)),
        EndpointRoute("iris", "Direct", ("iris",)),
        EndpointRoute("toolkit", "Direct", ("toolkit",)),
        EndpointRoute("chain", "Serial", ("iris", "streamer")),
    ]
    table = {(route.name, host): [urls[host]] for route in routes for host in route.containers}
    url, _ = start_router(servers, routes, table, invocation_timeout_s=5, stream_timeout_s=3)
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client, runtimes
    servers.stop()


def events(response: httpx.Response) -> Iterator[tuple[float, Any]]:
    """(arrival time, event) as botocore parses them, read as the bytes arrive."""
    buffer = EventStreamBuffer()
    for data in response.iter_raw():
        buffer.add_data(data)
        for message in buffer:
            kind = message.headers.get(":event-type") or message.headers.get(":exception-type")
            yield time.time(), (kind, message.payload)


def stream(
    client: httpx.Client, endpoint: str, document: Any, **headers: str
) -> tuple[httpx.Response, list]:
    headers = {
        "content-type": "application/json",
        protocol.STREAM_ACCEPT: "application/jsonlines",
        **headers,
    }
    with client.stream(
        "POST", STREAM_PATH.format(endpoint), content=json.dumps(document).encode(), headers=headers
    ) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        return response, list(events(response))


def test_parts_arrive_as_the_generator_makes_them(streaming) -> None:
    client, _ = streaming
    response, received = stream(client, "stream", {"count": 3, "gap": GAP_S})
    assert response.status_code == 200
    assert response.headers["content-type"] == protocol.EVENT_STREAM
    assert response.headers[protocol.STREAM_CONTENT_TYPE] == "application/jsonlines"
    assert response.headers[protocol.INVOKED_VARIANT] == "AllTraffic"
    assert [kind for _, (kind, _) in received] == ["PayloadPart"] * 3
    chunks = [json.loads(payload) for _, (_, payload) in received]
    assert [chunk["index"] for chunk in chunks] == [0, 1, 2]
    # the first part arrived before the last one was made: nothing waits for the generator to finish
    # (a buffered answer would arrive after it; the margin of two gaps keeps a starved CI machine
    # from failing it falsely)
    first_arrival, last_made = received[0][0], chunks[-1]["made"]
    assert first_arrival < last_made, (first_arrival, last_made)


def test_a_non_streaming_container_answers_with_one_part(streaming) -> None:
    client, _ = streaming
    response, received = stream(client, "iris", ROWS, **{protocol.STREAM_ACCEPT: "text/csv"})
    assert response.status_code == 200
    assert response.headers[protocol.STREAM_CONTENT_TYPE] == "text/csv"
    assert received == [(received[0][0], ("PayloadPart", b"0\n2\n1\n"))]


def test_serial_earlier_answers_are_whole_and_the_last_container_streams(streaming) -> None:
    client, _ = streaming
    # iris answers [0, 2, 1] whole; streamer streams it
    response, received = stream(client, "chain", ROWS)
    assert response.status_code == 200, response.text
    assert [json.loads(payload)["item"] for _, (_, payload) in received] == [0, 2, 1]


def test_a_generator_that_raises_midway_ends_with_a_model_stream_error(streaming) -> None:
    client, _ = streaming
    response, received = stream(client, "stream", {"count": 5, "fail": 2})
    assert response.status_code == 200
    assert [kind for _, (kind, _) in received] == ["PayloadPart", "PayloadPart", "ModelStreamError"]
    error = json.loads(received[-1][1][1])
    assert error == {
        "Message": "container streamer: ValueError: the generator broke at chunk 2",
        "ErrorCode": "ModelError",
    }


def test_an_error_before_the_first_part_is_an_ordinary_model_error(streaming) -> None:
    client, _ = streaming
    response, _ = stream(client, "stream", {"count": 2, "fail": 0})
    assert response.status_code == 424
    body = response.json()
    assert body["__type"] == "ModelError" and body["OriginalStatusCode"] == 500
    assert body["OriginalMessage"] == "ValueError: the generator broke at chunk 0"
    assert body["LogStreamArn"] == "/var/log/streamer"


def test_a_stream_past_its_time_limit_ends_with_model_invocation_time_exceeded(streaming) -> None:
    client, _ = streaming
    response, received = stream(client, "stream", {"forever": True, "gap": 0.5})
    assert response.status_code == 200
    assert received[-1][1][0] == "ModelStreamError"
    assert json.loads(received[-1][1][1])["ErrorCode"] == "ModelInvocationTimeExceeded"
    assert 4 <= len(received) <= 8  # ~3 s of parts, 0.5 s apart


def test_a_caller_that_leaves_stops_the_generator(streaming) -> None:
    client, runtimes = streaming
    closed: threading.Event = runtimes["streamer"].model["closed"]
    closed.clear()
    with client.stream(
        "POST",
        STREAM_PATH.format("stream"),
        content=b'{"forever": true, "gap": 0.1}',
        headers={"content-type": "application/json"},
    ) as response:
        assert response.status_code == 200
        parts = events(response)
        next(parts), next(parts)
    assert closed.wait(5), "the model's generator kept running after its caller left"


@pytest.mark.parametrize(
    ("header", "parameter"),
    [
        ("X-Amzn-SageMaker-Inference-Component", "InferenceComponentName"),
        ("X-Amzn-SageMaker-Session-Id", "SessionId"),
    ],
)
def test_unsupported_stream_parameters_are_refused_by_name(
    streaming, header: str, parameter: str
) -> None:
    client, _ = streaming
    response, _ = stream(client, "stream", {"count": 1}, **{header: "x"})
    assert response.status_code == 400
    assert (
        response.json()["__type"] == "ValidationError" and parameter in response.json()["message"]
    )


# --- container errors, as SageMaker reports them --------------------------------------------------


def test_a_toolkit_style_error_keeps_its_status_code(streaming) -> None:
    client, _ = streaming
    response = client.post(
        "/endpoints/toolkit/invocations",
        content=b"[[1.0]]",
        headers={"content-type": "application/json"},
    )
    body = response.json()
    assert response.status_code == 424 and body["__type"] == "ModelError"
    assert body["OriginalStatusCode"] == 403
    assert body["OriginalMessage"] == "this caller may not see this row"
    assert body["LogStreamArn"] == "/var/log/toolkit"
    assert body["message"].startswith(
        'Received client error (403) from container toolkit with message "this caller'
    )


def test_a_model_raising_a_validation_error_cannot_pass_for_the_platform(streaming) -> None:
    client, _ = streaming
    response = client.post(
        "/endpoints/toolkit/invocations",
        content=b'[["validation"]]',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 424 and response.json()["OriginalStatusCode"] == 400


@pytest.mark.parametrize(
    ("platform", "code", "status"),
    [
        (True, "ValidationError", 400),
        (True, "ModelNotReadyException", 429),
        (False, "ModelError", 424),
    ],
)
def test_only_marked_platform_answers_pass_through(platform: bool, code: str, status: int) -> None:
    body = json.dumps(
        {"__type": "ValidationError" if status != 429 else code, "message": "model m not found"}
    ).encode()
    answer = HopResponse(
        400 if status != 429 else 429,
        body,
        "application/json",
        None,
        platform=platform,
        log_stream="/l",
    )
    error = container_failure("e", "c", 1, 1, answer)
    assert (error.code, error.status) == (code, status)


def test_a_plain_text_error_answer_is_the_original_message() -> None:
    error = container_failure(
        "e", "c", 1, 1, HopResponse(503, b"upstream overloaded", "text/plain", None)
    )
    assert (
        error.body()["OriginalMessage"] == "upstream overloaded"
        and "LogStreamArn" not in error.body()
    )
    assert error.message.startswith("Received server error (503) from container c")


class _Toolkit(Exception):
    def __init__(self, status_code: Any, message: str) -> None:
        self.status_code, self.message = status_code, message


@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (
            UnsupportedFormatError("unsupported content type 'a/b'"),
            415,
            "unsupported content type 'a/b'",
        ),
        (ValidationError("not valid JSON"), 400, "not valid JSON"),
        (ModelNotReadyError("still loading"), 429, "still loading"),
        (_Toolkit(418, "teapot"), 418, "teapot"),
        (_Toolkit(200, "not an error status"), 500, "_Toolkit: "),
        (_Toolkit("500", "a string"), 500, "_Toolkit: "),
        (
            RuntimeError("failed reading /home/me/model.bin"),
            500,
            "RuntimeError: failed reading <path>",
        ),
    ],
)
def test_container_error_statuses_follow_the_toolkits(
    raised: Exception, status: int, message: str
) -> None:
    error = ContainerError.of(raised)
    assert error.status == status and error.code == "ModelError"
    assert error.message.startswith(message)


def test_the_hop_stream_header_is_signed() -> None:
    from serving.trust import hops

    signed = hops.sign(
        b"k" * 32, "POST", "/invocations", b"{}", {protocol.HOP_STREAM_HEADER: "true"}
    )
    with pytest.raises(hops.HopAuthError):
        # the stream header removed
        hops.verify(b"k" * 32, "POST", "/invocations", b"{}", {**signed})


def test_unknown_operations_are_sagemaker_shaped() -> None:
    from serving.http.responses import serving_app

    servers = Servers()
    try:
        url = servers.serve(serving_app([]))
        response = httpx.post(url + "/endpoints/e/async-invocations", content=b"{}")
    finally:
        servers.stop()
    assert (
        response.status_code == 404
        and response.headers["x-amzn-errortype"] == "UnknownOperationException"
    )
    assert "InvokeEndpointAsync" in response.json()["message"]
