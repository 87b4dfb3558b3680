"""Local paths described to anyone (issue 56, finding 6c').

The anonymous `GET /endpoints/{name}` showed a local DataCaptureConfig destination, and failure
reasons that quote an exception name local files: the server's paths, to anyone who reaches the
port. Now the gateway describes each local path as `.../<its last name>`; `s3://` locations stay
whole. Unit-level: the gateway's real state fed a registry snapshot, and its real routes on
Starlette; no Ray.
"""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from serving.config.data_capture import DataCaptureConfig
from serving.control.status import StatusBoard
from serving.gateway.invocation import Invocations
from serving.gateway.state import GatewayState
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.settings import ServerSettings


def _snapshot(name: str, destination: str, message: str) -> dict:
    """A registry snapshot of one endpoint whose container failed with `message` (as Serve reports
    it)."""
    row = {
        "ContainerHostname": "english",
        "Image": "sklearn",
        "Mode": "SingleModel",
        "DesiredReplicas": 1,
        "Version": "v1",
    }
    capture = DataCaptureConfig.model_validate(
        {
            "InitialSamplingPercentage": 20,
            "DestinationS3Uri": destination,
            "CaptureOptions": [{"CaptureMode": "Input"}],
        }
    ).model_dump(mode="json")
    record = {
        "name": name,
        "mode": "Direct",
        "containers": [row],
        "limits": {},
        "not_idempotent": [],
        "access": None,
        "async_inference": None,
        "data_capture": capture,
        "update": {"Status": "Failed", "FailureReason": f"container english: {message}"},
        "failed": False,
        "in_service": True,
        "desired_versions": {"english": "v1"},
    }
    statuses = {
        f"{name}.english.v1": {
            "status": "RUNNING",
            "message": "",
            "deployments": {
                "english": {
                    "status": "UNHEALTHY",
                    "message": f"Traceback (most recent call last):\n{message}",
                    "replicas": {"RUNNING": 1},
                }
            },
        }
    }
    return {
        "version": 1,
        "epoch": "e1",
        "endpoints": {name: record},
        "replicas": {(name, "english"): ["http://10.0.0.1:9000/x"]},
        "registered": {(name, "english", "v1"): 1},
        "statuses": statuses,
        "refused": 0,
        "scaling": {},
        "awaited": [],
        "api": {"fronts": {}, "served": []},
    }


def test_an_anonymous_description_shows_no_local_path(tmp_path: Path) -> None:
    settings = ServerSettings()
    transport = ContainerTransport(default_limit=8)
    state = GatewayState(settings, Invocations(settings, transport), transport, StatusBoard())
    destination = tmp_path / "operators-home" / "capture"
    model = "/home/alice/models/english/1/model.joblib"
    failure = f"FileNotFoundError: [Errno 2] No such file or directory: '{model}'"
    state.offer(_snapshot("local", f"file://{destination}", failure))
    with TestClient(serving_app(state.board.routes())) as client:
        answer = client.get("/endpoints/local")
    assert answer.status_code == 200
    described = answer.json()
    # before: the destination
    assert str(destination) not in answer.text and str(tmp_path) not in answer.text
    # before: the failure named the file
    assert model not in answer.text and "/home/alice" not in answer.text
    assert described["DataCaptureConfig"]["DestinationS3Uri"] == ".../capture"
    # which file, not where
    assert "'.../model.joblib'" in described["Containers"][0]["LastFailureReason"]
    assert "'.../model.joblib'" in described["LastUpdate"]["FailureReason"]
    # the rest of the summary stays
    assert described["DataCaptureConfig"]["CaptureStatus"] == "Started"
    assert described["DataCaptureConfig"]["CurrentSamplingPercentage"] == 20
    # the reason, less the path
    assert "FileNotFoundError" in described["Containers"][0]["LastFailureReason"]
    # still captured there
    assert state.invocations.endpoints["local"].data_capture.folder == destination


def test_an_s3_destination_is_not_a_local_path_and_stays_described(tmp_path: Path) -> None:
    settings = ServerSettings()
    transport = ContainerTransport(default_limit=8)
    state = GatewayState(settings, Invocations(settings, transport), transport, StatusBoard())
    state.offer(_snapshot("remote", "s3://capture-bucket/endpoints", "ValueError: bad weights"))
    with TestClient(serving_app(state.board.routes())) as client:
        described = client.get("/endpoints/remote").json()
    assert described["DataCaptureConfig"]["DestinationS3Uri"] == "s3://capture-bucket/endpoints"
    assert described["Containers"][0]["LastFailureReason"] == "ValueError: bad weights"
