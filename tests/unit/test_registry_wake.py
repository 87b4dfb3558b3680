"""serving.ray_wing.registry: a new replica's registration wakes the reconcile loop, so an update
waiting for that replica moves its traffic at once rather than at the next status read (up to
STATUS_POLL_S later); a heartbeat of a replica already known does not. The actor's class is used
unbound, with its replica table and reconciler replaced by recorders (no Ray started)."""

from __future__ import annotations

import threading

from serving.ray_wing.registry import Registry


class _Table:
    def __init__(self) -> None:
        self.known: set[str] = set()

    def proven(self, key, url: str, proof: str) -> bool:
        return proof == "proof"

    def heard(self, url: str, key, holder: str | None = None) -> bool:
        new = url not in self.known
        self.known.add(url)
        return new


class _Reconciler:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def _registry() -> tuple[object, _Reconciler]:
    registry = object.__new__(Registry.__ray_actor_class__)
    reconciler = _Reconciler()
    registry.__dict__.update(
        _replicas=_Table(),
        _reconciler=reconciler,
        _lock=threading.RLock(),
        refused=0,
        bumps=0,
    )
    registry._bump = lambda: setattr(registry, "bumps", registry.bumps + 1)
    return registry, reconciler


def test_a_new_replica_wakes_the_reconciler_and_a_heartbeat_does_not() -> None:
    registry, reconciler = _registry()
    key = ("ep", "iris", "v1")
    assert registry.register(*key, "http://127.0.0.1:1", "proof")
    assert (registry.bumps, reconciler.wakes) == (1, 1)
    assert registry.register(*key, "http://127.0.0.1:1", "proof")  # its heartbeat
    assert (registry.bumps, reconciler.wakes) == (1, 1)
    assert registry.register(*key, "http://127.0.0.1:2", "proof")  # a second replica
    assert (registry.bumps, reconciler.wakes) == (2, 2)


def test_a_refused_registration_wakes_nothing() -> None:
    registry, reconciler = _registry()
    assert not registry.register("ep", "iris", "v1", "http://127.0.0.1:1", "forged")
    assert (registry.bumps, reconciler.wakes, registry.refused) == (0, 0, 1)
