"""serving.client at the transport level: payloads, errors, retries and signing.

The server side here is an `httpx.MockTransport` handler (a function answering requests in
memory), because these tests drive what no real server does on demand: 429/503 sequences,
dropped connections, exact retry timing. Signatures are checked with the server's own
verifier (`serving.access.sigv4.Authenticator`). tests/integration/test_client.py runs the SDK
against a real endpoint server.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from serving.access.identities import load_identities
from serving.access.sigv4 import Authenticator, RawRequest
from serving.client import (
    AccessDenied,
    AsyncClient,
    Client,
    ConnectionFailed,
    InternalFailure,
    InvalidSignature,
    ModelError,
    ModelNotReady,
    RetryPolicy,
    ServiceUnavailable,
    ServingClientError,
    UnknownServerError,
    UnrecognizedClient,
    ValidationError,
    WaiterError,
)
from serving.client._core import decode_payload, encode_payload
from serving.client.credentials import Anonymous, BearerKey, SigV4, resolve
from serving.errors import ModelError as ServerModelError
from serving.errors import ModelNotReadyError, wire_error

URL = "http://serving.test:8080"
NO_SLEEP = RetryPolicy(base_delay=0.0, max_delay=0.0)


def error_answer(error) -> httpx.Response:
    status, headers, body = wire_error(error)
    return httpx.Response(status, headers=headers, content=body)


def ok(body: object = None, **headers: str) -> httpx.Response:
    return httpx.Response(
        200,
        json=body if body is not None else [1],
        headers={"x-Amzn-Invoked-Production-Variant": "AllTraffic", **headers},
    )


class Script:
    """Answers requests from a list, one per attempt, and records what it received."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def client(script: Script, **options) -> Client:
    options.setdefault("retry", NO_SLEEP)
    options.setdefault("sign", False)
    return Client(URL, transport=httpx.MockTransport(script), **options)


# --- payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "content_type", "expected_type"),
    [
        (b"\x00\x01", None, "application/octet-stream"),
        ("5.1,3.5\n", None, "text/csv"),
        ({"instances": [[1, 2]]}, None, "application/json"),
        ([[1.5, 2]], None, "application/json"),
        (np.arange(6, dtype="float32").reshape(2, 3), None, "application/x-npy"),
        ([[1, 2], [3, 4]], "text/csv", "text/csv"),
        ([[1, 2], [3, 4]], "application/x-npy", "application/x-npy"),
        (np.arange(4).reshape(2, 2), "application/json", "application/json"),
    ],
)
def test_payloads_round_trip(data, content_type, expected_type) -> None:
    body, sent_type = encode_payload(data, content_type)
    assert sent_type == expected_type
    decoded = decode_payload(body, sent_type)
    if isinstance(data, np.ndarray) or sent_type == "application/x-npy":
        assert np.array_equal(np.asarray(decoded, dtype=float), np.asarray(data, dtype=float))
    elif sent_type == "text/csv" and not isinstance(data, str):
        assert decoded == "1,2\n3,4\n"
    else:
        assert decoded == (data if not isinstance(data, (bytes,)) else data)


def test_dataframe_is_csv_without_header_or_index() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"a": [1.5, 2.0], "b": [3, 4]})
    assert encode_payload(frame, None) == (b"1.5,3\n2.0,4\n", "text/csv")


def test_npy_never_pickles() -> None:
    with pytest.raises(ValueError):
        encode_payload(np.array([{"a": 1}], dtype=object), None)
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        decode_payload(buffer.getvalue(), "application/x-npy")


def test_unencodable_payload_says_what_is_accepted() -> None:
    with pytest.raises(TypeError, match="numpy array"):
        encode_payload(object(), None)


def test_invoke_sends_the_protocol_headers_and_decodes_the_answer() -> None:
    script = Script(ok({"labels": ["setosa"]}, **{"X-Amzn-SageMaker-Custom-Attributes": "seen=1"}))
    result = client(script).invoke(
        "mce-demo",
        [[5.1, 3.5, 1.4, 0.2]],
        target="iris",
        model="m.tar.gz",
        accept="application/json",
        custom_attributes="trace=1",
        inference_id="id-7",
    )
    sent = script.requests[0]
    assert sent.method == "POST" and sent.url.path == "/endpoints/mce-demo/invocations"
    assert json.loads(sent.content) == [[5.1, 3.5, 1.4, 0.2]]
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["accept"] == "application/json"
    assert sent.headers["x-amzn-sagemaker-target-container-hostname"] == "iris"
    assert sent.headers["x-amzn-sagemaker-target-model"] == "m.tar.gz"
    assert sent.headers["x-amzn-sagemaker-custom-attributes"] == "trace=1"
    assert sent.headers["x-amzn-sagemaker-inference-id"] == "id-7"
    assert "authorization" not in sent.headers
    assert result.body == {"labels": ["setosa"]}
    assert result.invoked_variant == "AllTraffic"
    assert result.custom_attributes == "seen=1"
    assert json.loads(result.raw) == {"labels": ["setosa"]}


