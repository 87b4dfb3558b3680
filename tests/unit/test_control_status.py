"""serving.control.status: endpoint descriptions and status from hand-made Ray Serve status
snapshots."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from serving.control.container_versions import short_reason
from serving.control.status import EndpointRecord, StatusBoard, describe
from serving.http.responses import serving_app
from serving.ray_wing.serve_status import applications_from_serve_details

TRACEBACK = """\
The deployment failed to start 3 times in a row. This may be due to a problem with its constructor or initial health check failing. See controller logs for details. Error:
ray::ServeReplica:mce-demo:english.initialize_and_get_metadata() (pid=4242, ip=10.0.0.7, actor_id=abc)
  File "/work/main/serving/app.py", line 89, in __init__
    runtime.load()  # a failure here marks the container (and endpoint) Failed with this error
  File "/work/main/serving/runtimes/sklearn.py", line 62, in model_fn
    raise PermissionError(
PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops
"""


def record(
    *hostnames: str,
    mode: str = "Direct",
    name: str = "mce-demo",
    in_service: bool = True,
    failed: bool = False,
    update: dict | None = None,
    desired: dict | None = None,
) -> EndpointRecord:
    return EndpointRecord(
        name=name,
        mode=mode,
        containers=[
            {
                "ContainerHostname": host,
                "Image": "sklearn",
                "Mode": "SingleModel",
                "DesiredReplicas": 2,
                "Version": "v1",
            }
            for host in hostnames
        ],
        in_service=in_service,
        failed=failed,
        update=update or {"Status": "Succeeded"},
        desired_versions=desired or {host: "v1" for host in hostnames},
    )


def deployment(status: str, running: int = 0, message: str = "", **states: int) -> dict[str, Any]:
    replicas = {"RUNNING": running} if running else {}
    return {"status": status, "message": message, "replicas": {**replicas, **states}}


def app(status: str, message: str = "", **deployments: dict[str, Any]) -> dict[str, Any]:
    return {"status": status, "message": message, "deployments": deployments}


def apps(
    name: str = "mce-demo", version: str = "v1", **deployments: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Serve statuses: one application per container version, as the registry deploys them."""
    return {
        f"{name}.{host}.{version}": app(d["status"], **{host: d}) for host, d in deployments.items()
    }


def registered(
    name: str = "mce-demo", version: str = "v1", **counts: int
) -> dict[tuple[str, str, str], int]:
    return {(name, host, version): count for host, count in counts.items()}


# --- short_reason ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            TRACEBACK,
            "PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops",
        ),
        (
            'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "    raise FileNotFoundError('no model: here')\nFileNotFoundError: no model.skops in /models/english\n",
            "FileNotFoundError: no model.skops in /models/english",
        ),
        (
            "ray.exceptions.RayTaskError(RuntimeError): ray::ServeReplica:x (pid=1)\n"
            "RuntimeError: the python stack needs code/inference.py defining predict_fn\n"
            "  continued explanation without the magic words\n",
            "RuntimeError: the python stack needs code/inference.py defining predict_fn",
        ),
        (
            "Deploying app 'mce-demo' failed.\n\nReplica gave up after 3 attempts\n",
            "Replica gave up after 3 attempts",
        ),
        (
            'RuntimeError: Traceback (most recent call last):\n  File "x.py", line 3\nValueError: weights are corrupt\n',
            "ValueError: weights are corrupt",
        ),
        ("", ""),
        ("   \n \n", ""),
        (None, ""),
    ],
    ids=[
        "ray replica failure",
        "plain traceback",
        "continuation line",
        "no error line",
        "wrapped traceback",
        "empty",
        "blank",
        "none",
    ],
)
def test_short_reason(message: str | None, reason: str) -> None:
    assert short_reason(message) == reason


def test_short_reason_is_bounded() -> None:
    assert len(short_reason("ValueError: " + "x" * 5000)) == 1000


# --- describe -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_service", "live", "states", "endpoint_status", "container_statuses"),
    [
        (False, {}, {}, "Creating", ["Creating", "Creating"]),
        (False, {"english": 2}, {}, "Creating", ["InService", "Creating"]),
        (True, {"english": 2, "labels": 2}, {}, "InService", ["InService", "InService"]),
        # One replica of two died: Serve replaces it; the container still serves, the endpoint is
        # Updating.
        (
            True,
            {"english": 1, "labels": 2},
            {"english": {"RUNNING": 1, "STARTING": 1}},
            "Updating",
            ["Updating", "InService"],
        ),
        # Every replica of one container is gone: it is unavailable (429s) until Serve brings one
        # back.
        (True, {"labels": 2}, {"english": {"STARTING": 2}}, "Updating", ["Updating", "InService"]),
    ],
    ids=["creating", "half created", "in service", "a replica died", "all replicas of one died"],
)
def test_health_comes_from_registered_replicas(
    in_service: bool, live: dict, states: dict, endpoint_status: str, container_statuses: list[str]
) -> None:
    # Serve calls a deployment whose replica died UNHEALTHY: that must never make the endpoint
    # Failed.
    statuses = apps(
        **{
            host: deployment("UNHEALTHY" if host in states else "HEALTHY", **states.get(host, {}))
            for host in ("english", "labels")
        }
    )
    description = describe(
        record("english", "labels", in_service=in_service),
        statuses,
        registered(**live),
        in_service=in_service,
    )
    assert description["EndpointStatus"] == endpoint_status
    assert description["FailureReason"] is None
    assert [c["Status"] for c in description["Containers"]] == container_statuses
    assert [c["CurrentReplicas"] for c in description["Containers"]] == [
        live.get("english", 0),
        live.get("labels", 0),
    ]
    assert all(
        c["DesiredReplicas"] == 2 and c["Image"] == "sklearn" for c in description["Containers"]
    )
    assert all("FailureReason" not in c for c in description["Containers"])


