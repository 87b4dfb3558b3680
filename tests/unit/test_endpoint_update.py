"""serving.sagemaker_api.endpoint_update: an endpoint update read top to bottom over typed
documents.

The fleet here records what the update asks of it and the test plays Serve's part (which served
endpoint is InService at which generation): the module is a pure state machine over
`EndpointDocument`s, and the API tests (test_sagemaker_control_plane.py, test_deployment_config.py)
drive the same code through boto3.
"""

from __future__ import annotations

from typing import Any

import pytest

from serving.sagemaker_api import endpoint_update
from serving.sagemaker_api.endpoint_update import (
    EndpointUpdates,
    next_generation,
    routes,
    served_names,
)
from serving.sagemaker_api.stored import DeploymentPlan, EndpointDocument, VariantRow


class RecordingFleet:
    """Deploys and deletes by name; each deploy of a served endpoint is its next generation."""

    def __init__(self) -> None:
        self.generations: dict[str, int] = {}
        self.deleted: list[str] = []

    def deploy(self, endpoint: str, variants: list[VariantRow]) -> dict[str, int]:
        for variant in variants:
            self.generations[variant["Served"]] = self.generations.get(variant["Served"], 0) + 1
        return {variant["Served"]: self.generations[variant["Served"]] for variant in variants}

    def delete(self, served: str) -> bool:
        self.deleted.append(served)
        return True

    def described(self, *names: str, failed: str | None = None) -> dict[str, Any]:
        """Serve's view: `names` InService at their latest generation (`failed`: that one's update
        Failed)."""
        return {
            name: {
                "EndpointStatus": "Failed" if name == failed else "InService",
                "LastUpdate": {
                    "Generation": self.generations[name],
                    "Status": "Failed" if name == failed else "Succeeded",
                    "FailureReason": "the image would not start" if name == failed else None,
                },
            }
            for name in names
        }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _document(name: str = "e1") -> EndpointDocument:
    return {
        "EndpointName": name,
        "EndpointArn": f"arn:aws:sagemaker:us-east-1:000000000000:endpoint/{name}",
        "EndpointConfigName": "c1",
        "CreationTime": 0.0,
        "LastModifiedTime": 0.0,
        "EndpointStatus": "Creating",
        "FailureReason": None,
        "Tags": [],
        "Generation": 0,
        "variants": [],
        "pending": None,
    }


def _fleet_of(document: EndpointDocument, *names: str, count: int = 2) -> list[VariantRow]:
    document["Generation"], served = next_generation(document)
    model = {"mode": "Direct", "containers": []}
    return [
        {
            "VariantName": name,
            "ModelName": "m1",
            "Model": model,  # type: ignore[typeddict-item]
            "InstanceType": "ml.m5.large",
            "Weight": 1.0,
            "Count": count,
            "DataCapture": None,
            "Served": served(name),
        }
        for name in names
    ]


CANARY: DeploymentPlan = {
    "steps": [0.5, 1.0],
    "wait": 60.0,
    "termination": 0.0,
    "timeout": None,
    "alarms": ["5xx"],
}


@pytest.fixture
def world() -> tuple[EndpointUpdates, RecordingFleet, Clock, dict[str, str]]:
    fleet, clock, alarms = RecordingFleet(), Clock(), {"5xx": "OK"}
    return EndpointUpdates(fleet, clock, alarms.get), fleet, clock, alarms


def _in_service(world, document: EndpointDocument) -> None:
    updates, fleet, clock, _ = world
    first = _fleet_of(document, "A")
    updates.start(document, first, "create", "c1")
    assert updates.advance(document, fleet.described(first[0]["Served"]))
    assert document["EndpointStatus"] == "InService" and document["variants"] == first


def test_a_create_serves_only_once_its_whole_fleet_is_in_service(world) -> None:
    updates, fleet, clock, _ = world
    document = _document()
    variants = _fleet_of(document, "A", "B")
    updates.start(document, variants, "create", "c1")
    # B not up yet: nothing moves
    assert not updates.advance(document, fleet.described(variants[0]["Served"]))
    assert document["variants"] == [] and document["pending"] is not None
    assert updates.advance(document, fleet.described(*(v["Served"] for v in variants)))
    assert document["EndpointStatus"] == "InService" and document["pending"] is None
    assert served_names(document) == {v["Served"] for v in variants} and len(variants) == 2


