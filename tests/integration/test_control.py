"""Endpoint descriptions, listing and health, read from the running server."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_describe_in_service_endpoint(server):
    description = server.describe("it-direct")
    assert description["EndpointStatus"] == "InService"
    assert description["FailureReason"] is None
    assert description["InferenceExecutionConfig"] == {"Mode": "Direct"}
    containers = {c["ContainerHostname"]: c for c in description["Containers"]}
    assert list(containers) == ["iris", "wine", "labels", "faulty", "sleepy", "narrow"]
    assert containers["iris"]["Image"] == "sklearn" and containers["labels"]["Image"] == "python"
    for container in containers.values():
        assert container["Status"] == "InService"
        assert container["CurrentReplicas"] == container["DesiredReplicas"] == 1


def test_failed_container_is_named_with_its_reason(server):
    description = server.describe("it-broken")
    assert description["EndpointStatus"] == "Failed"
    assert "broken" in description["FailureReason"] and "weights file is corrupt" in description["FailureReason"]
    containers = {c["ContainerHostname"]: c for c in description["Containers"]}
    assert containers["broken"]["Status"] == "Failed"
    assert "weights file is corrupt" in containers["broken"]["FailureReason"]


def test_list_endpoints(server):
    listing = server.http.get("/endpoints").json()["Endpoints"]
    statuses = {e["EndpointName"]: e["EndpointStatus"] for e in listing}
    assert statuses["it-serial"] == "InService"
    assert statuses["it-broken"] == "Failed"


def test_describe_unknown_endpoint(server):
    response = server.http.get("/endpoints/nope")
    assert response.status_code == 400
    assert response.json()["__type"] == "ValidationError"


def test_ping_reports_unhealthy_while_an_endpoint_failed(server):
    # it-broken is Failed for the whole session, so the server is not fully healthy.
    assert server.http.get("/ping").status_code == 503