def test_replica_counts_by_state_and_the_last_failure_are_shown() -> None:
    statuses = apps(
        english=deployment(
            "UNHEALTHY",
            message="RuntimeError: container process exited (-9)",
            RUNNING=1,
            STARTING=1,
            STOPPING=1,
        )
    )
    description = describe(record("english"), statuses, registered(english=1), in_service=True)
    english = description["Containers"][0]
    assert english["Replicas"] == {"Running": 1, "Starting": 1, "Stopping": 1}
    assert english["LastFailureReason"] == "RuntimeError: container process exited (-9)"
    assert english["Status"] == "Updating"


def test_a_first_deployment_that_fails_makes_the_endpoint_failed() -> None:
    statuses = apps(
        english=deployment("DEPLOY_FAILED", message=TRACEBACK), labels=deployment("HEALTHY", 2)
    )
    update = {
        "Status": "Failed",
        "FailureReason": "container english: PermissionError: refusing to unpickle",
    }
    description = describe(
        record("english", "labels", mode="Serial", in_service=False, failed=True, update=update),
        statuses,
        registered(labels=2),
        in_service=False,
    )
    assert description["EndpointStatus"] == "Failed"
    reason = "PermissionError: refusing to unpickle model.joblib: pickle runs arbitrary code. Save the model with skops"
    # Serve's message now, in full
    assert description["FailureReason"] == f"container english: {reason}"
    english, labels = description["Containers"]
    assert english["Status"] == "Failed" and english["FailureReason"] == reason
    assert labels["Status"] == "InService" and "FailureReason" not in labels
    assert description["InferenceExecutionConfig"] == {"Mode": "Serial"}


def test_an_update_in_progress_and_a_rolled_back_one() -> None:
    statuses = apps(english=deployment("HEALTHY", 2))
    rolling = record(
        "english", update={"Status": "InProgress", "StartedAt": 1.0}, desired={"english": "v2"}
    )
    description = describe(rolling, statuses, registered(english=2), in_service=True)
    assert description["EndpointStatus"] == "Updating"
    assert description["Containers"][0]["Status"] == "Updating"
    assert description["Containers"][0]["PendingVersion"] == "v2"
    failed = record(
        "english",
        update={"Status": "Failed", "FailureReason": "container english: did not become ready"},
    )
    description = describe(failed, statuses, registered(english=2), in_service=True)
    assert description["EndpointStatus"] == "InService"  # still serving the previous version
    assert description["FailureReason"] == (
        "The last update failed and was rolled back: container english: did not become ready"
    )
    assert description["LastUpdate"]["Status"] == "Failed"


def test_description_does_not_share_the_records_lists() -> None:
    endpoint = record("english")
    endpoint.scaling_activities.append({"ContainerHostname": "english", "From": 1, "To": 2})
    description = describe(
        endpoint, apps(english=deployment("HEALTHY", 2)), registered(english=2), in_service=True
    )
    description["ScalingActivities"].clear()
    description["Containers"][0]["Image"] = "changed"
    assert endpoint.scaling_activities == [{"ContainerHostname": "english", "From": 1, "To": 2}]
    assert endpoint.containers[0]["Image"] == "sklearn"


# --- StatusBoard ----------------------------------------------------------------------


@pytest.fixture
def board() -> StatusBoard:
    board = StatusBoard()
    board.records = {
        "mce-demo": record("english"),
        "other": record("solo", name="other", in_service=False),
    }
    return board


STATUSES = {
    **apps(english=deployment("HEALTHY", 2)),
    **apps("other", solo=deployment("HEALTHY", 2)),
}
BOTH = {**registered(english=2), **registered("other", solo=2)}


def test_board_is_unroutable_until_every_endpoint_has_replicas(board: StatusBoard) -> None:
    assert board.unroutable() == ["the gateway has not read the registry yet"]
    board.refresh(STATUSES, registered(english=2))
    assert board.unroutable() == ["endpoint other is Creating"]
    board.records["other"].in_service = True
    board.refresh(STATUSES, BOTH)
    assert board.healthy()
    board.refresh(STATUSES, registered(english=2))  # other's only replicas went away
    assert board.unroutable() == ["endpoint other: no ready replica of solo"]