@pytest.mark.parametrize("name", ["", "../admin", "a/b", "-lead", "x" * 64, "has space"])
def test_bad_endpoint_names_are_refused_before_sending(name: str) -> None:
    script = Script(ok())
    with pytest.raises(ValueError, match="endpoint name"):
        client(script).invoke(name, [1])
    assert script.requests == []


def test_invoke_endpoint_matches_boto3s_shape() -> None:
    script = Script(ok([2], **{"X-Amzn-SageMaker-Custom-Attributes": "a=1"}))
    response = client(script).invoke_endpoint(
        EndpointName="mce-demo",
        Body=b"[[1,2,3,4]]",
        ContentType="application/json",
        TargetContainerHostname="iris",
        CustomAttributes="a=1",
    )
    assert set(response) == {
        "Body",
        "ContentType",
        "InvokedProductionVariant",
        "CustomAttributes",
        "ResponseMetadata",
    }
    assert json.loads(response["Body"].read()) == [2]
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert script.requests[0].headers["x-amzn-sagemaker-target-container-hostname"] == "iris"
    with pytest.raises(TypeError, match="TargetContainer"):
        client(script).invoke_endpoint(EndpointName="e", Body=b"", TargetContainer="iris")
    with pytest.raises(TypeError, match="Body"):
        client(script).invoke_endpoint(EndpointName="e")


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "exception", "code"),
    [
        (
            httpx.Response(400, json={"__type": "ValidationError", "message": "bad"}),
            ValidationError,
            "ValidationError",
        ),
        (
            httpx.Response(403, json={"__type": "AccessDeniedException", "message": "no"}),
            AccessDenied,
            "AccessDeniedException",
        ),
        (
            httpx.Response(403, json={"__type": "UnrecognizedClientException", "message": "?"}),
            UnrecognizedClient,
            None,
        ),
        (
            httpx.Response(403, json={"__type": "InvalidSignatureException", "message": "sig"}),
            InvalidSignature,
            None,
        ),
        (
            httpx.Response(503, json={"__type": "ServiceUnavailable", "message": "down"}),
            ServiceUnavailable,
            None,
        ),
        (
            httpx.Response(500, json={"__type": "InternalFailure", "message": "bug"}),
            InternalFailure,
            None,
        ),
        (httpx.Response(500, text="<html>proxy</html>"), InternalFailure, None),
        (httpx.Response(418, text="teapot"), UnknownServerError, None),
        (
            httpx.Response(400, headers={"x-amzn-ErrorType": "ValidationError"}, content=b""),
            ValidationError,
            None,
        ),
    ],
)
def test_each_error_code_has_its_exception(answer, exception, code) -> None:
    with pytest.raises(exception) as raised:
        client(Script(answer)).invoke("e", [1])
    assert isinstance(raised.value, ServingClientError)
    assert raised.value.status_code == answer.status_code
    if code:
        assert raised.value.response["Error"]["Code"] == code


def test_model_error_carries_the_original_status_and_container() -> None:
    answer = error_answer(
        ServerModelError(
            "container iris failed",
            container="iris",
            original_status=500,
            original_message="ValueError: nope",
        )
    )
    with pytest.raises(ModelError) as raised:
        client(Script(answer)).invoke("e", [1])
    error = raised.value
    assert (error.original_status_code, error.original_message, error.container_hostname) == (
        500,
        "ValueError: nope",
        "iris",
    )
    assert error.response["OriginalStatusCode"] == 500  # where botocore's ClientError has it
    assert "ModelError (424)" in str(error)


# --- retries --------------------------------------------------------------------------------


def test_throttling_is_retried_until_it_succeeds() -> None:
    busy = error_answer(ModelNotReadyError("container iris is busy"))
    script = Script(busy, busy, ok([3]))
    result = client(script).invoke("e", [1])
    assert result.body == [3] and len(script.requests) == 3 and result.retry_attempts == 2


def test_retries_are_bounded_and_the_last_error_raised() -> None:
    script = Script(error_answer(ModelNotReadyError("busy")))
    with pytest.raises(ModelNotReady) as raised:
        client(script, retry=RetryPolicy(max_attempts=3, base_delay=0, max_delay=0)).invoke(
            "e", [1]
        )
    assert len(script.requests) == 3 and raised.value.retry_attempts == 2


