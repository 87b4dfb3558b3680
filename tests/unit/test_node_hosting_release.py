"""A hosted replica taken off (scale-in, delete) keeps its placement group until it has drained, as
a Serve replica's actor holds its resources until it exits: otherwise a new replica could be placed
on CPUs the draining one still uses; a restarted registry frees the groups its predecessor was
still holding for drains; and the replicas of a host that died leave the routing table before their
successors start. Ray is replaced here by fakes (placement groups, the host's calls and `ray.wait`);
the registry's real use runs in `tests/integration/test_autoscaling.py` and
`test_container_hosts.py`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from serving.config.spec import parse_spec
from serving.control.hosted_apps import HostedApp
from serving.control.plans import endpoint_record
from serving.ray_wing import node_hosting, slot_reservations
from serving.ray_wing.container_host import HOST_PREFIX
from serving.ray_wing.node_hosting import HEALTH_S, NodeHosting
from serving.ray_wing.slot_reservations import RELEASE_WAIT_S, SlotReservations, group_name
from serving.settings import ServerSettings


@dataclass(eq=False)
class _Ref:
    replica: str
    done: bool = False


@dataclass
class _Host:
    stops: list[_Ref] = field(default_factory=list)
    running: dict[str, tuple] = field(default_factory=dict)  # what `report` answers
    dead: bool = False

    def __post_init__(self) -> None:
        self.stop = SimpleNamespace(remote=self._stop)
        self.report = SimpleNamespace(remote=self._report)

    def _stop(self, replica: str) -> _Ref:
        self.stops.append(_Ref(replica))
        return self.stops[-1]

    def _report(self) -> Callable[[], dict]:
        """The call's ref: what `ray.get` of it does (the test's `ray.get` calls it)."""

        def answer() -> dict:
            if self.dead:
                raise node_hosting.ray.exceptions.RayActorError()
            return self.running

        return answer


class _Store:
    def put(self, *_) -> None: ...

    def delete(self, *_) -> None: ...

    def load(self, _) -> dict:
        return {}


@pytest.fixture
def hosting(monkeypatch: pytest.MonkeyPatch):
    removed: list[str] = []
    clock = [1000.0]
    monkeypatch.setattr(slot_reservations, "remove_placement_group", lambda g: removed.append(g.id))
    monkeypatch.setattr(
        slot_reservations.ray,
        "wait",
        lambda refs, num_returns, timeout: (
            [r for r in refs if r.done],
            [r for r in refs if not r.done],
        ),
    )
    monkeypatch.setattr(slot_reservations.time, "monotonic", lambda: clock[0])
    spec = parse_spec(
        {
            "EndpointName": "e",
            "Containers": [
                {
                    "ContainerHostname": "c",
                    "Image": "python",
                    "AutoScaling": {"MinCapacity": 3, "MaxCapacity": 3},
                }
            ],
        }
    )
    record = endpoint_record(spec, ServerSettings())
    version = record["containers"][0]["Version"]
    app = HostedApp.of(f"e.c.{version}", "e", "c", version, record["plans"]["c"])
    forgotten: list[str] = []
    hosting = NodeHosting(store=_Store(), forget=forgotten.append)  # type: ignore[arg-type]
    host = _Host()
    hosting._hosts["node-1"] = host
    hosting._recovered, hosting._checked = True, time.monotonic()
    hosting._apps[app.app] = app
    for slot in app.slots:
        slot.state, slot.node, slot.replica = "RUNNING", "node-1", f"r{slot.index}"
        hosting._reservations._groups[(app.app, slot.index)] = SimpleNamespace(
            id=f"group-{slot.index}"
        )
    return SimpleNamespace(
        it=hosting, app=app.app, host=host, removed=removed, clock=clock, forgotten=forgotten
    )


def test_scale_in_frees_a_reservation_only_once_its_replica_has_drained(hosting) -> None:
    hosting.it.resize(hosting.app, 1)
    stops = {ref.replica: ref for ref in hosting.host.stops}
    assert set(stops) == {"r1", "r2"}
    assert hosting.removed == []  # both still draining
    stops["r2"].done = True
    assert hosting.it.tick()  # r1's reservation still held: the loop keeps polling
    assert hosting.removed == ["group-2"]
    stops["r1"].done = True
    hosting.it.tick()
    assert hosting.removed == ["group-2", "group-1"]


def test_a_host_that_never_answers_the_stop_is_not_waited_for_past_the_bound(hosting) -> None:
    assert hosting.it.delete(hosting.app)
    assert len(hosting.host.stops) == 3 and hosting.removed == []
    hosting.clock[0] += RELEASE_WAIT_S + 1
    hosting.it.tick()
    assert sorted(hosting.removed) == ["group-0", "group-1", "group-2"]


def test_a_new_registry_frees_the_groups_no_stored_slot_owns(
    hosting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The previous registry process took slot 2 of app "old" off (its replica still drains) and
    # deleted app "gone" outright; both groups are detached and outlive it.
    table = {
        "1": {"name": group_name("old", 1), "state": "CREATED"},
        "2": {"name": group_name("old", 2), "state": "CREATED"},
        "3": {"name": group_name("gone", 0), "state": "CREATED"},
        "4": {"name": group_name("gone", 1), "state": "REMOVED"},
        "5": {"name": "someone-else's", "state": "CREATED"},
    }
    monkeypatch.setattr(slot_reservations, "placement_group_table", lambda: table)
    monkeypatch.setattr(
        slot_reservations, "get_placement_group", lambda name: SimpleNamespace(id=name)
    )
    draining = hosting.host._stop("old-r2")
    reservations = SlotReservations()
    reservations.release_orphans({("old", 0), ("old", 1)}, {group_name("old", 2): draining})
    assert hosting.removed == [group_name("gone", 0)]  # no replica left to drain
    draining.done = True
    assert not reservations.released()
    assert hosting.removed == [group_name("gone", 0), group_name("old", 2)]


def test_a_dead_hosts_replicas_leave_the_routing_table_before_they_start_again(
    hosting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's report raises as a dead actor's does; its stand-in (a new host on that node, which
    # knows none of the replicas) is the same fake.
    monkeypatch.setattr(node_hosting.ray, "get", lambda ref, timeout=None: ref())
    monkeypatch.setattr(node_hosting, "host_on", lambda node: hosting.host)
    hosting.host.running = {f"r{i}": (hosting.app, None) for i in range(3)}
    hosting.it._checked -= HEALTH_S
    hosting.it.tick()
    assert hosting.forgotten == [] and hosting.host.stops == []
    hosting.host.dead = True
    hosting.it._checked -= HEALTH_S
    hosting.it.tick()
    # forgotten by the host's name, which every registration it made carries
    assert hosting.forgotten == [HOST_PREFIX + "node-1"]
    slots = hosting.it._apps[hosting.app].slots
    assert [(s.state, s.replica) for s in slots] == [("PLACING", None)] * 3
