"""serving.control: endpoint descriptions and status from hand-made Ray Serve status snapshots."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import httpx
from starlette.applications import Starlette

from serving.control import EndpointRecord, StatusBoard, applications_from_serve_details, describe, short_reason

TRACEBACK = """\
The deployment failed to start 3 times in a row. This may be due to a problem with its constructor or initial health check failing. See controller logs for details. Error:
ray::ServeReplica:mce-demo:english.initialize_and_get_metadata() (pid=4242, ip=10.0.0.7, actor_id=abc)
  File "/work/main/serving/app.py", line 89, in __init__
    runtime.load()  # a failure here marks the container (and endpoint) Failed with this error
  File "/work/main/serving/runtimes/sklearn.py", line 62, in model_fn
    raise PermissionError(
PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops
"""


def record(*hostnames: str, mode: str = "Direct", name: str = "mce-demo") -> EndpointRecord:
    return EndpointRecord(
        name=name,
        mode=mode,
        containers=[
            {"ContainerHostname": host, "Image": "sklearn", "Mode": "SingleModel", "DesiredReplicas": 2} for host in hostnames
        ],
    )


def deployment(status: str, running: int = 0, message: str = "") -> dict[str, Any]:
    return {"status": status, "message": message, "replicas": {"RUNNING": running} if running else {}}


def app(status: str, message: str = "", **deployments: dict[str, Any]) -> dict[str, Any]:
    return {"status": status, "message": message, "deployments": deployments}


# --- short_reason ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (TRACEBACK, "PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops"),
        (
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "    raise FileNotFoundError('no model: here')\nFileNotFoundError: no model.skops in /models/english\n",
            "FileNotFoundError: no model.skops in /models/english",
        ),
        (
            "ray.exceptions.RayTaskError(RuntimeError): ray::ServeReplica:x (pid=1)\n"
            "RuntimeError: the python stack needs code/inference.py defining predict_fn\n"
            "  continued explanation without the magic words\n",
            "RuntimeError: the python stack needs code/inference.py defining predict_fn",
        ),
        ("Deploying app 'mce-demo' failed.\n\nReplica gave up after 3 attempts\n", "Replica gave up after 3 attempts"),
        ("", ""),
        ("   \n \n", ""),
        (None, ""),
    ],
    ids=["ray replica failure", "plain traceback", "continuation line", "no error line", "empty", "blank", "none"],
)
def test_short_reason(message: str | None, reason: str) -> None:
    assert short_reason(message) == reason


def test_short_reason_is_bounded() -> None:
    assert len(short_reason("ValueError: " + "x" * 5000)) == 1000


# --- describe -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("snapshot", "endpoint_status", "container_statuses", "current"),
    [
        (None, "Creating", ["Creating", "Creating"], [0, 0]),
        (app("NOT_STARTED"), "Creating", ["Creating", "Creating"], [0, 0]),
        (app("DEPLOYING", english=deployment("UPDATING", 1)), "Creating", ["Creating", "Creating"], [1, 0]),
        (
            app("RUNNING", english=deployment("HEALTHY", 2), labels=deployment("HEALTHY", 2)),
            "InService", ["InService", "InService"], [2, 2],
        ),
        (
            app("RUNNING", english=deployment("UPSCALING", 2), labels=deployment("DOWNSCALING", 3)),
            "InService", ["Updating", "Updating"], [2, 3],
        ),
        (app("DELETING", english=deployment("HEALTHY", 1)), "Deleting", ["InService", "Creating"], [1, 0]),
        (app("SOMETHING_NEW", english=deployment("NEW_STATE", 1)), "Creating", ["Creating", "Creating"], [1, 0]),
    ],
    ids=["no snapshot", "not started", "deploying", "running", "scaling", "deleting", "unknown states"],
)
def test_describe_maps_serve_states(snapshot: dict | None, endpoint_status: str, container_statuses: list[str],
                                    current: list[int]) -> None:
    description = describe(record("english", "labels"), snapshot)
    assert description["EndpointName"] == "mce-demo"
    assert description["EndpointStatus"] == endpoint_status
    assert description["FailureReason"] is None
    assert description["InferenceExecutionConfig"] == {"Mode": "Direct"}
    assert [c["Status"] for c in description["Containers"]] == container_statuses
    assert [c["CurrentReplicas"] for c in description["Containers"]] == current
    assert [c["ContainerHostname"] for c in description["Containers"]] == ["english", "labels"]
    assert all(c["DesiredReplicas"] == 2 and c["Image"] == "sklearn" for c in description["Containers"])
    assert all("FailureReason" not in c for c in description["Containers"])
    assert description["ScalingActivities"] == []


def test_deploy_failed_names_the_failing_container() -> None:
    snapshot = app(
        "DEPLOY_FAILED", "Failed to update the deployments ['english'].",
        english=deployment("DEPLOY_FAILED", message=TRACEBACK), labels=deployment("HEALTHY", 1),
    )
    description = describe(record("english", "labels", mode="Serial"), snapshot)
    assert description["EndpointStatus"] == "Failed"
    reason = "PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops"
    assert description["FailureReason"] == f"container english: {reason}"
    english, labels = description["Containers"]
    assert english["Status"] == "Failed" and english["FailureReason"] == reason
    assert labels["Status"] == "InService" and "FailureReason" not in labels
    assert description["InferenceExecutionConfig"] == {"Mode": "Serial"}


def test_every_failed_container_is_named() -> None:
    snapshot = app(
        "UNHEALTHY",
        english=deployment("UNHEALTHY", message="RuntimeError: data port server stopped"),
        labels=deployment("DEPLOY_FAILED", message="ValueError: bad labels.json"),
    )
    description = describe(record("english", "labels"), snapshot)
    assert description["EndpointStatus"] == "Failed"
    assert description["FailureReason"] == (
        "container english: RuntimeError: data port server stopped; container labels: ValueError: bad labels.json"
    )


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Traceback (most recent call last):\nValueError: the application builder raised", "ValueError: the application builder raised"),
        ("", "the endpoint failed"),
    ],
    ids=["app message", "no message at all"],
)
def test_app_level_failure_without_a_failed_container(message: str, reason: str) -> None:
    description = describe(record("english"), app("DEPLOY_FAILED", message, english=deployment("UPDATING")))
    assert description["EndpointStatus"] == "Failed"
    assert description["FailureReason"] == reason


def test_description_does_not_share_the_records_lists() -> None:
    endpoint = record("english")
    endpoint.scaling_activities.append({"ContainerHostname": "english", "From": 1, "To": 2})
    description = describe(endpoint, app("RUNNING", english=deployment("HEALTHY", 1)))
    description["ScalingActivities"].clear()
    description["Containers"][0]["Image"] = "changed"
    assert endpoint.scaling_activities == [{"ContainerHostname": "english", "From": 1, "To": 2}]
    assert endpoint.containers[0]["Image"] == "sklearn"


# --- StatusBoard ----------------------------------------------------------------------

@pytest.fixture
def board() -> StatusBoard:
    board = StatusBoard()
    board.records = {"mce-demo": record("english"), "other": record("solo", name="other")}
    return board


RUNNING = app("RUNNING", english=deployment("HEALTHY", 1))
OTHER_RUNNING = app("RUNNING", solo=deployment("HEALTHY", 1))


def test_board_becomes_updating_after_in_service(board: StatusBoard) -> None:
    board.refresh({"mce-demo": app("DEPLOYING", english=deployment("UPDATING"))})
    assert board.descriptions["mce-demo"]["EndpointStatus"] == "Creating"

    board.refresh({"mce-demo": RUNNING, "other": OTHER_RUNNING})
    assert board.descriptions["mce-demo"]["EndpointStatus"] == "InService"
    assert board.healthy()

    # Redeploying an endpoint that has served traffic is an update, not a creation.
    board.refresh({"mce-demo": app("DEPLOYING", english=deployment("UPDATING", 1)), "other": OTHER_RUNNING})
    assert board.descriptions["mce-demo"]["EndpointStatus"] == "Updating"
    assert not board.healthy()

    board.refresh({"mce-demo": RUNNING, "other": OTHER_RUNNING})
    assert board.descriptions["mce-demo"]["EndpointStatus"] == "InService"


def test_board_failure(board: StatusBoard) -> None:
    board.refresh({"mce-demo": app("DEPLOY_FAILED", english=deployment("DEPLOY_FAILED", message=TRACEBACK)), "other": OTHER_RUNNING})
    assert board.failure("mce-demo") == (
        "container english: PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. "
        "Save the model with skops"
    )
    assert board.failure("other") is None
    assert board.failure("absent") is None
    assert not board.healthy()


def test_board_drops_deleted_endpoints(board: StatusBoard) -> None:
    board.refresh({"mce-demo": RUNNING, "other": OTHER_RUNNING})
    del board.records["other"]
    board.refresh({"mce-demo": RUNNING, "other": OTHER_RUNNING})
    assert set(board.descriptions) == {"mce-demo"}


def test_empty_board_is_healthy() -> None:
    board = StatusBoard()
    board.refresh({})
    assert board.healthy()


# --- HTTP -----------------------------------------------------------------------------

def get(board: StatusBoard, path: str) -> httpx.Response:
    """One GET against the board's routes, in process."""

    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=Starlette(routes=board.routes()))
        async with httpx.AsyncClient(transport=transport, base_url="http://serving.test") as client:
            return await client.get(path)

    return asyncio.run(request())


