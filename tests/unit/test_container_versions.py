"""serving.control.container_versions: desired endpoints to running ones, blue/green per container,
reverted on failure, as pure steps."""

from __future__ import annotations

from serving.control.container_versions import (
    Delete,
    Deploy,
    EndpointState,
    app_name,
    parse_app_name,
    plan_version,
    step,
)

TIMEOUT = 100.0


def record(**versions: str) -> dict:
    return {
        "name": "ep",
        "mode": "Direct",
        "containers": [
            {"ContainerHostname": host, "DesiredReplicas": 2, "Version": version}
            for host, version in versions.items()
        ],
        "plans": {host: {"image": "sklearn", "v": version} for host, version in versions.items()},
    }


def routable(**versions: str) -> dict:
    """A record as the registry stores an active one: with what a gateway routes by."""
    return {
        **record(**versions),
        "limits": {},
        "not_idempotent": [],
        "access": None,
        "async_inference": None,
    }


def running(*apps: str) -> dict[str, dict]:
    return {app: {"status": "RUNNING", "deployments": {}} for app in apps}


def live(**counts: int) -> dict[tuple[str, str, str], int]:
    return {("ep", *key.split("__")): count for key, count in counts.items()}


def creating() -> EndpointState:
    return EndpointState(
        "ep", record(a="v1", b="v1"), None, {"Status": "InProgress", "StartedAt": 0.0}
    )


def test_names_and_versions() -> None:
    assert app_name("ep", "a", "v1") == "ep.a.v1" and parse_app_name("ep.a.v1") == ("ep", "a", "v1")
    assert parse_app_name("serving-gateway") is None and parse_app_name("a.b") is None
    assert plan_version({"x": 1, "y": [1, 2]}) == plan_version({"y": [1, 2], "x": 1})
    assert plan_version({"x": 1}) != plan_version({"x": 2})
    assert plan_version({"gpus": 0, "cpus": [1]}) == plan_version({"gpus": 0.0, "cpus": [1.0]})


def test_a_new_endpoint_deploys_every_container_and_becomes_active_when_all_are_registered() -> (
    None
):
    state = creating()
    actions = step(state, {}, {}, now=1.0, timeout_s=TIMEOUT, deployed=set())
    assert [a.app for a in actions if isinstance(a, Deploy)] == ["ep.a.v1", "ep.b.v1"]
    deployed = {"ep.a.v1", "ep.b.v1"}
    # no second deploy
    assert step(state, {}, {}, now=2.0, timeout_s=TIMEOUT, deployed=deployed) == []
    step(
        state,
        running(*deployed),
        live(a__v1=2, b__v1=1),
        now=3.0,
        timeout_s=TIMEOUT,
        deployed=deployed,
    )
    # b has 1 of its 2 replicas
    assert state.active is None and state.update["Status"] == "InProgress"
    step(
        state,
        running(*deployed),
        live(a__v1=2, b__v1=2),
        now=4.0,
        timeout_s=TIMEOUT,
        deployed=deployed,
    )
    assert state.active == state.desired and state.update["Status"] == "Succeeded"


def test_an_update_starts_only_changed_containers_and_switches_at_once() -> None:
    state = EndpointState(
        "ep",
        record(a="v2", b="v1"),
        record(a="v1", b="v1"),
        {"Status": "InProgress", "StartedAt": 0.0},
    )
    statuses = running("ep.a.v1", "ep.b.v1")
    actions = step(
        state, statuses, live(a__v1=2, b__v1=2), now=1.0, timeout_s=TIMEOUT, deployed=set()
    )
    assert actions == [Deploy("ep.a.v2", "ep", "a", "v2", {"image": "sklearn", "v": "v2"})]
    assert state.routing() == record(a="v1", b="v1")  # the old version keeps all traffic meanwhile
    statuses = running("ep.a.v1", "ep.b.v1", "ep.a.v2")
    actions = step(
        state,
        statuses,
        live(a__v1=2, b__v1=2, a__v2=2),
        now=2.0,
        timeout_s=TIMEOUT,
        deployed={"ep.a.v2"},
    )
    assert state.routing() == record(a="v2", b="v1") and state.update["Status"] == "Succeeded"
    assert actions == [Delete("ep.a.v1")]  # b's replicas were never touched


def test_a_version_that_fails_to_deploy_is_rolled_back() -> None:
    old = record(a="v1")
    state = EndpointState("ep", record(a="v2"), old, {"Status": "InProgress", "StartedAt": 0.0})
    statuses = {
        **running("ep.a.v1"),
        "ep.a.v2": {
            "status": "DEPLOY_FAILED",
            "message": "",
            "deployments": {
                "a": {
                    "status": "DEPLOY_FAILED",
                    "message": "Traceback ...\nValueError: corrupt weights",
                }
            },
        },
    }
    actions = step(state, statuses, live(a__v1=2), now=5.0, timeout_s=TIMEOUT, deployed={"ep.a.v2"})
    assert actions == [Delete("ep.a.v2")]
    assert state.active == old and state.desired == old
    assert (
        state.update["Status"] == "Failed"
        and state.update["FailureReason"] == "container a: ValueError: corrupt weights"
    )
    assert (
        step(state, running("ep.a.v1"), live(a__v1=2), now=6.0, timeout_s=TIMEOUT, deployed=set())
        == []
    )


