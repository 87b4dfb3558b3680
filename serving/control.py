"""Control-plane reads: endpoint status and descriptions, `GET /endpoints[/{name}]` and `/ping`.

Statuses come from a snapshot of Ray Serve's application status that the registry
actor refreshes in its own process and hands to the gateway with the routing table
(plain dicts, so this module needs no Ray); the request path only reads the latest
snapshot and never waits on the controller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.errors import ValidationError, wire_error

# Ray Serve application status -> SageMaker EndpointStatus.
_ENDPOINT_STATUS = {
    "NOT_STARTED": "Creating",
    "DEPLOYING": "Creating",
    "RUNNING": "InService",
    "DEPLOY_FAILED": "Failed",
    "UNHEALTHY": "Failed",
    "DELETING": "Deleting",
}
# Ray Serve deployment status -> container status.
_CONTAINER_STATUS = {
    "UPDATING": "Creating",
    "HEALTHY": "InService",
    "UPSCALING": "Updating",
    "DOWNSCALING": "Updating",
    "UNHEALTHY": "Failed",
    "DEPLOY_FAILED": "Failed",
}


@dataclass
class EndpointRecord:
    """What the control plane knows of a deployed endpoint: its spec summary and history."""

    name: str
    mode: str
    containers: list[dict[str, Any]]  # ContainerHostname, Image, Mode, DesiredReplicas
    limits: dict[str, int] = field(default_factory=dict)  # per-replica in-flight bound by hostname
    # Identities and policies (Identities.to_record) or None; never part of a description.
    access: dict[str, Any] | None = field(default=None, repr=False)
    was_in_service: bool = False
    scaling_activities: list[dict[str, Any]] = field(default_factory=list)  # newest first
    # Autoscaled containers: hostname -> the autoscaler's latest state (DesiredReplicas, metric, target).
    scaling: dict[str, dict[str, Any]] = field(default_factory=dict)


def applications_from_serve_details(details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Application statuses from Serve's instance details (the documented JSON of Ray's
    `GET /api/serve/applications/`): per app its status and message, per deployment its
    status, message and replica count by state. What `serve.status()` derives, minus the
    pydantic round trip that costs ~100 ms of CPU per call on Ray 2.60."""
    applications = {}
    for name, app in (details.get("applications") or {}).items():
        deployments = {}
        for dep_name, dep in (app.get("deployments") or {}).items():
            states: dict[str, int] = {}
            for replica in dep.get("replicas") or []:
                state = _text(replica.get("state"))
                states[state] = states.get(state, 0) + 1
            deployments[dep_name] = {"status": _text(dep.get("status")), "message": dep.get("message") or "",
                                     "replicas": states}
        applications[name] = {"status": _text(app.get("status")), "message": app.get("message") or "",
                              "deployments": deployments}
    return applications


def _text(value: Any) -> str:
    return str(getattr(value, "value", value) or "")


def short_reason(message: str) -> str:
    """The useful last line of a Ray Serve failure message (tracebacks end with the error)."""
    lines = [line.strip() for line in (message or "").strip().splitlines() if line.strip()]
    errors = [line for line in lines if ("Error" in line or "Exception" in line) and ":" in line and not line.startswith("File ")]
    return (errors[-1] if errors else lines[-1] if lines else "")[:1000]


def describe(record: EndpointRecord, app: dict[str, Any] | None) -> dict[str, Any]:
    """DescribeEndpoint-shaped document for one endpoint from its Serve application status."""
    app = app or {"status": "NOT_STARTED", "message": "", "deployments": {}}
    status = _ENDPOINT_STATUS.get(app["status"], "Creating")
    if status == "Creating" and record.was_in_service:
        status = "Updating"
    containers, reasons = [], []
    for container in record.containers:
        name = container["ContainerHostname"]
        deployment = app["deployments"].get(name)
        state = _CONTAINER_STATUS.get(deployment["status"], "Creating") if deployment else "Creating"
        entry = {
            **container,
            "Status": state,
            "CurrentReplicas": (deployment or {}).get("replicas", {}).get("RUNNING", 0),
        }
        scaling = record.scaling.get(name)
        if scaling is not None:  # an autoscaled container: what its autoscaler last decided, and on what
            entry["DesiredReplicas"] = scaling["DesiredReplicas"]
            entry["ScalingMetric"] = {key: scaling.get(key) for key in ("MetricName", "MetricValue", "TargetValue")}
        if state == "Failed":
            entry["FailureReason"] = short_reason(deployment["message"])
            reasons.append(f"container {name}: {entry['FailureReason']}")
        containers.append(entry)
    failure = None
    if status == "Failed":
        failure = "; ".join(reasons) or short_reason(app["message"]) or "the endpoint failed"
    return {
        "EndpointName": record.name,
        "EndpointStatus": status,
        "FailureReason": failure,
        "InferenceExecutionConfig": {"Mode": record.mode},
        "Containers": containers,
        "ScalingActivities": list(record.scaling_activities),
    }


class StatusBoard:
    """Latest descriptions of every endpoint, swapped in whole by the background poller."""

    def __init__(self) -> None:
        self.records: dict[str, EndpointRecord] = {}
        self.descriptions: dict[str, dict[str, Any]] = {}

    def refresh(self, applications: dict[str, dict[str, Any]]) -> None:
        """Rebuild descriptions from a Serve status snapshot (app name -> status dict)."""
        descriptions = {}
        for name, record in list(self.records.items()):
            description = describe(record, applications.get(name))
            if description["EndpointStatus"] == "InService":
                record.was_in_service = True
            descriptions[name] = description
        self.descriptions = descriptions

    def healthy(self) -> bool:
        return all(d["EndpointStatus"] == "InService" for d in self.descriptions.values())

    def failure(self, name: str) -> str | None:
        description = self.descriptions.get(name)
        if description and description["EndpointStatus"] == "Failed":
            return description["FailureReason"]
        return None

    # --- HTTP ---------------------------------------------------------------------
    def routes(self) -> list[Route]:
        return [
            Route("/ping", self.ping, methods=["GET"]),
            Route("/endpoints", self.list_endpoints, methods=["GET"]),
            Route("/endpoints/{name}", self.describe_endpoint, methods=["GET"]),
        ]

    async def ping(self, request: Request) -> Response:
        return Response(b"", status_code=200 if self.healthy() else 503)

    async def list_endpoints(self, request: Request) -> Response:
        summaries = [
            {"EndpointName": d["EndpointName"], "EndpointStatus": d["EndpointStatus"]}
            for _, d in sorted(self.descriptions.items())
        ]
        return _json({"Endpoints": summaries})

    async def describe_endpoint(self, request: Request) -> Response:
        name = request.path_params["name"]
        description = self.descriptions.get(name)
        if description is None:
            status, headers, body = wire_error(ValidationError(f"Could not find endpoint {name}."))
            return Response(body, status_code=status, headers=headers)
        return _json(description)


def _json(document: Any) -> Response:
    return Response(json.dumps(document).encode(), media_type="application/json")