def test_board_failure(board: StatusBoard) -> None:
    board.records["mce-demo"] = record(
        "english",
        failed=True,
        in_service=False,
        update={"Status": "Failed", "FailureReason": "container english: broken"},
    )
    board.refresh(STATUSES, BOTH)
    assert board.failure("mce-demo") == "container english: broken"
    assert board.failure("other") is None
    assert board.failure("absent") is None
    assert not board.healthy()


def test_board_drops_deleted_endpoints(board: StatusBoard) -> None:
    board.refresh(STATUSES, BOTH)
    del board.records["other"]
    board.refresh(STATUSES, BOTH)
    assert set(board.descriptions) == {"mce-demo"}


def test_empty_board_is_healthy_once_loaded() -> None:
    board = StatusBoard()
    assert not board.healthy()
    board.refresh({}, {})
    assert board.healthy()


# --- HTTP -----------------------------------------------------------------------------


def get(board: StatusBoard, path: str) -> httpx.Response:
    """One GET against the board's routes, in process."""

    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=serving_app(board.routes()))
        async with httpx.AsyncClient(transport=transport, base_url="http://serving.test") as client:
            return await client.get(path)

    return asyncio.run(request())


def test_ping_follows_routability(board: StatusBoard) -> None:
    board.refresh(STATUSES, registered(english=2))
    response = get(board, "/ping")
    assert response.status_code == 503
    assert response.json() == {
        "__type": "ServiceUnavailable",
        "message": "endpoint other is Creating",
    }
    board.records["other"].in_service = True
    board.refresh(STATUSES, BOTH)
    assert get(board, "/ping").status_code == 200


def test_list_and_describe_endpoints(board: StatusBoard) -> None:
    board.refresh(STATUSES, registered(english=2))
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
    assert response.json() == {
        "__type": "ValidationError",
        "message": "Could not find endpoint nope.",
    }


def test_applications_from_serve_details() -> None:
    """The controller's instance details (Ray's REST schema, trimmed) -> the snapshot `describe`
    reads."""
    details = {
        "proxy_location": "Disabled",
        "applications": {
            "mce-demo": {
                "name": "mce-demo",
                "status": "DEPLOYING",
                "message": "",
                "route_prefix": None,
                "deployments": {
                    "english": {
                        "name": "english",
                        "status": "HEALTHY",
                        "status_trigger": "CONFIG_UPDATE_COMPLETED",
                        "message": "",
                        "replicas": [
                            {"replica_id": "a", "state": "RUNNING"},
                            {"replica_id": "b", "state": "RUNNING"},
                        ],
                    },
                    "german": {
                        "name": "german",
                        "status": "UPDATING",
                        "message": "starting",
                        "replicas": [
                            {"replica_id": "c", "state": "STARTING"},
                            {"replica_id": "d", "state": "RUNNING"},
                        ],
                    },
                    # no replicas yet, no message
                    "french": {"name": "french", "status": "UPDATING"},
                },
            },
            "empty": {"status": "NOT_STARTED", "message": None},
        },
    }
    applications = applications_from_serve_details(details)
    assert applications == {
        "mce-demo": {
            "status": "DEPLOYING",
            "message": "",
            "deployments": {
                "english": {"status": "HEALTHY", "message": "", "replicas": {"RUNNING": 2}},
                "german": {
                    "status": "UPDATING",
                    "message": "starting",
                    "replicas": {"STARTING": 1, "RUNNING": 1},
                },
                "french": {"status": "UPDATING", "message": "", "replicas": {}},
            },
        },
        "empty": {"status": "NOT_STARTED", "message": "", "deployments": {}},
    }
    assert applications_from_serve_details({}) == {}


def test_standby_generation_of_an_api_endpoint_does_not_fail_ping() -> None:
    """An UpdateEndpoint's new generation coming up beside the fronted one: GET /ping stays 200 (was
    503)."""
    old, new = "api@AllTraffic@1", "api@AllTraffic@2"
    board = StatusBoard()
    board.records[old] = record("solo", name=old)
    board.records[new] = record("solo", name=new, in_service=False)
    statuses = {
        **apps(old, solo=deployment("HEALTHY", 1)),
        **apps(new, solo=deployment("UPDATING")),
    }
    board.refresh(statuses, registered(old, solo=1))
    # no front yet: the first create counts
    assert board.unroutable() == [f"endpoint {new} is Creating"]
    board.fronted = {"api": frozenset({old})}
    assert board.healthy()
    # traffic moved before the new one is ready would be unhealthy
    board.fronted = {"api": frozenset({new})}
    assert board.unroutable() == [f"endpoint {new} is Creating"]