def test_a_version_that_is_not_ready_in_time_is_rolled_back() -> None:
    state = EndpointState(
        "ep", record(a="v2"), record(a="v1"), {"Status": "InProgress", "StartedAt": 0.0}
    )
    statuses = running("ep.a.v1", "ep.a.v2")
    assert (
        step(
            state,
            statuses,
            live(a__v1=2, a__v2=1),
            now=50.0,
            timeout_s=TIMEOUT,
            deployed={"ep.a.v2"},
        )
        == []
    )
    actions = step(
        state, statuses, live(a__v1=2, a__v2=1), now=101.0, timeout_s=TIMEOUT, deployed={"ep.a.v2"}
    )
    assert actions == [Delete("ep.a.v2")]
    assert state.update["FailureReason"] == "container a did not become ready within 100 s"


def test_a_first_deployment_that_fails_leaves_a_failed_endpoint() -> None:
    state = creating()
    statuses = {
        "ep.a.v1": {"status": "DEPLOY_FAILED", "message": "ValueError: bad", "deployments": {}},
        **running("ep.b.v1"),
    }
    actions = step(
        state, statuses, live(b__v1=2), now=1.0, timeout_s=TIMEOUT, deployed={"ep.a.v1", "ep.b.v1"}
    )
    assert (
        actions == []
        and state.failed
        and state.update["FailureReason"] == "container a: ValueError: bad"
    )


def test_containers_added_and_removed_and_leftovers() -> None:
    state = EndpointState(
        "ep",
        record(a="v1", c="v1"),
        record(a="v1", b="v1"),
        {"Status": "InProgress", "StartedAt": 0.0},
    )
    statuses = running("ep.a.v1", "ep.b.v1", "ep.a.v0")  # v0: a leftover of an interrupted update
    actions = step(
        state, statuses, live(a__v1=2, b__v1=2), now=1.0, timeout_s=TIMEOUT, deployed=set()
    )
    assert Delete("ep.a.v0") in actions and [a.app for a in actions if isinstance(a, Deploy)] == [
        "ep.c.v1"
    ]
    actions = step(
        state,
        running("ep.a.v1", "ep.b.v1", "ep.c.v1"),
        live(a__v1=2, b__v1=2, c__v1=2),
        now=2.0,
        timeout_s=TIMEOUT,
        deployed={"ep.c.v1"},
    )
    assert actions == [Delete("ep.b.v1")] and state.update["Status"] == "Succeeded"


def test_state_round_trips_as_plain_data() -> None:
    state = creating()
    assert EndpointState.from_dict(state.to_dict()) == state


def test_a_snapshot_routes_with_the_active_versions_while_new_ones_come_up() -> None:
    active = routable(a="v1", b="v1")
    desired = {**active, **record(a="v2", b="v1")}
    state = EndpointState("ep", desired, active, {"Status": "InProgress", "StartedAt": 0.0})
    snapshot = state.snapshot()
    # the active record routes
    assert [c["Version"] for c in snapshot["containers"]] == ["v1", "v1"]
    assert snapshot["desired_versions"] == {"a": "v2", "b": "v1"} and snapshot["in_service"]
    assert not snapshot["failed"] and snapshot["update"]["Status"] == "InProgress"
    replicas = {
        "http://a-old": ("ep", "a", "v1"),
        "http://a-new": ("ep", "a", "v2"),
        "http://b": ("ep", "b", "v1"),
        "http://other": ("other", "a", "v1"),
    }
    from serving.control.container_versions import routed_replicas

    assert routed_replicas({"ep": state}, replicas) == {
        ("ep", "a"): ["http://a-old"],
        ("ep", "b"): ["http://b"],
    }


def test_the_registry_snapshot_counts_replicas_and_copies_scaling_records() -> None:
    from serving.control.snapshots import snapshot_of

    active = routable(a="v1")
    state = EndpointState("ep", active, active, {"Status": "Succeeded", "StartedAt": 0.0})
    scaling = {"ep": {"containers": {"a": {"desired": 1}}, "activities": [{"id": "1"}]}}
    replicas = {"http://a1": ("ep", "a", "v1"), "http://a2": ("ep", "a", "v1")}
    snapshot = snapshot_of(
        version=3,
        epoch="e",
        states={"ep": state},
        replicas=replicas,
        statuses={},
        refused=0,
        awaited={"z", "y"},
        api=None,
        feed=None,
        scaling=scaling,  # type: ignore[arg-type]
    )
    assert snapshot["registered"] == {("ep", "a", "v1"): 2} and snapshot["awaited"] == ["y", "z"]
    assert snapshot["replicas"] == {("ep", "a"): ["http://a1", "http://a2"]}
    # a gateway's snapshot does not change when the registry records another activity
    scaling["ep"]["activities"].append({"id": "2"})
    scaling["ep"]["containers"]["b"] = {"desired": 1}
    assert snapshot["scaling"]["ep"]["activities"] == [{"id": "1"}]
    assert list(snapshot["scaling"]["ep"]["containers"]) == ["a"]
