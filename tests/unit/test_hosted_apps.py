"""Container versions on container hosts (`control.hosted_apps`): which plans are hosted, each
slot's life, and the status a version shows, which must read as a Serve application's would
(`container_versions.step` and `status.StatusBoard` read both)."""

from __future__ import annotations

from serving.config.spec import parse_spec
from serving.control.container_versions import DEPLOY_FAILED, EndpointState, step
from serving.control.hosted_apps import MAX_START_FAILURES, HostedApp, hosted, slot_of
from serving.control.plans import endpoint_record
from serving.control.status import EndpointRecord, StatusBoard
from serving.settings import ServerSettings


def _record(settings: ServerSettings, **container):
    spec = parse_spec(
        {
            "EndpointName": "e",
            "Containers": [{"ContainerHostname": "c", "Image": "python", **container}],
        }
    )
    return endpoint_record(spec, settings)


def _app(count: int = 2) -> HostedApp:
    record = _record(ServerSettings(), AutoScaling={"MinCapacity": count, "MaxCapacity": count})
    version = record["containers"][0]["Version"]
    return HostedApp.of(f"e.c.{version}", "e", "c", version, record["plans"]["c"])


def test_a_fixed_count_without_gpu_or_python_environment_is_hosted():
    assert hosted(_record(ServerSettings())["plans"]["c"])


_TRACKING = {
    "MinCapacity": 1,
    "MaxCapacity": 3,
    "TargetTrackingScalingPolicyConfiguration": {
        "PredefinedMetricSpecification": {
            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
        },
        "TargetValue": 10,
    },
}


def test_the_setting_off_a_gpu_or_a_runtime_env_keep_a_serve_replica_each():
    assert not hosted(_record(ServerSettings(node_hosts=False))["plans"]["c"])
    assert not hosted(_record(ServerSettings(), Resources={"Gpus": 1})["plans"]["c"])
    assert not hosted(_record(ServerSettings(), RuntimeEnvironment={"Pip": ["six"]})["plans"]["c"])


def test_an_autoscaled_container_is_hosted_and_starts_at_its_minimum():
    plan = _record(ServerSettings(), AutoScaling=_TRACKING)["plans"]["c"]
    assert hosted(plan)
    app = HostedApp.of("e.c.v", "e", "c", "v", plan)
    assert app.autoscaled and len(app.slots) == 1
    # a restarted registry takes the count it had reached, not the minimum
    assert len(HostedApp.of("e.c.v", "e", "c", "v", plan, app.to_dict()["replicas"] + 1).slots) == 2


def test_an_endpoint_level_policy_is_hosted_only_if_every_container_is():
    def endpoint(*gpus: float) -> dict:
        spec = parse_spec(
            {
                "EndpointName": "e",
                "AutoScaling": _TRACKING,
                "Containers": [
                    {"ContainerHostname": f"c{i}", "Image": "python", "Resources": {"Gpus": g}}
                    for i, g in enumerate(gpus)
                ],
            }
        )
        return endpoint_record(spec, ServerSettings())["plans"]

    assert all(hosted(plan) for plan in endpoint(0, 0).values())
    # one container needs a Serve replica: the policy runs in Serve's controller, for all of them
    assert not any(hosted(plan) for plan in endpoint(0, 1).values())


def test_resizing_adds_slots_after_the_last_and_takes_the_last_off():
    app = _app(2)
    for slot in app.slots:
        slot.new_replica("n")
        slot.state = "RUNNING"
    assert app.resize(4) == [] and [s.index for s in app.slots] == [0, 1, 2, 3]
    assert [s.state for s in app.slots[2:]] == ["PLACING", "PLACING"]
    assert app.status()["status"] == "DEPLOYING"  # the new ones are starting
    removed = app.resize(1)
    assert [s.index for s in removed] == [1, 2, 3] and len(app.slots) == 1
    assert app.status()["deployments"]["c"]["replicas"] == {"RUNNING": 1}


def test_the_setting_off_leaves_the_plan_and_so_the_version_as_before():
    plan = _record(ServerSettings(node_hosts=False))["plans"]["c"]
    assert "hosting" not in plan  # a stored plan of an earlier server keeps its version


def test_a_version_deploys_running_and_shows_it_as_serve_would():
    app = _app(2)
    assert app.status()["status"] == "DEPLOYING"
    assert app.status()["deployments"]["c"]["replicas"] == {"STARTING": 2}
    for slot in app.slots:
        replica = slot.new_replica("node-1")
        assert slot_of(replica) == slot.index
        slot.state = "RUNNING"
    status = app.status()
    assert status["status"] == "RUNNING" and status["deployments"]["c"]["status"] == "HEALTHY"
    assert status["deployments"]["c"]["replicas"] == {"RUNNING": 2}
    assert app.settled


def test_a_new_replica_never_reuses_an_id():
    slot = _app(1).slots[0]
    first = slot.new_replica("n")
    slot.lost()
    assert slot.new_replica("n") != first


def test_starts_that_keep_failing_fail_the_version_with_the_reason():
    app = _app(1)
    slot = app.slots[0]
    for attempt in range(MAX_START_FAILURES):
        assert app.failure is None
        slot.new_replica("n")
        app.start_failed(slot, "ModelError: no model.joblib")
    status = app.status()
    assert status["status"] == DEPLOY_FAILED
    assert "no model.joblib" in status["message"] and "container c" in status["message"]
    assert app.settled  # nothing more is started


def test_failures_do_not_fail_a_version_that_serves():
    app = _app(2)
    app.slots[0].new_replica("n")
    app.slots[0].state = "RUNNING"
    for _ in range(MAX_START_FAILURES + 1):
        app.slots[1].new_replica("n")
        app.start_failed(app.slots[1], "boom")
    assert app.failure is None and app.status()["status"] == "DEPLOYING"


def test_a_failed_version_steps_and_describes_as_a_failed_serve_application_does():
    record = _record(ServerSettings())
    version = record["containers"][0]["Version"]
    app = HostedApp.of(f"e.c.{version}", "e", "c", version, record["plans"]["c"])
    state = EndpointState("e", record, update={"Status": "InProgress", "StartedAt": 0.0})
    slot = app.slots[0]
    for _ in range(MAX_START_FAILURES):
        slot.new_replica("n")
        app.start_failed(slot, "ModelError: it does not load")
    statuses = {app.app: app.status()}
    step(state, statuses, {}, 1.0, 900.0, {app.app})
    assert state.update["Status"] == "Failed"
    assert "it does not load" in state.update["FailureReason"]
    snapshot = {"endpoints": {"e": state.snapshot()}, "statuses": statuses, "registered": {}}
    board = StatusBoard()
    board.records = {"e": EndpointRecord.from_snapshot(snapshot["endpoints"]["e"])}
    board.refresh(statuses, {})
    description = board.descriptions["e"]
    assert description["EndpointStatus"] == "Failed"
    assert "it does not load" in description["FailureReason"]


def test_a_replica_tracks_the_metrics_of_its_policies_only():
    from serving.ray_wing.replica import tracked_metrics

    plan = _record(ServerSettings(), AutoScaling=_TRACKING)["plans"]["c"]
    assert tracked_metrics(plan) == ("SageMakerVariantInvocationsPerInstance",)
    assert tracked_metrics(_app(2).plan) == ()  # a fixed count tracks nothing
