"""The registry's table of gateways and the versions they applied (`applied_everywhere`)."""

from __future__ import annotations

import pytest

from serving.ray_wing import gateway_readers
from serving.ray_wing.gateway_readers import (
    READER_FORGOTTEN_S,
    READER_SILENT_S,
    GatewayReaders,
)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(gateway_readers.time, "monotonic", lambda: now[0])
    return now


def test_every_gateway_heard_from_lately_must_have_applied_the_version(clock) -> None:
    readers = GatewayReaders()
    readers.asked("a", 5, "e1")
    readers.asked("b", 3, "e1")
    assert not readers.applied(4, "e1")
    readers.asked("b", 4, "e1")
    assert readers.applied(4, "e1") and not readers.applied(4, "e2")
    clock[0] += READER_SILENT_S + 1  # both silent: they hold nothing up
    assert readers.applied(9, "e1")


def test_forgotten_gateways_are_swept_at_most_once_a_sweep_period(clock) -> None:
    # Issue 61 item 5: a sweep on every call cost the registry gateways² per change.
    readers = GatewayReaders()
    readers.asked("gone", 1, "e")
    clock[0] += READER_FORGOTTEN_S + 1
    readers.asked("live", 1, "e")
    assert "gone" not in readers._table  # past SWEEP_S since the table was made
    readers.asked("gone-too", 1, "e")
    clock[0] += READER_FORGOTTEN_S + 1
    readers.asked("live", 2, "e")  # a sweep again: more than SWEEP_S since the last
    assert set(readers._table) == {"live"}
