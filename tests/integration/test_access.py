"""Access policies end to end on the shared server: real boto3 clients with real SigV4 credentials.

it-secure follows SageMaker's documented multi-container example: team-a may invoke only the
customIps* and common* containers, team-b every container but special*; batch-job has a
bearer API key with team-b's policy. Every other session endpoint stays anonymous.
"""

from __future__ import annotations

import datetime
import json

import boto3
import botocore.auth
import botocore.exceptions
import pytest
from botocore.config import Config
from sklearn.datasets import load_wine
from suite import endpoints

from serving.client import AccessDenied, Client, RetryPolicy

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-secure": endpoints.secure,
    "it-single": endpoints.single,
}  # what `server` deploys for this module, by builder

ENDPOINT = "it-secure"
BODIES = {
    "customIps-iris": ([[5.1, 3.5, 1.4, 0.2]], [0]),
    "common-wine": (load_wine().data[:1].tolist(), [0]),
    "special-labels": ([0, 2], {"labels": ["setosa", "virginica"]}),
}


def runtime(server, key: str, secret: str, region: str = "us-east-1"):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )


def caller(server, access_callers, principal: str):
    credentials = access_callers[principal]
    return runtime(server, credentials["AccessKeyId"], credentials["SecretAccessKey"])


def invoke(client, container: str):
    body, _ = BODIES[container]
    response = client.invoke_endpoint(
        EndpointName=ENDPOINT,
        TargetContainerHostname=container,
        ContentType="application/json",
        Body=json.dumps(body),
    )
    return json.loads(response["Body"].read())


def error_of(call) -> dict:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call()
    response = raised.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return response["Error"]


@pytest.mark.parametrize(
    ("principal", "container", "allowed"),
    [
        ("team-a", "customIps-iris", True),
        ("team-a", "common-wine", True),
        ("team-a", "special-labels", False),
        ("team-b", "customIps-iris", True),
        ("team-b", "common-wine", True),
        ("team-b", "special-labels", False),
    ],
)
def test_documented_example_per_caller_and_container(
    server, access_callers, principal: str, container: str, allowed: bool
):
    client = caller(server, access_callers, principal)
    if allowed:
        assert invoke(client, container) == BODIES[container][1]
    else:
        error = error_of(lambda: invoke(client, container))
        assert error["Code"] == "AccessDeniedException"
        assert (
            f"User: {principal} is not authorized to perform: sagemaker:InvokeEndpoint"
            in error["Message"]
        )
        assert "arn:aws:sagemaker:us-east-1:000000000000:endpoint/it-secure" in error["Message"]
        assert f"container {container}" in error["Message"]


def test_bearer_api_key(server, access_callers):
    key = access_callers["batch-job"]["ApiKey"]
    body, expected = BODIES["common-wine"]
    with Client(server.url, api_key=key, retry=RetryPolicy.none()) as batch_job:
        response = batch_job.invoke(ENDPOINT, body, target="common-wine")
        assert response.status_code == 200
        assert response.body == expected
        with pytest.raises(AccessDenied) as raised:
            batch_job.invoke(ENDPOINT, [0], target="special-labels")
        assert (raised.value.status_code, raised.value.headers["x-amzn-errortype"]) == (
            403,
            "AccessDeniedException",
        )
    with (
        Client(server.url, api_key=f"{key}-not", retry=RetryPolicy.none()) as forger,
        pytest.raises(AccessDenied) as raised,
    ):
        forger.invoke(ENDPOINT, body, target="common-wine")
    assert (raised.value.status_code, raised.value.body["__type"]) == (
        403,
        "UnrecognizedClientException",
    )


def test_unsigned_call_is_refused(server):
    with pytest.raises(AccessDenied) as raised:
        server.client.invoke(ENDPOINT, [[5.1, 3.5, 1.4, 0.2]], target="customIps-iris")
    response = raised.value
    assert response.status_code == 403
    assert response.headers["x-amzn-errortype"] == "MissingAuthenticationTokenException"
    assert response.body["__type"] == "MissingAuthenticationTokenException"


def test_forged_signature_is_refused(server, access_callers):
    forged = runtime(
        server, access_callers["team-a"]["AccessKeyId"], "forged-secret-of-someone-else"
    )
    error = error_of(lambda: invoke(forged, "customIps-iris"))
    assert error["Code"] == "InvalidSignatureException"
    assert "signature we calculated does not match" in error["Message"]


def test_unknown_access_key_is_refused(server):
    stranger = runtime(server, "AKIANOBODYKNOWSME1", "a-secret-of-a-stranger")
    assert (
        error_of(lambda: invoke(stranger, "customIps-iris"))["Code"]
        == "UnrecognizedClientException"
    )


def test_signature_outside_the_five_minute_window_is_refused(server, access_callers, monkeypatch):
    # boto3 signs with a clock ten minutes slow: a request replayed (or sent) outside the window.
    slow = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(minutes=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: slow)
    error = error_of(lambda: invoke(caller(server, access_callers, "team-a"), "customIps-iris"))
    assert error["Code"] == "InvalidSignatureException"
    assert "Signature expired" in error["Message"]


def test_wrong_region_scope_is_refused(server, access_callers):
    credentials = access_callers["team-b"]
    client = runtime(
        server, credentials["AccessKeyId"], credentials["SecretAccessKey"], region="eu-west-1"
    )
    error = error_of(lambda: invoke(client, "common-wine"))
    assert error["Code"] == "InvalidSignatureException" and "region" in error["Message"]


def test_other_endpoints_stay_anonymous(server):
    response = server.client.invoke("it-single", [[5.1, 3.5, 1.4, 0.2]])
    assert response.status_code == 200


def test_descriptions_carry_no_secrets(server, access_callers):
    description = server.http.get(f"/endpoints/{ENDPOINT}")
    listing = server.http.get("/endpoints")
    assert description.json()["EndpointStatus"] == "InService"
    for text in (description.text, listing.text):
        for credentials in access_callers.values():
            for field in ("SecretAccessKey", "ApiKey"):
                assert credentials.get(field, "<none>") not in text
        assert "Identities" not in text and "Policies" not in text
