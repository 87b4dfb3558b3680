"""serving.client against the shared endpoint server: real HTTP, real containers, real
signatures."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import boto3
import numpy as np
import pytest
from botocore.config import Config
from suite import endpoints

from serving.client import (
    AccessDenied,
    AsyncClient,
    Client,
    ModelError,
    ModelNotReady,
    RetryPolicy,
    ServiceUnavailable,
    UnrecognizedClient,
    ValidationError,
    WaiterError,
)

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-serial": endpoints.serial,
    "it-serial-fail": endpoints.serial_fail,
    "it-broken": endpoints.broken,
    "it-secure": endpoints.secure,
}  # what `server` deploys for this module, by builder

SETOSA, VIRGINICA = [5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]


@pytest.fixture(scope="module")
def client(server):
    with Client(server.url, sign=False, retry=RetryPolicy.none()) as sdk:
        yield sdk


def test_invoke_in_three_lines(server) -> None:
    client = Client(server.url, sign=False)
    result = client.invoke("it-direct", [SETOSA, VIRGINICA], target="iris")
    assert result.body == [0, 2] and result.invoked_variant == "AllTraffic"
    assert result.content_type.startswith("application/json")


def test_payload_types(client) -> None:
    assert client.invoke(
        "it-direct", np.array([VIRGINICA]), target="iris", accept="application/json"
    ).body == [2]
    npy = client.invoke(
        "it-direct", np.array([SETOSA]), target="iris", accept="application/x-npy"
    ).body
    assert isinstance(npy, np.ndarray) and npy.tolist() == [0]
    assert client.invoke("it-direct", "6.7,3.0,5.2,2.3\n", target="iris").body == [2]
    assert (
        client.invoke("it-direct", [VIRGINICA], target="iris", accept="text/csv").body.strip()
        == "2"
    )


def test_dataframe_payload(client) -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        [SETOSA, VIRGINICA], columns=["sepal_l", "sepal_w", "petal_l", "petal_w"]
    )
    assert client.invoke("it-direct", frame, target="iris").body == [0, 2]


def test_serial_chain_with_custom_attributes(client) -> None:
    result = client.invoke("it-serial", "5.1,3.5,1.4,0.2\n", custom_attributes="run=7")
    assert result.body == {"labels": ["setosa"]}
    assert result.custom_attributes == "run=7;labelled=1"


def test_same_answer_as_boto3(server, client) -> None:
    boto = boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    arguments = dict(
        EndpointName="it-serial",
        ContentType="text/csv",
        Accept="application/json",
        Body="6.7,3.0,5.2,2.3\n",
        CustomAttributes="run=8",
    )
    theirs, ours = boto.invoke_endpoint(**arguments), client.invoke_endpoint(**arguments)
    assert set(ours) == set(theirs)
    assert (
        json.loads(ours["Body"].read())
        == json.loads(theirs["Body"].read())
        == {"labels": ["virginica"]}
    )
    for key in ("ContentType", "InvokedProductionVariant", "CustomAttributes"):
        assert ours[key] == theirs[key]


def test_errors_are_typed(client) -> None:
    with pytest.raises(ValidationError, match="nosuch"):
        client.invoke("it-direct", [SETOSA], target="nosuch")
    with pytest.raises(ValidationError, match="not found"):
        client.invoke("it-nosuch", [SETOSA])
    with pytest.raises(ModelError) as raised:
        client.invoke("it-serial-fail", [SETOSA])
    assert raised.value.original_status_code == 500
    assert "cannot score this input" in raised.value.original_message
    assert raised.value.container_hostname == "faulty"
    with pytest.raises(ServiceUnavailable, match="broken"):
        client.invoke("it-broken", b"{}", target="fine", content_type="application/json")


def test_throttled_requests_succeed_with_retries(server) -> None:
    """`narrow` takes one request at a time: concurrent callers get 429 and the SDK retries them."""
    arguments = dict(
        target="narrow", content_type="application/json", custom_attributes="sleep=0.3"
    )
    with Client(server.url, sign=False, retry=RetryPolicy.none()) as no_retry:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: _outcome(no_retry, arguments), range(4)))
    # the limit is real: without retries some are refused
    assert "ModelNotReady" in outcomes, outcomes
    with Client(
        server.url, sign=False, retry=RetryPolicy(max_attempts=30, base_delay=0.1, max_delay=0.5)
    ) as patient:
        with ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(lambda _: patient.invoke("it-direct", b"{}", **arguments), range(4))
            )
    assert [r.body for r in results] == [{"slept": 0.3}] * 4
    assert sum(r.retry_attempts for r in results) > 0


def _outcome(client: Client, arguments: dict) -> str:
    try:
        client.invoke("it-direct", b"{}", **arguments)
        return "ok"
    except ModelNotReady:
        return "ModelNotReady"


def test_async_client_concurrent_invocations(server) -> None:
    async def main():
        async with AsyncClient(server.url, sign=False) as client:
            calls = [
                client.invoke("it-direct", [row], target="iris") for row in (SETOSA, VIRGINICA) * 10
            ]
            results = await asyncio.gather(*calls)
            description = await client.describe_endpoint("it-direct")
            return [r.body for r in results], description

    bodies, description = asyncio.run(main())
    assert bodies == [[0], [2]] * 10
    assert description["EndpointStatus"] == "InService"


def test_management_calls(client) -> None:
    names = {e["EndpointName"]: e["EndpointStatus"] for e in client.list_endpoints()}
    assert names["it-direct"] == "InService" and names["it-broken"] == "Failed"
    assert client.wait_until_in_service("it-serial", timeout=10)["EndpointStatus"] == "InService"
    with pytest.raises(WaiterError, match="broken"):
        client.wait_until_in_service("it-broken", timeout=10)
    assert client.ping() is False  # it-broken is Failed, so the server is not healthy as a whole


def test_signed_and_bearer_callers_on_the_secure_endpoint(server, access_callers) -> None:
    team_a = access_callers["team-a"]
    signed = Client(
        server.url,
        aws_access_key_id=team_a["AccessKeyId"],
        aws_secret_access_key=team_a["SecretAccessKey"],
        region_name="us-east-1",
        retry=RetryPolicy.none(),
    )
    assert signed.invoke("it-secure", [SETOSA], target="customIps-iris").body == [0]
    with pytest.raises(AccessDenied) as denied:
        signed.invoke("it-secure", [0, 2], target="special-labels")
    assert denied.value.status_code == 403
    bearer = Client(
        server.url, api_key=access_callers["batch-job"]["ApiKey"], retry=RetryPolicy.none()
    )
    assert bearer.invoke("it-secure", [SETOSA], target="customIps-iris").body == [0]
    with pytest.raises(AccessDenied):
        bearer.invoke("it-secure", [0, 2], target="special-labels")
    with pytest.raises(UnrecognizedClient):
        Client(server.url, api_key="not-a-known-key-000", retry=RetryPolicy.none()).invoke(
            "it-secure", [SETOSA], target="customIps-iris"
        )
