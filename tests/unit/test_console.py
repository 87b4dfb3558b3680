"""The operator console without Ray: who may read it (`console.access`, through its real Starlette
routes and TestClient, with the client address each case needs), and what it shows (`console.overview`
over the control-plane API of `sagemaker_harness`, a faked deployer, and datapoints recorded into
CloudWatch's real metric store). The page in a real browser on a real server:
tests/integration/test_console.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from serving import protocol
from serving.access.identities import load_identities
from serving.cloudwatch.statistics import Stat
from serving.console.access import ConsoleAccess
from serving.console.overview import endpoint_detail, overview
from serving.console.page import ASSETS, CONTENT_SECURITY_POLICY, ConsoleRoutes
from serving.console.series import PERIOD_S, axis
from serving.http.responses import serving_app
from tests.unit.sagemaker_harness import Harness

OPERATOR_KEY = "operator-key-for-the-console-tests"
TEAM_KEY = "team-a-key-for-the-console-tests-01"
INVOKER_KEY = "invoker-key-for-the-console-tests-1"
OTHER_FILE_KEY = "an-endpoint-accesscontrol-key-000001"
READS = ["sagemaker:List*", "sagemaker:Describe*", "cloudwatch:Describe*", "cloudwatch:Get*"]
OVERVIEW = {
    "Time": 1.0,
    "Endpoints": [
        {"EndpointName": name, "EndpointStatus": "InService"} for name in ("team-a-x", "team-b-y")
    ],
    "Alarms": [
        {"AlarmName": "b-errors", "Dimensions": [{"Name": "EndpointName", "Value": "team-b-y"}]},
        {"AlarmName": "global", "Dimensions": []},
    ],
}


def _policy(folder: Path, name: str, actions: list[str], resource: str = "*") -> str:
    statement = {"Effect": "Allow", "Action": actions, "Resource": resource}
    (folder / name).write_text(json.dumps({"Version": "2012-10-17", "Statement": [statement]}))
    return name


@pytest.fixture
def identities_file(tmp_path: Path) -> Path:
    """An API identities file: an operator, a team that may describe only its endpoints, and an
    identity whose policy allows invoking only (an invocation key in the same file)."""
    team = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sagemaker:ListEndpoints", "cloudwatch:*"],
                "Resource": "*",
            },
            {
                "Effect": "Allow",
                "Action": "sagemaker:DescribeEndpoint",
                "Resource": "arn:aws:sagemaker:*:*:endpoint/team-a-*",
            },
        ],
    }
    (tmp_path / "team.json").write_text(json.dumps(team))
    entries = [
        {
            "Principal": "operator",
            "ApiKey": OPERATOR_KEY,
            "PolicyDocuments": [_policy(tmp_path, "ops.json", READS)],
        },
        {"Principal": "team-a", "ApiKey": TEAM_KEY, "PolicyDocuments": ["team.json"]},
        {
            "Principal": "invoker",
            "ApiKey": INVOKER_KEY,
            "PolicyDocuments": [_policy(tmp_path, "invoke.json", ["sagemaker:InvokeEndpoint"])],
        },
    ]
    path = tmp_path / "api-identities.yaml"
    path.write_text(yaml.safe_dump({"Identities": entries}))
    return path


def _client(
    identities: Path | None, server: str = "127.0.0.1", client: str = "127.0.0.1"
) -> TestClient:
    """The console's routes in a Starlette app (the gateway's error handling), read from OVERVIEW."""
    access = ConsoleAccess(
        load_identities(identities) if identities else None, server, "us-east-1", "000000000000"
    )

    async def read(endpoint: str | None) -> Any:
        return OVERVIEW if endpoint is None else {"Endpoint": {"EndpointName": endpoint}}

    app = serving_app(ConsoleRoutes(access, read).routes())
    return TestClient(app, client=(client, 40000), raise_server_exceptions=True)


def _basic(key: str, user: str = "operator") -> dict[str, str]:
    token = base64.b64encode(f"{user}:{key}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _refused(response: Any, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers[protocol.ERROR_TYPE_HEADER] == code
    body = response.json()
    assert body["__type"] == code and body["message"]
    return body


# --- who may read it ------------------------------------------------------------------------------
def test_anonymous_on_a_loopback_server_from_loopback_sees_everything() -> None:
    with _client(None) as client:
        page = client.get(protocol.CONSOLE_PATH)
        data = client.get(protocol.CONSOLE_OVERVIEW_PATH)
    assert page.status_code == 200 and b'src="/console/assets/console.js"' in page.content
    assert page.headers["content-type"].startswith("text/html")
    assert [e["EndpointName"] for e in data.json()["Endpoints"]] == ["team-a-x", "team-b-y"]


@pytest.mark.parametrize(
    ("server", "client"),
    [("0.0.0.0", "203.0.113.7"), ("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "203.0.113.7")],
)
def test_anonymous_anywhere_else_is_refused(server: str, client: str) -> None:
    with _client(None, server=server, client=client) as http:
        for path in (
            protocol.CONSOLE_PATH,
            protocol.CONSOLE_OVERVIEW_PATH,
            "/console/assets/console.js",
        ):
            body = _refused(http.get(path), 403, "AccessDeniedException")
            assert "--api-identities" in body["message"]


def test_an_api_identity_with_the_read_actions_signs_in_by_basic_or_bearer(
    identities_file: Path,
) -> None:
    with _client(identities_file, server="0.0.0.0", client="203.0.113.7") as client:
        basic = client.get(protocol.CONSOLE_OVERVIEW_PATH, headers=_basic(OPERATOR_KEY))
        bearer = client.get(
            protocol.CONSOLE_OVERVIEW_PATH, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
        )
    assert basic.status_code == bearer.status_code == 200
    assert basic.json() == bearer.json() == OVERVIEW
    assert basic.headers[protocol.CACHE_CONTROL_HEADER] == protocol.NO_STORE


def test_no_credential_or_an_unknown_one_is_asked_for_with_basic(identities_file: Path) -> None:
    with _client(identities_file, server="127.0.0.1") as client:
        # loopback, but the server has API identities: they are required
        for headers in ({}, _basic(OTHER_FILE_KEY), {"Authorization": "Basic !!"}, _basic("")):
            response = client.get(protocol.CONSOLE_PATH, headers=headers)
            _refused(response, 401, "MissingAuthenticationTokenException")
            assert response.headers[protocol.AUTHENTICATE_HEADER] == protocol.CONSOLE_CHALLENGE


def test_an_invocation_identity_is_refused(identities_file: Path) -> None:
    with _client(identities_file) as client:
        response = client.get(protocol.CONSOLE_OVERVIEW_PATH, headers=_basic(INVOKER_KEY))
    body = _refused(response, 403, "AccessDeniedException")
    assert "User: invoker is not authorized to perform: sagemaker:ListEndpoints" in body["message"]


def test_an_identity_sees_only_the_endpoints_it_may_describe(identities_file: Path) -> None:
    with _client(identities_file) as client:
        shown = client.get(protocol.CONSOLE_OVERVIEW_PATH, headers=_basic(TEAM_KEY)).json()
        mine = client.get("/console/api/endpoints/team-a-x", headers=_basic(TEAM_KEY))
        theirs = client.get("/console/api/endpoints/team-b-y", headers=_basic(TEAM_KEY))
    assert [e["EndpointName"] for e in shown["Endpoints"]] == ["team-a-x"]
    assert [a["AlarmName"] for a in shown["Alarms"]] == ["global"]  # not team-b-y's
    assert mine.status_code == 200
    _refused(theirs, 403, "AccessDeniedException")


def test_every_answer_carries_the_strict_policy_and_only_known_assets_exist() -> None:
    with _client(None) as client:
        answers = [client.get(protocol.CONSOLE_PATH)] + [
            client.get(f"/console/assets/{name}") for name in ASSETS
        ]
        missing = client.get("/console/assets/..%2Fpage.py")
    for answer in answers:
        assert answer.status_code == 200
        assert answer.headers[protocol.CONTENT_SECURITY_POLICY_HEADER] == (CONTENT_SECURITY_POLICY)
        assert answer.headers[protocol.CONTENT_TYPE_OPTIONS_HEADER] == protocol.NO_SNIFF
    assert missing.status_code in (400, 404)
    # the page loads nothing from elsewhere and runs no inline script or style
    page = answers[0].text
    assert "<style" not in page and " style=" not in page and "http" not in page
    assert all(tag.count("src=") == 1 for tag in page.split("<script")[1:])
    # data reaches the page as text only: no markup built from it
    script = answers[1].text
    assert "textContent" in script
    assert not any(sink in script for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML"))


# --- what it shows --------------------------------------------------------------------------------
@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.stop()


def _record(harness: Harness, at: float, dimensions: dict[str, str], **stats: Stat) -> None:
    key_dimensions = tuple(sorted(dimensions.items()))
    points = {
        (protocol.SAGEMAKER_NAMESPACE, metric, key_dimensions): s for metric, s in stats.items()
    }
    harness.control.cloudwatch.store.record(at, points, at + 10)


def test_the_overview_and_an_endpoint_show_variants_containers_alarms_and_series(
    harness: Harness,
) -> None:
    harness.in_service("e1", "c1", ("A", "B"))
    served = harness.deployer.served["e1@A@1"]
    served["Containers"][0]["LastFailureReason"] = "replica exited: see its log"
    harness.control.cloudwatch.PutMetricAlarm(
        {
            "AlarmName": "e1-5xx",
            "Namespace": protocol.SAGEMAKER_NAMESPACE,
            "MetricName": "Invocation5XXErrors",
            "Dimensions": [{"Name": "EndpointName", "Value": "e1"}],
            "Statistic": "Sum",
            "Period": 60,
            "EvaluationPeriods": 1,
            "Threshold": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        }
    )
    # a whole minute: 6 intervals of 10 s, 30 calls each, latency 2 ms and 40 ms; then 10 s of the next
    minute = 1_800_000_000.0 - 1_800_000_000.0 % PERIOD_S
    variant = {"EndpointName": "e1", "VariantName": "A"}
    for i in range(6):
        _record(
            harness,
            minute + 10 * i,
            variant,
            Invocations=Stat(30, 30, 1, 1),
            Invocation5XXErrors=Stat(30, 3, 0, 1),
            ModelLatency=Stat(30, 30 * 3000, 1000, 50000, ((2500.0, 27.0), (50000.0, 3.0))),
        )
    _record(harness, minute + 60, variant, Invocations=Stat(5, 5, 1, 1))

    # an endpoint from a spec, capturing: DescribeEndpoint does not say so, its description does
    capture = {"EnableCapture": True, "CaptureStatus": "Started", "CurrentSamplingPercentage": 20}
    harness.deployer.served["s1"] = {
        "EndpointName": "s1",
        "EndpointStatus": "InService",
        # not applied yet: no StartedAt (ListEndpoints once sorted its 0.0 as "", beside floats)
        "LastUpdate": {"Generation": 1, "Status": "InProgress"},
        "Containers": [{"ContainerHostname": "only", "Image": "python", "CurrentReplicas": 1}],
        "DataCaptureConfig": capture,
    }
    summary = overview(harness.control, harness.deployer.descriptions(), now=5.0)
    spec_row = summary["Endpoints"].pop()
    assert (spec_row["EndpointName"], spec_row["DataCapture"], spec_row["Containers"]) == (
        "s1",
        True,
        1,
    )
    spec_detail = endpoint_detail(harness.control, harness.deployer.descriptions(), "s1")
    assert spec_detail is not None and spec_detail["Endpoint"]["DataCaptureConfig"] == capture
    detail = endpoint_detail(harness.control, harness.deployer.descriptions(), "e1")
    assert endpoint_detail(harness.control, {}, "nope") is None

    (row,) = summary["Endpoints"]
    assert row["EndpointName"] == "e1" and row["EndpointStatus"] == "InService"
    assert [(v["VariantName"], v["CurrentWeight"]) for v in row["Variants"]] == [
        ("A", 1.0),
        ("B", 1.0),
    ]
    assert (row["Containers"], row["ReplicasRunning"], row["ReplicasDesired"]) == (2, 2, 2)
    assert [a["AlarmName"] for a in summary["Alarms"]] == ["e1-5xx"]
    assert [a["AlarmName"] for a in detail["Alarms"]] == ["e1-5xx"]

    assert [(f["VariantName"], f["Served"], f["Fleet"]) for f in detail["Fleets"]] == [
        ("A", "e1@A@1", "serving"),
        ("B", "e1@B@1", "serving"),
    ]
    assert detail["Fleets"][0]["Containers"][0]["LastFailureReason"].startswith("replica exited")
    times = detail["Timestamps"]
    assert times == axis(minute + 70) and times[-2:] == [minute, minute + 60] and len(times) == 60
    charts = {
        (c["Kind"], c["VariantName"], c.get("ContainerHostname")): c for c in detail["Charts"]
    }
    a = charts[("variant", "A", None)]["Series"]
    assert a["InvocationsPerSecond"][-2:] == [180 / 60, 5 / 10]  # the minute under way: its 10 s
    assert a["Invocation5XXPerSecond"][-2] == pytest.approx(18 / 60)
    assert 1.0 <= a["ModelLatencyP50Ms"][-2] <= 2.5 and 2.5 < a["ModelLatencyP99Ms"][-2] <= 50.0
    assert a["InvocationsPerSecond"][:-2] == [None] * 58
    # A's one container is recorded as its variant; B has no datapoint at all
    container = next(c for (kind, v, host), c in charts.items() if kind == "container" and v == "A")
    assert container["Series"]["InvocationsPerSecond"][-2] == 3.0
    assert set(charts[("variant", "B", None)]["Series"]["InvocationsPerSecond"]) == {None}


def test_an_update_shows_its_canary_step_its_coming_fleet_and_its_rollback(
    harness: Harness,
) -> None:
    harness.model("m1")
    harness.model("m2")
    harness.config("c1", ("A", "m1"), count=2)
    harness.config("c2", ("A", "m2"), count=2)
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    harness.deployer.ready("e1@A@1")
    harness.api.tick()
    # watched by the rollback only: no dimension names the endpoint
    harness.client("cloudwatch").put_metric_alarm(
        AlarmName="canary-guard",
        Namespace=protocol.SAGEMAKER_NAMESPACE,
        MetricName="Invocation5XXErrors",
        Statistic="Sum",
        Period=10,
        EvaluationPeriods=1,
        Threshold=0,
        ComparisonOperator="GreaterThanThreshold",
        Dimensions=[{"Name": "VariantName", "Value": "A"}],
    )
    routing = {
        "Type": "CANARY",
        "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1},
        "WaitIntervalInSeconds": 600,
    }
    harness.sm.update_endpoint(
        EndpointName="e1",
        EndpointConfigName="c2",
        DeploymentConfig={
            "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing},
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "canary-guard"}]},
        },
    )
    harness.deployer.ready("e1@A@2")
    harness.api.tick()

    detail = endpoint_detail(harness.control, harness.deployer.descriptions(), "e1")
    assert detail is not None
    assert [(f["Served"], f["Fleet"]) for f in detail["Fleets"]] == [
        ("e1@A@1", "serving"),
        ("e1@A@2", "coming"),
    ]
    (new,) = detail["Endpoint"]["PendingDeploymentSummary"]["ProductionVariants"]
    assert new["VariantStatus"][0]["Status"] == "Baking"
    assert (
        new["VariantStatus"][0]["StatusMessage"] == "step 1 of 2: 50% of traffic on the new fleet"
    )
    assert [a["AlarmName"] for a in detail["Alarms"]] == ["canary-guard"]
    row = overview(harness.control, harness.deployer.descriptions())["Endpoints"][0]
    assert row["Updating"] and row["EndpointStatus"] == "Updating"

    harness.control.cloudwatch.SetAlarmState(
        {"AlarmName": "canary-guard", "StateValue": "ALARM", "StateReason": "5XX while baking"}
    )
    harness.api.tick()
    after = endpoint_detail(harness.control, harness.deployer.descriptions(), "e1")
    assert after is not None and "PendingDeploymentSummary" not in after["Endpoint"]
    assert "canary-guard" in after["Endpoint"]["FailureReason"]
    assert after["Alarms"][0]["StateValue"] == "ALARM"


# A container process that cannot start, under its supervisor, in a fresh interpreter whose stderr
# is a file (as a replica worker's is): what its ContainerStartError says.
_START_PROBE = r"""
import json, sys
from serving.model_server.container_config import ContainerConfig, ContainerStartError
from serving.model_server.supervisor import ContainerProcess
config = ContainerConfig(endpoint="ep", hostname="broken", image="python", model_data=sys.argv[1],
                         environment={}, hop_key=b"k" * 32)
process = ContainerProcess(config, "127.0.0.1")
try:
    process.start(timeout=120)
    print(json.dumps({"started": True}))
except ContainerStartError as error:
    print(json.dumps({"error": str(error)}))
finally:
    process.stop()
"""


def test_a_container_that_cannot_start_names_its_log_stream(tmp_path: Path) -> None:
    # the console shows a container's last failure, and with it where to read the rest
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text('raise RuntimeError("this model cannot load")\n')
    log = tmp_path / "worker-1234.err"
    with log.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", _START_PROBE, str(model)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=180,
            cwd=Path(__file__).resolve().parents[2],
        )
    assert done.returncode == 0, log.read_text()[-2000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error.endswith("; its output: ep/broken/worker-1234.err"), error