def test_a_canary_update_steps_bakes_and_drains_the_old_fleet(world) -> None:
    updates, fleet, clock, _ = world
    document = _document()
    _in_service(world, document)
    old = document["variants"][0]["Served"]
    new = _fleet_of(document, "A")
    updates.start(document, new, "update", "c2", plan=CANARY)
    ready = fleet.described(old, new[0]["Served"])
    assert updates.advance(document, ready)  # InService: the first step starts
    pending = document["pending"]
    assert pending is not None and pending.get("shift") == {"step": 0, "since": clock.now}
    assert [round(route.weight, 2) for route in routes(document["variants"], pending)] == [0.5, 0.5]
    clock.now += 30
    assert not updates.advance(document, ready)  # baking: nothing changes
    clock.now += 31
    assert updates.advance(document, ready)  # the second step
    assert pending["shift"] == {"step": 1, "since": clock.now}
    clock.now += 61
    assert updates.advance(document, ready)  # the last step baked: finished
    assert document["variants"] == new and document["EndpointConfigName"] == "c2"
    assert document["EndpointStatus"] == "InService" and document["pending"] is None
    assert document.get("retired") == [{"Served": old, "At": clock.now}] and fleet.deleted == []
    clock.now += endpoint_update.DRAIN_S
    assert updates.advance(document, ready)
    assert fleet.deleted == [old] and document.get("retired") == []


def test_an_alarm_rolls_a_stepped_update_back_and_drains_the_new_fleet(world) -> None:
    updates, fleet, clock, alarms = world
    document = _document()
    _in_service(world, document)
    old = document["variants"]
    new = _fleet_of(document, "A")
    updates.start(document, new, "update", "c2", plan=CANARY)
    ready = fleet.described(old[0]["Served"], new[0]["Served"])
    updates.advance(document, ready)
    alarms["5xx"] = "ALARM"
    clock.now += 5
    assert updates.advance(document, ready)
    assert document["variants"] == old and document["pending"] is None
    assert document["EndpointStatus"] == "InService" and document["EndpointConfigName"] == "c1"
    assert "alarm 5xx went to ALARM" in (document["FailureReason"] or "")
    # It took traffic: deleted only after the drain, once gateways route without it.
    assert fleet.deleted == [] and document.get("retired") == [
        {"Served": new[0]["Served"], "At": clock.now}
    ]


def test_a_failed_variant_rolls_back_at_once_and_a_first_fleet_fails(world) -> None:
    updates, fleet, clock, _ = world
    document = _document()
    first = _fleet_of(document, "A")
    updates.start(document, first, "create", "c1")
    assert updates.advance(document, fleet.described(first[0]["Served"], failed=first[0]["Served"]))
    assert document["EndpointStatus"] == "Failed" and "the image would not start" in (
        document["FailureReason"] or ""
    )
    assert fleet.deleted == [first[0]["Served"]]


def test_a_restart_mid_update_brings_both_fleets_back_and_starts_shifting_over(world) -> None:
    updates, fleet, clock, _ = world
    document = _document()
    _in_service(world, document)
    old, new = document["variants"], _fleet_of(document, "A")
    updates.start(document, new, "update", "c2", plan=CANARY)
    updates.advance(document, fleet.described(old[0]["Served"], new[0]["Served"]))
    assert document["pending"] and document["pending"].get("shift")
    # The server restarts: a new owner over the stored document (as JSON round-trips it).
    restarted = EndpointUpdates(fleet, clock, {"5xx": "OK"}.get)
    restarted.restore(document)
    pending = document["pending"]
    assert pending is not None and "shift" not in pending  # traffic shifting starts over
    assert (
        pending["generations"] == {new[0]["Served"]: 2} and fleet.generations[old[0]["Served"]] == 2
    )
    stale = {
        new[0]["Served"]: {
            "EndpointStatus": "InService",
            "LastUpdate": {"Generation": 1, "Status": "Succeeded"},
        }
    }
    # an answer from before the restart does not count
    assert not restarted.advance(document, stale)
    assert restarted.advance(document, fleet.described(old[0]["Served"], new[0]["Served"]))
    assert pending.get("shift") == {"step": 0, "since": clock.now}