def test_ping_follows_health(board: StatusBoard) -> None:
    board.refresh({"mce-demo": RUNNING})
    assert get(board, "/ping").status_code == 503
    board.refresh({"mce-demo": RUNNING, "other": OTHER_RUNNING})
    assert get(board, "/ping").status_code == 200


def test_list_and_describe_endpoints(board: StatusBoard) -> None:
    board.refresh({"mce-demo": RUNNING})
    listing = get(board, "/endpoints")
    assert listing.status_code == 200
    assert listing.json() == {
        "Endpoints": [
            {"EndpointName": "mce-demo", "EndpointStatus": "InService"},
            {"EndpointName": "other", "EndpointStatus": "Creating"},
        ]
    }
    described = get(board, "/endpoints/mce-demo")
    assert described.status_code == 200
    assert described.headers["content-type"] == "application/json"
    assert described.json() == board.descriptions["mce-demo"]


def test_describe_unknown_endpoint(board: StatusBoard) -> None:
    response = get(board, "/endpoints/nope")
    assert response.status_code == 400
    assert response.headers["x-amzn-ErrorType"] == "ValidationError"
    assert response.json() == {"__type": "ValidationError", "message": "Could not find endpoint nope."}


def test_applications_from_serve_details() -> None:
    """The controller's instance details (Ray's REST schema, trimmed) -> the snapshot `describe` reads."""
    details = {
        "proxy_location": "Disabled",
        "applications": {
            "mce-demo": {
                "name": "mce-demo", "status": "DEPLOYING", "message": "", "route_prefix": None,
                "deployments": {
                    "english": {"name": "english", "status": "HEALTHY", "status_trigger": "CONFIG_UPDATE_COMPLETED",
                                "message": "", "replicas": [{"replica_id": "a", "state": "RUNNING"},
                                                            {"replica_id": "b", "state": "RUNNING"}]},
                    "german": {"name": "german", "status": "UPDATING", "message": "starting",
                               "replicas": [{"replica_id": "c", "state": "STARTING"}, {"replica_id": "d", "state": "RUNNING"}]},
                    "french": {"name": "french", "status": "UPDATING"},  # no replicas yet, no message
                },
            },
            "empty": {"status": "NOT_STARTED", "message": None},
        },
    }
    applications = applications_from_serve_details(details)
    assert applications == {
        "mce-demo": {"status": "DEPLOYING", "message": "", "deployments": {
            "english": {"status": "HEALTHY", "message": "", "replicas": {"RUNNING": 2}},
            "german": {"status": "UPDATING", "message": "starting", "replicas": {"STARTING": 1, "RUNNING": 1}},
            "french": {"status": "UPDATING", "message": "", "replicas": {}},
        }},
        "empty": {"status": "NOT_STARTED", "message": "", "deployments": {}},
    }
    description = describe(record("english", "german", "french"), applications["mce-demo"])
    assert description["EndpointStatus"] == "Creating"
    assert [(c["Status"], c["CurrentReplicas"]) for c in description["Containers"]] == [
        ("InService", 2), ("Creating", 1), ("Creating", 0)]
    assert applications_from_serve_details({}) == {}
