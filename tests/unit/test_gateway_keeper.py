"""serving.ray_wing.gateway_fleet.GatewayKeeper: what the registry does for the gateways that Serve's
controller did. Ray is replaced by recorders (the live nodes, the actors started, their health
checks, the kills): what is checked is each decision. The same keeper against real Ray:
tests/integration/test_gateway_fleet.py and tests/multinode."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from serving.ray_wing import gateway_fleet
from serving.ray_wing.gateway_fleet import GatewayKeeper, GatewayPlan


class _Store:
    def __init__(self) -> None:
        self.kept: dict[bytes, dict[str, Any]] = {}

    def put(self, prefix: bytes, key: str, value: Any) -> None:
        self.kept.setdefault(prefix, {})[key] = value

    def load(self, prefix: bytes) -> dict[str, Any]:
        return dict(self.kept.get(prefix, {}))


class _Check:
    """A health check's outcome: "ok", "failed" (its server stopped), "dead" (gone), "silent"."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


class _Method:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def remote(self) -> _Check:
        return _Check(self.answer())


class _Gateway:
    def __init__(self, name: str, node: str) -> None:
        self.name, self.node, self.health = name, node, "ok"
        self.check_health = _Method(lambda: self.health)
        self.stop = _Method(lambda: "ok")


class _Ray:
    """The live nodes, the gateways started, the kills, and which names Ray still knows."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.nodes = ["node-a"]
        self.started: dict[str, _Gateway] = {}
        self.starts: list[str] = []
        self.killed: list[tuple[str, bool]] = []
        self.known: set[str] = set()
        self.failing: set[str] = set()  # names whose every start fails (Ray then forgets them)
        monkeypatch.setattr(gateway_fleet, "_live_nodes", lambda: list(self.nodes))
        monkeypatch.setattr(gateway_fleet, "_start", self._start)
        monkeypatch.setattr(gateway_fleet, "_exists", lambda name: name in self.known)
        monkeypatch.setattr(gateway_fleet, "gateway_names", lambda: sorted(self.known))
        monkeypatch.setattr(gateway_fleet.ray, "wait", self._wait)
        monkeypatch.setattr(gateway_fleet.ray, "get", self._get)
        monkeypatch.setattr(gateway_fleet.ray, "kill", self._kill)
        monkeypatch.setattr(
            gateway_fleet.ray, "get_actor", lambda name, namespace=None: self.started[name]
        )

    def _start(self, plan: GatewayPlan, name: str, node: str) -> _Gateway:
        self.starts.append(name)
        gateway = self.started.get(name) or _Gateway(name, node)
        self.started[name] = gateway
        if name in self.failing:
            gateway.health = "dead"
        else:
            self.known.add(name)
        return gateway

    @staticmethod
    def _wait(calls: list[_Check], num_returns: int = 1, timeout: float = 0) -> tuple[list, list]:
        return [c for c in calls if c.outcome != "silent"], [
            c for c in calls if c.outcome == "silent"
        ]

    @staticmethod
    def _get(call: _Check) -> None:
        if call.outcome == "failed":
            raise ray.exceptions.RayTaskError(
                "check_health", "Traceback", RuntimeError("endpoint HTTP server stopped")
            )
        if call.outcome == "dead":
            raise ray.exceptions.ActorDiedError()

    def _kill(self, handle: _Gateway, no_restart: bool = True) -> None:
        self.killed.append((handle.name, no_restart))

    def gateway(self, node: str) -> _Gateway:
        (gateway,) = [g for g in self.started.values() if g.node == node]
        return gateway


def _plan(per_node: int = 1) -> GatewayPlan:
    return {
        "settings": {"port": 8080, "gateways_per_node": per_node},
        "share_port": True,
        "env": {},
    }


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> _Ray:
    return _Ray(monkeypatch)


@pytest.fixture
def keeper(monkeypatch: pytest.MonkeyPatch) -> GatewayKeeper:
    monkeypatch.setattr(GatewayKeeper, "_start_thread", lambda self: None)  # steps run here
    monkeypatch.setattr(gateway_fleet.threading, "Thread", _Inline)
    return GatewayKeeper(_Store())  # type: ignore[arg-type]


class _Inline:
    """A thread that runs its target at `start` (the old plan's gateways stopping)."""

    def __init__(self, target: Any, args: tuple = (), **_: Any) -> None:
        self.target, self.args = target, args

    def start(self) -> None:
        self.target(*self.args)


def test_each_live_node_gets_its_gateways_and_the_plan_is_kept(
    cluster: _Ray, keeper: GatewayKeeper
) -> None:
    cluster.nodes = ["node-a", "node-b"]
    names = keeper.keep(_plan(per_node=2))
    digest = gateway_fleet.plan_id(_plan(per_node=2))
    assert sorted(names) == [
        f"serving-gateway:{digest}:{n}:{i}" for n in ("node-a", "node-b") for i in (0, 1)
    ]
    assert sorted(cluster.starts) == sorted(names)
    assert keeper._store.load(b"gateways/") == {"plan": _plan(per_node=2)}  # type: ignore[attr-defined]


def test_a_node_that_joins_gets_a_gateway_and_one_that_leaves_is_let_go(
    cluster: _Ray, keeper: GatewayKeeper
) -> None:
    keeper.keep(_plan())
    cluster.nodes = ["node-a", "node-b"]
    keeper.step()
    assert [cluster.started[name].node for name in cluster.starts] == ["node-a", "node-b"]
    cluster.nodes = ["node-a"]
    cluster.gateway("node-b").health = "dead"  # its node gone
    cluster.known.discard(cluster.gateway("node-b").name)
    keeper.step()
    keeper.step()
    assert len(cluster.starts) == 2 and cluster.killed == []


def test_a_gateway_whose_check_fails_is_restarted(cluster: _Ray, keeper: GatewayKeeper) -> None:
    keeper.keep(_plan())
    keeper.step()
    gateway = cluster.gateway("node-a")
    gateway.health = "failed"
    keeper.step()
    assert cluster.killed == [(gateway.name, False)]  # Ray starts it again, same name and node


def test_a_silent_gateway_is_restarted_once_it_had_answered_never_while_starting(
    cluster: _Ray, keeper: GatewayKeeper
) -> None:
    keeper.keep(_plan())
    gateway = cluster.gateway("node-a")
    gateway.health = "silent"  # starting: its start has bounds of its own
    keeper.step()
    assert cluster.killed == []
    gateway.health = "ok"
    keeper.step()
    gateway.health = "silent"  # answered once, then hung
    keeper.step()
    assert cluster.killed == [(gateway.name, False)]


def test_a_gateway_that_could_not_start_is_started_again_later_each_time(
    cluster: _Ray, keeper: GatewayKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(gateway_fleet.time, "monotonic", lambda: clock[0])
    cluster.failing.add(f"serving-gateway:{gateway_fleet.plan_id(_plan())}:node-a:0")
    keeper.keep(_plan())
    gateway = cluster.gateway("node-a")
    keeper.step()  # seen gone: again in 5 s
    keeper.step()
    assert cluster.starts == [gateway.name]
    clock[0] += gateway_fleet.CHECK_S
    keeper.step()  # started again, and gone again: next in 10 s
    assert cluster.starts == [gateway.name] * 2
    clock[0] += gateway_fleet.CHECK_S
    keeper.step()
    assert len(cluster.starts) == 2
    clock[0] += gateway_fleet.CHECK_S
    keeper.step()
    assert len(cluster.starts) == 3


def test_a_gateway_ray_is_starting_again_is_left_to_ray(
    cluster: _Ray, keeper: GatewayKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(gateway_fleet.time, "monotonic", lambda: clock[0])
    keeper.keep(_plan())
    gateway = cluster.gateway("node-a")
    gateway.health = "dead"  # its process died; Ray still knows the name: restarting
    for _ in range(3):
        keeper.step()
        clock[0] += gateway_fleet.CHECK_S
    # the same handle checked each time: neither dropped and found again, nor killed
    assert cluster.starts == [gateway.name] and cluster.killed == []


def test_a_restarted_registry_keeps_the_stored_plans_gateways(
    cluster: _Ray, keeper: GatewayKeeper
) -> None:
    names = keeper.keep(_plan())
    again = GatewayKeeper(keeper._store)  # type: ignore[attr-defined]
    again.step()
    assert cluster.starts == names * 2  # found by name (`get_if_exists`), not new processes
    assert len(cluster.started) == 1


def test_another_plan_replaces_the_gateways(cluster: _Ray, keeper: GatewayKeeper) -> None:
    (old,) = keeper.keep(_plan())
    (new,) = keeper.keep({**_plan(), "settings": {"port": 9090, "gateways_per_node": 1}})
    assert old != new
    assert cluster.killed == [(old, True)]
