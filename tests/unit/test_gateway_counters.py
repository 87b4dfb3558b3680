"""A gateway's published counters: generated again when a request moved them (or every REFRESH_S),
written when they change, and as a sign of life while they do not."""

from __future__ import annotations

import json

import pytest

from serving.metrics import invocations
from serving.ray_wing import gateway_counters
from serving.ray_wing.gateway_counters import HEARTBEAT_S, REFRESH_S, STALE_S, GatewayCounters


def test_an_idle_gateway_neither_generates_nor_writes_its_counters_but_as_a_heartbeat(
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
    generated: list[float] = []

    def publish_at(at: float, moves: int, text: bytes) -> None:
        clock[0] = 1000.0 + at

        def exposition() -> bytes:
            generated.append(at)
            return text

        counters.publish(moves, exposition)

    publish_at(0, 0, b"a 1\n")  # first: generated and written
    publish_at(5, 0, b"a 1\n")  # no request since, young: neither
    publish_at(7, 1, b"a 2\n")  # a request: generated, changed, written
    publish_at(12, 1, b"a 2\n")  # nothing moved, 5 s old: neither
    publish_at(7 + HEARTBEAT_S, 1, b"a 2\n")  # nothing moved, due: the last text written again
    publish_at(7 + REFRESH_S, 1, b"a 2\npolls 3\n")  # the registry polls catch up
    assert generated == [0, 7, 7 + REFRESH_S]
    assert [entry["text"] for _, entry in writes] == ["a 1\n", "a 2\n", "a 2\n", "a 2\npolls 3\n"]
    assert {key for key, _ in writes} == {b"gateway-metrics/gw-1"}
    # a reader counts a gateway live for STALE_S after its last write: the heartbeat keeps it so
    assert HEARTBEAT_S + gateway_counters.PUBLISH_S < STALE_S


def test_every_request_series_moves_and_a_registry_poll_does_not() -> None:
    before = invocations.series_moves()
    trace = invocations.InvocationTrace(endpoint="moves-ep")
    invocations.record_invocation(trace, 200, 0.01)
    invocations.record_client_abort(trace)
    invocations.record_access("moves-ep", "allow")
    assert invocations.series_moves() == before + 3
    invocations.REGISTRY_POLLS.labels("ray").inc()
    assert invocations.series_moves() == before + 3