@pytest.mark.parametrize("status", [400, 403, 404, 413, 424])
def test_client_errors_are_never_retried(status: int) -> None:
    script = Script(
        httpx.Response(status, json={"__type": "ValidationError", "message": "x"}), ok()
    )
    with pytest.raises(ServingClientError):
        client(script).invoke("e", [1])
    assert len(script.requests) == 1


def test_retries_off() -> None:
    script = Script(
        httpx.Response(503, json={"__type": "ServiceUnavailable", "message": "x"}), ok()
    )
    with pytest.raises(ServiceUnavailable):
        client(script, retry=RetryPolicy.none()).invoke("e", [1])
    assert len(script.requests) == 1


def test_refused_connection_is_retried_but_a_lost_answer_is_not() -> None:
    refused = Script(httpx.ConnectError("refused"), ok([1]))
    assert client(refused).invoke("e", [1]).body == [1] and len(refused.requests) == 2
    lost = Script(httpx.ReadTimeout("no answer"), ok([1]))
    with pytest.raises(ConnectionFailed, match="may have been processed"):
        client(lost).invoke("e", [1])
    assert len(lost.requests) == 1


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.1, max_delay=1.0)
    rng = random.Random(7)
    for retry, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.delay(retry, rng=rng) for _ in range(200)]
        assert 0 <= min(delays) and max(delays) <= cap
        assert max(delays) > 0.8 * cap  # spread over the whole range (full jitter), not fixed
    assert policy.delay(1, retry_after="0.5", rng=rng) >= 0.5
    assert policy.delay(1, retry_after="3600", rng=rng) <= 1.0  # bounded by max_delay
    assert policy.delay(1, retry_after="soon", rng=rng) <= 0.1


def test_retry_policy_refuses_retrying_client_errors() -> None:
    with pytest.raises(ValueError, match="4xx"):
        RetryPolicy(retry_on_status=frozenset({400, 429}))
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_waits_between_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("serving.client._clients.time.sleep", slept.append)
    busy = httpx.Response(
        429,
        headers={"Retry-After": "0.25"},
        json={"__type": "ModelNotReadyException", "message": "x"},
    )
    client(Script(busy, ok()), retry=RetryPolicy(base_delay=0.01, max_delay=1.0)).invoke("e", [1])
    assert slept == [pytest.approx(0.25)]


# --- async ----------------------------------------------------------------------------------


def test_async_client_behaves_the_same() -> None:
    busy = error_answer(ModelNotReadyError("busy"))
    script = Script(busy, ok([5]))

    async def main():
        async with AsyncClient(
            URL, transport=httpx.MockTransport(script), retry=NO_SLEEP, sign=False
        ) as async_client:
            result = await async_client.invoke("e", np.ones((1, 4)), target="iris")
            boto = await async_client.invoke_endpoint(
                EndpointName="e", Body="1,2", ContentType="text/csv"
            )
            with pytest.raises(ValidationError):
                script.answers = [
                    httpx.Response(400, json={"__type": "ValidationError", "message": "m"})
                ]
                await async_client.invoke("e", [1])
            return result, boto

    result, boto = asyncio.run(main())
    assert result.body == [5] and result.retry_attempts == 1
    assert script.requests[1].headers["content-type"] == "application/x-npy"
    assert boto["Body"].read() == b"[5]"


# --- management -----------------------------------------------------------------------------


def test_wait_until_in_service_follows_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("serving.client._clients.time.sleep", lambda s: None)
    not_found = httpx.Response(
        400, json={"__type": "ValidationError", "message": "Could not find endpoint e."}
    )
    creating = httpx.Response(200, json={"EndpointName": "e", "EndpointStatus": "Creating"})
    ready = httpx.Response(200, json={"EndpointName": "e", "EndpointStatus": "InService"})
    script = Script(not_found, creating, ready)
    assert (
        client(script).wait_until_in_service("e", timeout=10, poll_interval=0.01)["EndpointStatus"]
        == "InService"
    )
    assert [r.url.path for r in script.requests] == ["/endpoints/e"] * 3
    failed = httpx.Response(
        200,
        json={
            "EndpointName": "e",
            "EndpointStatus": "Failed",
            "FailureReason": "container x: boom",
        },
    )
    with pytest.raises(WaiterError, match="boom") as raised:
        client(Script(failed)).wait_until_in_service("e", timeout=10, poll_interval=0.01)
    assert raised.value.last_description["EndpointStatus"] == "Failed"


