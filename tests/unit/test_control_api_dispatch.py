"""serving.sagemaker_api.service.ControlApi.call: the control plane runs only the operations the
route admits.

The gateway's route refuses an unknown X-Amz-Target first; this is the control plane's own check, so
that a name reaching it some other way (a bug, a future caller) cannot run a method that is no
operation (`tick`, `restore`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import protocol
from serving.sagemaker_api.routes import AUTOSCALING_OPERATIONS, SAGEMAKER_OPERATIONS
from tests.unit.sagemaker_harness import Harness


@pytest.fixture
def harness(tmp_path: Path):
    running = Harness(tmp_path)
    yield running
    running.stop()


@pytest.mark.parametrize(
    "name", ["tick", "restore", "served_names", "__init__", "lock", "operations"]
)
def test_a_method_that_is_no_operation_is_refused(harness: Harness, name: str, monkeypatch) -> None:
    ran = []
    monkeypatch.setattr(harness.control.sagemaker, "tick", lambda: ran.append("tick"))
    for prefix in (protocol.SAGEMAKER_TARGET_PREFIX, protocol.AUTOSCALING_TARGET_PREFIX):
        status, _, body = harness.control.call(prefix, name, {})
        assert (status, json.loads(body)["__type"]) == (400, "UnknownOperationException"), (
            prefix,
            name,
        )
    assert ran == []


def test_every_admitted_operation_has_its_handler(harness: Harness) -> None:
    handlers = harness.control.handlers
    assert set(handlers[protocol.SAGEMAKER_TARGET_PREFIX]) == set(SAGEMAKER_OPERATIONS)
    assert set(handlers[protocol.AUTOSCALING_TARGET_PREFIX]) == set(AUTOSCALING_OPERATIONS)
    status, _, body = harness.control.call(protocol.SAGEMAKER_TARGET_PREFIX, "ListEndpoints", {})
    assert status == 200 and json.loads(body)["Endpoints"] == []
