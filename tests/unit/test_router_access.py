"""Access control in the router, over loopback HTTP without Ray: real boto3 clients, real
containers.

Each container is a ContainerApp on its own data port, counting the invocations it
serves, so the tests can tell that a refused request never reached any container.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import httpx
import pytest
import yaml
from botocore.config import Config
from starlette.applications import Starlette

from serving.access.decision import AUDIT_LOGGER, EndpointAccess, configure_audit_log
from serving.access.identities import load_identities
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer
from serving.metrics.invocations import REGISTRY
from serving.model_server.app import ContainerApp, build_container_app
from serving.runtimes import runtime_for
from serving.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
ROW = [[5.1, 3.5, 1.4, 0.2]]
TARGET = "X-Amzn-SageMaker-Target-Container-Hostname"
CREDENTIALS = {
    "team-a": ("AKIAUNITTEAMA0001", "team-a-secret-for-router-tests"),
    "team-b": ("AKIAUNITTEAMB0002", "team-b-secret-for-router-tests"),
    "team-c": ("AKIAUNITTEAMC0003", "team-c-secret-for-router-tests"),
}
API_KEY = "batch-job-key-for-router-tests"
ECHO_HANDLER = """
def input_fn(body, content_type):
    return body

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return prediction, "application/json"
"""


@pytest.fixture(scope="module")
def identities_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("router-identities")
    (folder / "common-only.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "CommonOnly",
                        "Effect": "Allow",
                        "Action": "sagemaker:InvokeEndpoint",
                        "Resource": "*",
                        "Condition": {
                            "StringLike": {"sagemaker:TargetContainerHostname": "common*"}
                        },
                    }
                ],
            }
        )
    )
    policies = {
        "team-a": str(ROOT / "policies" / "customips-and-common.json"),
        "team-b": str(ROOT / "policies" / "all-but-special.json"),
        "team-c": "common-only.json",
    }
    entries = [
        {
            "Principal": name,
            "AccessKeyId": key,
            "SecretAccessKey": secret,
            "PolicyDocuments": [policies[name]],
        }
        for name, (key, secret) in CREDENTIALS.items()
    ]
    entries.append(
        {"Principal": "batch-job", "ApiKey": API_KEY, "PolicyDocuments": [policies["team-b"]]}
    )
    (folder / "identities.yaml").write_text(yaml.safe_dump({"Identities": entries}))
    return folder / "identities.yaml"


class Stack:
    """Containers and routers on loopback ports, stopped at the end."""

    def __init__(self) -> None:
        self.servers: list[BackgroundServer] = []

    def serve(self, app: Any) -> str:
        server = BackgroundServer(app, "127.0.0.1", 0)
        self.servers.append(server)
        assert server.wait_started(), "server did not start"
        return server.url

    def router(
        self,
        settings: ServerSettings,
        routes: list[EndpointRoute],
        table: dict[tuple[str, str], list[str]],
    ) -> str:
        transport = ContainerTransport(default_limit=8)
        router = Router(settings, transport)
        router.endpoints = {route.name: route for route in routes}
        transport.update(table)

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette):
            await transport.start()
            try:
                yield
            finally:
                await transport.close()

        return self.serve(serving_app(router.routes(), lifespan=lifespan, hot=router.hot_route()))

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = Stack()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def containers(
    stack: Stack, iris_classifier, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ContainerApp]:
    echo_dir = tmp_path_factory.mktemp("echo")
    (echo_dir / "code").mkdir()
    (echo_dir / "code" / "inference.py").write_text(ECHO_HANDLER)
    apps = {}
    for name, image, model in (
        ("iris", "sklearn", iris_classifier.path),
        ("echo", "python", echo_dir),
    ):
        runtime = runtime_for(image, model, {})
        runtime.load()
        apps[name] = build_container_app(runtime, name)
    return apps


def calls(containers: dict[str, ContainerApp]) -> int:
    return sum(app.invocations for app in containers.values())


# Endpoint -> (mode, {hostname: which container app serves it})
ENDPOINTS = {
    "mce-secure": (
        "Direct",
        {"customIps-iris": "iris", "common-iris": "iris", "special-echo": "echo"},
    ),
    "chain-ok": ("Serial", {"customIps-echo": "echo", "common-echo": "echo"}),
    "chain-special": (
        "Serial",
        {"common-echo": "echo", "special-echo": "echo", "customIps-echo": "echo"},
    ),
    "only-special": ("Direct", {"special-echo": "echo"}),
}


def start(
    stack: Stack, containers: dict[str, ContainerApp], identities_file: Path, **settings: Any
) -> str:
    urls = {name: stack.serve(app) for name, app in containers.items()}
    server_settings = ServerSettings(**settings)
    access = EndpointAccess(
        load_identities(identities_file),
        region=server_settings.region,
        account_id=server_settings.account_id,
    )
    routes = [
        EndpointRoute(name, mode, tuple(hosts), access=access)
        for name, (mode, hosts) in ENDPOINTS.items()
    ]
    routes.append(EndpointRoute("open", "Direct", ("iris",)))  # no AccessControl
    table = {
        (name, host): [urls[app]]
        for name, (_, hosts) in ENDPOINTS.items()
        for host, app in hosts.items()
    }
    table[("open", "iris")] = [urls["iris"]]
    return stack.router(server_settings, routes, table)


@pytest.fixture(scope="module")
def url(stack: Stack, containers: dict[str, ContainerApp], identities_file: Path) -> str:
    return start(stack, containers, identities_file)


def client(
    url: str,
    principal: str | None = None,
    key: str | None = None,
    secret: str | None = None,
    region: str = "us-east-1",
):
    if principal is not None:
        key, secret = CREDENTIALS[principal]
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )


def invoke(runtime, endpoint: str, target: str | None = None, body: Any = ROW) -> Any:
    arguments = {
        "EndpointName": endpoint,
        "ContentType": "application/json",
        "Body": json.dumps(body),
    }
    if target is not None:
        arguments["TargetContainerHostname"] = target
    return json.loads(runtime.invoke_endpoint(**arguments)["Body"].read())


def refused(runtime, endpoint: str, target: str | None, code: str, *fragments: str) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        invoke(runtime, endpoint, target)
    error = raised.value.response
    assert error["Error"]["Code"] == code
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    for fragment in fragments:
        assert fragment in error["Error"]["Message"], error["Error"]["Message"]
    return error["Error"]["Message"]


def decisions(endpoint: str, decision: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "serving_access_decisions_total", {"endpoint": endpoint, "decision": decision}
        )
        or 0.0
    )


# --- the documented SageMaker example, per caller and container -----------------------------------


@pytest.mark.parametrize(
    ("principal", "target", "allowed"),
    [
        ("team-a", "customIps-iris", True),
        ("team-a", "common-iris", True),
        ("team-a", "special-echo", False),
        ("team-b", "customIps-iris", True),
        ("team-b", "common-iris", True),
        ("team-b", "special-echo", False),
        ("team-c", "customIps-iris", False),
        ("team-c", "common-iris", True),
        ("team-c", "special-echo", False),
    ],
)
def test_direct_invocation_per_caller(
    url: str, containers, principal: str, target: str, allowed: bool
) -> None:
    runtime = client(url, principal)
    before = calls(containers)
    if allowed:
        assert invoke(runtime, "mce-secure", target) == [0]
        assert calls(containers) == before + 1
    else:
        message = refused(
            runtime,
            "mce-secure",
            target,
            "AccessDeniedException",
            f"User: {principal} is not authorized",
            "sagemaker:InvokeEndpoint",
            "arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-secure",
            f"container {target}",
        )
        assert "StringLike" not in message and "Statement" not in message  # no policy text
        assert calls(containers) == before  # refused before any container ran


def test_invoke_endpoint_async_needs_its_own_action(url: str, containers) -> None:
    # team-b's policy allows sagemaker:InvokeEndpoint on every endpoint, and nothing else: as in
    # IAM, that does not allow InvokeEndpointAsync. The signature (boto3's, over an empty body)
    # verifies: the refusal is the policy's.
    before = calls(containers)
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        client(url, "team-b").invoke_endpoint_async(
            EndpointName="chain-ok", InputLocation="s3://bucket-a/in/x.json"
        )
    error = raised.value.response["Error"]
    assert error["Code"] == "AccessDeniedException"
    assert "not authorized to perform: sagemaker:InvokeEndpointAsync" in error["Message"]
    assert calls(containers) == before


def test_explicit_and_implicit_denials_say_which(url: str) -> None:
    refused(
        client(url, "team-b"),
        "mce-secure",
        "special-echo",
        "AccessDeniedException",
        "explicit deny",
    )
    refused(
        client(url, "team-a"),
        "mce-secure",
        "special-echo",
        "AccessDeniedException",
        "no identity-based policy allows",
    )


def test_the_only_container_is_authorized_without_a_target_header(url: str, containers) -> None:
    before = calls(containers)
    refused(
        client(url, "team-b"),
        "only-special",
        None,
        "AccessDeniedException",
        "container special-echo",
    )
    assert calls(containers) == before


def test_serial_chain_needs_every_container(url: str, containers) -> None:
    before = calls(containers)
    assert invoke(client(url, "team-a"), "chain-ok", body={"x": 1}) == {"x": 1}
    assert calls(containers) == before + 2
    # common-echo is allowed, special-echo is not: nothing in the chain runs, the denial names
    # special-echo.
    refused(
        client(url, "team-a"),
        "chain-special",
        None,
        "AccessDeniedException",
        "container special-echo",
    )
    refused(
        client(url, "team-b"),
        "chain-special",
        None,
        "AccessDeniedException",
        "container special-echo",
    )
    # team-c may run common* only: the first refused container is the first of the chain.
    refused(
        client(url, "team-c"), "chain-ok", None, "AccessDeniedException", "container customIps-echo"
    )
    assert calls(containers) == before + 2


def test_bearer_api_key(url: str) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(
        f"{url}/endpoints/mce-secure/invocations",
        json=ROW,
        headers={**headers, TARGET: "common-iris"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == [0]
    response = httpx.post(
        f"{url}/endpoints/mce-secure/invocations",
        json=ROW,
        headers={**headers, TARGET: "special-echo"},
    )
    assert response.status_code == 403
    assert response.headers["x-amzn-ErrorType"] == "AccessDeniedException"
    response = httpx.post(
        f"{url}/endpoints/mce-secure/invocations",
        json=ROW,
        headers={**headers, "Authorization": "Bearer not-a-key-of-anyone", TARGET: "common-iris"},
    )
    assert (response.status_code, response.json()["__type"]) == (403, "UnrecognizedClientException")


# --- authentication failures, in the wire shape botocore reads ------------------------------------


def test_unsigned_request(url: str, containers) -> None:
    before = calls(containers)
    response = httpx.post(
        f"{url}/endpoints/mce-secure/invocations", json=ROW, headers={TARGET: "common-iris"}
    )
    assert response.status_code == 403
    assert response.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    assert response.json()["__type"] == "MissingAuthenticationTokenException"
    assert calls(containers) == before


def test_authentication_comes_before_request_checks(url: str) -> None:
    # An unauthenticated caller learns nothing about the endpoint's containers or header rules.
    response = httpx.post(
        f"{url}/endpoints/mce-secure/invocations", json=ROW, headers={TARGET: "no-such-container"}
    )
    assert (response.status_code, response.json()["__type"]) == (
        403,
        "MissingAuthenticationTokenException",
    )
    # An authenticated one gets the usual validation errors.
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        invoke(client(url, "team-a"), "mce-secure", "no-such-container")
    assert raised.value.response["Error"]["Code"] == "ValidationError"


def test_forged_and_unknown_credentials(url: str) -> None:
    key, _ = CREDENTIALS["team-a"]
    refused(
        client(url, key=key, secret="forged-secret-forged-secret"),
        "mce-secure",
        "common-iris",
        "InvalidSignatureException",
        "signature we calculated does not match",
    )
    refused(
        client(url, key="AKIANOBODY00000000", secret="whatever-secret-x"),
        "mce-secure",
        "common-iris",
        "UnrecognizedClientException",
    )
    refused(
        client(url, "team-a", region="eu-west-1"),
        "mce-secure",
        "common-iris",
        "InvalidSignatureException",
        "region",
    )


def test_anonymous_endpoint_on_loopback(url: str) -> None:
    response = httpx.post(f"{url}/endpoints/open/invocations", json=ROW)
    assert response.status_code == 200, response.text


def test_anonymous_endpoint_off_loopback_needs_allow_anonymous(
    stack: Stack, containers, identities_file: Path
) -> None:
    # The router is told it binds 0.0.0.0 (the test server itself stays on loopback).
    exposed = start(stack, containers, identities_file, host="0.0.0.0")
    response = httpx.post(f"{exposed}/endpoints/open/invocations", json=ROW)
    assert (response.status_code, response.json()["__type"]) == (403, "AccessDeniedException")
    assert "--allow-anonymous" in response.json()["message"]
    # AccessControl endpoints still work
    assert invoke(client(exposed, "team-a"), "mce-secure", "common-iris") == [0]
    allowed = start(stack, containers, identities_file, host="0.0.0.0", allow_anonymous=True)
    assert httpx.post(f"{allowed}/endpoints/open/invocations", json=ROW).status_code == 200


# --- audit log and metrics ---------------------------------------------------------------------


def test_every_decision_is_audited_and_counted(url: str, caplog: pytest.LogCaptureFixture) -> None:
    counts = {d: decisions("mce-secure", d) for d in ("allow", "deny", "unauthenticated")}
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    invoke(client(url, "team-b"), "mce-secure", "common-iris")
    refused(client(url, "team-b"), "mce-secure", "special-echo", "AccessDeniedException")
    refused(
        client(url, "team-b", region="eu-west-1"),
        "mce-secure",
        "special-echo",
        "InvalidSignatureException",
    )

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]
    allow, deny, unauthenticated = lines[-3:]
    assert allow.pop("time").endswith("Z")
    assert allow == {
        "event": "authorize",
        "principal": "team-b",
        "auth": "sigv4",
        "endpoint": "mce-secure",
        "containers": ["common-iris"],
        "model": None,
        "action": "sagemaker:InvokeEndpoint",
        "resource": "arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-secure",
        "decision": "allow",
        "statements": {"common-iris": "all-but-special.json#InvokeEveryContainer"},
    }
    assert deny["decision"] == "deny" and deny["denied_container"] == "special-echo"
    assert deny["statements"] == {"special-echo": "all-but-special.json#ExceptSpecialContainers"}
    assert unauthenticated["decision"] == "unauthenticated"
    assert unauthenticated["error"] == "InvalidSignatureException"
    assert unauthenticated["access_key_id"] == CREDENTIALS["team-b"][0]
    text = caplog.text
    assert all(secret not in text for _, secret in CREDENTIALS.values()) and API_KEY not in text
    assert "Signature=" not in text

    assert decisions("mce-secure", "allow") == counts["allow"] + 1
    assert decisions("mce-secure", "deny") == counts["deny"] + 1
    assert decisions("mce-secure", "unauthenticated") == counts["unauthenticated"] + 1


def test_audit_lines_reach_a_stream_in_a_process_without_logging_setup(url: str) -> None:
    # The gateway's process has no root handler: configure_audit_log gives the audit logger its own.
    audit = logging.getLogger(AUDIT_LOGGER)
    saved = (list(audit.handlers), audit.propagate, audit.level)
    stream = io.StringIO()
    try:
        audit.handlers.clear()
        configure_audit_log(stream)
        invoke(client(url, "team-a"), "mce-secure", "customIps-iris")
        refused(client(url, "team-a"), "mce-secure", "special-echo", "AccessDeniedException")
        configure_audit_log(io.StringIO())  # a second call keeps the first handler
    finally:
        audit.handlers[:], audit.propagate = saved[:2]
        audit.setLevel(saved[2])
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["principal"], line["decision"]) for line in lines] == [
        ("team-a", "allow"),
        ("team-a", "deny"),
    ]
