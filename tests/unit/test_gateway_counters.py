"""A gateway's published counters: written when they change, and as a sign of life while they do not."""

from __future__ import annotations

import json

import pytest

from serving.ray_wing import gateway_counters
from serving.ray_wing.gateway_counters import HEARTBEAT_S, STALE_S, GatewayCounters


def test_an_idle_gateway_writes_its_counters_only_as_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ray's GCS key-value store is replaced by a dict: what is tested is when a gateway writes.
    writes: list[tuple[bytes, dict]] = []
    monkeypatch.setattr(
        gateway_counters.internal_kv,
        "_internal_kv_put",
        lambda key, value, namespace: writes.append((key, json.loads(value))),
    )
    clock = [1000.0]
    monkeypatch.setattr(gateway_counters.time, "monotonic", lambda: clock[0])
    counters = GatewayCounters("gw-1")

    def publish_at(at: float, text: bytes) -> None:
        clock[0] = 1000.0 + at
        counters.publish(text)

    publish_at(0, b"a 1\n")  # first: written
    publish_at(5, b"a 1\n")  # unchanged, young: skipped
    publish_at(7, b"a 2\n")  # changed: written
    publish_at(12, b"a 2\n")  # unchanged, 5 s old: skipped
    publish_at(7 + HEARTBEAT_S, b"a 2\n")  # unchanged but due: written
    assert [entry["text"] for _, entry in writes] == ["a 1\n", "a 2\n", "a 2\n"]
    assert {key for key, _ in writes} == {b"gateway-metrics/gw-1"}
    # a reader counts a gateway live for STALE_S after its last write: the heartbeat keeps it so
    assert HEARTBEAT_S + gateway_counters.PUBLISH_S < STALE_S