def test_wait_until_in_service_times_out() -> None:
    creating = httpx.Response(200, json={"EndpointName": "e", "EndpointStatus": "Creating"})
    with pytest.raises(WaiterError, match="not InService after 0.05 s .last status: Creating"):
        client(Script(creating)).wait_until_in_service("e", timeout=0.05, poll_interval=0.02)


def test_list_and_describe() -> None:
    script = Script(
        httpx.Response(
            200, json={"Endpoints": [{"EndpointName": "e", "EndpointStatus": "InService"}]}
        )
    )
    assert client(script).list_endpoints() == [{"EndpointName": "e", "EndpointStatus": "InService"}]
    assert script.requests[0].url.path == "/endpoints"


# --- credentials ----------------------------------------------------------------------------

KEY_ID, SECRET, API_KEY = (
    "AKIACLIENTTEST0001",
    "client-test-secret-0001",
    "client-test-api-key-0001",
)


@pytest.fixture
def verifier(tmp_path: Path):
    """The server's authenticator over an identities file with one SigV4 and bearer caller."""
    (tmp_path / "all.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": "*"}
                ],
            }
        )
    )
    (tmp_path / "ids.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "sdk",
                        "AccessKeyId": KEY_ID,
                        "SecretAccessKey": SECRET,
                        "ApiKey": API_KEY,
                        "PolicyDocuments": ["all.json"],
                    }
                ]
            }
        )
    )
    authenticator = Authenticator(load_identities(tmp_path / "ids.yaml"), region="eu-west-1")

    def handler(request: httpx.Request) -> httpx.Response:
        raw = RawRequest(
            request.method,
            request.url.raw_path.decode().split("?")[0],
            request.url.query.decode(),
            tuple((k.decode(), v.decode()) for k, v in request.headers.raw),
            request.read(),
        )
        try:
            caller = authenticator.authenticate(raw)
        except Exception as error:  # the server's own error, in its wire shape
            return error_answer(error)
        return httpx.Response(200, json={"principal": caller.principal, "how": caller.scheme})

    return handler


def test_sigv4_signature_verifies_on_the_server(verifier) -> None:
    signed = Client(
        URL,
        transport=httpx.MockTransport(verifier),
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="eu-west-1",
        retry=NO_SLEEP,
    )
    result = signed.invoke("mce-secure", [[1, 2, 3, 4]], target="iris", custom_attributes="a=1")
    assert result.body == {"principal": "sdk", "how": "sigv4"}


def test_wrong_secret_or_region_is_refused(verifier) -> None:
    wrong = Client(
        URL,
        transport=httpx.MockTransport(verifier),
        aws_access_key_id=KEY_ID,
        aws_secret_access_key="not-the-secret-000",
        region_name="eu-west-1",
        retry=NO_SLEEP,
    )
    with pytest.raises(InvalidSignature):
        wrong.invoke("mce-secure", [1])
    elsewhere = Client(
        URL,
        transport=httpx.MockTransport(verifier),
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
        retry=NO_SLEEP,
    )
    with pytest.raises(InvalidSignature, match="region"):
        elsewhere.invoke("mce-secure", [1])


def test_bearer_key(verifier) -> None:
    bearer = Client(URL, transport=httpx.MockTransport(verifier), api_key=API_KEY, retry=NO_SLEEP)
    assert bearer.invoke("mce-secure", [1]).body == {"principal": "sdk", "how": "bearer"}
    assert API_KEY not in repr(bearer)
    with pytest.raises(UnrecognizedClient):
        Client(
            URL,
            transport=httpx.MockTransport(verifier),
            api_key="unknown-key-0000000",
            retry=NO_SLEEP,
        ).invoke("e", [1])


def test_credentials_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "SERVING_API_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    assert isinstance(resolve(), Anonymous)
    with pytest.raises(ValueError, match="no AWS credentials"):
        resolve(sign=True)
    monkeypatch.setenv("SERVING_API_KEY", API_KEY)
    assert isinstance(resolve(), BearerKey)
    monkeypatch.delenv("SERVING_API_KEY")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    auto = resolve()
    assert (
        isinstance(auto, SigV4)
        and auto.region == "eu-west-1"
        and auto.credentials.access_key == KEY_ID
    )
    assert isinstance(resolve(sign=False), Anonymous)
    with pytest.raises(ValueError, match="not both"):
        resolve(api_key=API_KEY, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    with pytest.raises(ValueError, match="go together"):
        resolve(aws_access_key_id=KEY_ID)
